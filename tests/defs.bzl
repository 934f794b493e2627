"""Test helpers."""

def dt_cc_test(name, deps = [], srcs_name = None, srcs = [], **kwargs):
    """A GoogleTest suite from <srcs_name or name>.cc (plus srcs) and tests/test_util."""
    native.cc_test(
        name = name,
        srcs = [(srcs_name or name) + ".cc"] + srcs + native.glob(["test_util*.h", "test_util*.cc"]),
        deps = deps + [
            "//core",
            "//models",
            "@system_libs//:gtest_main",
        ],
        **kwargs
    )

"""Test helpers."""

def dt_cc_test(name, deps = [], **kwargs):
    native.cc_test(
        name = name,
        srcs = [name + ".cc"] + native.glob(["test_util*.h", "test_util*.cc"]),
        deps = deps + [
            "//core",
            "//models",
            "@system_libs//:gtest_main",
        ],
        **kwargs
    )

"""Test helpers: the rules the test folders share."""

GTEST = "@system_libs//:gtest"
GTEST_MAIN = "@system_libs//:gtest_main"

# tests/dt_assert.h: ASSERT_DT_OK, for every suite.
DT_ASSERT = "//tests:dt_assert"

def dt_cc_test(name, deps = [], srcs_name = None, srcs = [], **kwargs):
    """A GoogleTest suite from <srcs_name or name>.cc (plus srcs) and tests/test_util."""
    native.cc_test(
        name = name,
        srcs = [(srcs_name or name) + ".cc"] + srcs + native.glob(["test_util*.h", "test_util*.cc"]),
        deps = deps + [
            "//core",
            "//models",
            DT_ASSERT,
            GTEST_MAIN,
        ],
        **kwargs
    )

def dt_test_library(name, deps, header_only = False):
    """A helper library of the suites, <name>.h (and <name>.cc), for every test package."""
    native.cc_library(
        name = name,
        testonly = True,
        srcs = [] if header_only else [name + ".cc"],
        hdrs = [name + ".h"],
        visibility = ["//tests:__subpackages__"],
        deps = deps,
    )

def dt_lib_test(name, libs, srcs = None, size = "small", **kwargs):
    """A GoogleTest suite (srcs, default <name>.cc) over only the libraries `libs`."""
    native.cc_test(
        name = name,
        size = size,
        srcs = srcs or [name + ".cc"],
        deps = libs + [DT_ASSERT, GTEST_MAIN],
        **kwargs
    )

def dt_gtest_binary(name, srcs, libs, **kwargs):
    """A GoogleTest program with its own main() over `libs`: the ranks of an mpirun test run it."""
    native.cc_binary(
        name = name,
        testonly = True,
        srcs = srcs,
        deps = libs + [DT_ASSERT, GTEST],
        **kwargs
    )

def dt_sh_test(name, size, data = [], alone = False, tags = [], **kwargs):
    """A shell test, <name>.sh. alone: it starts processes of its own on this machine (mpirun ranks, daemons), so it runs outside the sandbox and with no other test."""
    native.sh_test(
        name = name,
        size = size,
        srcs = [name + ".sh"],
        data = data,
        local = alone or kwargs.pop("local", False),
        tags = (["exclusive"] if alone else []) + tags,
        **kwargs
    )

def dt_cli_test(name, size, data = [], **kwargs):
    """A shell test of the dtrain command: <name>.sh over tests/check_lib.sh and the binary."""
    dt_sh_test(
        name = name,
        size = size,
        data = data + [
            "//launch:dtrain",
            "//tests:check_lib.sh",
        ],
        **kwargs
    )

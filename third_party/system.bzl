"""Finds the system libraries dtrain links (Debian packages, see tools/setup.sh).

Yields @system_libs with cc_library targets :openblas, :mpi, :gtest,
:gtest_main, :zlib, :cjson, :png and :jpeg. Paths come from the machine, never from the source
tree, so that the same WORKSPACE builds on any Debian-like machine.
"""

_OPENBLAS_DIRS = [
    "/usr/lib/x86_64-linux-gnu/openblas-openmp",
    "/usr/lib/aarch64-linux-gnu/openblas-openmp",
    "/usr/lib/x86_64-linux-gnu/openblas-pthread",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread",
]

_OPENBLAS_INCLUDES = [
    "/usr/include/x86_64-linux-gnu/openblas-openmp",
    "/usr/include/aarch64-linux-gnu/openblas-openmp",
    "/usr/include/x86_64-linux-gnu/openblas-pthread",
    "/usr/include/aarch64-linux-gnu/openblas-pthread",
]

def _first_existing(ctx, paths, what):
    for p in paths:
        if ctx.path(p).exists:
            return p
    fail("dtrain: %s not found (looked in %s); run tools/setup.sh" % (what, ", ".join(paths)))

def _showme(ctx, what):
    r = ctx.execute(["mpicc", "--showme:" + what])
    if r.return_code != 0:
        fail("dtrain: `mpicc --showme:%s` failed (%s); run tools/setup.sh" % (what, r.stderr))
    return r.stdout.strip().split(" ")

def _system_libs_impl(ctx):
    blas_lib = _first_existing(ctx, _OPENBLAS_DIRS, "OpenBLAS")
    blas_inc = _first_existing(ctx, _OPENBLAS_INCLUDES, "OpenBLAS headers")
    ctx.symlink(blas_inc, "openblas_include")

    mpi_compile = _showme(ctx, "compile")
    mpi_link = _showme(ctx, "link")
    mpi_inc = [f[2:] for f in mpi_compile if f.startswith("-I")]
    for i, d in enumerate(mpi_inc):
        ctx.symlink(d, "mpi_include_%d" % i)

    build = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "openblas",
    hdrs = glob(["openblas_include/*.h"]),
    includes = ["openblas_include"],
    linkopts = ["-L{blas}", "-Wl,-rpath,{blas}", "-lopenblas", "-fopenmp"],
)

cc_library(
    name = "mpi",
    hdrs = glob(["mpi_include_*/**/*.h"]),
    includes = {mpi_includes},
    linkopts = {mpi_link} + ["-Wl,-rpath,{mpi_libdir}"],
)

cc_library(
    name = "zlib",
    linkopts = ["-lz"],
)

cc_library(
    name = "cjson",
    linkopts = ["-lcjson"],
)

cc_library(
    name = "png",
    linkopts = ["-lpng16", "-lz"],
)

cc_library(
    name = "jpeg",
    linkopts = ["-ljpeg"],
)

cc_library(
    name = "gtest",
    linkopts = ["-lgtest", "-lpthread"],
)

cc_library(
    name = "gtest_main",
    linkopts = ["-lgtest_main", "-lgtest", "-lpthread"],
)
""".format(
        blas = blas_lib,
        mpi_includes = repr(["mpi_include_%d" % i for i in range(len(mpi_inc))]),
        mpi_link = repr(mpi_link),
        mpi_libdir = [f[2:] for f in mpi_link if f.startswith("-L")][0] if [f for f in mpi_link if f.startswith("-L")] else "/usr/lib",
    )
    ctx.file("BUILD", build)
    ctx.file("WORKSPACE", "")

system_libs_repository = repository_rule(
    implementation = _system_libs_impl,
    local = True,
    environ = ["PATH"],
)

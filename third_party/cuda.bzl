"""Finds the CUDA toolkit ($CUDA_HOME, else /usr/local/cuda).

Yields @local_cuda with:
  - defs.bzl: CUDA_AVAILABLE (bool), NVCC (path or ""), CUDA_VERSION;
  - cc_library targets :headers, :cudart, :cublas, :cudnn, :nccl.
Without a toolkit every target is an empty library and CUDA_AVAILABLE is
False, so a CPU-only build works anywhere (//cuda then builds a stub that
reports DT_ERR_UNSUPPORTED).
"""

def _link(libdir, libs):
    return repr(["-L" + libdir, "-Wl,-rpath," + libdir] + ["-l" + l for l in libs])

def _cuda_impl(ctx):
    home = ctx.os.environ.get("CUDA_HOME", "") or "/usr/local/cuda"
    disabled = ctx.os.environ.get("DT_NO_CUDA", "") not in ["", "0"]
    nvcc = ctx.path(home + "/bin/nvcc")
    available = (not disabled) and nvcc.exists and ctx.path(home + "/include/cuda_runtime.h").exists
    version = ""
    if available:
        ctx.symlink(home + "/include", "include")
        ctx.symlink(home + "/lib64", "lib64")
        r = ctx.execute([str(nvcc), "--version"])
        for line in r.stdout.split("\n"):
            if "release" in line:
                version = line.split("release ")[1].split(",")[0]
    ctx.file("defs.bzl", "CUDA_AVAILABLE = %s\nNVCC = %r\nCUDA_VERSION = %r\nCUDA_HOME = %r\n" % (
        available,
        str(nvcc) if available else "",
        version,
        home if available else "",
    ))
    if available:
        libdir = home + "/lib64"
        build = """
package(default_visibility = ["//visibility:public"])

filegroup(name = "all_headers", srcs = glob(["include/**"]))

cc_library(name = "headers", hdrs = glob(["include/**"]), includes = ["include"])

cc_library(name = "cudart", deps = [":headers"], linkopts = {cudart})

cc_library(name = "cublas", deps = [":headers"], linkopts = {cublas})

cc_library(name = "cudnn", deps = [":headers"], linkopts = {cudnn})

cc_library(name = "nccl", deps = [":headers"], linkopts = {nccl})
""".format(
            cudart = _link(libdir, ["cudart"]),
            cublas = _link(libdir, ["cublasLt", "cublas"]),
            cudnn = _link(libdir, ["cudnn"]),
            nccl = _link(libdir, ["nccl"]),
        )
    else:
        build = """
package(default_visibility = ["//visibility:public"])

filegroup(name = "all_headers", srcs = [])

cc_library(name = "headers")

cc_library(name = "cudart")

cc_library(name = "cublas")

cc_library(name = "cudnn")

cc_library(name = "nccl")
"""
    ctx.file("BUILD", build)
    ctx.file("WORKSPACE", "")

cuda_repository = repository_rule(
    implementation = _cuda_impl,
    local = True,
    environ = ["CUDA_HOME", "DT_NO_CUDA"],
)

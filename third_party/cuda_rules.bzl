"""cuda_library: compiles .cu files with nvcc and wraps them in a cc_library.

    load("//third_party:cuda_rules.bzl", "cuda_library")

    cuda_library(
        name = "kernels",
        srcs = ["a.cu", "b.c", "internal.h"],  # .cu -> nvcc, the rest -> cc_library
        hdrs = ["public.h"],
        cu_hdrs = ["//core:backend.h"],         # headers the .cu files include
        deps = ["//core:backend"],
        stub_srcs = ["stub.c"],                 # used when CUDA is unavailable
    )

Each .cu file becomes one genrule running nvcc (machine code for sm_80 and
sm_90 plus compute_90 PTX, so Hopper runs its own SASS and newer GPUs JIT the
PTX). Includes resolve from the workspace root (`-I.`: genrules run in the
execroot) and from the generated-files root. The objects, the other sources
and the CUDA libraries form a cc_library.

When @local_cuda has no toolkit (or DT_NO_CUDA=1, i.e. `--config=cpu`),
the macro yields a cc_library of `stub_srcs` + `hdrs` with `stub_deps`
instead, so dependants link everywhere and a CUDA device request fails with
a clear status at run time.
"""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE", "NVCC")

CUDA_GENCODE = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

NVCC_COPTS = [
    "-c",
    "-O3",
    "-std=c++17",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-Wall",
    "-lineinfo",
    "-I.",
    "-I$(GENDIR)",
]

CUDA_LIBS = [
    "@local_cuda//:headers",
    "@local_cuda//:cudart",
    "@local_cuda//:cublas",
    "@local_cuda//:cudnn",
]

def cuda_library(
        name,
        srcs = [],
        hdrs = [],
        cu_hdrs = [],
        deps = [],
        copts = [],
        nvcc_copts = [],
        stub_srcs = [],
        stub_deps = None,
        alwayslink = False,
        **kwargs):
    """See the module docstring.

    Args:
      name: the cc_library's name.
      srcs: .cu files (nvcc) and .c/.cc/.h files (the C toolchain).
      hdrs: public headers.
      cu_hdrs: extra headers (labels) the .cu files include, as inputs of the
        nvcc actions.
      deps: cc deps; the CUDA libraries are added.
      copts: copts for the C sources.
      nvcc_copts: extra nvcc flags.
      stub_srcs: sources of the library built when CUDA is unavailable.
      stub_deps: deps of that library (default: deps).
      alwayslink: as cc_library (keep constructors that register backends).
      **kwargs: passed to cc_library (visibility, tags, ...).
    """
    if not CUDA_AVAILABLE:
        native.cc_library(
            name = name,
            srcs = stub_srcs,
            hdrs = hdrs,
            deps = deps if stub_deps == None else stub_deps,
            copts = copts,
            alwayslink = alwayslink,
            **kwargs
        )
        return

    cu_srcs = [s for s in srcs if s.endswith(".cu")]
    other_srcs = [s for s in srcs if not s.endswith(".cu") and not s.endswith(".cuh")]
    local_hdrs = [s for s in srcs if s.endswith(".h") or s.endswith(".cuh")]
    objs = []
    for src in cu_srcs:
        stem = src[:-3].replace("/", "_")
        out = "_objs/%s/%s.pic.o" % (name, stem)
        native.genrule(
            name = "%s_nvcc_%s" % (name, stem),
            srcs = [src] + local_hdrs + hdrs + cu_hdrs,
            outs = [out],
            cmd = " ".join(
                [NVCC] + NVCC_COPTS + CUDA_GENCODE + nvcc_copts +
                ["$(location %s)" % src, "-o", "$@"],
            ),
            message = "nvcc %s" % src,
            tags = ["cuda"],
            visibility = ["//visibility:private"],
        )
        objs.append(out)

    native.cc_library(
        name = name,
        srcs = objs + other_srcs,
        hdrs = hdrs,
        deps = deps + CUDA_LIBS,
        copts = copts,
        alwayslink = alwayslink,
        **kwargs
    )

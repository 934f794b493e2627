"""core/'s libraries, written once: which files each holds and what it builds on.

core/BUILD makes the cc_libraries from this table (core/defs.bzl), and
tests/layering_test.sh checks the #include lines against the same table,
handed to it as a generated text file (//core:libraries.txt).

Each entry, lowest layer first (a library uses only those above it):
  files         the file patterns (shell/glob style, file names in core/) of
                the library: a prefix pattern ("ops*", "cpu_*") keeps renames
                within the prefix out of this table. Every core/ file matches
                at most one library's patterns.
  hdrs          its public headers; the other matched files are its srcs.
  private_hdrs  headers the library's users inside core/ (and tests/) build
                on, exported by a second target <name>_internal (CORE_PRIVATE).
  textual_hdrs  .def lists included by other files.
  deps          the core/ libraries it builds on (each listed above it). A
                file may include headers of its own library and of those it
                builds on, directly or not.
  external      libraries outside core/.
  attrs         further cc_library attributes.
"""

# Who may depend on a library's private headers.
CORE_PRIVATE = [
    "//core:__pkg__",
    "//tests:__subpackages__",
]

CORE_LIBRARIES = {
    # status codes, error messages, counter-based RNG, values read from text
    # (parse.h: booleans, choice lists), trace span hooks
    "status": {
        "files": ["status.*", "rng.*", "parse.*", "trace.*"],
        "hdrs": ["parse.h", "rng.h", "status.h", "trace.h"],
    },
    # devices and dtypes, the backend vtable and registry, the op table's
    # kernel dispatch (argument checks), memory statistics, the environment
    # variables (env.h)
    "backend": {
        "files": [
            "backend.h",
            "backend_registry.c",
            "device.*",
            "env.*",
            "env_params.def",
            "half*",
            "kernels.c",
            "memory.*",
            "op_table.def",
        ],
        "hdrs": ["backend.h", "device.h", "half.h", "env.h", "memory.h"],
        # The op table (kernels) and the environment variables (core/env.h).
        "textual_hdrs": ["env_params.def", "op_table.def"],
        "deps": ["status"],
    },
    # The CPU reference backend; registers itself when linked.
    # cpu_internal.h is its own (srcs), not its users'.
    "cpu": {
        "files": ["cpu.h", "cpu_*"],
        "hdrs": ["cpu.h"],
        "deps": ["backend"],
        "external": ["@system_libs//:openblas"],
        "attrs": {
            "linkopts": ["-lm", "-lpthread"],
            # cpu_backend.c registers the backend from a constructor: keep it linked.
            "alwayslink": True,
        },
    },
    # tensors, views, the autograd tape and engine, autocast (amp.h); its
    # private headers, the tensor struct and how an op records itself on the
    # tape, are what the ops, modules and optimizers build on
    "tensor": {
        "files": ["tensor*", "autograd*", "amp.*", "autocast_policy.def"],
        "hdrs": ["amp.h", "autograd.h", "tensor.h"],
        "private_hdrs": ["autograd_internal.h", "tensor_internal.h"],
        # The autocast policy of every op (core/amp.h).
        "textual_hdrs": ["autocast_policy.def"],
        "deps": ["backend"],
    },
    # differentiable ops
    "ops": {
        "files": ["ops*"],
        "hdrs": ["ops.h"],
        "deps": ["tensor"],
    },
    # modules, layers, the parameter arena
    "module": {
        "files": ["module.*", "nn.h", "nn_*", "param_arena.c"],
        "hdrs": ["module.h", "nn.h"],
        "deps": ["ops", "tensor"],
    },
    # optimizers, LR schedules
    "optim": {
        "files": ["optim*"],
        "hdrs": ["optim.h"],
        "deps": ["module", "tensor"],
    },
    # the training step that train, bench and the data-parallel replicas share
    "step": {
        "files": ["step.*"],
        "hdrs": ["step.h"],
        "deps": ["module", "ops", "optim", "tensor"],
    },
    # datasets, samplers, loader, text (tokenizer, shards)
    "data": {
        "files": ["data*", "text.h"],
        "hdrs": ["data.h", "text.h"],
        "deps": ["tensor"],
        "external": ["@system_libs//:zlib"],
        "attrs": {"linkopts": ["-lpthread"]},
    },
    # image folders: PNG and JPEG decoding and writing, augmentation, the
    # ImageFolder data set (image.h)
    "image": {
        "files": ["image*"],
        "hdrs": ["image.h"],
        "deps": ["data", "status"],
        "external": ["@system_libs//:png", "@system_libs//:jpeg"],
        # The resize's loops vectorise at -O3 (the loader's hot path).
        "attrs": {"copts": ["-O3"]},
    },
    # checkpoint files: CRC32, atomic writes, safetensors, the trainer-state
    # file, the manifest (checkpoint.h)
    "checkpoint": {
        "files": ["checkpoint.h", "ckpt_*"],
        "hdrs": ["checkpoint.h"],
        "deps": ["module", "optim", "tensor"],
        "external": ["@system_libs//:zlib"],
    },
}

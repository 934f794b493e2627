"""The rule of core/'s libraries: one job each, its files named by a prefix."""

# What the libraries above the tensor layer build on: the tensor API and
# the tensor struct / tape internals.
TENSOR_BASE = [
    ":tensor",
    ":tensor_internal",
]

def core_library(name, prefix = None, srcs = [], hdrs = None, deps = [], **kwargs):
    """A core/ library: the files <prefix>_*.c and <prefix>_*.h (its private headers among them) and `srcs`; `hdrs`, its public headers, default [<name>.h]."""
    native.cc_library(
        name = name,
        srcs = srcs + (native.glob([prefix + "_*.c", prefix + "_*.h"]) if prefix else []),
        hdrs = hdrs if hdrs != None else [name + ".h"],
        deps = deps,
        **kwargs
    )

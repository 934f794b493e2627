"""The rules that make core/'s libraries from its table (core/libraries.bzl)."""

load(":libraries.bzl", "CORE_LIBRARIES", "CORE_PRIVATE")

def _labels(deps):
    """The targets of core/ libraries `deps`: each library and its private headers' target."""
    labels = []
    for dep in deps:
        labels.append(":" + dep)
        if CORE_LIBRARIES[dep].get("private_hdrs"):
            labels.append(":" + dep + "_internal")
    return labels

def core_libraries():
    """One cc_library per entry of CORE_LIBRARIES (and <name>_internal for its private headers)."""
    owner = {}
    for name, lib in CORE_LIBRARIES.items():
        for dep in lib.get("deps", []):
            if dep not in owner.values():
                fail("core library %s: its dep %s must be listed above it in core/libraries.bzl" %
                     (name, dep))
        private = lib.get("private_hdrs", [])
        textual = lib.get("textual_hdrs", [])
        files = native.glob(lib["files"])
        for f in files:
            if f in owner:
                fail("core/%s matches the files of both %s and %s (core/libraries.bzl)" %
                     (f, owner[f], name))
            owner[f] = name
        deps = _labels(lib.get("deps", [])) + lib.get("external", [])
        if private:
            native.cc_library(
                name = name + "_internal",
                hdrs = private,
                visibility = CORE_PRIVATE,
                deps = deps,
            )
            deps = deps + [":" + name + "_internal"]
        native.cc_library(
            name = name,
            srcs = [f for f in files if f not in lib["hdrs"] + private + textual],
            hdrs = lib["hdrs"],
            textual_hdrs = textual,
            deps = deps,
            **lib.get("attrs", {})
        )

def core_layering_file(name, out):
    """Writes the table for tests/layering_test.sh: "file PATTERN LIBRARY" per pattern, then "allow LIBRARY LIBRARIES..." (the library and all it builds on)."""
    lines = []
    for lib_name, lib in CORE_LIBRARIES.items():
        for pattern in lib["files"]:
            lines.append("file %s %s" % (pattern, lib_name))
    below = {}
    for lib_name, lib in CORE_LIBRARIES.items():
        allowed = [lib_name]
        for dep in lib.get("deps", []):
            allowed += [b for b in below[dep] if b not in allowed]
        below[lib_name] = allowed
        lines.append("allow %s %s" % (lib_name, " ".join(sorted(allowed))))
    native.genrule(
        name = name,
        outs = [out],
        cmd = "printf '%%s\\n' %s > $@" % " ".join(["'%s'" % line for line in lines]),
    )

"""dt_library: the installable libraries, lib<name>.so and lib<name>.a, of cc_library deps.

    dt_library(name = "dtrain", deps = ["//core", "//dist", ...])

yields
  lib<name>.so     every object of every library the deps link (their whole
                   archives: the backends register from constructors that
                   nothing references), linked with the deps' link flags
                   and -z defs (nothing left unresolved)
  lib<name>.a      the same objects in one archive (ar's MRI script)
  lib<name>.libs   the deps' link flags, one line: what a static link adds
                   after lib<name>.a, and what lib<name>.so was linked with
  lib<name>.keep   -Wl,-u,<symbol> for each object of lib<name>.a that runs
                   a constructor (a section .init_array), one line: a static
                   link names them so that the linker keeps those objects

cc_binary(linkshared = 1) would drop the objects nothing references, and a
cc_library cannot make its deps' libraries alwayslink, hence this rule.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _link_inputs(deps):
    """The archives (each once, link order) and link flags (each once) of deps."""
    archives = []
    flags = []
    seen = {}
    for dep in deps:
        for li in dep[CcInfo].linking_context.linker_inputs.to_list():
            for lib in li.libraries:
                a = lib.pic_static_library or lib.static_library
                if a == None:
                    if lib.objects or lib.pic_objects:
                        fail("dt_library: %s has objects but no archive" % li.owner)
                    continue
                if a.path not in seen:
                    seen[a.path] = True
                    archives.append(a)
            for f in li.user_link_flags:
                if f not in flags:
                    flags.append(f)
    return archives, flags

def _dt_library_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    archives, flags = _link_inputs(ctx.attr.deps)

    # The --linkopt of the build (.bazelrc: -fopenmp) and what the C++
    # objects (nvcc's) need, as cc_binary's link would add them.
    for f in ctx.fragments.cpp.linkopts + ["-lstdc++", "-lm"]:
        if f not in flags:
            flags.append(f)

    so = ctx.actions.declare_file("lib%s.so" % ctx.attr.name)
    a = ctx.actions.declare_file("lib%s.a" % ctx.attr.name)
    libs = ctx.actions.declare_file("lib%s.libs" % ctx.attr.name)
    keep = ctx.actions.declare_file("lib%s.keep" % ctx.attr.name)
    tools = cc_toolchain.all_files

    # What every action below reads: the archives, with the toolchain's tools.
    over_archives = dict(
        inputs = depset(archives, transitive = [tools]),
        use_default_shell_env = True,
    )

    ctx.actions.write(libs, " ".join(flags) + "\n")

    args = ctx.actions.args()
    args.add_all(["-shared", "-o", so, "-Wl,-soname," + so.basename, "-Wl,-z,defs"])
    args.add("-Wl,--whole-archive")
    args.add_all(archives)
    args.add("-Wl,--no-whole-archive")
    args.add_all(flags)
    ctx.actions.run(
        executable = cc_toolchain.compiler_executable,
        arguments = [args],
        outputs = [so],
        mnemonic = "DtLinkShared",
        progress_message = "Linking %s (whole archives)" % so.short_path,
        **over_archives
    )

    script = "CREATE %s\n" % a.path + "".join(["ADDLIB %s\n" % x.path for x in archives]) + "SAVE\nEND\n"
    ctx.actions.run_shell(
        command = 'printf "%%s" "$1" | "%s" -M' % cc_toolchain.ar_executable,
        arguments = [script],
        outputs = [a],
        mnemonic = "DtArchive",
        progress_message = "Archiving %s" % a.short_path,
        **over_archives
    )

    # For each input archive: the members with an .init_array section
    # (objdump -h), and the first strong global symbol each defines (nm; weak
    # ones, such as C++'s DW.ref.__gxx_personality_v0, many objects share).
    ctx.actions.run_shell(
        command = """
set -eu
out=$1; objdump=$2; nm=$3; shift 3
for lib in "$@"; do
  "$objdump" -h "$lib" | awk '/file format/ { m = $1; sub(/:$/, "", m) } / \\.init_array/ { print m }' |
    sort -u > "$out.ctors"
  [ -s "$out.ctors" ] || continue
  "$nm" -g --defined-only "$lib" | awk -v lib="$lib" '
    FILENAME != "-" { want[$1] = 1; next }
    /^$/ { next }
    /:$/ { m = $0; sub(/:$/, "", m); next }
    (m in want) && !(m in done) && NF == 3 && $2 ~ /^[TDBRGS]$/ { print "-Wl,-u," $3; done[m] = 1 }
    END { for (w in want) if (!(w in done)) {
            print "dt_library: " lib "(" w ") runs a constructor but defines no global symbol" > "/dev/stderr"
            exit 1 } }' "$out.ctors" -
done > "$out.tmp"
tr '\\n' ' ' < "$out.tmp" | sed 's/ $//' > "$out"
echo >> "$out"
rm -f "$out.tmp" "$out.ctors"
""",
        arguments = [keep.path, cc_toolchain.objdump_executable, cc_toolchain.nm_executable] +
                    [x.path for x in archives],
        outputs = [keep],
        mnemonic = "DtKeepSymbols",
        progress_message = "Listing the constructors of %s" % a.short_path,
        **over_archives
    )

    outs = [so, a, libs, keep]
    return [DefaultInfo(files = depset(outs), runfiles = ctx.runfiles(files = outs))]

dt_library = rule(
    implementation = _dt_library_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

def _dt_headers_impl(ctx):
    hdrs = []
    for dep in ctx.attr.deps:
        for h in dep[CcInfo].compilation_context.headers.to_list():
            if h.owner.workspace_name == "" and h.is_source:
                hdrs.append(h)
    files = depset(hdrs + ctx.files.srcs)
    return [DefaultInfo(files = files, runfiles = ctx.runfiles(transitive_files = files))]

# The headers of this repository that the deps' compilations see (public,
# textual and private ones): the pool an installation takes the closure of
# dtrain.h's #include lines from (tools/install.sh).
dt_headers = rule(
    implementation = _dt_headers_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "srcs": attr.label_list(allow_files = True),
    },
)

#!/usr/bin/env bash
# The documentation agrees with the code:
#   - the README's table of environment variables lists exactly the
#     variables of core/env_params.def, each with the default `dtrain doctor`
#     reports;
#   - no source reads a DT_* variable except through core/env.h;
#   - every file docs/decisions.md names is in the repository.
set -uo pipefail
. "$(dirname "$(readlink -f "$0")")/check_lib.sh"
readme=$(find_source README.md) || exit 1
def=$(find_source core/env_params.def) || exit 1

# ---- the README's environment table and core/env_params.def ----------------
sed -nE 's/^DT_ENV_[A-Z]+\(([A-Z0-9_]+),.*/DT_\1/p' "$def" | sort >"$tmp/table"
[ -s "$tmp/table" ] || { echo "FAIL: no entries in $def"; exit 1; }
# Rows of the table under "## Environment variables": | `DT_X` | default | doc |
awk '/^## Environment variables/ { on = 1; next } /^## / { on = 0 } on' "$readme" \
  | sed -nE 's/^\| `(DT_[A-Z0-9_]+)` \| ([^|]*) \|.*/\1\t\2/p' | sed -E 's/ +$//' >"$tmp/readme_rows"
cut -f1 "$tmp/readme_rows" | sort >"$tmp/readme"
missing=$(comm -23 "$tmp/table" "$tmp/readme" | tr '\n' ' ')
extra=$(comm -13 "$tmp/table" "$tmp/readme" | tr '\n' ' ')
[ -z "$missing" ]
check_status $? "the README's table lists every variable of core/env_params.def${missing:+ (missing: $missing)}"
[ -z "$extra" ]
check_status $? "the README's table lists no variable the table lacks${extra:+ (extra: $extra)}"

# Defaults: as `dtrain doctor` prints them ("  DT_X  value  default: TEXT").
"$dtrain" doctor >"$tmp/doctor" 2>&1
while IFS=$'\t' read -r name default; do
  shown=$(sed -nE "s/^  $name +[^ ]+ +default: (.*)$/\1/p" "$tmp/doctor" | sed -E 's/ \(tests only\)$//')
  [ "$shown" = "$default" ]
  check_status $? "$name: README default '$default' is doctor's '$shown'"
done <"$tmp/readme_rows"

# ---- sources and docs/decisions.md, from the repository itself -------------
# The runfiles link to the source tree; without it (a remote or sandboxed
# run) these checks cannot be made here.
root=$(dirname "$(readlink -f "$readme")")
if [ ! -f "$root/WORKSPACE" ] || [ ! -d "$root/core" ]; then
  echo "env_doc_test: the source tree is not reachable from the runfiles; skipping the source checks"
else
  cd "$root" || exit 1
  if git rev-parse --git-dir >/dev/null 2>&1; then
    git ls-files core cuda dist launch models tests tools >"$tmp/files"
  else
    find core cuda dist launch models tests tools -type f >"$tmp/files"
  fi
  grep -E '\.(c|h|cc|cu|cuh)$' "$tmp/files" | grep -vx 'core/env.c' |
    xargs grep -nE 'getenv\("DT_[A-Z]' >"$tmp/getenv" 2>/dev/null
  [ ! -s "$tmp/getenv" ]
  check_status $? "no source reads a DT_* variable except core/env.c$( [ -s "$tmp/getenv" ] && printf ': %s' "$(tr '\n' ' ' <"$tmp/getenv")")"

  doc=docs/decisions.md
  # Paths in backticks or links, and bare file names with an extension.
  {
    grep -oE '`[^` ]+`' "$doc" | tr -d '`'
    grep -oE '\]\([^)]+\)' "$doc" | sed -E 's/^\]\(//; s/\)$//' | sed -E 's|^\.\./||; s|^|@|'
    # Bare words: paths (with a /) and documents; not "llm.c", a project.
    sed -E 's/\]\([^)]*\)/]/g; s/`[^`]*`//g' "$doc" |
      grep -oE '(^|[ (])[A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)+/?|(^|[ (])[A-Za-z0-9_.-]+\.(md|sh|sbatch|def|bzl)\b' |
      sed -E 's/^[ (]//'
  } | sort -u >"$tmp/named"
  n=0
  while read -r p; do
    p=${p#@}
    case "$p" in
      */* | *.md | *.c | *.h | *.cc | *.cu | *.cuh | *.sh | *.sbatch | *.def | *.bzl | *.py) ;;
      *) continue ;;
    esac
    case "$p" in http*://* | *=* | -*) continue ;; esac
    n=$((n + 1))
    [ -e "$p" ]
    check_status $? "docs/decisions.md names $p, which is in the repository"
  done <"$tmp/named"
  [ "$n" -gt 0 ]
  check_status $? "docs/decisions.md names some files ($n)"
fi

echo "env_doc_test: $checks checks, $failures failed"
[ "$failures" = 0 ]

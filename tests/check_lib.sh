# Shared by the shell tests of the dtrain command: source it after setting
# `tmp`, and define `run` (which runs dtrain with stdout to $out, stderr to
# $err, and sets $rc). Then `expect RC WHERE PATTERN DESCRIPTION` checks the
# last run: it exited RC and WHERE (out|err) matches the extended regex.
failures=0
checks=0
out="$tmp/out"
err="$tmp/err"
rc=0

fail() {
  failures=$((failures + 1))
  echo "FAIL: $*"
  echo "  stdout: $(tail -c 3000 "$out")"
  echo "  stderr: $(tail -c 3000 "$err")"
}

expect() {
  local want=$1 where=$2 pattern=$3 what=$4
  checks=$((checks + 1))
  if [ "$rc" != "$want" ]; then
    fail "$what: exit status $rc, expected $want"
  elif ! grep -Eq -- "$pattern" "${!where}"; then
    fail "$what: $where does not match /$pattern/"
  else
    echo "ok: $what"
  fi
}

# expect_no WHERE PATTERN DESCRIPTION: the last run's WHERE (out|err) does
# not match the extended regex.
expect_no() {
  checks=$((checks + 1))
  if grep -Eq -- "$2" "${!1}"; then
    fail "$3: $1 matches /$2/"
  else
    echo "ok: $3"
  fi
}

# expect_cmd DESCRIPTION COMMAND...: COMMAND (a checker) succeeds; its last
# line is shown, or its output when it fails.
expect_cmd() {
  local what=$1
  shift
  checks=$((checks + 1))
  if "$@" >"$tmp/check.out" 2>&1; then
    echo "ok: $what ($(tail -1 "$tmp/check.out"))"
  else
    failures=$((failures + 1))
    echo "FAIL: $what"
    sed 's/^/  /' "$tmp/check.out" | tail -20
  fi
}

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

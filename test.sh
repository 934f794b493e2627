#!/usr/bin/env bash
# ./test.sh [extra bazel test flags]: sets up the machine if needed
# (tools/setup.sh), runs `bazel test //...` and ends with one plain line
#   N passed, N failed[, N skipped]
# counting test cases: GoogleTest cases from each test's JUnit XML
# (bazel-testlogs/<package>/<target>/test.xml), one case per shell test. A
# test target that failed without reporting a failing case (crash, timeout,
# build failure) counts as one failed case. Exit status 0 only when nothing
# failed.
set -uo pipefail

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
cd "$root" || exit 1

if ! tools/setup.sh --quiet --chromium --torchvision; then
  echo "test.sh: tools/setup.sh failed, no tests were run"
  echo "0 passed, 1 failed"
  exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
bazel test --keep_going --noshow_progress --ui_event_filters=-info --test_output=errors \
  --test_summary=short //... "$@" 2>&1 | tee "$log"
bazel_rc=${PIPESTATUS[0]}

targets=$(bazel query --noshow_progress --ui_event_filters=-info \
  'tests(//...) except attr("tags", "\bmanual\b", //...)' 2>/dev/null)

# Prints "tests failures skipped" for one JUnit XML file: sums the
# <testsuite> elements (GoogleTest's and the one Bazel writes for tests that
# produce no XML).
count_xml() {
  awk '
    function attr(line, name,   m) {
      if (match(line, " " name "=\"[0-9]+\"")) {
        m = substr(line, RSTART, RLENGTH)
        gsub(/[^0-9]/, "", m)
        return m + 0
      }
      return 0
    }
    /<testsuite[ >]/ {
      t += attr($0, "tests"); f += attr($0, "failures") + attr($0, "errors")
      s += attr($0, "disabled") + attr($0, "skipped")
    }
    END { printf "%d %d %d\n", t, f, s }
  ' "$1"
}

passed=0
failed=0
failing=() # "label|pkg/name" of each target with a failed case
flaky=()   # the same for targets that passed only on a later attempt
skipped=0
for label in $targets; do
  pkg=${label#//}
  pkg=${pkg%%:*}
  name=${label##*:}
  # "//tests:foo   (cached) PASSED in 0.4s" -> "PASSED in 0.4s"
  status=$(grep -E "^${label}[[:space:]]" "$log" | head -1 |
    sed -E 's/^[^[:space:]]+[[:space:]]+(\(cached\)[[:space:]]+)?//')
  xml="bazel-testlogs/$pkg/$name/test.xml"
  case "$status" in
    PASSED* | FLAKY* | "FAILED in"* | FAILED | TIMEOUT*) ;;
    "")
      # Not in the summary: trust an XML only when bazel itself succeeded.
      if [ "$bazel_rc" != 0 ]; then
        echo "test.sh: $label: no result"
        failed=$((failed + 1))
        continue
      fi
      ;;
    *)
      # FAILED TO BUILD, NO STATUS, INCOMPLETE, ...: any XML there is stale.
      echo "test.sh: $label: $status"
      failed=$((failed + 1))
      continue
      ;;
  esac
  if [ ! -f "$xml" ]; then
    echo "test.sh: $label: no test result"
    failed=$((failed + 1))
    continue
  fi
  read -r t f s <<<"$(count_xml "$xml")"
  case "$status" in
    FAILED* | TIMEOUT*) [ "$f" -gt 0 ] || f=1 ;;
  esac
  [ "$f" -gt 0 ] && failing+=("$label|$pkg/$name")
  case "$status" in FLAKY*) flaky+=("$label|$pkg/$name") ;; esac
  p=$((t - f - s))
  [ "$p" -ge 0 ] || p=0
  passed=$((passed + p))
  failed=$((failed + f))
  skipped=$((skipped + s))
done

# A bazel failure with nothing to blame it on (e.g. a broken BUILD file)
# still fails the run.
if [ "$bazel_rc" != 0 ] && [ "$failed" = 0 ]; then
  echo "test.sh: bazel test failed (exit $bazel_rc)"
  failed=1
fi

# fail_lines LOG: a shell test's failed checks (its "FAIL:" lines and the
# two that follow, stdout and stderr), shortened and indented.
fail_lines() {
  grep -a -A2 '^FAIL:' "$1" 2>/dev/null | head -12 | cut -c1-300 | sed 's/^/  | /'
}

# What failed, once more just above the summary (a CI log may keep only
# its end): each failing case's message from the XML, then the end of the
# target's log.
for entry in "${failing[@]}"; do
  label=${entry%%|*}
  dir="bazel-testlogs/${entry#*|}"
  echo "test.sh: FAILED $label"
  grep -o '<testcase name="[^"]*"\|<failure message="[^"]*"' "$dir/test.xml" 2>/dev/null |
    grep -B1 '<failure' | grep -v '^--$' | sed -e 's/^<testcase name=/  case /' \
    -e 's/^<failure message=/    failure: /' | head -20
  # A shell test's failed checks are its "FAIL:" lines.
  fail_lines "$dir/test.log"
  echo "  end of $dir/test.log:"
  tail -15 "$dir/test.log" 2>/dev/null | cut -c1-300 | sed 's/^/  | /'
done

# A test that passed only on a later attempt (flaky = True) counts as
# passed, and what failed in its earlier attempts is shown.
for entry in "${flaky[@]}"; do
  label=${entry%%|*}
  echo "test.sh: FLAKY $label (passed on a later attempt); the failed attempts' FAIL lines:"
  for a in "bazel-testlogs/${entry#*|}"/test_attempts/attempt_*.log; do
    [ -f "$a" ] || continue
    echo "  $a:"
    fail_lines "$a"
  done
done

line="$passed passed, $failed failed"
[ "$skipped" -gt 0 ] && line="$line, $skipped skipped"
echo "$line"
[ "$failed" = 0 ]

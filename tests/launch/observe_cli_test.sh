#!/usr/bin/env bash
# Issue 15, seeing the run, through the binary:
#   - --metrics: a JSONL file whose every record has the documented keys
#     (one process, and DDP over 2 ranks with the all-reduce figures);
#   - --trace: well-formed Chrome trace JSON per rank ({rank} in the name),
#     spans on the step, loader, host-to-device and comm lanes, only the
#     --trace-steps range, and comm spans queued during backward spans on
#     both ranks of a 2-rank DDP run (small buckets, so the first launches
#     early), overlapping them where a core is free;
#   - dtrain report: the page rendered by headless Chromium, and the
#     screenshot's eight plot areas each with a drawn series (pixels);
#   - dtrain top: says why there is no GPU to show and finds the ranks of a
#     running job through their status files;
#   - progress: the live line on a terminal (script(1)), the plain lines off
#     it, --quiet;
#   - bad input: --trace-steps, an unwritable metrics path, report errors.
set -uo pipefail

. "$(dirname "$(readlink -f "$0")")/../check_lib.sh"
obs_check=$(find_built tests/launch/obs_check) || exit 1
unshare_test_files
export DT_STATUS_DIR="$tmp/status"
unset DT_PROGRESS
DT_DATA_DIR=$(find_data_dir fashion-mnist) || exit 1
export DT_DATA_DIR
run() { timeout 300 "$dtrain" "$@" >"$out" 2>"$err"; rc=$?; }
# ---- one process: metrics and trace ------------------------------------------
one="$tmp/one"
mkdir -p "$one"
run train --max-steps 24 --log-interval 6 --metrics "$one/metrics.jsonl" \
  --trace "$one/trace-{rank}.json" --trace-steps 3:5
expect 0 out "^test_accuracy=0\.[0-9]{4}$" "a run with --metrics and --trace"
expect 0 out "^epoch 1 step 6/24 loss " "off a terminal the plain progress lines stay"
expect_cmd "one process: every metrics record has the documented keys" \
  "$obs_check" metrics "$one/metrics.jsonl" --world 1
expect_cmd "one process: the trace has step, loader and host-to-device spans of steps 3..5 only" \
  "$obs_check" trace "$one/trace-0.json" --lanes step,loader,host-to-device --steps 3:5
[ "$(grep -c '"type":"train"' "$one/metrics.jsonl")" = 4 ] ||
  fail "24 steps logged every 6: expected 4 train records"

# ---- DDP over 2 ranks: comm overlapping backward -----------------------------
# 26 traced steps: one that overlaps is enough, and a loaded machine can
# delay the communication thread past backward in a few (one run of 6 once did).
ddp="$tmp/ddp"
mkdir -p "$ddp"
run launch -n 2 -- train --batch 32 --max-steps 30 --log-interval 10 --first-bucket-mb 0.05 \
  --bucket-cap-mb 0.1 --metrics "$ddp/metrics.jsonl" --trace "$ddp/trace-{rank}.json" \
  --trace-steps 4:29
expect 0 out "^test_accuracy=0\.[0-9]{4}$" "2 ranks with --metrics and --trace"
expect_cmd "DDP: every record has the documented keys, all-reduce time and hidden share" \
  "$obs_check" metrics "$ddp/metrics.jsonl" --world 2 --ddp
# Every bucket but the last is queued while backward runs. It runs at once
# when a core is free; on a machine whose cores the ranks fill (CI's 2), the
# communication thread (SCHED_BATCH, dist/comm_thread.c) does not preempt backward
# and runs when backward ends, so the spans overlap only with a core to spare.
overlap=()
[ "$(nproc)" -ge 4 ] && overlap=(--overlap comm:backward)
for r in 0 1; do
  expect_cmd "DDP rank $r: spans per lane, comm queued during backward${overlap:+ and overlapping it}" \
    "$obs_check" trace "$ddp/trace-$r.json" --lanes step,loader,host-to-device,comm \
    --launched-during comm:backward "${overlap[@]}" --steps 4:29
done

# ---- dtrain report, rendered in headless Chromium ----------------------------
run report "$ddp"
expect 0 out "wrote .*/ddp/report.html" "dtrain report RUN_DIR writes RUN_DIR/report.html"
cp "$ddp/report.html" "$out"
expect_not out "<script|https?://" "the report holds no script and fetches nothing"
chromium=$(command -v chromium-headless-shell || command -v chromium || true)
if [ -z "$chromium" ]; then
  fail "no headless Chromium to render the report: tools/setup.sh --chromium installs it"
else
  rm -f "$ddp/shot.png"
  (cd "$tmp" && HOME="$tmp" timeout 120 "$chromium" --no-sandbox --disable-gpu --hide-scrollbars \
    --window-size=1200,1500 --screenshot="$ddp/shot.png" "file://$ddp/report.html" \
    >"$tmp/chromium.log" 2>&1)
  expect_cmd "the report as Chromium draws it: 8 plot areas, each with a series drawn" \
    "$obs_check" png "$ddp/shot.png" --panels 8
fi
# Issue 32: a metrics file is data, never script. Payloads that set the
# page's title to 7 when they run (short enough to survive the report's
# 31-character split), in every string value and key the report shows (the
# run record's values and keys, an evaluation's split and its metric key),
# rendered by Chromium: the title must stay the report's. Before the fix
# the split reached the page as markup and Chromium's title became 7.
xss="<svg onload=document.title=7>"
xss2="<img src=x onerror=document.title=7>"
{
  printf '{"type":"run","model":"%s","data":"%s","device":"%s","comm":"%s","%s":"%s","world":1}\n' \
    "$xss" "$xss2" "$xss" "$xss2" "$xss" "$xss2"
  printf '{"type":"train","step":1,"epoch":1,"time":0.1,"loss":2.0,"lr":0.1,"samples_per_s":10}\n'
  printf '{"type":"eval","split":"%s","step":1,"epoch":1,"%s_loss":1.5,"%s_%s":0.5}\n' \
    "$xss" "$xss" "$xss" "$xss2"
} >"$tmp/xss.jsonl"
run report "$tmp/xss.jsonl" --out "$tmp/xss.html"
expect 0 out "wrote $tmp/xss.html" "dtrain report of a metrics file full of markup"
cp "$tmp/xss.html" "$out"
expect_not out "<svg onload|<img src=x" "no value reaches the page as markup"
expect 0 out "Content-Security-Policy" "the page forbids script (Content-Security-Policy)"
if [ -n "$chromium" ]; then
  (cd "$tmp" && HOME="$tmp" timeout 120 "$chromium" --no-sandbox --disable-gpu --virtual-time-budget=2000 \
    --dump-dom "file://$tmp/xss.html" >"$tmp/xss.dom" 2>"$tmp/chromium-xss.log")
  cp "$tmp/xss.dom" "$out"
  expect 0 out "<title>dtrain report</title>" "Chromium renders the page and no payload ran"
  expect_not out "<title>7</title>" "no script of the metrics file ran in Chromium"
fi
run report "$one/metrics.jsonl" --out "$tmp/one.html"
expect 0 out "wrote $tmp/one.html" "dtrain report METRICS_FILE --out FILE"
expect 0 out "" "(report of a single process)"
grep -q "no all-reduce: a single process" "$tmp/one.html" ||
  fail "a single process's report says it has no all-reduce"
run report "$tmp/nonexistent"
expect 1 err "dtrain: error: cannot read the metrics file .*nonexistent" "report of a missing run"
printf '{"type":"run"}\nnot json\n' >"$tmp/bad.jsonl"
run report "$tmp/bad.jsonl"
expect 1 err "bad.jsonl line 2 is not a JSON object" "report names the bad line"
run report
expect 2 err "which run\?" "report without a run"

# ---- dtrain top ----------------------------------------------------------------
# A status folder that cannot be one: training goes on, saying so once.
touch "$tmp/a-file"
for bad in /proc/nope "$tmp/a-file"; do
  DT_STATUS_DIR=$bad run train --model mlp --max-steps 1 --log-interval 0 --threads 1
  expect 0 out "^dtrain train: warning: cannot use the status folder $bad \(for dtrain top\): .*dtrain top will not show this run" \
    "DT_STATUS_DIR=$bad is named on the log (it was accepted silently)"
done
run top --once --status-dir "$tmp/empty-status"
if [ "${DT_TEST_HAS_GPU:-0}" = 1 ]; then
  expect 0 out "^GPUs: [0-9]+" "top lists the GPUs"
else
  expect 0 out "^GPUs: none to show: GPU monitor unavailable: " "top without a GPU says why"
fi
expect 0 out "^jobs: no running dtrain job \(no live status file in .*empty-status" \
  "top without a job says where it looked"
# Long enough that a quiet machine is still training when top looks (400
# steps ended before it on one); the job is killed below.
"$dtrain" train --epochs 100 --max-steps 40000 --log-interval 0 >"$tmp/bg.out" 2>&1 &
bg=$!
for _ in $(seq 1 100); do
  ls "$DT_STATUS_DIR"/*.json >/dev/null 2>&1 && break
  sleep 0.2
done
sleep 1.2
run top --once
expect 0 out "^job pid$bg: lenet on fashion-mnist, 1 rank" "top finds a running job"
expect 0 out "^  rank 0 .* pid $bg .*(training|evaluating|starting).* step [0-9]+/40000" \
  "top shows the rank's step of the run"
kill "$bg" 2>/dev/null
wait "$bg" 2>/dev/null
run top --once
expect 0 out "^jobs: no running dtrain job" "a killed job's stale file is not shown"
run top --interval 0
expect 2 err "invalid value '0' for --interval" "top --interval 0"

# ---- progress on a terminal, --quiet ------------------------------------------
if command -v script >/dev/null 2>&1; then
  script -qec "$dtrain train --max-steps 12 --log-interval 4" /dev/null >"$out" 2>"$err" </dev/null
  rc=$?
  expect 0 out "\[[#.]{20}\] ep 1/1 +[0-9]+% step [0-9]+/12 [0-9]+ samples/s ETA ep [0-9?:]+ run [0-9?:]+" \
    "on a terminal: one live line with a bar, steps, throughput and ETAs"
  expect_not out "epoch 1 step 4/12 loss" "on a terminal the plain lines give way to the live one"
else
  fail "script(1) (util-linux) is needed to test the terminal progress line"
fi
run train --max-steps 12 --log-interval 4 --quiet
expect 0 out "^test_accuracy=" "--quiet still ends with the result"
expect_not out "^dtrain train: model|^epoch 1 step" "--quiet prints no header and no progress lines"

# ---- bad input ----------------------------------------------------------------
run train --trace-steps 5:2
expect 2 err "invalid value '5:2' for --trace-steps" "--trace-steps backwards"
run train --max-steps 2 --metrics "$tmp/no/such/dir/m.jsonl"
expect 1 err "dtrain: error: cannot create the metrics file .*/no/such/dir/m.jsonl" \
  "an unwritable --metrics path"

echo "observe_cli_test: $checks checks, $failures failed"
[ "$failures" = 0 ]

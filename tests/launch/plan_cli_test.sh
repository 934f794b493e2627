#!/usr/bin/env bash
# dtrain plan (issue 29) through the binary:
#   - calibration: on the cpu device, plan's peak_memory_mib is within 10 %
#     of bench's measured peak_mem (one warm-up step, then one timed) for
#     MLP, LeNet-5, GPT-tiny and GPT-2 124M (a context of 16, micro-batch 1)
#     at fp32 and bf16, GPT-tiny with --recompute, ResNet-18 (small stem,
#     16 px; ImageNet stem, 32 px RGB, bf16; with --recompute), and under
#     ZeRO 0, 1 and 2 on 2 ranks (mpirun), ResNet-18 under ZeRO 2 too;
#   - --json prints one object with peak_memory_mib, step_ms and the
#     breakdown; micro-batch x accumulation x ranks is the global batch;
#   - a ResNet at --image-size: compute from the task's FLOPs at that size;
#   - bad flags exit 2 naming the flag.
# Step times are not checked here (speed belongs to bench): docs/plan.md.
set -uo pipefail

# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "$0")")/../check_lib.sh"

# field JSON_FILE KEY: a number of plan's JSON object.
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

# calibrate WORLD ARGS...: bench (under `dtrain launch -n WORLD` when 2)
# and plan with the same ARGS (plan with --gpus WORLD); the peaks within 10 %.
calibrate() {
  local world=$1
  shift
  local bench=("$dtrain" bench --steps 1 --warmup 1 --threads 1 "$@")
  [ "$world" = 1 ] || bench=("$dtrain" launch -n "$world" --threads 1 -- bench --steps 1 --warmup 1 "$@")
  if ! timeout 300 "${bench[@]}" >"$out" 2>"$err"; then
    fail "bench $*: exit status $?"
    return
  fi
  local measured
  measured=$(grep -oE 'peak_mem=[0-9.]+' "$out" | head -1 | cut -d= -f2)
  run_within 300 plan --json --threads 1 --gpus "$world" "$@"
  cp "$out" "$tmp/plan.json"
  if [ "$rc" != 0 ] || [ -z "$measured" ]; then
    fail "plan $*: exit status $rc, bench's peak '${measured}'"
    return
  fi
  local planned
  planned=$(field "$tmp/plan.json" peak_memory_mib)
  if awk -v p="$planned" -v m="$measured" 'BEGIN { d = (p - m) / m; exit !(d <= 0.10 && d >= -0.10) }'; then
    ok "plan $* on $world rank(s): peak ${planned} MiB, bench ${measured} MiB"
  else
    not_ok "plan $* on $world rank(s): peak ${planned} MiB, bench measured ${measured} MiB (over 10 %)"
  fi
}

# ---- calibration against bench's measured peak ----------------------------
for precision in fp32 bf16; do
  calibrate 1 --model mlp --batch 64 --precision "$precision"
  calibrate 1 --model lenet --batch 256 --precision "$precision"
  calibrate 1 --model gpt2-tiny --batch 2 --precision "$precision"
done
calibrate 1 --model gpt2 --batch 1 --ctx 16 --precision bf16
calibrate 1 --model gpt2-tiny --batch 4 --recompute
# ResNets: the small stem at 16 px grey, and the ImageNet stem at 32 px RGB
# with recomputation of its residual blocks
calibrate 1 --model resnet18-small --batch 24 --image-size 16
calibrate 1 --model resnet18 --batch 24 --image-size 32 --channels 3 --precision bf16
calibrate 1 --model resnet18-small --batch 24 --image-size 16 --recompute
for zero in 0 1 2; do
  calibrate 2 --model gpt2-tiny --batch 2 --zero "$zero"
done
calibrate 2 --model mlp --batch 32 --zero 2
# ZeRO 2 on a model with most of its parameters at its end: its big
# buckets fill beside nearly all the activations (train/plan_zero2.c)
calibrate 2 --model resnet18 --batch 16 --image-size 32 --channels 3 --zero 2

# ZeRO 2 with accumulation keeps every gradient whole between the
# micro-batches: train's measured peak (its metrics) against plan's at the
# same global batch
if data_dir=$(find_data_dir fashion-mnist); then
  if timeout 300 "$dtrain" launch -n 2 --threads 1 -- train --model mlp --data-dir "$data_dir" \
    --batch 64 --accum 2 --zero 2 --max-steps 2 --warmup 0 --log-interval 1 \
    --run-dir "$tmp/accum-run" --metrics "$tmp/accum.jsonl" >"$out" 2>"$err"; then
    run_within 300 plan --json --threads 1 --gpus 2 --model mlp --batch 64 --global-batch 256 --zero 2
    cp "$out" "$tmp/accum-plan.json"
    check "plan --zero 2 with accumulation 2: peak within 10 % of train's" python3 - \
      "$tmp/accum.jsonl" "$tmp/accum-plan.json" <<'EOF'
import json, sys
peaks = [m["peak_mib"] for line in open(sys.argv[1]) for m in json.loads(line).get("memory", [])]
plan = json.load(open(sys.argv[2]))
assert plan["accumulation"] == 2, plan
measured, planned = max(peaks), plan["peak_memory_mib"]
assert abs(planned - measured) <= 0.10 * measured, (planned, measured)
print(f"planned {planned} MiB, train measured {measured:.1f} MiB")
EOF
  else
    fail "train --zero 2 --accum 2 on 2 ranks: exit status $?"
  fi
else
  fail "no fashion-mnist for the accumulation check"
fi

# ---- the JSON object and the batch arithmetic -----------------------------
run_within 120 plan --model gpt2-tiny --device h100 --gpus 8 --nodes 2 --precision bf16 \
  --global-batch 512 --zero 1 --json --threads 1
cp "$out" "$tmp/h100.json"
expect 0 out '^\{.*"peak_memory_mib": [0-9.]+.*"step_ms": [0-9.]+.*\}$' "plan --json: one object"
check "plan --json: the object's fields and the global batch" python3 - "$tmp/h100.json" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
assert text.count("\n") == 1, "more than one line"
d = json.loads(text)
for k in ("peak_memory_mib", "step_ms", "micro_batch", "accumulation", "ranks", "global_batch",
          "max_micro_batch", "rule_batch", "mfu", "tokens_per_s", "comm_ms"):
    assert k in d, k
assert d["ranks"] == 16 and d["global_batch"] == 512, d
assert d["micro_batch"] * d["accumulation"] * d["ranks"] == 512, d
m = d["memory_mib"]
parts = ("weights", "copies", "gradients", "optimizer", "activations", "workspace", "comm", "overhead")
assert abs(sum(m[k] for k in parts) - d["peak_memory_mib"]) < 0.5, (m, d["peak_memory_mib"])
assert m["workspace"] > 0 and m["overhead"] > 0, m  # a GPU's
assert d["step_ms"] > 0 and d["comm_ms"] > 0 and 0 < d["mfu"] < 1, d
assert d["straggler_ms"] == 0, d  # no spread measured on a GPU
assert d["comm_exposed_ms"] < d["comm_ms"], d  # DDP hides part of it behind the backward
EOF
# ZeRO 1 shards the optimizer state over the 16 ranks: 1/16 of ZeRO 0's.
run_within 120 plan --model gpt2-tiny --device h100 --gpus 8 --nodes 2 --precision bf16 --json \
  --threads 1
check "plan: --zero 1 holds 1/16 of the optimizer state" python3 -c '
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert abs(a["memory_mib"]["optimizer"] * 16 / b["memory_mib"]["optimizer"] - 1) < 0.03, (a, b)' \
  "$tmp/h100.json" "$out"
run_within 120 plan --model mlp --device a100 --threads 1
expect 0 out 'largest micro-batch that fits [0-9]+; the seed.s rule .* = [0-9]+' "plan: the text"
# A ResNet at another image size (--image-size, --channels): the compute
# term is the task's FLOPs at that size (3x32x32, 10 classes: 6 per forward
# multiply-add, 4 for conv1's) at 0.7 of the bf16 peak; the probe runs there.
run_within 120 plan --model resnet18-small --device h100 --batch 32 --precision bf16 \
  --image-size 32 --channels 3 --json --threads 1
check "plan: resnet18-small at 32 px, RGB: compute from the task's FLOPs" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
macs = 32 * 32 * (64 * 3 * 9 + 4 * 64 * 64 * 9) + 16 * 16 * (128 * 64 * 9 + 3 * 128 * 128 * 9 + 64 * 128) \
    + 8 * 8 * (256 * 128 * 9 + 3 * 256 * 256 * 9 + 128 * 256) \
    + 4 * 4 * (512 * 256 * 9 + 3 * 512 * 512 * 9 + 256 * 512) + 512 * 10
fps = 6 * macs - 2 * 32 * 32 * 64 * 3 * 9
want = fps * 32 / (d["peak_tflops"] * 1e12 * 0.7) * 1e3
assert abs(d["compute_ms"] / want - 1) < 0.01, (d["compute_ms"], want)
assert d["step_ms"] > d["compute_ms"] > 0, d' "$out"

# ---- the CPU's roofs at the plan's shapes -------------------------------
# bf16 on the CPU (no 16-bit FMA) runs at the measured roof of the
# backend's 16-bit linear at the micro-batch's rows (2 x 64 tokens), not at
# the f32 sgemm's; the activations' traffic at the copy bandwidth of their
# size (act_bw_gbs).
run_within 300 plan --model gpt2-tiny --device cpu --batch 2 --ctx 64 --precision bf16 --json \
  --threads 1
check "plan --device cpu --precision bf16: the 16-bit linear's roof at 128 rows" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["peak_source"].startswith("cpu bf16 linear 128x768^2"), d["peak_source"]
assert d["peak_tflops"] > 0 and d["act_bw_gbs"] > 0, d' "$out"
run_within 300 plan --model mlp --device cpu --batch 64 --json --threads 1
check "plan --device cpu at fp32: the sgemm roof" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["peak_source"].startswith("cpu sgemm"), d["peak_source"]
assert d["act_bw_gbs"] > 0, d' "$out"

# ---- the CPU's step on 2 ranks (docs/plan.md, stop 39) ----------------------
# the collectives are all exposed (the rank's cores do them), the step waits
# for the slowest rank, and the parts add up to the step
run_within 300 plan --model lenet --device cpu --gpus 2 --batch 64 --threads 1 --json
cp "$out" "$tmp/cpu2.json"
run_within 300 plan --model lenet --device cpu --batch 64 --threads 1 --json
check "plan on 2 cpu ranks: collectives exposed, a wait for the slowest, the step its parts" \
  python3 - "$tmp/cpu2.json" "$out" <<'EOF'
import json, sys
two, one = (json.load(open(f)) for f in sys.argv[1:3])
assert two["comm_ms"] > 0 and abs(two["comm_exposed_ms"] - two["comm_ms"]) < 1e-3, two
assert two["straggler_ms"] > 0, two
assert one["straggler_ms"] == 0 and one["comm_ms"] == 0, one
parts = two["compute_ms"] + two["optimizer_ms"] + two["comm_exposed_ms"] + two["straggler_ms"]
assert abs(parts - two["step_ms"]) < 0.01, (parts, two["step_ms"])
EOF

# ---- the other ranks' load on cpu (launch/plan_load.h) ---------------------
# a plan for 3 ranks a node starts copies of the probe's steps (2, or one
# fewer than the cores at one thread a rank) and stops them
run_within 300 plan --model mlp --device cpu --gpus 3 --batch 16 --threads 1 --json
expect 0 out '"ranks": 3' "plan --gpus 3 on cpu: the probe measured beside copies of its steps"
check "plan --gpus 3: no copy of the probe's steps left running" bash -c \
  '! pgrep -f -- "--gpus 3 --batch 16 --threads 1 --json [-]-probe-load"'
# a copy runs until its stdin ends, having said "r" after its first step
check "plan --probe-load: says ready, runs until stdin ends" bash -c '
  exec 3< <(sleep 2)
  timeout 60 "$1" plan --model mlp --threads 1 --probe-load <&3 >"$2"
  [ "$?" = 0 ] && [ "$(cat "$2")" = r ]' _ "$dtrain" "$tmp/load.out"

# ---- bad flags: exit 2 naming the flag ------------------------------------
run plan --model mlp --device tpu
expect 2 err '--device' "plan --device tpu"
run plan --model mlp --zero 3
expect 2 err '--zero' "plan --zero 3"
run plan --model mlp --gpus 0
expect 2 err '--gpus' "plan --gpus 0"
run plan --model mlp --gpus 4 --global-batch 10
expect 2 err '--global-batch 10: not a multiple of the 4 ranks' "plan: a global batch the ranks do not divide"
run plan --model mlp --gpus 2 --global-batch 64 --batch 3
expect 2 err '--global-batch 64: .* --batch 3' "plan: a micro-batch that does not divide it"
run plan --model mlp --global-batch 1.5
expect 2 err '--global-batch' "plan --global-batch 1.5"
run plan --model mlp --precision tf32
expect 2 err '--precision tf32' "plan: tf32 on the cpu"
run plan --model gpt2-tiny --ctx 100000
expect 2 err '--ctx' "plan --ctx beyond the model's"
run plan --model gpt2-tiny --image-size 64
expect 2 err '--image-size: model gpt2-tiny does not take images of another size' \
  "plan --image-size for a language model"
run plan --model resnet18 --channels 2
expect 2 err '--channels 2' "plan --channels 2"
# bench takes the same image shape: the header names it, peak memory grows
run_within 120 bench --model resnet18 --image-size 32 --channels 3 --batch 2 --steps 1 --warmup 0 \
  --threads 1
expect 0 out "model resnet18 \(11181642 parameters\) images 32x32 px, 3 channel\(s\) batch 2" \
  "bench --image-size 32 --channels 3: the header names the images"
run bench --model lenet --image-size 32 --steps 1
expect 1 err "--image-size: model lenet does not take images of another size" \
  "bench --image-size for LeNet (built for 28 px)"
run plan --model mlp --memory-gib -1
expect 2 err '--memory-gib' "plan --memory-gib -1"

echo "$test_name: $checks checks, $failures failed"
[ "$failures" = 0 ]

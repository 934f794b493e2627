#!/usr/bin/env bash
# Checkpoints of a language model (issues 11 and 13), through the dtrain
# binary, on a small Brown data set the test tokenizes (two files to train
# on, one to validate: the evaluation at the end of a run stays short):
#   - GPT-tiny bit-exact resume: N steps = N/2 + resume + N/2 with --accum 2
#     and --ctx 16, every parameter and AdamW moment bitwise equal (the files
#     byte for byte and the tensors by the independent numpy reader), one
#     process and DDP over 2 ranks;
#   - llama-tiny on 2 ranks under DDP (batch 2 each) ends 8 steps with 1
#     rank's (batch 4) validation loss (within 1e-3), parameters and AdamW
#     moments (within 5e-2 of each tensor's largest value: Adam's
#     m/sqrt(v) turns tiny differences of near-zero gradients into whole
#     steps; measured 1.7e-2 in stop 27, 4.04e-2 on stop 32's code and
#     machine, and 1e-5 on the logits); under --zero 1
#     and 2 the parameters are DDP's byte for byte, in fp32 and bf16, and
#     bf16 on 2 ranks ends with 1 rank's validation loss (within 1e-3);
#   - --recompute (activation recomputation per block) ends the same run
#     with the same parameters and AdamW moments bit for bit, on 1 and 2
#     ranks; a model without transformer blocks is refused;
#   - the checkpoint records --ctx and --precision: a resume with another
#     is refused naming both;
#   - dtrain report of the run plots val_loss where a task has no metric;
#     train.log gets the plain progress lines while the live line is shown;
#     bench takes a language model's training defaults;
#   - dtrain sample: the final checkpoint continues a prompt with the text
#     the training run printed (same model, prompt and seed); the same seed
#     gives the same text, other seeds other text; the text starts with the
#     prompt; a checkpoint that is not a language model's, a missing or a
#     damaged one, and an empty prompt are errors; a long sample streams
#     its text as it is drawn, and a full stdout is named.
set -uo pipefail
# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../check_lib.sh"
unshare_test_files
numpy_reader
src=$(find_data_dir gpt2 brown fashion-mnist) || exit 1
[ -d "$src/brown/raw" ] || { echo "$test_name: no $src/brown/raw (tools/setup.sh)" >&2; exit 1; }

# The small data set: data/gpt2 (the tokenizer) and brown/{train,val}.bin.
data="$tmp/data"
mkdir -p "$data"
ln -sfn "$src/gpt2" "$data/gpt2"
run tokenize --brown --in "$src/brown/raw/ca01" "$src/brown/raw/ca02" "$src/brown/raw/ca03" \
  --val-fraction 0.34 --out "$data/brown" --data-dir "$data"
expect 0 out "3 files \(2 train, 1 val\)" "a small Brown data set: 2 files to train on, 1 to validate"
export DT_DATA_DIR="$data"

ck() { printf '%s/checkpoints/step_%08d' "$1" "$2"; }
same_bits() { # same_bits CKPT_A CKPT_B
  cmp "$1/model.safetensors" "$2/model.safetensors" &&
    cmp "$1/trainer_state.bin" "$2/trainer_state.bin" &&
    "$py" "$numpy_tool" compare "$1" "$2"
}
launch() { # launch NP ARGS...: NP ranks (1 = a plain process), output to $out/$err
  local np=$1
  shift
  if [ "$np" = 1 ]; then
    timeout 300 "$dtrain" "$@" >"$out" 2>"$err"
  else
    timeout 300 "$dtrain" launch -n "$np" --threads 1 -- "$@" >"$out" 2>"$err"
  fi
  rc=$?
}

# ---- bit-exact resume ----
steps=8
lm=(train --model gpt2-tiny --ctx 16 --warmup 1 --accum 2 --log-interval 0 --threads 1
  --max-steps $steps --sample-len 16 --prompt "The jury said")
for np in 1 2; do
  d="$tmp/exact-$np"
  launch "$np" "${lm[@]}" --batch $((4 / np)) --save-every $((steps / 2)) --run-dir "$d/full"
  expect 0 out "^val_loss=" "gpt2-tiny on $np rank(s): $steps steps of --accum 2, saving at $((steps / 2))"
  cp "$out" "$d/full.out"
  launch "$np" "${lm[@]}" --batch $((4 / np)) --run-dir "$d/resumed" \
    --resume "$(ck "$d/full" $((steps / 2)))"
  expect 0 out "resumed from .*step_0*$((steps / 2)): optimizer step $((steps / 2))" \
    "gpt2-tiny on $np rank(s): resumed at step $((steps / 2))"
  expect_cmd "gpt2-tiny on $np rank(s), --accum 2: N = N/2 + resume + N/2, bitwise" \
    same_bits "$(ck "$d/full" $steps)" "$(ck "$d/resumed" $steps)"
  launch "$np" "${lm[@]}" --batch $((4 / np)) --recompute --run-dir "$d/recompute"
  expect 0 out "^val_loss=" "gpt2-tiny on $np rank(s) with --recompute"
  expect_cmd "gpt2-tiny on $np rank(s): --recompute ends with the same parameters and moments, bitwise" \
    same_bits "$(ck "$d/full" $steps)" "$(ck "$d/recompute" $steps)"
done
launch 1 bench --model mlp --recompute --steps 1 --warmup 0
expect 1 err "\`recompute\` on task mlp: recomputation is per transformer or residual block: a GPT-2, Llama or ResNet model" \
  "--recompute of a model without transformer blocks is refused, naming it"

# ---- llama-tiny under DDP (issue 31): 2 ranks x batch 2 match 1 x batch 4 ----
for np in 1 2; do
  launch "$np" train --model llama-tiny --ctx 16 --batch $((4 / np)) --max-steps 8 --lr 0.01 \
    --warmup 0 --log-interval 0 --sample-len 0 --threads 1 --run-dir "$tmp/llama-$np"
  expect 0 out "^val_loss=" "llama-tiny on $np rank(s), global batch 4: 8 AdamW steps at lr 0.01"
  llama_val[np]=$(sed -n 's/^val_loss=//p' "$out")
done
within "${llama_val[1]}" "${llama_val[2]}" 1e-3
check_status $? "llama-tiny: val_loss on 2 ranks (${llama_val[2]}) is 1 rank's (${llama_val[1]}) within 1e-3"
expect_cmd "llama-tiny: 2 ranks end with 1 rank's parameters and moments (within 5e-2 relative: Adam)" \
  "$py" "$numpy_tool" compare "$(ck "$tmp/llama-1" 8)" "$(ck "$tmp/llama-2" 8)" --rtol 5e-2

# ZeRO 1 and 2 shard the same sums: the parameters are DDP's byte for byte;
# bf16 autocast the same on 1 rank, 2 ranks and 2 ranks under ZeRO 2.
llama8=(train --model llama-tiny --ctx 16 --max-steps 8 --lr 0.01 --warmup 0 --log-interval 0
  --sample-len 0 --threads 1)
for z in 1 2; do
  launch 2 "${llama8[@]}" --batch 2 --zero "$z" --run-dir "$tmp/llama-zero$z"
  expect 0 out "^val_loss=${llama_val[2]}$" "llama-tiny on 2 ranks, --zero $z: DDP's val_loss"
  expect_cmd "llama-tiny on 2 ranks: --zero $z ends with DDP's parameters byte for byte" \
    cmp "$(ck "$tmp/llama-2" 8)/model.safetensors" "$(ck "$tmp/llama-zero$z" 8)/model.safetensors"
done
for run in "1 4 0" "2 2 0" "2 2 2"; do
  read -r np b z <<<"$run"
  launch "$np" "${llama8[@]}" --batch "$b" --precision bf16 --zero "$z" \
    --run-dir "$tmp/llama-bf16-$np-$z"
  expect 0 out "^val_loss=" "llama-tiny in bf16 on $np rank(s), --zero $z"
  llama_bf16[np * 10 + z]=$(sed -n 's/^val_loss=//p' "$out")
done
within "${llama_bf16[10]}" "${llama_bf16[20]}" 1e-3
check_status $? "llama-tiny in bf16: val_loss on 2 ranks (${llama_bf16[20]}) is 1 rank's (${llama_bf16[10]}) within 1e-3"
expect_cmd "llama-tiny in bf16 on 2 ranks: --zero 2 ends with DDP's parameters byte for byte" \
  cmp "$(ck "$tmp/llama-bf16-2-0" 8)/model.safetensors" "$(ck "$tmp/llama-bf16-2-2" 8)/model.safetensors"

# ---- --ctx is part of the checkpoint ----
full="$tmp/exact-1/full"
launch 1 "${lm[@]}" --batch 4 --ctx 32 --run-dir "$tmp/ctx32" \
  --resume "$(ck "$full" $((steps / 2)))"
expect 1 err "the checkpoint was written with --ctx 16, this run has --ctx 32" \
  "a resume with another --ctx is refused, naming both"

launch 1 "${lm[@]}" --batch 4 --precision bf16 --run-dir "$tmp/bf16" \
  --resume "$(ck "$full" $((steps / 2)))"
expect 1 err "the checkpoint was written with --precision default, this run has --precision bf16" \
  "a resume with another --precision is refused, naming both"

# ---- dtrain sample ----
final=$(ck "$full" $steps)
# The text the training run printed at its end (between "sample (...):" and ---).

awk '/^sample \(/ { on = 1; next } /^---$/ { on = 0 } on' "$full/train.log" >"$tmp/train_sample"
sample() { # sample ARGS...: dtrain sample of $final, stdout to $out
  timeout 120 "$dtrain" sample --checkpoint "$final" --threads 1 "$@" >"$out" 2>"$err"
  rc=$?
}
sample --sample-len 16 --prompt "The jury said"
expect 0 err "checkpoint .*step_0*$steps \(model gpt2-tiny, context 16, optimizer step $steps\)" \
  "dtrain sample names the checkpoint, its model and its context"
cp "$out" "$tmp/s0"
expect_cmd "the checkpoint continues the prompt as the training run did (same model, prompt, seed)" \
  cmp "$tmp/train_sample" "$tmp/s0"
expect 0 out "^The jury said" "the text starts with the prompt"
sample --sample-len 16 --prompt "The jury said"
expect_cmd "the same seed gives the same text" cmp "$tmp/s0" "$out"
differs=0
for seed in 1 2 3; do
  sample --sample-len 16 --prompt "The jury said" --sample-seed $seed
  cmp -s "$tmp/s0" "$out" || differs=$((differs + 1))
done
expect_cmd "other seeds give other text ($differs of 3 differ)" test "$differs" -ge 1
sample --sample-len 8 --temperature 0
cp "$out" "$tmp/g0"
sample --sample-len 8 --temperature 0 --sample-seed 5
expect_cmd "greedy (--temperature 0) text does not depend on the seed" cmp "$tmp/g0" "$out"
expect 0 out "^<\|endoftext\|>" "without --prompt the text starts from <|endoftext|>"
"$dtrain" sample --checkpoint "$full" --sample-len 16 --prompt "The jury said" --threads 1 \
  >"$out" 2>"$err"
rc=$?
expect 0 err "step_0*$steps" "a run directory stands for its newest complete checkpoint"

run report "$full"
expect 0 out "" "dtrain report of the language model's run"
expect_cmd "its evaluation panel plots val_loss (the task has no metric)" \
  grep -q "val loss after each evaluation" "$full/report.html"
expect_cmd "... and the summary names the last val_loss" \
  grep -Eq "last val loss [0-9]+\.[0-9]{4}" "$full/report.html"
expect_cmd "... with no empty evaluation panel" \
  bash -c "! grep -q 'no evaluation recorded' '$full/report.html'"

run eval --checkpoint "$full" --threads 1
expect 0 out "^val_loss=[0-9]" "dtrain eval of a language model's checkpoint (at its --ctx)"
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; exit !(d < 2e-4 && d > -2e-4) }'; }
expect_cmd "... gives the run's last val_loss (within the last digit: other eval batches)" \
  close "$(grep -o '^val_loss=[0-9.]*' "$out" | cut -d= -f2)" \
  "$(grep -o '^val_loss=[0-9.]*' "$tmp/exact-1/full.out" | cut -d= -f2)"

run bench --model gpt2-tiny --ctx 16 --steps 1 --warmup 0 --threads 1
expect 0 out "^dtrain bench: model gpt2-tiny .* batch 16 .* optimizer adamw" \
  "dtrain bench of a language model takes its training defaults (batch 16, AdamW)"

# A long sample streams: its first tokens reach stdout while it runs.
timeout 20 "$dtrain" sample --checkpoint "$final" --threads 1 --sample-len 1000000000 \
  --prompt "The jury said" >"$out" 2>"$err"
rc=$?
expect 124 out "^The jury said.{8}" \
  "a 10^9-token sample shows its text as it is drawn (stopped after 20 s)"
timeout 120 "$dtrain" sample --checkpoint "$final" --threads 1 --sample-len 4 >/dev/full 2>"$err"
rc=$?
expect 1 err "writing the sample to the standard output failed: No space left on device" \
  "dtrain sample > /dev/full: exit 1 naming the cause"
run sample --checkpoint "$final" --prompt ""
expect 2 err "invalid value '' for --prompt" "an empty prompt (no tokens) is a command-line error"
run sample
expect 2 err "--checkpoint PATH is required" "dtrain sample without --checkpoint"
run sample --checkpoint "$tmp/nowhere"
expect 1 err "nowhere: no such checkpoint or run directory" "a missing checkpoint: exit 1 naming it"
cp -r "$final" "$tmp/flipped"
"$py" -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[len(b) - 8] ^= 0x20; open(p, 'wb').write(b)" \
  "$tmp/flipped/model.safetensors"
run sample --checkpoint "$tmp/flipped"
expect 1 err "flipped/model.safetensors: tensor .*: CRC32 mismatch" \
  "a damaged checkpoint: exit 1 naming the file and tensor"
DT_PROGRESS=bar run train --model mlp --data fashion-mnist --data-dir "$src" --max-steps 3 \
  --log-interval 1 --run-dir "$tmp/mlp"
expect 0 out "^test_accuracy=" "an MLP run with the live progress line (DT_PROGRESS=bar)"
expect_not out "^epoch 1 step 2/" "... which shows no plain progress lines on the console"
expect_cmd "... while its train.log gets them" grep -q "^epoch 1 step 2/" "$tmp/mlp/train.log"
run sample --checkpoint "$tmp/mlp"
expect 1 err "holds model mlp, which does not generate text" \
  "the checkpoint of a model that is not a language model: exit 1 naming it"

echo "$test_name: $checks checks, $failures failed"
[ "$failures" = 0 ]

#!/usr/bin/env bash
# Issue 31: `dtrain export --format hf` (models/hf_export.h) through the
# binary, on a small Brown data set the test tokenizes:
#   - gpt2-tiny and llama-tiny, a few AdamW steps at a large learning rate
#     (weights far from their N(0, 0.02) start, so that attention is not
#     near-uniform and a wrong RoPE or GQA convention shows), exported;
#     an independent reader (ckpt_numpy.py hf-logits: numpy only, the
#     forward passes of transformers' GPT2LMHeadModel and LlamaForCausalLM
#     written from their definitions, every stored tensor used) reproduces
#     dtrain's logits on a batch (lm_logits_tool) within 1e-4;
#   - the tokenizer files (vocab.json, merges.txt) and configs are there;
#   - errors: an unknown --format, no --out, an
#     --out that is a file, the checkpoint of a model that is not a
#     language model, a missing checkpoint.
set -uo pipefail
# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../check_lib.sh"
numpy_reader
"$py" -c "import numpy" || { echo "FAIL: python3-numpy is missing (tools/setup.sh)"; exit 1; }
logits_tool=$(find_built tests/launch/lm_logits_tool) || exit 1
src=$(find_data_dir gpt2 brown fashion-mnist) || exit 1
[ -d "$src/brown/raw" ] || { echo "$test_name: no $src/brown/raw (tools/setup.sh)" >&2; exit 1; }

small_brown_data "$src"
"$py" "$numpy_tool" tokens "$tmp/tokens" 3 16 || exit 1

for model in gpt2-tiny llama-tiny; do
  run train --model "$model" --ctx 16 --max-steps 3 --batch 4 --optimizer adamw --lr 0.05 \
    --warmup 0 --log-interval 0 --run-dir "$tmp/$model"
  expect 0 out "checkpoint .* saved" "$model: 3 steps and a checkpoint"
  run export --checkpoint "$tmp/$model" --format hf --out "$tmp/$model-hf"
  expect 0 out "model $model, context 16.*Hugging Face layout" "$model: exported"
  for f in config.json generation_config.json model.safetensors vocab.json merges.txt \
    tokenizer_config.json; do
    [ -s "$tmp/$model-hf/$f" ] || not_ok "$model: $f is missing"
  done
  check "$model: dtrain's logits" "$logits_tool" "$tmp/$model" "$tmp/tokens" "$tmp/$model.f32"
  expect_cmd "$model: the numpy reader of the export reproduces them within 1e-4" \
    "$py" "$numpy_tool" hf-logits "$tmp/$model-hf" "$tmp/tokens" "$tmp/$model.f32"
done
grep -q '"n_positions": 16' "$tmp/gpt2-tiny-hf/config.json"
check_status $? "gpt2-tiny: n_positions is the checkpoint's context"
grep -q '"num_key_value_heads": 2' "$tmp/llama-tiny-hf/config.json"
check_status $? "llama-tiny: num_key_value_heads in config.json"

# ---- errors ----
ck="$tmp/gpt2-tiny"
run export --checkpoint "$ck" --format onnx --out "$tmp/x"
expect 2 err "onnx.*--format: expected one of hf, gguf" "an unknown --format: exit 2 naming it"
run export --checkpoint "$ck" --format hf
expect 2 err "--out PATH is required" "no --out: exit 2"
run export --checkpoint "$ck" --out "$tmp/x"
expect 2 err "--format FORMAT is required" "no --format: exit 2"
touch "$tmp/file"
run export --checkpoint "$ck" --format hf --out "$tmp/file"
expect 1 err "--out .*/file exists and is not a directory" "an --out that is a file: exit 1 naming it"
run export --checkpoint "$tmp/nothing" --format hf --out "$tmp/x"
expect 1 err "nothing" "a missing checkpoint: exit 1 naming it"
run train --model mlp --max-steps 1 --batch 8 --log-interval 0 --run-dir "$tmp/mlp"
expect 0 out "checkpoint .* saved" "an MLP checkpoint"
run export --checkpoint "$tmp/mlp" --format hf --out "$tmp/mlp-hf"
expect 1 err "holds model mlp, which does not generate text: dtrain export" \
  "the checkpoint of a model that is not a language model: exit 1 naming it"
[ ! -e "$tmp/mlp-hf" ] && [ ! -e "$tmp/x" ]
check_status $? "nothing written by a refused export"

echo "$test_name: $checks checks, $failures failed"
[ "$failures" = 0 ]

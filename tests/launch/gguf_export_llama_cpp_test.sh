#!/usr/bin/env bash
# Issue 31: `dtrain export --format gguf` (models/gguf_export.h) read by a
# real llama.cpp (npm node-llama-cpp@3.21.1, its prebuilt CPU build, from
# data/node-llama-cpp: tools/setup.sh), through gguf_llama_cpp.mjs:
#   - gpt2-tiny and llama-tiny, 3 AdamW steps at lr 0.05 on a small Brown set
#     (weights far from their start, so a wrong RoPE or GQA convention is
#     loud), exported as f32 GGUF: llama.cpp's tokens of five prompts equal
#     `dtrain tokenize`'s, and its teacher-forced log-probabilities over the
#     whole vocabulary, at every position, are within 2e-3 of dtrain's
#     (lm_logits_tool; measured ~1.5e-4 for GPT-2, whose ggml GELU goes
#     through an f16 table, ~1e-5 for Llama);
#   - llama.cpp's greedy continuation of each prompt (4 tokens, to the
#     context) is `dtrain sample --temperature 0`'s, up to a near-tie (top
#     two log-probabilities within 2e-3);
#   - --dtype f16 and bf16 files load and agree within 5e-2;
#   - errors: an unknown --dtype (exit 2), --dtype with --format hf, an --out
#     that is a folder, an --out in a missing folder.
set -uo pipefail
# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../check_lib.sh"
logits_tool=$(find_built tests/launch/lm_logits_tool) || exit 1
script=$(find_source tests/launch/gguf_llama_cpp.mjs) || exit 1
src=$(find_data_dir gpt2 brown fashion-mnist node-llama-cpp) || exit 1
[ -d "$src/brown/raw" ] || { echo "$test_name: no $src/brown/raw (tools/setup.sh)" >&2; exit 1; }
command -v node >/dev/null || { echo "$test_name: node is missing (tools/setup.sh)" >&2; exit 1; }

small_brown_data "$src"

# The prompts, one file each, tokenized by dtrain (each after <|endoftext|>)
prompts=("The quick brown fox jumps over the lazy dog." "Hello, world! It's 2024."
  "  leading spaces and	tabs" "Numbers: 3.14159 and 1,000,000" "The jury said it did find that")
files=()
for i in "${!prompts[@]}"; do
  printf '%s' "${prompts[$i]}" >"$tmp/prompt$i"
  files+=("$tmp/prompt$i")
done
run tokenize --in "${files[@]}" --val-fraction 0 --out "$tmp/prompts"
expect 0 out "wrote" "the prompts tokenized by dtrain"
check "the prompts' tokens, padded to the context" \
  node "$script" prep "$tmp/prompts/train.bin" 16 "$tmp/tokens"

for model in gpt2-tiny llama-tiny; do
  run train --model "$model" --ctx 16 --max-steps 3 --batch 4 --optimizer adamw --lr 0.05 \
    --warmup 0 --log-interval 0 --run-dir "$tmp/$model"
  expect 0 out "checkpoint .* saved" "$model: 3 steps and a checkpoint"
  check "$model: dtrain's logits" "$logits_tool" "$tmp/$model" "$tmp/tokens" "$tmp/$model.f32"
  mkdir -p "$tmp/$model-greedy"
  for i in "${!prompts[@]}"; do
    run sample --checkpoint "$tmp/$model" --prompt "${prompts[$i]}" --temperature 0 --sample-len 4
    [ "$rc" = 0 ] || not_ok "$model: dtrain sample of prompt $i exited $rc"
    cp "$out" "$tmp/$model-greedy/sample$i"
  done
  for dtype in f32 f16 bf16; do
    tol=5e-2
    [ "$dtype" = f32 ] && tol=2e-3
    run export --checkpoint "$tmp/$model" --format gguf --dtype "$dtype" \
      --out "$tmp/$model-$dtype.gguf"
    expect 0 out "model $model, context 16.*$model-$dtype.gguf \(GGUF\)" "$model: $dtype GGUF"
    expect_cmd "$model, $dtype: llama.cpp's tokens and log-probabilities (within $tol)" \
      node "$script" check "$src/node-llama-cpp" "$tmp/$model-$dtype.gguf" \
      "$tmp/prompts/train.bin" 16 "$tmp/$model.f32" 50304 "$tol" "${prompts[@]}"
  done
  expect_cmd "$model: llama.cpp's greedy continuations are dtrain sample --temperature 0's" \
    node "$script" greedy "$src/node-llama-cpp" "$tmp/$model-f32.gguf" 16 4 \
    "$tmp/$model-greedy" "${prompts[@]}"
done

# ---- errors ----
ck="$tmp/gpt2-tiny"
run export --checkpoint "$ck" --format gguf --dtype f64 --out "$tmp/x.gguf"
expect 2 err "f64.*--dtype: expected one of f32, f16, bf16" "an unknown --dtype: exit 2 naming it"
run export --checkpoint "$ck" --format hf --dtype f16 --out "$tmp/x"
expect 1 err "--dtype f16: --format hf writes f32 only" "--dtype with --format hf: exit 1"
mkdir -p "$tmp/folder"
run export --checkpoint "$ck" --format gguf --out "$tmp/folder"
expect 1 err "--out .*/folder is a directory" "a GGUF --out that is a folder: exit 1 naming it"
run export --checkpoint "$ck" --format gguf --out "$tmp/missing/x.gguf"
expect 1 err "missing" "a GGUF --out in a missing folder: exit 1 naming it"
[ ! -e "$tmp/x.gguf" ] && [ ! -e "$tmp/x" ] && [ ! -e "$tmp/missing" ]
check_status $? "nothing written by a refused export"

echo "$test_name: $checks checks, $failures failed"
[ "$failures" = 0 ]

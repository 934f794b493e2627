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
#   - train --init: each export loaded back and exported again is the same
#     file; refused naming the tensor: another architecture, another
#     context (shape), a missing and an extra tensor; --init with --resume
#     PATH (--resume auto, as --max-restarts adds, is accepted);
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
  # --init: the export loaded back (a step at lr 0 changes nothing), exported again
  run train --model "$model" --ctx 16 --max-steps 1 --batch 4 --optimizer sgd --lr 0 --min-lr 0 \
    --warmup 0 --log-interval 0 --init "$tmp/$model-hf" --run-dir "$tmp/$model-init"
  expect 0 out "checkpoint .* saved" "$model: --init DIR, a step at lr 0"
  run export --checkpoint "$tmp/$model-init" --format hf --out "$tmp/$model-init-hf"
  expect 0 out "Hugging Face layout" "$model: the --init run exported"
  cmp -s "$tmp/$model-hf/model.safetensors" "$tmp/$model-init-hf/model.safetensors"
  check_status $? "$model: --init loads every tensor of the export (the same file again)"
done
grep -q '"n_positions": 16' "$tmp/gpt2-tiny-hf/config.json"
check_status $? "gpt2-tiny: n_positions is the checkpoint's context"
grep -q '"num_key_value_heads": 2' "$tmp/llama-tiny-hf/config.json"
check_status $? "llama-tiny: num_key_value_heads in config.json"

# ---- errors ----
init() { run train --ctx 16 --max-steps 1 --batch 4 --warmup 0 --log-interval 0 --run-dir "$tmp/bad" "$@"; }
init --model llama-tiny --init "$tmp/gpt2-tiny-hf"
expect 1 err "init_path.*gpt2-tiny-hf/model.safetensors: no tensor model\.[a-z_.0-9]*weight" \
  "--init of a gpt2-tiny export into llama-tiny: refused naming the tensor"
init --model gpt2-tiny --ctx 32 --init "$tmp/gpt2-tiny-hf"
expect 1 err "tensor transformer.wpe.weight is \(16, 128\), model gpt2-tiny's is \(32, 128\)" \
  "--init at another context: refused naming the tensor and both shapes"
mkdir -p "$tmp/cut-hf" "$tmp/more-hf"
"$py" - "$tmp/gpt2-tiny-hf/model.safetensors" "$tmp/cut-hf" "$tmp/more-hf" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
def write(path, header):
    b = json.dumps(header).encode()
    b += b" " * (-len(b) % 8)
    open(path + "/model.safetensors", "wb").write(struct.pack("<Q", len(b)) + b + raw[8 + n:])
cut = dict(h); del cut["transformer.h.3.mlp.c_fc.bias"]
more = dict(h); more["transformer.h.4.ln_1.weight"] = h["transformer.h.3.ln_1.weight"]
write(sys.argv[2], cut); write(sys.argv[3], more)
PY
init --model gpt2-tiny --init "$tmp/cut-hf"
expect 1 err "cut-hf/model.safetensors: no tensor transformer.h.3.mlp.c_fc.bias \(512\)" \
  "--init missing a tensor: refused naming it"
init --model gpt2-tiny --init "$tmp/more-hf"
expect 1 err "tensor transformer.h.4.ln_1.weight, which model gpt2-tiny does not have" \
  "--init with an extra tensor (another n_layer): refused naming it"
init --model gpt2-tiny --init "$tmp/nothing-hf"
expect 1 err "nothing-hf/model.safetensors" "--init of a missing folder: refused naming the file"
init --model gpt2-tiny --init "$tmp/gpt2-tiny-hf" --resume "$tmp/gpt2-tiny-init"
expect 2 err "init.*resume" "--init with --resume PATH: refused"
# --resume auto (as --max-restarts adds): the newest checkpoint if any, else --init
run train --model gpt2-tiny --ctx 16 --max-steps 1 --batch 4 --warmup 0 --log-interval 0 \
  --init "$tmp/gpt2-tiny-hf" --resume auto --run-dir "$tmp/init-auto"
expect 0 out "checkpoint .* saved" "--init with --resume auto and no checkpoint yet: starts from --init"
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

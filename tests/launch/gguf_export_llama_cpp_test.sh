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
#   - train --init FILE.gguf (f32, f16, bf16): a step at lr 0 from it, then
#     the export in the same dtype, is the same file (f32: byte for byte;
#     f16/bf16 up to the sign of a zero, which the step may flip);
#   - --init refusals naming the file and the tensor: another architecture,
#     another context (a mis-shaped tensor), a missing and an extra tensor
#     (gguf_edit.py rewrites the header), a file that is not GGUF, a
#     truncated one, one claiming more tensor infos than it has bytes for
#     (refused before their table is allocated: under an address-space
#     limit that the table would not fit);
#   - errors: an unknown --dtype (exit 2), --dtype with --format hf, an --out
#     that is a folder, an --out in a missing folder.
set -uo pipefail
# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../check_lib.sh"
logits_tool=$(find_built tests/launch/lm_logits_tool) || exit 1
script=$(find_source tests/launch/gguf_llama_cpp.mjs) || exit 1
edit_tool=$(find_source tests/launch/gguf_edit.py) || exit 1
numpy_reader
src=$(find_data_dir gpt2 brown fashion-mnist node-llama-cpp) || exit 1
[ -d "$src/brown/raw" ] || { echo "$test_name: no $src/brown/raw (tools/setup.sh)" >&2; exit 1; }
command -v node >/dev/null || { echo "$test_name: node is missing (tools/setup.sh)" >&2; exit 1; }

small_brown_data "$src"

llama_cpp_prompts "$script" 16

for model in gpt2-tiny llama-tiny; do
  run train --model "$model" --ctx 16 --max-steps 3 --batch 4 --optimizer adamw --lr 0.05 \
    --warmup 0 --log-interval 0 --run-dir "$tmp/$model"
  expect 0 out "checkpoint .* saved" "$model: 3 steps and a checkpoint"
  check "$model: dtrain's logits" "$logits_tool" "$tmp/$model" "$tmp/tokens" "$tmp/$model.f32"
  greedy_samples "$tmp/$model" 4
  for dtype in f32 f16 bf16; do
    tol=5e-2
    [ "$dtype" = f32 ] && tol=2e-3
    run export --checkpoint "$tmp/$model" --format gguf --dtype "$dtype" \
      --out "$tmp/$model-$dtype.gguf"
    expect 0 out "model $model, context 16.*$model-$dtype.gguf \(GGUF\)" "$model: $dtype GGUF"
    expect_cmd "$model, $dtype: llama.cpp's tokens and log-probabilities (within $tol)" \
      node "$script" check "$src/node-llama-cpp" "$tmp/$model-$dtype.gguf" \
      "$tmp/prompts/train.bin" 16 "$tmp/$model.f32" 50304 "$tol" "${prompts[@]}"
    # --init FILE.gguf: loaded back (a step at lr 0 changes nothing), exported again
    run train --model "$model" --ctx 16 --max-steps 1 --batch 4 --optimizer sgd --lr 0 \
      --min-lr 0 --warmup 0 --log-interval 0 --sample-len 0 --init "$tmp/$model-$dtype.gguf" \
      --run-dir "$tmp/$model-init-$dtype"
    expect 0 out "checkpoint .* saved" "$model: --init FILE.gguf ($dtype), a step at lr 0"
    run export --checkpoint "$tmp/$model-init-$dtype" --format gguf --dtype "$dtype" \
      --out "$tmp/$model-rt-$dtype.gguf"
    expect 0 out "GGUF" "$model: the --init run exported ($dtype)"
    expect_cmd "$model: export $dtype -> --init -> export $dtype gives the same file" \
      "$py" - "$tmp/$model-$dtype.gguf" "$tmp/$model-rt-$dtype.gguf" "$dtype" <<'PY'
import sys
import numpy as np
a, b = (np.fromfile(f, np.uint8) for f in sys.argv[1:3])
same = len(a) == len(b)
if same and sys.argv[3] != "f32":  # 16-bit values at even offsets: only -0 and +0 may differ
    p = np.unique(np.nonzero(a != b)[0] & ~1)
    same = bool(np.all((a[p] | b[p]) == 0) and np.all((a[p + 1] ^ b[p + 1]) == 0x80) and
                np.all((a[p + 1] | b[p + 1]) == 0x80))
else:
    same = same and bool(np.array_equal(a, b))
print(f"{sys.argv[3]}: {len(a)} and {len(b)} bytes, {'the same' if same else 'different'}")
sys.exit(0 if same else 1)
PY
  done
  expect_cmd "$model: llama.cpp's greedy continuations are dtrain sample --temperature 0's" \
    node "$script" greedy "$src/node-llama-cpp" "$tmp/$model-f32.gguf" 16 4 \
    "$tmp/$model-greedy" "${prompts[@]}"
done

# ---- errors ----
refused() { # refused FILE PATTERN DESCRIPTION FLAGS...: train --init FILE exits 1 naming it
  local file=$1 pattern=$2 what=$3
  shift 3
  run train "$@" --max-steps 1 --batch 4 --warmup 0 --log-interval 0 --run-dir "$tmp/bad" \
    --init "$file"
  expect 1 err "$pattern" "$what"
}
g="$tmp/gpt2-tiny-f32.gguf"
refused "$g" "init_path .*gpt2-tiny-f32.gguf: architecture \"gpt2\", model llama-tiny's is \"llama\"" \
  "--init of a gpt2-tiny GGUF into llama-tiny: refused naming both architectures" \
  --model llama-tiny --ctx 16
refused "$g" "tensor position_embd.weight is \[128, 16\], model gpt2-tiny's is \[128, 32\]" \
  "--init GGUF at another context: refused naming the tensor and both shapes" --model gpt2-tiny --ctx 32
check "a GGUF without blk.3.ffn_up.bias, one with an extra blk.4.attn_norm.weight" \
  "$py" "$edit_tool" "$g" blk.3.ffn_up.bias blk.4.attn_norm.weight=blk.3.attn_norm.weight \
  "$tmp/cut.gguf" "$tmp/more.gguf"
head -c 5000000 "$g" >"$tmp/cut-short.gguf"
for bad in "cut.gguf: no tensor blk.3.ffn_up.bias \[512\], which model gpt2-tiny has|missing a tensor" \
  "more.gguf: tensor blk.4.attn_norm.weight, which model gpt2-tiny does not have|with an extra tensor" \
  "cut-short.gguf: tensor token_embd.weight: .* past the end|cut short"; do
  refused "$tmp/${bad%%:*}" "${bad%|*}" "--init GGUF ${bad#*|}: refused naming the file and tensor" \
    --model gpt2-tiny --ctx 16
done
refused "$tmp/prompts/train.bin" "train.bin: not a GGUF file" \
  "--init of a file that is not GGUF: refused naming it" --model gpt2-tiny --ctx 16
# A header claiming as many tensor infos as the file has bytes / 24, which
# its long padding string leaves no room for (each takes 24 bytes at least,
# 152 in memory): refused naming the file before their table is allocated.
# A file of 128 MiB (a hole) claims 5.6 million, a table of 810 MiB: under
# an address-space limit 384 MiB above what a 4 KiB such file needs
# (bisected), the refusal comes all the same.
many_infos() { # many_infos FILE SIZE
  "$py" - "$@" <<'PY'
import struct, sys
path, size = sys.argv[1], int(sys.argv[2])
def text(b): return struct.pack("<Q", len(b)) + b
kv = text(b"general.architecture") + struct.pack("<I", 8) + text(b"gpt2") + text(b"pad")
head = b"GGUF" + struct.pack("<IQQ", 3, size // 24, 2) + kv + struct.pack("<IQ", 8, 0)
pad = size - len(head)
with open(path, "wb") as f:
    f.write(head[:-8] + struct.pack("<Q", pad))
    f.truncate(size)
PY
}
many_infos "$tmp/many-small.gguf" 4096 && many_infos "$tmp/many.gguf" $((128 << 20))
check_status $? "GGUF headers claiming a tensor info per 24 bytes of the file"
refused "$tmp/many-small.gguf" "many-small.gguf: a truncated or malformed GGUF header" \
  "--init GGUF claiming more tensor infos than its bytes hold: refused naming the file" \
  --model gpt2-tiny --ctx 16
init_under() { # init_under KIB FILE: train --init FILE under ulimit -v KIB
  (ulimit -v "$1" && exec timeout 120 "$dtrain" train --model gpt2-tiny --ctx 16 --threads 1 \
    --max-steps 1 --batch 4 --warmup 0 --log-interval 0 --run-dir "$tmp/bad" --init "$2") \
    >"$out" 2>"$err"
  rc=$?
}
lo=$((128 << 10)) hi=$((16 << 20)) # KiB
while [ $((hi - lo)) -gt $((8 << 10)) ]; do
  mid=$(((lo + hi) / 2))
  init_under "$mid" "$tmp/many-small.gguf"
  if [ "$rc" = 1 ] && grep -q "many-small.gguf: a truncated" "$err"; then hi=$mid; else lo=$mid; fi
done
init_under $((hi + (512 << 10))) "$tmp/many.gguf"
expect 1 err "many.gguf: a truncated or malformed GGUF header" \
  "--init GGUF of 128 MiB claiming 5.6 million tensor infos: refused under ulimit -v $(((hi >> 10) + 512)) MiB (a 4 KiB one needs $((hi >> 10)))"
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

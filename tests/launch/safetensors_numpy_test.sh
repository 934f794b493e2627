#!/usr/bin/env bash
# model.safetensors read by an independent reader (ckpt_numpy.py: Python's
# json and struct, numpy; no dtrain code): the MLP's logits on the first 64
# test images, from the raw Fashion-MNIST files, match dtrain's within 1e-5.
set -uo pipefail
# Debian's python3 (python3-numpy), not one earlier on PATH.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
# shellcheck source=tests/check_lib.sh
. "$here/../check_lib.sh"
data_dir=$(find_data_dir fashion-mnist) || exit 1
logits_tool=$(find_built tests/launch/ckpt_logits_tool) || exit 1
"$py" -c "import numpy" || { echo "FAIL: python3-numpy is missing (tools/setup.sh)"; exit 1; }
"$dtrain" train --model mlp --max-steps 30 --batch 32 --log-interval 0 \
  --data-dir "$data_dir" --run-dir "$tmp/run" >"$tmp/out" 2>&1 || { cat "$tmp/out"; exit 1; }
ckpt="$tmp/run/checkpoints/step_00000030"
"$logits_tool" "$ckpt" "$data_dir" 64 "$tmp/logits.f32" || exit 1
"$py" "$here/ckpt_numpy.py" logits "$ckpt" "$data_dir" 64 "$tmp/logits.f32"

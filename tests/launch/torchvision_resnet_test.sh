#!/usr/bin/env bash
# Issue 28: dtrain's ResNets are torchvision's. resnet18, resnet50 and
# resnet18-small (the 3x3 stride-1 stem, no max-pool) train 2 steps on 64
# Fashion-MNIST images (so that every BatchNorm's running statistics and
# num_batches_tracked have moved); torchvision's own models (Debian's
# python3-torchvision, tools/setup.sh --torchvision) load the checkpoint's
# model.safetensors with load_state_dict(strict=True) (every parameter and
# buffer, the same names and shapes) and, in evaluation mode, reproduce
# dtrain's logits on 8 test images (ckpt_logits_tool) within 1e-4;
# --zero-init-residual zeroes the blocks' last BatchNorm weights;
# --channels-last trains the same weights (to rounding) into the same
# checkpoint layout.
set -uo pipefail
# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../check_lib.sh"
numpy_reader
logits_tool=$(find_built tests/launch/ckpt_logits_tool) || exit 1
script=$(find_source tests/launch/torchvision_resnet.py) || exit 1
src=$(find_data_dir fashion-mnist) || exit 1
"$py" -c "import torchvision" 2>/dev/null ||
  { echo "FAIL: python3-torchvision is missing (tools/setup.sh --torchvision)"; exit 1; }

small_image_data "$src" 64 32

for model in resnet18 resnet50 resnet18-small; do
  run train --model "$model" --max-steps 2 --batch 16 --lr 0.001 --min-lr 0 --log-interval 0 \
    --eval-batch 32 --data-dir "$data" --run-dir "$tmp/$model"
  expect 0 out "^test_accuracy=0\.[0-9]{4}$" "$model: 2 steps and an evaluation"
  ckpt="$tmp/$model/checkpoints/step_00000002"
  check "$model: dtrain's logits in evaluation mode" \
    "$logits_tool" "$ckpt" "$data" 8 "$tmp/$model.logits" "$model" "$tmp/$model.inputs"
  expect_cmd "$model: torchvision loads model.safetensors strictly and gives the same logits" \
    "$py" "$script" "$ckpt" "$model" 2 "$tmp/$model.inputs" "$tmp/$model.logits"
done

# --channels-last: the same 2 steps of resnet18 with NHWC activations give
# resnet18's checkpoint to rounding (every parameter and buffer), which
# torchvision loads and evaluates to dtrain's logits; models without
# residual convolutions refuse it.
run train --model resnet18 --channels-last --max-steps 2 --batch 16 --lr 0.001 --min-lr 0 \
  --log-interval 0 --eval-batch 32 --data-dir "$data" --run-dir "$tmp/cl"
expect 0 out "^test_accuracy=0\.[0-9]{4}$" "resnet18 --channels-last: 2 steps and an evaluation"
expect_cmd "--channels-last: the NCHW run's weights and buffers to rounding" "$py" - \
  "$(dirname "$script")" "$tmp/resnet18/checkpoints/step_00000002/model.safetensors" \
  "$tmp/cl/checkpoints/step_00000002/model.safetensors" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from ckpt_numpy import read_safetensors
a, b = read_safetensors(sys.argv[2]), read_safetensors(sys.argv[3])
assert sorted(a) == sorted(b), "the names differ"
worst = 0.0
for k in a:
    d = abs(a[k].astype("float64") - b[k].astype("float64")).max() if a[k].size else 0.0
    scale = abs(a[k].astype("float64")).max() if a[k].size else 0.0
    worst = max(worst, d / (scale + 1e-6))
    assert d <= 1e-4 * (scale + 1e-6), f"{k}: differs by {d} (scale {scale})"
print(f"{len(a)} tensors, worst relative difference {worst:.2e}")
PY
ckpt="$tmp/cl/checkpoints/step_00000002"
check "resnet18 --channels-last: dtrain's logits in evaluation mode" \
  "$logits_tool" "$ckpt" "$data" 8 "$tmp/cl.logits" resnet18 "$tmp/cl.inputs"
expect_cmd "resnet18 --channels-last: torchvision loads it strictly, the same logits" \
  "$py" "$script" "$ckpt" resnet18 2 "$tmp/cl.inputs" "$tmp/cl.logits"
run train --model lenet --channels-last --max-steps 1 --run-dir "$tmp/cl-lenet"
expect 2 err "^dtrain train: --channels-last: model lenet has no convolutions in residual blocks" \
  "--channels-last on LeNet: refused, naming the flag"

# --zero-init-residual: every block's last BatchNorm weight starts at 0
# (a step at lr 0 keeps it there), the others at 1; models without such
# blocks refuse it.
run train --model resnet50 --zero-init-residual --max-steps 1 --batch 16 --lr 0 --min-lr 0 \
  --log-interval 0 --eval-batch 32 --data-dir "$data" --run-dir "$tmp/zero"
expect 0 out "^test_accuracy=" "resnet50 --zero-init-residual: a step at lr 0"
expect_cmd "--zero-init-residual: bn3 weights 0, bn1/bn2/downsample.1 weights 1" "$py" - \
  "$(dirname "$script")" "$tmp/zero/checkpoints/step_00000001/model.safetensors" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from ckpt_numpy import read_safetensors
w = read_safetensors(sys.argv[2])
last = [k for k in w if k.startswith("layer") and k.endswith(".bn3.weight")]
other = [k for k in w if k.endswith("bn1.weight") or k.endswith("bn2.weight") or k.endswith("downsample.1.weight")]
assert len(last) == 16 and all((w[k] == 0).all() for k in last), "a bn3 weight is not 0"
assert all((w[k] == 1).all() for k in other), "another BatchNorm weight is not 1"
print(f"{len(last)} blocks start as the identity")
PY
run train --model mlp --zero-init-residual --max-steps 1 --run-dir "$tmp/zero-mlp"
expect 2 err "^dtrain train: --zero-init-residual: model mlp has no residual blocks ending in a BatchNorm" \
  "--zero-init-residual on the MLP: refused, naming the flag"

echo "$test_name: $checks checks, $failures failed"
[ "$failures" = 0 ]

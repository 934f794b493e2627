#!/usr/bin/env bash
# Issue 28: ResNet-18 with the small-image stem, trained on Fashion-MNIST
# written out as a PNG folder (`dtrain images`), on 2 ranks with --sync-bn
# (1 thread each), reaches test accuracy >= 0.90 on the 10,000 test images:
# one epoch (469 steps of global batch 128) at 20 px (the folder's 28 px
# images resized: 28 px trains at half the speed, 20 minutes an epoch on 2
# cores), AdamW at lr 2e-3, weight decay 0.05, warm-up 10, cosine.
# Measured (stop 30, this 2-core machine): 0.9079 in 10 minutes (stop 38,
# with the Winograd convolutions: 0.9073, 838 s on a slower 2-core machine,
# 16 px: 0.9027 and 0.8938, too near the bar); shorter
# runs fell short (0.8959 at 320 steps; one process of batch 128, 256
# steps: 0.8929; 28 px, 160 steps: 0.8812). That 2 ranks with --sync-bn
# compute one process's step is sync_bn_cli_test's (1 step, within 1e-4;
# more steps part by rounding, so a whole run is judged by its accuracy),
# as is the run's evaluation against `dtrain eval` of its checkpoint.
set -uo pipefail
# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../check_lib.sh"
unshare_test_files
data_dir=$(find_data_dir fashion-mnist) || exit 1
export DT_DATA_DIR="$data_dir"

run images --from fashion-mnist --out "$tmp/fm"
expect 0 out "70000 written" "Fashion-MNIST as a PNG folder: 60,000 + 10,000 images"
run launch -n 2 -- train --model resnet18-small --data "$tmp/fm" --image-size 20 --augment none \
  --optimizer adamw --lr 0.002 --weight-decay 0.05 --warmup 10 --eval-batch 500 --batch 64 \
  --sync-bn --epochs 1 --log-interval 100 --run-dir "$tmp/run"
expect 0 out "^test_accuracy=" "2 ranks with --sync-bn: one epoch of global batch 128"
acc=$(sed -n 's/^test_accuracy=\([0-9.]*\)$/\1/p' "$out" | tail -1)
checks=$((checks + 1))
if awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.90) }'; then
  echo "ok: test accuracy $acc >= 0.90"
else
  fail "test accuracy ${acc:-none} < 0.90"
fi
grep -E "^epoch 1 (step|train_loss)" "$out"

echo "$test_name: $checks checks, $failures failed"
[ "$failures" = 0 ]

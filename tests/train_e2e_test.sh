#!/usr/bin/env bash
# End to end: `dtrain train` on real Fashion-MNIST.
#   1. a short run exercising accumulation, warm-up, cosine decay and
#      clipping on the MLP (must finish and print test_accuracy=);
#   2. the default job, LeNet-5 for one epoch, must reach test accuracy
#      >= 0.85.
# Data: $DT_DATA_DIR if set, else the repository's data/ folder (found from
# this script's real path; tools/setup.sh fills it), else the Debian
# package's /usr/share/datasets.
set -uo pipefail

. "$(dirname "$(readlink -f "$0")")/check_lib.sh"
data_dir=$(find_data_dir fashion-mnist) || exit 1
echo "train_e2e_test: data from $data_dir"
log="$tmp/train.log"

"$dtrain" train --data-dir "$data_dir" --model mlp --max-steps 10 --accum 3 --warmup 2 \
  --schedule cosine --clip 1.0 --log-interval 10 --lr 0.05 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ] || ! tail -1 "$log" | grep -Eq '^test_accuracy=0\.[0-9]{4}$'; then
  echo "FAIL: short MLP run (exit $rc) did not end with test_accuracy=" >&2
  exit 1
fi

"$dtrain" train --data-dir "$data_dir" | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ]; then
  echo "FAIL: dtrain train exited with $rc" >&2
  exit 1
fi
acc=$(tail -1 "$log" | sed -n 's/^test_accuracy=\([0-9.]*\)$/\1/p')
if [ -z "$acc" ]; then
  echo "FAIL: the last line is not test_accuracy=...: $(tail -1 "$log")" >&2
  exit 1
fi
if ! awk -v a="$acc" 'BEGIN { exit !(a >= 0.85) }'; then
  echo "FAIL: LeNet-5 after one epoch: test_accuracy=$acc < 0.85" >&2
  exit 1
fi
echo "ok: LeNet-5, one epoch of Fashion-MNIST: test_accuracy=$acc >= 0.85"

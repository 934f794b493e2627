#!/usr/bin/env bash
# Image folders through the binary (issue 28):
#   - dtrain images: usage errors, Fashion-MNIST written as a PNG folder
#     (--per-class keeps it small), the class folders in label order, a
#     second run keeping every file, an interrupted tree finished, JPEG;
#   - dtrain bench --loader runs over the folder;
#   - dtrain train --model lenet --data DIR learns from the folder; --augment;
#   - dtrain eval of a folder's checkpoint (the folder and settings it records);
#   - a run with --workers 1 saving half way, resumed with --workers 3 from
#     that checkpoint (mid-epoch), ends with the same weights bit for bit;
#   - a corrupt image: exit 1 naming it; with --skip-bad-images the run
#     finishes and the log and metrics.jsonl count it; a folder that is no
#     image folder, and one whose splits differ, are errors naming it.
set -uo pipefail
# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../check_lib.sh"
unshare_test_files
data_dir=$(find_data_dir fashion-mnist) || exit 1
export DT_DATA_DIR="$data_dir"
cd "$tmp" || exit 1

# ---- dtrain images ----
run images --out "$tmp/x"
expect 2 err "give --from fashion-mnist\|mnist and --out DIR" "images without --from"
run images --from cifar --out "$tmp/x"
expect 2 err "invalid value 'cifar' for --from" "images --from an unknown set"
run images --from mnist --out "$tmp/x" --format gif
expect 2 err "invalid value 'gif' for --format" "images --format gif"
run images --from fashion-mnist --out "$tmp/x" --data-dir "$tmp/nowhere"
expect 1 err "$tmp/nowhere/fashion-mnist/train-images-idx3-ubyte\(.gz\) not found" \
  "images from a missing data dir names the file"

f="$tmp/fm"
run images --from fashion-mnist --out "$f" --per-class 60
expect 0 out "1200 written, 0 already there" "60 images per class, train and val"
n=$(find "$f/train" -name '*.png' | wc -l)
[ "$n" = 600 ] && ok "600 training PNGs" || not_ok "600 training PNGs (found $n)"
classes=$(ls "$f/val" | tr '\n' ' ')
[ "$classes" = "0_tshirt_top 1_trouser 2_pullover 3_dress 4_coat 5_sandal 6_shirt 7_sneaker 8_bag 9_ankle_boot " ] &&
  ok "class folders sort in label order" || not_ok "class folders: $classes"
# The PNG signature, then IHDR: width 28, height 28, depth 8, colour type 0 (grey).
head=$(od -An -tx1 -N26 "$f/train/1_trouser/$(ls "$f/train/1_trouser" | head -1)" | tr -d ' \n')
[ "$head" = 89504e470d0a1a0a0000000d494844520000001c0000001c0800 ] &&
  ok "28x28 grey PNGs" || not_ok "28x28 grey PNGs (header $head)"
run images --from fashion-mnist --out "$f" --per-class 60
expect 0 out "0 written, 1200 already there" "a second run keeps every file"
rm "$f"/val/3_dress/*.png
run images --from fashion-mnist --out "$f" --per-class 60
expect 0 out "60 written, 1140 already there" "an unfinished tree is finished"
run images --from mnist --out "$tmp/mj" --per-class 2 --format jpeg
expect 0 out "40 written" "mnist as JPEG"
ls "$tmp/mj/train/7/"*.jpg >/dev/null 2>&1 && ok "JPEG files" || not_ok "JPEG files"

# A ResNet takes the folder's channels, size and classes (adaptive pooling
# before its head): 3-channel 16 px images of the 10 MNIST classes.
run_within 120 train --model resnet18-small --data "$tmp/mj" --image-size 16 --channels 3 \
  --batch 4 --max-steps 1 --threads 1 --run-dir "$tmp/r-resnet"
expect 0 out "^test_accuracy=" "resnet18-small trains on 3-channel 16 px folder images"
check "its conv1 takes 3 channels, its fc 10 classes" python3 - \
  "$tmp/r-resnet/checkpoints/step_00000001/model.safetensors" <<'EOF2'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
head = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
assert head["conv1.weight"]["shape"] == [64, 3, 3, 3], head["conv1.weight"]
assert head["fc.weight"]["shape"] == [10, 512], head["fc.weight"]
EOF2

# ---- the loader benchmark (its figure is not checked: speed is not a test) ----
run_within 120 bench --loader --data "$f" --workers 2 --image-size 28 --channels 1 --batches 4
expect 0 out "^loader: images_per_s=[0-9.]+ workers=2 batch=64 size=28 channels=1 images=256 " \
  "bench --loader reports images per second"
run_within 60 bench --loader --data "$tmp/nowhere"
expect 1 err "cannot read image folder $tmp/nowhere/train" "bench --loader on a missing folder"
run_within 60 bench --loader
expect 2 err "--loader needs --data DIR" "bench --loader without --data"

# ---- training from the folder ----
common=(train --model lenet --data "$f" --batch 32 --log-interval 0 --threads 1)
run_within 300 "${common[@]}" --epochs 8 --workers 2 --run-dir "$tmp/r-learn"
expect 0 out "data $f \(600 train, 600 test\)" "lenet reads the image folder"
acc=$(sed -n 's/^test_accuracy=//p' "$out")
awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.45) }' &&
  ok "lenet learns from 600 PNGs (test_accuracy $acc >= 0.45; 0.1 is chance)" ||
  not_ok "lenet learns from 600 PNGs (test_accuracy ${acc:-none})"

# 2 epochs of 19 steps; the checkpoint at step 12 falls inside epoch 1.
run_within 300 "${common[@]}" --epochs 2 --workers 1 --save-every 12 --run-dir "$tmp/r-full"
expect 0 out "^test_accuracy=" "2 epochs, --workers 1, saving every 12 steps"
run_within 300 "${common[@]}" --epochs 2 --workers 3 --run-dir "$tmp/r-res" \
  --resume "$tmp/r-full/checkpoints/step_00000012"
expect 0 out "resumed from .*step_00000012" "resumed mid-epoch with --workers 3"
check "resumed with 3 workers = uninterrupted with 1, bitwise" \
  cmp "$tmp/r-full/checkpoints/step_00000038/model.safetensors" \
  "$tmp/r-res/checkpoints/step_00000038/model.safetensors"

# ---- bad images ----
cp -r "$f" "$tmp/bad"
victim=$(ls "$tmp/bad/train/4_coat/"*.png | head -3 | tail -1)
head -c 100 "$victim" >"$victim.cut" && mv "$victim.cut" "$victim"
run_within 120 "${common[@]}" --data "$tmp/bad" --epochs 1 --run-dir "$tmp/r-bad1"
expect 1 err "corrupt or truncated PNG $victim" "a truncated PNG fails the run naming it"
run_within 120 "${common[@]}" --data "$tmp/bad" --epochs 1 --skip-bad-images --run-dir "$tmp/r-bad2"
expect 0 out "epoch 1 .*bad_images=1" "--skip-bad-images: the run ends, the log counts 1"
grep -q '"bad_images":1' "$tmp/r-bad2/metrics.jsonl" &&
  ok "metrics.jsonl counts the bad image" || not_ok "metrics.jsonl has no bad_images 1"
mkdir "$tmp/bad/val/4_coat_extra"
cp "$victim" "$tmp/bad/val/4_coat_extra/"
run_within 60 "${common[@]}" --data "$tmp/bad" --epochs 1 --skip-bad-images --run-dir "$tmp/r-bad3"
expect 1 err "class 5 is 5_sandal in train/ but 4_coat_extra in val/" "splits of other classes"
mkdir -p "$tmp/plain/stuff"
run_within 60 "${common[@]}" --data "$tmp/plain" --epochs 1 --run-dir "$tmp/r-bad4"
expect 1 err "cannot read image folder $tmp/plain/train" "a folder without train/"
run_within 60 "${common[@]}" --data "$tmp/nothere" --epochs 1
expect 2 err "invalid value '$tmp/nothere' for --data: expected .*or an image folder" \
  "--data neither a data set nor a folder"
run_within 60 train --model lenet --data "$f" --image-mean 0.5
expect 2 err "--image-mean and --image-std go together" "--image-mean alone"
run_within 60 train --model lenet --data "$f" --image-mean 0 --image-std 0
expect 2 err "invalid value '0' for --image-std: .*each > 0" "--image-std 0 is refused"
run_within 60 train --model lenet --data "$f" --channels 2
expect 2 err "--channels 2: expected 1 \(grey\), 3 \(RGB\)" "--channels 2 is refused"
run_within 60 train --model lenet --channels 1 --skip-bad-images
expect 2 err "--channels, --image-size, .* are for image folders" "image flags without a folder"
run_within 60 train --model lenet --augment flip
expect 2 err "--augment and --skip-bad-images are for image folders" "--augment without a folder"
run_within 60 train --model lenet --data "$f" --augment cutout
expect 2 err "invalid value 'cutout' for --augment: expected one of resized-crop, pad-crop, flip" \
  "--augment cutout is refused"
for recipe in pad-crop flip none; do
  run_within 60 train --model lenet --data "$f" --augment $recipe --batch 8 --max-steps 2 \
    --threads 1 --run-dir "$tmp/r-aug-$recipe"
  expect 0 out "^test_accuracy=" "--augment $recipe trains"
done

# ---- dtrain eval of an image folder's checkpoint ----
# The checkpoint keeps the folder and its settings: eval rebuilds the
# ResNet for 16 px images and the folder's classes and gets the run's last
# line; --data evaluates on a copy; a folder of other classes is refused.
run_within 120 train --model resnet18-small --data "$f" --image-size 16 --augment pad-crop \
  --batch 8 --max-steps 2 --threads 1 --run-dir "$tmp/r-eval"
final=$(grep -E "^epoch 1 .*test_loss=" "$out" | grep -oE "test_loss=[0-9.]+ test_accuracy=[0-9.]+")
run_within 120 eval --checkpoint "$tmp/r-eval" --threads 1
expect 0 out "^$final\$" "eval of an image folder's checkpoint: the run's own $final"
expect 0 out "data $f, optimizer step 2" "eval names the folder"
cp -r "$f" "$tmp/fm-copy"
run_within 120 eval --checkpoint "$tmp/r-eval" --data "$tmp/fm-copy" --threads 1
expect 0 out "^$final\$" "eval --data: the same figures on a copy of the folder"
rm -r "$tmp/fm-copy/val/9_ankle_boot"
run_within 60 eval --checkpoint "$tmp/r-eval" --data "$tmp/fm-copy" --threads 1
expect 1 err "image folder $tmp/fm-copy/val has 9 classes, the checkpoint .* was trained on 10" \
  "eval --data: a folder of other classes is refused"
run_within 60 eval --checkpoint "$tmp/r-aug-none" --threads 1
expect 0 out "^test_loss=.* test_accuracy=" "eval of lenet's checkpoint of the folder"
run_within 60 train --model mlp --batch 8 --max-steps 1 --threads 1 --run-dir "$tmp/r-idx"
run_within 60 eval --checkpoint "$tmp/r-idx" --data "$tmp/fm-copy" --threads 1
expect 1 err "records no image folder \(its data: fashion-mnist\)" \
  "eval --data with a checkpoint of an idx data set is refused"

echo "$test_name: $checks checks, $failures failures"
[ "$failures" = 0 ]

#!/usr/bin/python3
"""`dtrain bench --loader` in torchvision, as a peer to measure against.

The same folder read the same way: torchvision.datasets.ImageFolder over
DIR/train (PIL decodes: libjpeg-turbo and zlib underneath, as dtrain), the
training transform RandomResizedCrop(size) (scale 0.08-1, ratio 3/4-4/3) and
RandomHorizontalFlip, ToTensor, Normalize (ImageNet's mean and std, or
0.5/0.5 for grey), a DataLoader with --workers worker processes, shuffled,
--batch images per batch, drop_last; --warmup untimed batches (the workers'
start-up among them), then --batches timed. Prints

    torch_loader: images_per_s=... workers=N batch=B size=S channels=C images=...

--eval times the evaluation transform on DIR/val instead (Resize(size /
0.875), CenterCrop(size)). --make DIR writes a synthetic RGB JPEG folder
(smooth random colour fields, --make-size pixels square, --make-count
images in each of 10 classes) for an ImageNet-like case, with PIL.

Run it with Debian's python3 (python3-torch 1.13, python3-torchvision 0.14):
    /usr/bin/python3 tools/bench_loader_torch.py --data DIR --workers 2
"""
import argparse
import os
import sys
import time


def make_folder(root, size, count):
    import random

    from PIL import Image

    rnd = random.Random(0)
    for split, n in (("train", count), ("val", max(1, count // 5))):
        for c in range(10):
            d = os.path.join(root, split, "class%d" % c)
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                path = os.path.join(d, "%05d.jpg" % i)
                if os.path.exists(path):
                    continue
                small = Image.new("RGB", (8, 8))
                small.putdata([tuple(rnd.randrange(256) for _ in range(3)) for _ in range(64)])
                img = small.resize((size, size), Image.BICUBIC)
                img.save(path + ".tmp.jpg", quality=90)
                os.replace(path + ".tmp.jpg", path)
    print("bench_loader_torch: wrote %s (%d px JPEGs, %d per class)" % (root, size, count))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--channels", type=int, default=3, choices=(1, 3))
    p.add_argument("--eval", action="store_true")
    p.add_argument("--make")
    p.add_argument("--make-size", type=int, default=256)
    p.add_argument("--make-count", type=int, default=100)
    a = p.parse_args()
    if a.make:
        make_folder(a.make, a.make_size, a.make_count)
        return 0
    if not a.data:
        p.error("--data DIR is needed")

    import torch
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    torch.set_num_threads(1)
    if a.channels == 1:
        colour, mean, std = [T.Grayscale(1)], [0.5], [0.5]
    else:
        colour, mean, std = [], [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    if a.eval:
        geometry = [T.Resize(int(a.image_size / 0.875)), T.CenterCrop(a.image_size)]
    else:
        geometry = [T.RandomResizedCrop(a.image_size), T.RandomHorizontalFlip()]
    tf = T.Compose(colour + geometry + [T.ToTensor(), T.Normalize(mean, std)])
    ds = ImageFolder(os.path.join(a.data, "val" if a.eval else "train"), transform=tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True,
                                     num_workers=a.workers, drop_last=True,
                                     persistent_workers=a.workers > 0)
    taken, images, t0 = 0, 0, time.perf_counter()
    while taken < a.warmup + a.batches:
        for x, _ in dl:
            if taken == a.warmup:
                t0 = time.perf_counter()
            if taken >= a.warmup:
                images += x.shape[0]
            taken += 1
            if taken >= a.warmup + a.batches:
                break
    seconds = time.perf_counter() - t0
    print("torch_loader: images_per_s=%.1f workers=%d batch=%d size=%d channels=%d images=%d "
          "seconds=%.3f split=%s" % (images / seconds, a.workers, a.batch, a.image_size,
                                     a.channels, images, seconds, "val" if a.eval else "train"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

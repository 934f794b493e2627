#!/usr/bin/env python3
"""An independent reader of dtrain checkpoints: numpy and the standard library
only, no dtrain code.

  ckpt_numpy.py compare A B [--rtol R]   the weights (model.safetensors) and
                                         optimizer moments (trainer_state.bin)
                                         of checkpoint dirs A and B: bitwise
                                         equal (R = 0) or within R (relative
                                         to each tensor's largest magnitude)
  ckpt_numpy.py logits CKPT DATA N FILE  the MLP 784-512-512-10 of CKPT's
                                         model.safetensors on the first N test
                                         images of DATA/fashion-mnist, against
                                         the N x 10 f32 logits in FILE (1e-5)
"""
import gzip
import json
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    """{name: array} from the standard format: u64 header length, JSON, data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    dtypes = {"F32": "<f4", "F16": "<f2", "I32": "<i4", "I64": "<i8", "U8": "u1"}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype=dtypes[info["dtype"]])
        out[name] = arr.reshape(info["shape"])
    return out


def read_sections(path):
    """{name: bytes} of a dtrain trainer-state file (layout in core/checkpoint.h)."""
    with open(path, "rb") as f:
        blob = f.read()
    assert blob[:8] == b"DTSTATE\0", path
    version, n = struct.unpack("<II", blob[8:16])
    sections = {}
    for i in range(n):
        e = blob[16 + 72 * i: 16 + 72 * (i + 1)]
        name = e[:48].rstrip(b"\0").decode()
        offset, size = struct.unpack("<QQ", e[48:64])
        sections[name] = blob[offset:offset + size]
    return sections


def read_moments(ckpt):
    """The optimizer state over the whole flat parameter space, (buffers, total),
    from the "optimizer" section or the shards (any sharding)."""
    sections = read_sections(ckpt + "/trainer_state.bin")
    for name in sorted(os.listdir(ckpt)):
        if name.startswith("optimizer.rank") and name.endswith(".bin"):
            sections.update(read_sections(ckpt + "/" + name))
    full = None
    for name, b in sections.items():
        if not name.startswith("optimizer"):
            continue
        total, nbuf, nseg = struct.unpack("<QII", b[:16])
        segs = np.frombuffer(b[24:24 + 16 * nseg], dtype="<u8").reshape(nseg, 2)
        data = np.frombuffer(b[24 + 16 * nseg:], dtype="<f4").reshape(nbuf, -1)
        if full is None:
            full = np.zeros((nbuf, total), dtype=np.float32)
        pos = 0
        for off, n in segs.tolist():
            full[:, off:off + n] = data[:, pos:pos + n]
            pos += n
    return {} if full is None else {"optimizer": full}


def compare(a, b, rtol):
    worst = 0.0
    pairs = []
    wa, wb = read_safetensors(a + "/model.safetensors"), read_safetensors(b + "/model.safetensors")
    if sorted(wa) != sorted(wb):
        print("different tensors:", sorted(wa), sorted(wb))
        return 1
    pairs += [("weight " + k, wa[k], wb[k]) for k in wa]
    ma, mb = read_moments(a), read_moments(b)
    if sorted(ma) != sorted(mb):
        print("different optimizer sections:", sorted(ma), sorted(mb))
        return 1
    pairs += [("moments " + k, ma[k], mb[k]) for k in ma]
    bad = 0
    for what, x, y in pairs:
        if x.shape != y.shape:
            print(f"{what}: shapes {x.shape} and {y.shape}")
            return 1
        if rtol == 0:
            if x.tobytes() != y.tobytes():
                diff = np.flatnonzero(x.ravel() != y.ravel())
                print(f"{what}: {diff.size} of {x.size} elements differ (first at {diff[0]})")
                bad += 1
            continue
        scale = max(float(np.abs(x).max()), 1e-30)
        rel = float(np.abs(x.astype(np.float64) - y).max()) / scale
        worst = max(worst, rel)
        if rel > rtol:
            print(f"{what}: relative difference {rel:.3g} > {rtol:g}")
            bad += 1
    kind = "bitwise equal" if rtol == 0 else f"max relative difference {worst:.3g} <= {rtol:g}"
    if bad == 0:
        print(f"{len(pairs)} tensors {kind}")
    return 1 if bad else 0


def idx_images(path, n):
    with gzip.open(path, "rb") as f:
        magic, count, rows, cols = struct.unpack(">IIII", f.read(16))
        assert magic == 2051, path
        raw = np.frombuffer(f.read(n * rows * cols), dtype=np.uint8)
    return raw.reshape(n, rows * cols).astype(np.float32)


def logits(ckpt, data_dir, n, file):
    w = read_safetensors(ckpt + "/model.safetensors")
    x = idx_images(data_dir + "/fashion-mnist/t10k-images-idx3-ubyte.gz", n)
    x = (x / np.float32(255.0) - np.float32(0.2860)) / np.float32(0.3530)  # the task's normalisation
    names = sorted({k.split(".")[0] for k in w}, key=int)
    h = x.astype(np.float64)
    for i, layer in enumerate(names):
        h = h @ w[layer + ".weight"].astype(np.float64).T + w[layer + ".bias"]
        if i + 1 < len(names):
            h = np.maximum(h, 0.0)
    got = np.fromfile(file, dtype="<f4").reshape(n, -1)
    err = float(np.abs(got - h).max())
    print(f"layers {names}; {n} images; max |dtrain - numpy| = {err:.3g}")
    return 0 if err <= 1e-5 else 1


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "compare":
        rtol = float(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--rtol" else 0.0
        sys.exit(compare(sys.argv[2], sys.argv[3], rtol))
    if len(sys.argv) == 6 and sys.argv[1] == "logits":
        sys.exit(logits(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]))
    print(__doc__)
    sys.exit(2)

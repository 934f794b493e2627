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
  ckpt_numpy.py tokens FILE B T          B x T random GPT-2 token ids (i32) to FILE
  ckpt_numpy.py hf-logits DIR TOKENS FILE  the Hugging Face export in DIR
                                         (config.json, model.safetensors) run
                                         as transformers' GPT2LMHeadModel or
                                         LlamaForCausalLM on TOKENS, against
                                         dtrain's f32 logits in FILE (1e-4)
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


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def attention(q, k, v):
    """(B, H, T, hd) each: causal softmax(q k^T / sqrt(hd)) v, as (B, T, H hd)."""
    B, H, T, hd = q.shape
    att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    att = np.where(np.tril(np.ones((T, T), dtype=bool)), att, -np.inf)
    att = np.exp(att - att.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    return (att @ v).transpose(0, 2, 1, 3).reshape(B, T, H * hd)


def heads(x, n):
    B, T, C = x.shape
    return x.reshape(B, T, n, C // n).transpose(0, 2, 1, 3)


def gpt2_forward(cfg, w, tok):
    """transformers' GPT2LMHeadModel: pre-LN blocks, Conv1D (x @ W + b with W
    (in, out)), GELU's tanh approximation (gelu_new), the head tied to wte."""
    T, H, eps = tok.shape[1], cfg["n_head"], cfg["layer_norm_epsilon"]
    p = lambda name: w["transformer." + name].astype(np.float64)
    x = p("wte.weight")[tok] + p("wpe.weight")[:T]
    for i in range(cfg["n_layer"]):
        b = lambda name: p(f"h.{i}.{name}")
        h = layer_norm(x, b("ln_1.weight"), b("ln_1.bias"), eps)
        q, k, v = np.split(h @ b("attn.c_attn.weight") + b("attn.c_attn.bias"), 3, axis=-1)
        y = attention(heads(q, H), heads(k, H), heads(v, H))
        x = x + y @ b("attn.c_proj.weight") + b("attn.c_proj.bias")
        h = layer_norm(x, b("ln_2.weight"), b("ln_2.bias"), eps)
        f = h @ b("mlp.c_fc.weight") + b("mlp.c_fc.bias")
        f = 0.5 * f * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (f + 0.044715 * f ** 3)))
        x = x + f @ b("mlp.c_proj.weight") + b("mlp.c_proj.bias")
    x = layer_norm(x, p("ln_f.weight"), p("ln_f.bias"), eps)
    head = w["lm_head.weight"] if "lm_head.weight" in w else p("wte.weight")
    return x @ head.astype(np.float64).T


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def llama_forward(cfg, w, tok):
    """transformers' LlamaForCausalLM: RMSNorm, RoPE by rotate_half with
    config's rope_theta, grouped-query attention (repeat_kv: query head j
    reads KV head j // (H / KV)), SwiGLU, the head tied or lm_head."""
    T, H, KV = tok.shape[1], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps, hd = cfg["rms_norm_eps"], cfg["hidden_size"] // H
    p = lambda name: w["model." + name].astype(np.float64)
    inv_freq = 1.0 / cfg["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    freqs = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(np.concatenate([freqs, freqs], -1)), np.sin(np.concatenate([freqs, freqs], -1))
    x = p("embed_tokens.weight")[tok]
    for i in range(cfg["num_hidden_layers"]):
        b = lambda name: p(f"layers.{i}.{name}")
        h = rms_norm(x, b("input_layernorm.weight"), eps)
        q = heads(h @ b("self_attn.q_proj.weight").T, H)
        k = heads(h @ b("self_attn.k_proj.weight").T, KV)
        v = heads(h @ b("self_attn.v_proj.weight").T, KV)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
        x = x + attention(q, k, v) @ b("self_attn.o_proj.weight").T
        h = rms_norm(x, b("post_attention_layernorm.weight"), eps)
        g, u = h @ b("mlp.gate_proj.weight").T, h @ b("mlp.up_proj.weight").T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ b("mlp.down_proj.weight").T
    x = rms_norm(x, p("norm.weight"), eps)
    tied = cfg.get("tie_word_embeddings", True)
    if tied == ("lm_head.weight" in w):
        raise ValueError(f"tie_word_embeddings {tied} but lm_head.weight stored: {'lm_head.weight' in w}")
    head = p("embed_tokens.weight") if tied else w["lm_head.weight"].astype(np.float64)
    return x @ head.T


class Used(dict):
    """A dict that remembers the keys read: every stored tensor must be used."""
    def __init__(self, d):
        super().__init__(d)
        self.read = set()

    def __getitem__(self, k):
        self.read.add(k)
        return super().__getitem__(k)


def hf_logits(folder, tokens, file):
    with open(folder + "/config.json") as f:
        cfg = json.load(f)
    w = Used(read_safetensors(folder + "/model.safetensors"))
    with open(folder + "/vocab.json") as f:
        vocab = json.load(f)
    with open(folder + "/merges.txt") as f:
        merges = f.read().splitlines()
    V = cfg["vocab_size"]
    if len(vocab) != V or not merges[0].startswith("#version") or len(merges) < 50000:
        print(f"tokenizer: {len(vocab)} tokens for vocab_size {V}, {len(merges)} merge lines")
        return 1
    arch = cfg["architectures"][0]
    forward = {"GPT2LMHeadModel": gpt2_forward, "LlamaForCausalLM": llama_forward}[arch]
    n_pos = cfg.get("n_positions", cfg.get("max_position_embeddings"))
    tok = np.fromfile(tokens, dtype="<i4").reshape(-1, n_pos)
    want = forward(cfg, w, tok)
    if set(w) != w.read:
        print(f"{arch}: tensors the model does not have: {sorted(set(w) - w.read)}")
        return 1
    if want.shape[-1] != V:
        print(f"{arch}: logits over {want.shape[-1]} tokens, vocab_size {V}")
        return 1
    got = np.fromfile(file, dtype="<f4").reshape(tok.shape[0], tok.shape[1], -1)[..., :V]
    err = float(np.abs(got - want).max())
    print(f"{arch}: {len(w)} tensors, tokens {tok.shape}, logits std {want.std():.3g}; "
          f"max |dtrain - numpy| = {err:.3g}")
    return 0 if err <= 1e-4 else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "tokens":
        b, t = int(sys.argv[3]), int(sys.argv[4])
        np.random.default_rng(31).integers(0, 50257, (b, t), dtype="<i4").tofile(sys.argv[2])
        sys.exit(0)
    if len(sys.argv) == 5 and sys.argv[1] == "hf-logits":
        sys.exit(hf_logits(sys.argv[2], sys.argv[3], sys.argv[4]))
    if len(sys.argv) >= 4 and sys.argv[1] == "compare":
        rtol = float(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--rtol" else 0.0
        sys.exit(compare(sys.argv[2], sys.argv[3], rtol))
    if len(sys.argv) == 6 and sys.argv[1] == "logits":
        sys.exit(logits(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]))
    print(__doc__)
    sys.exit(2)

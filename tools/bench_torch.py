#!/usr/bin/python3
"""The `dtrain bench` benchmark in PyTorch, as a peer to measure against.

Same models (MLP 784-512-512-10, LeNet-5, torchvision's ResNets, GPT-2, Llama), same synthetic batch
(random N(0,1) inputs of shape (B,1,28,28), random labels in [0,10); for
GPT-2 and Llama random token ids of shape (B,T) and their shifted targets), same step
(zero_grad, forward, cross-entropy, backward, optimizer), warm-up excluded,
and the same output line:

    steps_per_s=... samples_per_s=... ms_per_step=...   (GPT-2: tokens_per_s=...)

The GPT-2 model is dtrain's (models/gpt2.c): pre-LN blocks, learned
positional embedding, causal multi-head attention, tanh-GELU MLP, final LN,
LM head tied to the token embedding, vocabulary padded to 50304, GPT-2's
init; trained with AdamW (betas 0.9/0.95, weight decay 0.1 on 2-D weights
only) and gradient clipping at 1.0 (dtrain bench takes the same step: the task's
AdamW settings and clipping); the logits and the loss cover the 50257 real
tokens, not the padding, as dtrain's. Attention is written out (QK^T, causal
mask, softmax, PV) as in nanoGPT without flash attention, because Debian's
PyTorch (1.13) has no scaled_dot_product_attention; on PyTorch >= 2.0 that
fused kernel is used instead.

With --data DIR (the ResNets) the batches come from the image folder
DIR/train instead of one synthetic batch: torchvision's ImageFolder and a
DataLoader of --workers processes (RandomResizedCrop to --image-size and a
flip, normalised; pinned memory and non-blocking copies on CUDA), the peer
of `dtrain train --data DIR --workers N`; the wait for each batch counts in
the step (in optimizer_ms).

With --world N (N > 1) it runs PyTorch DDP, the peer of `dtrain launch -n N
-- bench`: N processes on this machine (this script again, one per rank),
torch.distributed with the gloo backend on localhost, the model wrapped in
DistributedDataParallel (its default buckets), each rank --batch samples per
step (--threads threads each); the ranks meet at a barrier before and after
the timed steps, and rank 0 prints the line above with samples_per_s over all
ranks, after a line `ddp: world N, per-rank batch B, global batch N*B, gloo`.

On the CPU it runs under Debian's python3-torch (`tools/setup.sh --bench`)
with the OpenMP build of OpenBLAS, which is several times faster here than
the default pthread build: the script re-executes itself with
LD_LIBRARY_PATH pointing at it when that folder exists.

With --device cuda[:N] (any PyTorch with CUDA, e.g. 2.11 on the GPU machine
that tools/gpu_check.sh runs on) the model and batch live on the GPU and
torch.cuda.synchronize() closes the warm-up and the timed steps, so the
figure excludes warm-up and counts all queued GPU work, as `dtrain bench
--device cuda` does. TF32 follows dtrain's default (on for f32 matmuls and
convolutions; --tf32 0 turns it off on both). --precision bf16 (or fp16,
with torch.amp.GradScaler) runs the forward and the loss under
torch.autocast with f32 master weights, the peer of `dtrain bench
--precision bf16` (docs/mixed-precision.md).
"""
import argparse
import os
import sys
import time

OPENBLAS_OPENMP = "/usr/lib/x86_64-linux-gnu/openblas-openmp"


def ensure_openmp_blas():
    """Re-exec with the OpenMP OpenBLAS first on the library path (CPU runs
    only, and only where Debian's OpenMP OpenBLAS is installed)."""
    path = os.environ.get("LD_LIBRARY_PATH", "")
    if not os.path.isdir(OPENBLAS_OPENMP) or OPENBLAS_OPENMP in path.split(":"):
        return
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = OPENBLAS_OPENMP + (":" + path if path else "")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def set_tf32(torch, on):
    """TF32 for f32 matmuls and cuDNN convolutions (dtrain's default: on).
    PyTorch 2.9+ has the fp32_precision settings (and refuses to mix them
    with the legacy allow_tf32 flags); older versions only the flags."""
    try:
        conv = getattr(torch.backends.cudnn, "conv", None)
        if conv is not None and hasattr(conv, "fp32_precision"):
            mode = "tf32" if on else "ieee"
            torch.backends.cuda.matmul.fp32_precision = mode
            conv.fp32_precision = mode
            return
    except (AttributeError, RuntimeError, ValueError):
        pass
    try:
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on
    except (AttributeError, RuntimeError, ValueError) as e:
        print("bench_torch: warning: could not set TF32 to %s: %s" % (on, e), file=sys.stderr)


def spawn_ranks(world):
    """Starts `world` copies of this script as the ranks of a DDP job on a
    free localhost port; passes rank 0's output on. Returns the exit code."""
    import socket
    import subprocess
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = []
    for r in range(world):
        cmd = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] + [
            "--rank", str(r), "--port", str(port)]
        out = None if r == 0 else subprocess.DEVNULL
        ranks.append(subprocess.Popen(cmd, stdout=out))
    # A rank that fails ends the others (they would wait for it at the
    # next collective).
    while any(proc.poll() is None for proc in ranks):
        bad = [(r, proc.returncode) for r, proc in enumerate(ranks)
               if proc.returncode not in (None, 0)]
        if bad:
            for proc in ranks:
                if proc.poll() is None:
                    proc.terminate()
            for proc in ranks:
                proc.wait()
            print("bench_torch: rank %d exited with %d" % bad[0], file=sys.stderr)
            return 1
        time.sleep(0.05)
    bad = [(r, proc.returncode) for r, proc in enumerate(ranks) if proc.returncode != 0]
    if bad:
        print("bench_torch: rank %d exited with %d" % bad[0], file=sys.stderr)
        return 1
    return 0


def build_model(name, nn, channels=1):
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(784, 512), nn.ReLU(),
            nn.Linear(512, 512), nn.ReLU(),
            nn.Linear(512, 10))
    if name == "lenet":
        return nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(400, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, 10))
    if name.split("-")[0] in RESNETS:
        # torchvision's, for dtrain's task input (models/resnet.c): 1-channel
        # 28x28 unless --channels and --image-size say otherwise
        import torchvision
        small = name.endswith("-small")
        model = getattr(torchvision.models, name.split("-")[0])(num_classes=10)
        model.conv1 = nn.Conv2d(channels, 64, 3 if small else 7, 1 if small else 2, 1 if small else 3,
                                bias=False)
        if small:
            model.maxpool = nn.Identity()
        return model
    raise SystemExit("bench_torch: unknown model '%s' (expected mlp, lenet, resnet*, gpt2-* or llama-*)"
                     % name)


RESNETS = ("resnet18", "resnet34", "resnet50")


GPT2_CONFIGS = {  # name: (layers, heads, width, context)
    "gpt2-tiny": (4, 4, 128, 64),
    "gpt2": (12, 12, 768, 1024),
    "gpt2-medium": (24, 16, 1024, 1024),
    "gpt2-large": (36, 20, 1280, 1024),
    "gpt2-xl": (48, 25, 1600, 1024),
}
GPT2_VOCAB = 50304  # 50257 padded to a multiple of 128
GPT2_TOKENS = 50257


def causal_attention(F, q, k, v, mask, t):
    """softmax(QK^T / sqrt(head size), causal) V over (B, heads, T, head size)."""
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is not None:
        return sdpa(q, k, v, is_causal=True)
    att = (q @ k.transpose(-2, -1)) * (1.0 / q.shape[-1] ** 0.5)
    att = att.masked_fill(~mask[:, :, :t, :t], float("-inf"))
    return F.softmax(att, dim=-1) @ v


def build_gpt2(torch, nn, name, ctx):
    """dtrain's GPT-2 (models/gpt2.c) in PyTorch."""
    layers, heads, width, max_ctx = GPT2_CONFIGS[name]
    if ctx > max_ctx:
        raise SystemExit("bench_torch: --ctx %d exceeds %s's context %d" % (ctx, name, max_ctx))
    F = nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(width, 3 * width)
            self.c_proj = nn.Linear(width, width)
            mask = torch.tril(torch.ones(ctx, ctx, dtype=torch.bool))
            self.register_buffer("mask", mask.view(1, 1, ctx, ctx), persistent=False)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(x).split(width, dim=2)
            q, k, v = [z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v)]
            y = causal_attention(F, q, k, v, self.mask, t)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(width)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(width)
            self.c_fc = nn.Linear(width, 4 * width)
            self.c_proj = nn.Linear(4 * width, width)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(GPT2_VOCAB, width)
            self.wpe = nn.Embedding(max_ctx, width)
            self.h = nn.ModuleList([Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(width)
            self.register_buffer("pos", torch.arange(ctx), persistent=False)
            for n, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / (2 * layers) ** 0.5 if n.endswith("c_proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif n.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx):
            t = idx.shape[1]
            x = self.wte(idx) + self.wpe(self.pos[:t])
            for block in self.h:
                x = block(x)
            # The tied LM head over the real tokens (dtrain's logits skip the padding).
            return self.ln_f(x) @ self.wte.weight[:GPT2_TOKENS].t()

    return GPT()


LLAMA_CONFIGS = {  # name: (layers, heads, kv heads, width, ffn, context, rope theta)
    "llama-tiny": (4, 4, 2, 128, 384, 64, 10000.0),
    "llama-135m": (30, 9, 3, 576, 1536, 2048, 100000.0),
    "llama-1b": (16, 32, 8, 2048, 8192, 2048, 500000.0),
}


def build_llama(torch, nn, name, ctx):
    """dtrain's Llama (models/llama.c, HF's LlamaForCausalLM) in PyTorch: RMS
    norm, rotate_half RoPE, grouped-query attention (each KV head repeated
    for its n_head / n_kv_head query heads), SwiGLU MLP, no biases, the head
    tied to the embedding, N(0, 0.02) initialisation."""
    layers, heads, kv_heads, width, ffn, max_ctx, theta = LLAMA_CONFIGS[name]
    if ctx > max_ctx:
        raise SystemExit("bench_torch: --ctx %d exceeds %s's context %d" % (ctx, name, max_ctx))
    F = nn.functional
    hd = width // heads
    inv = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
    ang = torch.outer(torch.arange(ctx).float(), inv)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight

    def rope(x, t):
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos[:t].to(x.device) + torch.cat([-x2, x1], -1) * sin[:t].to(x.device)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(width, width, bias=False)
            self.k_proj = nn.Linear(width, kv_heads * hd, bias=False)
            self.v_proj = nn.Linear(width, kv_heads * hd, bias=False)
            self.o_proj = nn.Linear(width, width, bias=False)
            mask = torch.tril(torch.ones(ctx, ctx, dtype=torch.bool))
            self.register_buffer("mask", mask.view(1, 1, ctx, ctx), persistent=False)

        def forward(self, x):
            b, t, c = x.shape
            q = rope(self.q_proj(x).view(b, t, heads, hd).transpose(1, 2), t)
            k = rope(self.k_proj(x).view(b, t, kv_heads, hd).transpose(1, 2), t)
            v = self.v_proj(x).view(b, t, kv_heads, hd).transpose(1, 2)
            k, v = [z.repeat_interleave(heads // kv_heads, dim=1) for z in (k, v)]
            y = causal_attention(F, q, k, v, self.mask, t)
            return self.o_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm()
            self.self_attn = Attention()
            self.post_attention_layernorm = RMSNorm()
            self.gate_proj = nn.Linear(width, ffn, bias=False)
            self.up_proj = nn.Linear(width, ffn, bias=False)
            self.down_proj = nn.Linear(ffn, width, bias=False)

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            h = self.post_attention_layernorm(x)
            return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(GPT2_VOCAB, width)
            self.layers = nn.ModuleList([Block() for _ in range(layers)])
            self.norm = RMSNorm()
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, idx):
            x = self.embed_tokens(idx)
            for block in self.layers:
                x = block(x)
            return self.norm(x) @ self.embed_tokens.weight[:GPT2_TOKENS].t()

    return Llama()


def folder_batches(torch, args, channels, size, device, on_cuda):
    """Batches from the image folder args.data/train, as a practitioner's
    loop gets them: ImageFolder, RandomResizedCrop(size) and a horizontal
    flip, ImageNet's normalisation (grey: its mean), a DataLoader of
    args.workers processes (pinned memory on CUDA, shuffled, whole batches),
    each batch copied to the device without blocking; cycles the epochs."""
    try:
        from torchvision import datasets, transforms
    except ImportError:
        raise SystemExit("bench_torch: --data needs torchvision (tools/setup.sh --bench installs "
                         "Debian's python3-torchvision)")
    root = os.path.join(args.data, "train")
    if not os.path.isdir(root):
        raise SystemExit("bench_torch: --data %s: no train/ folder" % args.data)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    tf = [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip()]
    if channels == 1:
        tf.insert(0, transforms.Grayscale(1))
        mean, std = [sum(mean) / 3], [sum(std) / 3]
    tf += [transforms.ToTensor(), transforms.Normalize(mean, std)]
    folder = datasets.ImageFolder(root, transform=transforms.Compose(tf))
    loader = torch.utils.data.DataLoader(folder, batch_size=args.batch, shuffle=True,
                                         num_workers=args.workers, pin_memory=on_cuda,
                                         drop_last=True,
                                         persistent_workers=args.workers > 0)
    if len(loader) == 0:
        raise SystemExit("bench_torch: --data %s: fewer images than one batch" % args.data)
    state = {"it": iter(loader)}

    def next_batch():
        try:
            xb, yb = next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            xb, yb = next(state["it"])
        return xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
    return next_batch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="mlp", choices=["mlp", "lenet"] + [r + s for r in RESNETS for s in ("", "-small")] + sorted(GPT2_CONFIGS) + sorted(LLAMA_CONFIGS))
    p.add_argument("--ctx", type=int, default=0,
                   help="GPT-2: sequence length T, 0 = the model's context")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"])
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads; 0 = the cores available to this process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image-size", type=int, default=0,
                   help="resnet*: the images' height and width, 0 = 28 (as dtrain bench)")
    p.add_argument("--channels", type=int, default=0, choices=(0, 1, 3),
                   help="resnet*: 1 (grey) or 3 (RGB), 0 = 1 (as dtrain bench)")
    p.add_argument("--data", default="",
                   help="resnet*: train from this image folder (DIR/train/<class>/...: "
                        "torchvision's ImageFolder + DataLoader, RandomResizedCrop and flip, "
                        "pinned memory and non-blocking copies on CUDA) instead of one "
                        "synthetic batch")
    p.add_argument("--workers", type=int, default=4,
                   help="--data: the DataLoader's worker processes")
    p.add_argument("--device", default="cpu",
                   help="cpu, cuda or cuda:N (as dtrain bench --device)")
    p.add_argument("--tf32", type=int, default=1, choices=[0, 1],
                   help="CUDA only: TF32 for f32 matmuls/convolutions (dtrain's default: 1)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="fp32 (TF32 per --tf32 on CUDA), or autocast to bf16/fp16")
    p.add_argument("--channels-last", action="store_true",
                   help="resnet*: the model and the batch in torch.channels_last memory format "
                        "(dtrain bench --channels-last's twin)")
    p.add_argument("--world", type=int, default=1,
                   help="CPU: ranks of PyTorch DDP (gloo on localhost), 1 = no DDP")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.channels_last and args.model.split("-")[0] not in RESNETS:
        raise SystemExit("bench_torch: --channels-last is for the resnet* models")
    if args.world < 1:
        raise SystemExit("bench_torch: --world must be >= 1")
    if args.world > 1 and args.rank < 0:
        sys.exit(spawn_ranks(args.world))
    if args.batch < 1 or args.steps < 1 or args.warmup < 0:
        raise SystemExit("bench_torch: --batch and --steps must be >= 1, --warmup >= 0")
    on_cuda = args.device.startswith("cuda")
    if not on_cuda and not (args.device == "cpu" or args.device.startswith("cpu:")):
        raise SystemExit("bench_torch: --device %s: expected cpu, cuda or cuda:N" % args.device)

    if not on_cuda:
        ensure_openmp_blas()
    try:
        import torch
        from torch import nn
    except ImportError:
        raise SystemExit("bench_torch: PyTorch not found under %s: run tools/setup.sh --bench "
                         "(Debian's python3-torch runs under /usr/bin/python3)" % sys.executable)

    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    ddp = args.world > 1
    if ddp:
        if on_cuda:
            raise SystemExit("bench_torch: --world runs DDP on the CPU (gloo) only")
        import torch.distributed as dist
        import datetime
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                                rank=args.rank, world_size=args.world,
                                timeout=datetime.timedelta(seconds=120))
    if on_cuda:
        if not torch.cuda.is_available():
            raise SystemExit("bench_torch: --device %s but torch %s sees no CUDA device "
                             "(torch.version.cuda=%s)" % (args.device, torch.__version__,
                                                          torch.version.cuda))
        device = torch.device(args.device)
        torch.cuda.set_device(device)
        set_tf32(torch, bool(args.tf32))
        sync = torch.cuda.synchronize
    else:
        device = torch.device("cpu")

        def sync():
            pass
    torch.manual_seed(args.seed + max(args.rank, 0))
    llama = args.model in LLAMA_CONFIGS
    gpt = args.model in GPT2_CONFIGS or llama
    ctx = (args.ctx or (LLAMA_CONFIGS[args.model][5] if llama else GPT2_CONFIGS[args.model][3])
           if gpt else 0)
    if gpt:
        build = build_llama if llama else build_gpt2
        model = build(torch, nn, args.model, ctx).to(device)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=6e-4, betas=(0.9, 0.95))
        ce = nn.CrossEntropyLoss()

        def loss_fn(logits, target):
            return ce(logits.view(-1, logits.shape[-1]), target.view(-1))
        tokens = torch.randint(0, 50257, (args.batch, ctx + 1))
        x, y = tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)
    else:
        if (args.image_size or args.channels) and args.model.split("-")[0] not in RESNETS:
            raise SystemExit("bench_torch: --image-size and --channels are for the resnet* models")
        channels, size = args.channels or 1, args.image_size or 28
        model = build_model(args.model, nn, channels).to(device)
        if args.optimizer == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = nn.CrossEntropyLoss()
        x = torch.randn(args.batch, channels, size, size).to(device)
        y = torch.randint(0, 10, (args.batch,)).to(device)
        if args.channels_last:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
    if args.data:
        if gpt or args.model.split("-")[0] not in RESNETS:
            raise SystemExit("bench_torch: --data is for the resnet* models")
        next_batch = folder_batches(torch, args, channels, size, device, on_cuda)
    else:
        def next_batch():
            return x, y
    model.train()
    if ddp:
        # Every rank starts from rank 0's weights, as DDP broadcasts them;
        # the optimizer holds the same parameter objects.
        model = nn.parallel.DistributedDataParallel(model)

        def barrier():
            dist.barrier()
    else:
        def barrier():
            pass

    times = [0.0, 0.0, 0.0]  # forward, backward, optimizer
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = None
    if half is torch.float16:
        if hasattr(torch.amp, "GradScaler"):  # PyTorch >= 2.3
            scaler = torch.amp.GradScaler("cuda" if on_cuda else "cpu")
        else:
            scaler = torch.cuda.amp.GradScaler(enabled=on_cuda)

    def forward_loss(x, y):
        if half is None:
            return loss_fn(model(x), y)
        with torch.autocast(device_type="cuda" if on_cuda else "cpu", dtype=half):
            return loss_fn(model(x), y)

    # On CUDA the phase boundaries synchronise, as `dtrain bench` does, so
    # that each phase's time is its GPU time.
    def step():
        t0 = time.perf_counter()
        xb, yb = next_batch()  # --data: the loader's wait and the copy, in optimizer_ms
        opt.zero_grad(set_to_none=False)
        t1 = time.perf_counter()
        loss = forward_loss(xb, yb)
        sync()
        t2 = time.perf_counter()
        (scaler.scale(loss) if scaler else loss).backward()
        sync()
        t3 = time.perf_counter()
        if scaler:
            scaler.unscale_(opt)
        if gpt:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        sync()
        t4 = time.perf_counter()
        times[0] += t2 - t1
        times[1] += t3 - t2
        times[2] += (t4 - t3) + (t1 - t0)
        return loss

    for _ in range(args.warmup):
        step()
    sync()  # warm-up (cuDNN/cuBLAS set-up, allocator growth) stays out of the timing
    barrier()
    times[:] = [0.0, 0.0, 0.0]
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync()
    barrier()
    seconds = time.perf_counter() - start
    if ddp:
        dist.destroy_process_group()
        if args.rank != 0:
            return

    params = sum(p.numel() for p in model.parameters())  # DDP's module: the same ones
    sps = args.steps / seconds
    where = "threads %d" % threads
    if on_cuda:
        where = "device %s (%s) tf32 %d" % (args.device, torch.cuda.get_device_name(device),
                                            args.tf32)
    where += " precision %s" % args.precision
    if ddp:
        print("ddp: world %d, per-rank batch %d, global batch %d, gloo"
              % (args.world, args.batch, args.world * args.batch))
    if args.data:
        where += " data %s workers %d" % (args.data, args.workers)
    print("torch bench: model %s (%d parameters) batch %d%s steps %d warmup %d optimizer %s "
          "%s torch %s" % (args.model, params, args.batch, " ctx %d" % ctx if gpt else "",
                           args.steps, args.warmup, "adamw" if gpt else args.optimizer, where,
                           torch.__version__))
    line = "steps_per_s=%.2f samples_per_s=%.1f ms_per_step=%.3f" % (
        sps, sps * args.batch * args.world, 1e3 * seconds / args.steps)
    if gpt:
        line += " tokens_per_s=%.0f" % (sps * args.batch * args.world * ctx)
    print(line)
    print("breakdown: forward_ms=%.3f backward_ms=%.3f optimizer_ms=%.3f loss=%.4f"
          % tuple([1e3 * t / args.steps for t in times] + [loss.item()]))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The `dtrain bench` benchmark in PyTorch, as a peer to measure against.

Same models (MLP 784-512-512-10, LeNet-5), same synthetic batch (random
N(0,1) inputs of shape (B,1,28,28), random labels in [0,10)), same step
(zero_grad, forward, cross-entropy, backward, optimizer), warm-up excluded,
and the same output line:

    steps_per_s=... samples_per_s=... ms_per_step=...

On the CPU it runs under Debian's python3-torch (`tools/setup.sh --bench`)
with the OpenMP build of OpenBLAS, which is several times faster here than
the default pthread build: the script re-executes itself with
LD_LIBRARY_PATH pointing at it when that folder exists.

With --device cuda[:N] (any PyTorch with CUDA, e.g. 2.11 on the GPU machine
that tools/gpu_check.sh runs on) the model and batch live on the GPU and
torch.cuda.synchronize() closes the warm-up and the timed steps, so the
figure excludes warm-up and counts all queued GPU work, as `dtrain bench
--device cuda` does. TF32 follows dtrain's default (on for f32 matmuls and
convolutions; --tf32 0 turns it off on both).
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


def build_model(name, nn):
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
    raise SystemExit("bench_torch: unknown model '%s' (expected mlp or lenet)" % name)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="mlp", choices=["mlp", "lenet"])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"])
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads; 0 = the cores available to this process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu",
                   help="cpu, cuda or cuda:N (as dtrain bench --device)")
    p.add_argument("--tf32", type=int, default=1, choices=[0, 1],
                   help="CUDA only: TF32 for f32 matmuls/convolutions (dtrain's default: 1)")
    args = p.parse_args()
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
    torch.manual_seed(args.seed)
    model = build_model(args.model, nn).to(device)
    model.train()
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(args.batch, 1, 28, 28).to(device)
    y = torch.randint(0, 10, (args.batch,)).to(device)

    times = [0.0, 0.0, 0.0]  # forward, backward, optimizer

    # On CUDA the phase boundaries synchronise, as `dtrain bench` does, so
    # that each phase's time is its GPU time.
    def step():
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        t1 = time.perf_counter()
        loss = loss_fn(model(x), y)
        sync()
        t2 = time.perf_counter()
        loss.backward()
        sync()
        t3 = time.perf_counter()
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
    times[:] = [0.0, 0.0, 0.0]
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync()
    seconds = time.perf_counter() - start

    params = sum(p.numel() for p in model.parameters())
    sps = args.steps / seconds
    where = "threads %d" % threads
    if on_cuda:
        where = "device %s (%s) tf32 %d" % (args.device, torch.cuda.get_device_name(device),
                                            args.tf32)
    print("torch bench: model %s (%d parameters) batch %d steps %d warmup %d optimizer %s "
          "%s torch %s" % (args.model, params, args.batch, args.steps, args.warmup,
                           args.optimizer, where, torch.__version__))
    print("steps_per_s=%.2f samples_per_s=%.1f ms_per_step=%.3f"
          % (sps, sps * args.batch, 1e3 * seconds / args.steps))
    print("breakdown: forward_ms=%.3f backward_ms=%.3f optimizer_ms=%.3f loss=%.4f"
          % tuple([1e3 * t / args.steps for t in times] + [loss.item()]))


if __name__ == "__main__":
    main()

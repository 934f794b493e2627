#!/usr/bin/python3
"""The `dtrain bench` benchmark in PyTorch, as a peer to measure against.

Same models (MLP 784-512-512-10, LeNet-5), same synthetic batch (random
N(0,1) inputs of shape (B,1,28,28), random labels in [0,10)), same step
(zero_grad, forward, cross-entropy, backward, optimizer), warm-up excluded,
and the same output line:

    steps_per_s=... samples_per_s=... ms_per_step=...

Runs under Debian's python3-torch (`tools/setup.sh --bench`) with the OpenMP
build of OpenBLAS, which is several times faster here than the default
pthread build: the script re-executes itself with LD_LIBRARY_PATH pointing
at it when that folder exists.
"""
import argparse
import os
import sys
import time

OPENBLAS_OPENMP = "/usr/lib/x86_64-linux-gnu/openblas-openmp"


def ensure_openmp_blas():
    """Re-exec with the OpenMP OpenBLAS first on the library path."""
    path = os.environ.get("LD_LIBRARY_PATH", "")
    if not os.path.isdir(OPENBLAS_OPENMP) or OPENBLAS_OPENMP in path.split(":"):
        return
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = OPENBLAS_OPENMP + (":" + path if path else "")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


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
    args = p.parse_args()
    if args.batch < 1 or args.steps < 1 or args.warmup < 0:
        raise SystemExit("bench_torch: --batch and --steps must be >= 1, --warmup >= 0")

    ensure_openmp_blas()
    try:
        import torch
        from torch import nn
    except ImportError:
        raise SystemExit("bench_torch: PyTorch not found under %s: run tools/setup.sh --bench "
                         "(Debian's python3-torch runs under /usr/bin/python3)" % sys.executable)

    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    model = build_model(args.model, nn)
    model.train()
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(args.batch, 1, 28, 28)
    y = torch.randint(0, 10, (args.batch,))

    times = [0.0, 0.0, 0.0]  # forward, backward, optimizer

    def step():
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        t1 = time.perf_counter()
        loss = loss_fn(model(x), y)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        opt.step()
        t4 = time.perf_counter()
        times[0] += t2 - t1
        times[1] += t3 - t2
        times[2] += (t4 - t3) + (t1 - t0)
        return loss

    for _ in range(args.warmup):
        step()
    times[:] = [0.0, 0.0, 0.0]
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    seconds = time.perf_counter() - start

    params = sum(p.numel() for p in model.parameters())
    sps = args.steps / seconds
    print("torch bench: model %s (%d parameters) batch %d steps %d warmup %d optimizer %s "
          "threads %d torch %s" % (args.model, params, args.batch, args.steps, args.warmup,
                                   args.optimizer, threads, torch.__version__))
    print("steps_per_s=%.2f samples_per_s=%.1f ms_per_step=%.3f"
          % (sps, sps * args.batch, 1e3 * seconds / args.steps))
    print("breakdown: forward_ms=%.3f backward_ms=%.3f optimizer_ms=%.3f loss=%.4f"
          % tuple([1e3 * t / args.steps for t in times] + [loss.item()]))


if __name__ == "__main__":
    main()

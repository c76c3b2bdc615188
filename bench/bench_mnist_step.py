"""Milliseconds per MNIST training step: uopc (graph every step, and TinyJit replay) against PyTorch eager and
torch.compile, same model, same data, same run.

    python bench/bench_mnist_step.py                       # both MLPs below, AdamW, synthetic data
    python bench/bench_mnist_step.py --rounds 7 --steps 50
    python bench/bench_mnist_step.py --threads 1           # every library single-threaded (steadier when busy)
    python bench/bench_mnist_step.py --no-compile          # skip torch.compile (its first compile takes a while)

Models: 784-128-10 at batch 128 and 784-1024-1024-10 at batch 256. A step is forward, cross-entropy, backward and an
AdamW update on pre-realized inputs cycled from a pool of 8 batches. Rounds alternate between the variants so
drifting machine load hits all of them; each prints the median over rounds and the ratio to PyTorch eager (below 1:
faster). For the jitted step it also prints where the time goes (Python, plan launch, kernels) and the pool misses
(allocations taken from the system) while timing: 0 means the step runs in memory that is already mapped.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from uopc import TinyJit, realize, runtime
from uopc.buffer import pool
from uopc.nn import AdamW, Linear, parameters
from uopc.tensor import Tensor


def batches(n: int, batch: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """A pool of synthetic MNIST-shaped batches (float32 pixels, int class labels)."""
    g = np.random.default_rng(seed)
    return [
        (g.standard_normal((batch, 784)).astype(np.float32), g.integers(0, 10, batch).astype(np.int32))
        for _ in range(n)
    ]


def uopc_stepper(data, sizes: list[int], jit: bool):
    """A closure running one uopc training step on the next batch."""
    Tensor.manual_seed(0)
    layers = [Linear(a, b) for a, b in zip(sizes, sizes[1:], strict=False)]
    opt = AdamW(parameters(layers), lr=1e-3)
    tdata = [(Tensor(x).realize(), Tensor(y).realize()) for x, y in data]

    def train(x: Tensor, y: Tensor) -> Tensor:
        h = x
        for i, layer in enumerate(layers):
            h = layer(h)
            h = h.relu() if i < len(layers) - 1 else h
        loss = h.cross_entropy(y)
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss)
        return loss

    f = TinyJit(train) if jit else train
    i = [0]

    def step() -> None:
        f(*tdata[i[0] % len(tdata)])
        i[0] += 1

    return step


def torch_stepper(data, sizes: list[int], compiled: bool):
    """The same step in PyTorch (its default AdamW: weight decay 0.01, like uopc's), eager or torch.compile'd."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    mods: list = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False)):
        mods += [torch.nn.Linear(a, b)] + ([torch.nn.ReLU()] if i < len(sizes) - 2 else [])
    model = torch.nn.Sequential(*mods)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fwd = torch.compile(model) if compiled else model
    tdata = [(torch.from_numpy(x), torch.from_numpy(y).long()) for x, y in data]
    i = [0]

    def step() -> None:
        x, y = tdata[i[0] % len(tdata)]
        i[0] += 1
        loss = F.cross_entropy(fwd(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def time_steps(step, n: int) -> float:
    """Milliseconds per step over n steps."""
    t = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t) / n * 1e3


def bench(sizes: list[int], batch: int, args) -> None:
    name = "-".join(map(str, sizes))
    data = batches(8, batch)
    runners = {
        "uopc": uopc_stepper(data, sizes, jit=False),
        "uopc TinyJit": uopc_stepper(data, sizes, jit=True),
    }
    try:
        runners["torch eager"] = torch_stepper(data, sizes, compiled=False)
        if not args.no_compile:
            try:
                st = torch_stepper(data, sizes, compiled=True)
                time_steps(st, 3)  # compiles here: a failure drops it from the comparison
                runners["torch.compile"] = st
            except Exception as e:  # torch.compile needs a working C++ toolchain; report and go on
                print(f"torch.compile skipped: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    except ImportError:
        print("torch is not installed: timing uopc only")
    for step in runners.values():  # warm up: uopc compiles its plan in the first steps, TinyJit captures
        time_steps(step, 5)
    times: dict[str, list[float]] = {k: [] for k in runners}
    misses: dict[str, int] = dict.fromkeys(runners, 0)
    for _ in range(args.rounds):
        for k, step in runners.items():
            m0 = pool.misses
            times[k].append(time_steps(step, args.steps))
            misses[k] += pool.misses - m0
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = med.get("torch eager")
    print(f"MLP {name}, AdamW, batch {batch} (median of {args.rounds} interleaved rounds x {args.steps} steps):")
    for k, v in med.items():
        ratio = f"  {v / ref:5.2f}x torch eager" if ref else ""
        miss = f"  pool misses while timing: {misses[k]}" if k.startswith("uopc") else ""
        print(f"  {k:14s} {v:8.2f} ms/step (min {min(times[k]):7.2f}){ratio}{miss}")
    # where the jitted step's time goes: Python (binding, output tensors), plan launch (ctypes), kernels
    step = runners["uopc TinyJit"]
    t = time.perf_counter()
    with realize.profile() as p:
        for _ in range(args.steps):
            step()
    total = (time.perf_counter() - t) * 1e3 / args.steps
    call, kern = p["call_ns"] / 1e6 / args.steps, p["kernel_ns"] / 1e6 / args.steps
    print(
        f"  TinyJit step split: {total:.2f} ms = Python {total - call:.3f} ms + launch {call - kern:.3f} ms + "
        f"kernels {kern:.2f} ms ({p['kernels'] // max(1, args.steps)} kernels in {p['calls'] // args.steps} plan call)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20, help="steps per round")
    ap.add_argument("--threads", type=int, default=0, help="threads for every library (0: each one's default)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--small-only", action="store_true", help="only the 784-128-10 MLP")
    args = ap.parse_args()
    if args.threads:
        runtime.set_num_threads(args.threads)
    try:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; uopc {runtime.get_num_threads()} threads")
    except ImportError:
        pass
    bench([784, 128, 10], 128, args)
    if not args.small_only:
        bench([784, 1024, 1024, 10], 256, args)


if __name__ == "__main__":
    main()

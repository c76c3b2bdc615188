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
import time

from uopc.engine import realize
from uopc.runtime import compiler as runtime
from uopc.runtime.buffer import pool
from uopc.tools import harness
from uopc.tools.bench_suite import mnist_batches, torch_stepper, uopc_stepper


def bench(sizes: list[int], batch: int, args) -> None:
    name = "-".join(map(str, sizes))
    data = mnist_batches(8, batch)
    runners = {
        "uopc": uopc_stepper(data, sizes, 1e-3),
        "uopc TinyJit": uopc_stepper(data, sizes, 1e-3, jit=True),
    }
    try:
        runners["torch eager"] = torch_stepper(data, sizes, 1e-3)
        if not args.no_compile:
            try:
                st = torch_stepper(data, sizes, 1e-3, compiled=True)
                harness.time_n(st, 3)  # compiles here: a failure drops it from the comparison
                runners["torch.compile"] = st
            except Exception as e:  # torch.compile needs a working C++ toolchain; report and go on
                print(f"torch.compile skipped: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    except ImportError:
        print("torch is not installed: timing uopc only")
    for step in runners.values():  # warm up: uopc compiles its plan in the first steps, TinyJit captures
        harness.time_n(step, 5)
    plans, compiles = len(realize._plans), runtime.stats["compiles"]
    times: dict[str, list[float]] = {k: [] for k in runners}
    misses: dict[str, int] = dict.fromkeys(runners, 0)
    for _ in range(args.rounds):
        for k, step in runners.items():
            m0 = pool.misses
            times[k].append(harness.time_n(step, args.steps) * 1e3)
            misses[k] += pool.misses - m0
    med = harness.medians(times)
    ref = med.get("torch eager")
    print(f"MLP {name}, AdamW, batch {batch} (median of {args.rounds} interleaved rounds x {args.steps} steps):")
    for k, v in med.items():
        ratio = f"  {v / ref:5.2f}x torch eager" if ref else ""
        miss = f"  pool misses while timing: {misses[k]}" if k.startswith("uopc") else ""
        print(f"  {k:14s} {v:8.2f} ms/step (min {min(times[k]):7.2f}){ratio}{miss}")
    print(
        f"  while timing: {len(realize._plans) - plans} plans built, "
        f"{runtime.stats['compiles'] - compiles} kernels compiled"
    )
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

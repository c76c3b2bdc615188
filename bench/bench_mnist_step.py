"""Milliseconds per MNIST training step: uopc against PyTorch eager, same model, same data, same run.

    python bench/bench_mnist_step.py                   # 784-128-10 MLP, AdamW, batch 128, synthetic data
    python bench/bench_mnist_step.py --rounds 7 --steps 100
    python bench/bench_mnist_step.py --threads 1    # both single-threaded (steadier on a busy machine)

A step is forward, cross-entropy, backward and an AdamW update (uopc: one plan, the loss realized with it).
Rounds alternate between the two libraries so drifting machine load hits both; each prints the median over rounds
and the ratio uopc / torch (below 1: uopc is faster). Without torch installed only uopc is timed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from uopc import realize, runtime
from uopc.nn import AdamW, Linear, parameters
from uopc.tensor import Tensor


def batches(n: int, batch: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """A pool of synthetic MNIST-shaped batches (float32 pixels, int class labels)."""
    g = np.random.default_rng(seed)
    return [
        (g.standard_normal((batch, 784)).astype(np.float32), g.integers(0, 10, batch).astype(np.int32))
        for _ in range(n)
    ]


def uopc_stepper(data, hidden: int, lr: float):
    """A closure running one uopc training step on the next batch of `data`."""
    Tensor.manual_seed(0)
    l1, l2 = Linear(784, hidden), Linear(hidden, 10)
    opt = AdamW(parameters([l1, l2]), lr=lr)
    i = [0]

    def step() -> None:
        x, y = data[i[0] % len(data)]
        i[0] += 1
        loss = l2(l1(Tensor(x)).relu()).cross_entropy(Tensor(y))
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss)

    return step


def torch_stepper(data, hidden: int, lr: float):
    """The same step in PyTorch eager (its default AdamW: weight decay 0.01, like uopc's)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    tdata = [(torch.from_numpy(x), torch.from_numpy(y).long()) for x, y in data]
    i = [0]

    def step() -> None:
        x, y = tdata[i[0] % len(tdata)]
        i[0] += 1
        loss = F.cross_entropy(model(x), y)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=50, help="steps per round")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="threads for both libraries (0: each one's default)")
    args = ap.parse_args()
    if args.threads:
        runtime.set_num_threads(args.threads)

    data = batches(8, args.batch)
    runners = {"uopc": uopc_stepper(data, args.hidden, 1e-3)}
    try:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        runners["torch"] = torch_stepper(data, args.hidden, 1e-3)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    except ImportError:
        print("torch is not installed: timing uopc only")

    compiles0, hits0 = runtime.stats["compiles"], runtime.stats["disk_hits"]
    for step in runners.values():  # warm up: uopc compiles its plan in the first two steps
        time_steps(step, 5)
    plans = len(realize._plans)
    times: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(args.rounds):
        for name, step in runners.items():
            times[name].append(time_steps(step, args.steps))
        print(f"round {r + 1}: " + "  ".join(f"{k} {v[-1]:.2f} ms" for k, v in times.items()))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"MLP 784-{args.hidden}-10, AdamW, batch {args.batch}: "
        + ", ".join(f"{k} {v:.2f} ms/step" for k, v in med.items())
    )
    if "torch" in med:
        print(f"ratio uopc / torch: {med['uopc'] / med['torch']:.2f}")
    print(
        f"uopc warm-up: {runtime.stats['compiles'] - compiles0} kernels compiled, "
        f"{runtime.stats['disk_hits'] - hits0} loaded from the disk cache; "
        f"{len(realize._plans) - plans} plans built while timing"
    )


if __name__ == "__main__":
    main()

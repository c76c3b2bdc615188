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

from uopc import realize, runtime
from uopc.tools import harness
from uopc.tools.bench_suite import mnist_batches, torch_stepper, uopc_stepper


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

    data = mnist_batches(8, args.batch)
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
        harness.time_n(step, 5)
    plans = len(realize._plans)

    def show(r: int, times: dict[str, list[float]]) -> None:
        print(f"round {r + 1}: " + "  ".join(f"{k} {v[-1] * 1e3:.2f} ms" for k, v in times.items()))

    rounds = {k: (lambda s=s: harness.time_n(s, args.steps)) for k, s in runners.items()}
    med = {k: v * 1e3 for k, v in harness.medians(harness.interleave(rounds, args.rounds, show)).items()}
    print(
        f"MLP 784-{args.hidden}-10, AdamW, batch {args.batch}: "
        + ", ".join(f"{k} {v:.2f} ms/step" for k, v in med.items())
    )
    if "torch" in med:
        print(f"ratio uopc / torch: {harness.ratio(med, 'uopc', 'torch'):.2f}")
    print(
        f"uopc warm-up: {runtime.stats['compiles'] - compiles0} kernels compiled, "
        f"{runtime.stats['disk_hits'] - hits0} loaded from the disk cache; "
        f"{len(realize._plans) - plans} plans built while timing"
    )


if __name__ == "__main__":
    main()

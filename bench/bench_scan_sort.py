"""cumsum of 2^20 elements and sort/argsort/topk of 2^16 elements along an axis, against NumPy and PyTorch.

    python bench/bench_scan_sort.py [--rounds 5]

Each round times every variant once (interleaved, so machine load hits all alike); the medians and the ratios to
PyTorch are printed. The first call of each uopc op (compile) is excluded and printed separately.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from uopc import Tensor


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x20 = rng.normal(size=1 << 20).astype(np.float32)
    x16 = rng.normal(size=(2, 1 << 16)).astype(np.float32)
    variants = {
        "cumsum 2^20 uopc": lambda: Tensor(x20).cumsum().realize(),
        "cumsum 2^20 torch": lambda: torch.cumsum(torch.from_numpy(x20), 0),
        "cumsum 2^20 numpy": lambda: np.cumsum(x20),
        "sort (2, 2^16) uopc": lambda: Tensor.realize_all(*Tensor(x16).sort(1)),
        "sort (2, 2^16) torch": lambda: torch.sort(torch.from_numpy(x16), dim=1, stable=True),
        "sort (2, 2^16) numpy": lambda: np.argsort(x16, 1, kind="stable"),
        "topk10 (2, 2^16) uopc": lambda: Tensor.realize_all(*Tensor(x16).topk(10)),
        "topk10 (2, 2^16) torch": lambda: torch.topk(torch.from_numpy(x16), 10),
    }
    for name, fn in variants.items():
        if "uopc" in name:
            print(f"first call (compiles) {name:24s} {_time(fn) * 1e3:9.1f} ms")
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            times[name].append(_time(fn))
    for name, ts in times.items():
        med = statistics.median(ts)
        ref = statistics.median(times[name.rsplit(" ", 1)[0] + " torch"])
        print(f"{name:24s} median {med * 1e3:9.2f} ms   {med / ref:7.1f}x torch")


if __name__ == "__main__":
    main()

"""Soak: train the MNIST-sized MLP (784-128-10, AdamW, batch 128) on synthetic data for many steps and watch
that nothing grows: resident memory, plans, compiled objects, live BUFFER UOps.

    python bench/soak.py                 # 10,000 steps; prints figures at step 500 and at the end
    python bench/soak.py --steps 2000
"""

import argparse
import gc
import os
import resource
import time

import numpy as np

from uopc.engine import realize
from uopc.nn import AdamW, Linear, parameters
from uopc.runtime import compiler as runtime
from uopc.tensor import Tensor
from uopc.uop import Ops, uop


def rss_mb() -> float:
    """Current resident set size (from /proc; ru_maxrss would only give the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def live_buffers() -> int:
    return sum(1 for u in list(uop._cache.values()) if u.op is Ops.BUFFER)


def figures(step: int) -> dict:
    gc.collect()
    return {
        "step": step,
        "rss_mb": rss_mb(),
        "plans": len(realize._plans),
        "compiles": runtime.stats["compiles"],
        "loads": runtime.stats["loads"],
        "live_buffers": live_buffers(),
        "uops": len(uop._cache),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10_000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2048, 784)).astype(np.float32)
    Y = rng.integers(0, 10, 2048).astype(np.int32)
    Tensor.manual_seed(0)
    l1, l2 = Linear(784, 128), Linear(128, 10)
    opt = AdamW(parameters([l1, l2]), lr=1e-3)
    marks, t0 = [], time.perf_counter()
    for step in range(1, args.steps + 1):
        i = (step * 128) % 2048
        x, y = Tensor(X[i : i + 128]), Tensor(Y[i : i + 128])
        loss = l2(l1(x).relu()).cross_entropy(y)
        opt.zero_grad()
        loss.backward()
        opt.step(loss)
        if step in (500, args.steps) or step % 2000 == 0:
            f = figures(step)
            f["loss"] = loss.item()
            marks.append(f)
            print(
                f"step {step:6d}  loss {f['loss']:.3f}  rss {f['rss_mb']:7.1f} MB  plans {f['plans']}  "
                f"compiles {f['compiles']}  loads {f['loads']}  live BUFFERs {f['live_buffers']}  "
                f"UOps {f['uops']}  ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    first = next(m for m in marks if m["step"] == 500) if args.steps >= 500 else marks[0]
    last = marks[-1]
    print(
        f"from step {first['step']} to {last['step']}: rss {last['rss_mb'] - first['rss_mb']:+.1f} MB, "
        f"plans {last['plans'] - first['plans']:+d}, compiles {last['compiles'] - first['compiles']:+d}, "
        f"live BUFFERs {last['live_buffers'] - first['live_buffers']:+d}"
    )


if __name__ == "__main__":
    main()

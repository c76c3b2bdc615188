"""Fusion vs fission, measured: (A @ B) @ C cut at its reductions (default) vs one loop nest (fuse_reduce=True),
and the cold/warm schedule time of a softmax plan.

    python bench/bench_fusion.py            # N=128; interleaved rounds, medians, and the ratio
"""

import os
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("UOPC_CACHE", tempfile.mkdtemp(prefix="uopc-bench-"))  # cold compiles: an empty cache

from uopc.engine import realize
from uopc.helpers import Context
from uopc.tensor import Tensor
from uopc.tools import harness


def run_abc(a, b, c, fuse):
    Tensor.fuse_reduce = fuse
    try:
        t0 = time.perf_counter()
        ((Tensor(a) @ Tensor(b)) @ Tensor(c)).realize()
        return time.perf_counter() - t0
    finally:
        Tensor.fuse_reduce = False


def main(n=128, rounds=3):
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(3))
    ref = (a @ b) @ c
    for fuse in (False, True):  # compile both plans first, and check them
        Tensor.fuse_reduce = fuse
        got = ((Tensor(a) @ Tensor(b)) @ Tensor(c)).numpy()
        Tensor.fuse_reduce = False
        print(f"fuse_reduce={fuse!s:5}  max |diff| vs numpy: {np.abs(got - ref).max():.2e}")
    # OPT=1's 4x4 register tile shares one inner product among the 4 output columns of a tile (rangeify
    # memoizes it), so the recompute factor drops from N to N/4 and threads split the rest: the gap narrows
    for opt in (0, 1):
        with Context(OPT=opt):
            for fuse in (False, True):
                run_abc(a, b, c, fuse)  # compile
            runners = {fuse: (lambda f=fuse: run_abc(a, b, c, f)) for fuse in (False, True)}
            med = harness.medians(harness.interleave(runners, rounds))
        cut, fused = med[False], med[True]
        print(f"(A @ B) @ C, N={n}, OPT={opt}, median of {rounds} interleaved rounds:")
        print(f"  cut at reductions (default): {cut * 1e3:9.2f} ms")
        print(f"  one loop nest (fuse_reduce): {fused * 1e3:9.2f} ms")
        print(f"  ratio fused / cut: {fused / cut:.0f}x")

    x = rng.standard_normal((512, 512)).astype(np.float32)
    realize._plans.clear()
    for label in ("cold", "warm"):
        t0 = time.perf_counter()
        with Context(DEBUG=1):
            Tensor(x).softmax(-1).realize()
        print(f"  softmax 512x512 {label}: {(time.perf_counter() - t0) * 1e3:.1f} ms end to end (the line above)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 128)

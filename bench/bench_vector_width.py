"""The width of gcc's auto-vectorized loops: the memory-bound and elementwise kernels with -mprefer-vector-width=256
against =512 (and the compiler's own default), interleaved rounds, medians, on whatever machine runs it.

    python bench/bench_vector_width.py [--rounds 9]

This is the measurement behind uopc.machine.VECTOR_WIDTH_RULE (which width an AVX-512 machine's kernels use). Each
variant is the same graph compiled under another CFLAGS (a plan of its own: CFLAGS is part of the plan key); every
round runs each variant once, in turn. Outputs come from uopc's pool (no first-touch faults after the first round);
inputs are made once. On a machine without AVX-512 there is nothing to choose and the script says so.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from uopc import Tensor, nn
from uopc.helpers import Context
from uopc.runtime import compiler as runtime


def workloads() -> dict:
    g = np.random.default_rng(0)
    sm = Tensor(g.standard_normal((4096, 4096)).astype(np.float32))
    ln_x = Tensor(g.standard_normal((8192, 1024)).astype(np.float32))
    ln = nn.LayerNorm(1024)
    chain = Tensor(g.standard_normal(1 << 26).astype(np.float32))
    rs = Tensor(g.standard_normal((8192, 8192)).astype(np.float32))
    ex = Tensor(g.standard_normal(1 << 24).astype(np.float32))
    return {
        "softmax 4096^2": lambda: sm.softmax(-1),
        "LayerNorm 8192x1024": lambda: ln(ln_x),
        "relu chain 2^26": lambda: (chain * 2 + 1).relu() * 3,
        "row-sum 8192^2": lambda: rs.sum(1),
        "exp+tanh 2^24 (compute)": lambda: (ex.exp() * 0.5).tanh() + ex.sigmoid(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    m = runtime.machine()
    print(f"machine: {m.describe()}")
    if "avx512f" not in m.isa:
        print("the compiler targets no AVX-512 here: 256-bit vectors are the widest, nothing to choose")
        return
    base = [f for f in runtime.base_cflags() if not f.startswith("-mprefer-vector-width")]
    # a width in CFLAGS turns uopc's rule off, so each variant is exactly that width
    variants = {"256": [*base, "-mprefer-vector-width=256"], "512": [*base, "-mprefer-vector-width=512"]}
    print(f"flags: {' '.join(base)}; uopc's rule adds: {' '.join(m.extra_flags) or 'nothing'} (the compiler's own")
    print("  preference is printed by `gcc <flags> -Q --help=target | grep prefer-vector-width`)")
    work = workloads()
    times: dict[tuple[str, str], list[float]] = {}
    for fn in work.values():
        for flags in variants.values():
            with Context(CFLAGS=flags):
                fn().realize()  # compile, and warm the pool
                fn().realize()
    for _ in range(args.rounds):
        for name, fn in work.items():
            for v, flags in variants.items():
                with Context(CFLAGS=flags):
                    t0 = time.perf_counter()
                    fn().realize()
                    times.setdefault((name, v), []).append(time.perf_counter() - t0)
    print(f"{'workload':28s}" + "".join(f"{v:>18s}" for v in variants) + f"{'512 / 256':>12s}  (ms, medians)")
    for name in work:
        med = {v: statistics.median(times[(name, v)]) * 1e3 for v in variants}
        cells = "".join(f"{med[v]:18.2f}" for v in variants)
        print(f"{name:28s}{cells}{med['512'] / med['256']:12.3f}")


if __name__ == "__main__":
    main()

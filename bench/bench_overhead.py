"""Fixed costs: a warm cached 16-element add, its TinyJit replay, and a cold softmax plan, against PyTorch eager.

    python bench/bench_overhead.py
    python bench/bench_overhead.py --rounds 9 --n 5000

1. `(a + b).realize()` of two realized 16-element float32 tensors with its plan cached (graph building, structure
   key, plan lookup, output buffer from the pool, one ctypes call), beside PyTorch eager's `a + b`.
2. The same add under TinyJit (replay: bind inputs, run the plan, wrap the output).
3. softmax of a 512x512 tensor in a fresh process with an empty kernel cache, against the same process with a warm
   cache (start-up, import, graph and plan lookup) plus one gcc run of the plan's C, measured in this run.
Rounds alternate between the variants; medians and ratios are printed, and the pool misses during the add loops.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from uopc import TinyJit
from uopc.engine import realize
from uopc.helpers import cache_dir
from uopc.machine import available_cpus
from uopc.runtime import compiler as runtime
from uopc.runtime.buffer import pool
from uopc.tensor import Tensor

CHILD = """
import numpy as np
from uopc.tensor import Tensor
Tensor(np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)).softmax(-1).realize()
"""


def per_call_us(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def child_seconds(cache: str) -> float:
    env = dict(os.environ, UOPC_CACHE=cache)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", CHILD], env=env, check=True)
    return time.perf_counter() - t


def gcc_seconds(srcs: list[str], tmp: str) -> float:
    """One compile of the plan's C with the flags uopc uses, as the runtime runs it: each translation unit to an
    object (as many compilers at a time as this process has CPUs), then one link."""
    cc, flags = runtime._resolve_compiler(), runtime.cflags()
    t = time.perf_counter()
    objs, running = [], []
    for i, src in enumerate(srcs):
        c, o = os.path.join(tmp, f"u{i}.c"), os.path.join(tmp, f"u{i}.o")
        with open(c, "w") as f:
            f.write(src)
        if len(running) >= available_cpus():
            running.pop(0).wait()
        running.append(subprocess.Popen([cc, *flags, "-fPIC", "-c", "-o", o, c]))
        objs.append(o)
    for p in running:
        assert p.wait() == 0
    subprocess.run([cc, *flags, "-shared", "-fPIC", "-o", os.path.join(tmp, "plan.so"), *objs, "-lm"], check=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=3000, help="calls per round")
    ap.add_argument("--cold-rounds", type=int, default=3)
    args = ap.parse_args()

    a = Tensor(np.arange(16, dtype=np.float32)).realize()
    b = Tensor(np.ones(16, np.float32)).realize()
    jadd = TinyJit(lambda x, y: x + y)
    variants = {"uopc add": lambda: (a + b).realize(), "uopc TinyJit add": lambda: jadd(a, b)}
    try:
        import torch

        ta, tb = torch.arange(16, dtype=torch.float32), torch.ones(16)
        variants["torch eager add"] = lambda: ta + tb
    except ImportError:
        print("torch is not installed: no reference")
    for f in variants.values():
        per_call_us(f, 200)
    times: dict[str, list[float]] = {k: [] for k in variants}
    m0 = pool.misses
    for _ in range(args.rounds):
        for k, f in variants.items():
            times[k].append(per_call_us(f, args.n))
    misses = pool.misses - m0
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = med.get("torch eager add")
    print(f"16-element add, median of {args.rounds} interleaved rounds x {args.n} calls:")
    for k, v in med.items():
        print(f"  {k:18s} {v:8.2f} us" + (f"  {v / ref:6.1f}x torch eager" if ref else ""))
    print(f"  pool misses during the add rounds: {misses}")

    # cold softmax plan: empty cache vs warm cache, and one gcc run of the same plan's C
    with tempfile.TemporaryDirectory() as tmp:
        cold, warm, gcc = [], [], []
        Tensor(np.zeros((512, 512), np.float32)).softmax(-1).realize()
        srcs = next(reversed(realize._plans.values())).srcs
        for r in range(args.cold_rounds):
            cache = os.path.join(tmp, f"cache{r}")
            cold.append(child_seconds(cache))
            warm.append(child_seconds(cache))
            gcc.append(gcc_seconds(srcs, tmp))
        c, w, g = (statistics.median(x) * 1e3 for x in (cold, warm, gcc))
        print(f"cold softmax 512x512 plan in a fresh process (median of {args.cold_rounds}):")
        print(f"  empty cache {c:7.1f} ms; warm cache {w:7.1f} ms; gcc on the plan's C as uopc runs it {g:7.1f} ms")
        print(f"  cold - warm = {c - w:.1f} ms = {(c - w) / g:.2f}x that gcc time (target <= 1.2x)")
    print(f"(kernel cache of this process: {cache_dir()})")


if __name__ == "__main__":
    main()

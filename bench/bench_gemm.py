"""GEMM GFLOP/s, step by step, against NumPy (OpenBLAS) in the same run.

  python bench/bench_gemm.py 1024           naive -> threads -> register tile -> cache blocks, Tensor A@B, ratio
  python bench/bench_gemm.py --interleave   4x4 tile + threads with and without cache blocks, in rounds

B strided   C[i,j] = sum_k A[i,k] B[k,j]: the reduce walks down a column of B (stride N)
B^T         same math, B stored transposed: both operands contiguous along k
"""

import argparse
import os
import time

import numpy as np

from uopc.dtype import dtypes
from uopc.helpers import Context
from uopc.rangeify import Ctx, Opts, lower
from uopc.render_c import render_c
from uopc.runtime import Program, get_num_threads
from uopc.uop import Ops, ParamArg, UOp


def gemm_graph(M, N=None, K=None, bt=False):
    """C = A @ B as a shape graph: A (M, K), B (K, N) or, with bt, B^T (N, K)."""
    N = M if N is None else N
    K = M if K is None else K
    A = UOp(Ops.BUFFER, (), ParamArg(0, dtypes.f32, (M * K,)))
    B = UOp(Ops.BUFFER, (), ParamArg(1, dtypes.f32, (K * N,)))
    a = A.reshape((M, 1, K)).expand((M, N, K))
    b = B.reshape((N, K)) if bt else B.reshape((K, N)).permute((1, 0))
    return (a * b.reshape((1, N, K)).expand((M, N, K))).reduce(Ops.ADD, 1)


def bench(fn, reps=5):
    """Best of `reps` runs after one warm-up."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def compile_gemm(N, bt, opts):
    out = UOp(Ops.BUFFER, (), ParamArg(2, dtypes.f32, (N * N,)))
    return Program(render_c(lower(gemm_graph(N, bt=bt), out, Ctx(opts=opts)), "gemm"), "gemm")


ROWS = [
    ("B strided", False, "naive", Opts()),
    ("B strided", False, "threads", Opts(thread=0)),
    ("B strided", False, "4x4 tile + threads", Opts(upcast={0: 4, 1: 4}, thread=0)),
    ("B^T", True, "naive", Opts()),
    ("B^T", True, "threads", Opts(thread=0)),
    ("B^T", True, "4x4 tile", Opts(upcast={0: 4, 1: 4})),
    ("B^T", True, "4x4 tile + threads", Opts(upcast={0: 4, 1: 4}, thread=0)),
    ("B^T", True, "+ 64x64 cache blocks", Opts(upcast={0: 4, 1: 4}, thread=0, tile={0: 64, 1: 64})),
]


def blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info

        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        return ", ".join(
            f"{i['internal_api']} {i.get('version')} {i.get('architecture')} ({i['num_threads']} threads)" for i in info
        )
    except ImportError:
        cfg = np.show_config(mode="dicts") if hasattr(np, "show_config") else {}
        blas = cfg.get("Build Dependencies", {}).get("blas", {}) if isinstance(cfg, dict) else {}
        return f"{blas.get('name', '?')} {blas.get('version', '')} (install threadpoolctl for the kernel name)"


def table(N):
    from uopc.tensor import Tensor

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((N, N), np.float32), rng.standard_normal((N, N), np.float32)
    bt, c = np.ascontiguousarray(b.T), np.zeros(N * N, np.float32)
    flop = 2 * N**3
    ref = a @ b
    print(
        f"N={N}  ({flop / 1e9:.2f} GFLOP per GEMM)  uopc threads={get_num_threads()}  "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}  BLAS: {blas_info()}"
    )
    for layout, transposed, name, o in ROWS:
        prg = compile_gemm(N, transposed, o)
        rhs = bt if transposed else b
        t = bench(lambda: prg(a, rhs, c), reps=2 if not o.thread and not o.upcast else 5)
        err = np.abs(c.reshape(N, N) - ref).max()
        print(f"  {layout:10s} {name:22s} {flop / t / 1e9:8.1f} GFLOP/s   max err {err:.1e}")
    A, B = Tensor(a), Tensor(b)
    out = (A @ B).numpy()
    t_ours = bench(lambda: (A @ B).realize())
    print(
        f"  {'Tensor A@B':10s} {'(layout pass+opt)':22s} {flop / t_ours / 1e9:8.1f} GFLOP/s   "
        f"max err {np.abs(out - ref).max():.1e}  (end to end, includes the transpose copy)"
    )
    with Context(OPT=0):  # the same Tensor program with the optimizer off
        t_opt0 = bench(lambda: (A @ B).realize(), reps=1)
    speedup = t_opt0 / t_ours
    print(f"  {'Tensor A@B':10s} {'(OPT=0)':22s} {flop / t_opt0 / 1e9:8.1f} GFLOP/s   OPT=1 is {speedup:.0f}x faster")
    t_np = bench(lambda: a @ b)
    print(f"  {'numpy':33s} {flop / t_np / 1e9:8.1f} GFLOP/s")
    print(f"  Tensor A@B / numpy = {t_np / t_ours:.2f}")
    # the same two, interleaved over rounds (each round sees about the same machine state): medians
    # OpenBLAS's threads busy-wait for a while after each call (its THREAD_TIMEOUT, ~2^28 cycles) and take a core
    # from whatever runs next: pause before each variant so neither side runs against the other's spinning threads
    ours, theirs = [], []
    for _ in range(5):
        time.sleep(0.2)
        ours.append(bench(lambda: (A @ B).realize(), reps=3))
        time.sleep(0.2)
        theirs.append(bench(lambda: a @ b, reps=3))
    m_ours, m_np = float(np.median(ours)), float(np.median(theirs))
    print(
        f"  interleaved, 5 rounds: Tensor A@B {flop / m_ours / 1e9:.1f}, numpy {flop / m_np / 1e9:.1f} GFLOP/s "
        f"(medians), ratio {m_np / m_ours:.2f}"
    )


def interleave(sizes, rounds=3):
    """Compile the variants once, then time them in turn, round after round (same machine state per round)."""
    for N in sizes:
        rng = np.random.default_rng(0)
        a, bt = rng.standard_normal((N, N), np.float32), rng.standard_normal((N, N), np.float32)
        c = np.zeros(N * N, np.float32)
        variants = [("no blocks", {})] + [(f"{t}x{t} blocks", {0: t, 1: t}) for t in (32, 64, 128)]
        prgs = [(n, compile_gemm(N, True, Opts(upcast={0: 4, 1: 4}, thread=0, tile=t))) for n, t in variants]
        res: dict[str, list[float]] = {n: [] for n, _ in prgs}
        for _ in range(rounds):
            for n, p in prgs:
                res[n].append(2 * N**3 / bench(lambda: p(a, bt, c), reps=3) / 1e9)
        print(f"N={N}")
        for n, v in res.items():
            print(f"  {n:14s}" + "".join(f"{x:8.1f}" for x in v) + f"   median {np.median(v):7.1f} GFLOP/s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("N", nargs="?", type=int, default=1024)
    ap.add_argument("--interleave", action="store_true", help="cache-block comparison at N=1024 and 2048")
    args = ap.parse_args()
    if args.interleave:
        interleave([1024, 2048])
    else:
        table(args.N)

"""GEMM GFLOP/s: Tensor `A @ B` end to end against NumPy (OpenBLAS) and PyTorch, and the FMA peak, in one run.

  python bench/bench_gemm.py                the table: N = 256..2048 and the MLP shapes, interleaved rounds, medians
  python bench/bench_gemm.py --rounds 25    more rounds at 1024 and 2048 (small shapes run fewer)
  python bench/bench_gemm.py --threads 1    every library on one thread (steadier on a busy machine)
  python bench/bench_gemm.py --steps 1024   naive -> threads -> register tile -> cache blocks, step by step
  python bench/bench_gemm.py --interleave   4x4 tile + threads with and without cache blocks, in rounds

NumPy runs in a subprocess with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, so OpenBLAS picks its own kernel
for this CPU (printed, from threadpoolctl). Every variant sleeps 0.2 s first, and after each NumPy timing the
parent waits until the worker has used no CPU for 0.1 s: OpenBLAS's threads busy-wait after a call (up to a second
on this VM) and would take a core from whatever runs next. After the pause each side makes one untimed call: the
first call after an idle 0.2 s ran ~1.7x slower here (threads and vCPUs waking), which at one call per timing
(N >= 1024) halved whichever side it hit. The peak is a generated C kernel of independent FMAs.

B strided   C[i,j] = sum_k A[i,k] B[k,j]: the reduce walks down a column of B (stride N)
B^T         same math, B stored transposed: both operands contiguous along k
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from uopc.codegen.rangeify import Ctx, Opts, lower
from uopc.helpers import Context
from uopc.opt.gemm import microkernel
from uopc.renderer.c import render_c
from uopc.runtime import compiler as runtime
from uopc.runtime.compiler import Program, get_num_threads, set_num_threads
from uopc.tools.harness import wait_idle
from uopc.uop import Ops, ParamArg, UOp
from uopc.uop.dtype import dtypes


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


# (label, M, K, N): C (M, N) = A (M, K) @ B (K, N); the MLP rows are a 784-128 layer at batch 128 and its gradients
SHAPES = [
    ("N=256", 256, 256, 256),
    ("N=512", 512, 512, 512),
    ("N=1024", 1024, 1024, 1024),
    ("N=2048", 2048, 2048, 2048),
    ("MLP fwd 128x784 @ 784x128", 128, 784, 128),
    ("MLP dW 784x128 @ 128x128", 784, 128, 128),
    ("MLP dX 128x128 @ 128x784", 128, 128, 784),
    ("256x1024 @ 1024x1024", 256, 1024, 1024),
]

# the NumPy side: a subprocess without OpenBLAS overrides, timing on request (one line in, one line out)
_NUMPY_WORKER = """
import sys, time, numpy as np
from threadpoolctl import threadpool_info
print(' / '.join(f"{i['internal_api']} {i.get('version')} kernel {i.get('architecture')} ({i['num_threads']} threads)"
                for i in threadpool_info() if i.get('user_api') == 'blas'), flush=True)
mats = {}
for line in sys.stdin:
    m, k, n, reps = map(int, line.split())
    if (m, k, n) not in mats:
        g = np.random.default_rng(0)
        mats[m, k, n] = (g.standard_normal((m, k), np.float32), g.standard_normal((k, n), np.float32))
        np.matmul(*mats[m, k, n])
    a, b = mats[m, k, n]
    np.matmul(a, b)  # untimed: the first call after a pause wakes the threads (see the parent's comment)
    t = time.perf_counter()
    for _ in range(reps):
        np.matmul(a, b)
    print((time.perf_counter() - t) / reps, flush=True)
"""


class NumpyWorker:
    def __init__(self):
        env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
        env["OPENBLAS_NUM_THREADS"] = str(get_num_threads())
        self.p = subprocess.Popen(
            [sys.executable, "-c", _NUMPY_WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.info = self.p.stdout.readline().strip()

    def time(self, m: int, k: int, n: int, reps: int) -> float:
        self.p.stdin.write(f"{m} {k} {n} {reps}\n")
        self.p.stdin.flush()
        return float(self.p.stdout.readline())

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait()


def fma_peak(threads: int, seconds: float = 0.3) -> float:
    """GFLOP/s of a generated C kernel of independent vector FMAs on every thread (the machine's FMA peak)."""
    w = runtime.machine().vector_bytes // 4
    n_acc = 12  # independent chains: enough to cover FMA latency x FMA units on any current x86 core
    accs = "".join(f"    float{w} a{i} = x + {i}.0f;\n" for i in range(n_acc))
    body = "".join(f"      a{i} = a{i} * y + z;\n" for i in range(n_acc))
    total = " + ".join(f"a{i}" for i in range(n_acc))
    src = f"""typedef float float{w} __attribute__((vector_size({4 * w})));
void peak(float* restrict out, float* restrict iters) {{
  #pragma omp parallel for
  for (int t = 0; t < {threads}; t++) {{
    float{w} x = {{0}}, y = x + 0.999999f, z = x + 1e-7f;
{accs}    long n = (long)iters[0];
    for (long i = 0; i < n; i++) {{
{body}      __asm__ volatile("" : "+v"(a0), "+v"(a1));
    }}
    float{w} s = {total};
    out[t] = s[0];
  }}
}}
"""
    prg = Program(src, "peak")
    out, iters = np.zeros(threads, np.float32), np.array([1e6], np.float32)
    prg(out, iters)
    t = time.perf_counter()
    prg(out, iters)
    n = max(1e6, 1e6 * seconds / (time.perf_counter() - t))
    iters[0] = n
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        prg(out, iters)
        best = min(best, time.perf_counter() - t)
    return threads * n * n_acc * w * 2 / best / 1e9


def compare(rounds: int, only: str = "") -> None:
    from uopc.tensor import Tensor

    try:
        import torch

        torch.set_num_threads(get_num_threads())
    except ImportError:
        torch = None
    npw = NumpyWorker()
    threads = get_num_threads()
    mr, nr, w = microkernel(1024, 1024, 4, runtime.machine())
    print(f"uopc threads={threads}, microkernel {mr}x{nr} floats ({w}-float vectors); NumPy: {npw.info}")
    if torch is not None:
        print(f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads)")
    peak = fma_peak(threads)
    print(f"FMA peak (generated kernel of independent FMAs, {threads} threads): {peak:.0f} GFLOP/s")
    cols = ("uopc", "numpy", "torch", "/numpy", "/torch")
    print(f"{'shape':28s} {'rounds':>6s}" + "".join(f"{c:>9s}" for c in cols) + "  %peak  (GFLOP/s, medians)")
    for label, m, k, n in SHAPES:
        if only not in label:
            continue
        g = np.random.default_rng(0)
        a, b = g.standard_normal((m, k), np.float32), g.standard_normal((k, n), np.float32)
        A, B = Tensor(a), Tensor(b)
        err = np.abs((A @ B).numpy() - a @ b).max()
        flop = 2 * m * n * k
        reps = max(1, int(0.02 * 100e9 / flop))  # ~20 ms of work per timing
        nround = rounds if m * n * k >= 1024**3 else max(7, rounds // 2)
        variants = {"uopc": lambda: (A @ B).realize()}
        if torch is not None:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            variants["torch"] = lambda: ta @ tb
        res: dict[str, list[float]] = {"uopc": [], "numpy": [], "torch": []}
        for fn in variants.values():
            fn()
        for _ in range(nround):
            for name, fn in variants.items():
                time.sleep(0.2)
                fn()  # untimed: after a pause the first call runs ~1.7x slower on this VM (N=1024: 19 ms vs 11 ms)
                t = time.perf_counter()
                for _ in range(reps):
                    fn()
                res[name].append((time.perf_counter() - t) / reps)
            time.sleep(0.2)
            res["numpy"].append(npw.time(m, k, n, reps))
            wait_idle(npw.p.pid)  # OpenBLAS's threads spin after a call: let them stop first
        gf = {k: flop / statistics.median(v) / 1e9 for k, v in res.items() if v}
        tgf = gf.get("torch", float("nan"))
        ours = gf["uopc"]
        print(
            f"{label:28s} {nround:6d} {ours:9.1f}{gf['numpy']:9.1f}{tgf:9.1f}{ours / gf['numpy']:8.2f}x"
            f"{ours / tgf:8.2f}x {100 * ours / peak:5.0f}%  (max err {err:.1e})"
        )
    npw.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds at N=1024 and 2048")
    ap.add_argument("--threads", type=int, default=0, help="threads for every library (default: uopc's count)")
    ap.add_argument("--only", type=str, default="", help="only the shapes whose label contains this text")
    ap.add_argument("--steps", type=int, metavar="N", help="the step-by-step table at size N")
    ap.add_argument("--interleave", action="store_true", help="cache-block comparison at N=1024 and 2048")
    args = ap.parse_args()
    if args.interleave:
        interleave([1024, 2048])
    elif args.steps:
        table(args.steps)
    else:
        if args.threads:
            set_num_threads(args.threads)
        compare(args.rounds, args.only)

"""The one benchmark harness: interleaved rounds, medians, ratios, and probes of what this machine can do.

    runners = {"uopc": timed(lambda: f().realize()), "numpy": timed(lambda: g())}
    times = interleave(runners, rounds=5)      # round r runs every side once, so drifting load hits all of them
    med = medians(times); ratio(med, "uopc", "numpy")

`machine()` reports the CPU (model, cores, vector ISA from /proc/cpuinfo) and two measured peaks: FMA GFLOP/s from a
generated C kernel of independent fused multiply-add chains, and streaming GB/s from a C triad loop, both compiled
with uopc.runtime.compiler.Program and run on uopc's threads. The measurements are cached in the uopc cache directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from uopc import helpers
from uopc.helpers import atomic_write
from uopc.runtime import compiler as runtime
from uopc.runtime.buffer import buffer_data
from uopc.runtime.compiler import Program, compiler_identity
from uopc.runtime.threads import get_num_threads
from uopc.uop import base_buffer

__all__ = [
    "calibrate",
    "interleave",
    "machine",
    "medians",
    "new_inputs",
    "ratio",
    "time_n",
    "timed",
    "wait_idle",
]


# ---------------------------------------------------------------------------------------------------------------
# timing


def calibrate(fn: Callable[[], object], min_time: float) -> int:
    """How many calls of `fn` take at least `min_time` seconds (at least 1), found by doubling."""
    n = 1
    while True:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t >= min_time or n >= 1 << 20:
            return n
        n *= 2


def time_n(fn: Callable[[], object], n: int) -> float:
    """Seconds per call over `n` back-to-back calls."""
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / max(1, n)


def timed(fn: Callable[[], object], min_time: float = 0.05) -> Callable[[], float]:
    """A round runner: calls `fn` enough times to last about `min_time` s and returns seconds per call.

    The call count is fixed on the first round, so every round does the same work; each round starts with one
    untimed call.
    """
    state: dict[str, int] = {}

    def run() -> float:
        fn()  # untimed: the first round compiles and maps pages; later, the first call after a pause (another
        # side's turn) runs slower on a VM whose threads and vCPUs went idle (bench_gemm: ~1.7x at N=1024)
        if "n" not in state:
            state["n"] = calibrate(fn, min_time)
        return time_n(fn, state["n"])

    return run


def wait_idle(pid: int, cap: float = 3.0, quiet: float = 0.1) -> bool:
    """Wait until process `pid` has used no CPU for `quiet` s (True), or `cap` s have passed (False).

    A BLAS in another process keeps its threads spinning after a call (OpenBLAS: up to a second on this project's
    VM), taking cores from whatever is timed next; call this after timing that process. Linux only (/proc); elsewhere
    it sleeps `cap` / 3 and returns True."""
    stat = f"/proc/{pid}/stat"

    def cpu_ticks() -> int:
        with open(stat) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime: fields 14 and 15 of proc(5)

    if not os.path.exists(stat):
        time.sleep(cap / 3)
        return True
    end, last = time.perf_counter() + cap, cpu_ticks()
    while time.perf_counter() < end:
        time.sleep(quiet)
        now = cpu_ticks()
        if now == last:
            return True
        last = now
    return False


def interleave(
    runners: dict[str, Callable[[], float]],
    rounds: int,
    on_round: Callable[[int, dict[str, list[float]]], None] | None = None,
) -> dict[str, list[float]]:
    """Run each runner once per round, alternating, and collect what each returns (seconds per call) per round.

    Before each side runs, this process's threads are let go idle (wait_idle on our own pid: the waiting thread
    sleeps, so only other threads count): onnxruntime's pool and the OpenMP teams of PyTorch and uopc spin after a
    call, and a side timed while the previous side's threads still spin loses cores to them (ResNet-18 b1 timed
    right after onnxruntime: uopc 32.9 ms, after its threads went idle 24.7 ms; onnxruntime's own time unchanged)."""
    times: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(rounds):
        for name, run in runners.items():
            wait_idle(os.getpid(), cap=1.0, quiet=0.05)
            times[name].append(run())
        if on_round is not None:
            on_round(r, times)
    return times


def new_inputs(*tensors):
    """`tensors`, realized, with their storage handed out (a NumPy view): a benchmark times one input over and over
    where a caller gives a new one each call, and uopc keeps across calls what it computes from unchanged inputs
    (uopc.engine.kept: a weight's panels or Winograd transform). Storage whose contents may change unseen keeps
    nothing, so every call computes what a new input would make it compute. Weights stay as they are: prepacked
    once, as onnxruntime and oneDNN do. Returns the tensors as a list."""
    out = []
    for t in tensors:
        t.realize()
        buffer_data(base_buffer(t.uop))
        out.append(t)
    return out


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in times.items() if v}


def ratio(med: dict[str, float], a: str, b: str) -> float | None:
    """med[a] / med[b] (below 1: a is faster), or None when either is missing."""
    return med[a] / med[b] if a in med and b in med and med[b] > 0 else None


# ---------------------------------------------------------------------------------------------------------------
# the machine


def cpu_info() -> dict:
    """CPU model, cores this process may use, and the ISA and vector width the compiler targets (the Machine)."""
    m = runtime.machine()
    isa = sorted(m.isa)
    return {
        "model": m.model,
        "cores": m.cores,
        "isa": isa,
        "vector_bytes": m.vector_bytes,
        "threads": get_num_threads(),
    }


_FMA_SRC = """
#include <omp.h>
#include <time.h>
typedef float vf __attribute__((vector_size({width})));
static double cpu_now(void) {{
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}}
void fma_peak(float* out, long long* iters) {{
  #pragma omp parallel
  {{
    vf a[{chains}];
    vf m = (vf){{0}} + 0.999999f, c = (vf){{0}} + 1e-7f;
    for (int j = 0; j < {chains}; j++) a[j] = (vf){{0}} + (float)(j + 1);
    double t0 = cpu_now();
    for (long long i = 0; i < iters[0]; i++) {{
      #pragma GCC unroll {chains}
      for (int j = 0; j < {chains}; j++) a[j] = a[j] * m + c;
    }}
    double t1 = cpu_now();
    float s = 0.0f;
    for (int j = 0; j < {chains}; j++) for (int l = 0; l < {lanes}; l++) s += a[j][l];
    int tid = omp_get_thread_num();
    out[tid] = (float)(t1 - t0);  /* this thread's CPU time: other processes' time slices are not counted */
    out[128 + tid] = s;           /* keeps the chains alive */
    if (tid == 0) out[255] = (float)omp_get_num_threads();
  }}
}}
"""

_TRIAD_SRC = """
#include <omp.h>
#include <time.h>
void triad(float* restrict a, const float* restrict b, const float* restrict c, long long* n, double* secs) {
  const long long N = n[0];
  #pragma omp parallel
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    long long lo = N * t / nt, hi = N * (t + 1) / nt;
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (long long i = lo; i < hi; i++) a[i] = b[i] + 3.0f * c[i];
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    secs[t] = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    if (t == 0) secs[255] = nt;
  }
}
"""


def _best(fn: Callable[[], object], reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)  # a peak: the least disturbed run


def probe_fma(vector_bytes: int, iters: int = 1_000_000, reps: int = 10) -> float:
    """Measured GFLOP/s of independent vector FMA chains on every uopc thread (2 FLOPs per lane per FMA).

    Each thread times itself in CPU time, so on a shared machine the peak is what the cores can do, not the share
    of them this process got; the rates of the threads add up (one thread per core).
    """
    chains, lanes = 12, vector_bytes // 4  # 12 chains hide the FMA latency (4-5 cycles x 2 ports)
    prg = Program(_FMA_SRC.format(width=vector_bytes, chains=chains, lanes=lanes), "fma_peak")
    out, n = np.zeros(256, np.float32), np.array([iters], np.int64)
    best = 0.0
    for _ in range(reps + 1):  # the first run warms up (thread pool, clocks)
        prg(out, n)
        threads = int(out[255]) or 1
        best = max(best, sum(iters * chains * lanes * 2 / max(float(t), 1e-9) for t in out[:threads]) / 1e9)
    return best


def probe_bandwidth(mbytes: int = 64, reps: int = 10) -> float:
    """Measured streaming GB/s of a triad a = b + 3c over arrays larger than the caches (3 arrays counted).

    Timed per thread in CPU time (the slowest thread counts), so other processes' time slices are not counted.
    """
    n = mbytes * (1 << 20) // 4
    a, b, c = np.zeros(n, np.float32), np.ones(n, np.float32), np.ones(n, np.float32)
    prg = Program(_TRIAD_SRC, "triad")
    nn, secs = np.array([n], np.int64), np.zeros(256, np.float64)
    best = 0.0
    for _ in range(reps + 1):  # the first run touches the pages
        prg(a, b, c, nn, secs)
        t = max(secs[: int(secs[255]) or 1])
        best = max(best, 3 * n * 4 / max(t, 1e-9) / 1e9)
    return best


def _probe_path() -> str:
    return os.path.join(helpers.cache_dir(), "probes.json")


def _probe_key(cpu: dict) -> str:
    ident = compiler_identity() + f"\nthreads={cpu['threads']}\nvector={cpu['vector_bytes']}"
    return hashlib.sha256(ident.encode()).hexdigest()


def machine(refresh: bool = False) -> dict:
    """CPU facts plus the measured FMA peak and streaming bandwidth (cached per compiler, flags, CPU and threads)."""
    cpu = cpu_info()
    key, path = _probe_key(cpu), _probe_path()
    cached: dict = {}
    try:
        with open(path) as f:
            cached = json.load(f)
    except (OSError, ValueError):
        pass
    entry = cached.get(key) if isinstance(cached, dict) else None
    if refresh or not isinstance(entry, dict) or "peak_gflops" not in entry:
        entry = {"peak_gflops": probe_fma(cpu["vector_bytes"]), "bandwidth_gbs": probe_bandwidth()}
        cached = cached if isinstance(cached, dict) else {}
        cached[key] = entry
        atomic_write(path, json.dumps(cached, indent=1).encode())
        entry = {**entry, "measured_now": True}
    return {**cpu, **entry}


def format_machine(m: dict) -> str:
    """The machine in two lines, as `uopc bench` and `uopc profile` print it."""
    src = "measured now" if m.get("measured_now") else "cached probe"
    return (
        f"machine: {m['model']}, {m['cores']} cores, uopc threads {m['threads']}, ISA {' '.join(m['isa']) or '?'} "
        f"({m['vector_bytes'] * 8}-bit vectors)\n"
        f"peaks:   FMA {m['peak_gflops']:.1f} GFLOP/s, stream triad {m['bandwidth_gbs']:.1f} GB/s ({src})"
    )

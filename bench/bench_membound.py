"""Memory-bound kernels against PyTorch and against the machine's streaming bandwidth, in one run.

    python bench/bench_membound.py [--rounds 7] [--no-compile]

Workloads: softmax 4096^2, LayerNorm 8192x1024 (uopc's nn.LayerNorm, composed from mean/square/sqrt), the
elementwise ((x*2+1).relu()*3) on 2^26 floats, row-sum 8192^2. Each round runs every side once, interleaved; the
table prints medians and ratios. The bandwidth floor of a workload is the bytes its uopc plan moves (every kernel
reads each of its inputs and writes its output once) divided by the streaming bandwidth of a plain C loop measured in
the same run; `min` is the same for the bytes any implementation must move (inputs once, output once).

First-touch page faults are very expensive on this project's VMs, so every side runs with glibc told to keep freed
memory (MALLOC_MMAP_MAX_=0, a large MALLOC_TRIM_THRESHOLD_): the script re-executes itself with those set.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
if any(os.environ.get(k) != v for k, v in MALLOC.items()):  # glibc reads these at start-up: re-exec with them set
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC})

import numpy as np  # noqa: E402

from uopc import Tensor, nn  # noqa: E402
from uopc.engine import realize  # noqa: E402
from uopc.runtime import compiler as runtime  # noqa: E402
from uopc.runtime.buffer import buffer_data  # noqa: E402
from uopc.schedule import RefKind  # noqa: E402
from uopc.uop import structure_key  # noqa: E402

STREAM_C = """void stream(float* restrict a, float* restrict b) {
  #pragma omp parallel for
  for (long i = 0; i < %dL; i++) b[i] = a[i] * 3.0f;
}
"""


def median_ms(ts: list[float]) -> float:
    return float(np.median(ts)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = ap.parse_args()
    import torch

    threads = runtime.get_num_threads()
    torch.set_num_threads(threads)
    print(f"malloc (every side, this process): {' '.join(f'{k}={os.environ[k]}' for k in MALLOC)}")
    print(
        f"threads: uopc {threads}, torch {torch.get_num_threads()}; torch {torch.__version__}; "
        f"CFLAGS {runtime.cflags()}"
    )

    rng = np.random.default_rng(0)
    data = {
        "softmax 4096^2": rng.standard_normal((4096, 4096), dtype=np.float32),
        "LayerNorm 8192x1024": rng.standard_normal((8192, 1024), dtype=np.float32),
        "relu chain 2^26": rng.standard_normal(2**26, dtype=np.float32),
        "row-sum 8192^2": rng.standard_normal((8192, 8192), dtype=np.float32),
    }
    ln = nn.LayerNorm(1024)
    uopc_fn = {
        "softmax 4096^2": lambda t: t.softmax(-1),
        "LayerNorm 8192x1024": ln,
        "relu chain 2^26": lambda t: (t * 2 + 1).relu() * 3,
        "row-sum 8192^2": lambda t: t.sum(1),
    }
    torch_fn = {
        "softmax 4096^2": lambda t: torch.softmax(t, -1),
        "LayerNorm 8192x1024": lambda t: torch.nn.functional.layer_norm(t, (1024,)),
        "relu chain 2^26": lambda t: torch.relu(t * 2 + 1) * 3,
        "row-sum 8192^2": lambda t: t.sum(1),
    }
    tens = {k: Tensor(v).realize() for k, v in data.items()}
    tts = {k: torch.from_numpy(v) for k, v in data.items()}

    # check every side once (and compile uopc's plans), and count the bytes each plan moves
    bytes_plan, bytes_min = {}, {}
    for k in data:
        lazy = uopc_fn[k](tens[k])
        inputs = structure_key([lazy.uop])[1]
        got = lazy.numpy()
        ref = torch_fn[k](tts[k]).numpy()
        err = float(np.abs(got - ref).max())
        cp = next(reversed(realize._plans.values()))
        n = 0
        for kern in cp.plan.kernels:
            for param in kern.refs:
                if param.kind is RefKind.IN:
                    n += buffer_data(inputs[param.i]).nbytes
                elif param.kind is not RefKind.ERR:  # an error record is a few words
                    b = cp.plan.temps[param.i] if param.kind is RefKind.TMP else cp.plan.outs[param.i]
                    n += b.dtype.itemsize * b.size
        bytes_plan[k] = n
        bytes_min[k] = data[k].nbytes + ref.nbytes
        print(f"{k:22s} max |uopc - torch| = {err:.2e}; plan: {len(cp.plan.kernels)} kernels, {n / 2**20:.0f} MiB")

    compiled = {}
    if not args.no_compile:
        for k in data:
            try:
                t0 = time.perf_counter()
                f = torch.compile(torch_fn[k])
                f(tts[k])
                compiled[k] = f
                print(f"torch.compile {k}: ready in {time.perf_counter() - t0:.1f} s")
            except Exception as e:  # a missing C++ toolchain or an inductor error: leave that column out
                print(f"torch.compile {k}: skipped ({type(e).__name__}: {str(e).splitlines()[0][:100]})")

    src = data["relu chain 2^26"]
    prg = runtime.Program(STREAM_C % src.size, "stream")
    dst = np.empty_like(src)
    prg(src, dst)  # map the output's pages once, as every other side's reused memory is

    times: dict[tuple[str, str], list[float]] = {}

    def timed(key: tuple[str, str], fn) -> None:
        t0 = time.perf_counter()
        fn()
        times.setdefault(key, []).append(time.perf_counter() - t0)

    for _ in range(args.rounds):
        timed(("stream", "C"), lambda: prg(src, dst))
        for k in data:
            timed((k, "uopc"), lambda k=k: uopc_fn[k](tens[k]).realize())
            timed((k, "torch"), lambda k=k: torch_fn[k](tts[k]))
            if k in compiled:
                timed((k, "compile"), lambda k=k: compiled[k](tts[k]))

    stream_ms = median_ms(times[("stream", "C")])
    bw = 2 * src.nbytes / (stream_ms / 1e3)
    print(f"\nplain C streaming loop (b[i] = a[i]*3) over 2 x {src.nbytes >> 20} MiB: {stream_ms:.2f} ms, "
          f"{bw / 1e9:.1f} GB/s  ({args.rounds} interleaved rounds, medians)")  # fmt: skip
    head = f"{'workload':22s} {'uopc ms':>8s} {'eager ms':>8s} {'compile':>8s} {'uopc/best':>9s}"
    print(head + f" {'floor ms':>8s} {'uopc/floor':>10s} {'min floor':>9s} {'uopc/min':>8s}")
    for k in data:
        u = median_ms(times[(k, "uopc")])
        e = median_ms(times[(k, "torch")])
        c = median_ms(times[(k, "compile")]) if k in compiled else float("nan")
        best = min(e, c) if k in compiled else e
        floor = bytes_plan[k] / bw * 1e3
        mfloor = bytes_min[k] / bw * 1e3
        cs = f"{c:8.2f}" if k in compiled else f"{'-':>8s}"
        row = f"{k:22s} {u:8.2f} {e:8.2f} {cs} {u / best:9.2f}"
        print(row + f" {floor:8.2f} {u / floor:10.2f} {mfloor:9.2f} {u / mfloor:8.2f}")
    relu = median_ms(times[("relu chain 2^26", "uopc")])
    print(f"relu chain vs the streaming loop over the same bytes: {relu / stream_ms:.2f}x")


if __name__ == "__main__":
    main()

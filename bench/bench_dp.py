"""Data-parallel training over MPI: steps/s on 1 and 2 ranks, scaling efficiency, and all-reduce bandwidth.

    python bench/bench_dp.py                       # 3 interleaved rounds of 200 steps per configuration
    python bench/bench_dp.py --rounds 5 --steps 400

Every configuration runs the MNIST MLP (784-128-10, AdamW, synthetic data) in ranks started with `mpiexec`, one
OpenMP thread each. Rounds alternate the configurations so drifting machine load hits all of them; each figure is
the median over rounds. Configurations:
  one plan      1 process, the usual single-plan step (forward, backward and update in one realize)
  dp 1 rank     DataParallel on 1 rank: two plans per step (gradients, then update) and a 1-rank all-reduce
  dp 2 strong   2 ranks, the same global batch split in two (time to train an epoch)
  dp 2 weak     2 ranks, each with the full batch (throughput at a fixed per-rank batch)
Then the all-reduce of 1-64 MiB float32 messages on 2 ranks over loopback (shared memory): `uopc` is
`uopc.distributed.all_reduce` (a fresh result array each call), `MPI` an in-place MPI Allreduce on one array.
Bus bandwidth is the algorithm bandwidth times 2(n-1)/n, the bytes each rank moves in a ring all-reduce.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

from uopc.nn import AdamW, Linear, parameters
from uopc.tensor import Tensor

SIZES_MIB = [1, 2, 4, 8, 16, 32, 64]


def mpiexec() -> str:
    found = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if not found:
        sys.exit(f"no mpiexec next to {sys.executable} or on PATH: pip install -e '.[dist]'")
    return found


def launch(ranks: int, *args: str) -> dict:
    """Run this script's worker on `ranks` ranks; rank 0's last stdout line is a JSON result."""
    env = dict(os.environ, UOPC_NUM_THREADS="1")
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, os.path.abspath(__file__), "--worker", *args]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{res.stdout}\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------
# inside the ranks


def worker_steps(dist, mode: str, batch: int, steps: int, warmup: int) -> dict:
    """Time `steps` training steps with `batch` samples per rank after `warmup` steps (which compile)."""
    world = dist.init()
    g = np.random.default_rng(world.rank)
    x, y = g.standard_normal((batch, 784)).astype(np.float32), g.integers(0, 10, batch).astype(np.int32)
    data = [(x, y), (x + 1, y)]  # alternate two batches: fresh inputs every step, the same structure
    Tensor.manual_seed(0)
    l1, l2 = Linear(784, 128), Linear(128, 10)
    opt = AdamW(parameters([l1, l2]), lr=1e-3)
    dp = dist.DataParallel(opt) if mode == "dp" else None
    t0 = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            dist.barrier()
            t0 = time.perf_counter()
        x, y = data[i % 2]
        loss = l2(l1(Tensor(x)).relu()).cross_entropy(Tensor(y))
        opt.zero_grad()
        loss.backward(opt.params)
        if dp is not None:
            dp.step(loss)
        else:
            opt.step(loss)
    return {"sps": steps / (time.perf_counter() - t0)}


def worker_allreduce(dist, reps: int) -> dict:
    """Median seconds per all-reduce of each message size, through uopc and through MPI in place."""
    from mpi4py import MPI  # only in the ranks (see main)

    dist.init()
    comm, out = MPI.COMM_WORLD, {}
    for mib in SIZES_MIB:
        arr = np.ones(mib << 18, np.float32)
        t = Tensor(arr).realize()
        n = max(3, min(reps, (256 // mib)))
        for name, fn in (("uopc", lambda: dist.all_reduce(t)), ("mpi", lambda: comm.Allreduce(MPI.IN_PLACE, arr))):
            fn()  # warm: first-touch page faults, connection setup
            ts = []
            for _ in range(n):
                comm.Barrier()
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            # the slowest rank decides when a collective is done
            out[f"{name}_{mib}"] = comm.allreduce(statistics.median(ts), op=MPI.MAX)
    return out


# ---------------------------------------------------------------------------------------------------
# the launching process


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128, help="the global batch of the strong-scaling runs")
    ap.add_argument("--reps", type=int, default=20, help="all-reduce repetitions per message size (at most)")
    ap.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker is not None:
        # only the ranks import uopc.distributed: importing mpi4py.MPI initializes MPI, which would make this
        # launching process a one-rank MPI job of its own
        from uopc import distributed as dist

        kind, *rest = args.worker
        if kind == "steps":
            mode, batch = rest[0], int(rest[1])
            res = worker_steps(dist, mode, batch, args.steps, args.warmup)
        else:
            res = worker_allreduce(dist, args.reps)
        if dist.init().rank == 0:
            print(json.dumps(res))
        return

    b = args.batch
    configs = {  # name -> (ranks, mode, per-rank batch, global batch)
        "one plan": (1, "single", b, b),
        "dp 1 rank": (1, "dp", b, b),
        "dp 2 strong": (2, "dp", b // 2, b),
        "dp 2 weak": (2, "dp", b, 2 * b),
    }
    sps: dict[str, list[float]] = {k: [] for k in configs}
    print(
        f"MLP 784-128-10, AdamW, synthetic data, 1 OpenMP thread per rank; {args.rounds} interleaved rounds of "
        f"{args.steps} steps (after {args.warmup} warm-up); medians"
    )
    for _ in range(args.rounds):
        for name, (ranks, mode, local, _) in configs.items():
            res = launch(ranks, "steps", mode, str(local), "--steps", str(args.steps), "--warmup", str(args.warmup))
            sps[name].append(res["sps"])
    med = {k: statistics.median(v) for k, v in sps.items()}
    print(f"{'configuration':<14} {'ranks':>5} {'global batch':>12} {'steps/s':>9} {'samples/s':>10}")
    for name, (ranks, _, _, gb) in configs.items():
        print(f"{name:<14} {ranks:>5} {gb:>12} {med[name]:9.1f} {med[name] * gb:10.0f}")
    base = med["dp 1 rank"]
    print(f"two plans + all-reduce vs one plan, 1 rank: {med['dp 1 rank'] / med['one plan']:.2f}x the steps/s")
    strong = med["dp 2 strong"] / base
    print(f"strong scaling (global batch {b}): speedup {strong:.2f}x on 2 ranks, efficiency {strong / 2 * 100:.0f}%")
    weak = med["dp 2 weak"] / base
    print(f"weak scaling ({b} per rank): samples/s {2 * weak:.2f}x on 2 ranks, efficiency {weak * 100:.0f}%")
    print(f"  (vs the one-plan step: strong {med['dp 2 strong'] / med['one plan'] / 2 * 100:.0f}%, ", end="")
    print(f"weak {med['dp 2 weak'] / med['one plan'] * 100:.0f}%)")

    ar = launch(2, "allreduce", "--reps", str(args.reps))
    print("all-reduce, 2 ranks, float32, loopback (shared memory); median per call")
    print(f"{'size':>7} {'uopc ms':>9} {'algbw GB/s':>11} {'busbw GB/s':>11} {'MPI ms':>9} {'algbw GB/s':>11}")
    for mib in SIZES_MIB:
        nbytes = mib << 20
        tu, tm = ar[f"uopc_{mib}"], ar[f"mpi_{mib}"]
        print(
            f"{mib:>4} MiB {tu * 1e3:9.3f} {nbytes / tu / 1e9:11.2f} {nbytes / tu / 1e9 * 2 * (2 - 1) / 2:11.2f} "
            f"{tm * 1e3:9.3f} {nbytes / tm / 1e9:11.2f}"
        )


if __name__ == "__main__":
    main()

"""What the always-on index checks cost: the MNIST training step with its data-dependent index checks (the
cross-entropy's label gather and its scatter-add gradient) against the same step with the checks rendered away.

    python bench/bench_index_checks.py                 # 784-128-10 MLP, AdamW, batch 128, TinyJit replay
    python bench/bench_index_checks.py --rounds 15 --steps 100 --threads 1

Both steps are captured by TinyJit, so each keeps its own compiled plan: the checked one as uopc builds it, the
unchecked one compiled while the renderer's CHECK entry emits the bare index (`uopc_check(data3, i, 1, lo, n, k)`,
whose error record is the kernel's dataN, -> `i`).
Rounds alternate between the two; each prints the median ms/step with the spread (min..max over rounds), and the
cost of the checks as (checked - unchecked) / unchecked. Inputs are pre-realized batches cycled from a pool of 8.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from uopc.engine import realize
from uopc.renderer.c import code_for_op
from uopc.runtime import compiler as runtime
from uopc.tools import harness
from uopc.tools.bench_suite import mnist_batches, uopc_stepper
from uopc.uop import Ops


def _bare_index(r, u) -> str:
    """CHECK without the check: the index itself (negative ones still wrap when the op allows them)."""
    i, (n, _, lo) = r.expr(u.src[0]), u.arg
    return f"(({u.dtype.cname})({i} < 0 ? {i} + {n} : {i}))" if lo < 0 else f"(({u.dtype.cname})({i}))"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--steps", type=int, default=50, help="steps per round")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="OpenMP threads (0: the default)")
    args = ap.parse_args()
    if args.threads:
        runtime.set_num_threads(args.threads)
    data, sizes = mnist_batches(8, 128), [784, args.hidden, 10]

    checked = uopc_stepper(data, sizes, 1e-3, jit=True)
    for _ in range(3):  # run, capture, replay
        checked()
    n_checked = sum(cp.src.count("uopc_check(data") for cp in realize._plans.values())  # not UOPC_CHECK_OOB's
    realize._plans.clear()  # the unchecked step must compile its own plan, not find the checked one
    original, cache = code_for_op[Ops.CHECK], os.environ.get("UOPC_CACHE")
    code_for_op[Ops.CHECK] = _bare_index
    # a cache of its own: the plan store would hand back the checked plan (its key knows nothing of this patch)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["UOPC_CACHE"] = tmp
        try:
            unchecked = uopc_stepper(data, sizes, 1e-3, jit=True)
            for _ in range(3):
                unchecked()
            n_unchecked = sum(cp.src.count("uopc_check(data") for cp in realize._plans.values())
        finally:
            code_for_op[Ops.CHECK] = original
            realize._plans.clear()
            if cache is None:
                del os.environ["UOPC_CACHE"]
            else:
                os.environ["UOPC_CACHE"] = cache
    print(f"index checks in the step's C: checked plan {n_checked}, unchecked plan {n_unchecked}")
    assert n_checked > 0 and n_unchecked == 0, "the two plans do not differ in their checks"

    runners = {"checked": checked, "unchecked": unchecked}
    rounds = {k: (lambda s=s: harness.time_n(s, args.steps)) for k, s in runners.items()}
    times = harness.interleave(rounds, args.rounds)
    med = harness.medians(times)
    print(
        f"MLP {'-'.join(map(str, sizes))}, AdamW, batch 128, TinyJit, {runtime.get_num_threads()} threads "
        f"(median of {args.rounds} interleaved rounds x {args.steps} steps):"
    )
    for k, v in med.items():
        print(f"  {k:10s} {v * 1e3:7.3f} ms/step  (rounds {min(times[k]) * 1e3:.3f} .. {max(times[k]) * 1e3:.3f})")
    cost = harness.ratio(med, "checked", "unchecked") - 1
    print(f"cost of the index checks: {cost * 100:+.2f}% of the step (target <= 2%)")


if __name__ == "__main__":
    main()

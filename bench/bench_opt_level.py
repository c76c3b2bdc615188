"""-O2 against -O3, per kernel class: what each costs gcc and what it buys at run time, on the models' real kernels.

    python bench/bench_opt_level.py                          # GPT-2 small forward, char-GPT step, ResNet-18, CNN step
    python bench/bench_opt_level.py --models cnn --rounds 5
    python bench/bench_opt_level.py --quick                  # small configs, to try it out
    python bench/bench_opt_level.py --low "-O2 -fvect-cost-model=dynamic"   # another level against -O3

For each model the process builds the call twice, once with uopc's CFLAGS as they are (-O3) and once with -O3
replaced by -O2, each in its own empty UOPC_CACHE, so both sides compile every plan. Then:
- gcc: every distinct kernel of those plans, rendered alone (`render_c`), compiled to an object by one `gcc -c` per
  kernel and level, sequentially, in alternating order; seconds summed per class;
- run: the two builds' calls alternate for `--rounds` rounds, each round `--calls` calls, with every kernel timed by
  the plan's own timers (realize.set_kernel_hook); per class, the median over rounds of its seconds per call.
A kernel's class is the first word of its `op` (matmul, sum, max, elementwise, copy, scatter_add, setitem ...).
Allocation: both builds run on pool storage uopc owns (the first call of each faults its pages in; the rounds reuse
them). 2 threads unless --threads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import models  # noqa: E402

from uopc import Tensor, helpers  # noqa: E402
from uopc.engine import realize  # noqa: E402
from uopc.renderer.c import render_c  # noqa: E402
from uopc.runtime import compiler  # noqa: E402
from uopc.runtime.threads import set_num_threads  # noqa: E402

QUICK = {  # bench_coldstart.py's quick configs
    "gpt2": dict(layers=2, dim=64, heads=2, vocab=97, seq=32),
    "chargpt": dict(batch=4, ctx=16, layers=1),
    "resnet18": dict(seq=32),
    "cnn": dict(batch=16),
}


def kind(k) -> str:
    return k.op.split(" ")[0] if k.op else "other"


def build(name: str, flags: list[str], quick: bool, cache: str):
    """The workload built and called once under `flags` in its own cache; returns the call, its inputs and the
    compiled plans it ran."""
    os.environ["UOPC_CACHE"] = cache
    with helpers.Context(CFLAGS=flags):
        w = models.build(name, "uopc", **(QUICK[name] if quick else {}))
        xs = [Tensor(x) for x in w.inputs]
        Tensor.realize_all(*xs)
        before = set(map(id, realize._plans.values()))
        out = w.call(*xs)
        Tensor.realize_all(*[t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, Tensor)])
        plans = [cp for cp in realize._plans.values() if id(cp) not in before]
    return w, xs, plans


def gcc_seconds(kernels: list, flags: list[str], cc: str, tmp: str) -> dict[str, float]:
    """Seconds of `gcc -c` per kernel class, each distinct kernel compiled alone."""
    per: dict[str, float] = {}
    for i, k in enumerate(kernels):
        src = os.path.join(tmp, f"k{i}.c")
        with open(src, "w") as f:
            f.write(render_c(k.ast, "k"))
        t0 = time.perf_counter()
        subprocess.run([cc, *flags, "-fPIC", "-c", "-o", os.devnull, src], check=True)
        per[kind(k)] = per.get(kind(k), 0.0) + time.perf_counter() - t0
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gpt2,chargpt,resnet18,cnn")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=3, help="calls per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--low", default="-O2", help="the flags that replace -O3 on the -O2 side (e.g. '-O2 -fno-...')")
    args = ap.parse_args()
    set_num_threads(args.threads)
    o3 = compiler.base_cflags()  # the CFLAGS setting; the Machine's additions follow from it
    if "-O3" not in o3:
        raise SystemExit(f"bench_opt_level: the flags have no -O3 to compare: {o3}")
    low = args.low.split()  # what replaces -O3 on the "-O2" side
    levels = {"-O3": o3, "-O2": [g for f in o3 for g in (low if f == "-O3" else [f])]}
    cc = compiler._resolve_compiler()
    keep = os.environ.get("UOPC_CACHE")
    print(f"gcc {compiler._compiler_version(cc).splitlines()[0]}; flags {' '.join(o3)}; {args.threads} threads")
    print(f"the -O2 columns: -O3 replaced by {args.low}")
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            built = {lv: build(name, fl, args.quick, os.path.join(tmp, lv)) for lv, fl in levels.items()}
            kernels = list({k.ast: k for cp in built["-O3"][2] for k in cp.kernels}.values())
            gcc = {lv: {} for lv in levels}
            for r in range(2):  # alternate the order: the second compile of a file is no warmer than the first
                for lv in ("-O3", "-O2") if r % 2 == 0 else ("-O2", "-O3"):
                    with helpers.Context(CFLAGS=levels[lv]):
                        flags = compiler.cflags()
                    for c, t in gcc_seconds(kernels, flags, cc, tmp).items():
                        gcc[lv].setdefault(c, []).append(t)
            run: dict[str, dict[str, list[float]]] = {lv: {} for lv in levels}
            for r in range(args.rounds):
                for lv in ("-O3", "-O2") if r % 2 == 0 else ("-O2", "-O3"):
                    w, xs, _ = built[lv]
                    acc: dict[str, float] = {}
                    old = realize.set_kernel_hook(
                        lambda k, t, acc=acc: acc.__setitem__(kind(k), acc.get(kind(k), 0) + t)
                    )
                    with helpers.Context(CFLAGS=levels[lv]):
                        for _ in range(args.calls):  # an inference call returns a lazy tensor: realize it
                            out = w.call(*xs)
                            Tensor.realize_all(
                                *[t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, Tensor)]
                            )
                    realize.set_kernel_hook(old)
                    for c, t in acc.items():
                        run[lv].setdefault(c, []).append(t / args.calls)
        if keep is None:
            os.environ.pop("UOPC_CACHE", None)
        else:
            os.environ["UOPC_CACHE"] = keep
        counts: dict[str, int] = {}
        for k in kernels:
            counts[kind(k)] = counts.get(kind(k), 0) + 1
        print(f"\n{name}{' (quick)' if args.quick else ''}: {len(kernels)} distinct kernels")
        print(
            f"  {'class':14s} {'n':>4s} {'gcc -O3 s':>10s} {'gcc -O2 s':>10s} {'O2/O3':>6s} "
            f"{'run -O3 ms':>11s} {'run -O2 ms':>11s} {'O2/O3':>6s}"
        )
        tot = {lv: [0.0, 0.0] for lv in levels}
        for c in sorted(counts, key=lambda c: -statistics.median(run["-O3"].get(c, [0]))):
            g = {lv: statistics.median(gcc[lv].get(c, [0])) for lv in levels}
            t = {lv: statistics.median(run[lv].get(c, [0])) for lv in levels}
            for lv in levels:
                tot[lv][0] += g[lv]
                tot[lv][1] += t[lv]
            gr = g["-O2"] / g["-O3"] if g["-O3"] else float("nan")
            tr = t["-O2"] / t["-O3"] if t["-O3"] else float("nan")
            print(
                f"  {c:14s} {counts[c]:4d} {g['-O3']:10.2f} {g['-O2']:10.2f} {gr:6.2f} "
                f"{t['-O3'] * 1e3:11.3f} {t['-O2'] * 1e3:11.3f} {tr:6.2f}"
            )
        a, b = tot["-O3"], tot["-O2"]
        nan = float("nan")
        print(
            f"  {'all':14s} {len(kernels):4d} {a[0]:10.2f} {b[0]:10.2f} {b[0] / a[0] if a[0] else nan:6.2f} "
            f"{a[1] * 1e3:11.3f} {b[1] * 1e3:11.3f} {b[1] / a[1] if a[1] else nan:6.2f}"
        )


if __name__ == "__main__":
    main()

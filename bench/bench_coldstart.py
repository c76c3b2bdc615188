"""The first call of each model in a fresh process: uopc (under TinyJit) with an empty and then a warm kernel cache,
against torch.compile's first call with an empty and a warm inductor cache.

    python bench/bench_coldstart.py                              # every row (GPT-2 takes tens of seconds today)
    python bench/bench_coldstart.py --models softmax,cnn,resnet18
    python bench/bench_coldstart.py --no-torch                   # uopc only
    python bench/bench_coldstart.py --quick                      # small configs, to try it out

Each cell is its own Python process. uopc: a fresh UOPC_CACHE temp dir (empty), then a second process on that dir
(warm), in --rounds rounds (default 3: the table gives medians and ranges, a single first call on this VM varies by
10-20%); the process never imports torch. The first call is the first call of the TinyJit'd forward or training
step, which runs it eagerly: graph building, scheduling, gcc (or the disk cache), the run. Run at DEBUG=1, the
`realize:` lines printed during that call give the phase split (plan and run ms; a `realize: built plan` line's
phases are summed too). torch.compile: a fresh TORCHINDUCTOR_CACHE_DIR temp dir, then the same dir again, 2 threads
(--torch-rounds rounds, default 1); the model is compiled (training: forward and backward; AdamW runs eagerly, as
bench_mnist_step compares).
The softmax row's target is the warm first call plus 1.2 x gcc's time on a hand-written C softmax, compiled in the
same run with uopc's compiler and flags. Timings are wall clock on a shared machine: the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

MARK = "COLDSTART "  # the child's own lines start with this; everything else it prints is uopc's DEBUG output
CHILD_TIMEOUT = 1200  # s: GPT-2 small's empty-cache first call takes minutes on a busy 2-core machine


@dataclass(frozen=True)
class Row:
    """One benchmark row: a models.build name (or "softmax", also the --models name), its build arguments, and the
    targets in seconds."""

    label: str
    model: str
    full: dict = field(default_factory=dict)
    quick: dict = field(default_factory=dict)
    target: tuple[float, float] | None = None  # (empty cache, warm cache); None: the softmax row's gcc rule

    def title(self, quick: bool) -> str:
        return f"{self.label.split(',')[0]} (quick config)" if quick and self.quick else self.label


ROWS = {
    "gpt2": Row(
        "GPT-2 small forward, 1 x 128 tokens",
        "gpt2",
        quick=dict(layers=2, dim=64, heads=2, vocab=97, seq=32),
        target=(5.0, 1.0),
    ),
    "chargpt": Row(
        "char-GPT training step, batch 32", "chargpt", quick=dict(batch=4, ctx=16, layers=1), target=(3.0, 0.3)
    ),
    "resnet18": Row("ResNet-18 inference, batch 1", "resnet18", quick=dict(seq=32), target=(2.0, 0.5)),
    "cnn": Row("CNN training step, batch 128", "cnn", quick=dict(batch=16), target=(2.0, 0.3)),
    "softmax": Row("softmax 512x512", "softmax"),
}

SOFTMAX_C = """
#include <math.h>
void softmax(const float* restrict x, float* restrict out, int rows, int cols) {
  #pragma omp parallel for
  for (int r = 0; r < rows; r++) {
    const float* xr = x + (long)r * cols;
    float* o = out + (long)r * cols;
    float m = -INFINITY, s = 0.0f;
    for (int c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
    for (int c = 0; c < cols; c++) s += (o[c] = expf(xr[c] - m));
    float inv = 1.0f / s;
    for (int c = 0; c < cols; c++) o[c] *= inv;
  }
}
"""


# ---------------------------------------------------------------------------------------------------------------
# the child: one first call, in this process


def _report(**kw) -> None:
    print(MARK + json.dumps(kw), flush=True)


def child_uopc(row: Row, cfg: dict) -> None:
    t0 = time.perf_counter()
    sys.modules["torch"] = None  # a uopc process never loads torch (its import alone takes ~1.5 s)
    # imported here, not at the top: the imports are part of what the child times
    import models
    import numpy as np

    from uopc import Tensor, TinyJit
    from uopc.runtime import compiler as runtime

    t1 = time.perf_counter()
    if row.model == "softmax":
        xs = [Tensor(np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32))]
        fn = lambda x: x.softmax(-1)
    else:
        w = models.build(row.model, "uopc", **cfg)
        xs, fn = [Tensor(a) for a in w.inputs], w.call
    jit = TinyJit(lambda *a: fn(*a).realize())
    t2 = time.perf_counter()
    stats = dict(runtime.stats)
    print(MARK + "first call begins", flush=True)
    jit(*xs)
    t3 = time.perf_counter()
    print(MARK + "first call ends", flush=True)
    new = {k: v - stats[k] for k, v in runtime.stats.items() if v != stats[k]}
    _report(import_s=t1 - t0, build_s=t2 - t1, first_s=t3 - t2, stats=new)


def child_torch(row: Row, cfg: dict) -> None:
    t0 = time.perf_counter()
    import models
    import numpy as np
    import torch

    torch.set_num_threads(2)
    t1 = time.perf_counter()
    if row.model == "softmax":
        xs = [torch.from_numpy(np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32))]
        fn = torch.compile(lambda x: torch.softmax(x, -1))
    else:
        w = models.build(row.model, "torch", compile=True, **cfg)
        xs, fn = [torch.from_numpy(a) for a in w.inputs], w.call
    t2 = time.perf_counter()
    fn(*xs)
    t3 = time.perf_counter()
    _report(import_s=t1 - t0, build_s=t2 - t1, first_s=t3 - t2)


def child_gcc() -> None:
    """gcc's time on the hand-written softmax with uopc's compiler and flags (the best of 3 compiles)."""
    from uopc.runtime import compiler as runtime

    cc, flags = runtime._resolve_compiler(), runtime.cflags()
    with tempfile.TemporaryDirectory() as d:
        src, so = os.path.join(d, "softmax.c"), os.path.join(d, "softmax.so")
        with open(src, "w") as f:
            f.write(SOFTMAX_C)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            subprocess.run([cc, *flags, "-shared", "-fPIC", "-o", so, src, "-lm"], check=True)
            times.append(time.perf_counter() - t)
    _report(gcc_s=min(times), cmd=" ".join([os.path.basename(cc), *flags, "-shared", "-fPIC"]))


# ---------------------------------------------------------------------------------------------------------------
# the parent: fresh processes, the phase split, the table


@dataclass
class Run:
    """What one child process measured (None where it failed)."""

    total_s: float
    result: dict | None
    realize_lines: list[str]
    error: str = ""

    @property
    def first_s(self) -> float | None:
        return self.result["first_s"] if self.result else None


def run_child(args: list[str], env: dict[str, str]) -> Run:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", *args]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return Run(time.perf_counter() - t, None, [], f"timed out after {CHILD_TIMEOUT} s")
    total = time.perf_counter() - t
    result, lines, inside = None, [], False
    for line in p.stdout.splitlines():
        if line.startswith(MARK + "first call"):
            inside = line.endswith("begins")
        elif line.startswith(MARK):
            result = json.loads(line[len(MARK) :])
        elif inside and line.startswith("realize:"):
            lines.append(line)
    err = "" if p.returncode == 0 and result else (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    return Run(total, result, lines, err)


_PHASE = re.compile(r"([a-z][a-z_ ]*?) (\d+(?:\.\d+)?) ms")
_KERNELS = re.compile(r"realize: (\d+) kernels")


def phase_split(lines: list[str]) -> str:
    """The `realize:` lines summed: realizes, kernels, and every "<phase> <x> ms" they name (plan: finding or building
    it, run, and the phases of `realize: built plan` lines when present), in the order they first appear."""
    sums: dict[str, float] = {}
    realizes = kernels = 0
    for line in lines:
        if m := _KERNELS.match(line):
            realizes, kernels = realizes + 1, kernels + int(m.group(1))
        for name, ms in _PHASE.findall(line.split(":", 1)[1]):
            key = name.strip()
            sums[key] = sums.get(key, 0.0) + float(ms)
    parts = ", ".join(f"{k} {v:.0f} ms" for k, v in sums.items())
    return f"{realizes} realizes, {kernels} kernels" + (f"; {parts}" if parts else "")


def describe(side: str, run: Run) -> str:
    if run.result is None:
        return f"  {side:20s} failed: {run.error}"
    r = run.result
    stats = ", ".join(f"{k} {v}" for k, v in r.get("stats", {}).items())
    line = (
        f"  {side:20s} first call {r['first_s']:7.3f} s   (import {r['import_s']:.2f} s, build {r['build_s']:.2f} s, "
        f"process {run.total_s:.2f} s)"
    )
    if side.startswith("uopc"):
        line += f"\n  {'':20s}   {phase_split(run.realize_lines)}" + (f"; {stats}" if stats else "")
    return line


def measure(row: Row, args, scratch: str) -> dict[str, list[Run] | float]:
    """Both caches for uopc (and torch.compile), each a fresh process, in rounds (a round: an empty cache of its
    own, then a warm process on it); for softmax also gcc's time."""
    extra = ["--quick"] if args.quick else []
    base = {k: v for k, v in os.environ.items() if k != "DEBUG"}
    cells: dict[str, list[Run] | float] = {}
    for k in range(args.rounds):
        ucache = tempfile.mkdtemp(prefix="uopc-", dir=scratch)
        for state in ("empty", "warm"):
            env = dict(base, UOPC_CACHE=ucache, DEBUG="1")
            run = run_child([row.model, "--framework", "uopc", *extra], env)
            cells.setdefault(f"uopc {state}", []).append(run)
            print(describe(f"uopc {state}" + (f" #{k + 1}" if args.rounds > 1 else ""), run), flush=True)
    if row.model == "softmax":
        gcc = run_child(["gcc"], dict(base, UOPC_CACHE=ucache))
        if gcc.result:
            cells["gcc"] = gcc.result["gcc_s"]
            print(f"  {'gcc hand-written':20s} {gcc.result['gcc_s']:.3f} s   ({gcc.result['cmd']})", flush=True)
        else:
            print(f"  gcc hand-written     failed: {gcc.error}", flush=True)
    if not args.no_torch:
        for k in range(args.torch_rounds):
            tcache = tempfile.mkdtemp(prefix="inductor-", dir=scratch)
            for state in ("empty", "warm"):
                env = dict(base, TORCHINDUCTOR_CACHE_DIR=tcache)
                run = run_child([row.model, "--framework", "torch", *extra], env)
                cells.setdefault(f"torch.compile {state}", []).append(run)
                side = f"torch.compile {state}" + (f" #{k + 1}" if args.torch_rounds > 1 else "")
                print(describe(side, run), flush=True)
    return cells


def _s(x: float) -> str:
    """Seconds, to the millisecond below one second (the softmax row is decided by a few ms)."""
    return f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def median_first(runs: list[Run] | None) -> float | None:
    """The median first call of the runs that succeeded (the upper one of an even count), or None."""
    ok = sorted(r.first_s for r in runs or () if r.first_s is not None)
    return ok[len(ok) // 2] if ok else None


def _cell(cells: dict, key: str, target: float | None = None) -> str:
    runs = cells.get(key)
    if runs is None:
        return "-"
    med = median_first(runs)
    if med is None:
        return "failed"
    mark = " (over)" if target is not None and med > target else ""
    ok = sorted(r.first_s for r in runs if r.first_s is not None)
    spread = f" ({_s(ok[0])}-{_s(ok[-1])})" if len(ok) > 1 else ""
    failed = f", {len(runs) - len(ok)} failed" if len(ok) < len(runs) else ""
    return f"{_s(med)} s{spread}{failed}{mark}"


def table(results: dict[str, dict], quick: bool) -> None:
    cols = ["uopc empty", "uopc warm", "torch.compile empty", "torch.compile warm"]
    head = ["first call of", *cols, "target empty/warm"]
    body = []
    for name, cells in results.items():
        row = ROWS[name]
        if row.target is not None:
            t_empty, t_warm = (None, None) if quick else row.target
            target = f"<= {row.target[0]:g} s / <= {row.target[1]:g} s"
        else:  # softmax: the warm first call plus 1.2 x gcc on the hand-written kernel
            warm, gcc = median_first(cells["uopc warm"]), cells.get("gcc")
            t_empty = warm + 1.2 * gcc if warm is not None and gcc is not None else None
            t_warm = None
            target = f"<= {t_empty:.3f} s (warm + 1.2 x gcc {gcc:.3f} s)" if t_empty is not None else "-"
        targets = {"uopc empty": t_empty, "uopc warm": t_warm}
        body.append([row.title(quick), *[_cell(cells, c, targets.get(c)) for c in cols], target])
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths], *body]:
        print(" | ".join(s.ljust(w) for s, w in zip(r, widths)).rstrip())
    if quick:
        print("(--quick: small configs; the targets are for the full models and are not checked)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ROWS), help=f"comma-separated subset of {','.join(ROWS)}")
    ap.add_argument("--no-torch", action="store_true", help="skip torch.compile")
    ap.add_argument("--quick", action="store_true", help="small configs, for trying the benchmark out")
    ap.add_argument("--rounds", type=int, default=3, help="uopc's rounds (empty, then warm); the table: medians")
    ap.add_argument("--torch-rounds", type=int, default=1, help="torch.compile's rounds (each empty one: ~15 s)")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: run one cell in this process
    ap.add_argument("--framework", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "gcc":
        return child_gcc()
    if args.child:
        row = ROWS[args.child]
        cfg = row.quick if args.quick else row.full
        return (child_uopc if args.framework == "uopc" else child_torch)(row, cfg)

    names = [n.strip() for n in args.models.split(",") if n.strip()]
    if unknown := [n for n in names if n not in ROWS]:
        ap.error(f"unknown models {unknown}; choose from {','.join(ROWS)}")
    load = os.getloadavg()[0]
    print(
        f"first calls in fresh processes; load average {load:.2f} on {os.cpu_count()} CPUs" + (" (quick)" * args.quick)
    )
    results = {}
    for name in names:
        print(f"{ROWS[name].title(args.quick)}:", flush=True)
        with tempfile.TemporaryDirectory(prefix="coldstart-") as scratch:  # both caches go when the row is done
            results[name] = measure(ROWS[name], args, scratch)
    print()
    if args.rounds > 1 or args.torch_rounds > 1:
        print(f"medians (and ranges) of {args.rounds} rounds for uopc, {args.torch_rounds} for torch.compile")
    table(results, args.quick)


if __name__ == "__main__":
    main()

"""`uopc profile SCRIPT [args]`: run a script and account for every kernel it ran against the machine's roofline.

Each kernel run is timed (uopc.engine.realize's kernel hook) and grouped by kernel (name and code). The table shows
calls,
total and mean time, achieved GFLOP/s and GB/s (the bytes the kernel must move: each buffer once), arithmetic
intensity (FLOP per byte), and the percentage of the roofline bound min(peak FLOP/s, intensity x bandwidth) it
reached, using the FMA peak and stream bandwidth that `uopc bench` probes (cached).
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from uopc import helpers
from uopc.engine import realize
from uopc.schedule import Kernel
from uopc.tools import harness, roofline

__all__ = ["KernelStats", "profile_script", "format_table"]


@dataclass
class KernelStats:
    name: str
    op: str
    flops: int  # per call
    nbytes: int  # per call
    calls: int = 0
    total_s: float = 0.0

    @property
    def gflops(self) -> float:
        return self.flops * self.calls / max(self.total_s, 1e-12) / 1e9

    @property
    def gbs(self) -> float:
        return self.nbytes * self.calls / max(self.total_s, 1e-12) / 1e9

    @property
    def intensity(self) -> float:
        return self.flops / self.nbytes if self.nbytes else 0.0

    def pct_of_roof(self, peak_gflops: float, bw_gbs: float) -> float:
        """Achieved / attainable at this intensity; a kernel with no FLOPs is measured against bandwidth alone."""
        if self.flops == 0:
            return 100 * self.gbs / bw_gbs
        return 100 * self.gflops / min(peak_gflops, self.intensity * bw_gbs)


def profile_script(
    script: str, args: list[str], phases: dict[str, float] | None = None
) -> tuple[list[KernelStats], BaseException | None]:
    """Run `script` as __main__ with `args` and collect per-kernel stats. Returns them and the script's error.
    `phases`, if given, receives the seconds of each compile phase (uopc.helpers.phase) and the script's wall time."""
    if not os.path.isfile(script):
        raise FileNotFoundError(f"uopc profile: no such script: {script}")
    stats: dict[tuple[str, object], KernelStats] = {}

    def hook(k: Kernel, dt: float) -> None:
        s = stats.get((k.name, k.ast))
        if s is None:
            s = stats[(k.name, k.ast)] = KernelStats(k.name, k.op, k.flops, k.nbytes)
        s.calls += 1
        s.total_s += dt

    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    prev = realize.set_kernel_hook(hook)
    err: BaseException | None = None
    before, t0 = helpers.phase_totals(), time.perf_counter()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        err = e if e.code not in (None, 0) else None
    except Exception as e:  # report what ran before the failure, then re-raise in the caller
        err = e
    finally:
        if phases is not None:
            phases.update(realize.phase_split(before, helpers.phase_totals()))
            phases["wall"] = time.perf_counter() - t0
        realize.set_kernel_hook(prev)
        sys.argv, sys.path[:] = old_argv, old_path
    out = sorted(stats.values(), key=lambda s: -s.total_s)
    seen: dict[str, int] = {}
    for s in out:  # the same name in two plans can be two different kernels: number the later ones
        seen[s.name] = seen.get(s.name, 0) + 1
        if seen[s.name] > 1:
            s.name = f"{s.name}#{seen[s.name]}"
    return out, err


def format_table(stats: list[KernelStats], m: dict, top: int = 0) -> str:
    """The profile table, sorted by total time; `top` > 0 keeps the first `top` rows."""
    peak, bw = m["peak_gflops"], m["bandwidth_gbs"]
    total = sum(s.total_s for s in stats)
    rows = stats[:top] if top > 0 else stats
    lines = [
        f"{len(stats)} kernels, {sum(s.calls for s in stats)} runs, {total * 1e3:.1f} ms in kernels; "
        f"roofline: {peak:.1f} GFLOP/s peak, {bw:.1f} GB/s, ridge at {peak / bw:.1f} FLOP/byte",
        f"{'kernel':24s} {'calls':>6s} {'total ms':>9s} {'mean us':>9s} {'GFLOP/s':>8s} {'GB/s':>7s} "
        f"{'FLOP/B':>7s} {'%roof':>6s} {'%time':>6s}  op",
    ]
    for s in rows:
        lines.append(
            f"{s.name:24s} {s.calls:6d} {s.total_s * 1e3:9.2f} {s.total_s / s.calls * 1e6:9.1f} {s.gflops:8.2f} "
            f"{s.gbs:7.2f} {s.intensity:7.2f} {s.pct_of_roof(peak, bw):6.1f} {100 * s.total_s / total:6.1f}  {s.op}"
        )
    if len(rows) < len(stats):
        lines.append(
            f"... {len(stats) - len(rows)} more kernels ({sum(s.total_s for s in stats[len(rows) :]) * 1e3:.1f} ms)"
        )
    return "\n".join(lines)


def format_phases(phases: dict[str, float], kernel_s: float) -> str:
    """Where the script's wall time went outside kernels, phase by phase (the rest is graph building and Python)."""
    wall = phases["wall"]
    named = {k: phases[k] for k in realize.PHASES if k in phases}
    rest = wall - kernel_s - sum(named.values())
    rows = [("kernels", kernel_s), *named.items(), ("graph building and other Python", rest)]
    lines = [f"where {wall:.2f} s went (wall time of the script):"]
    lines += [f"  {k:32s} {v * 1e3:10.1f} ms  {100 * v / max(wall, 1e-12):5.1f}%" for k, v in rows]
    return "\n".join(lines)


def run(
    script: str, args: list[str], png: str | None, top: int, out: TextIO = sys.stdout, compile_split: bool = False
) -> int:
    """The `uopc profile` command: run, print the machine and the table, draw the roofline if asked."""
    if png and importlib.util.find_spec("matplotlib") is None:  # say so before a long script runs, not after
        print(
            "uopc profile: --png needs matplotlib: pip install 'uopc[plot]' (or pip install matplotlib)",
            file=sys.stderr,
        )
        return 2
    m = harness.machine()
    phases: dict[str, float] = {}
    stats, err = profile_script(script, args, phases)
    print("\n" + harness.format_machine(m), file=out)
    if compile_split:
        print(format_phases(phases, sum(s.total_s for s in stats)), file=out)
    if not stats:
        print("uopc profile: the script ran no uopc kernels", file=out)
    else:
        print(format_table(stats, m, top), file=out)
    if png and stats:
        roofline.draw(stats, m, png)
        print(f"roofline written to {png}", file=out)
    if err is not None:
        if isinstance(err, SystemExit):
            return int(err.code) if isinstance(err.code, int) else 1
        raise err
    return 0

"""The roofline picture of `uopc profile --png`: this machine's roof and one labelled point per kernel, log-log.

Needs matplotlib (the `plot` extra: pip install 'uopc[plot]'); without it `draw` raises an ImportError that says
how to install it. matplotlib is imported only when a picture is drawn: it is optional and slow to import.
"""

from __future__ import annotations

import io

import numpy as np

from uopc.helpers import atomic_write

__all__ = ["draw"]


def draw(stats: list, m: dict, path: str, title: str = "") -> None:
    """Write a PNG: roof min(peak, I x bandwidth) and each kernel at (intensity, achieved GFLOP/s)."""
    try:
        import matplotlib  # optional dependency, see the module docstring

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(
            "uopc: drawing a roofline needs matplotlib: pip install 'uopc[plot]' (or pip install matplotlib)"
        ) from e
    peak, bw = m["peak_gflops"], m["bandwidth_gbs"]
    drawn = [s for s in stats if s.flops > 0 and s.nbytes > 0]
    xs = np.array([s.intensity for s in drawn]) if drawn else np.array([1.0])
    ys = np.array([s.gflops for s in drawn]) if drawn else np.array([1.0])
    lo = min(xs.min(), peak / bw) / 4
    hi = max(xs.max(), peak / bw) * 4
    grid = np.geomspace(lo, hi, 200)
    fig, ax = plt.subplots(figsize=(10, 6.5), dpi=110)
    ax.loglog(grid, np.minimum(peak, grid * bw), color="black", lw=2, label="roofline")
    ax.axvline(peak / bw, color="grey", ls=":", lw=1)
    ax.text(lo * 1.1, peak * 1.08, f"FMA peak {peak:.0f} GFLOP/s", fontsize=9)
    ax.text(lo * 1.1, lo * bw * 1.4, f"{bw:.1f} GB/s", fontsize=9, rotation=30)
    total = sum(s.total_s for s in stats) or 1.0
    sizes = 30 + 400 * np.array([s.total_s / total for s in drawn])
    sc = ax.scatter(
        xs,
        ys,
        s=sizes,
        c=[s.pct_of_roof(peak, bw) for s in drawn],
        cmap="viridis",
        vmin=0,
        vmax=100,
        edgecolors="black",
        zorder=3,
    )
    # points carry their rank in the profile table (by total time); the key beside the plot names each one, so
    # dozens of kernels stay readable where full labels would pile on top of each other
    rank = {id(s): i + 1 for i, s in enumerate(stats)}
    for s, x, y in zip(drawn, xs, ys, strict=True):
        ax.annotate(str(rank[id(s)]), (x, y), textcoords="offset points", xytext=(5, 3), fontsize=7)
    key = [f"{rank[id(s)]:>2} {s.name} {s.op[:28]} ({100 * s.total_s / total:.0f}%)" for s in drawn]
    ax.text(1.24, 1.0, "\n".join(key), transform=ax.transAxes, va="top", ha="left", fontsize=6.5, family="monospace")
    fig.colorbar(sc, ax=ax, label="% of the roofline bound")
    skipped = len(stats) - len(drawn)
    note = f"; {skipped} kernel(s) with no FLOPs (copies) not drawn" if skipped else ""
    threads = f"{m['threads']} thread{'s' if m['threads'] != 1 else ''}"
    default = f"uopc kernels on {m['model']} ({threads}); point area ~ share of time{note}"
    ax.set_title(title or default, fontsize=9)
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_ylim(min(ys.min(), lo * bw) / 2, peak * 2)
    ax.grid(True, which="both", ls=":", lw=0.5)
    ax.legend(loc="lower right")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    atomic_write(path, buf.getvalue())

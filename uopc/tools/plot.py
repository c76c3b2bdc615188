"""Small helpers the examples share: a loss-curve PNG (when matplotlib is installed) and a progress line with ETA.

A progress library (tqdm, rich) was considered and not taken: the examples need one carriage-return line with their
own fields (loss, steps/s, samples/s), which `progress` gives in a few lines without a new dependency.
"""

from __future__ import annotations

import io
import sys

from uopc.helpers import atomic_write

__all__ = ["progress", "save_loss_curve"]


def _eta(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def progress(step: int, total: int, rate: float, extra: str = "", width: int = 30) -> str:
    """`[#####     ] step 40/100  12.5 steps/s  ETA 0:04  <extra>`: the ETA is the remaining steps at `rate`."""
    bar = "#" * int(width * step / max(1, total))
    eta = _eta((total - step) / rate) if rate > 0 else "?"
    return f"[{bar:<{width}}] step {step}/{total}  {rate:6.1f} steps/s  ETA {eta}  {extra}".rstrip()


def save_loss_curve(path: str, steps: list[int], losses: list[float], title: str = "training loss") -> bool:
    """Write a PNG of loss against step. Without matplotlib, print how to install it and return False."""
    try:
        import matplotlib  # optional dependency (the `plot` extra): imported only when a plot is asked for

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("uopc: --plot needs matplotlib: pip install 'uopc[plot]' (or pip install matplotlib)", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, losses, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(True, ls=":", lw=0.5)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    atomic_write(path, buf.getvalue())
    return True

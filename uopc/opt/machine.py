"""Facts about this machine that the optimizer's choices depend on, read from the machine (never assumed)."""

from __future__ import annotations

import os
from functools import cache


@cache
def l2_bytes() -> int:
    """Per-core L2 size from sysfs (1 MiB if the machine does not say)."""
    for i in range(8):
        base = f"/sys/devices/system/cpu/cpu0/cache/index{i}"
        try:
            with open(f"{base}/level") as f:
                if f.read().strip() != "2":
                    continue
            with open(f"{base}/size") as f:
                txt = f.read().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20}.get(txt[-1], 1)
            return int(txt.rstrip("KM")) * mult
        except (OSError, ValueError):
            continue
    return 1 << 20


@cache
def num_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

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


@cache
def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of this CPU (from /proc/cpuinfo; empty where the machine does not say)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@cache
def vector_bytes() -> int:
    """Bytes in one SIMD register gcc -march=native uses: 64 with AVX-512, 32 with AVX2, else 16."""
    flags = cpu_flags()
    return 64 if "avx512f" in flags else 32 if "avx2" in flags else 16


@cache
def vector_registers() -> int:
    """How many SIMD registers: 32 zmm with AVX-512, 16 ymm/xmm otherwise."""
    return 32 if "avx512f" in cpu_flags() else 16

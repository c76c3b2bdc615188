"""Small utilities and every setting uopc reads from the environment (read once, here).

Settings (all optional):
  DEBUG             0..4: realize/kernel timing lines, then the C of each new kernel
  OPT               0 none, 1 hand heuristic (default), 2 autotune search
  UOPC_CACHE        directory of compiled kernels (default: $XDG_CACHE_HOME/uopc or ~/.cache/uopc)
  CC                C compiler (default: gcc)
  CFLAGS            compiler flags, replacing the defaults in uopc.runtime
  UOPC_NUM_THREADS  OpenMP threads (default: OMP_NUM_THREADS, else all cores)
  UOPC_CHECK_OOB    1: generated code checks every load/store index against its buffer
  UOPC_PLAN_CACHE   how many plans the in-memory structural cache keeps (default 1024)
"""

from __future__ import annotations

import contextlib
import functools
import operator
import os
import sys
from collections.abc import Iterable
from typing import Any


def getenv(key: str, default: Any = 0) -> Any:
    """An environment variable converted to the type of `default`."""
    val = os.environ.get(key)
    if val is None or val == "":
        return default
    return type(default)(val)


DEBUG: int = getenv("DEBUG", 0)
OPT: int = getenv("OPT", 1)
CC: str = getenv("CC", "gcc")
CFLAGS_ENV: str | None = os.environ.get("CFLAGS") or None
CHECK_OOB: int = getenv("UOPC_CHECK_OOB", 0)
PLAN_CACHE_SIZE: int = getenv("UOPC_PLAN_CACHE", 1024)
NUM_THREADS_ENV: int = getenv("UOPC_NUM_THREADS", 0) or getenv("OMP_NUM_THREADS", 0)


def cache_dir() -> str:
    """The compiled-kernel cache directory (UOPC_CACHE, else the user's cache home)."""
    if os.environ.get("UOPC_CACHE"):
        return os.path.abspath(os.environ["UOPC_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "uopc")


@contextlib.contextmanager
def deep_recursion(limit: int = 20000):
    """Let the recursive lowering and rendering walk long chains (a 400-op elementwise chain is ~1200 frames)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def prod(xs: Iterable[int]) -> int:
    """Product of a sequence of ints (1 for an empty one)."""
    return functools.reduce(operator.mul, xs, 1)


def argsort(xs: list) -> list[int]:
    return sorted(range(len(xs)), key=xs.__getitem__)

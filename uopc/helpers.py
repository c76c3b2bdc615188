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
  UOPC_POOL_MB      MiB of freed storage the allocation pool keeps for reuse (default 2048)
  UOPC_CACHE_MAX_MB size cap of the compiled kernels on disk; least recently used go first (default 512, 0: no cap)
"""

from __future__ import annotations

import contextlib
import functools
import operator
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any


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
POOL_MB: int = getenv("UOPC_POOL_MB", 2048)
CACHE_MAX_MB: int = getenv("UOPC_CACHE_MAX_MB", 512)
NUM_THREADS_ENV: int = getenv("UOPC_NUM_THREADS", 0) or getenv("OMP_NUM_THREADS", 0)


# the settings Context may change at run time, by the name users know them by (the environment variable)
_CONTEXT_VARS = {
    "DEBUG": "DEBUG",
    "OPT": "OPT",
    "CHECK_OOB": "CHECK_OOB",
    "PLAN_CACHE": "PLAN_CACHE_SIZE",
    "CC": "CC",
    "POOL_MB": "POOL_MB",
    "CACHE_MAX_MB": "CACHE_MAX_MB",
}


@contextlib.contextmanager
def Context(**settings: Any) -> Iterator[None]:
    """Change settings for the duration of a `with` block, then restore them: the one way code changes a setting.

        with Context(OPT=0, DEBUG=2):
            x.realize()

    Every setting that changes generated code is part of the plan and compile-cache keys, so a plan built under
    one value is never reused under another.
    """
    unknown = set(settings) - set(_CONTEXT_VARS)
    if unknown:
        raise ValueError(f"Context: unknown setting(s) {sorted(unknown)}; known: {sorted(_CONTEXT_VARS)}")
    mod = sys.modules[__name__]
    old = {k: getattr(mod, _CONTEXT_VARS[k]) for k in settings}
    try:
        for k, v in settings.items():
            setattr(mod, _CONTEXT_VARS[k], type(old[k])(v))
        yield
    finally:
        for k, v in old.items():
            setattr(mod, _CONTEXT_VARS[k], v)


def atomic_write(path: str, data: bytes | Callable[[IO[bytes]], Any], mode: int | None = None) -> None:
    """Write `path` through a temp file in the same directory and a rename: readers never see half a file.

    `data` is the bytes to write, or a function that writes to the open binary file. On any error the temp file is
    removed and the old file (if any) is left as it was. `mode` sets the permission bits before the rename.
    """
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def cache_dir() -> str:
    """The compiled-kernel cache directory (UOPC_CACHE, else the user's cache home)."""
    if os.environ.get("UOPC_CACHE"):
        return os.path.abspath(os.environ["UOPC_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "uopc")


_recursion_lock = threading.Lock()
_recursion_users = [0, 0]  # threads inside deep_recursion, the limit to restore when the last one leaves


@contextlib.contextmanager
def deep_recursion(limit: int = 20000):
    """Let the recursive lowering and rendering walk long chains (a 400-op elementwise chain is ~1200 frames).

    The limit is process-wide: with several threads compiling, only the last one out restores it (restoring on
    each exit would lower it under a thread still deep in a walk).
    """
    with _recursion_lock:
        if _recursion_users[0] == 0:
            _recursion_users[1] = sys.getrecursionlimit()
        _recursion_users[0] += 1
        sys.setrecursionlimit(max(sys.getrecursionlimit(), limit))
    try:
        yield
    finally:
        with _recursion_lock:
            _recursion_users[0] -= 1
            if _recursion_users[0] == 0:
                sys.setrecursionlimit(_recursion_users[1])


def prod(xs: Iterable[int]) -> int:
    """Product of a sequence of ints (1 for an empty one)."""
    return functools.reduce(operator.mul, xs, 1)


def argsort(xs: list) -> list[int]:
    return sorted(range(len(xs)), key=xs.__getitem__)

"""Small utilities and every setting uopc reads from the environment (read once, here, into `Settings`).

Settings (all optional):
  DEBUG             0..4: realize/kernel timing lines, then the C of each new kernel
  OPT               0 none, 1 hand heuristic (default), 2 autotune search
  UOPC_CACHE        directory of compiled kernels (default: $XDG_CACHE_HOME/uopc or ~/.cache/uopc)
  CC                C compiler (default: gcc)
  CFLAGS            compiler flags, replacing the defaults in uopc.runtime.compiler
  UOPC_NUM_THREADS  OpenMP threads (default: OMP_NUM_THREADS, else all cores)
  UOPC_CHECK_OOB    1: generated code checks every load/store index against its buffer
  UOPC_PLAN_CACHE   how many plans the in-memory structural cache keeps (default 1024)
  UOPC_POOL_MB      MiB of freed storage the allocation pool keeps for reuse (default 2048)
  UOPC_CACHE_MAX_MB size cap of the compiled kernels on disk; least recently used go first, checked each time a 32nd
                    of it was written (default 512, 0: no cap)
  UOPC_WINOGRAD     3x3 stride-1 convs by Winograd: 0 never, 1 by the cost rule (default), 2/4 F(2,3)/F(4,3) always
  UOPC_FOLD_BN      1: fold a factor per output channel of a convolution (BatchNorm in eval mode) into its weight
                    (uopc.schedule.fold; default 0)
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import operator
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any


def getenv(key: str, default: Any = 0) -> Any:
    """An environment variable converted to the type of `default`."""
    val = os.environ.get(key)
    if val is None or val == "":
        return default
    return type(default)(val)


NUM_THREADS_ENV: int = getenv("UOPC_NUM_THREADS", 0) or getenv("OMP_NUM_THREADS", 0)


# Bytes of mapped memory before and after every storage uopc allocates (uopc.runtime.buffer). A plan's kernels read
# a padded input unclamped where its index strays at most this far outside the buffer (uopc.renderer.c.gated_load):
# the value read there is never used, and the loads stay contiguous, so gcc vectorizes them.
STORAGE_GUARD = 4096


@dataclass(frozen=True)
class Settings:
    """Every setting a realize reads, as one frozen snapshot (named as `Context` takes them).

    `code_key()` is the part that changes generated code or a plan's kernels: the plan cache keys on it, so a plan
    built with index checks is never replayed without them (and the compiled plan records what it was built with)."""

    DEBUG: int = 0
    OPT: int = 1
    CC: str = "gcc"
    CFLAGS: tuple[str, ...] | None = None  # None: uopc.runtime.compiler's defaults
    CHECK_OOB: int = 0
    PLAN_CACHE: int = 1024
    POOL_MB: int = 2048
    CACHE_MAX_MB: int = 512
    WINOGRAD: int = 1
    FOLD_BN: int = 0

    def code_key(self) -> tuple:
        return (self.CHECK_OOB, self.CC, self.CFLAGS, self.FOLD_BN)


def _cflags_env() -> tuple[str, ...] | None:
    return tuple(os.environ["CFLAGS"].split()) if os.environ.get("CFLAGS") else None


_ENV_SETTINGS = Settings(
    DEBUG=getenv("DEBUG", 0),
    OPT=getenv("OPT", 1),
    CC=getenv("CC", "gcc"),
    CFLAGS=_cflags_env(),
    CHECK_OOB=getenv("UOPC_CHECK_OOB", 0),
    PLAN_CACHE=getenv("UOPC_PLAN_CACHE", 1024),
    POOL_MB=getenv("UOPC_POOL_MB", 2048),
    CACHE_MAX_MB=getenv("UOPC_CACHE_MAX_MB", 512),
    WINOGRAD=getenv("UOPC_WINOGRAD", 1),
    FOLD_BN=getenv("UOPC_FOLD_BN", 0),
)
# a context variable, not a module global: a `Context` in one thread (or asyncio task) changes nothing in another,
# and a new thread starts from the environment's values
_settings: contextvars.ContextVar[Settings] = contextvars.ContextVar("uopc_settings", default=_ENV_SETTINGS)


def settings() -> Settings:
    """The settings in force in this thread: read it once and pass the snapshot on."""
    return _settings.get()


@contextlib.contextmanager
def Context(**changes: Any) -> Iterator[Settings]:
    """Change settings for the duration of a `with` block in this thread, then restore them: the one way code
    changes a setting.

        with Context(OPT=0, DEBUG=2):
            x.realize()

    Every setting that changes generated code is part of the plan and compile-cache keys, so a plan built under
    one value is never reused under another. CFLAGS takes a string (split on white space) or a list.
    """
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    unknown = set(changes) - set(fields)
    if unknown:
        raise ValueError(f"Context: unknown setting(s) {sorted(unknown)}; known: {sorted(fields)}")
    old = settings()
    new: dict[str, Any] = {}
    for k, v in changes.items():
        if k == "CFLAGS":
            new[k] = None if v is None else tuple(v.split() if isinstance(v, str) else v)
        else:
            new[k] = type(getattr(old, k))(v)
    token = _settings.set(dataclasses.replace(old, **new))
    try:
        yield settings()
    finally:
        _settings.reset(token)


class _Phases(threading.local):
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}


_phases = _Phases()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Add the block's wall time to this thread's total for `name`: where a first call spends its time (autodiff,
    schedule, layout, lower, render, gcc, load). Phases nest: schedule includes layout and lower."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _phases.seconds[name] = _phases.seconds.get(name, 0.0) + time.perf_counter() - t0


def phase_totals() -> dict[str, float]:
    """This thread's seconds per phase so far (take two and subtract to time a stretch of work)."""
    return dict(_phases.seconds)


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


def in_forked_child(fn: Callable[[], None]) -> None:
    """Run `fn` in the child after every fork(): each module makes its locks anew there, since one that another
    thread held at fork time would stay held in the child forever."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=fn)


in_forked_child(lambda: globals().__setitem__("_recursion_lock", threading.Lock()))


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

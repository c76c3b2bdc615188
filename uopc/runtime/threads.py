"""OpenMP threads for kernels: the count every plan runs with, set per OS thread before a call, and the fork rule.

libgomp's thread-count setting is per OS thread, so `ensure_threads()` gives the calling thread the target count
before a plan runs. GNU libgomp's pool does not survive fork: a child of a process that ran parallel regions runs
its kernels single-threaded (and warns once) instead of hanging.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import warnings
from typing import Any

import numpy as np

from uopc import helpers
from uopc.machine import available_cpus

__all__ = ["ensure_threads", "get_num_threads", "set_num_threads"]


class _ThreadState(threading.local):
    applied = 0  # thread count last given to omp_set_num_threads on this OS thread; 0 = never


_tls = _ThreadState()
# default: one thread per CPU this process may run on (its affinity mask), as Machine.cores counts them
_wanted: int = max(1, helpers.NUM_THREADS_ENV or available_cpus())
_target: int = _wanted  # what kernels run with: _wanted, or 1 in a forked child (see _after_fork_in_child)
_ran_parallel = False  # this process may have started libgomp's thread pool
_forked_unsafe = False
_fork_warned = False
_gomp: Any = None
_gomp_loaded = False


def _open_gomp(name: str) -> Any:
    try:
        gomp = ctypes.CDLL(name)
        gomp.omp_set_num_threads.argtypes = [ctypes.c_int]
        gomp.omp_set_num_threads.restype = None
        return gomp
    except (OSError, AttributeError):
        return None


def _libgomp() -> Any:
    """libgomp, loaded once (None when unavailable, e.g. a compiler with another OpenMP runtime)."""
    global _gomp, _gomp_loaded
    if not _gomp_loaded:
        _gomp = _open_gomp("libgomp.so.1")
        # find_library runs `ldconfig -p` (2-5 ms of every process's first call): only where the soname fails
        if _gomp is None and (found := ctypes.util.find_library("gomp")):
            _gomp = _open_gomp(found)
        _gomp_loaded = True
    return _gomp


def _warn_forked() -> None:
    global _fork_warned
    if not _fork_warned:
        _fork_warned = True
        warnings.warn(
            "uopc: running OpenMP kernels single-threaded in a forked child (GNU libgomp's thread pool "
            "does not survive fork); use the 'spawn' or 'forkserver' start method to keep all threads",
            RuntimeWarning,
            stacklevel=3,
        )


def _apply_threads() -> None:
    """Give the current OS thread's OpenMP ICV the target count (it is per thread, so each thread needs it)."""
    global _ran_parallel
    n = _target
    if _forked_unsafe and _wanted > 1:
        _warn_forked()
    gomp = _libgomp()
    if gomp is not None:
        gomp.omp_set_num_threads(n)
    if n > 1:
        _ran_parallel = True  # libgomp only starts its pool for regions with more than one thread
    _tls.applied = n


def ensure_threads() -> None:
    """Give the calling OS thread the target OpenMP thread count, if it does not have it yet."""
    if _tls.applied != _target:
        _apply_threads()


def set_num_threads(n: int) -> None:
    """Run later kernels with `n` OpenMP threads (forced to 1 in a forked child of a parallel parent)."""
    global _wanted, _target
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"uopc: set_num_threads needs an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"uopc: set_num_threads needs n >= 1, got {n}")
    _wanted = int(n)
    _target = 1 if _forked_unsafe else _wanted
    if _forked_unsafe and _wanted > 1:
        _warn_forked()


def get_num_threads() -> int:
    """The number of OpenMP threads kernels run with."""
    return _target


def _after_fork_in_child() -> None:
    global _target, _forked_unsafe
    if _ran_parallel:
        # The child has no pool threads but libgomp still thinks it does: a region with >1 threads would hang.
        # A single-thread region never touches the pool.
        _forked_unsafe = True
        _target = 1
        _tls.applied = 0  # so the child's first kernel goes through _apply_threads (and warns)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

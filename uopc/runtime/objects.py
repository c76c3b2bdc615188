"""Kernel objects: each kernel's translation unit compiled to an object file in the cache, `<cache>/obj/<key>.o` (with
its .json), where every plan and every model that contains the kernel finds it.

Small units compile several at a time: one gcc run over their concatenation (the renderer guards the prelude and
every helper, so units concatenate; each kernel's definition is weak, so two objects may both hold one). A run
costs 15-25 ms before it compiles anything (gcc's start and its target set-up for -march=native: an empty unit took
15 ms under uopc's flags on a Zen 4, a 755-character elementwise kernel 23), which was half of the time on a model's
many small kernels: char-GPT's 110 small units took 5.0 s one by one, 3.0 s in runs of up to BATCH_CHARS. The
object of a run is stored under the key of every unit in it (hard links of one file), and a link takes each distinct
object once.

    obj = unit_object(src, cache, key)   # where a unit's object lives
    prefetch(Unit(src, obj), cc, flags)  # compile it in the background, batched with what else is waiting
    local = gather(units, cc, flags, tmpdir, fail)   # each unit's object, compiled now where missing

Early compiles (`prefetch`) run while the engine lowers the rest of a plan, at most as many gcc processes as this
process has CPUs; the units that wait meanwhile go out together when a CPU frees up. A link (`gather`) waits for the
early compile of a unit it needs, or takes a waiting one over, and compiles whatever is still missing in balanced
batches, in parallel.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import os
import select
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import NamedTuple

from uopc.machine import available_cpus
from uopc.renderer.flags import unit_cflags
from uopc.runtime.disk_cache import entry_digest, unlink_quiet, write_entry

__all__ = ["BATCH_CHARS", "Unit", "cancel", "gather", "prefetch", "stats", "unit_object"]

# compiles: compiler runs; units: kernel units compiled (a run compiles one or more); object_hits: units a link found
# in the object cache; disk_hits, rebuilds, loads: whole plans and programs (uopc.runtime.compiler)
stats: dict[str, int] = {"compiles": 0, "units": 0, "loads": 0, "disk_hits": 0, "rebuilds": 0, "object_hits": 0}

# The most C characters one run compiles, unless a single unit is bigger: past it the run's optimization time, not
# its start, is what counts, and smaller runs keep every CPU busy.
BATCH_CHARS = 24_000


class Unit(NamedTuple):
    """One kernel's translation unit and the path of its object in the cache."""

    src: str
    obj: str


def unit_object(cache: str, key: str) -> str:
    return os.path.join(cache, "obj", f"{key}.o")


def _json(obj: str) -> str:
    return os.path.splitext(obj)[0] + ".json"


class _Run(NamedTuple):
    """One compiler run over one or more units."""

    proc: subprocess.Popen
    cmd: list[str]
    units: tuple[Unit, ...]
    c_file: str
    tmp_obj: str
    wanted: set[str]  # an early run's object paths no caller has cancelled (see cancel)


_serial = itertools.count()


def _start(units: tuple[Unit, ...], cc: str, flags: list[str], where: str) -> _Run:
    """Start gcc on the units' concatenation, writing its files into `where` (raises OSError if gcc cannot run)."""
    stem = os.path.join(where, f".batch-{os.getpid()}-{threading.get_ident()}-{next(_serial)}")
    c_file, tmp_obj = stem + ".c", stem + ".o"
    with open(c_file, "w") as f:
        f.write("\n".join(u.src for u in units))
    cmd = [cc, *flags, "-fPIC", "-pipe", "-c", "-o", tmp_obj, c_file]
    try:
        # a process group of its own, so that _kill stops cc1 and as with the driver
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, process_group=0)
    except OSError:
        unlink_quiet(c_file)
        raise
    return _Run(proc, cmd, units, c_file, tmp_obj, {u.obj for u in units})


def _finish(run: _Run) -> tuple[bytes, str]:
    """Wait for a run; if it succeeded, store its object under every unit's key. Returns (the object, "") or (b"",
    gcc's error text); the run's own files are removed either way."""
    try:
        stderr = run.proc.communicate()[1].decode(errors="replace")
        stats["compiles"] += 1
        if run.proc.returncode != 0:
            return b"", stderr or f"exit {run.proc.returncode}"
        with open(run.tmp_obj, "rb") as f:
            data = f.read()
        for i, u in enumerate(run.units):  # the first unit's file, hard links of it for the others
            write_entry(u.obj, data, 0o600, same_as=run.units[0].obj if i else None)
        stats["units"] += len(run.units)
        return data, ""
    finally:
        unlink_quiet(run.c_file)
        unlink_quiet(run.tmp_obj)


def _first_done(runs: list[_Run]) -> _Run:
    """The run that ends first (its compiler's stderr reaches end of file, or says something: then it is waited for
    as it is). Waiting on the oldest run instead left a CPU idle whenever a younger one ended first: a CNN step's
    last two runs ended 140 ms apart."""
    if len(runs) == 1:
        return runs[0]
    ready, _, _ = select.select([r.proc.stderr for r in runs], [], [])
    return next(r for r in runs if r.proc.stderr in ready)


def _kill(run: _Run) -> None:
    """Stop a run and remove its files. The whole process group: the driver's children (cc1, and as beside it
    under -pipe) outlive a killed driver, and the assembler wrote the run's object after its removal."""
    with contextlib.suppress(OSError):
        os.killpg(run.proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        run.proc.wait()
    unlink_quiet(run.c_file)
    unlink_quiet(run.tmp_obj)


# ---------------------------------------------------------------------------------------------------------------
# early compiles, in the background; everything below is guarded by _lock

_queue: dict[str, tuple[Unit, str, tuple[str, ...]]] = {}  # object path -> (unit, compiler, flags), waiting
_running: dict[str, _Run] = {}  # object path -> the run compiling it (one run may hold several)
_lock = threading.Lock()


def _runs() -> list[_Run]:
    """The early runs in progress, each once."""
    return list({id(r): r for r in _running.values()}.values())


def prefetch(unit: Unit, cc: str, flags: list[str]) -> None:
    """Compile `unit` into the object cache in the background (nothing happens if its object is there or on its
    way). The engine calls this for a big plan's kernels as it lowers them, so gcc runs on the other cores while
    Python lowers the rest. A failed run leaves nothing: the link compiles those units again and reports the error."""
    with _lock:
        if unit.obj in _queue or unit.obj in _running or entry_digest(unit.obj, _json(unit.obj)):
            return
        _queue[unit.obj] = (unit, cc, (*flags, *unit_cflags(unit.src)))
        _pump()


def _pump() -> None:
    """Finish the runs that exited, then start runs over the waiting units while CPUs are free: each takes the
    oldest waiting unit and those after it with the same compiler and flags, up to BATCH_CHARS."""
    for run in _runs():
        if run.proc.poll() is not None:
            _finish_early(run)
    width = max(1, available_cpus())
    while _queue and len(_runs()) < width:
        first, cc, flags = next(iter(_queue.values()))
        batch, chars = [], 0
        for obj, (u, c, f) in list(_queue.items()):
            if (c, f) != (cc, flags) or (batch and chars + len(u.src) > BATCH_CHARS):
                break
            batch.append(u)
            chars += len(u.src)
            del _queue[obj]
        where = os.path.dirname(first.obj)
        try:
            os.makedirs(where, mode=0o700, exist_ok=True)
            run = _start(tuple(batch), cc, list(flags), where)
        except OSError:  # the link compiles them and reports why
            continue
        for u in batch:
            _running[u.obj] = run


def _finish_early(run: _Run) -> None:
    for u in run.units:
        _running.pop(u.obj, None)
    with contextlib.suppress(OSError):
        _finish(run)  # a failure leaves no entry: the link compiles those units again


def _claim(obj: str) -> None:
    """Before a link uses `obj`: wait for the run compiling it, or take it off the queue (the link compiles it)."""
    with _lock:
        _queue.pop(obj, None)
        if (run := _running.get(obj)) is not None:
            _finish_early(run)


def cancel(objs: list[str]) -> None:
    """Drop the early compiles of these objects that no link claimed (the plan's whole object was already in the
    cache, or its build failed): waiting ones leave the queue, and a running compiler is stopped (its files
    removed) once no unit in it is wanted any more."""
    with _lock:
        for obj in objs:
            _queue.pop(obj, None)
            if (run := _running.get(obj)) is not None:
                run.wanted.discard(obj)
                if not run.wanted:
                    for u in run.units:
                        _running.pop(u.obj, None)
                    _kill(run)


@atexit.register
def _stop() -> None:
    """At exit: end the early compiles still running (their objects were never needed) and remove their files."""
    with _lock:
        _queue.clear()
        for run in _runs():
            _kill(run)
        _running.clear()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a lock held by another thread at fork time would stay locked in the child
    _queue.clear()  # the parent's early compiles are the parent's to finish
    _running.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------------------------------------------------------
# a link's objects


def _groups(units: list[Unit], n: int) -> list[tuple[Unit, ...]]:
    """`units` in runs for `n` CPUs: at least n runs (while there are units), more where they exceed BATCH_CHARS
    each, balanced by size (the biggest unit first into the smallest run)."""
    total = sum(len(u.src) for u in units)
    k = min(len(units), max(n, -(-total // BATCH_CHARS)))
    runs: list[list[Unit]] = [[] for _ in range(k)]
    sizes = [0] * k
    for u in sorted(units, key=lambda u: -len(u.src)):
        i = sizes.index(min(sizes))
        runs[i].append(u)
        sizes[i] += len(u.src)
    return [tuple(r) for r in runs if r]


def gather(
    units: list[Unit], cc: str, flags: list[str], tmpdir: str, fail: Callable[[int, list[str], str, str], Exception]
) -> list[str]:
    """The object files that hold `units`, hard-linked into `tmpdir` (so an eviction meanwhile cannot take them from
    the link), each distinct object once. Units without a valid object (after their early compile, if any, is done)
    compile now, in runs over as many CPUs as this process has. A failed run raises `fail(exit code, command,
    compiler output, source)`; OSError if the compiler cannot be run."""
    local: dict[str, str] = {}  # sha256 of an object -> its path in tmpdir
    todo = []
    for u in dict.fromkeys(units):
        _claim(u.obj)
        digest = entry_digest(u.obj, _json(u.obj))
        if digest is None:
            todo.append(u)
            continue
        if digest not in local:
            path = os.path.join(tmpdir, f"obj{len(local)}.o")
            try:
                os.link(u.obj, path)
            except OSError:  # evicted since the check
                todo.append(u)
                continue
            local[digest] = path
        stats["object_hits"] += 1
        with contextlib.suppress(OSError):
            os.utime(u.obj)  # the mtime is the entry's last use: eviction goes oldest first
    if todo:
        os.makedirs(os.path.dirname(todo[0].obj), mode=0o700, exist_ok=True)
    width = max(1, available_cpus())
    by_flags: dict[tuple[str, ...], list[Unit]] = {}  # one run compiles units of equal flags of their own only
    for u in todo:
        by_flags.setdefault(tuple(unit_cflags(u.src)), []).append(u)
    pending = [(g, [*flags, *extra]) for extra, us in by_flags.items() for g in _groups(us, width)]
    pending.sort(key=lambda p: -sum(len(u.src) for u in p[0]))  # the biggest runs first
    running, failed = [], None
    try:
        while pending or running:
            while pending and len(running) < width:
                batch, batch_flags = pending.pop(0)
                running.append(_start(batch, cc, batch_flags, tmpdir))  # OSError: gcc cannot run
            run = _first_done(running)
            running.remove(run)
            data, err = _finish(run)
            if err:
                failed = failed or fail(run.proc.returncode, run.cmd, err, "\n".join(u.src for u in run.units))
            elif (digest := hashlib.sha256(data).hexdigest()) not in local:
                local[digest] = path = os.path.join(tmpdir, f"obj{len(local)}.o")
                with open(path, "wb") as f:
                    f.write(data)
    finally:
        for run in running:
            _kill(run)
    if failed is not None:
        raise failed
    return list(local.values())

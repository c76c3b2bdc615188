"""Plans persisted across processes: a warm first call skips scheduling, the optimizer, lowering and rendering.

    plans/<digest>.plan   the Plan (kernels with their lowered ASTs, refs, temps, outputs) and its C sources

The digest is a sha256 over everything that decides a plan: the graph's structure key, the fusion rule, the optimizer
and its Machine, the settings that change generated code, the compiler's identity (path, version, every flag, the
CPU) and uopc's own version (a digest of its source files). Change any one and the entry is simply never looked up.
A plan found here still goes through the compile cache (uopc.runtime.compiler), which holds its shared object; if that
was
evicted, gcc runs on the stored C, but no Python lowering does.

The ASTs are stored as one flat node table (op, arg, dtype, source indices), rebuilt bottom-up through hash-consing:
no recursion, whatever the depth. A file that does not read back (truncated, altered, from another layout) is
deleted and the plan built anew. The folder is size-capped with the kernel cache (a quarter of UOPC_CACHE_MAX_MB,
oldest entries first, scanned as the kernel cache is: uopc.runtime.disk_cache.scan_due).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
from dataclasses import replace
from functools import cache
from typing import Any

from uopc import helpers
from uopc.helpers import atomic_write
from uopc.runtime.disk_cache import folder_lock, scan_due
from uopc.uop import Ops, UOp

__all__ = ["digest", "load", "save", "uopc_version"]

FORMAT = 1  # bump when what a file holds changes


@cache
def uopc_version() -> str:
    """A digest of uopc's source files (every .py under the package): any change to the compiler invalidates every
    stored plan."""
    return source_digest(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def source_digest(root: str) -> str:
    """A digest of the .py files under `root`, by path relative to it and content."""
    h = hashlib.sha256()
    skip = len(os.path.join(root, ""))
    for d, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(d, f)
                with open(path, "rb") as fh:  # (the path cut, not os.path.relpath: that was a third of the time)
                    h.update(path[skip:].encode() + b"\0" + fh.read() + b"\0")
    return h.hexdigest()


def digest(key: tuple, compiler: str) -> str:
    """The file name of a plan key: its structure, fusion rule, optimizer, code settings and Machine (`key`, as
    uopc.engine.realize.plan_key builds it), the compiler identity and uopc's version."""
    h = hashlib.sha256(f"uopc-plan-v{FORMAT}\0{uopc_version()}\0{compiler}\0".encode())
    h.update(repr(key).encode())
    return h.hexdigest()[:40]


def _path(name: str) -> str:
    return os.path.join(helpers.cache_dir(), "plans", f"{name}.plan")


def _flatten(asts: list[UOp]) -> tuple[list[tuple], list[int]]:
    """Every node of `asts` once, sources first: (op, arg, dtype, source indices), and the index of each root."""
    index: dict[UOp, int] = {}
    table: list[tuple] = []
    for u in UOp(Ops.SINK, tuple(asts)).toposort()[:-1]:
        index[u] = len(table)
        table.append((u.op, u.arg, u.dtype, tuple(index[s] for s in u.src)))
    return table, [index[a] for a in asts]


def _unflatten(table: list[tuple], roots: list[int]) -> list[UOp]:
    nodes: list[UOp] = []
    for op, arg, dtype, src in table:
        nodes.append(UOp(op, tuple(nodes[i] for i in src), arg, dtype))
    return [nodes[i] for i in roots]


def save(name: str, plan: Any, srcs: list[str], names: tuple[str, ...], n_in: int, check_oob: bool) -> None:
    """Store a compiled plan's parts under `name` (a digest); best effort: a full disk loses only the speed-up."""
    if plan.kernels and not srcs:  # nothing to run it with (a stub compile in a test): never store it
        return
    table, roots = _flatten([k.ast for k in plan.kernels])
    kernels = tuple(replace(k, ast=None) for k in plan.kernels)
    blob = pickle.dumps(
        {
            "format": FORMAT,
            "plan": replace(plan, kernels=kernels),
            "nodes": table,
            "roots": roots,
            "srcs": srcs,
            "names": names,
            "n_in": n_in,
            "check_oob": check_oob,
        },
        protocol=pickle.HIGHEST_PROTOCOL,
    )
    with contextlib.suppress(OSError):
        atomic_write(_path(name), blob, mode=0o600)
        _evict(os.path.dirname(_path(name)), keep=_path(name), written=len(blob))


def load(name: str) -> dict | None:
    """The stored parts of plan `name` (plan, srcs, names, n_in, check_oob), or None (missing or unreadable)."""
    path = _path(name)
    try:
        with open(path, "rb") as f:
            d = pickle.load(f)
        if d.get("format") != FORMAT or (d["plan"].kernels and not d["srcs"]):
            raise ValueError("another format, or no code")
        asts = _unflatten(d["nodes"], d["roots"])
        plan = d["plan"]
        d["plan"] = replace(plan, kernels=tuple(replace(k, ast=a) for k, a in zip(plan.kernels, asts, strict=True)))
        with contextlib.suppress(OSError):
            os.utime(path)  # last use, for eviction
        return d
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - truncated, altered or stale: build the plan anew and overwrite it
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None


def _evict(folder: str, keep: str, written: int) -> None:
    """Oldest plans first until the folder fits a quarter of UOPC_CACHE_MAX_MB (0: no cap), scanned only once a
    share of that was written since the last scan (uopc.runtime.disk_cache.scan_due: make test's 6,000 plans took
    30 ms a scan, after every plan stored)."""
    cap = helpers.settings().CACHE_MAX_MB * (1 << 20) // 4
    if cap <= 0:
        return
    with folder_lock(folder):
        if not scan_due(folder, written, cap):
            return
        entries = []
        for e in os.scandir(folder):
            if e.name.endswith(".plan"):
                with contextlib.suppress(OSError):
                    st = e.stat()
                    entries.append((st.st_mtime, e.path, st.st_size))
        total = sum(s for _, _, s in entries)
        for _, path, size in sorted(entries):
            if total <= cap:
                break
            if path != keep:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                total -= size

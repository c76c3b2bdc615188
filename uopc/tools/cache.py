"""`uopc cache info|clear|verify`: what the on-disk cache holds, emptying it, and checking it without loading code.

Layout of `helpers.cache_dir()`: `<key>.so` + `<key>.json` per compiled plan (size and sha256 of the .so), `obj/`
(each kernel's object file and its json, shared by every plan that links it), `search/` (OPT=2 search results),
`machine/` (the Machine records of uopc.machine), `plans/` (plans stored by uopc.engine.plan_store), `probes.json` (the
machine probes of `uopc bench`), `failed/` (sources of failed compiles), `datasets/` and `wheels/` (downloaded data,
kept by `clear` unless --all).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import TextIO

from uopc import helpers
from uopc.runtime.compiler import entry_ok

__all__ = ["clear", "info", "verify"]


def _kernels(cache: str) -> list[str]:
    """Keys of the kernel entries (a .so or a .json at the top level)."""
    if not os.path.isdir(cache):
        return []
    names = [n for n in os.listdir(cache) if n.endswith((".so", ".json")) and not n.startswith(".")]
    return sorted({n.rsplit(".", 1)[0] for n in names} - {"probes"})


def _tree_size(path: str) -> tuple[int, int]:
    """(files, bytes) under `path` (0, 0 if missing)."""
    n = size = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                size += os.path.getsize(os.path.join(root, f))
                n += 1
            except OSError:
                pass
    return n, size


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.2f} MB"


def info(out: TextIO = sys.stdout) -> int:
    cache = helpers.cache_dir()
    print(f"cache directory: {cache}" + ("" if os.path.isdir(cache) else " (does not exist yet)"), file=out)
    keys = _kernels(cache)
    kbytes = 0
    for k in keys:
        for ext in (".so", ".json"):
            p = os.path.join(cache, k + ext)
            kbytes += os.path.getsize(p) if os.path.exists(p) else 0
    cap = helpers.settings().CACHE_MAX_MB
    print(
        f"compiled kernels: {len(keys)} entries, {_mb(kbytes)} "
        f"(cap UOPC_CACHE_MAX_MB={cap}{'' if cap > 0 else ': no cap'}; least recently used go first)",
        file=out,
    )
    for sub, what in (
        ("obj", "per-kernel objects (linked into plans)"),
        ("search", "OPT=2 search results"),
        ("machine", "Machine records (what the compiler targets)"),
        ("plans", "stored plans (uopc.engine.plan_store)"),
        ("failed", "sources of failed compiles"),
        ("datasets", "datasets"),
        ("wheels", "downloaded wheels"),
    ):
        n, size = _tree_size(os.path.join(cache, sub))
        print(f"{what}: {n} files, {_mb(size)}  ({os.path.join(cache, sub)})", file=out)
    probes = os.path.join(cache, "probes.json")
    print(f"machine probes: {'cached' if os.path.exists(probes) else 'not measured yet'} ({probes})", file=out)
    return 0


def verify(out: TextIO = sys.stdout) -> int:
    """Check every compiled entry's size and sha256 against its json: plans' .so and the per-kernel objects in obj/
    (nothing is loaded). 1 if any is bad."""
    cache = helpers.cache_dir()
    objdir = os.path.join(cache, "obj")
    objs = sorted(f[:-2] for f in os.listdir(objdir) if f.endswith(".o")) if os.path.isdir(objdir) else []
    keys = _kernels(cache) + [os.path.join("obj", k) for k in objs]
    bad = [
        k
        for k in keys
        if not entry_ok(
            os.path.join(cache, k + (".o" if k.startswith("obj") else ".so")), os.path.join(cache, k + ".json")
        )
    ]
    for k in bad:
        print(f"BAD  {k}: missing, truncated or altered (it will be rebuilt on its next use)", file=out)
    print(f"verified {len(keys)} entries in {cache}: {len(keys) - len(bad)} ok, {len(bad)} bad", file=out)
    return 1 if bad else 0


def clear(everything: bool = False, out: TextIO = sys.stdout) -> int:
    """Delete the kernels, search results, probes and failed sources (and with `everything`, the datasets)."""
    cache = helpers.cache_dir()
    if not os.path.isdir(cache):
        print(f"nothing to clear: {cache} does not exist", file=out)
        return 0
    n = 0
    for k in _kernels(cache):
        for ext in (".so", ".json"):
            try:
                os.unlink(os.path.join(cache, k + ext))
                n += 1
            except OSError:
                pass
    for name in ("probes.json",):
        try:
            os.unlink(os.path.join(cache, name))
            n += 1
        except OSError:
            pass
    for sub in ("obj", "search", "machine", "plans", "failed", *(("datasets", "wheels") if everything else ())):
        files, _ = _tree_size(os.path.join(cache, sub))
        shutil.rmtree(os.path.join(cache, sub), ignore_errors=True)
        n += files
    kept = "" if everything else " (datasets and wheels kept; --all removes them too)"
    print(f"removed {n} files from {cache}{kept}", file=out)
    return 0

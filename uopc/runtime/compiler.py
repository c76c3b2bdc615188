"""Compile C kernels with the system C compiler, cache the shared objects on disk, and call them on NumPy arrays.

    import numpy as np
    from uopc.runtime.compiler import Program
    prg = Program("void inc(float* a) { for (int i = 0; i < 4; i++) a[i] += 1.0f; }", "inc")
    a = np.zeros(4, np.float32)
    prg(a)  # a == [1, 1, 1, 1]

Compiled objects live in `helpers.cache_dir()` as `<key>.so` + `<key>.json` (size and sha256 of the .so); an entry
that fails that check is rebuilt silently. A hit touches the entry's mtime; past UOPC_CACHE_MAX_MB the least recently
used entries are deleted (under a lock file, see `evict`). OpenMP threads: `set_num_threads` (uopc/threads.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from typing import Any

import numpy as np

from uopc import helpers
from uopc.codegen.error_record import ERROR_RECORD, ErrorField, oob_error
from uopc.machine import Machine, cpu_fingerprint, probe
from uopc.renderer.flags import unit_cflags
from uopc.runtime import objects
from uopc.runtime.disk_cache import (  # re-exported: the runtime's names
    CacheDirError,
    check_cache_dir,
    entry_ok,
    evict,
    forget_checked_dirs,
    save_failed_source,
    take_written,
    unlink_quiet,
    write_entry,
)
from uopc.runtime.objects import Unit, stats, unit_object  # stats re-exported: the runtime's counters
from uopc.runtime.threads import ensure_threads, get_num_threads, set_num_threads  # re-exported: runtime's old names

__all__ = [
    "CacheDirError",
    "CompileError",
    "CompilerNotFoundError",
    "Program",
    "ensure_threads",
    "entry_ok",
    "evict",
    "get_num_threads",
    "base_cflags",
    "cancel_prefetches",
    "cflags",
    "machine",
    "prefetch",
    "set_num_threads",
    "stats",
]

# Bump when the on-disk layout or the meaning of a key changes, so old entries are simply never looked up again.
CACHE_VERSION = 1

_DEFAULT_CFLAGS = [
    "-O3",
    "-march=native",
    "-fopenmp",
    "-ffp-contract=fast",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-fno-trapping-math",
    "-fno-math-errno",
]
# -fno-math-errno: sqrtf never sets errno for us to read, so gcc may emit vsqrtps instead of a call per element; it
# changes no result (NaN and inf are as before).
# If-conversion stays on (every `?:` vectorizes): gcc 12.2 miscompiled a conditional PAD load in a reduce under an
# invariant loop, so the renderer makes every load unconditional at a clamped index and gates only the value.
# -ffast-math is deliberately absent: it implies -ffinite-math-only, which lets gcc drop the NaN/inf handling
# that reductions and comparisons in generated code rely on.

# Always needed to get a loadable shared object; part of the key like every other flag. -pipe: the compiler's
# stages pass the assembly through pipes, not temporary files (3-5 ms of a 70 ms compile).
_FIXED_FLAGS = ["-shared", "-fPIC", "-pipe"]
# Libraries go after the input on the command line (link order matters for static archives). -nodefaultlibs: the
# link skips libc (libc.so's linker script and libc_nonshared.a were 10-13 ms of every link, measured on a plan's
# link at 19 ms against 7), since an object is only ever loaded into a running Python, whose libc resolves the
# kernels' few calls into it (memset, memcpy, clock_gettime). libm likewise where this process has it in its global
# scope already (CPython links it: reading its symbols was 3.3 ms of a 10.8 ms link), else it is linked. libgcc (the
# compiler's helpers, such as half-float conversions on CPUs without them) stays; -fopenmp still adds its runtime.
_LIBS = ["-nodefaultlibs", "-lgcc"]


@functools.cache
def _link_libs() -> list[str]:
    """What a kernel object links: _LIBS, and -lm unless the process already resolves libm's functions."""
    try:
        ctypes.CDLL(None).sinf  # noqa: B018 - dlsym in the global scope, where a kernel's sinf would resolve
        return _LIBS
    except AttributeError:
        return [*_LIBS, "-lm"]


class CompileError(RuntimeError):
    """The C compiler rejected a kernel; `.c_path` holds a copy of the source to reproduce it."""

    def __init__(self, msg: str, cmd: list[str], stderr: str, src: str, c_path: str | None):
        super().__init__(msg)
        self.cmd, self.stderr, self.src, self.c_path = cmd, stderr, src, c_path


class CompilerNotFoundError(RuntimeError):
    """The C compiler named by CC is missing or cannot be executed."""


# ---------------------------------------------------------------------------------------------------------------
# compiler identity and cache key

_which_cache: dict[tuple[str, str], str | None] = {}
_version_cache: dict[str, str] = {}


def _not_found(cc: str, why: str) -> CompilerNotFoundError:
    return CompilerNotFoundError(
        f"uopc: C compiler {cc!r} {why}. uopc compiles kernels with the compiler named by the CC environment "
        f"variable (default gcc; flags come from CFLAGS). Install one (Debian/Ubuntu: apt-get install gcc; "
        f"Fedora: dnf install gcc; Alpine: apk add gcc musl-dev; macOS: xcode-select --install) or set CC to "
        f"the full path of a working compiler."
    )


def _resolve_compiler() -> str:
    """Absolute path of the CC setting (read now, so it can be changed at run time)."""
    cc = helpers.settings().CC
    # PATH is part of the memo key: the same name can resolve elsewhere once PATH changes.
    memo = (cc, os.environ.get("PATH", ""))
    if memo not in _which_cache:
        found = shutil.which(cc)
        # abspath, not realpath: tools like ccache and clang++ dispatch on the name they were invoked by
        _which_cache[memo] = os.path.abspath(found) if found else None
    path = _which_cache[memo]
    if path is None:
        raise _not_found(cc, "was not found" + ("" if os.sep in cc else " on PATH"))
    return path


def _compiler_version(cc_path: str) -> str:
    """First line of `cc --version`, run once per process per compiler."""
    if cc_path not in _version_cache:
        try:
            out = subprocess.run([cc_path, "--version"], capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise _not_found(cc_path, f"could not be executed ({e})") from e
        _version_cache[cc_path] = (out.stdout or out.stderr).strip().split("\n")[0]
    return _version_cache[cc_path]


def _command(cc_path: str, flags: list[str], out: str, src_file: str = "-") -> list[str]:
    """The compile command; "-" reads C from stdin, so no temporary source file is needed."""
    lang = ["-x", "c"] if src_file == "-" else []
    return [cc_path, *flags, *_FIXED_FLAGS, "-o", out, *lang, src_file, *_link_libs()]


def _cache_key(src: str | tuple[str, ...], cc_path: str, flags: list[str]) -> str:
    """sha256 over the format version, compiler path and version, every flag (fixed ones included) and the source."""
    h = hashlib.sha256()
    parts = [f"uopc-cache-v{CACHE_VERSION}", cc_path, _compiler_version(cc_path), *_command(cc_path, flags, "")]
    if any(f.endswith("=native") for f in flags):
        parts.append(cpu_fingerprint())
    for p in parts:
        # length-prefix every part so ("ab", "c") and ("a", "bc") cannot collide
        h.update(f"{len(p)}:".encode() + p.encode() + b"\0")
    if isinstance(src, tuple):  # translation units of one object: each length-prefixed, after a marker
        h.update(b"uopc-parts\0")
        for p in src:
            h.update(f"{len(p)}:".encode() + p.encode())
    else:
        h.update(src.encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# building and loading


def _compile_error(
    rc: int, cmd: list[str], stderr: str, src: str, cc_path: str, flags: list[str], cache: str, key: str
):
    c_path = save_failed_source(cache, key, src)
    where = (
        f"source saved to {c_path}; reproduce with:\n  "
        + shlex.join(_command(cc_path, flags, "/tmp/uopc-kernel.so", c_path))
        if c_path
        else "(could not save the failing source)"
    )
    return CompileError(
        f"uopc: C compiler failed (exit {rc})\ncommand: {shlex.join(cmd)}\n{stderr.rstrip()}\n{where}",
        cmd,
        stderr,
        src,
        c_path,
    )


def _object_key(src: str, cc_path: str, flags: list[str]) -> str:
    """The cache key of one translation unit compiled to an object file (`-c`): its own source, compiler, flags."""
    return _cache_key(("object", src), cc_path, flags)


def prefetch(src: str) -> str:
    """Start compiling one kernel unit of a plan into the object cache in the background and return at once (see
    uopc.runtime.objects.prefetch); returns the unit's object path, for cancel_prefetches."""
    cc_path, flags = _resolve_compiler(), cflags()
    obj = unit_object(check_cache_dir(helpers.cache_dir()), _object_key(src, cc_path, flags))
    objects.prefetch(Unit(src, obj), cc_path, flags)
    return obj


def cancel_prefetches(objs: list[str]) -> None:
    """Drop the early compiles (by the object paths prefetch returned) that no link claimed."""
    objects.cancel(objs)


def _build_parts(srcs: tuple[str, ...], cc_path: str, flags: list[str], cache: str, key: str, tmpdir: str) -> str:
    """Link a plan into one shared object: its kernel units (all of `srcs` but the last) from the object cache
    (uopc.runtime.objects: keyed by each unit's own source, so a kernel shared by two plans or two models compiles
    once; missing ones compile now, several to a compiler run, in parallel), and its entry point (the last unit).
    The entry point compiles while the kernels do: compiled by the link itself, it took 116 of the 130 ms that
    char-GPT's link added to its first call after the last kernel (311 calls and <time.h>)."""
    units = [Unit(src, unit_object(cache, _object_key(src, cc_path, flags))) for src in srcs[:-1]]

    def fail(rc: int, cmd: list[str], stderr: str, src: str) -> CompileError:
        return _compile_error(rc, cmd, stderr, src, cc_path, flags, cache, key)

    entry, entry_obj, tmp = (os.path.join(tmpdir, f) for f in ("entry.c", "entry.o", "k.so"))
    with open(entry, "w") as f:
        f.write(srcs[-1])
    entry_cmd = [cc_path, *flags, *(f for f in _FIXED_FLAGS if f != "-shared"), "-c", "-o", entry_obj, entry]
    try:
        entry_proc = subprocess.Popen(entry_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            objs = objects.gather(units, cc_path, flags, tmpdir, fail)
        finally:
            entry_err = entry_proc.communicate()[1].decode(errors="replace")
    except OSError as e:
        raise _not_found(cc_path, f"could not be executed ({e})") from e
    stats["compiles"] += 1
    if entry_proc.returncode != 0:
        raise fail(entry_proc.returncode, entry_cmd, entry_err, srcs[-1])
    cmd = [cc_path, *flags, *_FIXED_FLAGS, "-o", tmp, entry_obj, *objs, *_link_libs()]
    proc = subprocess.run(cmd, capture_output=True, check=False)
    if proc.returncode != 0:
        raise fail(proc.returncode, cmd, proc.stderr.decode(errors="replace"), srcs[-1])
    return tmp


def _compile(src: str | tuple[str, ...], cc_path: str, flags: list[str], cache: str, key: str) -> str:
    """Run the compiler into a temp file, then move the .so and its json into place; return the .so path.

    A tuple of sources is several translation units of one object (a plan: one per kernel and its entry point),
    each compiled through the object cache and linked.
    """
    so_path = os.path.join(cache, f"{key}.so")
    with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as tmpdir:
        if isinstance(src, tuple):
            tmp = _build_parts(src, cc_path, flags, cache, key, tmpdir)
        else:
            tmp = os.path.join(tmpdir, "k.so")
            cmd = _command(cc_path, [*flags, *unit_cflags(src)], tmp)
            try:
                proc = subprocess.run(cmd, input=src.encode(), capture_output=True, check=False)
            except OSError as e:
                raise _not_found(cc_path, f"could not be executed ({e})") from e
            stats["compiles"] += 1
            if proc.returncode != 0:
                stderr = proc.stderr.decode(errors="replace")
                raise _compile_error(proc.returncode, cmd, stderr, src, cc_path, flags, cache, key)
        with open(tmp, "rb") as f:
            data = f.read()
    write_entry(so_path, data, 0o700)
    return so_path


def _compile_cached(src: str | tuple[str, ...], cc_path: str, flags: list[str], key: str) -> str:
    """Path of a verified .so for `src` in the cache directory, compiling or rebuilding it if needed."""
    cache = check_cache_dir(helpers.cache_dir())
    so_path, json_path = os.path.join(cache, f"{key}.so"), os.path.join(cache, f"{key}.json")
    if entry_ok(so_path, json_path):
        stats["disk_hits"] += 1
        try:
            os.utime(so_path)  # the mtime is the entry's last use: eviction goes oldest first
        except OSError:
            pass
        return so_path
    if os.path.exists(so_path) or os.path.exists(json_path):
        stats["rebuilds"] += 1  # missing, truncated or altered entry: recompile over it
    with helpers.phase("gcc"):
        so_path = _compile(src, cc_path, flags, cache, key)
    evict(cache, keep=so_path, written=take_written())
    return so_path


def base_cflags() -> list[str]:
    """The CFLAGS setting, or uopc's defaults: what the user chose, before the machine's additions."""
    flags = helpers.settings().CFLAGS
    return list(flags) if flags is not None else list(_DEFAULT_CFLAGS)


def machine() -> Machine:
    """The machine the current compiler and CFLAGS target (probed once per compiler and flag set, see
    uopc.machine); what it says at DEBUG=1 is printed the first time."""
    global _last_machine
    s = helpers.settings()
    last = _last_machine  # read once: another thread may rebind it
    if last[0] is s:  # every realize asks: the same settings snapshot (no Context entered since) has its answer
        return last[1]
    env = os.environ
    memo = (s.CC, s.CFLAGS, s.DEBUG >= 1, env.get("PATH"), env.get("UOPC_CACHE"), env.get("XDG_CACHE_HOME"))
    if (m := _machines.get(memo)) is not None:
        _last_machine = (s, m)
        return m
    cc_path, flags = _resolve_compiler(), base_cflags()
    cache = check_cache_dir(helpers.cache_dir())
    m = probe(cc_path, flags, _compiler_version(cc_path), cache)
    _machines[memo] = m
    _last_machine = (s, m)
    if m.notes and helpers.settings().DEBUG >= 1 and (cc_path, tuple(flags)) not in _told:
        _told.add((cc_path, tuple(flags)))
        for note in m.notes:
            print(f"uopc: {note}")
    return m


_told: set[tuple] = set()
_machines: dict[tuple, Machine] = {}
_last_machine: tuple = (None, None)  # (settings snapshot, its Machine), rebound whole


def cflags() -> list[str]:
    """Every flag kernels compile with: the CFLAGS setting (or the defaults), then what the machine adds."""
    return [*base_cflags(), *machine().extra_flags]


def _resolve(src: str | tuple[str, ...]) -> tuple[str, list[str], str]:
    """Compiler path, flags and cache key for `src`; CC and CFLAGS are read now so they can change at run time."""
    cc_path, flags = _resolve_compiler(), cflags()
    return cc_path, flags, _cache_key(src, cc_path, flags)


def compiler_identity() -> str:
    """What, besides the source, decides compiled code: compiler path and version, every flag, the host CPU.

    Anything keyed by measured speed (the search cache) includes it, so a choice timed under one compiler, flag
    set or CPU is never applied under another.
    """
    cc_path, flags = _resolve_compiler(), cflags()
    # the Machine's additions are in `flags`; the record itself keys the search and plan caches where they use it
    return "\n".join([f"uopc-cache-v{CACHE_VERSION}", cc_path, _compiler_version(cc_path), *flags, cpu_fingerprint()])


def _build(src: str) -> str:
    """Compile `src` into the disk cache (or verify it is there) without loading it; returns the .so path."""
    return _compile_cached(src, *_resolve(src))


# (cache dir, key) -> loaded library; the dir is part of it so a changed UOPC_CACHE gets its own entries.
_libs: dict[tuple[str, str], tuple[ctypes.CDLL, str]] = {}
_libs_guard = threading.Lock()
_key_locks: dict[tuple[str, str], threading.Lock] = {}


def _clear_memory_cache() -> None:
    """Forget loaded libraries (tests use this; already dlopened objects stay mapped)."""
    with _libs_guard:
        _libs.clear()
        _key_locks.clear()
    forget_checked_dirs()


def _load(src: str | tuple[str, ...]) -> tuple[ctypes.CDLL, str]:
    """The loaded library for `src`: from memory, else from the disk cache, else freshly compiled."""
    cc_path, flags, key = _resolve(src)
    mkey = (helpers.cache_dir(), key)
    hit = _libs.get(mkey)
    if hit is not None:
        return hit
    with _libs_guard:
        lock = _key_locks.setdefault(mkey, threading.Lock())
    with lock:  # one build per key per process; other keys build in parallel
        if (hit := _libs.get(mkey)) is not None:
            return hit
        path = _compile_cached(src, cc_path, flags, key)
        try:
            with helpers.phase("load"):
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        except OSError:
            # Verified but unloadable (e.g. a consistent-but-bad pair written by something else): rebuild once.
            unlink_quiet(path)
            path = _compile_cached(src, cc_path, flags, key)
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        stats["loads"] += 1
        _libs[mkey] = (lib, path)
        return lib, path


class Program:
    """A compiled C function; call it with C-contiguous NumPy arrays, each passed as a pointer to its data."""

    def __init__(self, src: str | tuple[str, ...], name: str):
        self.src, self.name = src, name
        lib, self.lib_path = _load(src)
        self._lib = lib
        try:
            # lib[name] is a fresh function pointer, so this Program's argtypes never affect another's
            self._fn: Any = lib[name]
        except AttributeError:
            raise AttributeError(
                f"uopc: function {name!r} not found in the compiled source ({self.lib_path})"
            ) from None
        self._fn.restype = None
        self._nargs = -1
        try:  # sources rendered with UOPC_CHECK_OOB=1 record their first out-of-range index here
            self._oob: Any = (ctypes.c_longlong * ERROR_RECORD).in_dll(lib, "uopc_oob")
        except ValueError:
            self._oob = None

    def __repr__(self) -> str:
        return f"Program({self.name!r}, {self.lib_path!r})"

    def entry(self, argtypes: list[Any]) -> Any:
        """A fresh ctypes function for this program's symbol with `argtypes`, for callers that pass raw pointers
        (a plan passes one array of buffer pointers); call `ensure_threads()` before calling it."""
        fn = self._lib[self.name]
        fn.argtypes, fn.restype = argtypes, None
        return fn

    def __call__(self, *args: np.ndarray) -> None:
        """Run the kernel on `args` (C-contiguous ndarrays)."""
        ensure_threads()
        ptrs = []
        for i, a in enumerate(args):
            if not isinstance(a, np.ndarray):
                raise TypeError(f"uopc: argument {i} of {self.name}: expected a numpy.ndarray, got {type(a).__name__}")
            if not a.flags.c_contiguous:
                raise TypeError(
                    f"uopc: argument {i} of {self.name}: array is not C-contiguous "
                    f"(shape {a.shape}, strides {a.strides}); pass np.ascontiguousarray(...)"
                )
            ptrs.append(a.ctypes.data)
        if len(ptrs) != self._nargs:
            # set once: without argtypes ctypes would pass Python ints as 32-bit C ints and truncate pointers
            self._fn.argtypes = [ctypes.c_void_p] * len(ptrs)
            self._nargs = len(ptrs)
        self._fn(*ptrs)
        if self._oob is not None and self._oob[ErrorField.FAILED]:
            self._oob[ErrorField.FAILED] = 0
            raise oob_error(self._oob, self.name)


def _after_fork_in_child() -> None:
    global _libs_guard
    # A lock held by another thread at fork time would stay locked forever in the child.
    _libs_guard = threading.Lock()
    _key_locks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

"""The on-disk kernel cache's files: the directory (created 0700, refused if anyone else could plant code in it),
entries (a file plus a json of its size and sha256, written atomically, trusted only when both agree) and eviction
(least recently used first, past UOPC_CACHE_MAX_MB; after a compile, only once a share of the cap was written since
the last scan). uopc.runtime.compiler builds into it.

    path = check_cache_dir(helpers.cache_dir())
    write_entry(os.path.join(path, "k.so"), data, 0o700)     # k.so, then k.json
    entry_ok(os.path.join(path, "k.so"), os.path.join(path, "k.json"))
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import stat
import threading

from uopc import helpers
from uopc.helpers import atomic_write

__all__ = [
    "CacheDirError",
    "SCAN_SHARE",
    "check_cache_dir",
    "entry_ok",
    "evict",
    "folder_lock",
    "forget_checked_dirs",
    "save_failed_source",
    "scan_due",
    "take_written",
    "unlink_quiet",
    "write_entry",
]


class CacheDirError(PermissionError):
    """The kernel cache directory is unsafe to load code from (symlink, writable by others, or not ours)."""

    def __init__(self, msg: str, path: str):
        super().__init__(msg)
        self.path = path


_checked_dirs: set[str] = set()


def check_cache_dir(path: str) -> str:
    """Create `path` (mode 0700) if missing and refuse it if anyone else could plant code in it."""
    if path in _checked_dirs:
        if os.path.isdir(path):
            return path
        _checked_dirs.discard(path)  # removed while we ran (rm -rf ~/.cache/uopc): check and create it again
    if not os.path.islink(path):
        try:
            os.makedirs(path, mode=0o700)
            os.chmod(path, 0o700)  # makedirs' mode is filtered by the umask; make it exact
        except FileExistsError:
            pass
    st = os.lstat(path)
    fix = "set UOPC_CACHE to a directory you own (e.g. mkdir -m 700 ~/.cache/uopc)"
    # Only the directory itself is checked, not its parents: /tmp and macOS's /var are symlinks or shared.
    if stat.S_ISLNK(st.st_mode):
        raise CacheDirError(f"uopc: refusing kernel cache directory {path}: it is a symlink; {fix}", path)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheDirError(f"uopc: kernel cache path {path} is not a directory; {fix}", path)
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise CacheDirError(
            f"uopc: refusing kernel cache directory {path}: it is owned by uid {st.st_uid}, "
            f"not by you (uid {os.getuid()}); {fix}",
            path,
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheDirError(
            f"uopc: refusing kernel cache directory {path}: it is group- or world-writable "
            f"(mode {stat.S_IMODE(st.st_mode):o}), so others could plant code in it; "
            f"fix with: chmod 700 {shlex.quote(path)}, or {fix}",
            path,
        )
    # Only good verdicts are remembered: a refused directory is re-checked, so fixing it needs no restart.
    _checked_dirs.add(path)
    return path


def unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def entry_ok(so_path: str, json_path: str) -> bool:
    """Whether a cache entry's file exists and matches the size and sha256 recorded in its json, without loading it."""
    return entry_digest(so_path, json_path) is not None


def entry_digest(path: str, json_path: str) -> str | None:
    """The sha256 of a cache entry's file if it exists and matches the size and digest its json records, else None."""
    try:
        with open(json_path) as f:
            meta = json.load(f)
        size, digest = meta["size"], meta["sha256"]
        if not isinstance(size, int) or not isinstance(digest, str) or size <= 0:
            return None
        if os.path.getsize(path) != size:  # cheap check before hashing
            return None
        with open(path, "rb") as f:
            return digest if hashlib.sha256(f.read()).hexdigest() == digest else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_entry(path: str, data: bytes, mode: int, same_as: str | None = None) -> None:
    """A cache entry: the file, then its json (size and sha256) last, so a crash in between leaves no trusted entry.
    `same_as`: an entry just written with the same `data`, which this one becomes a hard link of (one object file
    holding several kernels, stored under each kernel's key); written out when the link cannot be made."""
    linked = False
    if same_as is not None:
        d, name = os.path.split(path)
        tmp = os.path.join(d, f".tmp-link-{os.getpid()}-{threading.get_ident()}-{name}")
        try:
            os.link(same_as, tmp)
            os.replace(tmp, path)
            linked = True
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    if not linked:
        atomic_write(path, data, mode=mode)
    meta = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    atomic_write(os.path.splitext(path)[0] + ".json", json.dumps(meta).encode())
    with _written_lock:
        _written[0] += len(data)


# Eviction stats every entry of the cache: make test leaves ~15,000 files, a scan of them took 100 ms, and every
# compile asked for one (make test's second pass took 414 s with it, 203 s without). After a write, a scan runs only
# once the bytes written since the last one reach 1/SCAN_SHARE of the cap, so the cache exceeds its cap by at most
# that share (16 MB of the default 512). The count is kept across processes in <folder>/.written, read and
# rewritten under the folder's lock; a missing or unreadable count (a cache from before it, a write cut short) makes a
# scan due at once.
SCAN_SHARE = 32
_written = [0]  # bytes this process wrote into cache entries since take_written last took them
_written_lock = threading.Lock()  # (objects are written from the early compiles' thread too)


def take_written() -> int:
    """The bytes write_entry wrote since the last call (then zero)."""
    with _written_lock:
        n, _written[0] = _written[0], 0
        return n


@contextlib.contextmanager
def folder_lock(folder: str):
    """An exclusive flock on <folder>/.lock, across processes, for the block."""
    with open(os.path.join(folder, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def scan_due(folder: str, written: int, cap: int) -> bool:
    """Under folder_lock: add `written` bytes to the folder's count since its last scan; True (the count reset to
    zero) once it reaches cap / SCAN_SHARE or when it is missing or unreadable, else False."""
    path = os.path.join(folder, ".written")
    try:
        with open(path) as f:
            total = int(f.read()) + written
    except (OSError, ValueError):
        total = None
    due = total is None or total >= cap // SCAN_SHARE
    with contextlib.suppress(OSError):
        with open(path, "w") as f:
            f.write("0" if due else str(total))
    return due


def evict(cache: str, max_bytes: int | None = None, keep: str | None = None, written: int | None = None) -> int:
    """Delete least recently used entries until the cache's compiled files (plans' .so and kernels' .o in obj/, each
    with its .json) fit `max_bytes` (default UOPC_CACHE_MAX_MB; 0 means no cap). Returns how many were deleted.
    `written`: the bytes just written, after a compile; the scan then runs only when scan_due says so.

    Processes serialize eviction with an flock on `<cache>/.lock`. Deleting an entry another process is about to
    load is safe: a loaded .so stays mapped after unlink, a link that finds an object gone fails over to compiling
    it, and a load that finds its .so gone rebuilds it.
    """
    cap = helpers.settings().CACHE_MAX_MB * (1 << 20) if max_bytes is None else max_bytes
    if cap <= 0:
        return 0
    with folder_lock(cache):
        if written is not None and not scan_due(cache, written, cap):
            return 0
        entries, total = [], 0
        for folder, ext in ((cache, ".so"), (os.path.join(cache, "obj"), ".o")):
            if not os.path.isdir(folder):
                continue
            for entry in os.scandir(folder):
                if not entry.name.endswith(ext) or not entry.is_file(follow_symlinks=False):
                    continue
                json_path = entry.path[: -len(ext)] + ".json"
                try:
                    size = entry.stat().st_size + (os.path.getsize(json_path) if os.path.exists(json_path) else 0)
                    entries.append((entry.stat().st_mtime, entry.path, size, json_path))
                except OSError:
                    continue  # deleted meanwhile by a process that does not take the lock (clear)
                total += size
        n = 0
        for _, path, size, json_path in sorted(entries):
            if total <= cap:
                break
            if path == keep:
                continue
            unlink_quiet(json_path)  # json first: a file without its json is never trusted
            unlink_quiet(path)
            total, n = total - size, n + 1
        return n


def save_failed_source(cache: str, key: str, src: str) -> str | None:
    """Keep the source of a failed compile under <cache>/failed/ so the user can rerun the compiler on it."""
    try:
        failed = os.path.join(cache, "failed")
        os.makedirs(failed, mode=0o700, exist_ok=True)
        c_path = os.path.join(failed, f"{key}.c")
        atomic_write(c_path, src.encode())
        return c_path
    except OSError:
        return None  # reporting the compile error matters more than saving the copy


def forget_checked_dirs() -> None:
    """Check every directory again on its next use (tests change modes and owners under a running process)."""
    _checked_dirs.clear()

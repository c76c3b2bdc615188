"""Storage: the NumPy array behind each BUFFER UOp, kept in a side table (UOps stay immutable and small).

    >>> b = new_buffer(dtypes.float32, 4, np.arange(4))
    >>> buffer_data(b)          # a 64-byte aligned float32 copy that uopc owns
    array([0., 1., 2., 3.], dtype=float32)

A BUFFER's array lives exactly as long as the BUFFER UOp: when the last graph (or Tensor) using it dies, its memory
goes back to `pool`, which hands it out again by size class, so a training loop keeps writing to memory that is
already mapped (a first touch of a fresh 256 MiB array costs 50-300 ms here, a rewrite 31 ms). Slots come from one
counter, so two buffers never hash-cons into one.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import NamedTuple

import numpy as np

from uopc import helpers
from uopc.helpers import STORAGE_GUARD
from uopc.uop import Ops, ParamArg, UOp, base_buffer, note_new_reader
from uopc.uop.dtype import DType

__all__ = [
    "ALIGN",
    "Pool",
    "aligned_empty",
    "buffer_data",
    "buffer_ptr",
    "bump_version",
    "buffer_from",
    "is_shared",
    "new_buffer",
    "output_buffer",
    "pool",
    "storage_view",
    "version",
]

ALIGN = 64  # bytes: a cache line, and a multiple of every vector width the kernels use


def _size_class(nbytes: int) -> int:
    """Round up to one of four steps per power of two (at most 25% slack), at least one cache line."""
    n = max(nbytes, ALIGN)
    step = max(ALIGN, 1 << max(0, n.bit_length() - 3))
    return -(-n // step) * step


class Block(NamedTuple):
    """A pool allocation: the aligned bytes and their address (read once: numpy's .ctypes costs a microsecond)."""

    data: np.ndarray
    addr: int


class Pool:
    """Freed storage kept by size class and handed out again; `misses` counts allocations taken from the system.

    At most `helpers.POOL_MB` MiB wait in the free lists (more is given back to the system). `empty()` gives
    everything back; an allocation that raises MemoryError empties the pool and tries once more.
    """

    def __init__(self) -> None:
        self._free: dict[int, list[Block]] = {}
        self._lock = threading.Lock()
        self.held = 0  # bytes waiting in the free lists
        self.misses = 0
        self.hits = 0

    def alloc(self, nbytes: int) -> Block:
        """A 64-byte aligned, uninitialized uint8 block of at least `nbytes` bytes (its size class), and its address."""
        cls = _size_class(nbytes)
        with self._lock:
            lst = self._free.get(cls)
            if lst:
                self.held -= cls
                self.hits += 1
                return lst.pop()
            self.misses += 1
        try:
            data = _guarded_empty(cls)
        except MemoryError:
            self.empty()
            data = _guarded_empty(cls)
        return Block(data, data.ctypes.data)

    def free(self, block: Block) -> None:
        """Give back a block from `alloc` (nothing else may still use it)."""
        cls = block.data.size
        with self._lock:
            if self.held + cls > helpers.settings().POOL_MB << 20:
                return  # over the cap: the garbage collector gives it back to the system
            self._free.setdefault(cls, []).append(block)
            self.held += cls

    def empty(self) -> None:
        """Give every free block back to the system."""
        with self._lock:
            self._free.clear()
            self.held = 0


pool = Pool()


def _typed(block: Block, n: int, dtype: DType) -> np.ndarray:
    return block.data[: n * dtype.itemsize].view(dtype.np)


class _Ref(weakref.ref):
    """A weak reference to a BUFFER UOp that remembers the storage key, so the callback can find the entry."""

    __slots__ = ("key",)


class _Entry:
    """The storage of one BUFFER: its flat array (None until first asked for), the weak reference whose callback
    drops the entry, the pool block (None for an array taken over by buffer_from), the address of the data (a plan
    call reads it without going through NumPy), whether buffer_data has handed a view of it out, and its version:
    a count of the writes uopc made into it after the first (see version)."""

    __slots__ = ("arr", "ref", "block", "addr", "shared", "version")

    def __init__(self, arr: np.ndarray | None, ref: _Ref, block: Block | None, addr: int):
        self.arr, self.ref, self.block, self.addr = arr, ref, block, addr
        # a NumPy view of it is out there: the pool never reuses it and nothing writes it in place
        self.shared = False
        self.version = 0


# id(BUFFER UOp) -> its entry. Keyed by id, not by the UOp: the entry must not keep the UOp alive, and the callback
# runs before the id is reused.
_storage: dict[int, _Entry] = {}
# next(count) is atomic under the GIL: two threads never get the same slot
_slots = itertools.count(1)
_attach_lock = threading.Lock()


def _new_locks_in_child() -> None:
    global _attach_lock
    _attach_lock = threading.Lock()
    pool._lock = threading.Lock()


helpers.in_forked_child(_new_locks_in_child)


def _dead(ref: _Ref) -> None:
    entry = _storage.pop(ref.key, None)
    # storage whose view was handed out belongs to whoever holds the view: the garbage collector frees it
    if entry is not None and entry.block is not None and not entry.shared:
        pool.free(entry.block)


def _attach(u: UOp, arr: np.ndarray | None, block: Block | None, addr: int) -> None:
    key = id(u)
    r = _Ref(u, _dead)
    r.key = key
    _storage[key] = _Entry(arr, r, block, addr)


def _guarded_empty(nbytes: int) -> np.ndarray:
    """`nbytes` uninitialized bytes starting on an ALIGN boundary, with helpers.STORAGE_GUARD bytes of the same
    allocation before and after them (never written; a kernel may read them and discard the values)."""
    raw = np.empty(nbytes + ALIGN + 2 * STORAGE_GUARD, np.uint8)
    off = STORAGE_GUARD + (-(raw.ctypes.data + STORAGE_GUARD)) % ALIGN
    return raw[off : off + nbytes]


def has_guard(arr: np.ndarray) -> bool:
    """Whether `arr`'s data has helpers.STORAGE_GUARD bytes of its own allocation on each side (as _guarded_empty
    gives), found through the arrays it is a view of."""
    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    lo, hi = root.ctypes.data, root.ctypes.data + root.nbytes
    start = arr.ctypes.data
    return root.flags.c_contiguous and lo + STORAGE_GUARD <= start and start + arr.nbytes + STORAGE_GUARD <= hi


def aligned_empty(n: int, dtype: DType) -> np.ndarray:
    """An uninitialized flat array of `n` elements whose data starts on an ALIGN boundary (not from the pool), guarded
    as the pool's storage is (see helpers.STORAGE_GUARD).

    NumPy's large allocations start 16 bytes into a page; with 32-byte vector loads every other load would then
    split a cache line (measured: a 1024^3 GEMM kernel 175 vs 192 GFLOP/s at 16 vs 32-byte alignment).
    """
    return _guarded_empty(n * dtype.itemsize).view(dtype.np)


def new_buffer(dtype: DType, size: int, data: np.ndarray | None = None) -> UOp:
    """A fresh BUFFER (a new positive slot, so hash-consing never merges two buffers); `data` is copied in.

    The copy is aligned, from the pool, and owned by uopc: changing the caller's array later does not change it.
    """
    u = UOp(Ops.BUFFER, (), ParamArg(next(_slots), dtype, (max(size, 1),)))
    if data is not None:
        flat = np.asarray(data).reshape(-1)
        output_storage(u)
        storage_view(u)[: flat.size] = flat
    return u


def output_storage(u: UOp) -> int:
    """Attach uninitialized storage from the pool to a BUFFER that has none yet; returns its address.

    The typed NumPy view is made on the first buffer_data: a plan only needs the address.
    """
    block = pool.alloc(u.arg.shape[0] * u.dtype.itemsize)
    _attach(u, None, block, block.addr)
    return block.addr


def output_buffer(dtype: DType, size: int) -> UOp:
    """A BUFFER for a kernel to write: aligned, from the pool, uninitialized (the kernel writes every element)."""
    u = UOp(Ops.BUFFER, (), ParamArg(next(_slots), dtype, (max(size, 1),)))
    output_storage(u)
    return u


def buffer_from(arr: np.ndarray, dtype: DType) -> UOp:
    """A BUFFER that takes `arr` (flat, aligned, of `dtype`, owned by nobody else) as its storage without a copy."""
    if arr.ndim != 1 or arr.dtype != dtype.np or arr.ctypes.data % ALIGN:
        raise ValueError(f"buffer_from: need a flat {ALIGN}-byte aligned {dtype.np} array, got {arr.dtype}{arr.shape}")
    if not has_guard(arr):  # kernels may read a little past a buffer's ends (helpers.STORAGE_GUARD)
        raise ValueError("buffer_from: the array must come from aligned_empty (storage with guard bytes around it)")
    u = UOp(Ops.BUFFER, (), ParamArg(next(_slots), dtype, (arr.size,)))
    _attach(u, arr, None, arr.ctypes.data)
    return u


def buffer_data(u: UOp) -> np.ndarray:
    """The flat array of a BUFFER UOp (zero-filled on first use): a view of uopc's storage, handed out.

    From then on the storage is the view's as much as uopc's: the pool never reuses it, and no plan writes into it
    in place (an assign to its tensor goes to fresh storage), so the view keeps the values it shows.
    """
    entry = _entry(u)
    if not entry.shared:
        entry.shared = True
        note_new_reader()  # a TinyJit replay that found this storage free to overwrite must look again
    return storage_view(u)


def storage_view(u: UOp, write: bool = True) -> np.ndarray:
    """The flat array of a BUFFER UOp for uopc's own short use (a copy out, a write in): not handed out, so the
    caller must not keep it. Unless `write` is False (a copy out), it counts as a write (see version)."""
    entry = _entry(u)
    entry.version += write
    if entry.arr is None:
        entry.arr = _typed(entry.block, u.arg.shape[0], u.dtype)
    return entry.arr


def _entry(u: UOp) -> _Entry:
    entry = _storage.get(id(u))
    if entry is None:
        with _attach_lock:  # two threads touching a fresh buffer at once must attach one array
            if id(u) not in _storage:
                output_storage(u)
                _typed(_storage[id(u)].block, u.arg.shape[0], u.dtype).fill(0)
        entry = _storage[id(u)]
    return entry


def buffer_ptr(u: UOp) -> int:
    """The address of a BUFFER's data (attaching zeroed storage on first use, as buffer_data does)."""
    entry = _storage.get(id(u))
    return entry.addr if entry is not None else _entry(u).addr


def is_shared(u: UOp) -> bool:
    """Whether buffer_data has handed out a view of this BUFFER's storage (see buffer_data)."""
    entry = _storage.get(id(u))
    return entry is not None and entry.shared


def version(u: UOp) -> int | None:
    """Which contents a BUFFER holds: the same number means the same values, as long as the BUFFER lives (its
    storage is its own). It changes on every write uopc makes after the first: a plan storing into the buffer it was
    given (bump_version), or a host write through storage_view. None where the storage is handed out (buffer_data):
    whoever holds the view may change it unseen. Results computed from a buffer are kept across calls on this."""
    entry = _storage.get(id(u))
    if entry is None:
        return 0
    return None if entry.shared else entry.version


def bump_version(u: UOp) -> None:
    """Record a write into a BUFFER's existing storage (a plan that stored into it; see version)."""
    entry = _storage.get(id(u))
    if entry is not None:
        entry.version += 1


def has_data(u: UOp) -> bool:
    """Whether storage has been attached to this BUFFER yet."""
    return id(u) in _storage


def is_contiguous_buffer(u: UOp) -> bool:
    """A BUFFER, or RESHAPEs of one: the data is already where a realize would put it."""
    return base_buffer(u).op is Ops.BUFFER

"""Who reads a storage view: the weak record TinyJit consults before writing an assigned tensor's storage in place.
(Nodes are typed Any here: uop.py imports this module.)

    track(buf)                      # an assign's fresh buffer under a TinyJit capture or replay, at its birth
    y = w.uop * 2                   # UOp.__new__ calls add_reader(w.uop, y): y may read w's storage later
    read_only_by(w.uop, w)          # False while y lives; True again once it is gone

Only tracked storage records its readers, so building on any other buffer costs nothing.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from uopc.helpers import in_forked_child
from uopc.uop.ops import Ops

__all__ = ["add_reader", "forget_reader", "note_new_reader", "read_only_by", "readers_epoch", "track"]


# The readers of a storage view: a list of weak references per node (u.__dict__["readers"]), appended to when a
# node is built on the view or a Tensor takes it, pruned of dead references whenever its length reaches a power of
# two (amortized O(1)). Appends are single list operations (atomic under the GIL) and take no lock; a prune, a
# removal and a read take `_readers_lock`, and a prune deletes from the back, so a concurrent append is never lost.
_readers_lock = threading.Lock()
in_forked_child(lambda: globals().__setitem__("_readers_lock", threading.Lock()))


def track(buf: Any) -> None:
    """From now on, record who reads this BUFFER's storage (nodes built on it or on its RESHAPEs, Tensors holding
    one): it holds an assigned tensor's value, which a TinyJit replay may write in place (see read_only_by). Called
    on a buffer at its birth, before anything can read it; other buffers cost nothing to build on."""
    if buf.op is not Ops.BUFFER:
        raise ValueError(f"track: only a BUFFER's readers are recorded, got {buf.op}")
    buf.__dict__["tracked"] = True


_epoch = 0  # bumped whenever a reader is added anywhere (or storage handed out): see readers_epoch


def readers_epoch() -> int:
    """A number that changes whenever tracked storage gains a reader (add_reader) or is handed out to NumPy
    (note_new_reader): while it stays the same, no read_only_by answer that was True has become False."""
    return _epoch


def note_new_reader() -> None:
    """Something outside the graph now reads some storage (a NumPy view of it): read_only_by answers may change."""
    global _epoch
    _epoch += 1


def add_reader(u: Any, reader: Any) -> None:
    """Record, weakly, that `reader` (a node built on u, or a Tensor holding u) may read u's storage later."""
    global _epoch
    _epoch += 1
    readers = u.__dict__.setdefault("readers", [])
    readers.append(weakref.ref(reader))
    n = len(readers)
    if n >= 8 and not n & (n - 1):
        _drop_readers(readers, None)


def _drop_readers(readers: list, reader: Any) -> None:
    """Delete the dead references (and those to `reader`), from the back: appends meanwhile land past them."""
    with _readers_lock:
        for i in range(len(readers) - 1, -1, -1):
            x = readers[i]()
            if x is None or x is reader:
                del readers[i]


def forget_reader(u: Any, reader: Any) -> None:
    """`reader` no longer reads u (a Tensor rebound to another graph)."""
    readers = u.__dict__.get("readers")
    if readers:
        _drop_readers(readers, reader)


def read_only_by(u: Any, reader: Any) -> bool:
    """Whether nothing alive but `reader` reads the storage under `u` (a tracked BUFFER or a RESHAPE of one): no other
    node built on u or on the RESHAPEs below it, and no other Tensor holding one of them. False for storage that is
    not tracked. A reader is forgotten when it dies, so the answer errs only one way: something unreachable but not
    yet collected counts as a reader."""
    if not u.tracked:
        return False
    with _readers_lock:
        while True:
            for r in u.__dict__.get("readers") or ():
                x = r()
                if x is not None and x is not reader:
                    return False
            if u.op is not Ops.RESHAPE:
                return True
            u, reader = u.src[0], u

"""What DEBUG prints about plans: the plan-cache miss explainer (DEBUG=1: a new structure key against the cached ones,
in words) and the line per kernel of a plan's run (DEBUG>=2).

realize: plan cache miss; the closest cached plan differs first at CONST 0.00099 (was 0.001) at node 12 of 40
(1 node differs): a Python float that changes every step: pass it as a Tensor
"""

from __future__ import annotations

import ctypes
from typing import Any

from uopc.codegen.error_record import ERROR_RECORD
from uopc.uop import Ops

__all__ = ["closest_difference", "print_kernels"]


def _arg(arg: Any) -> str:
    """A structure-key arg as the user wrote it (floats are keyed by their hex form)."""
    if isinstance(arg, tuple) and len(arg) == 2 and arg[0] is float:
        return f"{float.fromhex(arg[1]):.6g}"
    if isinstance(arg, tuple) and len(arg) == 2 and arg[0] is bool:
        return repr(arg[1])
    return repr(arg)


def _describe(node: tuple) -> str:
    op, dtype, arg, _ = node
    if op is Ops.BUFFER:
        return f"BUFFER {arg[1]}[{', '.join(map(str, arg[2]))}]"
    if op is Ops.CONST or dtype is None:  # a CONST's dtype is in its arg; a SINK or ASSIGN-like node has none
        return f"{op.name} {_arg(arg)}"
    return f"{op.name} {dtype.name} {_arg(arg)}"


def closest_difference(key: tuple, recent: list[tuple]) -> str | None:
    """Why plan key `key` missed, in words: the closest of the cached keys `recent` with the same settings and a
    structure of the same size, and the first node where they differ (None if there is none)."""
    skey = key[0]
    best, best_same = None, -1
    for other in recent:
        if other[1:] != key[1:] or len(other[0]) != len(skey):
            continue
        same = sum(a == b for a, b in zip(skey, other[0], strict=True))
        if same > best_same:
            best, best_same = other[0], same
    if best is None:
        return None
    i = next(j for j, (a, b) in enumerate(zip(skey, best, strict=True)) if a != b)
    new, old = skey[i], best[i]
    ndiff = len(skey) - best_same
    where = f"at node {i} of {len(skey)} ({ndiff} node{'s differ' if ndiff != 1 else ' differs'})"
    if new[0] is Ops.CONST and old[0] is Ops.CONST and new[1] == old[1]:
        kind = "float" if isinstance(new[2], tuple) and new[2][:1] == (float,) else "number"
        what = f"CONST {_arg(new[2])} (was {_arg(old[2])}) {where}: a Python {kind} that changes every step: "
        what += "pass it as a Tensor"
    elif new[0] is Ops.BUFFER and old[0] is Ops.BUFFER:
        what = f"{_describe(new)} (was {_describe(old)}) {where}: an input of another shape or dtype"
    elif new[0] is old[0] and new[1] == old[1] and new[3] == old[3]:
        what = f"{_describe(new)} (was {_arg(old[2])}) {where}: the same op with another argument (shape, axis)"
    else:
        what = f"{_describe(new)} (was {_describe(old)}) {where}: a different computation"
    return f"realize: plan cache miss; the closest cached plan differs first at {what}"


def print_kernels(cp: Any, ptrs: Any, ns: Any, debug: int, writes_given: bool) -> None:
    """DEBUG>=2: one line per kernel of a run of `cp` (a realize.CompiledPlan) from the plan's own timers; DEBUG>=3
    runs the plan again (warm caches, no first-touch page faults) unless it writes into one of its inputs or into
    storage the caller gave it."""
    again = None
    in_place = writes_given or cp.writes_input
    if debug >= 3 and not in_place:
        again = (ctypes.c_longlong * len(cp.kernels))()
        cp.fn(ptrs, again, (ctypes.c_longlong * ERROR_RECORD)())
    skipped = cp.kept.skipped(ptrs)
    for i, k in enumerate(cp.kernels):
        if i in skipped:
            print(f"  {k.name:24s}     kept  (its inputs unchanged since it last ran: not run)  {k.op}")
            continue
        dt = max(ns[i] * 1e-9, 1e-9)
        extra = ""
        if again is not None:
            extra = f"  (again: {again[i] * 1e-6:.3f} ms)"
            if k.opts is not None:
                extra += f"  {k.opts}"
        print(
            f"  {k.name:24s} {dt * 1e3:8.3f} ms  {k.flops / dt / 1e9:7.2f} GFLOP/s  {k.nbytes / dt / 1e9:7.2f} GB/s  "
            f"{k.op}{extra}"
        )

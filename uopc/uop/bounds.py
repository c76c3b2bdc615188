"""Inclusive bounds of an integer index expression (UOp.vmin / UOp.vmax), from RANGE sizes, Variables and constants.

The lowering and the index simplifier (symbolic.py) ask every index node for its range: `r * 4 + 3` over a RANGE of
8 lies in [3, 31]. A value the rules do not bound gets its dtype's range (a float: -inf..inf).
"""

from __future__ import annotations

import math
from typing import Any

from uopc.uop.ops import Ops


def bounds(u: Any) -> tuple[Any, Any]:
    """Inclusive (min, max) of an index expression (a UOp), from RANGE sizes and constants."""
    op, s = u.op, u.src
    if op is Ops.CONST:
        return u.arg, u.arg
    if op is Ops.RANGE:
        return 0, s[0].vmax - 1
    if op is Ops.DEFINE_VAR:
        return u.arg.vmin, u.arg.vmax
    if op is Ops.CHECK:  # a checked index is always in range (a bad one is recorded and replaced by 0)
        return 0, u.arg[0] - 1
    if u.dtype is not None and u.dtype.is_bool:
        return False, True
    if u.dtype is None or not u.dtype.is_int:
        return -math.inf, math.inf
    if u.dtype.count > 1:  # a vector of indices (codegen.lanes: a PAD gate's, per lane): any of its type's values
        return u.dtype.scalar().min, u.dtype.scalar().max
    lo, hi = u.dtype.min, u.dtype.max
    if op is Ops.ADD:
        return max(lo, s[0].vmin + s[1].vmin), min(hi, s[0].vmax + s[1].vmax)
    if op is Ops.MUL:
        c = [a * b for a in (s[0].vmin, s[0].vmax) for b in (s[1].vmin, s[1].vmax)]
        return max(lo, min(c)), min(hi, max(c))
    if op is Ops.NEG:
        return -s[0].vmax, -s[0].vmin
    if op is Ops.MAX:
        return max(s[0].vmin, s[1].vmin), max(s[0].vmax, s[1].vmax)
    if op is Ops.IDIV and s[1].op is Ops.CONST and s[1].arg > 0:
        return s[0].vmin // s[1].arg, s[0].vmax // s[1].arg
    if op is Ops.MOD and s[1].op is Ops.CONST and s[1].arg > 0:
        if s[0].vmin >= 0:
            return 0, min(s[0].vmax, s[1].arg - 1)
        return 0, s[1].arg - 1  # floor semantics: the sign follows the divisor
    if op is Ops.WHERE:
        return min(s[1].vmin, s[2].vmin), max(s[1].vmax, s[2].vmax)
    if op is Ops.CAST and s[0].dtype is not None and s[0].dtype.is_int:
        return max(lo, s[0].vmin), min(hi, s[0].vmax)
    return lo, hi

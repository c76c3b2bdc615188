"""Selects as C: `c ? a : b`, or, for a float select against +0.0 on a stored mask or an integer one against 0, a bit
mask (below).

data4[i] = uopc_keepf(data0[i], val);     /* where(mask, val, 0): val's bits ANDed with the mask's */
"""

from __future__ import annotations

import math

from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes

__all__ = ["gate_load", "render_where"]

# A float select between a value and +0.0 on a stored mask (a ReLU's or a max-pool's backward: where(mask, g, 0)) is
# the value's bits ANDed with the mask's: gcc compiled the select to a compare and jump wherever it kept the loop
# scalar (a pool window's taps interleaved: the vectorizer took 2 lanes), and a ReLU mask is a coin toss. The CNN
# step's 2x2 max-pool backward over (128, 16, 28, 28) with a stored ReLU mask: 2.3 -> 1.0 ms in a C harness on random
# data (the same code on a periodic mask ran 0.4-0.7 ms either way). Vectorized, the AND ran as fast as the blend
# (0.88 against 1.08 ms over 4M floats); on a condition computed by a compare it ran 9% slower, so only conditions
# that read a stored bool take it. The bits kept are the value's own: -0.0, NaN and inf pass through unchanged.
_KEEP = {
    dtypes.float32: ("uopc_keepf", "static inline float uopc_keepf(int c, float x) "
                     "{ return uopc_as_f32(uopc_as_u32(x) & (0u - (uint32_t)c)); }\n"),
    dtypes.float64: ("uopc_keep", "static inline double uopc_keep(int c, double x) "
                     "{ return uopc_as_f64(uopc_as_u64(x) & (0ull - (uint64_t)c)); }\n"),
}  # fmt: skip


# An integer select against 0 (an argmax's `hit ? weight : 0`: max pool's backward, argmax over a window) is the
# value ANDed with 0 - c, on any condition: where gcc keeps the loop scalar (the remainder of a 14-wide row of the
# CNN step's 2x2 argmax) the select was a compare and jump; that kernel ran 0.35 -> 0.25 ms in a C harness, its
# vectorized part as fast.


def _reads_mask(c: UOp) -> bool:
    """Is bool `c` computed from a stored bool (a mask loaded from memory) by logic ops alone?"""
    if c.op is Ops.LOAD:
        return c.dtype is dtypes.bool
    return (
        c.dtype is dtypes.bool
        and c.op in (Ops.AND, Ops.OR, Ops.XOR, Ops.MUL, Ops.ADD)
        and any(_reads_mask(s) for s in c.src)
    )


def _is_pos_zero(x: UOp) -> bool:
    return x.op is Ops.CONST and x.arg == 0 and not math.copysign(1.0, x.arg) < 0


def _kept(u: UOp) -> tuple[UOp, bool] | None:
    """(the value, whether it is kept where the condition holds) of a select of a value against +0.0, else None."""
    if u.op is not Ops.WHERE:
        return None
    if _is_pos_zero(u.src[2]):
        return u.src[1], True
    if _is_pos_zero(u.src[1]):
        return u.src[2], False
    return None


def render_where(r, u: UOp) -> str:
    """C for WHERE `u` (r: the uopc.renderer.c.CRenderer rendering it). A select against +0.0 of one against +0.0
    (where(mask, where(tap == argmax, g, 0), 0): a max-pool's backward) takes both conditions into one mask."""
    c, a, b = u.src
    if c.dtype.count > 1 and c.dtype.is_int:  # a vector mask (codegen.lanes): a's bits where its lane is set, else b's
        it, m = c.dtype.cname, r.expr(c)
        return f"(({u.dtype.cname})((({it}){r.expr(a)} & {m}) | (({it}){r.expr(b)} & ~{m})))"
    if u.dtype.is_int and u.dtype.count == 1 and u.dtype is not dtypes.bool and (kept := _kept(u)) is not None:
        x, when = kept  # an integer against 0: its bits ANDed with 0 - c (see above _reads_mask)
        cond = r.expr(c) if when else f"!{r.expr(c)}"
        return f"({r.expr(x)} & ({u.dtype.cname})(0 - ({u.dtype.cname})({cond})))"
    if u.dtype in _KEEP and _reads_mask(c) and (kept := _kept(u)) is not None:
        name, code = _KEEP[u.dtype]
        r.use_bits()
        r.use(name, code)
        conds = []
        while kept is not None:
            x, when = kept
            conds.append(r.expr(u.src[0]) if when else f"!{r.expr(u.src[0])}")
            u, kept = x, _kept(x)
        return f"{name}({' & '.join(conds)}, {r.expr(u)})"
    return f"({r.expr(c)}?{r.expr(a)}:{r.expr(b)})"


def gate_load(r, dtype, gate: str, raw: str, zero: str) -> str:
    """C for a PAD load's value: `raw`, the element read unconditionally, where `gate` holds, else `zero`. A float's
    bits are ANDed with the gate's mask (uopc_keepf), not selected: gcc 12 turned `gate ? raw : 0` into a masked
    load, and a masked load at a stride (a window's tap over the output's innermost loop) stopped its vectorizer. A
    depthwise 3x3 stride-2 convolution's window sum over 8 x 96 x 112 x 112, its window unrolled: 3.1-3.9 ms
    scalar, 1.1-1.7 ms vectorized (a C harness, the same bits)."""
    if dtype not in _KEEP:
        return f"({gate}?{raw}:{zero})"
    name, code = _KEEP[dtype]
    r.use_bits()
    r.use(name, code)
    return f"{name}({gate}, {raw})"

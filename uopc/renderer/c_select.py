"""Selects as C. A scalar float select is bit arithmetic, never `c ? a : b`, and so is an integer one against 0:

data4[i] = uopc_keepf(alu3 < 0.0f, val);         /* where(c, val, 0): val's bits ANDed with c's mask */
data4[i] = uopc_selectf(6.0f < alu5, 6.0f, alu5); /* where(c, a, b): a's bits where c holds, b's elsewhere */

Wherever gcc keeps a loop scalar, it compiled a float select to compare-and-jump (its phi optimization first moves
an accumulator's add into both arms), and on data a coin toss mispredicts half of them: the CNN step's max-pool
backward on a ReLU mask, 2.3 -> 1.0 ms in a C harness on random data; MobileNetV2's head, relu6(BatchNorm(x))
averaged over 1280 x 7 x 7 (four channels' sums interleaved, so not vectorized), 0.28 ms -> 6 us. Where gcc
vectorizes the loop it compiles the bits back to the same compare and masked move as the select (gcc 12, AVX-512:
4M floats, 1.54-1.63 ms either way; relu6 over 1M, 0.08 against 0.11 ms). The bits kept are the values' own: -0.0,
NaN and inf pass through unchanged. Both values are computed: they are loads already read and ALU values, no call
that a branch would skip.
"""

from __future__ import annotations

import math

from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes

__all__ = ["gate_load", "render_where"]

# name and C of: a float kept where c holds (else +0.0), and a float select between two values
_KEEP = {
    dtypes.float32: ("uopc_keepf", "static inline float uopc_keepf(int c, float x) "
                     "{ return uopc_as_f32(uopc_as_u32(x) & (0u - (uint32_t)c)); }\n"),
    dtypes.float64: ("uopc_keep", "static inline double uopc_keep(int c, double x) "
                     "{ return uopc_as_f64(uopc_as_u64(x) & (0ull - (uint64_t)c)); }\n"),
}  # fmt: skip
_SELECT = {
    dtypes.float32: ("uopc_selectf", "static inline float uopc_selectf(int c, float a, float b) { uint32_t m = 0u - "
                     "(uint32_t)c; return uopc_as_f32((uopc_as_u32(a) & m) | (uopc_as_u32(b) & ~m)); }\n"),
    dtypes.float64: ("uopc_select", "static inline double uopc_select(int c, double a, double b) { uint64_t m = 0ull - "
                     "(uint64_t)c; return uopc_as_f64((uopc_as_u64(a) & m) | (uopc_as_u64(b) & ~m)); }\n"),
}  # fmt: skip


# An integer select against 0 (an argmax's `hit ? weight : 0`: max pool's backward, argmax over a window) is the
# value ANDed with 0 - c: where gcc keeps the loop scalar (the remainder of a 14-wide row of the CNN step's 2x2
# argmax) the select was a compare and jump; that kernel ran 0.35 -> 0.25 ms in a C harness, its vectorized part as
# fast. (Other integer selects are left to gcc, which makes them a cmov.)


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
        x, when = kept  # an integer against 0: its bits ANDed with 0 - c (see above)
        cond = r.expr(c) if when else f"!{r.expr(c)}"
        return f"({r.expr(x)} & ({u.dtype.cname})(0 - ({u.dtype.cname})({cond})))"
    if u.dtype not in _KEEP:
        return f"({r.expr(c)}?{r.expr(a)}:{r.expr(b)})"
    r.use_bits()
    if (kept := _kept(u)) is None:
        name, code = _SELECT[u.dtype]
        r.use(name, code)
        return f"{name}({r.expr(c)}, {r.expr(a)}, {r.expr(b)})"
    name, code = _KEEP[u.dtype]
    r.use(name, code)
    conds = []
    while kept is not None:
        x, when = kept
        conds.append(r.expr(u.src[0]) if when else f"!{r.expr(u.src[0])}")
        u, kept = x, _kept(x)
    return f"{name}({' & '.join(conds)}, {r.expr(u)})"


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

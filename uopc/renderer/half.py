"""float16 and bfloat16 are storage types: before rendering, every ALU op on them computes in float32.

    data2[i] = val1 * val3;         (val1, val3: halves; C arithmetic on _Float16 ran in half precision with
                                     AVX512-FP16, in float elsewhere, so results depended on the CPU)
      ->  data2[i] = uopc_f16_st((uopc_f16_ld(val1) * uopc_f16_ld(val3)));      (in float, rounded once)

A lowered kernel goes in (after vectorize, before linearize); out comes the same kernel in which a 16-bit float is only
loaded, stored, selected by a gated load and converted to and from float32 (the renderer's integer conversions on the
bits). Each ALU op on 16-bit floats becomes the float32 op with its result rounded back: a primitive op rounds once,
as PyTorch rounds every op. A composite op (erf, softmax) is computed in float32 already: the Tensor layer casts its
inputs (`opmath` in uopc/tensor/elementwise.py), so nothing of it is here. Kernels without a 16-bit float are
returned as they are, so their C does not change.
"""

from __future__ import annotations

from uopc.uop import ALU, Ops, UOp
from uopc.uop.dtype import DType, dtypes, truncate
from uopc.uop.rewrite import PatternMatcher, UPat, graph_rewrite

__all__ = ["compute_in_float"]


def _wide(dt: DType) -> DType:
    """float32, or the float32 vector as wide as `dt`."""
    return dtypes.float32.vec(dt.count)


def _low(u: UOp) -> bool:
    return u.dtype is not None and u.dtype.is_16bit_float


def _alu_in_float(u: UOp) -> UOp | None:
    """op(a, b) on 16-bit floats -> round(op(float(a), float(b))); a comparison only widens its operands."""
    if not (_low(u) or any(_low(s) for s in u.src)):
        return None
    src = tuple(s.cast(_wide(s.dtype)) if _low(s) else s for s in u.src)
    out = UOp(u.op, src, u.arg, _wide(u.dtype) if _low(u) else u.dtype)
    return out.cast(u.dtype) if _low(u) else out


def _cast_through_float(u: UOp, x: UOp) -> UOp | None:
    """A conversion to or from a 16-bit float goes through float32, so only those two conversions are rendered:
    half -> int is (int)(float)h, double -> half is (half)(float)d (as PyTorch converts)."""
    if _low(x) and u.dtype.scalar() is not dtypes.float32:
        return x.cast(_wide(x.dtype)).cast(u.dtype)
    if _low(u) and x.dtype.scalar() is not dtypes.float32:
        return x.cast(_wide(u.dtype)).cast(u.dtype)
    return None


def _cast_const(u: UOp, c: UOp) -> UOp | None:
    return UOp.const(truncate(c.dtype, c.arg), u.dtype) if _low(c) and u.dtype is dtypes.float32 else None


rules = PatternMatcher(
    [
        # round(float(h)) -> h: a 16-bit value widened is exact, so rounding it back gives the value itself
        (
            UPat(Ops.CAST, name="u", src=(UPat(Ops.CAST, src=(UPat.var("h"),)),)),
            lambda u, h: h if h.dtype is u.dtype and _low(h) and u.src[0].dtype is _wide(h.dtype) else None,
        ),
        # float(c) of a 16-bit constant -> the float32 constant of its 16-bit value
        (UPat(Ops.CAST, name="u", src=(UPat(Ops.CONST, name="c"),)), _cast_const),
        # T(h) -> T(float(h)), h(x) -> h(float(x)) for every other T and x
        (UPat(Ops.CAST, name="u", src=(UPat.var("x"),)), _cast_through_float),
        # op(a, b) -> h(op(float(a), float(b))) for every other ALU op: computed in float32, rounded back once
        (UPat(ALU - {Ops.CAST}, name="u"), _alu_in_float),
    ]
)


def compute_in_float(ast: UOp) -> UOp:
    """The lowered kernel `ast` with every ALU op on float16 or bfloat16 computed in float32 (see the module
    docstring); `ast` itself when it holds no 16-bit float."""
    if not any(_low(u) for u in ast.toposort()):
        return ast
    return graph_rewrite(ast, rules)

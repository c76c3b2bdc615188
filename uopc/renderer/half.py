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

__all__ = ["bf16_widening", "c_conversion", "compute_in_float"]


def _wide(dt: DType) -> DType:
    """float32, or the float32 vector as wide as `dt`."""
    return dtypes.float32.vec(dt.count)


def _low(u: UOp) -> bool:
    return u.dtype is not None and u.dtype.is_16bit_float


def _alu_in_float(u: UOp) -> UOp | None:
    """op(a, b) on 16-bit floats -> round(op(float(a), float(b))); a comparison only widens its operands. A select
    of 16-bit values stays one: it computes nothing, and a KV cache's in-place write where(here, new, cache) keeps
    the form the renderer stores only where the condition holds."""
    if not (_low(u) or any(_low(s) for s in u.src)):
        return None
    if u.op is Ops.WHERE and _low(u) and u.src[1].dtype is u.dtype and u.src[2].dtype is u.dtype:
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


# ---------------------------------------------------------------- the C conversions the renderer uses

# float16 and bfloat16 values are their bits in an unsigned short, converted to and from float by integer operations
# (exact, rounding to nearest even, NaN staying a quiet NaN). gcc vectorizes these at full width; it vectorizes
# no _Float16 conversion without AVX512-FP16 (gcc 12: "unsupported data-type"), and with it, it narrows
# (_Float16)((float)a * (float)b) to vmulph and contracts the add after it into a half FMA (results would depend on
# the CPU). Measured on a Zen 4: a*b + c over 2^24 halves 22 ms, against 34 ms with _Float16 (scalar vcvtph2ps).
# float16: a normal half rebiases its exponent by 127 - 15 = 112; a subnormal is (2^-14 + m 2^-24) - 2^-14 in
# normal floats (no float denormal is touched, so flush-to-zero modes do not matter); below 2^-14 the FPU rounds
# |x| + 0.5 to a multiple of 2^-24; from 65520 up (a carry into exponent 31) it is inf
_F16 = """static inline float uopc_f16_ld(unsigned short h) {
  unsigned int u = (unsigned int)(h & 0x7FFFu) << 13, e = u & 0x0F800000u, t = u + 0x38800000u, s, r;
  float f;
  __builtin_memcpy(&f, &t, 4);
  f -= 6.103515625e-05f;
  __builtin_memcpy(&s, &f, 4);
  r = e == 0x0F800000u ? u + 0x70000000u : e == 0 ? s : u + 0x38000000u;
  r |= (unsigned int)(h & 0x8000u) << 16;
  __builtin_memcpy(&f, &r, 4);
  return f;
}
static inline unsigned short uopc_f16_st(float x) {
  unsigned int u, a, d, r;
  float f;
  __builtin_memcpy(&u, &x, 4);
  a = u & 0x7FFFFFFFu;
  __builtin_memcpy(&f, &a, 4);
  f += 0.5f;
  __builtin_memcpy(&d, &f, 4);
  r = (a + 0xC8000FFFu + ((a >> 13) & 1u)) >> 13;
  r = a >= 0x47800000u ? (a > 0x7F800000u ? 0x7E00u : 0x7C00u) : a < 0x38800000u ? d - 0x3F000000u : r;
  return (unsigned short)(r | ((u >> 16) & 0x8000u));
}
"""
# bfloat16 is the top 16 bits of a float32
_BF16 = """static inline float uopc_bf16_ld(unsigned short b) {
  unsigned int u = (unsigned int)b << 16; float f; __builtin_memcpy(&f, &u, 4); return f;
}
static inline unsigned short uopc_bf16_st(float f) {
  unsigned int u; __builtin_memcpy(&u, &f, 4);
  if (f != f) return (unsigned short)((u >> 16) | 0x40);
  return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
"""
_CONVERT = {dtypes.float16: ("f16", _F16), dtypes.bfloat16: ("bf16", _BF16)}


def bf16_widening(fn: str, n: int, f32_type: str, bf16_type: str) -> str:
    """The C of `f32_type fn(bf16_type v)`: n bfloat16 lanes widened to float32, each pattern zero-extended and
    shifted into a float's top half (see c_conversion for why lane by lane)."""
    lanes = ", ".join(f"v[{i}]" for i in range(n))
    return (
        f"typedef unsigned int uopc_u32x{n} __attribute__((vector_size({4 * n})));\n"
        f"static inline {f32_type} {fn}({bf16_type} v) "
        f"{{ uopc_u32x{n} w = {{{lanes}}}; return ({f32_type})(w << 16); }}\n"
    )


def c_conversion(to: DType, frm: DType) -> tuple[str, str, str] | None:
    """How C converts a value of dtype `frm` to `to` where one of them is a 16-bit float: (the helper's key, its C,
    the function to call), or None for other casts. Scalars go through float32 (compute_in_float leaves no other
    conversion of them); the one vector form is bfloat16 lanes widened to float32 (uopc.codegen.vectorize), each
    16-bit pattern zero-extended and shifted into a float's top half (vpmovzxwd, vpslld). The 32-bit vector is built
    lane by lane: gcc 12 compiles that to one zero-extending load, where __builtin_convertvector(v, u32) split 16
    lanes into two halves and joined them again (six instructions a vector: a bf16 GEMV at 28-34 GB/s)."""
    if to.count > 1 and frm.scalar() is dtypes.bfloat16 and to.scalar() is dtypes.float32:
        fn = f"uopc_bf16x{to.count}_ld"
        return fn, bf16_widening(fn, to.count, to.cname, frm.cname), fn
    for dt, way in ((to, "st"), (frm, "ld")):
        if dt in _CONVERT:
            tag, code = _CONVERT[dt]
            return f"uopc_{tag}", code, f"uopc_{tag}_{way}"
    return None

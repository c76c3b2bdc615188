"""Math ops as C: float32 exp2, log2 and sin as branch-free inline functions gcc vectorizes, exp2 on gcc vectors.

    data1[ridx0] = uopc_exp2f(val1);      /* instead of exp2f(val1), a libm call per element */

exp2 runs in float: the reduction x - rint(x) is exact and the degree-7 polynomial with FMAs stays within 1 ulp (checked
over every float32 input once, and by tests/backend/test_transcendental.py's sweep), so 16 lanes per AVX-512 vector
instead of 8 doubles; the softmax sum pass runs in half the time. log2 and sin reduce and evaluate in double, so one
final rounding gives <= 1 ulp; double also holds every 2^n a float result needs. exp2 assembles its result in integers
(n into p's exponent bits, a subnormal's bits by rint), not by a final multiply, so that -fassociative-math cannot
regroup a multiply that follows into its scaling: exp2(200) * 0.25 stays inf * 0.25 = inf. NaN compares false
everywhere and so stays NaN. sin reduces |x| >= 0.5 by pi/2 with a table of 2/pi's bits per exponent (Payne-Hanek,
in integers): exact enough for the float nearest a multiple of pi/2, however large. float64 keeps libm; float16 goes
through float32.
"""

from __future__ import annotations

import math

from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes

__all__ = ["F32_BITS", "F32_MATH", "MATH", "render_math"]


def _horner(var: str, coeffs: list[float], suffix: str = "") -> str:
    """c0 + var*(c1 + var*(c2 + ...)) with exact Python float reprs (suffix "f": float literals)."""
    return (" + " + var + "*(").join(repr(c) + suffix for c in coeffs) + ")" * (len(coeffs) - 1)


def _two_over_pi(bits: int) -> int:
    """floor(2/pi * 2^bits), from Machin's formula in integers."""

    def atan_inv(n: int, b: int) -> int:  # atan(1/n) * 2^b
        s, t, k = 0, (1 << b) // n, 0
        while t:
            s += t // (2 * k + 1) if k % 2 == 0 else -(t // (2 * k + 1))
            t //= n * n
            k += 1
        return s

    pi = 16 * atan_inv(5, bits + 16) - 4 * atan_inv(239, bits + 16)  # pi * 2^(bits+16), good to ~2^-bits
    return (1 << (2 * bits + 17)) // pi


# sin's reduction is integer arithmetic (-fassociative-math may regroup float sums, never integer ones): for
# x = M * 2^E (M the 24-bit integer significand), a table row holds (2^E * 2/pi) mod 4 as a fixed-point number with 2
# integer and 94 fractional bits in three 32-bit words; M times it, kept to 62 fractional bits, is x * 2/pi mod 4.
_E0, _E1 = -24, 104  # |x| >= 0.5 .. the largest float


def _sin_table() -> list[tuple[int, int, int]]:
    g = _two_over_pi(400)
    rows = []
    for e in range(_E0, _E1 + 1):
        v = (g >> (400 - e - 94)) % (1 << 96)
        rows.append((v >> 64, (v >> 32) & 0xFFFFFFFF, v & 0xFFFFFFFF))
    return rows


_EXP2F = _horner("f", [math.log(2) ** k / math.factorial(k) for k in range(8)], "f")
_LOG2 = _horner("s2", [2 / (k * math.log(2)) for k in (1, 3, 5, 7, 9, 11)])
_SIN = _horner("r2", [(-1) ** k / math.factorial(2 * k + 1) for k in range(6)])
_COS = _horner("r2", [(-1) ** k / math.factorial(2 * k) for k in range(7)])
_TAB = ",\n".join(f"  {{{a}u, {b}u, {c}u}}" for a, b, c in _sin_table())

F32_BITS = """static inline double uopc_as_f64(uint64_t i) { double d; __builtin_memcpy(&d, &i, 8); return d; }
static inline uint64_t uopc_as_u64(double d) { uint64_t i; __builtin_memcpy(&i, &d, 8); return i; }
static inline uint32_t uopc_as_u32(float f) { uint32_t i; __builtin_memcpy(&i, &f, 4); return i; }
static inline float uopc_as_f32(uint32_t i) { float f; __builtin_memcpy(&f, &i, 4); return f; }
"""

EXP2F = f"""static inline float uopc_exp2f(float x) {{
  float d = x < -151.0f ? -151.0f : x;  /* below, the result is 0 (from 128 on, inf: the last select) */
  float n = __builtin_rintf(d);
  float f = d - n;  /* exact, in [-0.5, 0.5]: 2^f by its Taylor series to f^7 (truncation < 1e-8 relative) */
  float p = {_EXP2F};
  /* p * 2^n is built in integers, so that the result is no float product: -fassociative-math may regroup a final
     p * 2^n1 * 2^n2 with a multiply that follows (exp2(200) * 0.25 as p * 2^64 * (2^65 * 0.25) = 1.7e38, not inf;
     exp2(-200) * 2^60 as 4e-28, not 0), but never into an integer operation or a rounding to an integer (gcc does
     move it into the selects' arms below, where it multiplies a finished value). n is converted where it is below
     129 only (not NaN, not past an int), one compare: a clamp of x from above too cost a compare and a blend more. */
  int ni = (int)(n < 129.0f ? n : 0.0f);
  uint32_t pb = uopc_as_u32(p);
  uint32_t sh = (uint32_t)ni << 23;
  uint32_t bits = pb + sh;  /* a normal result: n added to p's exponent */
  /* below 2^-126 a float's bits, read as an integer, are its value in units of 2^-149: p * 2^(n + 149) (< 2^23, the
     exponent added in integers: n + 149 in [-2, 23] keeps it normal and exact) rounded to nearest even, once. lo is
     n << 23 taken at most -126 << 23 (where this lane is not used), so that the conversion to int stays in range. */
  int32_t lo = (int32_t)sh < -(126 << 23) ? (int32_t)sh : -(126 << 23);
  uint32_t sub = (uint32_t)__builtin_irintf(uopc_as_f32(pb + (uint32_t)lo + (149u << 23)));  /* one vcvtps2dq */
  bits = x < -126.0f ? sub : bits;
  bits = x >= 128.0f ? 0x7f800000u : bits;  /* 2^x overflows from 128 on: the float below has 2^x < 2^128 (1 - 2^-18) */
  return uopc_as_f32(bits);
}}
"""

LOG2F = f"""static inline float uopc_log2f(float x) {{
  uint64_t i = uopc_as_u64((double)x);  /* float subnormals are normal doubles */
  double e = uopc_as_f64((i >> 52) | 0x4330000000000000ull) - 4503599627371519.0;  /* exponent - 1023, via 2^52 */
  double m = uopc_as_f64((i & 0x000fffffffffffffull) | 0x3ff0000000000000ull);  /* x = m * 2^e, m in [1, 2) */
  int big = m > 1.4142135623730951;
  m = big ? m * 0.5 : m;
  e = big ? e + 1.0 : e;
  double s = (m - 1.0) / (m + 1.0);  /* log2(m) = 2/ln2 * atanh(s), |s| < 0.172 */
  double s2 = s * s;
  double r = e + s * ({_LOG2});
  r = x == 0.0f ? -INFINITY : r;
  r = x < 0.0f ? NAN : r;
  r = x == INFINITY ? INFINITY : r;
  return x != x ? x : (float)r;
}}
"""

SINF = f"""static const uint32_t uopc_two_over_pi[{_E1 - _E0 + 1}][3] = {{
{_TAB}
}};
static inline float uopc_sinf(float x) {{
  float ax = __builtin_fabsf(x);
  uint32_t bits = uopc_as_u32(ax);
  int e = (int)(bits >> 23) - 150;  /* ax = m * 2^e */
  int row = e - {_E0};  /* clamped as plain min/max: branches would let PRE make the table loads conditional */
  row = row < 0 ? 0 : row;
  row = row > {_E1 - _E0} ? {_E1 - _E0} : row;
  uint64_t m = (bits & 0x7fffffu) | 0x800000u;
  uint64_t p2 = m * uopc_two_over_pi[row][2];
  uint64_t p1 = m * uopc_two_over_pi[row][1] + (p2 >> 32);
  uint64_t p0 = m * uopc_two_over_pi[row][0] + (p1 >> 32);
  uint64_t t = (p0 << 32) | (p1 & 0xffffffffu);  /* ax * 2/pi mod 4, 62 fractional bits */
  uint64_t k = (t + (1ull << 61)) >> 62;  /* the nearest multiple of pi/2, mod 4 (a carry out is 4 = 0) */
  double r = (double)(int64_t)(t - (k << 62)) * {math.pi / 2 / 2.0**62!r};  /* ax - k*pi/2 in [-pi/4, pi/4] */
  /* |x| < 0.5 is its own reduction, blended in by arithmetic so that no table load depends on a condition
     (gcc cannot vectorize a masked gather) */
  double small = (double)(ax < 0.5f);
  r = r * (1.0 - small) + (double)ax * small;
  int q = (int)(k & 3u) & ((int)small - 1);
  double r2 = r * r;
  double v = (q & 1) ? {_COS} : r * ({_SIN});
  v = (q & 2) ? -v : v;
  v = x < 0.0f ? -v : v;
  return (ax == INFINITY) | (x != x) ? NAN : (float)v;
}}
"""

# op -> (C function name, its definition)
F32_MATH = {Ops.EXP2: ("uopc_exp2f", EXP2F), Ops.LOG2: ("uopc_log2f", LOG2F), Ops.SIN: ("uopc_sinf", SINF)}


MATH = {  # op -> (float, double) C function: gcc's builtins, which are libm's functions without <math.h>
    Ops.SQRT: ("__builtin_sqrtf", "__builtin_sqrt"),
    Ops.EXP2: ("__builtin_exp2f", "__builtin_exp2"),
    Ops.LOG2: ("__builtin_log2f", "__builtin_log2"),
    Ops.SIN: ("__builtin_sinf", "__builtin_sin"),
    Ops.TRUNC: ("__builtin_truncf", "__builtin_trunc"),
}


# exp2 on a gcc vector (uopc.codegen.lanes: a GEMM's SiLU, sigmoid, tanh or GELU epilogue) is written in gcc's vector
# arithmetic, so that it is vector code at any optimization level: the register-tiled kernels that apply it compile at
# -O1 (uopc.renderer.c.TILED_OPTIMIZE), which vectorizes no loop. The scalar function lane by lane in a loop stayed
# scalar there, and called as an -O3 function the tile's registers spilled around each call: a 1x1 convolution with
# BatchNorm and SiLU ran 1.1-1.3x the time of the GEMM and a separate kernel. Where the compiler targets AVX-512 (VL
# for 8 lanes), n = rint(x) is one vrndscaleps and p * 2^n one vscalefps, which rounds a subnormal result once and
# gives inf past the range and NaN for NaN (x clamped to +-160 first, so that inf - rint(inf) is no NaN): 12
# instructions, bit for bit EXP2F's result for every float32 input. Elsewhere it is EXP2F's steps with integer vectors
# for its selects (n = floor(d + 0.5) by a conversion of d + 256.5, positive as d >= -151; a subnormal result rounded
# half up, not to even), ~30 instructions, within 1 ulp of EXP2F for every input.
EXP2F_VECTOR = """static inline __attribute__((always_inline)) {vt} {name}({vt} x) {{
  typedef int it __attribute__((vector_size({size})));
#if {test}
  /* max and min return their second operand where either is NaN: NaN stays NaN */
  {vt} d = {min}(({vt}){{0}} + 160.0f, {max}(({vt}){{0}} - 160.0f, x{minmax}){minmax});
  {vt} n = {rndscale}(d, 8{masked});
  {vt} f = d - n;
  {vt} p = {poly};
  return {scalef}(p, n{masked});
#else
  typedef unsigned ut __attribute__((vector_size({size})));
  it lo = x < -151.0f, hi = x > 129.0f;  /* clamped: the conversion below stays in range; NaN passes through */
  {vt} d = ({vt})(((it)x & ~(lo | hi)) | ((it)(({vt}){{0}} - 151.0f) & lo) | ((it)(({vt}){{0}} + 129.0f) & hi));
  it ni = __builtin_convertvector(d + 256.5f, it) - 256;
  {vt} f = d - __builtin_convertvector(ni, {vt});  /* exact, in [-0.5, 0.5] */
  {vt} p = {poly};
  ni &= (it)(x < 129.0f);  /* NaN: p is NaN and keeps its bits */
  ut pb = (ut)p, sh = (ut)ni << 23, bits = pb + sh;
  it m = (it)sh < -(126 << 23);
  ut lo2 = (ut)(((it)sh & m) | (-(126 << 23) & ~m));
  ut sub = (ut)__builtin_convertvector(({vt})(pb + lo2 + (149u << 23)) + 0.5f, it);
  ut small = (ut)(x < -126.0f), big = (ut)(x >= 128.0f);
  bits = (sub & small) | (bits & ~small);
  return ({vt})((0x7f800000u & big) | (bits & ~big));
#endif
}}
"""
# vector bytes -> the preprocessor test for vrndscaleps and vscalefps on them (the builtins are gcc's names), gcc's
# builtins for those, max and min, and the arguments that make a masked builtin apply to every lane (AVX's 8-lane max
# and min take none)
_AVX512 = {
    64: {
        "test": "defined(__AVX512F__) && !defined(__clang__)",
        "rndscale": "__builtin_ia32_rndscaleps_mask",
        "scalef": "__builtin_ia32_scalefps512_mask",
        "max": "__builtin_ia32_maxps512_mask",
        "min": "__builtin_ia32_minps512_mask",
        "masked": ", x, (unsigned short)-1, 4",
        "minmax": ", x, (unsigned short)-1, 4",
    },
    32: {
        "test": "defined(__AVX512VL__) && !defined(__clang__)",
        "rndscale": "__builtin_ia32_rndscaleps_256_mask",
        "scalef": "__builtin_ia32_scalefps256_mask",
        "max": "__builtin_ia32_maxps256",
        "min": "__builtin_ia32_minps256",
        "masked": ", x, (unsigned char)-1",
        "minmax": "",
    },
}
# any other width (or no AVX-512): the generic form, which names none of them
_GENERIC = {"test": "0"} | dict.fromkeys(("rndscale", "scalef", "max", "min", "masked", "minmax"), "")


def render_math(r, u: UOp) -> str:
    """C of math op `u` (r: the uopc.renderer.c.CRenderer rendering it): gcc's builtin or uopc's own float32 function;
    on a gcc vector of float32 (uopc.codegen.lanes; only EXP2 is lowered to one, VECTOR_MATH), EXP2F_VECTOR."""
    scalar = u.dtype.scalar()
    if u.dtype.count > 1:
        if u.op is not Ops.EXP2 or scalar is not dtypes.float32:
            raise NotImplementedError(f"render_math: no vector form of {u.op.name} on {u.dtype}")
        vt, name, size = u.dtype.cname, f"uopc_exp2f_x{u.dtype.count}", u.dtype.itemsize
        fields = _AVX512.get(size, _GENERIC)
        r.use(name, EXP2F_VECTOR.format(vt=vt, name=name, size=size, poly=_EXP2F, **fields))
        return f"{name}({r.expr(u.src[0])})"
    f, d = MATH[u.op]
    if u.op in F32_MATH and scalar is not dtypes.float64:  # uopc's own vectorizable float32 code
        f, code = F32_MATH[u.op]
        r.use_bits()
        r.use(f, code)
    return f"{d if scalar is dtypes.float64 else f}({r.expr(u.src[0])})"

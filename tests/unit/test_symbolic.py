"""Tests for uopc.uop.symbolic.simplify: constant folding as C computes in each dtype, algebraic identities (and the
float ones that must NOT apply), canonical operand order, div/mod folding from RANGE bounds, the Chapter 10
exercise 9 regression, and a hypothesis check that simplify never changes the value of integer index arithmetic."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import buf, gemm_graph, int_alu_rhs, render_graph
from uopc.codegen.rangeify import Opts
from uopc.uop import Ops, RangeArg, UOp
from uopc.uop.dtype import DType, dtypes
from uopc.uop.symbolic import simplify, symbolic

i32, f32, f64 = dtypes.int32, dtypes.float32, dtypes.float64
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def C(v, dt: DType = i32) -> UOp:
    return UOp.const(v, dt)


def rng(idx: int, size: int) -> UOp:
    return UOp(Ops.RANGE, (C(size),), RangeArg(idx), i32)


def folded(u: UOp):
    s = simplify(u)
    assert s.op is Ops.CONST, s.pretty()
    assert s.dtype is u.dtype
    return s.arg


# ------------------------------------------------------------------ constant folding


@pytest.mark.parametrize(
    "expr, want",
    [
        ("C(INT_MAX) + C(1)", INT_MIN),  # int32 wraps
        ("C(INT_MIN) + C(-1)", INT_MAX),
        ("C(65536) * C(65536)", 0),
        ("C(46341) * C(46341)", 46341 * 46341 - 2**32),
        ("-C(INT_MIN)", INT_MIN),
        ("C(200, dtypes.u8) + C(100, dtypes.u8)", 44),  # uint8 wraps
        ("C(3, dtypes.u8) * C(100, dtypes.u8)", 44),
        ("C(100, dtypes.i8) + C(100, dtypes.i8)", -56),
        ("C(2**62, dtypes.i64) * C(4, dtypes.i64)", 0),
        ("C(-7) // C(2)", -4),  # floor semantics, as Python
        ("C(-7) % C(2)", 1),
        ("C(7) // C(-2)", -4),
        ("C(7) % C(-2)", -1),
        ("C(-7) // C(-2)", 3),
        ("C(-7) % C(-2)", -1),
        ("C(-8) // C(2)", -4),
        ("C(-8) % C(2)", 0),
        ("C(7) // C(0)", 0),  # x // 0 == x % 0 == 0 (documented choice)
        ("C(-7) % C(0)", 0),
        ("C(INT_MIN) // C(-1)", INT_MIN),  # wraps
        ("C(INT_MIN) % C(-1)", 0),
        ("C(5).maximum(C(-9))", 5),
        ("C(3) < C(4)", True),
        ("C(3).ne(C(3))", False),
        ("C(6) & C(3)", 2),
        ("C(6) | C(3)", 7),
        ("C(6).alu(Ops.XOR, C(3))", 6 ^ 3),
        ("C(True, dtypes.bool) + C(True, dtypes.bool)", True),  # C _Bool: 1 + 1 stored as 1
    ],
)
def test_int_constant_folding(expr: str, want):
    # reference: Python ints with floor division, wrapped to the dtype; exact
    assert folded(eval(expr)) == want


@pytest.mark.parametrize(
    "expr, want",
    [
        ("C(16777216.0, f32) + C(1.0, f32)", 16777216.0),  # float32 rounding
        ("C(16777216.0, f64) + C(1.0, f64)", 16777217.0),
        ("C(0.1, f32) + C(0.2, f32)", float(np.float32(0.1) + np.float32(0.2))),
        ("C(0.1, f64) + C(0.2, f64)", 0.1 + 0.2),
        ("C(1.1, f32) * C(1.1, f32)", float(np.float32(1.1) * np.float32(1.1))),
        ("C(3e38, f32) * C(10.0, f32)", math.inf),  # float32 overflow
        ("C(3e38, f64) * C(10.0, f64)", 3e39),
        ("C(1.0, f32).alu(Ops.RECIP)", 1.0),
        ("C(3.0, f32).alu(Ops.RECIP)", float(np.float32(1) / np.float32(3))),
        ("C(2.0, f32).alu(Ops.SQRT)", float(np.sqrt(np.float32(2.0)))),
        ("C(128.0, f32).alu(Ops.EXP2)", math.inf),
        ("C(0.0, f32).alu(Ops.RECIP)", math.inf),
        ("C(0.0, f32).alu(Ops.LOG2)", -math.inf),
        ("C(-2.5, f32).alu(Ops.TRUNC)", -2.0),
        ("C(2.9, f32).cast(i32)", 2),  # C conversion truncates toward zero
        ("C(-2.9, f32).cast(i32)", -2),
        ("C(300, i32).cast(dtypes.u8)", 44),
        ("C(-1, i32).cast(dtypes.u8)", 255),
        ("C(16777217, i32).cast(f32)", 16777216.0),
        ("C(0.5, f32).cast(dtypes.bool)", True),  # nonzero -> 1, not int(0.5)
        ("C(True, dtypes.bool).cast(f32)", 1.0),
        ("C(1e300, f64).cast(f32)", math.inf),
        ("C(0.1, f64).cast(f32)", float(np.float32(0.1))),
    ],
)
def test_float_constant_folding(expr: str, want):
    # reference: NumPy scalars of the dtype (C arithmetic in that type); exact
    with np.errstate(all="ignore"):
        assert folded(eval(expr)) == want


def test_float_constant_folding_nan():
    # reference: IEEE 754 / np.maximum; exact
    nan = C(math.nan, f32)
    assert math.isnan(folded(C(-1.0, f32).alu(Ops.LOG2)))
    assert math.isnan(folded(C(-1.0, f32).alu(Ops.SQRT)))
    assert math.isnan(folded(C(math.inf, f32) + C(-math.inf, f32)))
    assert math.isnan(folded(nan.maximum(C(1.0, f32))))
    assert math.isnan(folded(C(1.0, f32).maximum(nan)))
    assert folded(nan < C(1.0, f32)) is False
    assert folded(nan.ne(nan)) is True


@pytest.mark.parametrize(
    "expr, want",
    [
        ("C(0.1, f32).cast(f64)", float(np.float32(0.1))),  # C: (double)0.1f == 0.10000000149011612
        ("C(16777217.0, f32).cast(i32)", 16777216),  # C: (int)16777217.0f == 16777216
        ("C(0.1, f32) < C(0.10000000001, f32)", False),  # both literals are the same float
        ("C(0.1, f32).ne(C(0.10000000001, f32))", False),
    ],
)
def test_folding_rounds_float32_constants_first(expr: str, want):
    # regression: folding CAST/CMPLT/CMPNE read a float32 CONST's unrounded double, not the C float literal it renders
    # reference: NumPy float32 scalars; exact
    assert folded(eval(expr)) == want


# ------------------------------------------------------------------ identities


def test_identities():
    xi, xf = buf(0, 4, i32), buf(1, 4, f32)
    assert simplify(xi + 0) is xi
    assert simplify(0 + xi) is xi
    assert simplify(xf + 0.0) is xf
    assert simplify(xi * 1) is xi
    assert simplify(1 * xi) is xi
    assert simplify(xf * 1.0) is xf
    assert simplify(xi * 0) is C(0)
    assert simplify(0 * xi) is C(0)
    xb = buf(2, 4, dtypes.bool)
    assert simplify(xb & True) is xb and simplify(xb | False) is xb
    assert simplify(xb & False) is C(False, dtypes.bool) and simplify(xb | True) is C(True, dtypes.bool)
    nxf = -xf
    assert simplify(-nxf) is xf
    assert simplify(xf.maximum(xf)) is xf
    assert simplify(xf.cast(f32)) is xf


def test_one_rule_per_identity_for_int_and_float():
    # x+0, x*1 and x*0 are one rule each, whatever the constant's Python type; the rule decides by dtype
    def rules(op: Ops, value: float) -> int:
        """How many rules match op(x, CONST value) with a number (not a bool) as the pattern's value."""
        found = 0
        for pat, _ in symbolic.rules:
            c = pat.src[1] if pat.ops == {op} and pat.src and len(pat.src) == 2 else None
            if c is not None and c.ops == {Ops.CONST} and type(c.arg) in (int, float) and c.arg == value:
                found += 1
        return found

    assert (rules(Ops.ADD, 0), rules(Ops.MUL, 1), rules(Ops.MUL, 0)) == (1, 1, 1)
    for dt in (i32, dtypes.u8, dtypes.i64, f32, f64, dtypes.f16, dtypes.bf16):
        x = buf(0, 4, dt)
        assert simplify(x + UOp.const(0, dt)) is x, dt
        assert simplify(x * UOp.const(1, dt)) is x, dt
        zero = simplify(x * UOp.const(0, dt))
        if dt.is_float:
            assert zero.op is Ops.ADD and x in zero.src, dt  # x+(-x), as below
        else:
            assert zero is UOp.const(0, dt), dt
    # a bool is not a number here: x*False is the bool rule's, and True does not stand for 1
    xb = buf(1, 4, dtypes.bool)
    assert simplify(xb * False) is C(False, dtypes.bool)
    assert simplify(xb * True) is xb * True


def test_float_times_zero_is_not_folded_to_zero():
    # x*0 is NaN for x = NaN or inf: only the integer form may fold to 0; the float form becomes x+(-x), which
    # keeps NaN/inf (gcc folds a literal x*0.0f to 0 under -fno-signed-zeros)
    xf = buf(0, 4, f32)
    for u in (xf * 0.0, 0.0 * xf, xf * -0.0):
        s = simplify(u)
        assert s.op is Ops.ADD and xf in s.src and any(v.op is Ops.NEG and v.src[0] is xf for v in s.src)


def test_where_with_constant_condition():
    a, b = buf(0, 4), buf(1, 4)
    assert simplify(C(True, dtypes.bool).where(a, b)) is a
    assert simplify(C(False, dtypes.bool).where(a, b)) is b
    assert simplify((C(1) < C(2)).where(a, b)) is a
    c = buf(2, 4, dtypes.bool)
    assert simplify(c.where(a, a)) is a
    assert simplify(c.where(a, b)) is c.where(a, b)


# ------------------------------------------------------------------ canonical order


def test_canonical_operand_order():
    a, b, c = buf(0, 4), buf(1, 4), buf(2, 4)
    assert simplify(a + b) is simplify(b + a)
    assert simplify(a * b) is simplify(b * a)
    assert simplify(a.maximum(b)) is simplify(b.maximum(a))
    assert simplify(a.ne(b)) is simplify(b.ne(a))
    assert simplify((a * b) + c) is simplify(c + (b * a))
    assert simplify((a + b).alu(Ops.EXP2) * c) is simplify(c * (b + a).alu(Ops.EXP2))
    # constants go last
    s = simplify(2.0 * a)
    assert s.op is Ops.MUL and s.src == (a, C(2.0, f32))
    r = rng(0, 8)
    s = simplify(3 + r * 4)
    assert s.op is Ops.ADD and s.src[1] is C(3)
    # CMPLT is not commutative and keeps its order
    assert simplify(b < a) is (b < a)


# ------------------------------------------------------------------ div/mod with RANGE bounds


def test_divmod_folding_with_range_bounds():
    r0, r1 = rng(0, 4), rng(1, 8)
    flat = r0 * 8 + r1
    assert simplify((flat // 8) % 4) is r0
    assert simplify(flat % 8) is r1
    assert simplify(flat // 8) is r0
    assert simplify(r1 // 8) is C(0) and simplify(r1 % 8) is r1
    assert simplify(r0 % 1) is C(0) and simplify(r0 // 1) is r0
    assert simplify((r1 // 2) // 2) is simplify(r1 // 4)
    assert simplify((r1 % 4) % 2) is simplify(r1 % 2)
    assert simplify((r0 * 8 + r1 + 16) // 8) is simplify(r0 + 2)
    assert simplify(r0 * 4 < C(16)) is C(True, dtypes.bool)
    assert simplify(r0 < C(0)) is C(False, dtypes.bool)


def test_index_check_proven_in_range_folds_away():
    # CHECK(i, err) with arg (size, which, lowest valid): only an index the bounds cannot place in 0..size-1 keeps it
    err, r = buf(9, 5, dtypes.int64), rng(0, 4)
    assert simplify(UOp(Ops.CHECK, (r + 1, err), (5, 0, 0))) is simplify(r + 1)
    assert simplify(UOp(Ops.CHECK, (C(2), err), (3, 0, -3))) is C(2)
    for j in (r + 2, C(-1), buf(0, 4, i32).index(C(0)).load()):  # may be 5; negative; data
        chk = UOp(Ops.CHECK, (j, err), (5, 0, -5))
        assert simplify(chk).op is Ops.CHECK


def test_mod_by_zero_is_not_reassociated():
    # regression: the (x % (k*d)) % d -> x % d rule fired for k*d == 0 (0 % d == 0), but x % 0 == 0
    r = rng(0, 10)
    s = simplify((r % 0) % 3)
    for v in range(10):
        assert folded(s.substitute({r: C(v)})) == 0


# ------------------------------------------------------------------ Chapter 10 exercise 9


def _norm(e: str):
    """A C expression as a tree whose commutative operands are sorted, so (a+b) and (b+a) compare equal."""
    e = e.strip()
    if e.startswith("(") and e.endswith(")"):
        depth = 0
        for i, ch in enumerate(e):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i != len(e) - 1:
                break
        else:
            inner = e[1:-1]
            depth = 0
            for i, ch in enumerate(inner):
                depth += ch == "("
                depth -= ch == ")"
                if depth == 0 and i > 0:
                    for op in ("!=", "+", "*", "&", "|", "^", "<", "/", "%"):
                        if inner.startswith(op, i):
                            left, right = _norm(inner[:i]), _norm(inner[i + len(op) :])
                            if op in ("+", "*", "&", "|", "^", "!="):
                                return (op, *sorted((left, right), key=repr))
                            return (op, left, right)
            if inner.startswith("-"):
                return ("neg", _norm(inner[1:]))
            return _norm(inner)
    return e


def test_norm_helper():
    assert _norm("(alu1+alu2)") == _norm("(alu2+alu1)")
    assert _norm("((ridx1*16)+ridx2)") == _norm("(ridx2+(16*ridx1))")
    assert _norm("(a+(b*c))") != _norm("((a+b)*c)")
    assert _norm("(a<b)") != _norm("(b<a)")


@pytest.mark.parametrize("upcast, bt", [({0: 2, 1: 2}, False), ({0: 2, 1: 2}, True), ({0: 4, 1: 4}, True)])
def test_upcast_gemm_has_no_duplicate_index_terms(upcast, bt):
    # regression: Chapter 10 exercise 9, alu3 = (alu1+alu2) and alu4 = (alu2+alu1) computed the same index twice
    src = render_graph(gemm_graph(8, 8, 8, bt=bt), 2, Opts(upcast=upcast))
    rhs = int_alu_rhs(src)
    assert rhs, src
    seen: dict = {}
    for name, e in rhs.items():
        key = _norm(e)
        assert key not in seen, f"{name} = {e} duplicates {seen.get(key)}\n{src}"
        seen[key] = f"{name} = {e}"
    # and the chapter's structure: two output loops plus one shared reduce loop
    assert src.count("for (") == 3
    assert len(re.findall(r"float acc\d+;", src)) == math.prod(upcast.values())


# ------------------------------------------------------------------ hypothesis: simplify keeps values

SIZES = (4, 3, 8)
RANGES = [rng(i, s) for i, s in enumerate(SIZES)]

_leaf = st.one_of(
    st.sampled_from([("r", i) for i in range(len(SIZES))]),
    st.integers(-9, 9).map(lambda c: ("c", c)),
)


def _extend(ch):
    return st.one_of(
        st.tuples(st.sampled_from(["+", "*", "-", "max"]), ch, ch),
        st.tuples(st.sampled_from(["//", "%"]), ch, st.integers(1, 9)),
    )


EXPRS = st.recursive(_leaf, _extend, max_leaves=10)


def _build(e) -> UOp:
    k = e[0]
    if k == "r":
        return RANGES[e[1]]
    if k == "c":
        return C(e[1])
    a = _build(e[1])
    if k in ("//", "%"):
        return a // e[2] if k == "//" else a % e[2]
    b = _build(e[2])
    return {"+": a + b, "*": a * b, "-": a - b, "max": a.maximum(b)}[k]


def _eval(e, env) -> int:
    k = e[0]
    if k == "r":
        return env[e[1]]
    if k == "c":
        return e[1]
    a = _eval(e[1], env)
    if k == "//":
        return a // e[2]
    if k == "%":
        return a % e[2]
    b = _eval(e[2], env)
    return {"+": a + b, "*": a * b, "-": a - b, "max": max(a, b)}[k]


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(EXPRS)
def test_simplify_preserves_integer_index_arithmetic(e):
    # reference: direct Python evaluation with floor // and %, for every assignment of the RANGEs; exact
    # (values stay far below 2**31, so int32 wrap-around never matters)
    u = _build(e)
    s = simplify(u)
    for env in itertools.product(*(range(n) for n in SIZES)):
        sub = {RANGES[i]: C(v) for i, v in enumerate(env)}
        want = _eval(e, env)
        assert folded(s.substitute(sub)) == want, (e, env, s.pretty())
        assert folded(u.substitute(sub)) == want, (e, env)
    assert s.vmin <= min(_eval(e, env) for env in itertools.product(*(range(n) for n in SIZES)))
    assert s.vmax >= max(_eval(e, env) for env in itertools.product(*(range(n) for n in SIZES)))


def test_unravel_then_ravel_is_the_index():
    # a reshape (288,) -> (32, 3, 3) read back as (288,): ((r//3)%3)*3 + r%3 + (r//9)*9 is r (im2col rows)
    r = rng(0, 288)
    e = ((r // 3) % 3) * 3 + r % 3 + (r // 9) * 9
    assert simplify(e) is r
    assert simplify(r % 3 + (r // 3) * 3) is r
    assert simplify(r % 3 + ((r // 3) % 4) * 3) is simplify(r % 12)


def test_unravel_then_ravel_is_the_index_when_the_mod_reduced_its_coefficients():
    # a merged loop over 14x14 positions in vectors of 16 (r*16 + LANE) read through the (14, 14) view: y % 14 has
    # y's coefficients reduced mod 14 (r*16 -> r*2) before the sum sees it, and the sum is still y (a transposing
    # read's index: without it, its 16 lanes were simplified one by one and rendered with a division each)
    r, lane, c = rng(0, 12), rng(1, 16), rng(2, 256)
    y = r * 16 + lane
    e = ((y // 14) * 14 + y % 14) * 256 + c
    assert simplify(e) is simplify(y * 256 + c)
    assert simplify((y // 14) * 14 + y % 14) is simplify(y)
    for rv, lv in itertools.product(range(12), range(16)):  # exact, as floor division
        v = rv * 16 + lv
        assert (v // 14) * 14 + (rv * 2 + lv) % 14 == v
    # a mod of another sum (not y's coefficients reduced) is not merged
    assert simplify((y // 14) * 14 + (r * 3 + lane) % 14).op is Ops.ADD


def test_mod_reduces_coefficients_then_drops():
    # a sliding-window view: row k of length 31 over an input of 30 starts at element k: (k*31 + o) % 30 = k + o
    k, o = rng(0, 3), rng(1, 28)
    assert simplify((k * 31 + o) % 30) is simplify(k + o)
    # the mod stays when the bounds do not prove it away
    assert simplify((k * 31 + rng(2, 29)) % 30).op is Ops.MOD


def test_divmod_drops_a_remainder_below_a_common_factor_of_the_divisor():
    # K = N*H*W in chunks of 196 positions (7 rows of 28): position chunk*196 + row*28 + col, image // 784 and the
    # position in it % 784. The terms that are multiples of 196 (a divisor of 784) carry the division, the rest,
    # in [0, 196), passes through: (196*a + s) // 784 == a // 4, (196*a + s) % 784 == (a % 4) * 196 + s
    a, row, col = rng(0, 32), rng(1, 7), rng(2, 28)
    x = a * 196 + row * 28 + col
    assert simplify(x // 784) is simplify(a // 4)
    assert simplify((x % 784) // 28) is simplify((a % 4) * 7 + row)
    assert simplify(x % 784 % 28) is col
    # exact on every value, negative multiples included (floor division)
    for av in range(-9, 9):
        for s in (0, 100, 195):
            v = av * 196 + s
            assert (v // 784, v % 784) == ((av * 196) // 784, (av * 196) % 784 + s)
    # a remainder that can reach the factor keeps the division
    assert simplify((a * 196 + rng(3, 197)) // 784).op is Ops.IDIV


def test_divmod_whose_bounds_lie_in_one_quotient_folds():
    # a GEMM's remainder region of 32 columns starting at column 480 of weight panels 48 wide: the second vector's
    # lanes are columns 496 + lane, all in panel 10 ((496 + lane) // 48), at 16 + lane in it: one vector load, not
    # 16 scalar loads packed
    lane = rng(0, 16)
    assert simplify((lane + 496) // 48) is C(10)
    assert simplify((lane + 496) % 48) is simplify(lane + 16)
    assert simplify((lane * 2 - 90) // 48) is C(-2) and simplify((lane * 2 - 90) % 48) is simplify(lane * 2 + 6)
    for v in range(16):  # exact, as floor division
        assert ((v + 496) // 48, (v + 496) % 48, (v * 2 - 90) // 48, (v * 2 - 90) % 48) == (10, v + 16, -2, v * 2 + 6)
    # bounds across a multiple keep the division
    assert simplify((lane + 40) // 48).op is Ops.IDIV and simplify((lane + 40) % 48).op is Ops.MOD

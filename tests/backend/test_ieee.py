"""IEEE 754 and integer edge cases, compiled and run: NaN propagation through ADD and MAX (elementwise and reduced),
overflow to inf, log2/sqrt/recip of 0 and negatives, integer floor division and modulo with Python semantics
(x // 0 == x % 0 == 0, INT_MIN // -1 wraps), and the identity elements of MAX reductions.

Each value is checked twice where it can be: computed by the kernel from a buffer, and folded by the simplifier from
constants (the folded constant must render as the same C value), so both paths agree with NumPy.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.helpers import buf, cc_major, render_graph, run
from uopc.runtime import compiler as runtime
from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes

f32, f64, i32 = dtypes.float32, dtypes.float64, dtypes.int32
nan, inf = np.nan, np.inf
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def _const_run(u: UOp) -> np.ndarray:
    """A constant-only graph: folded by simplify, rendered as a C literal, stored by a kernel without inputs."""
    return run(u, [])


# ------------------------------------------------------------------ NaN propagation

A = np.array([nan, 1, nan, -inf, 2, nan, 0, 3, inf, -inf], np.float32)
B = np.array([1, nan, nan, nan, 3, -inf, 1, 3, -inf, -inf], np.float32)


@pytest.mark.parametrize("dt", [f32, f64], ids=lambda d: d.name)
def test_nan_through_add(dt):
    # reference: np.add (inf + -inf = nan); exact, NaN positions included
    a, b = A.astype(dt.np), B.astype(dt.np)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(run(buf(0, 10, dt) + buf(1, 10, dt), [a, b]), a + b)


@pytest.mark.parametrize("dt", [f32, f64], ids=lambda d: d.name)
def test_nan_through_elementwise_max(dt):
    # reference: np.maximum, which propagates NaN from either side; exact
    a, b = A.astype(dt.np), B.astype(dt.np)
    np.testing.assert_array_equal(run(buf(0, 10, dt).maximum(buf(1, 10, dt)), [a, b]), np.maximum(a, b))


def test_nan_through_reduce_max_and_sum():
    # NaN first, in the middle, last, alone, and absent; reference: np.max / np.sum over rows; exact
    m = np.array([[nan, 1, 2, 3], [1, nan, 3, 2], [1, 2, 3, nan], [nan, nan, nan, nan], [-inf, 5, -1, 2]], np.float32)
    x = buf(0, 20).reshape((5, 4))
    np.testing.assert_array_equal(run(x.reduce(Ops.MAX, 1), [m]), m.max(1))
    np.testing.assert_array_equal(run(x.reduce(Ops.ADD, 1), [m]), m.sum(1))
    np.testing.assert_array_equal(run(x.reduce(Ops.MAX, 2), [m]), np.float32(nan))


def test_nan_constants_fold_and_render():
    # reference: IEEE 754; exact
    assert math.isnan(_const_run(UOp.const(nan) + UOp.const(1.0)))
    assert math.isnan(_const_run(UOp.const(nan).maximum(UOp.const(1.0))))
    assert math.isnan(_const_run(UOp.const(1.0).maximum(UOp.const(nan))))
    assert math.isnan(_const_run(UOp.const(inf) + UOp.const(-inf)))
    x = buf(0, 3)
    got = run(x.maximum(UOp.const(nan)), [np.array([1, -inf, nan], np.float32)])  # the NAN literal
    assert np.isnan(got).all()


# gcc 12's vectorizer folds a vector x * {0, ...} to zero under -fno-signed-zeros (NaNs honored or not)
GCC12_NO_SIGNED_ZEROS = cc_major() == 12 and "-fno-signed-zeros" in runtime.cflags()


@pytest.mark.parametrize("dt", [f32, f64], ids=lambda d: d.name)
def test_float_times_zero_keeps_nan(dt):
    # regression: simplify keeps float x*0 for NaN/inf semantics, but the C compiler must not drop it either
    # reference: np.multiply; exact
    a = np.array([nan, inf, -inf, 1.0], dt.np)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(run(buf(0, 4, dt) * 0.0, [a]), a * 0)


# ------------------------------------------------------------------ overflow, log2, sqrt, recip


@pytest.mark.parametrize("dt", [f32, f64], ids=lambda d: d.name)
def test_exp2_overflow_and_underflow(dt):
    # reference: np.exp2; exact for the special values, 4 ulp for the finite ones
    a = np.array([128, 1024, 1e6, -inf, inf, nan, -1e6, 0, -1, 3.5], dt.np)
    got = run(buf(0, 10, dt).alu(Ops.EXP2), [a])
    with np.errstate(over="ignore"):
        want = np.exp2(a)
    np.testing.assert_array_max_ulp(got, want, maxulp=4)
    assert got[1] == inf and got[2] == inf and got[4] == inf and got[3] == 0 and got[6] == 0 and np.isnan(got[5])
    if dt is f32:
        assert got[0] == inf  # 2**128 overflows float32
    assert _const_run(UOp.const(128.0).alu(Ops.EXP2)) == inf
    assert _const_run(UOp.const(1024.0, f64).alu(Ops.EXP2)) == inf


@pytest.mark.parametrize("dt", [f32, f64], ids=lambda d: d.name)
def test_log2_sqrt_recip_special_values(dt):
    # reference: IEEE 754 (np.log2, np.sqrt, np.reciprocal); exact
    a = np.array([0, -1, inf, nan, 1, 8, 0.25, -inf], dt.np)
    x = buf(0, 8, dt)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(run(x.alu(Ops.LOG2), [a]), np.log2(a))
        np.testing.assert_array_equal(run(x.alu(Ops.SQRT), [a]), np.sqrt(a))
        np.testing.assert_array_equal(run(x.alu(Ops.RECIP), [a]), np.reciprocal(a))
    got = run(x.alu(Ops.LOG2), [a])
    assert got[0] == -inf and np.isnan(got[1])
    assert np.isnan(run(x.alu(Ops.SQRT), [a])[1])
    assert run(x.alu(Ops.RECIP), [a])[0] == inf


def test_special_values_from_folded_constants():
    # reference: IEEE 754; exact
    assert _const_run(UOp.const(0.0).alu(Ops.LOG2)) == -inf
    assert math.isnan(_const_run(UOp.const(-1.0).alu(Ops.LOG2)))
    assert math.isnan(_const_run(UOp.const(-1.0).alu(Ops.SQRT)))
    assert _const_run(UOp.const(0.0).alu(Ops.RECIP)) == inf
    assert _const_run(UOp.const(0.0, f64).alu(Ops.RECIP)) == inf
    assert _const_run(UOp.const(3e38) * UOp.const(10.0)) == inf


# ------------------------------------------------------------------ integer division and modulo

IA = np.array([7, -7, 7, -7, 0, 5, -5, INT_MIN, INT_MIN, INT_MIN, INT_MAX, -1, 3, 6, -6, 1], np.int32)
IB = np.array([2, 2, -2, -2, 3, 0, 0, -1, 1, 2, -1, 0, -3, 3, 4, INT_MIN], np.int32)


def _py(op, a: int, b: int) -> int:
    """Python floor semantics, x // 0 == x % 0 == 0, wrapped to int32."""
    if b == 0:
        return 0
    v = a // b if op is Ops.IDIV else a % b
    return (v + 2**31) % 2**32 - 2**31


@pytest.mark.parametrize("op", [Ops.IDIV, Ops.MOD], ids=lambda o: o.name)
def test_int_floor_div_mod_match_python(op):
    # reference: Python int // and % (floor), with x//0 == x%0 == 0 and INT_MIN // -1 wrapping; exact
    want = np.array([_py(op, int(a), int(b)) for a, b in zip(IA, IB, strict=True)], np.int32)
    got = run(buf(0, 16, i32).alu(op, buf(1, 16, i32)), [IA, IB])
    np.testing.assert_array_equal(got, want)
    # NumPy agrees too (it warns on / 0 and INT_MIN // -1; the compiled kernel must not trap)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, np.floor_divide(IA, IB) if op is Ops.IDIV else np.mod(IA, IB))


def test_int_div_mod_edge_cases():
    # reference: Python; exact
    x, y = buf(0, 1, i32), buf(1, 1, i32)

    def one(op, a, b):
        return int(run(x.alu(op, y), [np.array([a], np.int32), np.array([b], np.int32)])[0])

    assert one(Ops.IDIV, INT_MIN, -1) == INT_MIN
    assert one(Ops.MOD, INT_MIN, -1) == 0
    assert one(Ops.IDIV, 9, 0) == 0 and one(Ops.MOD, 9, 0) == 0
    assert one(Ops.IDIV, -9, 0) == 0 and one(Ops.MOD, -9, 0) == 0


@pytest.mark.parametrize("c", [3, -3, 0, -1, 1, INT_MAX], ids=lambda c: f"by_{c}")
def test_int_div_mod_by_constant(c):
    # a constant divisor takes other code paths (bounds, plain C / and %); reference: Python; exact
    a = IA
    x = buf(0, 16, i32)
    np.testing.assert_array_equal(run(x // c, [a]), [_py(Ops.IDIV, int(v), c) for v in a])
    np.testing.assert_array_equal(run(x % c, [a]), [_py(Ops.MOD, int(v), c) for v in a])


def test_int_div_mod_folded_constants():
    # reference: Python; exact
    for a, b in [(7, 2), (-7, 2), (7, -2), (-7, -2), (5, 0), (INT_MIN, -1)]:
        for op in (Ops.IDIV, Ops.MOD):
            got = _const_run(UOp.const(a, i32).alu(op, UOp.const(b, i32)))
            assert got.dtype == np.int32 and int(got) == _py(op, a, b), (a, b, op)


# ------------------------------------------------------------------ identity elements of MAX reductions


def test_float_max_reduce_identity_is_negative_infinity():
    # reference: np.max; exact. The accumulator starts at -INFINITY, so an all -inf row gives -inf, not a finite min
    m = np.array([[-inf, -inf, -inf], [-3e38, -inf, -1e38], [-inf, -inf, 0]], np.float32)
    g = buf(0, 9).reshape((3, 3)).reduce(Ops.MAX, 1)
    np.testing.assert_array_equal(run(g, [m]), m.max(1))
    assert "= -INFINITY;" in render_graph(g, 1)
    g64 = buf(0, 9, f64).reshape((3, 3)).reduce(Ops.MAX, 1)
    np.testing.assert_array_equal(run(g64, [m.astype(np.float64)]), m.astype(np.float64).max(1))


def test_int32_max_reduce_with_negative_values():
    # reference: np.max; exact. The identity is INT_MIN (rendered as (-2147483647-1)), never 0
    m = np.array([[-5, -3, -9, -100], [INT_MIN, INT_MIN, INT_MIN, INT_MIN], [-1, INT_MIN, INT_MAX, 0]], np.int32)
    g = buf(0, 12, i32).reshape((3, 4)).reduce(Ops.MAX, 1)
    np.testing.assert_array_equal(run(g, [m]), m.max(1))
    assert "(-2147483647-1)" in render_graph(g, 1)
    np.testing.assert_array_equal(run(buf(0, 12, i32).reshape((3, 4)).reduce(Ops.MAX, 2), [m]), np.int32(INT_MAX))


def test_fmod_by_infinity_keeps_the_dividend():
    # regression (found by the ONNX Mod cases): a - trunc(a/inf)*inf was 0*inf = NaN; C's fmod and torch give a
    from uopc import Tensor

    a = np.array([3.0, -3.0, 0.5, math.inf, math.nan, 2.0], np.float32)
    b = np.array([math.inf, -math.inf, math.inf, math.inf, math.inf, 1.5], np.float32)
    np.testing.assert_array_equal(Tensor(a).fmod(Tensor(b)).numpy(), np.fmod(a, b))


def test_zero_d_bfloat16_tensor_keeps_its_shape():
    # regression: np.ascontiguousarray made the 0-d array of bit patterns 1-d, so the Tensor's shape was (1,)
    from uopc import Tensor

    t = Tensor(np.array(1.5, np.float32), dtype=dtypes.bfloat16)
    assert t.shape == () and float(t.float().numpy()) == 1.5

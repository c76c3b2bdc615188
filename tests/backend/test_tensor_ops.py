"""Numerics of the Tensor API against NumPy (and PyTorch where it is installed).

Tolerances: float32 elementwise ops use F32 (rtol 1e-5, atol 1e-6). Transcendentals (exp2f, log2f, sinf from libm,
composed as exp = exp2(x * log2 e)) and reductions (different summation order, -fassociative-math) use LOOSE.
Shapes are small and shared between tests so equal kernels compile once.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from uopc import Tensor, dtypes
from uopc.engine import lower as lowering
from uopc.uop import Ops

F32 = dict(rtol=1e-5, atol=1e-6)
LOOSE = dict(rtol=1e-4, atol=1e-5)

rng = np.random.default_rng(0)


def r(*shape: int, dtype=np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def close(t: Tensor, ref, tol=F32) -> None:
    """t's shape equals NumPy's `ref` and its values are within `tol` (callers assert dtypes themselves)."""
    out = t.numpy()
    ref = np.asarray(ref)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    np.testing.assert_allclose(out, ref, **tol)


A = r(3, 4)
B = r(3, 4)
P = np.abs(r(3, 4)) + 0.1  # positive, for log/sqrt/pow
# int32 operands with negatives and a zero divisor
IA = np.array([[7, -7, 3, 0], [-1, 5, -8, 2], [4, 4, -3, 9]], np.int32)
JA = np.array([[2, 2, -2, 3], [3, -4, 3, 1], [-5, 1, 0, 4]], np.int32)


# ---------------------------------------------------------------- creation


@pytest.mark.parametrize(
    "data,dtype,shape",
    [
        (1.5, dtypes.float32, ()),
        (3, dtypes.int32, ()),
        (True, dtypes.bool, ()),
        ([1, 2, 3], dtypes.int32, (3,)),
        ([[1.0, 2], [3, 4]], dtypes.float32, (2, 2)),
        ([[True, False]], dtypes.bool, (1, 2)),
        ([], dtypes.float32, (0,)),
        (np.zeros((2, 3)), dtypes.float64, (2, 3)),  # NumPy arrays keep their dtype, float64 too
        (np.zeros(4, np.int64), dtypes.int64, (4,)),
        (np.zeros(4, np.float16), dtypes.float16, (4,)),
        (np.float32(2.0), dtypes.float32, ()),
        (range(3), dtypes.int32, (3,)),
    ],
)
def test_creation_infers_dtype(data, dtype, shape):
    t = Tensor(data)
    assert t.dtype is dtype and t.shape == shape
    np.testing.assert_array_equal(t.numpy(), np.asarray(data, dtype.np).reshape(shape))


def test_creation_dtype_and_requires_grad_kwargs():
    t = Tensor([1.7, -2.7], dtype=dtypes.int32, requires_grad=False)
    assert t.dtype is dtypes.int32 and t.requires_grad is False and t.tolist() == [1, -2]
    assert Tensor([1, 2], dtype="float64").dtype is dtypes.float64
    assert Tensor(np.ones(2, np.float32), dtype=np.int8).dtype is dtypes.int8
    assert Tensor([1.0], requires_grad=True).requires_grad is True


def test_creation_copies_the_numpy_array():
    a = np.arange(4, dtype=np.float32)
    t = Tensor(a)
    a[0] = 100
    assert t.tolist() == [0, 1, 2, 3]
    out = t.numpy()
    out[1] = 100  # numpy() hands out a copy too
    assert t.tolist() == [0, 1, 2, 3]


def test_constant_tensors_are_lazy_consts():
    for t in (Tensor.zeros(2, 3), Tensor.ones((2, 3)), Tensor.full((2, 3), 7), Tensor.empty(2, 3)):
        assert all(u.op is not Ops.BUFFER for u in t.uop.toposort())
    assert Tensor.zeros(2, 3).dtype is dtypes.float32 and Tensor.full((2,), 7).dtype is dtypes.int32
    assert Tensor.full((2,), True).dtype is dtypes.bool and Tensor.ones(2, dtype=dtypes.int8).dtype is dtypes.int8
    close(Tensor.full((2, 3), 7.5), np.full((2, 3), 7.5))
    close(Tensor.ones(2, 3) + Tensor.zeros(3), np.ones((2, 3)))
    assert Tensor.zeros(()).shape == () and Tensor.ones(()).item() == 1.0


def test_like_constructors():
    t = Tensor(IA)
    assert t.zeros_like().dtype is dtypes.int32 and t.zeros_like().tolist() == np.zeros_like(IA).tolist()
    assert t.ones_like(dtype=dtypes.float32).numpy().tolist() == np.ones((3, 4)).tolist()
    assert t.full_like(5).tolist() == np.full((3, 4), 5).tolist()
    assert Tensor.empty_like(t).shape == (3, 4)
    assert Tensor(A).rand_like().shape == (3, 4) and Tensor(IA).randn_like().dtype is dtypes.float32


@pytest.mark.parametrize(
    "args,dtype",
    [
        ((5,), None),
        ((2, 8, 3), None),
        ((5, 0, -2), None),
        ((0, 1, 0.25), None),
        ((3, 3), None),
        ((4,), dtypes.float32),
        ((-1.5, 1.0, 0.5), None),
    ],
)
def test_arange(args, dtype):
    t = Tensor.arange(*args, dtype=dtype)
    ref = np.arange(*args)
    want = dtype or (dtypes.int32 if all(isinstance(a, int) for a in args) else dtypes.float32)
    assert t.dtype is want and t.shape == ref.shape
    np.testing.assert_allclose(t.numpy(), ref)


@pytest.mark.parametrize("n,m", [(3, None), (2, 4), (4, 2), (1, 1), (0, 3)])
def test_eye(n, m):
    t = Tensor.eye(n, m)
    assert all(u.op is not Ops.BUFFER for u in t.uop.toposort())  # built lazily from a padded constant
    np.testing.assert_array_equal(t.numpy(), np.eye(n, m, dtype=np.float32))


def test_random_creation_and_manual_seed():
    Tensor.manual_seed(42)
    a, b, c = Tensor.rand(50, 2), Tensor.randn(3, 4), Tensor.uniform(100, low=-2, high=-1)
    Tensor.manual_seed(42)
    a2, b2, c2 = Tensor.rand((50, 2)), Tensor.randn(3, 4), Tensor.uniform(100, low=-2, high=-1)
    for x, y in ((a, a2), (b, b2), (c, c2)):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert a.dtype is dtypes.float32 and a.shape == (50, 2) and 0 <= a.numpy().min() and a.numpy().max() < 1
    assert -2 <= c.numpy().min() and c.numpy().max() < -1
    assert not np.array_equal(Tensor.randn(3, 4).numpy(), b.numpy())  # the stream moves on
    assert Tensor.randn(2, dtype=dtypes.float64).dtype is dtypes.float64
    ri = Tensor.randint(20, low=3, high=6)
    assert ri.dtype is dtypes.int32 and set(ri.tolist()) <= {3, 4, 5}


# ---------------------------------------------------------------- properties and conversion


def test_properties():
    t = Tensor(r(2, 3, 4))
    assert t.shape == (2, 3, 4) and t.ndim == 3 and t.numel() == 24 and t.size() == (2, 3, 4)
    assert t.size(-1) == 4 and t.size(0) == 2 and len(t) == 2 and t.T.shape == (4, 3, 2)
    assert "shape=(2, 3, 4)" in repr(t + 1) and "f32" in repr(t + 1) and "f32" in repr(t)  # values once realized
    assert t.dtype is dtypes.float32 and t.device == "CPU"
    assert {t: 1}[t] == 1  # hashable by identity although == builds a tensor


def test_item_tolist_bool_iter():
    assert Tensor(2.5).item() == 2.5 and isinstance(Tensor(3).item(), int) and Tensor([[True]]).item() is True
    assert Tensor(IA).tolist() == IA.tolist()
    assert bool(Tensor([1.0])) and not bool(Tensor(0))
    assert [row.tolist() for row in Tensor(IA[:2])] == IA[:2].tolist()


def test_realize_returns_self_and_drops_the_graph():
    t = Tensor(A) * 2 + 1
    assert t.realize() is t
    assert t.uop.op is Ops.RESHAPE and t.uop.src[0].op is Ops.BUFFER
    close(t, A * 2 + 1)


def test_keepdim_reduction_realizes_as_one_kernel():
    # regression: a RESHAPE root over a REDUCE was a reduce kernel plus a copy; make_plan strips the free reshape

    t = Tensor(A).sum(1, keepdim=True)
    assert len(lowering.make_plan([t.uop])[0].kernels) == 1
    close(t, A.sum(1, keepdims=True), LOOSE)


def test_realize_all_shares_one_call(monkeypatch):
    from uopc.engine import realize

    calls, real = [], realize.realize
    monkeypatch.setattr(realize, "realize", lambda roots, **kw: calls.append(roots) or real(roots, **kw))
    x = Tensor(A)
    m = x.max(1, keepdim=True)
    a, b = (x - m).exp(), (x - m) * 2
    Tensor.realize_all(a, b, x)
    assert len(calls) == 1 and len(calls[0]) == 2  # x is already a buffer: not a root
    for t in (a, b, x):
        assert t.uop.src[0].op is Ops.BUFFER
    close(a, np.exp(A - A.max(1, keepdims=True)), LOOSE)
    close(b, (A - A.max(1, keepdims=True)) * 2)


def test_assign_contiguous_detach_cast():
    t = Tensor(A)
    t.assign(t * 2)
    close(t, A * 2)
    t.assign(0.0)  # a scalar broadcasts to the tensor's shape
    close(t, np.zeros((3, 4)))
    t.assign(Tensor(B[0]))
    close(t, np.broadcast_to(B[0], (3, 4)))
    assert t.shape == (3, 4)
    c = (Tensor(A) * 3).contiguous()
    assert c.uop.op is Ops.STAGE
    close(c.sum(1), (A * 3).sum(1), LOOSE)
    d = Tensor(A, requires_grad=True).detach()
    assert d.uop.op is Ops.STAGE and d.uop.arg == "detach" and not d.requires_grad
    close(d + 1, A + 1)
    assert Tensor(A).int().dtype is dtypes.int32 and Tensor(A).half().dtype is dtypes.float16
    assert Tensor(IA).float().dtype is dtypes.float32 and Tensor(IA).double().dtype is dtypes.float64
    np.testing.assert_array_equal(Tensor(A).int().numpy(), A.astype(np.int32))  # truncation, as C and NumPy
    np.testing.assert_array_equal(Tensor(IA).bool().numpy(), IA.astype(bool))
    np.testing.assert_allclose(Tensor(A).half().numpy(), A.astype(np.float16))
    assert Tensor(A).cast("float64").dtype is dtypes.float64


# ---------------------------------------------------------------- elementwise


UNARY = [
    ("neg", lambda t: -t, lambda a: -a, A, F32),
    ("abs", lambda t: t.abs(), np.abs, A, F32),
    ("square", lambda t: t.square(), np.square, A, F32),
    ("sqrt", lambda t: t.sqrt(), np.sqrt, P, F32),
    ("rsqrt", lambda t: t.rsqrt(), lambda a: 1 / np.sqrt(a), P, F32),
    ("reciprocal", lambda t: t.reciprocal(), lambda a: 1 / a, P, F32),
    ("exp", lambda t: t.exp(), np.exp, A, LOOSE),
    ("exp2", lambda t: t.exp2(), np.exp2, A, LOOSE),
    ("log", lambda t: t.log(), np.log, P, LOOSE),
    ("log2", lambda t: t.log2(), np.log2, P, LOOSE),
    ("sin", lambda t: t.sin(), np.sin, A, LOOSE),
    ("cos", lambda t: t.cos(), np.cos, A, LOOSE),
    ("tanh", lambda t: t.tanh(), np.tanh, A, LOOSE),
    ("sigmoid", lambda t: t.sigmoid(), lambda a: 1 / (1 + np.exp(-a)), A, LOOSE),
    ("relu", lambda t: t.relu(), lambda a: np.maximum(a, 0), A, F32),
    ("leaky_relu", lambda t: t.leaky_relu(0.1), lambda a: np.where(a > 0, a, 0.1 * a), A, F32),
    ("silu", lambda t: t.silu(), lambda a: a / (1 + np.exp(-a)), A, LOOSE),
    ("softplus", lambda t: t.softplus(), lambda a: np.log1p(np.exp(a)), A, LOOSE),
    (
        "gelu",
        lambda t: t.gelu(approximate="tanh"),
        lambda a: 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3))),
        A,
        LOOSE,
    ),
    ("trunc", lambda t: (t * 3).trunc(), lambda a: np.trunc(a * 3), A, F32),
    ("floor", lambda t: (t * 3).floor(), lambda a: np.floor(a * 3), A, F32),
    ("ceil", lambda t: (t * 3).ceil(), lambda a: np.ceil(a * 3), A, F32),
    ("sign", lambda t: t.sign(), np.sign, A, F32),
    ("tan", lambda t: t.tan(), np.tan, A, LOOSE),
]


@pytest.mark.parametrize("name,fn,ref,data,tol", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, fn, ref, data, tol):
    out = fn(Tensor(data))
    assert out.dtype is dtypes.float32
    close(out, ref(data.astype(np.float64)), tol)


def test_activations_saturate_without_nan():
    x = np.array([-1000, -90, -1, 0, 1, 90, 1000], np.float32)
    with np.errstate(over="ignore"):
        close(Tensor(x).sigmoid(), 1 / (1 + np.exp(-x.astype(np.float64))), LOOSE)
    close(Tensor(x).tanh(), np.tanh(x), LOOSE)
    close(Tensor(x).softplus(), np.logaddexp(0, x.astype(np.float64)), LOOSE)


def test_relu_and_abs_keep_nan_and_inf():
    x = np.array([np.nan, -np.inf, np.inf, -0.5, 0.0], np.float32)
    np.testing.assert_array_equal(Tensor(x).abs().numpy(), np.abs(x))
    out = Tensor(x).relu().numpy()
    assert out[2] == np.inf and out[1] == 0 and out[3] == 0  # relu(NaN): select keeps the comparison's False -> 0


def test_float_only_ops_cast_ints_to_float32():
    t = Tensor([1, 4, 9])
    for out in (t.sqrt(), t.exp(), t.log(), t.sin(), t.sigmoid(), t.reciprocal(), t / 2, t.mean(), t.softmax()):
        assert out.dtype is dtypes.float32
    close(t.sqrt(), [1, 2, 3])


BROADCAST = [((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)), ((), (3,))]  # incl. 1-dims and 0-d
BINARY = [
    ("add", lambda a, b: a + b, F32),
    ("sub", lambda a, b: a - b, F32),
    ("mul", lambda a, b: a * b, F32),
    ("div", lambda a, b: a / b, F32),
    ("maximum", lambda a, b: a.maximum(b) if isinstance(a, Tensor) else np.maximum(a, b), F32),
    ("minimum", lambda a, b: a.minimum(b) if isinstance(a, Tensor) else np.minimum(a, b), F32),
    ("lt", lambda a, b: a < b, None),
    ("le", lambda a, b: a <= b, None),
    ("gt", lambda a, b: a > b, None),
    ("ge", lambda a, b: a >= b, None),
    ("eq", lambda a, b: a == b, None),
    ("ne", lambda a, b: a != b, None),
]


@pytest.mark.parametrize("sa,sb", BROADCAST)
@pytest.mark.parametrize("name,fn,tol", BINARY, ids=[b[0] for b in BINARY])
def test_binary_broadcast(name, fn, tol, sa, sb):
    a = np.round(r(*sa) * 2) / 2  # half-integers: comparisons see exact ties
    b = np.round(r(*sb) * 2) / 2 + (0.25 if name == "div" else 0)
    out = fn(Tensor(a), Tensor(b))
    ref = fn(a, b)
    assert out.shape == ref.shape
    if tol is None:
        assert out.dtype is dtypes.bool
        np.testing.assert_array_equal(out.numpy(), ref)
    else:
        close(out, ref, tol)


def test_scalar_and_reflected_operators():
    t = Tensor(A)
    for out, ref in [
        (t + 2, A + 2),
        (2 + t, 2 + A),
        (t - 2, A - 2),
        (2 - t, 2 - A),
        (t * 3, A * 3),
        (3 * t, 3 * A),
        (t / 4, A / 4),
        (4 / t, 4 / A),
        (t**2, A**2),
        (2**t, 2**A),
        (-t, -A),
        (t + np.float32(1), A + 1),
        (A + t, A + A),
        (t.maximum(0.5), np.maximum(A, 0.5)),
        (t.minimum(-0.5), np.minimum(A, -0.5)),
    ]:
        assert out.dtype is dtypes.float32
        close(out, ref, LOOSE)
    assert (t + 2).uop.src[1].op is Ops.CONST  # a Python scalar is a shape-() CONST, not an expanded buffer


def test_sub_by_scalar_folds_the_negation():
    # `x - 1` is x + -1 (one ADD of a CONST), not x + 1 * -1
    u = (Tensor(A) - 1).uop
    assert u.op is Ops.ADD and u.src[1].op is Ops.CONST and u.src[1].arg == -1.0


@pytest.mark.parametrize(
    "fn,want",
    [
        (lambda: Tensor([1, 2]) + Tensor([1.0, 2.0]), dtypes.float32),
        (lambda: Tensor([1, 2]) * 0.5, dtypes.float32),  # an int tensor times a float scalar: default float
        (lambda: Tensor([True]) + 1, dtypes.int32),
        (lambda: Tensor([True]) * 2.0, dtypes.float32),
        (lambda: Tensor([True]) + True, dtypes.bool),
        (lambda: Tensor(np.ones(2, np.int8)) + 1000, dtypes.int8),  # a scalar never widens within its category
        (lambda: Tensor(np.ones(2, np.float16)) * 2.5, dtypes.float16),
        (lambda: Tensor(np.ones(2, np.float64)) + Tensor([1.0, 2.0]), dtypes.float64),
        (lambda: Tensor(np.ones(2, np.int8)) + Tensor(np.ones(2, np.uint8)), dtypes.int16),
        (lambda: Tensor(np.ones(2, np.int64)) + Tensor([1, 2]), dtypes.int64),
        (lambda: Tensor([1, 2]) / Tensor([3, 4]), dtypes.float32),
        (lambda: Tensor([1, 2]) / 2, dtypes.float32),
        (lambda: Tensor([1, 2]) // 2, dtypes.int32),
        (lambda: Tensor([1, 2]) ** 2, dtypes.int32),
        (lambda: Tensor([1, 2]) ** 0.5, dtypes.float32),
        (lambda: Tensor([1, 2]) < 1.5, dtypes.bool),
        (lambda: Tensor(np.ones(2, np.float64)) * 2.0, dtypes.float64),
        (lambda: Tensor([1, 2]).where(1.0, 0), dtypes.float32),
        (lambda: Tensor([1, 2]) @ Tensor([[1.0], [2.0]]), dtypes.float32),
    ],
)
def test_promotion(fn, want):
    out = fn()
    assert out.dtype is want
    out.numpy()  # and it compiles and runs


def test_int_tensor_times_float_and_mean():
    t = Tensor(np.array([1, 2, 3], np.int32))
    close(t * 0.5, [0.5, 1.0, 1.5])
    assert t.mean().item() == 2.0 and t.dtype is dtypes.int32


def test_deleted_reads_do_not_shift_kernel_arguments():
    # regression: (t * 0) simplifies to a constant, the kernel no longer reads t, and a shifted argument list
    # once wrote the zeros into t
    t = Tensor(np.array([1, 2, 3], np.int32))
    assert (t * 0).numpy().tolist() == [0, 0, 0]
    assert t.numpy().tolist() == [1, 2, 3]
    assert (Tensor([1, 2, 3]) * 0).tolist() == [0, 0, 0]


def test_int_floordiv_and_mod_have_python_semantics():
    a, b = Tensor(IA), Tensor(JA)
    assert (a // b).dtype is dtypes.int32
    # Python/NumPy floor semantics; x // 0 == x % 0 == 0 (NumPy also gives 0, with a warning)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal((a // b).numpy(), IA // JA)
        np.testing.assert_array_equal((a % b).numpy(), IA % JA)
    np.testing.assert_array_equal((a // 3).numpy(), IA // 3)
    np.testing.assert_array_equal((a % -3).numpy(), IA % -3)
    np.testing.assert_array_equal((7 // b).numpy()[JA != 0], 7 // JA[JA != 0])


def test_float_floordiv_and_mod():
    a, b = A * 5, np.where(np.abs(B) < 0.2, 0.5, B)
    close(Tensor(a) // Tensor(b), np.floor_divide(a, b), LOOSE)
    close(Tensor(a) % Tensor(b), np.mod(a, b), LOOSE)
    close(Tensor(a) % 1.5, np.mod(a, 1.5), LOOSE)


@pytest.mark.parametrize(
    "base,exp",
    [(A, 2), (A, 3), (P, 0.5), (P, -0.5), (P, -1), (A, 0), (A, 1), (P, 2.5), (A, 5), (A, -2), (A, 10), (A, 2.5)],
)
def test_pow_scalar_exponent(base, exp):
    with np.errstate(invalid="ignore"):
        ref = np.power(base.astype(np.float64), exp)
    out = Tensor(base) ** exp
    assert out.dtype is dtypes.float32
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_pow_special_cases_are_plain_multiplies():
    x = Tensor(A)
    assert (x**2).uop is (x * x).uop
    assert all(u.op not in (Ops.EXP2, Ops.LOG2) for u in (x**3).uop.toposort())
    assert Ops.SQRT in {u.op for u in (x**0.5).uop.toposort()}


def test_pow_tensor_exponent_and_negative_bases():
    base = np.array([-2.0, -2.0, -8.0, 0.0, 0.0, 3.0, 2.0, -1.5], np.float32)
    exp = np.array([3.0, 2.0, 1 / 3, 2.0, 0.0, -1.0, 0.5, -2.0], np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        ref = np.power(base.astype(np.float64), exp)
    np.testing.assert_allclose((Tensor(base) ** Tensor(exp)).numpy(), ref, rtol=1e-4, equal_nan=True)
    assert (Tensor(np.float32(0)) ** -1.0).item() == math.inf
    ints = Tensor([2, -3, 5, 7]) ** Tensor([10, 3, 0, 2])
    assert ints.dtype is dtypes.int32 and ints.tolist() == [1024, -27, 1, 49]
    assert (Tensor([2, -3]) ** 3).tolist() == [8, -27]
    assert (3 ** Tensor([0, 1, 4])).tolist() == [1, 3, 81]
    close(2.0 ** Tensor([0.5, 3.0]), [math.sqrt(2), 8.0], LOOSE)
    close((-2.0) ** Tensor([2.0, 3.0]), [4.0, -8.0], LOOSE)


def test_comparisons_with_nan_and_scalars():
    x = np.array([np.nan, 1.0, 2.0, -np.inf], np.float32)
    with np.errstate(invalid="ignore"):
        for op in ("__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"):
            np.testing.assert_array_equal(getattr(Tensor(x), op)(1.0).numpy(), getattr(x, op)(1.0), err_msg=op)
    np.testing.assert_array_equal((1.5 < Tensor(x)).numpy(), 1.5 < x)
    np.testing.assert_array_equal((Tensor(IA) <= 3).numpy(), IA <= 3)
    np.testing.assert_array_equal((Tensor(IA) == Tensor(JA)).numpy(), IA == JA)


def test_where():
    c = A > 0
    close(Tensor(c).where(Tensor(A), Tensor(B)), np.where(c, A, B))
    close(Tensor.where(Tensor(c), Tensor(A), 0.0), np.where(c, A, 0))
    close(Tensor(c).where(1.0, Tensor(B[0])), np.where(c, 1.0, B[0]))  # broadcasts the (4,) operand
    out = Tensor(c[0]).where(1, 0)
    assert out.dtype is dtypes.int32 and out.tolist() == c[0].astype(int).tolist()
    close(Tensor(A).where(1.0, -1.0), np.where(A != 0, 1.0, -1.0))  # a non-bool condition means != 0


def test_clip():
    close(Tensor(A).clip(-0.5, 0.5), np.clip(A, -0.5, 0.5))
    close(Tensor(A).clamp(min=0), np.maximum(A, 0))
    close(Tensor(A).clip(max=0.1), np.minimum(A, 0.1))
    assert Tensor(IA).clip(-2, 2).tolist() == np.clip(IA, -2, 2).tolist()


def test_logic_and_bitwise():
    a, b = A > 0, B > 0
    for t, ref in [
        (Tensor(a) & Tensor(b), a & b),
        (Tensor(a) | Tensor(b), a | b),
        (Tensor(a) ^ Tensor(b), a ^ b),
        (~Tensor(a), ~a),
        (Tensor(a).logical_not(), ~a),
        (Tensor(a) & True, a),
        (True ^ Tensor(a), ~a),
    ]:
        assert t.dtype is dtypes.bool
        np.testing.assert_array_equal(t.numpy(), ref)
    for t, ref in [
        (Tensor(IA) & Tensor(JA), IA & JA),
        (Tensor(IA) | 6, IA | 6),
        (Tensor(IA) ^ Tensor(JA), IA ^ JA),
        (~Tensor(IA), ~IA),
    ]:
        assert t.dtype is dtypes.int32
        np.testing.assert_array_equal(t.numpy(), ref)
    np.testing.assert_array_equal(Tensor(IA).logical_not().numpy(), IA == 0)


def test_minimum_and_min_of_ints_do_not_overflow():
    x = np.array([-(2**31), 2**31 - 1, 0, -5], np.int32)
    assert Tensor(x).min().item() == -(2**31) and Tensor(x).max().item() == 2**31 - 1
    assert Tensor(x).minimum(Tensor(x[::-1].copy())).tolist() == np.minimum(x, x[::-1]).tolist()
    u = np.array([0, 7, 3], np.uint8)
    assert Tensor(u).min().item() == 0 and Tensor(u).argmin().item() == 0
    assert Tensor([True, False]).min().item() is False and Tensor([True, False]).max().item() is True


# ---------------------------------------------------------------- reductions


X3 = r(2, 3, 4)


@pytest.mark.parametrize("axis", [None, 0, -1, (2, 0), (-1, -2, 0)])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("name", ["sum", "max", "min", "mean"])
def test_reductions(name, axis, keepdim):
    ax = tuple(a % 3 for a in axis) if isinstance(axis, tuple) else axis
    ref = getattr(X3, name)(axis=ax, keepdims=keepdim)
    out = getattr(Tensor(X3), name)(axis, keepdim=keepdim)
    assert out.dtype is dtypes.float32
    close(out, ref, LOOSE)


@pytest.mark.parametrize("axis", [None, 1, (0, 2)])
@pytest.mark.parametrize("correction", [0, 1])
def test_var_std(axis, correction):
    ax = axis
    close(Tensor(X3).var(axis, correction=correction), X3.var(axis=ax, ddof=correction), LOOSE)
    close(
        Tensor(X3).std(axis, keepdim=True, correction=correction),
        X3.std(axis=ax, ddof=correction, keepdims=True),
        LOOSE,
    )


def test_var_kernel_structure_and_degenerate_correction():
    from uopc.kernelize import make_plan

    plan, _ = make_plan([Tensor(A).var(-1).uop])
    assert [k.name[:2] for k in plan.kernels] == ["r_", "r_", "e_"]
    assert math.isnan(Tensor([1.0]).var().item())  # n - correction == 0: NaN, as PyTorch


def test_reduction_dtypes():
    assert Tensor([True, True, False]).sum().dtype is dtypes.int32  # PyTorch gives int64; uopc's default int
    assert Tensor([True, True, False]).sum().item() == 2
    assert Tensor(np.array([100, 100], np.int8)).sum().item() == 200  # no int8 overflow
    assert Tensor(IA).sum().dtype is dtypes.int32 and Tensor(IA).sum().item() == IA.sum()
    assert Tensor(IA).max(0).tolist() == IA.max(0).tolist() and Tensor(IA).min(1).tolist() == IA.min(1).tolist()
    assert Tensor(IA).mean(1).dtype is dtypes.float32
    close(Tensor(IA).mean(1), IA.mean(1))
    h = Tensor(np.full(1000, 0.1, np.float16)).sum()
    assert h.dtype is dtypes.float16 and abs(h.item() - 100) < 0.1  # half accumulates in float32
    close(Tensor(np.ones((2, 3), np.float64)).sum(1), [3.0, 3.0])
    assert Tensor(np.ones((2, 3), np.float64)).sum(1).dtype is dtypes.float64


def test_prod():
    x = np.array([[1.5, -2.0, 0.5], [3.0, 0.0, -1.0]], np.float32)
    close(Tensor(x).prod(1), x.prod(1), LOOSE)
    close(Tensor(x[0]).prod(), x[0].prod(), LOOSE)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_argmax_argmin_first_occurrence(axis, keepdim):
    x = np.array([[1, 5, 5, 0], [7, 7, 2, 7], [3, 3, 3, 3]], np.float32)  # ties everywhere
    for name in ("argmax", "argmin"):
        out = getattr(Tensor(x), name)(axis, keepdim=keepdim)
        ref = getattr(x, name)(axis=axis, keepdims=keepdim)
        assert out.dtype is dtypes.int32
        np.testing.assert_array_equal(out.numpy(), ref)


def test_argmax_nan_and_ints():
    assert Tensor([1.0, np.nan, 3.0, np.nan]).argmax().item() == 1  # NaN is the max, as NumPy and PyTorch
    assert Tensor(IA).argmax(1).tolist() == IA.argmax(1).tolist()
    assert Tensor(IA).argmin(0).tolist() == IA.argmin(0).tolist()
    assert Tensor(2.0).argmax().item() == 0


def _np_softmax(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_family_with_large_values(axis):
    x = (X3 * 1000).astype(np.float32)  # exp(1000) overflows unless the max is subtracted
    x64 = x.astype(np.float64)
    close(Tensor(x).softmax(axis), _np_softmax(x64, axis), LOOSE)
    lse = np.log(np.exp(x64 - x64.max(axis, keepdims=True)).sum(axis, keepdims=True)) + x64.max(axis, keepdims=True)
    close(Tensor(x).log_softmax(axis), x64 - lse, LOOSE)
    close(Tensor(x).logsumexp(axis), lse.squeeze(axis), LOOSE)
    close(Tensor(x).logsumexp(axis, keepdim=True), lse, LOOSE)
    assert np.isfinite(Tensor(x).softmax(axis).numpy()).all()


def test_fuse_reduce_switch(monkeypatch):
    from uopc.engine import realize

    seen, real = [], realize.realize
    monkeypatch.setattr(realize, "realize", lambda roots, **kw: seen.append(kw) or real(roots, **kw))
    monkeypatch.setattr(Tensor, "fuse_reduce", True)
    close(Tensor(A).softmax(-1), _np_softmax(A.astype(np.float64), -1), LOOSE)
    assert seen[0]["fuse_reduce"] is True


def test_float64_stays_float64():
    x = A.astype(np.float64)
    tight = dict(rtol=1e-12, atol=1e-14)  # double math and double constants (log2(e) is not rounded to float)
    for out, ref in [
        (Tensor(x).exp(), np.exp(x)),
        (Tensor(x).sigmoid(), 1 / (1 + np.exp(-x))),
        (Tensor(x) / 3, x / 3),
        (Tensor(x).softmax(-1), _np_softmax(x, -1)),
        (Tensor(x) @ Tensor(x.T), x @ x.T),
        (Tensor(x).var(), x.var(ddof=1)),
    ]:
        assert out.dtype is dtypes.float64
        close(out, ref, tight)


def test_softmax_is_three_kernels():
    from uopc.kernelize import make_plan

    plan, _ = make_plan([Tensor(A).softmax(-1).uop])
    assert len(plan.kernels) == 3  # max, sum, elementwise output


def test_logsumexp_all_and_infinite_rows():
    close(Tensor(A).logsumexp(), np.log(np.exp(A.astype(np.float64)).sum()), LOOSE)
    x = np.array([[-np.inf, -np.inf], [np.inf, 1.0], [1.0, 2.0]], np.float32)
    close(Tensor(x).logsumexp(1), [-np.inf, np.inf, np.logaddexp(1.0, 2.0)], LOOSE)  # as PyTorch, no NaN


# ---------------------------------------------------------------- matmul


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((4,), (4,)),
        ((4,), (4, 3)),
        ((3, 4), (4,)),
        ((3, 4), (4, 5)),
        ((2, 3, 4), (4, 5)),
        ((2, 3, 4), (2, 4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((4,), (2, 4, 3)),
        ((3, 0), (0, 2)),
    ],
)
def test_matmul_shapes(sa, sb):
    a, b = r(*sa), r(*sb)
    out = Tensor(a) @ Tensor(b)
    close(out, a @ b, LOOSE)


def test_matmul_forms_and_dtypes():
    a, b = r(3, 4), r(4, 5)
    close(Tensor(a).matmul(Tensor(b)), a @ b, LOOSE)
    x, y = r(2, 3, 4), r(2, 3, 4)
    close(Tensor(x) @ Tensor(y).transpose(), x @ y.transpose(0, 2, 1), LOOSE)  # the chapters' batched form
    close(Tensor(a).dot(b), a @ b, LOOSE)
    close(a @ Tensor(b), a @ b, LOOSE)  # __rmatmul__ (NumPy defers to the Tensor)
    out = Tensor(IA) @ Tensor(JA.T.copy())
    assert out.dtype is dtypes.int32 and out.tolist() == (IA @ JA.T).tolist()
    u = (Tensor(a) @ Tensor(b)).uop
    assert u.op is Ops.REDUCE and u.src[0].shape == (3, 5, 4)  # (n, m, k): the reduce axis is last


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 4), (4, 5)),
        ((2, 3, 4), (4, 5)),
        ((3, 4), (2, 4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((1, 4), (4, 1)),
        ((4,), (4, 3)),
        ((3, 4), (4,)),
        ((3, 0), (0, 2)),
    ],
)
def test_matmul_builds_the_graph_of_its_tensor_ops(sa, sb):
    # matmul builds its UOps directly (no intermediate Tensors); hash-consing makes "the same graph as the Tensor
    # ops a.reshape(.., n, 1, k) * b.T.reshape(.., 1, m, k), broadcast, summed over the last axis" an identity test
    a, b = Tensor(r(*sa)), Tensor(r(*sb), requires_grad=True)
    a2 = a.reshape(1, -1) if a.ndim == 1 else a
    b2 = b.reshape(-1, 1) if b.ndim == 1 else b
    (n, k), m = a2.shape[-2:], b2.shape[-1]
    full = (*np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]), n, m, k)
    ae = a2.reshape(*a2.shape[:-2], n, 1, k).expand(full)
    be = b2.transpose(-1, -2).reshape(*b2.shape[:-2], 1, m, k).expand(full)
    want = (ae * be).sum(-1)
    want = want.squeeze(-2) if a.ndim == 1 else want
    want = want.squeeze(-1) if b.ndim == 1 else want
    out = a @ b
    assert out.uop is want.uop
    assert out.requires_grad and not (a.detach() @ b.detach()).requires_grad  # gradients tracked as before


# ---------------------------------------------------------------- movement


def test_reshape_view_permute_transpose_expand():
    x = Tensor(X3)
    close(x.reshape(4, -1), X3.reshape(4, -1))
    close(x.reshape((6, 4)), X3.reshape(6, 4))
    close(x.view(-1), X3.reshape(-1))
    close(x.permute(2, 0, 1), X3.transpose(2, 0, 1))
    close(x.permute((-1, 0, 1)), X3.transpose(2, 0, 1))
    close(x.transpose(), X3.swapaxes(-1, -2))  # the last two dims by default: (1, 0) for a matrix
    close(Tensor(A).transpose(), A.T)
    close(x.transpose(1, 0), X3.swapaxes(0, 1))
    close(x.transpose(-1, 0), X3.swapaxes(-1, 0))
    close(x.T, X3.T)
    close(Tensor(A[:1]).expand(5, -1), np.broadcast_to(A[:1], (5, 4)))
    close(Tensor(A[:, :1]).expand(2, 3, 6), np.broadcast_to(A[:, :1], (2, 3, 6)))  # a new leading dim
    close(Tensor(A[0]).expand((3, 4)) * 2, np.broadcast_to(A[0], (3, 4)) * 2)


def test_squeeze_unsqueeze_flatten_unflatten():
    x = Tensor(r(1, 3, 1, 4))
    assert x.squeeze().shape == (3, 4) and x.squeeze(0).shape == (3, 1, 4) and x.squeeze(1).shape == (1, 3, 1, 4)
    assert x.squeeze((0, 2)).shape == (3, 4)
    assert Tensor(A).unsqueeze(0).shape == (1, 3, 4) and Tensor(A).unsqueeze(-1).shape == (3, 4, 1)
    assert Tensor(A).unsqueeze(1).shape == (3, 1, 4)
    assert Tensor(X3).flatten().shape == (24,) and Tensor(X3).flatten(1).shape == (2, 12)
    assert Tensor(X3).flatten(0, 1).shape == (6, 4) and Tensor(2.0).flatten().shape == (1,)
    close(Tensor(X3).flatten(1), X3.reshape(2, 12))
    close(Tensor(X3).unflatten(2, (2, 2)), X3.reshape(2, 3, 2, 2))


PAD_CASES = [
    (((1, 2), (0, 1)), 0.0, ((1, 2), (0, 1))),
    ((1, 2), 0.0, ((0, 0), (1, 2))),  # PyTorch's flat form: the last dim first
    ((1, 1, 2, 0), 0.0, ((2, 0), (1, 1))),
    ((None, (2, 2)), -math.inf, ((0, 0), (2, 2))),
    (((1, 0), None), 3.5, ((1, 0), (0, 0))),
    (((-1, 1), (0, -2)), 0.0, None),  # negative pads cut
    ((-1, -1), 7.0, None),
]


@pytest.mark.parametrize("padding,value,np_pad", PAD_CASES)
def test_pad(padding, value, np_pad):
    out = Tensor(A).pad(padding, value=value)
    if np_pad is None:  # negative pads: cut first, then pad the positive parts
        pairs = padding if isinstance(padding[0], tuple) else ((0, 0), (padding[0], padding[1]))
        sl = tuple(slice(max(0, -lo), s - max(0, -hi)) for (lo, hi), s in zip(pairs, A.shape, strict=True))
        grow = tuple((max(0, lo), max(0, hi)) for lo, hi in pairs)
        ref = np.pad(A[sl], grow, constant_values=value)
    else:
        ref = np.pad(A, np_pad, constant_values=value)
    close(out, ref)


def test_pad_int_and_bool():
    assert (
        Tensor(IA).pad(((0, 0), (1, 0)), value=-1).tolist() == np.pad(IA, ((0, 0), (1, 0)), constant_values=-1).tolist()
    )
    assert Tensor([True]).pad((1, 1)).tolist() == [False, True, False]


def test_shrink_flip():
    close(Tensor(X3).shrink(((0, 1), None, (1, 3))), X3[0:1, :, 1:3])
    close(Tensor(X3).flip(0), X3[::-1])
    close(Tensor(X3).flip((0, 2)), X3[::-1, :, ::-1])
    close(Tensor(X3).flip(-1), X3[..., ::-1])


def test_repeat_split_chunk():
    close(Tensor(A).repeat(2, 3), np.tile(A, (2, 3)))
    close(Tensor(A[0]).repeat(2, 1, 2), np.tile(A[0], (2, 1, 2)))
    parts = Tensor(X3).split(2, dim=2)
    assert [p.shape for p in parts] == [(2, 3, 2), (2, 3, 2)]
    close(parts[1], X3[:, :, 2:])
    parts = Tensor(X3).split([1, 2], dim=1)
    close(parts[1], X3[:, 1:])
    assert [c.shape[0] for c in Tensor(np.arange(7)).chunk(3)] == [3, 3, 1]


# ---------------------------------------------------------------- indexing


INDEXES = [
    (1,),
    (-1,),
    (slice(None, None, -1),),
    (slice(1, None, 2),),
    (slice(None, None, -2), slice(3, 0, -1)),
    (slice(-100, 100), slice(10, None)),  # out-of-range ends are clipped, as slice.indices does
    (slice(5, 1, -3), Ellipsis, slice(None, None, 3)),
    (Ellipsis, 0),
    (None, 1, None, slice(None, None, -1)),
    (0, -1, 2),
    (slice(2, 2),),  # empty
    (slice(None, None, 5), 1, slice(1, 4, 2)),
    (Ellipsis,),
    (slice(None), None),
    (-2, slice(-1, -5, -1), slice(0, 4, 4)),
]


@pytest.mark.parametrize("index", INDEXES, ids=[str(i) for i in range(len(INDEXES))])
def test_getitem_basic(index):
    x = r(4, 5, 6)
    out = Tensor(x)[index]
    ref = x[index]
    assert out.shape == ref.shape
    np.testing.assert_array_equal(out.numpy(), ref)


def test_getitem_is_movement_only():
    t = Tensor(np.arange(10, dtype=np.float32))
    u = t[1:8:3].uop
    assert [n for n in u.toposort() if n.op is Ops.BUFFER] == [t.uop]  # no host copy: t's own buffer, viewed
    assert t[1:8:3].tolist() == [1, 4, 7] and t[::-3].tolist() == [9, 6, 3, 0]
    assert t[3].item() == 3 and t[-1].shape == ()


def test_getitem_tensor_index_gather():
    x = r(5, 3)
    idx = np.array([[4, 0], [-1, 2]], np.int32)
    np.testing.assert_array_equal(Tensor(x)[Tensor(idx)].numpy(), x[idx])
    np.testing.assert_array_equal(Tensor(x)[[0, 2, 2]].numpy(), x[[0, 2, 2]])
    np.testing.assert_array_equal(Tensor(x)[:, Tensor([2, 0])].numpy(), x[:, [2, 0]])
    x3 = r(2, 3, 4)
    np.testing.assert_array_equal(Tensor(x3)[1, Tensor([2, 0])].numpy(), x3[1, [2, 0]])
    np.testing.assert_array_equal(Tensor(x3)[0, :, Tensor([3, 1])].numpy(), x3[0, :, [3, 1]])  # advanced dims first
    nan = np.array([np.nan, 1.0, np.inf], np.float32)
    np.testing.assert_array_equal(Tensor(nan)[Tensor([1, 2])].numpy(), [1.0, np.inf])  # a select: no NaN leaks


# ---------------------------------------------------------------- cat and stack


def test_cat():
    a, b, c = r(2, 3), r(4, 3), r(1, 3)
    close(Tensor.cat(Tensor(a), Tensor(b), Tensor(c)), np.concatenate([a, b, c]))
    close(Tensor.cat([Tensor(a), Tensor(b)], dim=0), np.concatenate([a, b]))
    close(Tensor.cat([Tensor(a), Tensor(a)], 1), np.concatenate([a, a], 1))  # torch.cat(tensors, dim) form
    close(Tensor(a).cat(Tensor(a * 2), dim=-1), np.concatenate([a, a * 2], -1))
    close(Tensor(a).cat([Tensor(b), Tensor(c)]), np.concatenate([a, b, c]))
    mixed = Tensor.cat(Tensor([1, 2]), Tensor([0.5]))
    assert mixed.dtype is dtypes.float32 and mixed.tolist() == [1.0, 2.0, 0.5]
    assert Tensor.cat(Tensor([True]), Tensor([False, True])).tolist() == [True, False, True]
    assert Tensor.cat(Tensor(np.zeros((0, 3))), Tensor(a)).shape == (2, 3)
    close(Tensor.cat(Tensor(np.zeros((0, 3), np.float32)), Tensor(a)), a)


def test_cat_fuses_into_one_kernel():
    from uopc.kernelize import make_plan

    a, b = Tensor(r(2, 3)), Tensor(r(4, 3))
    plan, _ = make_plan([(Tensor.cat(a, b) * 2).uop])
    assert len(plan.kernels) == 1


def test_stack():
    a, b = r(2, 3), r(2, 3)
    close(Tensor.stack([Tensor(a), Tensor(b)]), np.stack([a, b]))
    close(Tensor.stack([Tensor(a), Tensor(b)], 1), np.stack([a, b], 1))
    close(Tensor.stack(Tensor(a), Tensor(b), dim=-1), np.stack([a, b], -1))
    close(Tensor(a).stack(Tensor(b), dim=2), np.stack([a, b], 2))
    assert Tensor.stack([Tensor(1.0), Tensor(2.0)]).tolist() == [1.0, 2.0]


# ---------------------------------------------------------------- losses


def _np_log_softmax(x, axis):
    x = x.astype(np.float64)
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def _np_cross_entropy(x, target, smoothing=0.0, reduction="mean", ignore=-100):
    """Reference: class dim 1 (0 for 1-D); integer targets or probabilities; PyTorch's smoothing and ignore_index."""
    cdim = 1 if x.ndim > 1 else 0
    logp = _np_log_softmax(x, cdim)
    n_cls = x.shape[cdim]
    if np.issubdtype(target.dtype, np.floating):
        q = target * (1 - smoothing) + smoothing / n_cls
        loss = -(q * logp).sum(cdim)
        return {"mean": loss.mean(), "sum": loss.sum(), "none": loss}[reduction]
    keep = target != ignore
    onehot = np.moveaxis(np.eye(n_cls)[np.where(keep, target, 0)], -1, cdim)
    loss = -((1 - smoothing) * onehot * logp).sum(cdim) - smoothing * logp.mean(cdim)
    loss = np.where(keep, loss, 0)
    return {"mean": loss.sum() / keep.sum(), "sum": loss.sum(), "none": loss}[reduction]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_class_indices(reduction, smoothing):
    x = r(4, 5) * 3
    y = np.array([0, 4, 2, 2], np.int32)
    out = Tensor(x).cross_entropy(Tensor(y), reduction=reduction, label_smoothing=smoothing)
    close(out, _np_cross_entropy(x, y, smoothing, reduction), LOOSE)


def test_cross_entropy_probabilities_spatial_and_ignore():
    x = r(4, 5) * 3
    p = _np_softmax(r(4, 5).astype(np.float64), -1).astype(np.float32)
    close(Tensor(x).cross_entropy(Tensor(p)), _np_cross_entropy(x, p), LOOSE)
    close(Tensor(x).cross_entropy(Tensor(p), label_smoothing=0.2), _np_cross_entropy(x, p, 0.2), LOOSE)
    xs, ys = r(2, 3, 4), np.array([[0, 1, 2, 1], [2, 2, 0, 1]], np.int32)  # (N, C, d): class dim 1
    close(Tensor(xs).cross_entropy(Tensor(ys), reduction="none"), _np_cross_entropy(xs, ys, reduction="none"), LOOSE)
    y = np.array([0, -100, 2, 1], np.int32)
    close(Tensor(x).cross_entropy(Tensor(y)), _np_cross_entropy(x, y), LOOSE)
    close(Tensor(x[0]).cross_entropy(Tensor(np.int32(3))), _np_cross_entropy(x[0], np.int32(3)), LOOSE)
    big = np.array([[1000.0, 0.0, -1000.0]], np.float32)  # log_softmax: no overflow
    close(Tensor(big).cross_entropy(Tensor([2])), 2000.0, LOOSE)


def test_sparse_categorical_crossentropy():
    x, y = r(2, 3, 5) * 2, np.array([[1, 4, -1], [0, 0, 3]], np.int32)  # class dim last; -1 ignored
    logp = _np_log_softmax(x, -1)
    keep = y != -1
    nll = -np.take_along_axis(logp, np.where(keep, y, 0)[..., None], -1)[..., 0]
    close(Tensor(x).sparse_categorical_crossentropy(Tensor(y)), np.where(keep, nll, 0).sum() / keep.sum(), LOOSE)
    smooth = np.where(keep, 0.9 * nll - 0.1 * logp.mean(-1), 0).sum() / keep.sum()
    close(Tensor(x).sparse_categorical_crossentropy(Tensor(y), label_smoothing=0.1), smooth, LOOSE)


def test_one_hot():
    assert Tensor([2, 0]).one_hot(3).tolist() == [[0, 0, 1], [1, 0, 0]]


# ---------------------------------------------------------------- 0-d and zero-size tensors


def test_zero_dim_tensors():
    s = Tensor(3.0)
    assert s.shape == () and s.numpy().shape == () and s.item() == 3.0
    assert (s * Tensor(A)).shape == (3, 4)
    close(s * Tensor(A), 3 * A)
    close(Tensor(A) + s, A + 3)
    assert (s + 1).item() == 4.0 and s.sum().item() == 3.0 and s.max(0).item() == 3.0
    assert s.reshape(1, 1).shape == (1, 1) and Tensor(A)[1, 2].shape == ()
    assert Tensor(A).sum().shape == () and Tensor(A).sum(keepdim=True).shape == (1, 1)
    assert s.exp().shape == () and s.exp().item() == pytest.approx(math.exp(3), rel=1e-5)
    assert Tensor.ones(()).realize().uop.shape == ()
    assert Tensor(2).unsqueeze(0).tolist() == [2] and s.flip(0).item() == 3.0


@pytest.mark.parametrize("shape", [(0,), (2, 0, 3)])
def test_zero_size_tensors(shape):
    e = Tensor(np.zeros(shape, np.float32))
    assert e.numpy().shape == shape and e.tolist() == np.zeros(shape).tolist()
    for t in (
        e + 1,
        e * Tensor(np.zeros(shape[-1:], np.float32)),
        e.exp(),
        e.reshape(-1),
        e.T,
        e.pad(((1, 1),) * e.ndim),
    ):
        t.realize()
    assert e.pad(((1, 1),) * e.ndim).numel() == math.prod(s + 2 for s in shape)
    assert (e + 1).numpy().shape == shape and e.realize() is e
    assert e.sum().item() == 0 and e.sum().dtype is dtypes.float32
    assert math.isnan(e.mean().item())
    with pytest.raises(RuntimeError):
        e.max()
    if len(shape) == 3:
        np.testing.assert_array_equal(e.sum(1).numpy(), np.zeros((2, 3)))
        assert e.max(0).shape == (0, 3) and e.sum(0, keepdim=True).shape == (1, 0, 3)
        assert (e @ Tensor(np.ones((3, 2), np.float32))).shape == (2, 0, 2)
        np.testing.assert_array_equal(Tensor(np.zeros((2, 0), np.float32)).sum(1).numpy(), [0, 0])
    assert Tensor.zeros(*shape).numpy().shape == shape and Tensor.arange(0).shape == (0,)
    assert Tensor.cat(e, e).shape == (2 * shape[0],) + shape[1:]


# ---------------------------------------------------------------- PyTorch (where installed)


def test_against_torch():
    torch = pytest.importorskip("torch")
    x = r(4, 5) * 2
    y = np.array([1, 0, 4, 2])
    tx = torch.tensor(x)
    close(Tensor(x).softmax(-1), torch.softmax(tx, -1).numpy(), LOOSE)
    close(Tensor(x).gelu(approximate="tanh"), torch.nn.functional.gelu(tx, approximate="tanh").numpy(), LOOSE)
    close(Tensor(x).var(0), tx.var(0).numpy(), LOOSE)
    ce = torch.nn.functional.cross_entropy(tx, torch.tensor(y), label_smoothing=0.1).item()
    close(Tensor(x).cross_entropy(Tensor(y.astype(np.int32)), label_smoothing=0.1), ce, LOOSE)
    # promotion agrees with PyTorch's, up to the default int (int64 there, int32 here)
    i32, b = torch.tensor([1, 2], dtype=torch.int32), torch.tensor([True])
    for ours, theirs in [
        (Tensor([1, 2]) * 0.5, i32 * 0.5),
        (Tensor([True]) + 1, b + 1),
        (Tensor(np.ones(2, np.int8)) + 1000, torch.ones(2, dtype=torch.int8) + 1000),
        (Tensor([1, 2]) / 2, i32 / 2),
        (Tensor(np.ones(2, np.float16)) * 2.5, torch.ones(2, dtype=torch.float16) * 2.5),
    ]:
        assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.").replace("int64", "int32")
    close(Tensor(x).logsumexp(1), torch.logsumexp(tx, 1).numpy(), LOOSE)
    close(Tensor(x).std(1, correction=0), tx.std(1, correction=0).numpy(), LOOSE)

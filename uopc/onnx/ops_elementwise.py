"""Elementwise ONNX ops: arithmetic, comparisons, logic, bit ops, casts and activations, over Tensor methods.

    Add(x, y) -> x + y          Relu(x) -> x.relu()        Cast(x, to=INT64) -> x.cast(dtypes.int64)

Each binary op broadcasts NumPy-style and keeps ONNX's dtype rule (both inputs share a type, the output has it).
The arithmetic and comparison ops also have NumPy versions, for shape arithmetic on host-known values.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from uopc import Tensor, dtypes
from uopc.onnx.graph import Node, np_dtype, onnx_dtype, op

# ---------------------------------------------------------------- host (NumPy) versions


def _hbin(fn):
    def run(n: Node, a, b):
        with np.errstate(all="ignore"):
            out = fn(a, b)
        return np.asarray(out).astype(a.dtype) if out.dtype != np.bool_ else out

    return run


def _hdiv(a, b):
    if np.issubdtype(a.dtype, np.integer):
        q = np.floor_divide(a, b)
        return q + ((np.remainder(a, b) != 0) & ((a < 0) ^ (b < 0))).astype(q.dtype)
    return np.divide(a, b)


def _hmod(n: Node, a, b):
    return (np.fmod(a, b) if n.attr("fmod", 0) else np.mod(a, b)).astype(a.dtype)


def _hvariadic(fn):
    def run(n: Node, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return np.asarray(out).astype(xs[0].dtype)

    return run


def _cast_to(n: Node):
    to = n["to"]  # a name before opset 6 ("FLOAT"), an enum value after
    return onnx_dtype(onnx.TensorProto.DataType.Value(to) if isinstance(to, str) else to)


def _hcast(n: Node, x):
    return x.astype(np_dtype(_cast_to(n)))


# ---------------------------------------------------------------- arithmetic


def _div(a: Tensor, b: Tensor) -> Tensor:
    if a.dtype.is_int or a.dtype.is_unsigned:
        return a.div(b, rounding_mode="trunc").cast(a.dtype)
    return a / b


def _pow(a: Tensor, b: Tensor) -> Tensor:
    if a.dtype.is_float:
        return a.pow(b.cast(a.dtype))
    wide = dtypes.float64
    return a.cast(wide).pow(b.cast(wide)).round().cast(a.dtype)


def _mod(n: Node, a, b):
    a, b = n.t(a), n.t(b)
    if n.attr("fmod", 0):
        return a.fmod(b)
    if not a.dtype.is_float:
        return a.mod(b)
    r = (b.isinf() & ~a.isinf()).where(
        a, a.fmod(b)
    )  # NumPy's mod: the sign of the divisor (mod(-5, inf) = inf, mod(inf, b) = nan)
    return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)


op("Add", host=_hbin(np.add))(lambda n, a, b: n.t(a) + n.t(b))
op("Sub", host=_hbin(np.subtract))(lambda n, a, b: n.t(a) - n.t(b))
op("Mul", host=_hbin(np.multiply))(lambda n, a, b: n.t(a) * n.t(b))
op("Div", host=_hbin(_hdiv))(lambda n, a, b: _div(n.t(a), n.t(b)))
op("Pow", host=_hbin(lambda a, b: np.power(a, b)))(lambda n, a, b: _pow(n.t(a), n.t(b)))
op("Mod", host=_hmod)(_mod)


def _variadic(fn):
    def run(n: Node, *xs):
        ts = [n.t(x) for x in xs]
        out = ts[0]
        for x in ts[1:]:
            out = fn(out, x)
        return out

    return run


def _mean(n: Node, *xs):
    return _variadic(lambda a, b: a + b)(n, *xs) / len(xs)


op("Sum", host=_hvariadic(np.add))(_variadic(lambda a, b: a + b))
op("Max", host=_hvariadic(np.maximum))(_variadic(lambda a, b: a.maximum(b)))
op("Min", host=_hvariadic(np.minimum))(_variadic(lambda a, b: a.minimum(b)))
op("Mean")(_mean)

# ---------------------------------------------------------------- comparisons and logic

op("Equal", host=_hbin(np.equal))(lambda n, a, b: n.t(a).eq(n.t(b)))
op("Less", host=_hbin(np.less))(lambda n, a, b: n.t(a) < n.t(b))
op("Greater", host=_hbin(np.greater))(lambda n, a, b: n.t(a) > n.t(b))
op("LessOrEqual", host=_hbin(np.less_equal))(lambda n, a, b: n.t(a) <= n.t(b))
op("GreaterOrEqual", host=_hbin(np.greater_equal))(lambda n, a, b: n.t(a) >= n.t(b))
op("And", host=_hbin(np.logical_and))(lambda n, a, b: n.t(a).bitwise_and(n.t(b)))
op("Or", host=_hbin(np.logical_or))(lambda n, a, b: n.t(a).bitwise_or(n.t(b)))
op("Xor", host=_hbin(np.logical_xor))(lambda n, a, b: n.t(a).bitwise_xor(n.t(b)))
op("Not", host=lambda n, x: np.logical_not(x))(lambda n, x: n.t(x).logical_not())
op("BitwiseAnd")(lambda n, a, b: n.t(a).bitwise_and(n.t(b)))
op("BitwiseOr")(lambda n, a, b: n.t(a).bitwise_or(n.t(b)))
op("BitwiseXor")(lambda n, a, b: n.t(a).bitwise_xor(n.t(b)))
op("BitwiseNot")(lambda n, x: n.t(x).bitwise_not())


@op("BitShift")
def _bitshift(n: Node, x, y):
    x, y = n.t(x), n.t(y)
    if n["direction"] == "LEFT":
        return x.bitwise_left_shift(y)
    return x.bitwise_right_shift(y)


def _hwhere(n: Node, c, a, b):
    return np.where(c, a, b).astype(a.dtype)


op("Where", host=_hwhere)(lambda n, c, a, b: n.t(c).bool().where(n.t(a), n.t(b)))

# ---------------------------------------------------------------- casts


@op("Cast", host=_hcast)
def _cast(n: Node, x):
    return n.t(x).cast(_cast_to(n))


def _hcastlike(n: Node, x, like):
    return x.astype(like.dtype)


@op("CastLike", host=_hcastlike)
def _castlike(n: Node, x, like):
    dt = like.dtype if isinstance(like, Tensor) else onnx_like(like)
    return n.t(x).cast(dt)


def onnx_like(a: np.ndarray):
    return dtypes.bfloat16 if a.dtype == np_dtype(dtypes.bfloat16) else dtypes.from_np(a.dtype)


# ---------------------------------------------------------------- unary math


def _unary(name: str, host=None):
    def run(n: Node, x):
        return getattr(n.t(x), name)()

    op(_ONNX_NAMES[name], host=host)(run)


_ONNX_NAMES = {
    "abs": "Abs",
    "neg": "Neg",
    "floor": "Floor",
    "ceil": "Ceil",
    "round": "Round",
    "sqrt": "Sqrt",
    "exp": "Exp",
    "log": "Log",
    "reciprocal": "Reciprocal",
    "sin": "Sin",
    "cos": "Cos",
    "tan": "Tan",
    "asin": "Asin",
    "acos": "Acos",
    "atan": "Atan",
    "sinh": "Sinh",
    "cosh": "Cosh",
    "tanh": "Tanh",
    "asinh": "Asinh",
    "acosh": "Acosh",
    "atanh": "Atanh",
    "erf": "Erf",
    "sign": "Sign",
    "isnan": "IsNaN",
    "relu": "Relu",
    "sigmoid": "Sigmoid",
    "softsign": "Softsign",
    "mish": "Mish",
    "hardswish": "HardSwish",
}
_HOST_UNARY = {
    "abs": np.abs,
    "neg": np.negative,
    "floor": np.floor,
    "ceil": np.ceil,
    "sqrt": np.sqrt,
    "sign": np.sign,
    "reciprocal": np.reciprocal,
}
for _name in _ONNX_NAMES:
    _h = _HOST_UNARY.get(_name)
    _unary(_name, None if _h is None else (lambda f: lambda n, x: np.asarray(f(x)).astype(x.dtype))(_h))


@op("IsInf")
def _isinf(n: Node, x):
    return n.t(x).isinf(bool(n.attr("detect_positive", 1)), bool(n.attr("detect_negative", 1)))


@op("Identity", host=lambda n, x: x)
def _identity(n: Node, x):
    return x


# ---------------------------------------------------------------- activations with parameters


@op("LeakyRelu")
def _leaky(n: Node, x):
    return n.t(x).leaky_relu(n.attr("alpha", 0.01))


@op("Elu")
def _elu(n: Node, x):
    return n.t(x).elu(n.attr("alpha", 1.0))


@op("Celu")
def _celu(n: Node, x):
    return n.t(x).celu(n.attr("alpha", 1.0))


@op("Selu")
def _selu(n: Node, x):
    x = n.t(x)
    alpha, gamma = n.attr("alpha", 1.67326319217681884765625), n.attr("gamma", 1.05070102214813232421875)
    return (x > 0).where(x, (x.exp() - 1) * alpha) * gamma


@op("HardSigmoid")
def _hardsigmoid(n: Node, x):
    x = n.t(x)
    return (x * n.attr("alpha", 0.2) + n.attr("beta", 0.5)).clip(0, 1)


@op("ThresholdedRelu")
def _thresholded(n: Node, x):
    x = n.t(x)
    return (x > n.attr("alpha", 1.0)).where(x, 0.0)


@op("Softplus")
def _softplus(n: Node, x):
    x = n.t(x)
    # log(1 + e^x) without overflow: max(x, 0) + log1p(e^-|x|)
    return x.relu() + (-x.abs()).exp().log1p()


@op("Gelu")
def _gelu(n: Node, x):
    return n.t(x).gelu(approximate=n.attr("approximate", "none"))


@op("Swish")
def _swish(n: Node, x):
    x = n.t(x)
    return x * (x * n.attr("alpha", 1.0)).sigmoid()


@op("PRelu")
def _prelu(n: Node, x, slope):
    x, slope = n.t(x), n.t(slope)
    if slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1] != x.shape[-1]:  # per channel (opset < 7)
        slope = slope.reshape(-1, *[1] * (x.ndim - 2))
    return (x < 0).where(x * slope, x)


@op("Shrink")
def _shrink(n: Node, x):
    x = n.t(x)
    lambd, bias = n.attr("lambd", 0.5), n.attr("bias", 0.0)
    out = (x < -lambd).where(x + bias, (x > lambd).where(x - bias, 0))
    return out.cast(x.dtype)


@op("Clip")
def _clip(n: Node, x, lo=None, hi=None):
    x = n.t(x)
    if n.opset < 11:
        lo, hi = n.attr("min", -math.inf), n.attr("max", math.inf)
        return x.clip(lo, hi)
    out = x
    if lo is not None:
        out = out.maximum(n.t(lo).cast(x.dtype))
    if hi is not None:
        out = out.minimum(n.t(hi).cast(x.dtype))
    return out

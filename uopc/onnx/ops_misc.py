"""ONNX quantization, bit casts and other ops that fit no other table, over Tensor methods.

    DequantizeLinear(q, scale, zp) -> (q.float() - zp) * scale
    QuantizeLinear(x, scale, zp)   -> clip(round_half_even(x / scale) + zp, qmin, qmax)

8-bit float and sub-byte formats are not uopc dtypes: models using them fail at the cast with a TypeError.
"""

from __future__ import annotations

import numpy as np

from uopc import Tensor, dtypes
from uopc.onnx.graph import OPS, Node, onnx_dtype, op


def _axis_shape(x: Tensor, s: Tensor, axis: int, block: int) -> Tensor:
    """A per-tensor, per-axis or blocked scale/zero point broadcast against x."""
    if s.ndim == 0 or s.numel() == 1:
        return s.reshape(())
    axis %= x.ndim
    if s.ndim == 1 and block == 0:
        return s.reshape(*[s.shape[0] if i == axis else 1 for i in range(x.ndim)])
    # blocked: repeat each scale `block` times along axis, cut to x's length
    return s.repeat_interleave(block, dim=axis).shrink(
        [(0, x.shape[axis]) if i == axis else None for i in range(x.ndim)]
    )


@op("DequantizeLinear")
def _dequantize(n: Node, q, scale, zp=None):
    q, s = n.t(q), n.t(scale)
    axis, block = n.attr("axis", 1), n.attr("block_size", 0)
    s = _axis_shape(q, s, axis, block)
    x = q.cast(dtypes.float32)
    if zp is not None:
        x = x - _axis_shape(q, n.t(zp), axis, block).cast(dtypes.float32)
    out_dt = n.attr("output_dtype", 0)
    return (x * s.cast(dtypes.float32)).cast(onnx_dtype(out_dt) if out_dt else s.dtype)


def _qrange(dt) -> tuple[int, int]:
    return int(dt.min), int(dt.max)


@op("QuantizeLinear")
def _quantize(n: Node, x, scale, zp=None):
    x, s = n.t(x), n.t(scale)
    axis, block = n.attr("axis", 1), n.attr("block_size", 0)
    out_dt = onnx_dtype(n.attr("output_dtype", 0)) if n.attr("output_dtype", 0) else None
    zt = None if zp is None else n.t(zp)
    dt = zt.dtype if zt is not None else out_dt or dtypes.uint8
    s = _axis_shape(x, s, axis, block).cast(dtypes.float32)
    y = _fdiv(x.cast(dtypes.float32), s).round()  # round half to even
    if zt is not None:
        y = y + _axis_shape(x, zt, axis, block).cast(dtypes.float32)
    lo, hi = _qrange(dt)
    return y.clip(lo, hi).cast(dt)


@op("DynamicQuantizeLinear")
def _dynamic_quantize(n: Node, x):
    x = n.t(x).cast(dtypes.float32)
    lo, hi = x.min().minimum(0.0), x.max().maximum(0.0)
    scale = _fdiv(hi - lo, Tensor(np.array(255.0, np.float32)))
    zp = _fdiv(-lo, scale).round().clip(0, 255)
    y = (_fdiv(x, scale).round() + zp).clip(0, 255).cast(dtypes.uint8)
    return y, scale, zp.cast(dtypes.uint8)


def _fdiv(a: Tensor, b: Tensor) -> Tensor:
    """a / b rounded as IEEE float32 division rounds (through float64): a quotient that float32 rounds to x.5 must
    round to even next, as onnx's reference does; a * (1/b) in float32 can land on the other side."""
    return (a.cast(dtypes.float64) / b.cast(dtypes.float64)).cast(dtypes.float32)


def _centered(n: Node, v, zp, axis: int | None = None) -> Tensor:
    t = n.t(v).cast(dtypes.int32)
    if zp is None:
        return t
    z = n.t(zp).cast(dtypes.int32)
    if z.numel() > 1 and axis is not None:
        z = z.reshape(*[z.shape[0] if i == axis % t.ndim else 1 for i in range(t.ndim)])
    return t - z.reshape(()) if z.numel() == 1 else t - z


@op("MatMulInteger")
def _matmul_integer(n: Node, a, b, azp=None, bzp=None):
    ai = _centered(n, a, azp, -2 if azp is not None and n.t(azp).numel() > 1 else None)
    bi = _centered(n, b, bzp, -1)
    return (ai @ bi).cast(dtypes.int32)


@op("ConvInteger")
def _conv_integer(n: Node, x, w, xzp=None, wzp=None):
    from_nn = _conv_like(n)
    xi = _centered(n, x, xzp)
    wi = _centered(n, w, wzp, 0)
    return from_nn(n, xi.cast(dtypes.float32), wi.cast(dtypes.float32)).round().cast(dtypes.int32)


def _conv_like(n: Node):
    return OPS["Conv"]


@op("QLinearMatMul")
def _qlinear_matmul(n: Node, a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp):
    fa = _dequantize(n, a, a_s, a_zp)
    fb = _dequantize(n, b, b_s, b_zp)
    return _requant(n, (fa.float() @ fb.float()), y_s, y_zp)


def _requant(n: Node, y: Tensor, y_s, y_zp) -> Tensor:
    s, z = n.t(y_s).cast(dtypes.float32), n.t(y_zp)
    lo, hi = _qrange(z.dtype)
    return ((y / s.reshape(())).round() + z.cast(dtypes.float32).reshape(())).clip(lo, hi).cast(z.dtype)


@op("QLinearConv")
def _qlinear_conv(n: Node, x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, b=None):
    xf = (n.t(x).cast(dtypes.float32) - n.t(x_zp).cast(dtypes.float32).reshape(())) * n.t(x_s).reshape(())
    wt, ws, wz = n.t(w), n.t(w_s).cast(dtypes.float32), n.t(w_zp).cast(dtypes.float32)
    shape = (-1,) + (1,) * (wt.ndim - 1)
    wf = (wt.cast(dtypes.float32) - wz.reshape(shape if wz.numel() > 1 else ())) * ws.reshape(
        shape if ws.numel() > 1 else ()
    )
    y = _conv_like(n)(n, xf, wf)
    if b is not None:
        bias = n.t(b).cast(dtypes.float32) * (n.t(x_s).reshape(()) * ws.reshape(-1))
        y = y + bias.reshape(-1, *[1] * (y.ndim - 2))
    return _requant(n, y, y_s, y_zp)


@op("BitCast")
def _bitcast(n: Node, x):
    return n.t(x).bitcast(onnx_dtype(n["to"]))


# ---------------------------------------------------------------- random numbers (uopc's Philox stream, Node.draw: the
# values differ from onnx's NumPy-generated expectations)


def _rand_dtype(n: Node, like=None):
    dt = n.attr("dtype")
    if dt is not None:
        return onnx_dtype(dt)
    return like.dtype if isinstance(like, Tensor) else dtypes.float32 if like is None else dtypes.from_np(like.dtype)


def _uniform(n: Node, shape, like=None) -> Tensor:
    dt = _rand_dtype(n, like)
    lo, hi = n.attr("low", 0.0), n.attr("high", 1.0)
    return n.draw(lambda: Tensor.uniform(*shape, low=lo, high=hi, dtype=dtypes.float32)).cast(dt)


def _normal(n: Node, shape, like=None) -> Tensor:
    dt = _rand_dtype(n, like)
    mean, std = n.attr("mean", 0.0), n.attr("scale", 1.0)
    return n.draw(lambda: Tensor.normal(*shape, mean=mean, std=std, dtype=dtypes.float32)).cast(dt)


op("RandomUniform")(lambda n: _uniform(n, n["shape"]))
op("RandomNormal")(lambda n: _normal(n, n["shape"]))
op("RandomUniformLike")(lambda n, x: _uniform(n, x.shape, x))
op("RandomNormalLike")(lambda n, x: _normal(n, x.shape, x))


@op("Bernoulli")
def _bernoulli(n: Node, p):
    p = n.t(p)
    dt = onnx_dtype(n["dtype"]) if n.attr("dtype") is not None else p.dtype
    return (n.draw(lambda: Tensor.rand(*p.shape)) < p.float()).cast(dt)

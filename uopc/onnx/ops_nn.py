"""ONNX neural-network ops: convolutions, pooling, normalizations, dropout, over Tensor methods.

    Conv(x, w, b, pads=[1, 1, 1, 1], strides=[2, 2]) -> x.conv2d(w, b, stride=(2, 2), padding=(1, 1))
    MaxPool(x, kernel_shape=[3, 3], pads=[0, 0, 1, 1]) -> x padded with -inf, windows by unfold, max

ONNX's padding is per side (`pads` = all begins, then all ends) or `auto_pad` (SAME_UPPER/SAME_LOWER/VALID), and
pooling has ceil_mode and dilations: the pads and output sizes are computed here, on the host, from the shapes.
"""

from __future__ import annotations

import math

import numpy as np

from uopc import Tensor, dtypes
from uopc.onnx.graph import Node, op


def _same_pads(ins, ks, st, dl, lower: bool) -> list[int]:
    begins, ends = [], []
    for i, k, s, d in zip(ins, ks, st, dl):
        out = -(-i // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - i, 0)
        lo = total - total // 2 if lower else total // 2
        begins.append(lo)
        ends.append(total - lo)
    return begins + ends


def _window_args(n: Node, spatial, ks) -> tuple[list[int], list[int], list[int]]:
    """strides, dilations and pads (begins then ends) of a conv or pool node."""
    k = len(ks)
    st = list(n.attr("strides", [1] * k))
    dl = list(n.attr("dilations", [1] * k))
    auto = n.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(spatial, ks, st, dl, auto == "SAME_LOWER")
    elif auto == "VALID":
        pads = [0] * (2 * k)
    else:
        pads = list(n.attr("pads", [0] * (2 * k)))
    return st, dl, pads


def _pad_spatial(x: Tensor, pads: list[int], value: float = 0.0) -> Tensor:
    k = len(pads) // 2
    if not any(pads):
        return x
    return x.pad([(0, 0)] * (x.ndim - k) + [(pads[i], pads[i + k]) for i in range(k)], value=value)


# ---------------------------------------------------------------- convolutions


@op("Conv")
def _conv(n: Node, x, w, b=None):
    x, w = n.t(x), n.t(w)
    ks = list(n.attr("kernel_shape", w.shape[2:]))
    st, dl, pads = _window_args(n, x.shape[2:], ks)
    x = _pad_spatial(x, pads)
    bias = None if b is None else n.t(b)
    return x.conv2d(w, bias, stride=tuple(st), padding=0, dilation=tuple(dl), groups=n.attr("group", 1))


@op("ConvTranspose")
def _conv_transpose(n: Node, x, w, b=None):
    x, w = n.t(x), n.t(w)
    k = w.ndim - 2
    ks = list(n.attr("kernel_shape", w.shape[2:]))
    st = list(n.attr("strides", [1] * k))
    dl = list(n.attr("dilations", [1] * k))
    outp = list(n.attr("output_padding", [0] * k))
    sp = x.shape[2:]
    full = [(i - 1) * s + (kk - 1) * d + 1 + o for i, s, kk, d, o in zip(sp, st, ks, dl, outp)]
    out_shape = n.attr("output_shape")
    auto = n.attr("auto_pad", "NOTSET")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = list(out_shape)[-k:] if out_shape is not None else [i * s for i, s in zip(sp, st)]
        total = [f - t for f, t in zip(full, target)]
        if auto == "SAME_UPPER":
            begins = [t // 2 for t in total]
        else:
            begins = [t - t // 2 for t in total]
        pads = begins + [t - bgn for t, bgn in zip(total, begins)]
    elif auto == "VALID":
        pads = [0] * (2 * k)
    else:
        pads = list(n.attr("pads", [0] * (2 * k)))
    y = x.conv_transpose2d(w, None, stride=tuple(st), padding=0, groups=n.attr("group", 1), dilation=tuple(dl))
    if any(outp):  # output_padding adds rows past the last input's reach: zeros before the bias
        y = y.pad([(0, 0), (0, 0)] + [(0, o) for o in outp])
    y = y.pad([(0, 0), (0, 0)] + [(-pads[i], -pads[i + k]) for i in range(k)])  # negative pads cut
    if b is not None:
        y = y + n.t(b).reshape(-1, *[1] * k)
    return y


# ---------------------------------------------------------------- pooling


def _pool_geometry(n: Node, spatial, ks):
    """strides, dilations, pads (begins + ends, widened on the right for ceil_mode) and output sizes."""
    st, dl, pads = _window_args(n, spatial, ks)
    k = len(ks)
    ceil = n.attr("ceil_mode", 0)
    auto = n.attr("auto_pad", "NOTSET")
    outs, extra = [], []
    for j, (i, kk, s, d) in enumerate(zip(spatial, ks, st, dl)):
        dk = (kk - 1) * d + 1
        span = i + pads[j] + pads[j + k] - dk
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-i // s)
        elif ceil:
            o = -(-span // s) + 1
            if (o - 1) * s >= i + pads[j]:  # the last window must start inside the input or its left padding
                o -= 1
        else:
            o = span // s + 1
        outs.append(o)
        extra.append(max((o - 1) * s + dk - (i + pads[j] + pads[j + k]), 0))
    return st, dl, pads, outs, extra


def _windows(x: Tensor, ks, st, dl) -> Tensor:
    """(N, C, *padded) -> (N, C, *out, *k): sliding windows by unfold, one spatial dim at a time."""
    for j, (kk, s, d) in enumerate(zip(ks, st, dl)):
        x = x.unfold(2 + j, (kk - 1) * d + 1, s)  # the window dim goes last, so spatial dim j stays at 2 + j
        if d > 1:
            x = x[..., ::d]
    return x


def _pooled(n: Node, x: Tensor, value: float):
    ks = list(n["kernel_shape"])
    st, dl, pads, outs, extra = _pool_geometry(n, x.shape[2:], ks)
    k = len(ks)
    full = pads[:k] + [p + e for p, e in zip(pads[k:], extra)]
    xp = _pad_spatial(x, full, value)
    return _windows(xp, ks, st, dl), (ks, st, dl, pads, extra)


@op("MaxPool")
def _max_pool(n: Node, x):
    x = n.t(x)
    w, (ks, st, dl, pads, extra) = _pooled(n, x, -math.inf if x.dtype.is_float else x.dtype.min)
    k = len(ks)
    red = tuple(range(w.ndim - k, w.ndim))
    y = w.max(red)
    if len(n.proto.output) < 2 or not n.proto.output[1]:
        return y
    sp = x.shape[2:]
    # the flat index of each element in the whole input (row-major, or column-major in space with storage_order)
    pos = np.arange(int(np.prod(sp)), dtype=np.int64).reshape(sp)
    if n.attr("storage_order", 0):
        pos = np.arange(int(np.prod(sp)), dtype=np.int64).reshape(sp[::-1]).T
    base = (np.arange(x.shape[0] * x.shape[1], dtype=np.int64) * int(np.prod(sp))).reshape(x.shape[0], x.shape[1])
    full_pos = base.reshape(*base.shape, *[1] * k) + pos
    full = pads[:k] + [p + e for p, e in zip(pads[k:], extra)]
    pw = _windows(_pad_spatial(Tensor(full_pos), full, -1), ks, st, dl)
    flat_w = w.reshape(*w.shape[: w.ndim - k], -1)
    am = flat_w.argmax(-1, keepdim=True)
    idx = pw.reshape(*pw.shape[: pw.ndim - k], -1).gather(-1, am).reshape(*y.shape)
    return y, idx


@op("AveragePool")
def _avg_pool(n: Node, x):
    x = n.t(x)
    w, (ks, st, dl, pads, extra) = _pooled(n, x, 0.0)
    k = len(ks)
    red = tuple(range(w.ndim - k, w.ndim))
    total = w.sum(red)
    # the divisor of each window: its elements inside the input (and the padding, with count_include_pad), never the
    # ceil_mode overhang
    sp = x.shape[2:]
    ones = np.ones(sp, np.float32)
    inc = n.attr("count_include_pad", 0)
    cnt = np.pad(ones, [(pads[j], pads[j + k]) for j in range(k)], constant_values=1.0 if inc else 0.0)
    cnt = np.pad(cnt, [(0, e) for e in extra])
    cw = _windows(Tensor(cnt.reshape(1, 1, *cnt.shape)), ks, st, dl)
    counts = cw.sum(tuple(range(cw.ndim - k, cw.ndim))).realize()
    return (total / counts.cast(total.dtype)).cast(x.dtype)


@op("LpPool")
def _lp_pool(n: Node, x):
    x = n.t(x)
    p = n.attr("p", 2)
    w, (ks, *_rest) = _pooled(n, x, 0.0)
    k = len(ks)
    return (w.abs() ** p).sum(tuple(range(w.ndim - k, w.ndim))) ** (1.0 / p)


def _spatial_axes(x: Tensor) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


op("GlobalAveragePool")(lambda n, x: n.t(x).mean(_spatial_axes(n.t(x)), keepdim=True))
op("GlobalMaxPool")(lambda n, x: n.t(x).max(_spatial_axes(n.t(x)), keepdim=True))


@op("GlobalLpPool")
def _global_lp(n: Node, x):
    x, p = n.t(x), n.attr("p", 2)
    return (x.abs() ** p).sum(_spatial_axes(x), keepdim=True) ** (1.0 / p)


# ---------------------------------------------------------------- normalization


def _per_channel(v: Tensor, ndim: int) -> Tensor:
    return v.reshape(-1, *[1] * (ndim - 2))


@op("BatchNormalization")
def _batchnorm(n: Node, x, scale, bias, mean, var):
    x, scale, bias, mean, var = (n.t(v) for v in (x, scale, bias, mean, var))
    eps = n.attr("epsilon", 1e-5)
    training = n.attr("training_mode", 0) or (n.opset < 9 and not n.attr("is_test", 1) and len(n.proto.output) > 1)
    if not training:
        inv = (_per_channel(var, x.ndim) + eps).rsqrt()
        y = (x - _per_channel(mean, x.ndim)) * inv * _per_channel(scale, x.ndim) + _per_channel(bias, x.ndim)
        return y.cast(x.dtype)
    axes = (0, *_spatial_axes(x))
    bm, bv = x.mean(axes), x.var(axes, correction=0)
    y = (x - _per_channel(bm, x.ndim)) * (_per_channel(bv, x.ndim) + eps).rsqrt()
    y = y * _per_channel(scale, x.ndim) + _per_channel(bias, x.ndim)
    mom = n.attr("momentum", 0.9)
    return y, mean * mom + bm * (1 - mom), var * mom + bv * (1 - mom)


@op("InstanceNormalization")
def _instancenorm(n: Node, x, scale, bias):
    x, scale, bias = n.t(x), n.t(scale), n.t(bias)
    axes = _spatial_axes(x)
    m, v = x.mean(axes, keepdim=True), x.var(axes, keepdim=True, correction=0)
    y = (x - m) * (v + n.attr("epsilon", 1e-5)).rsqrt()
    return y * _per_channel(scale, x.ndim) + _per_channel(bias, x.ndim)


@op("LayerNormalization")
def _layernorm(n: Node, x, scale, bias=None):
    x, scale = n.t(x), n.t(scale)
    axis = n.attr("axis", -1) % x.ndim
    axes = tuple(range(axis, x.ndim))
    xf = x.float() if n.attr("stash_type", 1) == 1 and x.dtype is not dtypes.float64 else x
    m = xf.mean(axes, keepdim=True)
    d = xf - m
    inv = ((d * d).mean(axes, keepdim=True) + n.attr("epsilon", 1e-5)).rsqrt()
    y = (d * inv).cast(x.dtype) * scale
    if bias is not None:
        y = y + n.t(bias)
    return y, m, inv


@op("LpNormalization")
def _lpnorm(n: Node, x):
    x = n.t(x)
    axis, p = n.attr("axis", -1), n.attr("p", 2)
    norm = x.abs().sum(axis, keepdim=True) if p == 1 else (x * x).sum(axis, keepdim=True).sqrt()
    return (norm == 0).where(0.0, x / norm).cast(x.dtype)


@op("LRN")
def _lrn(n: Node, x):
    x = n.t(x)
    size = n["size"]
    alpha, beta, bias = n.attr("alpha", 1e-4), n.attr("beta", 0.75), n.attr("bias", 1.0)
    sq = (x * x).pad([(0, 0), ((size - 1) // 2, size // 2)] + [(0, 0)] * (x.ndim - 2))
    win = sq.unfold(1, size, 1).sum(-1)
    return x / (bias + alpha / size * win) ** beta


@op("Dropout")
def _dropout(n: Node, x, ratio=None, training=None):
    x = n.t(x)
    train = n.host(training) if training is not None else None
    if train is not None and bool(train.reshape(-1)[0]):
        r = 0.5 if ratio is None else float(n.host(ratio).reshape(-1)[0])
        if r != 0:  # uopc's random stream: not the numbers onnx's NumPy-made expectations hold
            keep = n.draw(lambda: Tensor.rand(*x.shape)) >= r
            return (keep.where(x, 0.0) / (1 - r)).cast(x.dtype), keep
    mask = Tensor.full(x.shape, True, dtype=dtypes.bool) if x.ndim else Tensor(np.array(True))
    return x, mask

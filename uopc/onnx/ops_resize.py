"""ONNX Resize and Upsample: every coordinate mode, nearest/linear/cubic, antialias, as one matrix per axis.

Resizing is separable: along each resized axis an output element is a weighted sum of input elements, so the
weights form an (out, in) matrix computed here on the host from the shapes and attributes, and the Tensor graph is

    y = x.transpose(d, -1) @ M_d.T  (then transposed back)    for each resized axis d
    y = x[..., idx_d, ...]                                    when every weight row is one-hot (nearest)

tf_crop_and_resize's extrapolation_value fills the outputs whose source coordinate falls outside the input.
"""

from __future__ import annotations

import math

import numpy as np

from uopc import Tensor, dtypes
from uopc.onnx.graph import Node, op


def _source_coord(mode: str, y: float, scale: float, i: int, o: int, roi: tuple[float, float] | None) -> float:
    """The input coordinate of output index y (ONNX's coordinate_transformation_mode)."""
    ow = scale * i  # the output length before rounding
    if mode == "align_corners":
        return 0.0 if ow == 1 else y * (i - 1) / (ow - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        lo, hi = roi
        if o == 1:
            return (hi - lo) * (i - 1) / 2 + lo * (i - 1)
        return y * (hi - lo) * (i - 1) / (o - 1) + lo * (i - 1)
    if mode == "pytorch_half_pixel":
        return -0.5 if o == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = o / ow
        return i / 2 * (1 - adjustment) + (y + 0.5) / scale - 0.5
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    raise ValueError(f"Resize: unknown coordinate_transformation_mode {mode!r}")


def _cubic(A: float, x: float) -> float:
    x = abs(x)
    if x <= 1:
        return (A + 2) * x**3 - (A + 3) * x**2 + 1
    if x < 2:
        return A * x**3 - 5 * A * x**2 + 8 * A * x - 4 * A
    return 0.0


def _coeffs(kind: str, ratio: float, scale: float, n: Node, antialias: bool) -> np.ndarray:
    """The weights of the neighbours base + (1 - len/2) .. base + len/2 for a coordinate `ratio` past `base`."""
    if kind == "nearest":
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        nm = n.attr("nearest_mode", "round_prefer_floor") if n.opset >= 11 else "floor"
        if n.op == "Upsample":
            nm = "floor"
        pick_hi = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False, "ceil": True}
        return np.array([0.0, 1.0]) if pick_hi[nm] else np.array([1.0, 0.0])
    s = min(scale, 1.0) if antialias else 1.0
    if kind == "linear":
        start = int(math.floor(-1 / s) + 1)
        args = (np.arange(start, 2 - start) - ratio) * s
        c = np.clip(1 - np.abs(args), 0, 1)
    else:
        A = n.attr("cubic_coeff_a", -0.75)
        start = int(math.floor(-2 / s) + 1)
        c = np.array([_cubic(A, s * (k - ratio)) for k in range(start, 2 - start)])
    return c / c.sum() if antialias else c


def _matrix(n: Node, kind: str, mode: str, i: int, o: int, scale: float, roi) -> tuple[np.ndarray, np.ndarray]:
    """The (o, i) weights of one axis, and a flag per output row: its source lies outside (tf_crop_and_resize)."""
    m = np.zeros((o, i), np.float64)
    outside = np.zeros(o, bool)
    antialias = bool(n.attr("antialias", 0)) and kind != "nearest" and scale < 1
    exclude = bool(n.attr("exclude_outside", 0))
    for y in range(o):
        x = _source_coord(mode, float(y), scale, i, o, roi)
        if mode == "tf_crop_and_resize" and (x < 0 or x > i - 1):
            outside[y] = True
            continue
        base = math.floor(x) if not float(x).is_integer() else int(x) - 1
        ratio = x - base
        c = _coeffs(kind, ratio, scale, n, antialias)
        k = len(c)
        idx = base + np.arange(1 - k // 2, k // 2 + 1)
        if exclude:
            c = np.where((idx >= 0) & (idx < i), c, 0.0)
            c = c / c.sum() if c.sum() else c
        for w, j in zip(c, np.clip(idx, 0, i - 1)):
            m[y, j] += w
    return m, outside


def _sizes_and_scales(n: Node, x: Tensor, roi, scales, sizes):
    """(axes, input sizes, output sizes, scales, roi pairs) of the resized axes."""
    r = x.ndim
    axes = [a % r for a in n.attr("axes", list(range(r)))]
    sc = None if scales is None or n.host(scales).size == 0 else [float(v) for v in n.host(scales).reshape(-1)]
    sz = None if sizes is None or n.host(sizes).size == 0 else n.ints(sizes)
    ins = [x.shape[a] for a in axes]
    if sz is not None:
        policy = n.attr("keep_aspect_ratio_policy", "stretch")
        if policy == "stretch":
            sc = [o / i for o, i in zip(sz, ins)]
            outs = list(sz)
        else:
            f = (min if policy == "not_larger" else max)(o / i for o, i in zip(sz, ins))
            sc = [f] * len(ins)
            outs = [int(f * i + 0.5) for i in ins]
    else:
        if sc is None:
            raise n.fail("needs scales or sizes")
        outs = [int(math.floor(i * s)) for i, s in zip(ins, sc)]
    rv = None if roi is None or n.host(roi).size == 0 else [float(v) for v in n.host(roi).reshape(-1)]
    k = len(axes)
    rois = [(rv[j], rv[j + k]) if rv is not None else (0.0, 1.0) for j in range(k)]
    return axes, ins, outs, sc, rois


def _resize(n: Node, x: Tensor, roi, scales, sizes) -> Tensor:
    axes, ins, outs, sc, rois = _sizes_and_scales(n, x, roi, scales, sizes)
    kind = n.attr("mode", "nearest")
    mode = n.attr("coordinate_transformation_mode", "half_pixel") if n.opset >= 11 else "asymmetric"
    if n.op == "Upsample":
        mode = "asymmetric"
    y = x
    masks = []
    for a, i, o, s, rr in zip(axes, ins, outs, sc, rois):
        if i == o and s == 1.0 and mode != "tf_crop_and_resize":
            continue
        m, outside = _matrix(n, kind, mode, i, o, s, rr)
        one_hot = np.all((m == 0) | (m == 1)) and np.all(m.sum(1) == 1)
        if one_hot:
            idx = Tensor(m.argmax(1).astype(np.int64))
            y = y[(slice(None),) * a + (idx,)]
        else:
            ft = y.dtype if y.dtype.is_float else dtypes.float32
            mt = Tensor(m.T.astype(ft.np if ft is not dtypes.bfloat16 else np.float32)).cast(ft)
            y = (y.cast(ft).transpose(a, -1) @ mt).transpose(a, -1)
        if outside.any():
            shape = [1] * x.ndim
            shape[a] = o
            masks.append(outside.reshape(shape))
    if masks:
        out_mask = masks[0]
        for mm in masks[1:]:
            out_mask = out_mask | mm
        fill = n.attr("extrapolation_value", 0.0)
        y = Tensor(np.broadcast_to(out_mask, y.shape).copy()).where(Tensor.full(y.shape, fill, dtype=y.dtype), y)
    if y.dtype is not x.dtype:  # integer images: round to the nearest, saturate
        lo, hi = x.dtype.min, x.dtype.max
        y = y.round().clip(lo, hi).cast(x.dtype)
    return y


@op("Resize")
def _resize_op(n: Node, x, roi=None, scales=None, sizes=None):
    x = n.t(x)
    if n.opset < 11:  # Resize-10: (X, scales)
        return _resize(n, x, None, roi, None)
    return _resize(n, x, roi, scales, sizes)


@op("Upsample")
def _upsample(n: Node, x, scales=None):
    x = n.t(x)
    if scales is None:
        scales = np.array(n["scales"], np.float32)
    return _resize(n, x, None, scales, None)

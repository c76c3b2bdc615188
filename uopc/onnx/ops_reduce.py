"""ONNX reductions, softmax family, cumulative ops, matrix products and top-k, over Tensor methods.

    ReduceMean(x, axes=[1], keepdims=1) -> x.mean(axis=(1,), keepdim=True)
    Gemm(a, b, c, transB=1) -> a @ b.T * alpha + c * beta

Reductions take their axes as an attribute before opset 13 (18 for most) and as an optional input after, with
`noop_with_empty_axes`; an empty reduced set gives the op's identity (0 for sums, -inf/+inf for max/min).
"""

from __future__ import annotations

import numpy as np

from uopc import Tensor, dtypes
from uopc.onnx.graph import Node, op

# opset where each reduction's axes moved from attribute to input
_AXES_INPUT_SINCE = {"ReduceSum": 13}


def _axes(n: Node, x_ndim: int, axes_in) -> tuple[int, ...] | None:
    """The reduced axes (normalized), or None for 'no reduction' (noop_with_empty_axes with no axes)."""
    since = _AXES_INPUT_SINCE.get(n.op, 18)
    axes = n.attr("axes") if n.opset < since else n.ints(axes_in)
    if not axes:
        if n.attr("noop_with_empty_axes", 0) and n.opset >= since:
            return None
        return tuple(range(x_ndim))
    out = tuple(sorted({a % x_ndim if x_ndim else 0 for a in axes}))
    return out


def _reduce(fn, identity):
    def run(n: Node, x, axes_in=None):
        x = n.t(x)
        axes = _axes(n, x.ndim, axes_in)
        keep = bool(n.attr("keepdims", 1))
        if axes is None:
            return fn(x, None, None, noop=True)
        if x.ndim == 0:
            return fn(x, None, keep, noop=True)
        shape = [1 if i in axes else s for i, s in enumerate(x.shape)] if keep else []
        if not keep:
            shape = [s for i, s in enumerate(x.shape) if i not in axes]
        if any(x.shape[a] == 0 for a in axes):  # an empty set: the identity of the reduction
            ident = identity(x.dtype) if callable(identity) else identity
            return Tensor.full(tuple(shape), ident, dtype=x.dtype)
        return fn(x, axes, keep, noop=False)

    return run


def _float(x: Tensor) -> Tensor:
    return x if x.dtype.is_float else x.float()


def _sum(x, axes, keep, noop):
    return x if noop else x.sum(axes, keepdim=keep).cast(x.dtype)


def _mean(x, axes, keep, noop):
    return x if noop else x.mean(axes, keepdim=keep).cast(x.dtype)


def _max(x, axes, keep, noop):
    return x if noop else x.max(axes, keepdim=keep)


def _min(x, axes, keep, noop):
    return x if noop else x.min(axes, keepdim=keep)


def _prod(x, axes, keep, noop):
    return x if noop else x.prod(axes, keepdim=keep).cast(x.dtype)


def _l1(x, axes, keep, noop):
    return x.abs() if noop else x.abs().sum(axes, keepdim=keep).cast(x.dtype)


def _l2(x, axes, keep, noop):
    if noop:
        return x.abs()
    return _float(x * x).sum(axes, keepdim=keep).sqrt().cast(x.dtype)


def _sumsq(x, axes, keep, noop):
    return x * x if noop else (x * x).sum(axes, keepdim=keep).cast(x.dtype)


def _logsum(x, axes, keep, noop):
    return x.log() if noop else x.sum(axes, keepdim=keep).log()


def _logsumexp(x, axes, keep, noop):
    if noop:
        return x
    xf = _float(x)
    return xf.logsumexp(axes, keepdim=keep).cast(x.dtype)


op("ReduceSum")(_reduce(_sum, 0))
op("ReduceMean")(_reduce(_mean, float("nan")))
op("ReduceMax")(_reduce(_max, lambda dt: dt.min))
op("ReduceMin")(_reduce(_min, lambda dt: dt.max))
op("ReduceProd")(_reduce(_prod, 1))
op("ReduceL1")(_reduce(_l1, 0))
op("ReduceL2")(_reduce(_l2, 0))
op("ReduceSumSquare")(_reduce(_sumsq, 0))
op("ReduceLogSum")(_reduce(_logsum, float("-inf")))
op("ReduceLogSumExp")(_reduce(_logsumexp, float("-inf")))


def _arg(largest: bool):
    def run(n: Node, x):
        x = n.t(x)
        axis, keep = n.attr("axis", 0) % max(x.ndim, 1), bool(n.attr("keepdims", 1))
        last = n.attr("select_last_index", 0)
        src = x.flip(axis) if last else x
        idx = src.argmax(axis, keepdim=keep) if largest else src.argmin(axis, keepdim=keep)
        idx = idx.cast(dtypes.int64)
        return (x.shape[axis] - 1) - idx if last else idx

    return run


op("ArgMax")(_arg(True))
op("ArgMin")(_arg(False))


def _softmax(kind: str):
    def run(n: Node, x):
        x = n.t(x)
        if n.opset < 13:  # the input is seen as 2-D: (prod(shape[:axis]), prod(shape[axis:]))
            axis = n.attr("axis", 1) % max(x.ndim, 1)
            flat = x.reshape(int(np.prod(x.shape[:axis])), -1)
            return _soft(kind, flat, -1).reshape(x.shape)
        return _soft(kind, x, n.attr("axis", -1))

    return run


def _soft(kind: str, x: Tensor, axis: int) -> Tensor:
    # NOTE: materialize the input: if the max and the exp pass each recompute a fused producer (a conv), the two
    # results can differ by an ulp, and at 1e10 an ulp is 1024: exp(x - max) overflows (light_squeezenet gave NaN)
    x = x.contiguous()
    if kind == "softmax":
        return x.softmax(axis)
    if kind == "log":
        return x.log_softmax(axis)
    # hardmax: one-hot of the first maximum along axis
    axis %= x.ndim
    idx = x.argmax(axis, keepdim=True)
    pos = Tensor.arange(x.shape[axis]).reshape(*[x.shape[axis] if i == axis else 1 for i in range(x.ndim)])
    return pos.eq(idx.cast(pos.dtype)).cast(x.dtype)


op("Softmax")(_softmax("softmax"))
op("LogSoftmax")(_softmax("log"))
op("Hardmax")(_softmax("hard"))


def _cumulative(kind: str):
    def run(n: Node, x, axis):
        x = n.t(x)
        ax = int(n.host(axis).reshape(-1)[0]) % x.ndim
        rev, excl = n.attr("reverse", 0), n.attr("exclusive", 0)
        y = x.flip(ax) if rev else x
        if excl:  # shift by one along the axis, filling with the identity
            pad = [(1, 0) if i == ax else (0, 0) for i in range(x.ndim)]
            cut = [(0, x.shape[ax]) if i == ax else None for i in range(x.ndim)]
            y = y.pad(pad, value=0 if kind == "sum" else 1).shrink(cut)
        y = y.cumsum(ax) if kind == "sum" else y.cumprod(ax)
        y = y.cast(x.dtype)
        return y.flip(ax) if rev else y

    return run


op("CumSum")(_cumulative("sum"))
op("CumProd")(_cumulative("prod"))


@op("MatMul")
def _matmul(n: Node, a, b):
    a, b = n.t(a), n.t(b)
    return (a @ b).cast(a.dtype)


@op("Gemm")
def _gemm(n: Node, a, b, c=None):
    a, b = n.t(a), n.t(b)
    if n.attr("transA", 0):
        a = a.T
    if n.attr("transB", 0):
        b = b.T
    alpha, beta = n.attr("alpha", 1.0), n.attr("beta", 1.0)
    out = a @ b
    if alpha != 1.0:
        out = out * alpha
    if c is not None:
        c = n.t(c)
        out = out + (c * beta if beta != 1.0 else c)
    return out.cast(a.dtype)


@op("Einsum")
def _einsum(n: Node, *xs):
    ts = [n.t(x) for x in xs]
    return Tensor.einsum(n["equation"].replace(" ", ""), *ts).cast(ts[0].dtype)


@op("TopK")
def _topk(n: Node, x, k=None):
    x = n.t(x)
    kk = n.attr("k") if n.opset < 10 else int(n.host(k).reshape(-1)[0])
    axis = n.attr("axis", -1) % x.ndim
    largest, srt = bool(n.attr("largest", 1)), bool(n.attr("sorted", 1))
    if kk == 0:
        shape = tuple(0 if i == axis else s for i, s in enumerate(x.shape))
        return Tensor.zeros(*shape, dtype=x.dtype), Tensor.zeros(*shape, dtype=dtypes.int64)
    vals, idx = x.topk(kk, dim=axis, largest=largest, sorted_=srt)
    return vals, idx.cast(dtypes.int64)


def _det(m: list[list[Tensor]]) -> Tensor:
    """The determinant by cofactor expansion along the first row (small matrices: n <= 4)."""
    if len(m) == 1:
        return m[0][0]
    total = None
    for j, a in enumerate(m[0]):
        minor = [row[:j] + row[j + 1 :] for row in m[1:]]
        term = a * _det(minor)
        total = term if total is None else (total - term if j % 2 else total + term)
    return total


@op("Det")
def _det_op(n: Node, x):
    x = n.t(x)
    k = x.shape[-1]
    if k > 4:
        raise NotImplementedError(f"uopc.onnx: Det of {k}x{k} matrices (only up to 4x4) (node {n.proto.name!r})")
    rows = [[x[..., i, j] for j in range(k)] for i in range(k)]
    return _det(rows).cast(x.dtype)

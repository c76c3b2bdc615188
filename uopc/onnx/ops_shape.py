"""ONNX shape, movement and indexing ops: reshape/transpose/slice/concat/split/pad, gathers and scatters, constants.

    Shape(x)                 -> np.array(x.shape)          (always known on the host)
    Reshape(x, [0, -1])      -> x.reshape(x.shape[0], -1)
    Gather(x, idx, axis=1)   -> x[:, idx]                   (negative indices count from the end)

Shape, Size, Range, NonZero and Unique give host (NumPy) values: Range and NonZero have data-dependent sizes, so
their inputs are read on the host (realized if they are not known there) and the result is computed with NumPy.
"""

from __future__ import annotations

import numpy as np

from uopc import Tensor, dtypes
from uopc.onnx.graph import HOST_FOLD_MAX, Node, host_op, np_dtype, onnx_dtype, op, sparse_to_array

# ---------------------------------------------------------------- shapes and constants


def _shape_of(n: Node, x) -> np.ndarray:
    shape = np.array(x.shape, np.int64)
    start, end = n.attr("start", 0), n.attr("end")
    return shape[start:end] if end is not None else shape[start:]


op("Shape", host=_shape_of)(_shape_of)
op("Size", host=lambda n, x: np.array(x.size, np.int64))(lambda n, x: np.array(x.numel(), np.int64))


@op("Constant", host=lambda n: _constant(n))
def _constant(n: Node) -> np.ndarray:
    (name, v), *_ = n.attrs.items()
    if name == "sparse_value":
        return v if isinstance(v, np.ndarray) else sparse_to_array(v)
    if name in ("value", "sparse_value"):
        return np.asarray(v)
    kinds = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}
    if name in kinds:
        return np.array(v, kinds[name])
    raise NotImplementedError(f"uopc.onnx: Constant with attribute {name!r} (string constants are not supported)")


def _fill_value(n: Node) -> np.ndarray:
    v = n.attr("value")
    return np.zeros(1, np.float32) if v is None else np.asarray(v).reshape(-1)


def _hconstant_of_shape(n: Node, shape) -> np.ndarray:
    v = _fill_value(n)
    return np.full(tuple(int(s) for s in shape), v[0], v.dtype)


@op("ConstantOfShape", host=_hconstant_of_shape)
def _constant_of_shape(n: Node, shape):
    dims = tuple(n.ints(shape))
    v = _fill_value(n)
    if int(np.prod(dims)) <= HOST_FOLD_MAX:
        return np.full(dims, v[0], v.dtype)
    return Tensor.full(dims, v[0].item(), dtype=dtypes.from_np(v.dtype))  # a constant: no buffer, it folds


def _hrange(n: Node, start, limit, delta) -> np.ndarray:
    s, lim, d = (np.asarray(n.host(v)).reshape(()) for v in (start, limit, delta))
    count = max(int(np.ceil((lim - s) / d)), 0)
    return (s + np.arange(count, dtype=s.dtype) * d).astype(s.dtype)


op("Range", host=_hrange)(_hrange)


def _reshape_dims(n: Node, in_shape: tuple[int, ...], shape: list[int]) -> list[int]:
    allowzero = n.attr("allowzero", 0)
    dims = [in_shape[i] if s == 0 and not allowzero else s for i, s in enumerate(shape)]
    if dims.count(-1) > 1:
        raise n.fail(f"shape {shape} has more than one -1")
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1]))
        total = int(np.prod(in_shape))
        dims[dims.index(-1)] = total // known if known else 0
    return dims


def _hreshape(n: Node, x, shape=None):
    return x.reshape(_reshape_dims(n, x.shape, n.attr("shape") if shape is None else n.ints(shape)))


@op("Reshape", host=_hreshape)
def _reshape(n: Node, x, shape=None):
    x = n.t(x)
    return x.reshape(*_reshape_dims(n, x.shape, n.attr("shape") if shape is None else n.ints(shape)))


def _flat_dims(n: Node, shape) -> tuple[int, int]:
    axis = n.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    return int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))


op("Flatten", host=lambda n, x: x.reshape(_flat_dims(n, x.shape)))(
    lambda n, x: n.t(x).reshape(*_flat_dims(n, n.t(x).shape))
)


def _squeeze_axes(n: Node, shape, axes) -> list[int]:
    ax = n.attr("axes") if n.opset < 13 else n.ints(axes)
    if ax is None:
        return [i for i, s in enumerate(shape) if s == 1]
    return sorted(a % len(shape) for a in ax)


def _squeezed(n: Node, shape, axes) -> list[int]:
    ax = _squeeze_axes(n, shape, axes)
    return [s for i, s in enumerate(shape) if i not in ax]


def _unsqueezed(n: Node, shape, axes) -> list[int]:
    ax = n.attr("axes") if n.opset < 13 else n.ints(axes)
    rank = len(shape) + len(ax)
    ax = sorted(a % rank for a in ax)
    out, it = [], iter(shape)
    for i in range(rank):
        out.append(1 if i in ax else next(it))
    return out


op("Squeeze", host=lambda n, x, a=None: x.reshape(_squeezed(n, x.shape, a)))(
    lambda n, x, a=None: n.t(x).reshape(*_squeezed(n, n.t(x).shape, a))
)
op("Unsqueeze", host=lambda n, x, a=None: x.reshape(_unsqueezed(n, x.shape, a)))(
    lambda n, x, a=None: n.t(x).reshape(*_unsqueezed(n, n.t(x).shape, a))
)


def _perm(n: Node, ndim: int) -> list[int]:
    p = n.attr("perm")
    return list(reversed(range(ndim))) if p is None else [int(i) for i in p]


op("Transpose", host=lambda n, x: np.transpose(x, _perm(n, x.ndim)))(
    lambda n, x: n.t(x).permute(*_perm(n, n.t(x).ndim))
)


@op("Concat", host=lambda n, *xs: np.concatenate(xs, axis=n.attr("axis", 1)))
def _concat(n: Node, *xs):
    ts = [n.t(x) for x in xs]
    axis = n.attr("axis", 1) % ts[0].ndim  # axis is required since opset 4; 1 before
    ts = [t for t in ts if t.shape[axis] > 0] or ts[:1]
    return ts[0] if len(ts) == 1 else Tensor.cat(*ts, dim=axis)


def _split_sizes(n: Node, dim: int, split, nout: int) -> list[int]:
    sizes = n.attr("split") if n.opset < 13 else n.ints(split)
    if sizes:
        return list(sizes)
    parts = n.attr("num_outputs", nout)
    step = -(-dim // parts)
    return [min(step, dim - i * step) for i in range(parts)]


@op("Split")
def _split(n: Node, x, split=None):
    x = n.t(x)
    axis = n.attr("axis", 0) % x.ndim
    sizes = _split_sizes(n, x.shape[axis], split, len(n.proto.output))
    if sum(sizes) != x.shape[axis]:
        raise n.fail(f"split sizes {sizes} do not add up to dim {axis} of shape {x.shape}")
    outs, lo = [], 0
    for s in sizes:
        outs.append(x.shrink([(lo, lo + s) if i == axis else None for i in range(x.ndim)]))
        lo += s
    return tuple(outs)


def _slices(n: Node, shape, starts, ends, axes, steps) -> tuple[slice, ...]:
    if n.opset < 10:
        st, en, ax, sp = n.attr("starts"), n.attr("ends"), n.attr("axes"), None
    else:
        st, en, ax, sp = n.ints(starts), n.ints(ends), n.ints(axes), n.ints(steps)
    ax = list(range(len(st))) if ax is None else [a % len(shape) for a in ax]
    sp = [1] * len(st) if sp is None else sp
    out = [slice(None)] * len(shape)
    for a, s, e, k in zip(ax, st, en, sp):
        if k == 0:
            raise n.fail("a slice step is 0")
        out[a] = slice(*slice(s, e, k).indices(shape[a]))
    return tuple(out)


def _hslice(n: Node, x, starts=None, ends=None, axes=None, steps=None):
    return x[_slices(n, x.shape, starts, ends, axes, steps)]


@op("Slice", host=_hslice)
def _slice(n: Node, x, starts=None, ends=None, axes=None, steps=None):
    x = n.t(x)
    sl = _slices(n, x.shape, starts, ends, axes, steps)
    out_shape = tuple(len(range(*s.indices(d))) for s, d in zip(sl, x.shape))
    if 0 in out_shape:
        return Tensor.zeros(*out_shape, dtype=x.dtype)
    return x[sl]


# ---------------------------------------------------------------- padding


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}


@op("Pad")
def _pad(n: Node, x, pads=None, value=None, axes=None):
    x = n.t(x)
    if n.opset < 11:
        p, v = n.attr("pads", n.attr("paddings")), n.attr("value", 0.0)
    else:
        p = n.ints(pads)
        v = 0 if value is None else n.host(value).reshape(-1)[0].item() if n.host(value).size else 0
    ax = list(range(x.ndim)) if axes is None else [a % x.ndim for a in n.ints(axes)]
    k = len(ax)
    pairs: list[tuple[int, int]] = [(0, 0)] * x.ndim
    for j, a in enumerate(ax):
        pairs[a] = (p[j], p[j + k])
    mode = n.attr("mode", "constant")
    if mode not in _PAD_MODES:
        raise n.fail(f"pad mode {mode!r} is not one of {sorted(_PAD_MODES)}")
    if mode == "constant":
        return x.pad(pairs, value=v)
    if any(lo < 0 or hi < 0 for lo, hi in pairs):  # cut first, then fill from what remains
        x = x.pad([(min(lo, 0), min(hi, 0)) for lo, hi in pairs])
        pairs = [(max(lo, 0), max(hi, 0)) for lo, hi in pairs]
    return x.pad(pairs, mode=_PAD_MODES[mode])


# ---------------------------------------------------------------- broadcasting and repetition


def _expanded_shape(in_shape, shape) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(tuple(in_shape), tuple(shape)))


op("Expand", host=lambda n, x, s: np.broadcast_to(x, _expanded_shape(x.shape, n.ints(s))).copy())(
    lambda n, x, s: _expand(n.t(x), _expanded_shape(n.t(x).shape, n.ints(s)))
)


def _expand(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    x = x.reshape(*(1,) * (len(shape) - x.ndim), *x.shape)
    return x.expand(*shape) if 0 not in shape else Tensor.zeros(*shape, dtype=x.dtype)


@op("Tile", host=lambda n, x, r: np.tile(x, n.ints(r)))
def _tile(n: Node, x, reps):
    x = n.t(x)
    r = n.ints(reps)
    if 0 in r or 0 in x.shape:
        return Tensor.zeros(*[s * k for s, k in zip(x.shape, r)], dtype=x.dtype)
    return x.repeat(*r)


# ---------------------------------------------------------------- gathers and scatters


def _norm_index(idx, size: int):
    """Negative indices count from the end (ONNX); host arrays stay on the host."""
    if isinstance(idx, np.ndarray):
        return np.where(idx < 0, idx + size, idx).astype(np.int64)
    return (idx < 0).where(idx + size, idx)


def _hgather(n: Node, x, idx):
    return np.take(x, _norm_index(idx, x.shape[n.attr("axis", 0) % x.ndim]), axis=n.attr("axis", 0))


@op("Gather", host=_hgather)
def _gather(n: Node, x, idx):
    x = n.t(x)
    axis = n.attr("axis", 0) % x.ndim
    i = n.t(_norm_index(idx, x.shape[axis]) if isinstance(idx, np.ndarray) else idx)
    i = _norm_index(i, x.shape[axis])
    if i.numel() == 0:
        return Tensor.zeros(*x.shape[:axis], *i.shape, *x.shape[axis + 1 :], dtype=x.dtype)
    return x[(slice(None),) * axis + (i,)]


@op("GatherElements")
def _gather_elements(n: Node, x, idx):
    x, i = n.t(x), n.t(idx)
    axis = n.attr("axis", 0) % x.ndim
    return x.gather(axis, _norm_index(i, x.shape[axis]))


def _linear_index(x_shape, i: Tensor, k: int, batch: int) -> Tensor:
    """Flat positions into dims batch..batch+k of x for an (..., k) index tensor (negative indices allowed)."""
    lin = None
    for j in range(k):
        size = x_shape[batch + j]
        ij = _norm_index(i[..., j], size)
        lin = ij if lin is None else lin * size + ij
    return lin


@op("GatherND")
def _gather_nd(n: Node, x, idx):
    x, i = n.t(x), n.t(idx).cast(dtypes.int64)
    b, k = n.attr("batch_dims", 0), i.shape[-1]
    bshape, rest = x.shape[:b], x.shape[b + k :]
    nb, kk = int(np.prod(bshape)), int(np.prod(x.shape[b : b + k]))
    lin = _linear_index(x.shape, i, k, b).reshape(nb, -1)  # (B, M)
    lin = lin + Tensor.arange(nb, dtype=dtypes.int64).reshape(nb, 1) * kk
    flat = x.reshape(nb * kk, *rest)
    out = flat[lin.reshape(-1)]
    return out.reshape(*i.shape[:-1], *rest)


_REDUCE = {"none": None, "add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _scatter_into(x: Tensor, dim: int, i: Tensor, upd: Tensor, reduction: str) -> Tensor:
    red = _REDUCE[reduction]
    if red is None:
        return x.scatter(dim, i, upd)
    return x.scatter_reduce(dim, i, upd, red, include_self=True)


@op("ScatterElements", "Scatter")
def _scatter_elements(n: Node, x, idx, upd):
    x, i, u = n.t(x), n.t(idx), n.t(upd)
    axis = n.attr("axis", 0) % x.ndim
    return _scatter_into(x, axis, _norm_index(i, x.shape[axis]), u, n.attr("reduction", "none"))


@op("ScatterND")
def _scatter_nd(n: Node, x, idx, upd):
    x, i, u = n.t(x), n.t(idx).cast(dtypes.int64), n.t(upd)
    k = i.shape[-1]
    rest = x.shape[k:]
    kk, m = int(np.prod(x.shape[:k])), int(np.prod(i.shape[:-1]))
    lin = _linear_index(x.shape, i, k, 0).reshape(m, *(1,) * len(rest)).expand(m, *rest)
    flat = x.reshape(kk, *rest)
    out = _scatter_into(flat, 0, lin, u.reshape(m, *rest), n.attr("reduction", "none"))
    return out.reshape(*x.shape)


# ---------------------------------------------------------------- data-dependent sizes (host)


def _hnonzero(n: Node, x):
    return np.array(np.nonzero(n.host(x)), np.int64).reshape(np.ndim(n.host(x)), -1)


op("NonZero", host=_hnonzero)(_hnonzero)


@op("Compress")
def _compress(n: Node, x, cond):
    c = np.nonzero(n.host(cond).reshape(-1))[0].astype(np.int64)
    x = n.t(x)
    axis = n.attr("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis %= x.ndim
    c = c[c < x.shape[axis]]
    if c.size == 0:
        return Tensor.zeros(*[0 if i == axis else s for i, s in enumerate(x.shape)], dtype=x.dtype)
    return x[(slice(None),) * axis + (Tensor(c),)]


@op("Unique")
def _unique(n: Node, x):
    a = n.host(x)
    axis = n.attr("axis")
    vals, idx, inv, cnt = np.unique(a, return_index=True, return_inverse=True, return_counts=True, axis=axis)
    if not n.attr("sorted", 1):  # in order of first occurrence
        order = np.argsort(idx, kind="stable")
        vals = np.take(vals, order, axis=0 if axis is None else axis)
        remap = np.empty_like(order)
        remap[order] = np.arange(order.size)
        idx, inv, cnt = idx[order], remap[inv.reshape(-1)], cnt[order]
    i64 = np.int64
    return vals, idx.astype(i64), inv.reshape(-1).astype(i64), cnt.astype(i64)


# ---------------------------------------------------------------- rearrangements


@op("DepthToSpace")
def _depth_to_space(n: Node, x):
    x = n.t(x)
    b, c, h, w = x.shape
    s = n["blocksize"]
    if n.attr("mode", "DCR") == "DCR":
        y = x.reshape(b, s, s, c // (s * s), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(b, c // (s * s), s, s, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(b, c // (s * s), h * s, w * s)


@op("SpaceToDepth")
def _space_to_depth(n: Node, x):
    x = n.t(x)
    b, c, h, w = x.shape
    s = n["blocksize"]
    y = x.reshape(b, c, h // s, s, w // s, s)
    y = y.permute(0, 1, 3, 5, 2, 4) if n.attr("mode", "DCR") == "CRD" else y.permute(0, 3, 5, 1, 2, 4)
    return y.reshape(b, c * s * s, h // s, w // s)


@op("Trilu")
def _trilu(n: Node, x, k=None):
    x = n.t(x)
    kk = 0 if k is None else int(n.host(k).reshape(-1)[0])
    if x.numel() == 0:
        return x
    rows, cols = x.shape[-2], x.shape[-1]
    r = Tensor.arange(rows, dtype=dtypes.int64).reshape(rows, 1)
    c = Tensor.arange(cols, dtype=dtypes.int64).reshape(1, cols)
    keep = (c - r >= kk) if n.attr("upper", 1) else (c - r <= kk)
    return keep.where(x, Tensor.zeros(1, dtype=x.dtype).reshape(()))


@op("EyeLike")
def _eye_like(n: Node, x):
    rows, cols = x.shape
    dt = n.attr("dtype")
    out_np = np.eye(rows, cols, k=n.attr("k", 0))
    from_x = x.dtype if isinstance(x, Tensor) else dtypes.from_np(x.dtype)
    dtype = from_x if dt is None else onnx_dtype(dt)
    return out_np.astype(np_dtype(dtype))


@op("OneHot")
def _one_hot(n: Node, idx, depth, values):
    d = int(n.host(depth).reshape(-1)[0])
    vals = n.t(values)
    i = n.t(idx)
    i = (i < 0).where(i + d, i)
    axis = n.attr("axis", -1) % (i.ndim + 1)
    shape = [d if j == axis else 1 for j in range(i.ndim + 1)]
    pos = Tensor.arange(d, dtype=i.dtype).reshape(*shape)
    hit = i.unsqueeze(axis).eq(pos)
    return hit.where(vals[1], vals[0])


@op("ReverseSequence")
def _reverse_sequence(n: Node, x, lens):
    x = n.t(x)
    ln = n.host(lens).astype(np.int64)
    ba, ta = n.attr("batch_axis", 1), n.attr("time_axis", 0)
    t = np.arange(x.shape[ta])
    # index[time, batch]: reversed within each batch's length, identity after it
    idx = np.where(t[:, None] < ln[None, :], ln[None, :] - 1 - t[:, None], t[:, None])
    if ta > ba:
        idx = idx.T
    shape = [1] * x.ndim
    shape[ta], shape[ba] = x.shape[ta], x.shape[ba]
    full = np.broadcast_to(idx.reshape(shape), x.shape).copy()
    return x.gather(ta, Tensor(full))


host_op("EyeLike")(_eye_like)

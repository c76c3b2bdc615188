"""ONNX image ops: GridSample, Col2Im, MaxUnpool, NonMaxSuppression, TensorScatter, DFT/STFT.

    GridSample(x, grid) -> per tap (2 per dim linear, 4 cubic, 1 nearest): gather x at the tap's flat index,
                           weight it, sum over taps          (the taps' indices are Tensors: they depend on grid)
    DFT(x, axis=1)      -> x @ [cos | -sin] matrices built on the host (real/imaginary pairs in the last dim)

NonMaxSuppression's output size depends on the data: it reads boxes and scores on the host and computes there.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from uopc import Tensor, dtypes
from uopc.onnx.graph import Node, op


def _reflect(x: Tensor, lo: float, hi: float) -> Tensor:
    """Reflect coordinates into [lo, hi] by the nearer border, as often as needed."""
    rng = hi - lo
    if rng == 0:
        return x * 0 + lo
    below = lo - x
    above = x - hi
    dx = (x < lo).where(below, above)
    k = (dx / rng).floor()
    r = dx - k * rng
    even = (k - (k / 2).floor() * 2) == 0
    low_side = even.where(lo + r, hi - r)
    high_side = even.where(hi - r, lo + r)
    return (x < lo).where(low_side, (x > hi).where(high_side, x))


def _cubic_w(t: Tensor, A: float = -0.75) -> list[Tensor]:
    def c(v: Tensor, near: bool) -> Tensor:
        if near:
            return ((A + 2) * v - (A + 3)) * v * v + 1
        return ((A * v - 5 * A) * v + 8 * A) * v - 4 * A

    return [c(t + 1, False), c(t, True), c(1 - t, True), c(2 - t, False)]


@op("GridSample")
def _grid_sample(n: Node, x, grid):
    x, g = n.t(x), n.t(grid)
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(n.attr("mode", "linear"), n.attr("mode", "linear"))
    pad, align = n.attr("padding_mode", "zeros"), n.attr("align_corners", 0)
    N, C, dims = x.shape[0], x.shape[1], x.shape[2:]
    r = len(dims)
    out_sp = g.shape[1:-1]
    ft = x.dtype if x.dtype.is_float else dtypes.float32
    g = g.cast(ft)
    taps_per_dim = []
    for j, size in enumerate(dims):
        c = g[..., r - 1 - j]
        c = (c + 1) / 2 * (size - 1) if align else ((c + 1) * size - 1) / 2
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if mode == "nearest":
            c = c.round()
        if pad == "border":
            c = c.clip(0, size - 1)
        elif pad == "reflection":
            c = _reflect(c, lo, hi)
        if mode == "nearest":
            taps_per_dim.append([(c, None)])
            continue
        base = c.floor()
        t = c - base
        offs, ws = ([0, 1], [1 - t, t]) if mode == "linear" else ([-1, 0, 1, 2], _cubic_w(t))
        taps_per_dim.append([(base + o, w) for o, w in zip(offs, ws)])
    flat = x.reshape(N, C, -1)
    m = int(np.prod(out_sp))
    total = None
    for combo in itertools.product(*taps_per_dim):
        lin, weight, valid = None, None, None
        for (idx, w), size in zip(combo, dims):
            if pad == "border":
                idx = idx.clip(0, size - 1)
            elif pad == "reflection":
                idx = _reflect(idx, *((0.0, size - 1.0) if align else (-0.5, size - 0.5))).floor()
            ok = (idx >= 0) & (idx <= size - 1)
            valid = ok if valid is None else valid & ok
            ii = idx.clip(0, size - 1).cast(dtypes.int64)
            lin = ii if lin is None else lin * size + ii
            if w is not None:
                weight = w if weight is None else weight * w
        vals = flat.gather(2, lin.reshape(N, 1, m).expand(N, C, m)).reshape(N, C, *out_sp).cast(ft)
        if weight is not None:
            vals = vals * weight.unsqueeze(1)
        if pad == "zeros":
            vals = valid.unsqueeze(1).where(vals, 0.0)
        total = vals if total is None else total + vals
    return total.cast(x.dtype)


@op("Col2Im")
def _col2im(n: Node, x, image_shape, block_shape):
    x = n.t(x)
    img, blk = n.ints(image_shape), n.ints(block_shape)
    k = len(img)
    st = n.attr("strides", [1] * k)
    dl = n.attr("dilations", [1] * k)
    pads = n.attr("pads", [0] * (2 * k))
    N, CK, L = x.shape
    kk = int(np.prod(blk))
    C = CK // kk
    padded = [i + pads[j] + pads[j + k] for j, i in enumerate(img)]
    outs = [(p - (b - 1) * d - 1) // s + 1 for p, b, d, s in zip(padded, blk, dl, st)]
    # the flat padded-image position of every (kernel tap, block) column: a scatter-add
    pos = np.zeros((kk, L), np.int64)
    strides = [int(np.prod(padded[j + 1 :])) for j in range(k)]
    for t, tap in enumerate(itertools.product(*[range(b) for b in blk])):
        for q, blk_pos in enumerate(itertools.product(*[range(o) for o in outs])):
            pos[t, q] = sum((bp * s + tp * d) * sd for bp, s, tp, d, sd in zip(blk_pos, st, tap, dl, strides))
    idx = Tensor(np.broadcast_to(pos.reshape(1, 1, kk * L), (N, C, kk * L)).copy())
    src = x.reshape(N, C, kk * L)
    out = Tensor.zeros(N, C, int(np.prod(padded)), dtype=x.dtype).scatter_add(2, idx, src)
    out = out.reshape(N, C, *padded)
    return out.shrink([None, None] + [(pads[j], pads[j] + img[j]) for j in range(k)])


@op("MaxUnpool")
def _max_unpool(n: Node, x, idx, output_shape=None):
    x, i = n.t(x), n.t(idx).cast(dtypes.int64)
    ks = n["kernel_shape"]
    k = len(ks)
    st = n.attr("strides", [1] * k)
    pads = n.attr("pads", [0] * (2 * k))
    sp = [(d - 1) * s - pads[j] - pads[j + k] + kk for j, (d, s, kk) in enumerate(zip(x.shape[2:], st, ks))]
    shape = [*x.shape[:2], *sp]
    out = Tensor.zeros(int(np.prod(shape)), dtype=x.dtype).scatter(0, i.reshape(-1), x.reshape(-1)).reshape(*shape)
    if output_shape is not None:  # the indices address the default shape; a larger output pads it at the end
        want = n.ints(output_shape)
        out = out.pad([(0, w - s) for w, s in zip(want, shape)])
    return out


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    inter = np.prod(np.clip(np.minimum(a[2:], b[2:]) - np.maximum(a[:2], b[:2]), 0, None))
    union = np.prod(a[2:] - a[:2]) + np.prod(b[2:] - b[:2]) - inter
    return float(inter / union) if union > 0 else 0.0


@op("NonMaxSuppression")
def _nms(n: Node, boxes, scores, max_out=None, iou_th=None, score_th=None):
    """Greedy NMS per (batch, class), on the host (the number of selected boxes depends on the data)."""
    bx, sc = n.host(boxes).astype(np.float64), n.host(scores).astype(np.float64)
    mo = 0 if max_out is None else int(n.host(max_out).reshape(-1)[0])
    it = 0.0 if iou_th is None else float(n.host(iou_th).reshape(-1)[0])
    stv = None if score_th is None else float(n.host(score_th).reshape(-1)[0])
    if n.attr("center_point_box", 0):  # (cx, cy, w, h) -> corners
        cx, cy, w, h = (bx[..., i] for i in range(4))
        bx = np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], -1)
    else:  # corners in either order: (y1, x1, y2, x2) normalized to min/max
        bx = np.concatenate([np.minimum(bx[..., :2], bx[..., 2:]), np.maximum(bx[..., :2], bx[..., 2:])], -1)
    out = []
    for b in range(sc.shape[0]):
        for c in range(sc.shape[1]):
            order = np.argsort(-sc[b, c], kind="stable")
            keep: list[int] = []
            for j in order:
                if len(keep) >= mo:
                    break
                if stv is not None and sc[b, c, j] <= stv:
                    continue
                if all(_iou(bx[b, j], bx[b, q]) <= it for q in keep):
                    keep.append(int(j))
            out += [[b, c, j] for j in keep]
    return np.array(out, np.int64).reshape(-1, 3)


@op("TensorScatter")
def _tensor_scatter(n: Node, cache, update, write_idx=None):
    """Write `update` into the cache along `axis` at each batch entry's write index (linear or circular)."""
    c, u = n.t(cache), n.t(update)
    axis = n.attr("axis", -2) % c.ndim
    size, length = c.shape[axis], u.shape[axis]
    starts = np.zeros(c.shape[0], np.int64) if write_idx is None else n.host(write_idx).astype(np.int64)
    pos = starts.reshape(-1, 1) + np.arange(length)
    pos = pos % size if n.attr("mode", "linear") == "circular" else pos
    shape = [1] * c.ndim
    shape[0], shape[axis] = c.shape[0], length
    idx = np.broadcast_to(pos.reshape(shape), u.shape).copy()
    return c.scatter(axis, Tensor(idx), u)


def _dft_matrices(length: int, out_len: int, inverse: bool) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(out_len).reshape(-1, 1)
    t = np.arange(length).reshape(1, -1)
    ang = 2 * math.pi * k * t / length * (1 if inverse else -1)
    scale = 1 / length if inverse else 1.0
    return np.cos(ang) * scale, np.sin(ang) * scale


def _dft(x: Tensor, axis: int, length: int | None, inverse: bool, onesided: bool) -> Tensor:
    """x (..., 1 or 2) real or complex pairs -> (..., 2): the DFT along `axis` as two matrix products."""
    re, im = x[..., 0], (x[..., 1] if x.shape[-1] == 2 else None)
    if inverse and onesided:  # irfft: rebuild the full spectrum by Hermitian symmetry, keep the real part
        bins = re.shape[axis]
        full = 2 * (bins - 1) if length is None else length
        tail = [(1, full - bins + 1) if i == axis else None for i in range(re.ndim)]
        re = Tensor.cat(re, re.shrink(tail).flip(axis), dim=axis)
        imag = im if im is not None else re.shrink([(0, bins) if i == axis else None for i in range(re.ndim)]) * 0
        im = Tensor.cat(imag, -imag.shrink(tail).flip(axis), dim=axis)
        return _dft(Tensor.stack(re, im, dim=-1), axis, full, True, False)[..., :1]
    n = re.shape[axis] if length is None else length
    if re.shape[axis] != n:  # zero-pad or cut to the DFT length
        cut = [(0, min(n, re.shape[axis])) if i == axis else None for i in range(re.ndim)]
        padw = [(0, max(0, n - re.shape[axis])) if i == axis else (0, 0) for i in range(re.ndim)]
        re = re.shrink(cut).pad(padw)
        im = None if im is None else im.shrink(cut).pad(padw)
    out_len = n // 2 + 1 if onesided else n
    cm, sm = _dft_matrices(n, out_len, inverse)
    ft = x.dtype
    cos_t, sin_t = Tensor(cm.T.astype(ft.np)), Tensor(sm.T.astype(ft.np))
    r = re.transpose(axis, -1)
    yr, yi = r @ cos_t, r @ sin_t
    if im is not None:
        i_ = im.transpose(axis, -1)
        yr, yi = yr - i_ @ sin_t, yi + i_ @ cos_t
    return Tensor.stack(yr.transpose(axis, -1), yi.transpose(axis, -1), dim=-1)


@op("DFT")
def _dft_op(n: Node, x, dft_length=None, axis=None):
    x = n.t(x)
    length = None if dft_length is None or n.host(dft_length).size == 0 else int(n.host(dft_length).reshape(-1)[0])
    ax = n.attr("axis", 1) if n.opset < 20 else (-2 if axis is None else int(n.host(axis).reshape(-1)[0]))
    ax = ax % x.ndim
    if ax == x.ndim - 1:
        raise n.fail("the DFT axis cannot be the last (real/imaginary) dim")
    return _dft(x, ax, length, bool(n.attr("inverse", 0)), bool(n.attr("onesided", 0)))


@op("STFT")
def _stft(n: Node, signal, step, window=None, frame_length=None):
    x = n.t(signal)
    hop = int(n.host(step).reshape(-1)[0])
    win = None if window is None else n.t(window)
    fl = int(n.host(frame_length).reshape(-1)[0]) if frame_length is not None else win.shape[0]
    frames = x.unfold(1, fl, hop)  # (batch, frames, 1 or 2, fl)
    frames = frames.permute(0, 1, 3, 2)  # (batch, frames, fl, 1 or 2)
    if win is not None:
        frames = frames * win.reshape(1, 1, fl, 1)
    return _dft(frames, 2, None, False, bool(n.attr("onesided", 1)))


def _roi_samples(n: Node, rois: np.ndarray, H: int, W: int):
    """Per ROI, output bin and sample: the 4 bilinear corners (flat positions in H*W) and their weights."""
    oh, ow = n.attr("output_height", 1), n.attr("output_width", 1)
    ratio, scale = n.attr("sampling_ratio", 0), n.attr("spatial_scale", 1.0)
    half = n.attr("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    per_roi = []
    for x1, y1, x2, y2 in rois.astype(np.float64):
        off = 0.5 if half else 0.0
        sx, sy, ex, ey = x1 * scale - off, y1 * scale - off, x2 * scale - off, y2 * scale - off
        rw, rh = ex - sx, ey - sy
        if not half:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = ratio if ratio > 0 else int(math.ceil(rh / oh))
        gw = ratio if ratio > 0 else int(math.ceil(rw / ow))
        pos = np.zeros((oh, ow, gh * gw, 4), np.int64)
        wts = np.zeros((oh, ow, gh * gw, 4), np.float64)
        for ph, pw, iy, ix in itertools.product(range(oh), range(ow), range(gh), range(gw)):
            y = sy + ph * bh + (iy + 0.5) * bh / gh
            x = sx + pw * bw + (ix + 0.5) * bw / gw
            s = iy * gw + ix
            if y < -1.0 or y > H or x < -1.0 or x > W:
                continue  # outside: contributes 0
            y, x = max(y, 0.0), max(x, 0.0)
            yl, xl = int(y), int(x)
            yh, xh = (yl + 1, xl + 1)
            if yl >= H - 1:
                yl = yh = H - 1
                y = float(yl)
            if xl >= W - 1:
                xl = xh = W - 1
                x = float(xl)
            ly, lx = y - yl, x - xl
            pos[ph, pw, s] = [yl * W + xl, yl * W + xh, yh * W + xl, yh * W + xh]
            wts[ph, pw, s] = [(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx]
        per_roi.append((pos, wts, gh * gw))
    return per_roi


@op("RoiAlign")
def _roi_align(n: Node, x, rois, batch_indices):
    """The sample positions depend on the ROIs (their count per bin too): computed on the host from the ROI values,
    the bilinear taps gathered from x as a Tensor."""
    x = n.t(x)
    N, C, H, W = x.shape
    r, b = n.host(rois), n.host(batch_indices).astype(np.int64)
    oh, ow = n.attr("output_height", 1), n.attr("output_width", 1)
    flat = x.reshape(N, C, H * W)
    outs = []
    for (pos, wts, count), bi in zip(_roi_samples(n, r, H, W), b):
        plane = flat[int(bi)]  # (C, H*W)
        idx = Tensor(np.broadcast_to(pos.reshape(1, -1), (C, pos.size)).copy())
        taps = plane.gather(1, idx).reshape(C, oh, ow, count, 4) * Tensor(wts.astype(x.dtype.np))
        if n.attr("mode", "avg") == "max":  # onnx's max mode: the largest weighted corner of any sample
            outs.append(taps.max((3, 4)))
        else:
            outs.append(taps.sum(4).mean(3))
    return Tensor.stack(*outs, dim=0).cast(x.dtype)


def _bilinear_zeros(planes: Tensor, py: Tensor, px: Tensor, H: int, W: int) -> Tensor:
    """Sample (B, C, H*W) planes at pixel positions (B, M) bilinearly, zero outside: (B, C, M)."""
    B, C = planes.shape[0], planes.shape[1]
    y0, x0 = py.floor(), px.floor()
    out = None
    for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)):
        yi, xi = y0 + dy, x0 + dx
        w = (1 - (py - yi).abs()) * (1 - (px - xi).abs())
        ok = (yi >= 0) & (yi <= H - 1) & (xi >= 0) & (xi <= W - 1)
        lin = (yi.clip(0, H - 1) * W + xi.clip(0, W - 1)).cast(dtypes.int64)
        m = lin.shape[-1]
        v = planes.gather(2, lin.reshape(B, 1, m).expand(B, C, m)) * ok.where(w, 0.0).reshape(B, 1, m)
        out = v if out is None else out + v
    return out


@op("DeformConv")
def _deform_conv(n: Node, x, w, offset, b=None, mask=None):
    """Each kernel tap reads x at its grid position plus a learned offset (bilinear, zero outside), times the mask;
    then the taps are contracted with the weights as a grouped convolution (one matmul)."""
    x, w, off = n.t(x), n.t(w), n.t(offset)
    if x.ndim != 4:
        raise NotImplementedError(f"uopc.onnx: DeformConv on {x.ndim - 2}-D inputs (2-D only) (node {n.proto.name!r})")
    N, C, H, W = x.shape
    oc, cg = w.shape[0], w.shape[1]
    kh, kw = n.attr("kernel_shape", w.shape[2:])
    sh, sw = n.attr("strides", [1, 1])
    dh, dw = n.attr("dilations", [1, 1])
    pads = n.attr("pads", [0, 0, 0, 0])
    group, og = n.attr("group", 1), n.attr("offset_group", 1)
    oh, ow = off.shape[2:]
    k = kh * kw
    off = off.reshape(N, og, kh, kw, 2, oh, ow)
    base_y = (np.arange(kh) * dh).reshape(kh, 1, 1, 1) + (np.arange(oh) * sh - pads[0]).reshape(1, 1, oh, 1)
    base_x = (np.arange(kw) * dw).reshape(1, kw, 1, 1) + (np.arange(ow) * sw - pads[1]).reshape(1, 1, 1, ow)
    ft = x.dtype
    py = off[:, :, :, :, 0] + Tensor(np.broadcast_to(base_y, (kh, kw, oh, ow)).astype(ft.np))
    px = off[:, :, :, :, 1] + Tensor(np.broadcast_to(base_x, (kh, kw, oh, ow)).astype(ft.np))
    planes = x.reshape(N * og, C // og, H * W)
    s = _bilinear_zeros(planes, py.reshape(N * og, -1), px.reshape(N * og, -1), H, W)  # (N*og, C/og, k*oh*ow)
    if mask is not None:
        s = s * n.t(mask).reshape(N * og, 1, -1)
    s = s.reshape(N, group, C // group, k, oh * ow).permute(0, 1, 4, 2, 3).reshape(N, group, oh * ow, cg * k)
    wm = w.reshape(group, oc // group, cg * k).permute(0, 2, 1)  # (group, C/group*k, oc/group)
    y = (s @ wm).permute(0, 1, 3, 2).reshape(N, oc, oh, ow)
    if b is not None:
        y = y + n.t(b).reshape(1, oc, 1, 1)
    return y.cast(x.dtype)

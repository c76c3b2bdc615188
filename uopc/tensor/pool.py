"""Pooling, unpooling and resizing for Tensor (N, C, *spatial) inputs, with PyTorch's names and arguments.

Pooling reduces a window view of the padded input (conv.py's `_windows`, movement ops only) with one REDUCE:

    max_pool2d(x, 2):   x (N, C, 4, 4) -> windows (N, C, 2, 2, 2, 2) -> REDUCE(MAX) over the last two dims

Resizing is per spatial dim: the nearest modes gather their source rows (any dtype, uint8 stays uint8); the linear,
cubic and area modes multiply by a small (out, in) weight matrix built on the host from the sizes alone.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Self

import numpy as np

from uopc.helpers import prod
from uopc.tensor.autodiff import is_stored, with_gradient
from uopc.tensor.conv import _tuple
from uopc.tensor.elementwise import opmath
from uopc.tensor.shape import is_int
from uopc.uop.dtype import dtypes

_LINEAR = ("linear", "bilinear", "trilinear")  # the linear mode of 1, 2 and 3 spatial dims
_CUBIC_A = -0.75  # PyTorch's bicubic coefficient


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    """The four taps' weights (at floor - 1 .. floor + 2) of Keys' cubic convolution at fraction t, PyTorch's A."""
    a = _CUBIC_A

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1)


def _source_index(i: int, o: int, align_corners: bool | None, scale: float | None, cubic: bool) -> np.ndarray:
    """PyTorch's source coordinate of each output position of a linear or cubic resize of size i to o."""
    j = np.arange(o, dtype=np.float64)
    if align_corners:
        return j * ((i - 1) / (o - 1)) if o > 1 else np.zeros(o)
    r = (i / o) if scale is None else 1 / scale
    src = (j + 0.5) * r - 0.5
    return src if cubic else np.maximum(src, 0)  # the cubic taps clamp their own indices instead


def _resize_matrix(i: int, o: int, mode: str, align_corners: bool | None, scale: float | None) -> np.ndarray:
    """The (o, i) matrix that maps one dim of size i to size o by linear, cubic or area interpolation."""
    m = np.zeros((o, i), np.float64)
    j = np.arange(o)
    if mode == "area":  # adaptive average pooling: window j covers [floor(j*i/o), ceil((j+1)*i/o))
        for r in range(o):
            lo, hi = (r * i) // o, -(-((r + 1) * i) // o)
            m[r, lo:hi] = 1 / (hi - lo)
        return m
    src = _source_index(i, o, align_corners, scale, mode == "bicubic")
    lo = np.floor(src).astype(np.int64)
    frac = src - lo
    if mode == "bicubic":
        w = _cubic_weights(frac)
        for k in range(4):
            np.add.at(m, (j, np.clip(lo - 1 + k, 0, i - 1)), w[:, k])
        return m
    lo = np.minimum(lo, i - 1)
    np.add.at(m, (j, lo), 1 - frac)
    np.add.at(m, (j, np.minimum(lo + 1, i - 1)), frac)
    return m


def _nearest_index(i: int, o: int, mode: str, scale: float | None) -> np.ndarray:
    """The source row of each output row of a nearest resize, in float32 as PyTorch computes it."""
    r = np.float32(i / o) if scale is None else np.float32(1 / scale)
    j = np.arange(o, dtype=np.float32)
    src = np.floor((j + np.float32(0.5)) * r) if mode == "nearest-exact" else np.floor(j * r)
    return np.minimum(src.astype(np.int64), i - 1).astype(np.int32)


def _window_counts(i: int, k: int, s: int, pads: tuple[int, int], o: int, include_pad: bool) -> np.ndarray:
    """Per window of one dim (o windows of k taps, stride s, over i elements padded by pads): how many taps fall on
    the input, or on the input and its padding if include_pad; a ceil_mode window's part past the padding never
    counts. avg_pool's divisors are the outer product of these, computed from the sizes alone on the host."""
    lo, hi = pads
    counted = np.zeros(i + lo + hi, np.int64)
    if include_pad:
        counted[: i + 2 * lo] = 1  # the extra ceil_mode pad (hi - lo) is not padding PyTorch counts
    else:
        counted[lo : lo + i] = 1
    taps = np.arange(o)[:, None] * s + np.arange(k)[None, :]
    return counted[taps].sum(1)


class PoolMixin:
    """Max, average and adaptive pooling, max unpooling and interpolate of Tensor."""

    # ---------------------------------------------------------------- argument rules

    def _pool_args(self, name: str, kernel_size: Any, stride: Any, padding: Any, dilation: Any, n: int):
        self._check_spatial(name, n)
        ks = _tuple(kernel_size, n, "kernel_size")
        st = ks if stride is None or (isinstance(stride, (tuple, list)) and not stride) else _tuple(stride, n, "stride")
        pd, dl = _tuple(padding, n, "padding"), _tuple(dilation, n, "dilation")
        if any(v < 1 for v in ks + st + dl):
            raise ValueError(f"{name}: kernel_size {ks}, stride {st} and dilation {dl} must be positive")
        if any(p < 0 or p > k // 2 for p, k in zip(pd, ks, strict=True)):
            raise ValueError(f"{name}: padding {pd} must be at most half the kernel size {ks}")
        return ks, st, pd, dl

    def _pool_pads(self, ks, st, pd, dl, ceil_mode: bool) -> tuple[list[tuple[int, int]], list[int]]:
        """(before, after) pads of each spatial dim and the output sizes, PyTorch's rule for ceil_mode: a window may
        run past the end, but the last one must start inside the input or its left padding."""
        n = len(ks)
        sp = self.shape[self.ndim - n :]
        pads, outs = [], []
        for i, k, s, p, d in zip(sp, ks, st, pd, dl, strict=True):
            span = i + 2 * p - d * (k - 1) - 1
            o = (-(-span // s) if ceil_mode else span // s) + 1
            if ceil_mode and (o - 1) * s >= i + p:
                o -= 1
            if o < 1:
                raise ValueError(f"pooling: kernel {ks} (dilation {dl}) is larger than the padded input {self.shape}")
            pads.append((p, (o - 1) * s + d * (k - 1) + 1 - i - p))
            outs.append(o)
        return pads, outs

    def _pool(self, ks, st, pads, dl, value: float = 0.0) -> Self:
        n = len(ks)
        return self.pad([None] * (self.ndim - n) + pads, value=value)._windows(ks, st, dl)

    # ---------------------------------------------------------------- max pooling and unpooling

    def _max_pool(self, n: int, kernel_size, stride, padding, dilation, ceil_mode: bool, return_indices: bool):
        """Max pooling over the last n dims; with return_indices also the flat index (int32) of each window's first
        largest element within its input plane, as PyTorch's: a constant table of the positions, windowed the same
        way, picked by an argmax over the window."""
        ks, st, pd, dl = self._pool_args(f"max_pool{n}d", kernel_size, stride, padding, dilation, n)
        pads, outs = self._pool_pads(ks, st, pd, dl, ceil_mode)
        fill = -math.inf if self.dtype.is_float else self.dtype.min
        w = self._pool(ks, st, pads, dl, value=fill)
        out = w.reshape(*w.shape[: w.ndim - n], prod(ks)).max(-1)  # the node the gradient rule's argmax shares
        if self.dtype.is_float and not type(self).no_grad:  # the gradient goes to each window's first maximum
            params = (ks, st, tuple(pads), dl)
            out = out._new(with_gradient(out.uop, (self.uop,), "max_pool", params), self)
        if not return_indices:
            return out
        sp = self.shape[self.ndim - n :]
        pos = type(self)(np.arange(prod(sp), dtype=np.int32).reshape(sp))._pool(ks, st, pads, dl, value=-1)
        kk = prod(ks)
        first = w.reshape(*w.shape[: w.ndim - n], kk).argmax(-1)  # the first largest tap (a NaN counts as largest)
        taps = type(self).arange(kk).reshape(*(1,) * (w.ndim - n), kk)
        pick = (taps == first.unsqueeze(-1)).where(pos.reshape(*outs, kk), 0)
        return out, pick.sum(-1).cast(dtypes.int32).detach()

    @classmethod
    def _max_pool_grad_rule(cls, grad: Any, m: Any) -> tuple[Any]:
        """The gradient of max pooling (m: CUSTOM_GRAD(out, x)), as PyTorch's: each window sends its gradient to its
        first largest element (a NaN counts as largest), by compare-select, not by summing over the windows.

        Each output's window tap that won (an argmax) selects the gradient into one of k plane-sized parts; tap j's
        part is moved to where that tap reads (spread by the stride, shifted by j * dilation) and the parts add up.
        Windows that do not overlap (k <= stride, no dilation) put their parts side by side: a view, no sum."""
        ks, st, pads, dl = m.arg.params
        x, g, n = cls(m.src[1]), cls(grad), len(ks)
        if not is_stored(x.uop):  # the argmax compares stored numbers with their max (see autodiff._reduce_grad)
            x = x.contiguous()
        w = x._pool(ks, st, list(pads), dl, value=-math.inf)
        lead, outs, kk = w.shape[: w.ndim - 2 * n], w.shape[w.ndim - 2 * n : w.ndim - n], prod(ks)
        first = w.reshape(*lead, *outs, kk).argmax(-1)
        taps = cls.arange(kk).reshape(*(1,) * (w.ndim - n), kk)
        parts = (taps == first.unsqueeze(-1)).where(g.unsqueeze(-1), 0.0).reshape(*lead, *outs, *ks)
        p = len(lead)
        padded = [o + lo + hi for o, (lo, hi) in zip(x.shape[p:], pads, strict=True)]
        if all(k <= s and d == 1 for k, s, d in zip(ks, st, dl, strict=True)):
            # (..., o1, o2, k1, k2) -> (..., o1, k1, o2, k2), each k padded to the stride: the planes, tiled
            v = parts.permute(*range(p), *(p + j // 2 + (j % 2) * n for j in range(2 * n)))
            v = v.pad([None] * p + [b for k, s in zip(ks, st, strict=True) for b in ((0, 0), (0, s - k))])
            v = v.reshape(*lead, *[o * s for o, s in zip(outs, st, strict=True)])
            dxp = v.pad([None] * p + [(0, P - o * s) for P, o, s in zip(padded, outs, st, strict=True)])
        else:
            dxp = None
            for tap in itertools.product(*(range(k) for k in ks)):
                v = parts[(..., *tap)] if n else parts
                for i, (o, s) in enumerate(zip(outs, st, strict=True)):  # spread by the stride
                    if s > 1:
                        rest = [None] * (n - i - 1)
                        v = v.unsqueeze(p + i + 1).pad([None] * (p + i + 1) + [(0, s - 1)] + rest)
                        v = v.reshape(*v.shape[: p + i], o * s, *v.shape[p + i + 2 :])
                        v = v.shrink([None] * (p + i) + [(0, (o - 1) * s + 1)] + rest)
                shift = [(j * d, P - j * d - L) for j, d, P, L in zip(tap, dl, padded, v.shape[p:], strict=True)]
                v = v.pad([None] * p + shift)
                dxp = v if dxp is None else dxp + v
        dx = dxp.pad([None] * p + [(-lo, -hi) for lo, hi in pads])  # the padding off (and the uncovered end on)
        return (dx.cast(x.dtype).uop,)

    def max_pool1d(self, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                   ceil_mode: bool = False, return_indices: bool = False) -> Self:  # fmt: skip
        """PyTorch's max_pool1d on (N, C, L)."""
        return self._max_pool(1, kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    def max_pool2d(self, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                   ceil_mode: bool = False, return_indices: bool = False) -> Self:  # fmt: skip
        """PyTorch's max_pool2d (stride defaults to kernel_size); padded positions count as -inf. return_indices
        also gives each maximum's flat index in its (H, W) plane (int32), for max_unpool2d."""
        return self._max_pool(2, kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    def max_pool3d(self, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                   ceil_mode: bool = False, return_indices: bool = False) -> Self:  # fmt: skip
        """PyTorch's max_pool3d on (N, C, D, H, W)."""
        return self._max_pool(3, kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    def _max_unpool(self, n: int, indices: Any, kernel_size, stride, padding, output_size) -> Self:
        """The inverse of max pooling: zeros with each value written at its flat index within its plane (a scatter,
        so an index outside the output raises IndexError when the result is computed; a repeated one: last wins)."""
        name = f"max_unpool{n}d"
        self._check_spatial(name, n)
        idx = indices if isinstance(indices, PoolMixin) else type(self)(indices)
        if not idx.dtype.is_int:
            raise TypeError(f"{name}: indices must be an int tensor, got {idx.dtype!r}")
        if idx.shape != self.shape:
            raise ValueError(f"{name}: indices of shape {idx.shape} do not match the input's {self.shape}")
        ks = _tuple(kernel_size, n, "kernel_size")
        st = ks if stride is None else _tuple(stride, n, "stride")
        pd = _tuple(padding, n, "padding")
        sp = self.shape[self.ndim - n :]
        outs = [(i - 1) * s - 2 * p + k for i, k, s, p in zip(sp, ks, st, pd, strict=True)]
        if output_size is not None:
            want = tuple(output_size)[-n:]
            if len(want) != n or any(abs(w - o) >= s for w, o, s in zip(want, outs, st, strict=True)):
                raise ValueError(f"{name}: output_size {tuple(output_size)} must be within a stride of {outs}")
            outs = [int(w) for w in want]
        if any(o < 1 for o in outs):
            raise ValueError(f"{name}: the output size {outs} must be positive")
        lead = self.shape[: self.ndim - n]
        flat = type(self).zeros(*lead, prod(outs), dtype=self.dtype)
        out = flat.scatter(-1, idx.reshape(*lead, -1), self.reshape(*lead, -1))
        return out.reshape(*lead, *outs)

    def max_unpool1d(self, indices: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
                     output_size: Any = None) -> Self:  # fmt: skip
        """PyTorch's max_unpool1d: (N, C, L) values and their max_pool1d indices."""
        return self._max_unpool(1, indices, kernel_size, stride, padding, output_size)

    def max_unpool2d(self, indices: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
                     output_size: Any = None) -> Self:  # fmt: skip
        """PyTorch's max_unpool2d: zeros of the pooled input's size with each value at its max_pool2d index."""
        return self._max_unpool(2, indices, kernel_size, stride, padding, output_size)

    def max_unpool3d(self, indices: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
                     output_size: Any = None) -> Self:  # fmt: skip
        """PyTorch's max_unpool3d: (N, C, D, H, W) values and their max_pool3d indices."""
        return self._max_unpool(3, indices, kernel_size, stride, padding, output_size)

    # ---------------------------------------------------------------- average pooling

    def _avg_pool(self, n: int, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        """The mean of each window over the last n dims; the divisor counts padded positions if count_include_pad
        (never the part of a ceil_mode window past the padding), or is `divisor_override`."""
        ks, st, pd, dl = self._pool_args(f"avg_pool{n}d", kernel_size, stride, padding, 1, n)
        pads, outs = self._pool_pads(ks, st, pd, dl, ceil_mode)
        x = self._to_float()
        sums = x._pool(ks, st, pads, dl).sum(tuple(range(-n, 0)))
        if divisor_override is not None:
            if not is_int(divisor_override) or divisor_override == 0:
                raise ValueError(f"avg_pool{n}d: divisor_override must be a nonzero int, got {divisor_override!r}")
            return sums / divisor_override
        # NOTE: the divisors come from NumPy, not from a uopc graph: realizing one here would compile and run a plan
        # while the caller builds its graph (and a TinyJit capture would record it)
        dims = zip(self.shape[-n:], ks, st, pads, outs, strict=True)
        counts = [_window_counts(i, k, s, pad, o, count_include_pad) for i, k, s, pad, o in dims]
        return sums * type(self)(1 / functools.reduce(np.multiply.outer, counts), dtype=x.dtype)

    @opmath
    def avg_pool1d(self, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                   count_include_pad: bool = True) -> Self:  # fmt: skip
        """PyTorch's avg_pool1d on (N, C, L)."""
        return self._avg_pool(1, kernel_size, stride, padding, ceil_mode, count_include_pad, None)

    @opmath
    def avg_pool2d(self, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                   count_include_pad: bool = True, divisor_override: int | None = None) -> Self:  # fmt: skip
        """PyTorch's avg_pool2d: the mean of each window; the divisor counts padded positions if count_include_pad
        (but never the part of a ceil_mode window past the padding), or is `divisor_override`."""
        return self._avg_pool(2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)

    @opmath
    def avg_pool3d(self, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                   count_include_pad: bool = True, divisor_override: int | None = None) -> Self:  # fmt: skip
        """PyTorch's avg_pool3d on (N, C, D, H, W)."""
        return self._avg_pool(3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)

    @opmath
    def adaptive_avg_pool2d(self, output_size: Any) -> Self:
        """PyTorch's adaptive_avg_pool2d: window j of a dim covers [floor(j*i/o), ceil((j+1)*i/o)).

        Sizes that divide evenly are a plain average pool; others a matmul with an averaging matrix per dim."""
        self._check_spatial("adaptive_avg_pool2d", 2)
        sp = self.shape[-2:]
        if is_int(output_size) or output_size is None:
            output_size = (output_size, output_size)
        outs = tuple(i if o is None else int(o) for i, o in zip(sp, output_size, strict=True))
        if any(o < 1 for o in outs):
            raise ValueError(f"adaptive_avg_pool2d: output_size must be positive, got {output_size!r}")
        if all(i % o == 0 for i, o in zip(sp, outs, strict=True)):
            ks = tuple(i // o for i, o in zip(sp, outs, strict=True))
            return self._to_float()._pool(ks, ks, [(0, 0), (0, 0)], (1, 1)).mean((-2, -1))
        mats = [_resize_matrix(i, o, "area", None, None) for i, o in zip(sp, outs, strict=True)]
        return self._to_float()._resize_dims(mats)

    # ---------------------------------------------------------------- resizing

    def _resize_dims(self, mats: list[np.ndarray]) -> Self:
        """Apply an (o, i) matrix to each of the last len(mats) dims: x.transpose(d, -1) @ M.T, dim by dim."""
        x, n = self, len(mats)
        for j, m in enumerate(mats):
            x = x._resize_dim(x.ndim - n + j, m)
        return x

    def _resize_dim(self, d: int, m: np.ndarray) -> Self:
        """Dim d of size i becomes size o: x.transpose(d, -1) @ M.T for the (o, i) matrix M."""
        return (self.transpose(d, -1) @ type(self)(m.T.astype(self.dtype.np))).transpose(d, -1)

    def interpolate(
        self,
        size: Any = None,
        scale_factor: Any = None,
        mode: str = "nearest",
        align_corners: bool | None = None,
        recompute_scale_factor: bool | None = None,
    ) -> Self:
        """PyTorch's interpolate on (N, C, *spatial): modes nearest, nearest-exact (any dtype, kept), linear,
        bilinear, bicubic, trilinear (int inputs are rounded back to their dtype, as PyTorch's uint8) and area.
        recompute_scale_factor=True places the samples by the output size alone, as if `size` had been given."""
        n = self.ndim - 2
        if n < 1:
            raise ValueError(f"interpolate expects (N, C, *spatial), got shape {self.shape}")
        modes = ("nearest", "nearest-exact", "area", "bicubic", *_LINEAR)
        if mode not in modes:
            raise ValueError(f"interpolate: mode {mode!r} is not supported (use one of {sorted(modes)})")
        if (mode in _LINEAR and mode != _LINEAR[min(n, 3) - 1]) or (mode == "bicubic" and n != 2):
            raise ValueError(f"interpolate: mode {mode!r} does not fit a {n}-D spatial input (shape {self.shape})")
        if align_corners is not None and mode not in (*_LINEAR, "bicubic"):
            raise ValueError("interpolate: align_corners only applies to the linear and bicubic modes")
        if (size is None) == (scale_factor is None):
            raise ValueError("interpolate: give exactly one of size and scale_factor")
        sp = self.shape[2:]
        scales: list[float | None]
        if size is not None:
            outs = list(_tuple(size, n, "size"))
            scales = [None] * n
        else:
            sf = (scale_factor,) * n if isinstance(scale_factor, (int, float)) else tuple(scale_factor)
            if len(sf) != n or not all(isinstance(f, (int, float)) and f > 0 for f in sf):
                raise ValueError(f"interpolate: scale_factor {scale_factor!r} needs {n} positive numbers")
            outs = [int(math.floor(i * f)) for i, f in zip(sp, sf, strict=True)]
            scales = [None if recompute_scale_factor else float(f) for f in sf]
        if any(o < 1 for o in outs):
            raise ValueError(f"interpolate: output size {outs} must be positive")
        if mode.startswith("nearest"):  # a gather of source rows per dim: exact in every dtype
            x = self
            for d, (i, o, s) in enumerate(zip(sp, outs, scales, strict=True)):
                if i != o or s not in (None, 1.0):
                    x = x._take(2 + d, type(self)(_nearest_index(i, o, mode, s)), "interpolate")
            return x
        scales = [None if mode == "area" else s for s in scales]  # area is adaptive pooling: sizes alone
        mats = [_resize_matrix(i, o, mode, align_corners, s) for i, o, s in zip(sp, outs, scales, strict=True)]
        return self._resize_float(mats)

    @opmath
    def _resize_float(self, mats: list[np.ndarray]) -> Self:
        """The weighted resize in float; an int input is rounded to nearest and clamped back to its dtype after each
        dim's pass, as PyTorch's separable uint8 kernels do (the last dim first)."""
        if self.dtype.is_float:
            return self._resize_dims(mats)
        lo, hi = (0, 1) if self.dtype.is_bool else (self.dtype.min, self.dtype.max)
        x, n = self, len(mats)
        for j in reversed(range(n)):
            x = x._to_float()._resize_dim(x.ndim - n + j, mats[j]).round().clip(lo, hi).cast(self.dtype)
        return x

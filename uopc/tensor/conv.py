"""Convolutions for Tensor, built from movement ops and one REDUCE each (pooling and resizing: pool.py).

Every sliding-window op first makes a window view of the (padded) input with movement ops only, then reduces it:

    x (N, C, H, W)  --pad, reshape/expand/shrink/permute-->  (N, C, oh, ow, kh, kw)   # a view: no copy
    conv2d:   windows (N, 1, C, oh, ow, kh, kw) * w (1, Cout, C, 1, 1, kh, kw)  -> REDUCE over (C, kh, kw)

so the kernelizer fuses the window reads into the reduction and the optimizer sees a matmul-like loop nest.

A stride-1 convolution reads its input in place (an implicit GEMM, no im2col copy): the padded input is flattened
per channel, and output position p = oh*Wp + ow is computed for every column of the padded width Wp (the last
k-1 columns are cut afterwards), so tap (kh, kw) reads element p + kh*d*Wp + kw*d: for consecutive p, consecutive
elements. The microkernel's vector loads then come straight from the input, and each input element is read by
every tap without being copied once per tap.

    xf (N, C, Hp*Wp + tail)  --windows per spatial dim-->  (N, C, kh, kw, OH*Wp)          # a view: no copy
    out_ext (N, Cout, OH*Wp) = sum over (C, kh, kw) of w * view   -> cut to (N, Cout, OH, OW)

A convolution with one input channel per group (a depthwise convolution; at stride 1 with at most
DIRECT_MAX_CHANNELS output channels per group) is a direct loop (_conv_direct) unless a rule below takes it: each
output sums its window, read where it lies, the stride and the padding in the index arithmetic. A strided
convolution whose kernel is long against its stride (a ResNet stem's 7x7 stride 2) runs as a stride-1 one over the
input's phases (_conv_phases: the s x s phases of each channel copied apart, tap kh = s*a + i reading phase i at
shift a, so only the kernel's own taps are multiplied). Other strided
ones with overlapping windows, 16 or more output channels per group and a reduction (input channels per group x
taps) of 64 or more take the output positions as the GEMM's rows and the channels as its vector lanes (_conv_rows):
the microkernel broadcasts each window element from the padded input where it lies, whatever the stride, so the
windows are never copied; the product is channels-last and its consumer reads it as NCHW. The rest (non-overlapping
windows, as a 1x1 stride 2's, few channels per group, a short reduction, as an RGB stem's) copy their windows once
into rows (im2col) for a GEMM. A 3x3 stride-1 float32 convolution may instead run by Winograd's F(4,3) or F(2,3)
(_conv_winograd: two transform kernels around alpha^2 batched GEMMs, uopc.uop.winograd) where the cost rule
_winograd_tile says it pays.

Gradients come from a rule of their own (autodiff.with_gradient), not from differentiating the windows: the input's
is a stride-1 convolution of the (zero-dilated, padded) output gradient with the flipped, transposed weight, through
the same kernel; the weight's a GEMM whose reduction runs over batch and positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

from uopc import helpers
from uopc.helpers import prod
from uopc.tensor.autodiff import with_gradient
from uopc.tensor.elementwise import opmath
from uopc.tensor.shape import is_int
from uopc.uop.dtype import dtypes
from uopc.uop.winograd import MATRICES, winograd_in, winograd_out, winograd_weight


def _tuple(v: Any, n: int, name: str) -> tuple[int, ...]:
    """An int or a sequence of n ints (PyTorch's `int | tuple` arguments), checked to be ints."""
    vals = (v,) * n if is_int(v) else tuple(v) if isinstance(v, (tuple, list)) else None
    if vals is None or len(vals) != n or not all(is_int(x) for x in vals):
        raise ValueError(f"{name} must be an int or a tuple of {n} ints, got {v!r}")
    return tuple(int(x) for x in vals)


def _out_size(i: int, k: int, s: int, d: int, lo: int, hi: int) -> int:
    """Windows of size k (dilation d, stride s) that fit in i + lo + hi elements."""
    return (i + lo + hi - d * (k - 1) - 1) // s + 1


def _round_positions(npos: int) -> int:
    """The positions an in-place convolution computes: npos rounded up to whole blocks of 64 (the widest register
    tile's columns) when that adds at most 1/8 (the extra outputs read zeros past the input and are cut). Measured:
    ResNet-18's 512-channel 3x3 convs at 7x7 (63 positions, all in the tile's remainder) took ~3 ms each."""
    up = -(-npos // 64) * 64
    return up if (up - npos) * 8 <= npos else npos


# a strided convolution runs as a stride-1 one over the input's phases (Tensor._conv_phases) when its kernel is long
# against its stride: padded to whole strides it would have at most this many times its taps (7x7 stride 2, 8x8:
# 1.31; 3x3 stride 2, 4x4: 1.78, runs as _conv_rows, whose GEMM took 0.33 ms against 0.49-0.61 over the phases for
# ResNet-18's 64 -> 128 at 56x56: there the phases of 64 channels outgrow L1 for each tile of positions)
PHASES_MAX_SPAN = 1.35


# a strided convolution with overlapping windows and at least this many output channels per group runs with its
# positions as the GEMM's rows and its channels as the vector lanes (Tensor._conv_rows: no im2col); fewer channels,
# or windows that do not overlap, copy the windows (im2col)
ROWS_MIN_CHANNELS = 16
# ...and a reduction (input channels per group x taps) at least this long: with fewer, the GEMM is cheap and the
# channels-last product is the cost, read transposed by its consumer. MobileNetV2's stem (3 -> 32 channels, 3x3
# stride 2 at 224x224, 27 multiply-adds an output) with its BatchNorm and ReLU6 took 0.95 ms so, 0.27 by im2col
# (8.6 against 3.0 ms at batch 8); 16 -> 32 channels at 112x112 (144) 0.31 against 0.35; ResNet-18's (576 and
# more) keep it.
ROWS_MIN_REDUCE = 64


# a convolution with one input channel per group is a direct loop over each output's window (Tensor._conv_direct)
# when strided (unless the phases or _conv_rows take it: else it would copy its windows), and at stride 1 with at
# most DIRECT_MAX_CHANNELS output channels per group, where the in-place GEMM reuses each window's loads across its
# tile's rows: 3x3 over (128, 1, 28, 28) with a ReLU, the direct loop ran 0.90x the GEMM's time to 4 channels, 1.17x
# to 8 and 1.12x to 15 (alternating, one process); a depthwise convolution (1 channel per group) 0.5-0.7x, in a
# MobileNetV2 block 0.70-0.97x.
DIRECT_MAX_CHANNELS = 4


def _phases_pay(ks: Sequence[int], st: Sequence[int], dl: Sequence[int]) -> bool:
    """Does a kernel `ks` with stride `st` run over the input's phases (Tensor._conv_phases): no dilation, every
    window overlapping the next (k > s; shorter windows are a reshape already), a kernel long against its stride."""
    if any(d != 1 for d in dl) or any(k <= s for k, s in zip(ks, st, strict=True)):
        return False
    return prod(-(-k // s) * s for k, s in zip(ks, st, strict=True)) <= PHASES_MAX_SPAN * prod(ks)


def _conv_padding(padding: Any, n: int, ks: tuple[int, ...], dil: tuple[int, ...], stride: tuple[int, ...]):
    """Per-dim (before, after) pads from an int, a tuple, "valid" or "same" (PyTorch puts an odd extra pad after)."""
    if padding == "valid":
        return [(0, 0)] * n
    if padding == "same":
        if any(s != 1 for s in stride):
            raise ValueError(f"padding='same' is not supported for strided convolutions (stride {stride})")
        total = [d * (k - 1) for k, d in zip(ks, dil, strict=True)]
        return [(t // 2, t - t // 2) for t in total]
    if isinstance(padding, str):
        raise ValueError(f"padding must be an int, a tuple of ints, 'valid' or 'same', got {padding!r}")
    return [(p, p) for p in _tuple(padding, n, "padding")]


# a Winograd transform moves each float twice (written, then read by the next kernel): the cost rule counts a byte
# moved as this many multiply-adds, the ratio of the FMA peak to the streaming bandwidth here (~100 G/s to 25 GB/s)
WINOGRAD_FMA_PER_BYTE = 4
# the products of a Winograd convolution are alpha^2 GEMMs with one column per tile: with fewer columns than this,
# the microkernel's register tile is as slow as with this many (ResNet-18's 7x7 layers at batch 1 have 4 tiles)
WINOGRAD_MIN_COLS = 16
# ...and with a reduction (input channels) shorter than this, as slow per multiply-add as with this many: the conv
# benchmark's (64,32,28,28) x (64,32,3,3) forward's 36 products of (64 x 32) x (32 x 3136) ran at 90-100 GFLOP/s
# where the 32-channel input gradient's (reducing 64) ran at 120-150
WINOGRAD_MIN_K = 64
# with fewer tiles than this (the microkernel's widest register tile, 64 columns), the products are computed with
# the tiles as rows and the output channels as columns, (alpha^2, T, K): ResNet-18 at batch 1, 36 x (256 x 256) x
# 16 tiles at 14x14 took 0.98 ms as (K, T), 0.62 as (T, K); 36 x (128 x 128) x 49 at 28x28 0.68 and 0.32 ms. The
# output transform reads them a vector of channels at a time (uopc.renderer.winograd).
WINOGRAD_WIDE_T = 64
# ...and three kernels where a direct convolution has one: a fixed cost in multiply-adds (~3 us each)
WINOGRAD_FIXED = 1 << 20


def _winograd_tile(x: Any, w: Any, st, dl, pads, groups: int, outs: Sequence[int]) -> int | None:
    """The m of the Winograd F(m x m, 3 x 3) a convolution runs by (uopc.uop.winograd), or None for the direct
    GEMM: a 2-D 3x3 float32 convolution of stride 1, no dilation or groups, where the cost rule says it pays.

    The rule compares multiply-adds, memory traffic counted at WINOGRAD_FMA_PER_BYTE: direct 9 K C P (P the
    positions the in-place GEMM computes) and its weight's 9 K C floats against alpha^2 K max(C, WINOGRAD_MIN_K)
    max(T, WINOGRAD_MIN_COLS) for T tiles, the transformed weight's alpha^2 K C floats (each product reads its
    weight once a call, from memory in a model whose weights outgrow the caches), 4 bytes per transformed element
    written and read (and the weight's transform, when the weight is trained: it changes every step).
    ResNet-18 at batch 1 picks F(4,3) at 56 and 28 pixels, F(2,3) at 14 and 7 (at 14, F(4,3)'s 9.4 MB of
    transformed weight against F(2,3)'s 4.2: the model 0.98x the time), F(4,3) at 14 and 7 at batch 8; a 1-channel
    input, few channels or a small image keep the direct GEMM. The WINOGRAD setting, read when the convolution is
    built: 0 never, 1 by this rule, 2 or 4 F(2,3) or F(4,3) for every convolution it can take."""
    mode = helpers.settings().WINOGRAD
    if mode not in (0, 1, *MATRICES):
        raise ValueError(f"WINOGRAD must be 0 (never), 1 (by the cost rule), 2 or 4 (F(m,3) always), got {mode!r}")
    if not mode or w.ndim != 4 or tuple(w.shape[2:]) != (3, 3) or groups != 1:
        return None
    if any(v != 1 for v in (*st, *dl)) or x.dtype is not dtypes.float32 or w.dtype is not dtypes.float32:
        return None
    if not all(isinstance(d, int) for d in x.shape) or any(lo < 0 or lo > 2 or hi < 0 for lo, hi in pads):
        return None
    if mode in MATRICES:
        return mode
    N, C, K = x.shape[0], x.shape[1], w.shape[0]
    # the direct GEMM's multiply-adds at the positions it computes: every column of the padded width, rounded up
    # (_conv_in_place), not only the outputs (28x28 at padding 1: 896 positions for 784 outputs)
    cost = 9 * K * C * N * _round_positions(outs[0] * (x.shape[3] + pads[1][0] + pads[1][1]))
    best, cost = None, cost + WINOGRAD_FMA_PER_BYTE * 4 * 9 * K * C
    for m in (2, 4):
        a, T = m + 2, N * -(-outs[0] // m) * -(-outs[1] // m)
        moved = 4 * 2 * (a * a * T * (C + K) + N * prod(outs) * K + N * C * prod(x.shape[2:])) + 4 * a * a * K * C
        if w.requires_grad and not type(x).no_grad:  # a trained weight changes every step: so does its transform
            moved += 4 * (a * a + 9) * K * C
        c = a * a * K * max(C, WINOGRAD_MIN_K) * max(T, WINOGRAD_MIN_COLS) + WINOGRAD_FMA_PER_BYTE * moved
        c += WINOGRAD_FIXED
        if c < cost:
            best, cost = m, c
    return best


class ConvMixin:
    """Convolutions, pooling and interpolation of Tensor (N, C, *spatial) inputs, PyTorch's names and arguments."""

    # ---------------------------------------------------------------- window views

    def _windows(self, ks: Sequence[int], stride: Sequence[int], dil: Sequence[int]) -> Self:
        """The sliding windows of the last len(ks) dims as a view: (..., *spatial) -> (..., *out, *ks).

        Non-overlapping windows (k <= s, no dilation) are a reshape of each dim into (out, s) and a shrink to k.
        Otherwise each dim of size i is repeated e times (an EXPAND), flattened, and re-cut into rows of length
        L = q*i + d (L is d more than a multiple of i): row r then starts at element r*d of the input, so column
        o*s of row r is element o*s + r*d, which is window o's r-th tap."""
        n = len(ks)
        pre, sp = self.shape[: self.ndim - n], self.shape[self.ndim - n :]
        outs = [_out_size(i, k, s, d, 0, 0) for i, k, s, d in zip(sp, ks, stride, dil, strict=True)]
        if all(k <= s and d == 1 for k, s, d in zip(ks, stride, dil, strict=True)):
            need = [o * s for o, s in zip(outs, stride, strict=True)]
            x = self.pad([None] * len(pre) + [(0, nd - i) for nd, i in zip(need, sp, strict=True)])
            x = x.reshape(*pre, *[v for o, s in zip(outs, stride, strict=True) for v in (o, s)])
            x = x.shrink([None] * len(pre) + [b for o, k in zip(outs, ks, strict=True) for b in ((0, o), (0, k))])
            # (..., o1, k1, o2, k2) -> (..., o1, o2, k1, k2)
            p = len(pre)
            return x.permute(*range(p), *(p + 2 * j for j in range(n)), *(p + 2 * j + 1 for j in range(n)))
        rows = []
        for i, o, s, d in zip(sp, outs, stride, dil, strict=True):
            q = max(1, -(-(o * s - d) // i))
            rows.append(q * i + d)
        reps = [-(-(k * L) // i) for k, L, i in zip(ks, rows, sp, strict=True)]
        p = len(pre)
        x = self.reshape(*pre, *[v for i in sp for v in (1, i)])
        x = x.expand(*pre, *[v for e, i in zip(reps, sp, strict=True) for v in (e, i)])
        x = x.reshape(*pre, *[e * i for e, i in zip(reps, sp, strict=True)])
        x = x.shrink([None] * p + [(0, k * L) for k, L in zip(ks, rows, strict=True)])
        x = x.reshape(*pre, *[v for k, L in zip(ks, rows, strict=True) for v in (k, L)])
        x = x.shrink([None] * p + [b for k, o, s in zip(ks, outs, stride, strict=True) for b in ((0, k), (0, o * s))])
        x = x.reshape(*pre, *[v for k, o, s in zip(ks, outs, stride, strict=True) for v in (k, o, s)])
        x = x.shrink([None] * p + [b for k, o in zip(ks, outs, strict=True) for b in ((0, k), (0, o), (0, 1))])
        x = x.reshape(*pre, *[v for k, o in zip(ks, outs, strict=True) for v in (k, o)])
        # (..., k1, o1, k2, o2) -> (..., o1, o2, k1, k2)
        return x.permute(*range(p), *(p + 2 * j + 1 for j in range(n)), *(p + 2 * j for j in range(n)))

    def _check_spatial(self, name: str, n: int) -> None:
        if self.ndim not in (n + 1, n + 2):
            raise ValueError(f"{name} expects a {n + 1}-D (unbatched) or {n + 2}-D input, got shape {self.shape}")

    # ---------------------------------------------------------------- convolution

    @opmath
    def conv2d(
        self,
        weight: Any,
        bias: Any = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
    ) -> Self:
        """PyTorch's conv2d (cross-correlation); also 1-D and 3-D: the weight's rank picks the number of dims.

        x (N, Cin, *spatial), weight (Cout, Cin/groups, *kernel), bias (Cout,); padding int, tuple, 'valid', 'same'.
        """
        w = weight if isinstance(weight, ConvMixin) else type(self)(weight)
        n = w.ndim - 2
        if n < 1:
            raise ValueError(f"conv weight must be (Cout, Cin/groups, *kernel), got shape {w.shape}")
        self._check_spatial(f"conv{n}d", n)
        if self.ndim == n + 1:  # unbatched
            return self.unsqueeze(0).conv2d(w, bias, stride, padding, dilation, groups).squeeze(0)
        ks = w.shape[2:]
        st, dl = _tuple(stride, n, "stride"), _tuple(dilation, n, "dilation")
        if any(v < 1 for v in st + dl):
            raise ValueError(f"stride {st} and dilation {dl} must be positive")
        pads = _conv_padding(padding, n, ks, dl, st)
        if any(lo < 0 or hi < 0 for lo, hi in pads):
            raise ValueError(f"padding must be non-negative, got {padding!r}")
        cin, sp, cout = self.shape[1], self.shape[2:], w.shape[0]
        if not is_int(groups) or groups < 1 or cin % groups or cout % groups:
            raise ValueError(f"groups={groups} must be a positive divisor of in_channels {cin} and out_channels {cout}")
        if w.shape[1] * groups != cin:
            raise ValueError(
                f"conv{n}d: weight {w.shape} with groups={groups} expects {w.shape[1] * groups} input channels, "
                f"got input of shape {self.shape}"
            )
        outs = [_out_size(i, k, s, d, lo, hi) for i, k, s, d, (lo, hi) in zip(sp, ks, st, dl, pads, strict=True)]
        if any(o < 1 for o in outs):
            raise ValueError(f"conv{n}d: kernel {ks} (dilation {dl}) is larger than the padded input {self.shape}")
        stride1 = all(v == 1 for v in st)
        # depthwise (or few channels per group): a direct loop over each output's window
        direct = w.shape[1] == 1 and (not stride1 or cout // groups <= DIRECT_MAX_CHANNELS)
        if (m := _winograd_tile(self, w, st, dl, pads, groups, outs)) is not None:
            out = self._conv_winograd(w, pads, m, outs)
        elif stride1 and not direct:
            out = self._conv_in_place(w, pads, dl, groups)
        elif not stride1 and _phases_pay(ks, st, dl):
            out = self._conv_phases(w, pads, st, groups, outs)
        elif (
            cout // groups >= ROWS_MIN_CHANNELS
            and w.shape[1] * prod(ks) >= ROWS_MIN_REDUCE
            and any(k > s or d > 1 for k, s, d in zip(ks, st, dl, strict=True))
        ):
            out = self._conv_rows(w, pads, st, dl, groups, outs)
        elif direct:
            out = self._conv_direct(w, pads, st, dl, groups, outs)
        else:
            out = self._conv_im2col(w, pads, st, dl, groups, outs)
        out = self._mark_conv(w, out, st, dl, pads, groups)
        if bias is not None:
            b = bias if isinstance(bias, ConvMixin) else type(self)(bias)
            if b.shape != (cout,):
                raise ValueError(f"conv{n}d: bias must have shape ({cout},), got {b.shape}")
            out = out + b.reshape(cout, *([1] * n))
        return out

    def _mark_conv(self, w: Self, out: Self, st: Sequence[int], dl: Sequence[int], pads: Sequence, groups: int):
        """`out`, the convolution of self with w, marked for autodiff (its gradients come from _conv_grad_rule, not
        from differentiating the windows) and for the scheduler (uopc.schedule.fold), under no_grad too."""
        params = (tuple(st), tuple(dl), tuple(tuple(p) for p in pads), groups)
        return out._new(with_gradient(out.uop, (self.uop, w.uop), "conv", params), self, w)

    def _flat_padded(self, pads: Sequence[tuple[int, int]], ks: Sequence[int], dl: Sequence[int]) -> Self:
        """The input padded, flattened per channel and materialized, (N, C, L): Hp*Wp elements and, past them, the
        zeros that the taps of the last rows read (so no read leaves the buffer). `pads` may be negative (a cut).

        The copy is made in the padded input's own shape with whole rows of zeros added for the tail, and flattened
        as a view: its loops then index rows and columns, where a flat (N, C, L) copy divides every position by the
        padded width (a BatchNorm's output copied so ran at 4-6 GB/s)."""
        xp = self.pad([None, None, *pads])
        sp = xp.shape[2:]
        # (the first dim's taps stay inside: its last rows are not output rows)
        tail = sum((ks[i] - 1) * dl[i] * prod(sp[i + 1 :]) for i in range(1, len(ks)))
        npos = (sp[0] - dl[0] * (ks[0] - 1)) * prod(sp[1:])
        tail += _round_positions(npos) - npos
        if rows := -(-tail // prod(sp[1:])):
            xp = self.pad([None, None, (pads[0][0], pads[0][1] + rows), *pads[1:]])
        flat = xp.contiguous().reshape(*xp.shape[:2], prod(xp.shape[2:]))
        return flat.shrink([None, None, (0, prod(sp) + tail)])

    @staticmethod
    def _taps(flat: Any, sp: Sequence[int], ks: Sequence[int], dl: Sequence[int]) -> Any:
        """(N, C, L) -> (N, C, *k, P): for each tap, the flat input from that tap's offset on, over P = OH * Wp
        positions (every column of the padded width, of the output's rows). A view of `flat`: no copy."""
        v = flat
        for i, (k, d) in enumerate(zip(ks, dl, strict=True)):  # (..., L) -> (..., k, L - d*f*(k-1))
            f = prod(sp[i + 1 :])
            v = v.unsqueeze(-2) if k == 1 else v._windows((k,), (1,), (d * f,)).transpose(-1, -2)
        return v

    def _conv_in_place(self, w: Self, pads: Sequence[tuple[int, int]], dl: Sequence[int], groups: int) -> Self:
        """A stride-1 convolution as a GEMM that reads the padded input in place (the module docstring's picture).

        `pads` may be negative (a cut: the input gradient's convolution needs that). Returns (N, Cout, *out)."""
        ks = w.shape[2:]
        sp = [s + lo + hi for s, (lo, hi) in zip(self.shape[2:], pads, strict=True)]
        outs = [s - d * (k - 1) for s, k, d in zip(sp, ks, dl, strict=True)]
        if all(k == 1 for k in ks) and not any(lo or hi for lo, hi in pads):
            # a 1x1 kernel over the unpadded input: a plain GEMM over the input where it lies, its positions as they
            # are (a computed input is packed into the product's panels). A padded copy whose positions were rounded
            # up to whole tiles (_round_positions) cost a kernel of its own and left the product, read through the
            # cut of its extra positions, without its BatchNorm and activation epilogue: MobileNetV2, whose 28x28
            # blocks rounded, ran 0.94-0.95x the time without it at batch 1 and 8 (interleaved, one process)
            flat = self.reshape(*self.shape[:2], prod(self.shape[2:]))
        else:
            flat = self._flat_padded(pads, ks, dl)
        v = self._taps(flat, sp, ks, dl)
        return self._taps_product(v, w, groups, sp, outs)

    def _taps_product(self, v: Self, w: Self, groups: int, sp: Sequence[int], outs: Sequence[int]) -> Self:
        """The in-place GEMM over a taps view v (N, Cin, *k, P) whose position p = oh * W + ow (W = sp[-1], the width
        of the rows it reads: every column is computed, the extra ones cut): (N, Cout, *outs)."""
        n, ks, N, cin, cout = w.ndim - 2, w.shape[2:], v.shape[0], v.shape[1], w.shape[0]
        npos = v.shape[-1]  # outs[0] * W (every position of the padded width, in the output's rows), rounded up
        g, cg, og = groups, cin // groups, cout // groups
        # (N, g, cg, *k, P) -> (N, g, P, cg, *k): the reduction (cg, *k) last
        v = v.reshape(N, g, cg, *ks, npos).permute(0, 1, 3 + n, *range(2, 3 + n))
        col = v.reshape(N, g, 1, npos, cg * prod(ks))
        out = (col * w.reshape(1, g, og, 1, cg * prod(ks))).sum(-1).reshape(N, cout, npos)
        out = out.shrink([None, None, (0, outs[0] * prod(sp[1:]))]).reshape(N, cout, outs[0], *sp[1:])
        return out.shrink([None, None, None, *[(0, o) for o in outs[1:]]])

    def _conv_winograd(self, w: Self, pads: Sequence[tuple[int, int]], m: int, outs: Sequence[int]) -> Self:
        """A 3x3 stride-1 convolution by Winograd's F(m x m, 3 x 3) (uopc.uop.winograd): the input tiles transformed
        (a kernel of its own, reading the unpadded input), one GEMM per transformed point (alpha^2 of them, batched),
        the products transformed back into outputs (another). The weight's transform G w G^T is a third, which a
        plan keeps from call to call while the weight is unchanged (uopc.engine.kept)."""
        N, cin, cout = self.shape[0], self.shape[1], w.shape[0]
        a = m + 2
        u = w._new(winograd_weight(w.uop, m), w).reshape(a * a, cout, 1, cin)
        v = self._new(winograd_in(self.uop, m, (pads[0][0], pads[1][0]), tuple(outs)), self)
        T = v.shape[2]
        if T < WINOGRAD_WIDE_T:  # (a^2, T, K), then read as (a^2, K, T): the tiles as the products' rows
            vt = v.permute(1, 2, 0).reshape(a * a, T, 1, cin)
            y = (vt * u.reshape(a * a, 1, cout, cin)).sum(-1).permute(0, 2, 1)
        else:
            y = (u * v.permute(1, 2, 0).reshape(a * a, 1, T, cin)).sum(-1)  # (a^2, K, T): the batched products
        tiles = (-(-outs[0] // m), -(-outs[1] // m))
        return y._new(winograd_out(y.uop, m, tiles, (N, cout, *outs)), y)

    def _conv_phases(self, w: Self, pads: list, st: tuple[int, ...], groups: int, outs: list) -> Self:
        """A strided convolution as a stride-1 one over the input's phases, read in place (no im2col). Per dim, tap
        k = s*a + i of output o reads x[s*(o + a) + i]: element o + a of phase i. So the s x s phases of each channel
        are copied apart, (N, C, s, s, H/s, W/s) (the copy that also applies the previous layer's elementwise tail),
        each phase flattened with its rows W/s apart as _conv_in_place flattens a padded input, and tap (kh, kw)
        reads phase (kh % s, kw % s) from shift (kh // s) * W/s + kw // s on: the view of the (a, i) pairs, a < k/s
        and i < s, taken in the order s*a + i and cut to the kernel's k. Only the kernel's own taps are multiplied
        (space to depth's phases as channels would multiply 8x8 taps for a 7x7 kernel at stride 2: ResNet-18's stem
        took 0.96-1.05 ms so against 0.85-0.95). The weight is read where it is. Returns (N, Cout, *out)."""
        n, ks = w.ndim - 2, w.shape[2:]
        N, cin = self.shape[0], self.shape[1]
        kk = [-(-k // s) for k, s in zip(ks, st, strict=True)]
        # each padded dim a whole number of phases, long enough for every output's taps
        dims = list(zip(self.shape[2:], pads, st, outs, kk, strict=True))
        big = [s * max(-(-(i + lo + hi) // s), o + t - 1) for i, (lo, hi), s, o, t in dims]
        xp = self.pad([None, None, *[(lo, b - i - lo) for (i, (lo, _), *_), b in zip(dims, big, strict=True)]])
        q = [b // s for b, s in zip(big, st, strict=True)]
        # (N, C, q1, s1, q2, s2, ...) -> (N, C, s1, s2, ..., q1, q2, ...): each phase a plane of its own
        split = [v for b, s in zip(big, st, strict=True) for v in (b // s, s)]
        x2 = xp.reshape(N, cin, *split).permute(0, 1, *range(3, 2 + 2 * n, 2), *range(2, 2 + 2 * n, 2))
        x2 = x2.reshape(N, cin * prod(st), *q)
        v = x2._taps(x2._flat_padded([(0, 0)] * n, kk, [1] * n), q, kk, [1] * n)  # (N, C*s1*s2.., *kk, P)
        npos = v.shape[-1]
        # (N, C, s1, s2, .., a1, a2, .., P) -> (N, C, a1, s1, a2, s2, .., P) -> (N, C, a1*s1, .., P), cut to the kernel
        v = v.reshape(N, cin, *st, *kk, npos)
        v = v.permute(0, 1, *[x for j in range(n) for x in (2 + n + j, 2 + j)], 2 + 2 * n)
        v = v.reshape(N, cin, *[t * s for t, s in zip(kk, st, strict=True)], npos)
        v = v.shrink([None, None, *[(0, k) for k in ks], None])
        return self._taps_product(v, w, groups, q, outs)

    def _conv_rows(self, w: Self, pads: list, st: tuple[int, ...], dl: tuple[int, ...], groups: int, outs: list):
        """A strided convolution as an implicit GEMM with the output positions as rows: (N, P, Cout) = windows
        (N, P, Cin*k) @ w^T (Cin*k, Cout). The input is stored padded once (the copy that also applies the previous
        layer's elementwise tail); the microkernel reads each window's elements where they lie, a broadcast per row
        and tap (uopc.opt.gemm: an operand of memory that is not a computed value is read in place), and the output
        channels are its vector lanes, from the weight's panels (packed once per weight change). So the windows are
        never copied. The product is channels-last; its consumer reads it as (N, Cout, *out)."""
        n, ks = w.ndim - 2, w.shape[2:]
        N, cin, cout = self.shape[0], self.shape[1], w.shape[0]
        g, cg, og = groups, cin // groups, cout // groups
        kk, npos = cg * prod(ks), prod(outs)
        x = self.pad([None, None, *pads]).contiguous()._windows(ks, st, dl)  # (N, Cin, *out, *k)
        # (N, g, cg, P, *k) -> (g, N*P, cg*k): the batch's positions all rows of one GEMM, the reduction last (a
        # symbolic batch stays a dim of its own: (g, N, P, cg*k), a GEMM per image)
        rows = (N * npos,) if type(N) is int else (N, npos)
        x = x.reshape(N, g, cg, npos, *ks).permute(1, 0, 3, 2, *range(4, 4 + n)).reshape(g, *rows, 1, kk)
        out = (x * w.reshape(g, *[1] * len(rows), og, kk)).sum(-1)  # (g, *rows, og)
        return out.reshape(g, N, npos, og).permute(1, 0, 3, 2).reshape(N, cout, *outs)

    def _conv_direct(self, w: Self, pads: list, st: tuple[int, ...], dl: tuple[int, ...], groups: int, outs: list):
        """A convolution with one input channel per group (a depthwise one, or a channel multiplier) as one reduce
        over each output's window: (N, g, og, *out) = sum over k of windows (N, g, 1, *out, *k) * w, the windows a
        view of the input (padding a condition on the index, stride and dilation its strides), so nothing is copied.
        It is memory-bound (k multiply-adds an output). At stride 2 im2col copied each window (2.25 times the input
        at 3x3) and a copy of its phases read the input at a stride with a condition per element; with its
        window unrolled and vectorized (uopc.opt.heuristic._tile_reuse), MobileNetV2's four downsampling blocks (1x1
        expand, depthwise 3x3 stride 2, 1x1 project, BatchNorm and ReLU6 after each) ran in half of im2col's time:
        1.2-1.4 ms against 2.4-2.5 at batch 1, 11-16 against 22-27 at batch 8 (alternating processes). At stride 1
        the in-place GEMM read a padded copy, which took the expand convolution's BatchNorm and ReLU6: with rows
        shorter than two vectors in partial vectors (heuristic._window_lanes), MobileNetV2's stride-1 blocks at
        7x7 to 112x112 ran 0.70-0.97x its time (alternating, one process). Returns (N, Cout, *out)."""
        n, ks = w.ndim - 2, w.shape[2:]
        N, cout = self.shape[0], w.shape[0]
        og = cout // groups
        x = self.pad([None, None, *pads])._windows(ks, st, dl).reshape(N, groups, 1, *outs, *ks)
        out = (x * w.reshape(1, groups, og, *[1] * n, *ks)).sum(tuple(range(-n, 0)))
        return out.reshape(N, cout, *outs)

    def _conv_im2col(self, w: Self, pads: list, st: tuple[int, ...], dl: tuple[int, ...], groups: int, outs: list):
        """A strided convolution whose windows do not overlap (a 1x1 stride 2: the copy is a quarter of the input)
        or with few output channels per group (too few for the lanes of _conv_rows) and several input channels per
        group: the windows copied once into rows (im2col), then a GEMM. Returns (N, Cout, *out)."""
        n, ks = w.ndim - 2, w.shape[2:]
        N, cin, cout = self.shape[0], self.shape[1], w.shape[0]
        g, cg, og = groups, cin // groups, cout // groups
        kk, npos = cg * prod(ks), prod(outs)
        x = self.pad([None, None, *pads])._windows(ks, st, dl)  # (N, Cin, *out, *k)
        # im2col: the windows copied once, position-major within each tap (N, g, cg*k, P): the GEMM's B with its
        # columns (positions) contiguous, which the microkernel's panels copy a run of NR at a time, and its output
        # (N, g, og, P) already NCHW. (Staged with the positions and the window axes unmerged, so the copy's loops
        # index without div/mod. Rows of taps (N, g, P, cg*k) made the panels a transposing copy: 0.45 of the
        # 1.2 ms of a 64->128 stride-2 convolution at 56x56.)
        sp_ax, k_ax = list(range(3, 3 + n)), list(range(3 + n, 3 + 2 * n))
        x = x.reshape(N, g, cg, *outs, *ks).permute(0, 1, 2, *k_ax, *sp_ax)
        col = x.contiguous().reshape(N, g, 1, kk, npos).transpose(-1, -2)
        return (col * w.reshape(1, g, og, 1, kk)).sum(-1).reshape(N, cout, *outs)

    @classmethod
    def _conv_grad_rule(cls, grad: Any, m: Any) -> tuple[Any, Any]:
        """The gradients of a convolution marked by conv2d (m: CUSTOM_GRAD(out, x, w)), as UOp graphs.

        dx: a stride-1 convolution of the output gradient, zero-dilated by the stride and padded so that every input
        position sees each tap that read it, with the weight flipped in space and its channels transposed per group.
        dw: a GEMM over (batch, positions): the output gradient against the windows of the padded input."""
        x, w, g = cls(m.src[1]), cls(m.src[2]), cls(grad)
        st, dl, pads, groups = m.arg.params
        n, ks = w.ndim - 2, w.shape[2:]
        N, cin, sp = x.shape[0], x.shape[1], x.shape[2:]
        cout, outs = w.shape[0], g.shape[2:]
        gr, cg, og = groups, cin // groups, cout // groups
        # ---- dx
        gd = g
        if any(s > 1 for s in st):  # stride-1 zeros between elements: (o, 1) padded to (o, s), cut to (o-1)*s + 1
            gd = gd.reshape(N, cout, *[v for o in outs for v in (o, 1)])
            gd = gd.pad([None, None, *[b for s in st for b in ((0, 0), (0, s - 1))]])
            gd = gd.reshape(N, cout, *[o * s for o, s in zip(outs, st, strict=True)])
            gd = gd.shrink([None, None, *[(0, (o - 1) * s + 1) for o, s in zip(outs, st, strict=True)]])
        # input position i (padded: i + lo) gets tap j from output position (i + lo - j*d) / s: the dilated gradient
        # padded by d*(k-1) - lo before, and to length i + d*(k-1) after (negative amounts cut)
        gpads = []
        for i, k, d, (lo, _), gl in zip(sp, ks, dl, pads, gd.shape[2:], strict=True):
            before = d * (k - 1) - lo
            gpads.append((before, i + d * (k - 1) - before - gl))
        # (cout, cg, *k) -> (g, og, cg, *k) -> (g, cg, og, *k) -> (cin, og, *k), flipped in space
        wt = w.reshape(gr, og, cg, *ks).transpose(1, 2).reshape(cin, og, *ks).flip(tuple(range(2, 2 + n)))
        # (a 3x3 one by Winograd where the cost rule says so, as a forward convolution of these shapes would run)
        if (wm := _winograd_tile(gd, wt, (1,) * n, dl, gpads, groups, sp)) is not None:
            dxv = gd._conv_winograd(wt, gpads, wm, sp)
        else:
            dxv = gd._conv_in_place(wt, gpads, dl, groups)
        dx = gd._mark_conv(wt, dxv, (1,) * n, dl, gpads, groups)
        # ---- dw: (g, kk, og) = sum over (N, P) of the windows (g, kk, N*P) times the gradient (g, og, N*P). The
        # windows are read from the flat padded input (a stride-1 forward's own node: materialized once, for both)
        psp = [s + lo + hi for s, (lo, hi) in zip(sp, pads, strict=True)]
        xp = x._flat_padded(pads, ks, dl).shrink([None, None, (0, prod(psp))]).reshape(N, cin, *psp)
        npos, kk = prod(outs), cg * prod(ks)
        win = xp._windows(ks, st, dl).reshape(N, gr, cg, npos, *ks)  # (N, g, cg, P, *k)
        win = win.permute(1, 2, *range(4, 4 + n), 0, 3).reshape(gr, kk, 1, N * npos)
        gg = g.reshape(N, gr, 1, og, npos).permute(1, 2, 3, 0, 4).reshape(gr, 1, og, N * npos)
        dw = (win * gg).sum(-1).transpose(1, 2).reshape(cout, cg, *ks)
        return dx.uop, dw.uop

    @opmath
    def conv1d(self, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups=1):
        """PyTorch's conv1d: x (N, Cin, L), weight (Cout, Cin/groups, k)."""
        w = weight if isinstance(weight, ConvMixin) else type(self)(weight)
        if w.ndim != 3:
            raise ValueError(f"conv1d weight must be (Cout, Cin/groups, k), got shape {w.shape}")
        return self.conv2d(w, bias, stride, padding, dilation, groups)

    @opmath
    def conv3d(self, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups=1):
        """PyTorch's conv3d: x (N, Cin, D, H, W), weight (Cout, Cin/groups, kd, kh, kw)."""
        w = weight if isinstance(weight, ConvMixin) else type(self)(weight)
        if w.ndim != 5:
            raise ValueError(f"conv3d weight must be (Cout, Cin/groups, kd, kh, kw), got shape {w.shape}")
        return self.conv2d(w, bias, stride, padding, dilation, groups)

    @opmath
    def conv_transpose2d(
        self,
        weight: Any,
        bias: Any = None,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        dilation: Any = 1,
    ) -> Self:
        """PyTorch's conv_transpose2d (and 1-D/3-D by the weight's rank): weight (Cin, Cout/groups, *kernel).

        The gradient of a convolution: spread the input with stride-1 zeros between elements, pad by
        d*(k-1) - padding, and convolve with the flipped kernel, in and out channels swapped within each group."""
        w = weight if isinstance(weight, ConvMixin) else type(self)(weight)
        n = w.ndim - 2
        if n < 1:
            raise ValueError(f"conv_transpose weight must be (Cin, Cout/groups, *kernel), got shape {w.shape}")
        self._check_spatial(f"conv_transpose{n}d", n)
        if self.ndim == n + 1:
            return self.unsqueeze(0).conv_transpose2d(w, bias, stride, padding, output_padding, groups, dilation)[0]
        ks = w.shape[2:]
        st, dl = _tuple(stride, n, "stride"), _tuple(dilation, n, "dilation")
        pd, op = _tuple(padding, n, "padding"), _tuple(output_padding, n, "output_padding")
        cin = self.shape[1]
        if not is_int(groups) or groups < 1 or cin % groups or w.shape[0] != cin:
            raise ValueError(f"conv_transpose{n}d: weight {w.shape} and groups={groups} do not fit input {self.shape}")
        if any(o >= max(s, d) for o, s, d in zip(op, st, dl, strict=True)) or any(v < 0 for v in pd + op):
            raise ValueError(f"output_padding {op} must be smaller than stride {st} or dilation {dl}; pads >= 0")
        g, og = groups, w.shape[1]
        # (Cin, og, *k) -> (g, cin/g, og, *k) -> (g, og, cin/g, *k) -> (g*og, cin/g, *k), flipped in space
        wt = w.reshape(g, cin // g, og, *ks).transpose(1, 2).reshape(g * og, cin // g, *ks)
        wt = wt.flip(tuple(range(2, 2 + n)))
        x = self
        N, sp = x.shape[:2], x.shape[2:]
        if any(s > 1 for s in st):  # stride-1 zeros between elements: (i, 1) padded to (i, s), cut to (i-1)*s + 1
            x = x.reshape(*N, *[v for i in sp for v in (i, 1)])
            x = x.pad([None, None, *[b for s in st for b in ((0, 0), (0, s - 1))]])
            x = x.reshape(*N, *[i * s for i, s in zip(sp, st, strict=True)])
            x = x.shrink([None, None, *[(0, (i - 1) * s + 1) for i, s in zip(sp, st, strict=True)]])
        pads = [(d * (k - 1) - p, d * (k - 1) - p + o) for k, d, p, o in zip(ks, dl, pd, op, strict=True)]
        x = x.pad([None, None, *pads])  # a negative amount cuts
        return x.conv2d(wt, bias, 1, 0, dl, g)

    @opmath
    def conv_transpose1d(self, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, output_padding=0,
                         groups: int = 1, dilation: Any = 1) -> Self:  # fmt: skip
        """PyTorch's conv_transpose1d: weight (Cin, Cout/groups, k)."""
        return self.conv_transpose2d(weight, bias, stride, padding, output_padding, groups, dilation)

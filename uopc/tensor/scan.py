"""Scans and sorting for Tensor: cumsum/cumprod/cummax/cummin/logcumsumexp, sort/argsort/topk, and exact prod.

cumsum and cummax are blocked scans: the scanned axis is cut into blocks of 64, each block scanned by a masked
(64, 64) reduce, the block totals scanned the same way (recursively, so log_64(n) levels) and added back:

    x (n,) -> (n/64, 64) -> local scans (n/64, 64) -> totals (n/64,) -> scanned recursively -> local + exclusive

sort is a bitonic network on the axis padded to a power of two, log2(n)(log2(n)+1)/2 compare-exchange stages, each
one kernel that GATHERs every element's partner (position XOR j). The stage's j and k are one-element tensors, so
every stage is the same kernel (compiled once per shape) and the whole sort is one plan.
"""

from __future__ import annotations

import math
from typing import Any, Self

import numpy as np

from uopc.helpers import prod
from uopc.tensor.elementwise import opmath
from uopc.tensor.shape import norm_dim
from uopc.uop import Ops
from uopc.uop.dtype import dtypes

# a sort with more compare-exchange stages than this realizes its network in chunks of this many stages: every chunk
# has the same structure (the stage's j and k are data), so one plan serves them all, where one plan of the whole
# network (136 stages for 2^16) would take seconds to schedule the first time. Such a sort realizes its input.
_SORT_CHUNK = 16
_BLOCK = 64  # scan block: a (64, 64) masked reduce per block is cheap, and 64^3 = 2^18 needs only three levels


class ScanMixin:
    """Scans, sorting and exact products of Tensor."""

    # ---------------------------------------------------------------- scans

    def _widen_small_int(self) -> Self:
        """bool and ints narrower than 32 bits accumulate in int32, as sum does."""
        small = self.dtype.is_bool or (self.dtype.is_int and self.dtype.itemsize < 4)
        return self.cast(dtypes.default_int) if small else self

    def _scan(self, axis: int, op: Ops) -> Self:
        """Inclusive ADD or MAX scan along `axis` (moved last and back)."""
        if self.ndim == 0:
            return self
        d = norm_dim(axis, self.ndim)
        x = self.transpose(d, -1) if d != self.ndim - 1 else self
        if x.shape[-1] == 0:
            return self
        out = x._scan_last(op)
        return out.transpose(d, -1) if d != self.ndim - 1 else out

    def _scan_identity(self, op: Ops) -> Any:
        return 0 if op is Ops.ADD else self.dtype.min

    def _combine(self, other: Self, op: Ops) -> Self:
        return self + other if op is Ops.ADD else self.maximum(other)

    def _scan_tri(self, op: Ops) -> Self:
        """Scan the last axis (length n <= block) with one masked (n, n) reduce: out[i] = op(x[j] for j <= i)."""
        n = self.shape[-1]
        mask = type(self)(np.tri(n, dtype=np.bool_))  # mask[i, j] = j <= i
        xe = self.unsqueeze(-2).expand(*self.shape[:-1], n, n)
        sel = mask.where(xe, self._scan_identity(op))
        return sel._reduce(op, -1, keepdim=False)

    def _scan_last(self, op: Ops) -> Self:
        n = self.shape[-1]
        if n <= _BLOCK:
            return self._scan_tri(op)
        m = -(-n // _BLOCK)
        lead = self.shape[:-1]
        pads = ((0, 0),) * len(lead) + ((0, m * _BLOCK - n),)
        x = self.pad(pads, value=self._scan_identity(op)) if m * _BLOCK != n else self
        local = x.reshape(*lead, m, _BLOCK)._scan_tri(op).contiguous()
        totals = local[..., _BLOCK - 1]
        inclusive = totals._scan_last(op).contiguous()
        excl = inclusive.pad(((0, 0),) * len(lead) + ((1, 0),), value=self._scan_identity(op))
        excl = excl.shrink(tuple((0, s) for s in lead) + ((0, m),))
        out = local._combine(excl.unsqueeze(-1), op).reshape(*lead, m * _BLOCK)
        return out.shrink(tuple((0, s) for s in lead) + ((0, n),)) if m * _BLOCK != n else out

    @opmath
    def cumsum(self, axis: int = 0) -> Self:
        """Running sum along `axis` (bool and small ints sum in int32, as sum does)."""
        return self._widen_small_int()._scan(axis, Ops.ADD)

    def cummax(self, axis: int = 0) -> Self:
        """Running maximum along `axis` (values, as tinygrad; PyTorch's .values)."""
        return self._scan(axis, Ops.MAX)

    def cummin(self, axis: int = 0) -> Self:
        """Running minimum along `axis`."""
        return self._order_flip()._scan(axis, Ops.MAX)._order_flip()

    @opmath
    def cumprod(self, axis: int = 0) -> Self:
        """Running product along `axis`: log2(n) doubling passes (x * x shifted by 1, 2, 4, ...), exact for ints."""
        if self.ndim == 0:
            return self
        d = norm_dim(axis, self.ndim)
        x = self._widen_small_int()
        n = x.shape[d]
        s = 1
        while s < n:
            pads = tuple((s, 0) if i == d else (0, 0) for i in range(x.ndim))
            shifted = x.pad(pads, value=1).shrink(tuple((0, n) if i == d else None for i in range(x.ndim)))
            x = (x * shifted).contiguous()
            s *= 2
        return x

    @opmath
    def logcumsumexp(self, axis: int = 0) -> Self:
        """log(cumsum(exp(x))) along `axis`: each prefix is its own shifted logsumexp (one shift for the whole
        axis would underflow the prefixes before a large value to log(0)), blocked as the other scans."""
        x = self._to_float()
        if x.ndim == 0:
            return x
        d = norm_dim(axis, x.ndim)
        y = x.transpose(d, -1) if d != x.ndim - 1 else x
        if y.shape[-1] == 0:
            return x
        out = y._logcumsumexp_last()
        return out.transpose(d, -1) if d != x.ndim - 1 else out

    def _logcumsumexp_last(self) -> Self:
        n = self.shape[-1]
        if n <= _BLOCK:  # out[i] = logsumexp(x[j] for j <= i), one masked (n, n) reduce
            mask = type(self)(np.tri(n, dtype=np.bool_))
            return mask.where(self.unsqueeze(-2).expand(*self.shape[:-1], n, n), -math.inf).logsumexp(-1)
        m = -(-n // _BLOCK)
        lead = self.shape[:-1]
        x = self.pad(((0, 0),) * len(lead) + ((0, m * _BLOCK - n),), value=-math.inf) if m * _BLOCK != n else self
        local = x.reshape(*lead, m, _BLOCK)._logcumsumexp_last().contiguous()
        inclusive = local[..., _BLOCK - 1]._logcumsumexp_last().contiguous()
        excl = inclusive.pad(((0, 0),) * len(lead) + ((1, 0),), value=-math.inf)
        excl = excl.shrink(tuple((0, s) for s in lead) + ((0, m),)).unsqueeze(-1)
        top = local.maximum(excl).detach()  # log(e^a + e^b) shifted by the larger; an infinite one shifts by 0
        top = (top.abs() == math.inf).where(0, top)
        out = ((local - top).exp() + (excl - top).exp()).log() + top
        out = out.reshape(*lead, m * _BLOCK)
        return out.shrink(tuple((0, s) for s in lead) + ((0, n),)) if m * _BLOCK != n else out

    @opmath
    def prod(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Self:
        """Product over `axis` by a tree of multiplies (8 at a time per kernel): exact for ints, as PyTorch."""
        x = self if dtype is None else self.cast(dtype)
        x = x._widen_small_int()
        if axis is None:
            out = x.reshape(-1)._prod_last() if x.ndim else x
            return out.reshape((1,) * x.ndim) if keepdim else out
        axes = sorted({norm_dim(a, x.ndim) for a in ((axis,) if isinstance(axis, int) else axis)})
        if not x.ndim:
            return x
        kept = [i for i in range(x.ndim) if i not in axes]
        y = x.permute(*kept, *axes)
        y = y.reshape(*y.shape[: len(kept)], prod(x.shape[a] for a in axes))._prod_last()  # no -1: a dim may be 0
        if keepdim:
            y = y.reshape(tuple(1 if i in axes else s for i, s in enumerate(x.shape)))
        return y

    def _prod_last(self) -> Self:
        """The product of the last axis, which disappears."""
        x = self
        while x.shape[-1] > 1:
            n = x.shape[-1]
            k = min(8, n)
            m = -(-n // k)
            if m * k != n:
                x = x.pad(((0, 0),) * (x.ndim - 1) + ((0, m * k - n),), value=1)
            parts = x.reshape(*x.shape[:-1], m, k)
            acc = parts[..., 0]
            for i in range(1, k):
                acc = acc * parts[..., i]
            x = acc.contiguous() if m > 1 else acc
        if x.shape[-1] == 0:
            return self.full(x.shape[:-1], 1, dtype=x.dtype)
        return x.reshape(x.shape[:-1])

    # ---------------------------------------------------------------- sorting

    def sort(self, dim: int = -1, descending: bool = False) -> tuple[Self, Self]:
        """(values, indices) sorted along `dim`; equal values keep their order (stable); the values carry gradients
        (a gather of the input). NaNs are not ordered specially."""
        if self.ndim == 0:
            return self, self.full_like(0, dtypes.int32)
        d = norm_dim(dim, self.ndim)
        x = self.transpose(d, -1) if d != self.ndim - 1 else self
        n = x.shape[-1]
        key = x.cast(dtypes.int32) if x.dtype.is_bool else x
        if descending:
            key = key._order_flip()
        big = 1 << max(0, (n - 1).bit_length())
        if n == 0:
            return self, self.full_like(0, dtypes.int32)
        if big != n:
            key = key.pad(((0, 0),) * (key.ndim - 1) + ((0, big - n),), value=key.dtype.max)
        pos = self.arange(big)
        key = key.detach().contiguous()  # the network only permutes indices: no gradient through its comparisons
        # only the permutation travels through the network: each stage reads both keys through it (a gather of a
        # gather), so a stage is one kernel with one output
        idx = pos._broadcast_to(key.shape, keep_const=False).contiguous()
        n_stages = sum(range(1, big.bit_length()))
        chunked = n_stages > _SORT_CHUNK
        if chunked:  # see _SORT_CHUNK: the network runs as equal chunks that share one cached plan
            type(self).realize_all(key, idx)
        done, k = 0, 2
        while k <= big:
            j = k // 2
            while j >= 1:
                # fresh one-element tensors per stage: every chunk then has the same structure (no shared buffers)
                jt, kt = (type(self)(np.array([v], np.int32)) for v in (j, k))
                idx = key._bitonic_stage(idx, pos, jt, kt)
                done += 1
                if chunked and done % _SORT_CHUNK == 0:
                    idx.realize()
                j //= 2
            k *= 2
        idx = idx.shrink(tuple((0, s) for s in idx.shape[:-1]) + ((0, n),))
        vals = x.gather(-1, idx)  # a GATHER of the input: gradients flow back to the sorted elements
        if d != self.ndim - 1:
            vals, idx = vals.transpose(d, -1), idx.transpose(d, -1)
        return vals, idx

    def _bitonic_stage(self, idx: Self, pos: Self, j: Self, k: Self) -> Self:
        """One compare-exchange stage on the permutation `idx` of keys `self`: position i meets i ^ j, and the
        pair ascends where i & k == 0."""
        partner = pos ^ j
        last = self.ndim - 1
        pidx = type(self)(idx.uop.gather(partner._broadcast_to(self.shape, keep_const=False).uop, last, "sort"))
        mine = type(self)(self.uop.gather(idx.uop, last, "sort"))
        theirs = type(self)(self.uop.gather(pidx.uop, last, "sort"))
        less = (mine < theirs) | ((mine == theirs) & (idx < pidx))
        want_small = (pos < partner) == ((pos & k) == 0)
        return (want_small == less).where(idx, pidx).contiguous()

    def argsort(self, dim: int = -1, descending: bool = False) -> Self:
        """The indices (int32) that sort `dim` (stable)."""
        return self.sort(dim, descending)[1]

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Self, Self]:
        """(values, indices) of the k largest (or smallest) entries along `dim`, best first."""
        d = norm_dim(dim, self.ndim)
        if not 0 <= k <= (self.shape[d] if self.ndim else 1):
            raise ValueError(f"topk: k={k} is out of range for dim {dim} of size {self.shape[d] if self.ndim else 1}")
        vals, idx = self.sort(d, descending=largest)
        keep = tuple((0, k) if i == d else None for i in range(self.ndim))
        return vals.shrink(keep), idx.shrink(keep)

"""Movement for Tensor: reshape, permute, expand, pad, shrink, flip, indexing, and joining or splitting tensors.

All of them are index maps on the UOp graph (movement ops); nothing here copies on the host. A strided slice is a
shrink, an optional flip, and a pad+reshape that exposes every step-th element:

    x[1:8:3]   (size 10)  ->  shrink to [1, 8) (7 elems), pad to 9, reshape (3, 3), keep column 0  ->  x[1], x[4], x[7]

Concatenation pads every piece to the full size at its offset and adds them, so it fuses into one kernel.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple, Self

import numpy as np

from uopc.helpers import prod
from uopc.tensor.shape import (
    broadcast_shape,
    expand_shape,
    is_int,
    norm_axes,
    norm_dim,
    pad_cuts,
    pad_pairs,
    permute_order,
    reshape_shape,
    shape_arg,
    shrink_bounds,
    symbolic_item,
    varargs,
)
from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes, promote
from uopc.uop.variable import Bound, Variable, merge_vars, unbind


class View(NamedTuple):
    """Where a tensor made by basic indexing comes from: x[index] for the tensor `src()` (None once it is gone)."""

    src: weakref.ref
    index: Any


class MovementMixin:
    """The movement part of Tensor. Every Tensor is a MovementMixin, so `isinstance(x, MovementMixin)` tells a
    tensor argument without importing Tensor; new tensors come from `self._new(...)` or `type(self)(...)`."""

    # ---------------------------------------------------------------- movement ops

    def reshape(self, *shape: Any) -> Self:
        """Same data, new shape; one dim may be -1 (inferred)."""
        shape, binds = unbind(varargs(shape))
        shape = reshape_shape(self.shape, shape)
        return (self if shape == self.shape else self._new(self.uop.reshape(shape)))._bound(binds)

    view = reshape

    def permute(self, *order: Any) -> Self:
        """Reorder dims: out.shape[i] = self.shape[order[i]]."""
        order = permute_order(self.shape, varargs(order))
        return self._new(self.uop.permute(order)) if order != tuple(range(self.ndim)) else self

    def transpose(self, dim0: int = -2, dim1: int = -1) -> Self:
        """Swap two dims; by default the last two (for a matrix that is (1, 0); batched `a @ b.transpose()` works)."""
        a, b = norm_dim(dim0, self.ndim), norm_dim(dim1, self.ndim)
        order = list(range(self.ndim))
        if self.ndim:
            order[a], order[b] = order[b], order[a]
        return self.permute(*order)

    def expand(self, *shape: Any) -> Self:
        """Broadcast size-1 dims (and new leading dims) to `shape`; -1 keeps a dim."""
        shape, binds = unbind(varargs(shape))
        shape = expand_shape(self.shape, shape)
        x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape)
        return (x if shape == x.shape else x._new(x.uop.expand(shape)))._bound(binds)

    def pad(self, padding: Sequence, mode: Any = "constant", value: float = 0.0) -> Self:
        """Pad with `value` (±inf too): ((before, after) or None) per dim, or PyTorch's flat form; negative pads cut.

        mode "reflect", "replicate" or "circular" fills from the tensor itself; a number as `mode` is the value."""
        if not isinstance(mode, str):  # pad(p, 1.0): the value, positionally
            mode, value = "constant", mode
        pairs = pad_pairs(self.shape, padding)
        if mode != "constant":
            if mode not in ("reflect", "replicate", "circular"):
                raise ValueError(f"pad mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
            # reflect/replicate fill from the whole tensor, then cut the negative amounts; circular cuts first and
            # wraps what is left (PyTorch's rules)
            x = self.shrink(pad_cuts(self.shape, pairs, padding)) if mode == "circular" else self
            grown = x._pad_mode([(max(0, lo), max(0, hi)) for lo, hi in pairs], mode)
            if mode == "circular":
                return grown
            cut = [(max(0, -lo), max(0, -hi)) for lo, hi in pairs]
            if any(lo + hi > s for (lo, hi), s in zip(cut, grown.shape, strict=True)):
                raise ValueError(f"padding {tuple(padding)} cuts more than the dims of shape {self.shape}")
            return grown.shrink(tuple((lo, s - hi) for (lo, hi), s in zip(cut, grown.shape, strict=True)))
        x = self.shrink(pad_cuts(self.shape, pairs, padding))  # negative amounts cut first
        grow = tuple((max(0, lo), max(0, hi)) for lo, hi in pairs)
        if all(g == (0, 0) for g in grow):
            return x
        padded = x._new(x.uop.pad(grow))
        if value == 0:  # the IR's PAD fills with zero
            return padded
        try:
            fill = UOp.const(value, x.dtype)
        except (OverflowError, ValueError):
            raise ValueError(f"pad value {value} cannot be represented in dtype {x.dtype!r}") from None
        # a bool mask that is True on the original elements: PAD fills it with False, WHERE picks the fill value there
        mask = UOp.const(True, dtypes.bool).reshape((1,) * x.ndim).expand(x.shape).pad(grow)
        return padded._new(mask.alu(Ops.WHERE, padded.uop, fill))

    def shrink(self, bounds: Sequence) -> Self:
        """Keep [lo, hi) of each dim; None keeps a dim whole."""
        bounds, binds = unbind(tuple(bounds))
        b = shrink_bounds(self.shape, bounds)
        return (self._new(self.uop.shrink(b)) if b != tuple((0, s) for s in self.shape) else self)._bound(binds)

    def flip(self, *axis: Any) -> Self:
        """Reverse the order along `axis` (an int or a tuple of ints)."""
        axes = tuple(norm_dim(a, self.ndim) for a in varargs(axis))
        return self._new(self.uop.flip(axes)) if self.ndim else self

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Self:
        """Drop size-1 dims (all, or those in `dim`; a named dim that is not 1 is kept, as PyTorch)."""
        dims = range(self.ndim) if dim is None else norm_axes(dim, self.shape)
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if not (i in dims and s == 1)))

    def unsqueeze(self, dim: int) -> Self:
        """Insert a size-1 dim at `dim` (in range [-ndim-1, ndim])."""
        d = norm_dim(dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Self:
        """Merge dims start_dim..end_dim (inclusive) into one."""
        if not self.ndim:
            return self.reshape(1)
        s, e = norm_dim(start_dim, self.ndim), norm_dim(end_dim, self.ndim)
        if s > e:
            raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} (shape {self.shape})")
        return self.reshape(self.shape[:s] + (prod(self.shape[s : e + 1]),) + self.shape[e + 1 :])

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Self:
        """Split dim `dim` into `sizes`."""
        d = norm_dim(dim, self.ndim)
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1 :])

    def repeat(self, *repeats: Any) -> Self:
        """Tile the tensor `repeats[i]` times along dim i (new leading dims allowed), as PyTorch.

        Each dim s is viewed as (1, s), expanded to (r, s), and merged to r * s."""
        repeats = shape_arg(repeats)
        if len(repeats) < self.ndim:
            raise ValueError(f"repeat {repeats} needs at least one entry per dim of shape {self.shape}")
        shape = (1,) * (len(repeats) - self.ndim) + self.shape
        pairs = [v for s in shape for v in (1, s)]
        tiled = [v for r, s in zip(repeats, shape, strict=True) for v in (r, s)]
        return self.reshape(pairs).expand(tiled).reshape(tuple(r * s for r, s in zip(repeats, shape, strict=True)))

    # ---------------------------------------------------------------- splitting

    def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple[Self, ...]:
        """Pieces along `dim`: of `sizes` each (the last may be smaller), or of the listed sizes."""
        d = norm_dim(dim, self.ndim)
        total = self.shape[d]
        if is_int(sizes):
            if sizes <= 0:
                raise ValueError(f"split size must be positive, got {sizes}")
            sizes = [min(sizes, total - i) for i in range(0, total, sizes)] or [0]
        sizes = list(sizes)
        if sum(sizes) != total:
            raise ValueError(
                f"split sizes {sizes} sum to {sum(sizes)} but dim {d} of shape {self.shape} has size {total}"
            )
        out, off = [], 0
        for n in sizes:
            out.append(self.shrink(tuple((off, off + n) if j == d else None for j in range(self.ndim))))
            off += n
        return tuple(out)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Self, ...]:
        """`chunks` nearly equal pieces along `dim`."""
        if chunks <= 0:
            raise ValueError(f"chunk expects a positive number of chunks, got {chunks}")
        size = self.shape[norm_dim(dim, self.ndim)]
        return self.split(max(1, -(-size // chunks)), dim)

    # ---------------------------------------------------------------- indexing

    def __getitem__(self, index: Any) -> Self:
        """Basic indexing (ints, slices with any step, None, ...) as views, and int-Tensor indices as gathers, as in
        NumPy: several Tensors broadcast together. A list of ints indexes like an int Tensor."""
        items = list(index) if isinstance(index, tuple) else [index]
        for i, it in enumerate(items):
            if isinstance(it, (list, np.ndarray)):
                items[i] = type(self)(it)
            elif not (it is None or it is Ellipsis or is_int(it) or isinstance(it, (slice, MovementMixin))):
                raise TypeError(
                    f"unsupported index {it!r} ({type(it).__name__}): use ints, slices, None, ..., or an int Tensor"
                )
        if sum(it is Ellipsis for it in items) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        consumed = sum(it is not None and it is not Ellipsis for it in items)
        if consumed > self.ndim:
            raise IndexError(f"too many indices for tensor of dimension {self.ndim} (shape {self.shape}): {index!r}")
        if any(it is Ellipsis for it in items):  # not `Ellipsis in items`: that would compare Tensors with ==
            at = next(i for i, it in enumerate(items) if it is Ellipsis)
            items[at : at + 1] = [slice(None)] * (self.ndim - consumed)
        else:
            items += [slice(None)] * (self.ndim - consumed)
        tensors = [i for i, it in enumerate(items) if isinstance(it, MovementMixin)]
        bounds, flips, steps, final, gather_at = [], [], [], [], []
        binds: dict = {}  # the values of a symbolic slice's stop (x[:, :pos.bind(n)])
        d = 0  # the input dim the next item indexes
        for it in items:
            if it is None:
                final.append(1)
                continue
            s = self.shape[d]
            plain = is_int(it) or (isinstance(it, slice) and not isinstance(it.stop, (Bound, Variable)))
            if type(s) is Variable and plain:
                sp = symbolic_item(it, s, d)  # a whole symbolic dim, or an int below its minimum
                bounds.append((sp.start, sp.start + 1) if is_int(it) else (0, s))
                steps.append(1)
                if not is_int(it):
                    final.append(s)
            elif is_int(it):
                if not -s <= it < s:
                    raise IndexError(f"index {it} is out of bounds for dimension {d} with size {s}")
                bounds.append((int(it) % s, int(it) % s + 1))
                steps.append(1)
            elif isinstance(it, slice) and isinstance(it.stop, (Bound, Variable)):
                if it.start not in (None, 0) or it.step not in (None, 1):
                    raise IndexError(f"a slice to a Variable must be [:n] (start 0, step 1), got {it!r} at dim {d}")
                stop, more = unbind(it.stop)
                binds = merge_vars(binds, more)
                bounds.append((0, stop))
                steps.append(1)
                final.append(stop)
            elif isinstance(it, MovementMixin):
                gather_at.append(len(final))
                bounds.append((0, s))
                steps.append(1)
                final.append(s)
            else:
                start, stop, step = it.indices(s)
                n = len(range(start, stop, step))
                if n == 0:
                    bounds.append((0, 0))
                elif step > 0:
                    bounds.append((start, start + (n - 1) * step + 1))
                else:  # take the ascending run [last, start], then flip it
                    bounds.append((start + (n - 1) * step, start + 1))
                    flips.append(d)
                steps.append(abs(step) if n > 1 else 1)
                final.append(n)
            d += 1
        out = self.shrink(bounds).flip(tuple(flips))._strided(steps).reshape(tuple(final))._bound(binds)
        if not gather_at:
            if out is not self:  # a view: writing to it writes self (weakly: a view alone does not keep self alive)
                out._view_of = View(weakref.ref(self), index)
            return out
        idx = [items[t] for t in tensors]
        if len(idx) > 1:  # several Tensors: one gather of the dims they index, merged, at their broadcast shape
            out, at, flat = out._merged_index(gather_at, idx)
        else:
            out, at, flat = out, gather_at[0], idx[0]
        out = out._take(at, flat)
        # NumPy: ints and Tensors are all advanced indices; if they are not adjacent, the gathered dims go first
        adv = [i for i, it in enumerate(items) if is_int(it) or isinstance(it, MovementMixin)]
        if adv != list(range(adv[0], adv[-1] + 1)):
            order = list(range(at, at + flat.ndim))
            out = out.permute(*order, *(i for i in range(out.ndim) if i not in order))
        return out

    def _merged_index(self, dims: list[int], idx: list[Self]) -> tuple[Self, int, Self]:
        """x[..., I, ..., J, ...] as one take: the indexed `dims` moved together (to the first one) and merged into
        one dim, and the flat index I*size_J + J at the Tensors' broadcast shape. Each Tensor is checked against
        its own dim first (negative values count from the end), so a flat index is never out of range silently."""
        for t in idx:
            if not t.dtype.is_int:
                raise IndexError(f"tensors used as indices must be int tensors, got {t.dtype!r}")
        try:
            shape = broadcast_shape(*(t.shape for t in idx))
        except ValueError:
            shapes = " ".join(str(t.shape) for t in idx)
            msg = f"shape mismatch: indexing tensors could not be broadcast together with shapes {shapes}"
            raise IndexError(msg) from None
        sizes = [self.shape[d] for d in dims]
        dt = dtypes.int64 if prod(sizes) > 2**31 - 1 else dtypes.int32
        flat = None
        for t, d, n in zip(idx, dims, sizes, strict=True):
            if n == 0 and t.numel():
                raise IndexError(f"cannot index dimension {d} of size 0 (shape {self.shape})")
            # arange(n) taken at t: t itself, checked against n when the kernel runs (negatives wrapped)
            j = type(self).arange(n, dtype=dt)._take(0, t, f"index of dim {d}").expand(shape)
            flat = j if flat is None else flat * n + j
        at = dims[0]
        rest = [d for d in range(self.ndim) if d not in dims]
        perm = [*rest[:at], *dims, *rest[at:]]
        x = self.permute(*perm)
        x = x.reshape((*x.shape[:at], prod(sizes), *x.shape[at + len(dims) :]))
        return x, at, flat

    def _strided(self, steps: list[int]) -> Self:
        """Every steps[d]-th element of each dim: pad to a multiple of the step, split (n, step), keep column 0."""
        if all(s == 1 for s in steps):
            return self
        counts = [-(-size // st) for size, st in zip(self.shape, steps, strict=True)]
        x = self.pad(tuple((0, n * st - size) for n, st, size in zip(counts, steps, self.shape, strict=True)))
        split = [v for n, st in zip(counts, steps, strict=True) for v in ((n, st) if st > 1 else (n,))]
        keep = [b for n, st in zip(counts, steps, strict=True) for b in (((0, n), (0, 1)) if st > 1 else ((0, n),))]
        return x.reshape(split).shrink(keep).reshape(counts)

    def _take(self, dim: int, idx: Self, label: str = "index") -> Self:
        """self indexed along `dim` by an int tensor, as NumPy's take: shape x.shape[:dim] + idx.shape + rest.

        A data-dependent read: each index is checked when the kernel runs (negative ones count from the end), and
        one outside -n..n-1 raises IndexError naming `label`, the value and the valid range. Work is O(result).
        """
        if not idx.dtype.is_int:
            raise IndexError(
                f"tensors used as indices must be int tensors, got {idx.dtype!r} "
                "(boolean masks are not supported: their result shape depends on the data)"
            )
        n, k, rest = self.shape[dim], idx.ndim, self.shape[dim + 1 :]
        if n == 0 and idx.numel():
            raise IndexError(f"cannot index dimension {dim} of size 0 (shape {self.shape})")
        if k == 0:
            return self._take(dim, idx.reshape(1), label).squeeze(dim)
        # GATHER needs index and source of one rank: the source gets idx's leading dims as broadcast axes
        full = self.shape[:dim] + idx.shape + rest
        src = self.reshape(self.shape[:dim] + (1,) * (k - 1) + (n,) + rest).expand(full[: dim + k - 1] + (n,) + rest)
        index = idx.reshape((1,) * dim + idx.shape + (1,) * len(rest)).expand(full)
        return src._new(src.uop.gather(index.uop, dim + k - 1, label, wrap=True), index)  # (index: its bound values)

    def gather(self, dim: int, index: Any) -> Self:
        """out[i][j][k] = self[i][index[i][j][k]][k] for dim=1 (PyTorch's gather): the result has index's shape.

        index is an int tensor of self's rank, no larger than self off `dim`; a value outside 0..size-1 raises
        IndexError when the result is computed."""
        return self._gather(dim, index, "gather")

    def _gather(self, dim: int, index: Any, label: str) -> Self:
        index = index if isinstance(index, MovementMixin) else type(self)(index)
        return self._new(self.uop.gather(index.uop, norm_dim(dim, self.ndim), label), index)

    def scatter_add(self, dim: int, index: Any, src: Any) -> Self:
        """self with src[i][j] added at [i][index[i][j]] for dim=1 (PyTorch's scatter_add); repeats accumulate."""
        index = index if isinstance(index, MovementMixin) else type(self)(index)
        src = src if isinstance(src, MovementMixin) else type(self)(src, dtype=self.dtype)
        d = norm_dim(dim, self.ndim)
        return self._new(self.uop.scatter_add(index.uop, src.uop, d, "scatter_add"), src)

    def _scatter(self, dim: int, index: Any, src: Any, rop: Ops, label: str) -> Self:
        index = index if isinstance(index, MovementMixin) else type(self)(index)
        src = src if isinstance(src, MovementMixin) else type(self)(src, dtype=self.dtype)
        return self._new(self.uop.scatter_reduce(index.uop, src.uop, norm_dim(dim, self.ndim), rop, label), src)

    def _written(self, dim: int, index: Any, label: str = "scatter") -> Self:
        """Which elements of self some index entry targets (bool, self's shape)."""
        index = index if isinstance(index, MovementMixin) else type(self)(index)
        ones = index.full_like(1, dtype=dtypes.int32)
        return self.full_like(0, dtype=dtypes.int32)._scatter(dim, index, ones, Ops.ADD, label) > 0

    def scatter(self, dim: int, index: Any, src: Any, reduce: str | None = None) -> Self:
        """PyTorch's scatter: self with src[i][j] written at [index[i][j]][j] for dim=0 (src may be a number).

        Where an index repeats, the last source element in row-major order wins (PyTorch leaves the choice open).
        reduce="add" / "multiply" combine instead, as scatter_reduce's "sum" / "prod" with include_self."""
        if reduce is not None:
            modes = {"add": "sum", "multiply": "prod"}
            if reduce not in modes:
                raise ValueError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")
            return self.scatter_reduce(dim, index, src, modes[reduce])
        index = index if isinstance(index, MovementMixin) else type(self)(index)
        if not isinstance(src, MovementMixin):
            src = index.full_like(src, dtype=self.dtype)
        pdt = dtypes.int64 if index.numel() >= 2**31 else dtypes.int32
        pos = type(self).arange(index.numel(), dtype=pdt).reshape(index.shape)
        # the position of the last element writing each target (-1: none), then only that element is added in
        last = self.full_like(-1, dtype=pdt)._scatter(dim, index, pos, Ops.MAX, "scatter")
        winner = pos == last._gather(dim, index, "scatter")
        vals = self.zeros_like()._scatter(dim, index, winner.where(src, 0).cast(self.dtype), Ops.ADD, "scatter")
        return (last >= 0).where(vals, self)

    def scatter_reduce(self, dim: int, index: Any, src: Any, reduce: str, include_self: bool = True) -> Self:
        """PyTorch's scatter_reduce: combine src into self at the index's positions along `dim` with "sum", "prod",
        "mean", "amax" or "amin"; include_self=False leaves self's old value out wherever something is written.
        Gradients as PyTorch's for sum, mean, amax and amin (shared among ties); none for prod."""
        if reduce not in ("sum", "prod", "mean", "amax", "amin"):
            raise ValueError(f"scatter_reduce: reduce must be sum, prod, mean, amax or amin, got {reduce!r}")
        index = index if isinstance(index, MovementMixin) else type(self)(index)
        src = src if isinstance(src, MovementMixin) else type(self)(src, dtype=self.dtype)
        label = f"scatter_reduce {reduce}"
        written = self._written(dim, index, label)
        if reduce in ("sum", "mean"):
            base = self if include_self else written.where(0, self)
            total = base._scatter(dim, index, src, Ops.ADD, label)
            if reduce == "sum":
                return total
            ones = index.full_like(1, dtype=self.dtype)
            count = self.full_like(int(include_self))._scatter(dim, index, ones, Ops.ADD, label)
            count = written.where(count, 1)  # nothing written (count 0 without self): no 0/0 on the gradient path
            mean = total / count if self.dtype.is_float else total // count
            return written.where(mean, self)
        if reduce == "prod":
            base = self if include_self else written.where(1, self)
            return base._scatter(dim, index, src, Ops.MUL, label)
        # amin is amax of an order-reversed copy: -x for floats, ~x for integers (exact, no overflow)
        flip = (lambda t: -t) if self.dtype.is_float or self.dtype is dtypes.bool else (lambda t: ~t)
        low = (
            -math.inf if self.dtype.is_float else (False if self.dtype is dtypes.bool else np.iinfo(self.dtype.np).min)
        )
        a, b = (self, src) if reduce == "amax" else (flip(self), flip(src))
        base = a if include_self else written.where(low, a)
        out = base._scatter(dim, index, b, Ops.MAX, label)
        return out if reduce == "amax" else flip(out)

    # ---------------------------------------------------------------- joining (Tensor.cat(a, b) or a.cat(b))

    def cat(*tensors: Any, dim: int = 0) -> Self:
        """Concatenate along `dim`: Tensor.cat(a, b), Tensor.cat([a, b], 1), a.cat(b, dim=1). One fused kernel.

        Each piece is padded to the full size at its offset and the pieces are added."""
        ts, dim = _tensor_args(tensors, dim)
        if not ts:
            raise ValueError("cat expects a non-empty list of tensors")
        for i, t in enumerate(ts):
            if t.ndim == 0:
                raise ValueError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")
        ref = ts[0]
        d = norm_dim(dim, ref.ndim)
        for i, t in enumerate(ts):
            if t.ndim != ref.ndim or any(
                a != b for j, (a, b) in enumerate(zip(ref.shape, t.shape, strict=True)) if j != d
            ):
                raise ValueError(
                    f"cat: shapes {ref.shape} and {t.shape} (tensor {i}) must match except in dimension {d}"
                )
        dt = ref.dtype
        for t in ts[1:]:
            dt = promote(dt, t.dtype)
        total = sum(t.shape[d] for t in ts)
        out, off = None, 0
        for t in ts:
            n = t.shape[d]
            if n:
                pads = tuple((off, total - off - n) if j == d else (0, 0) for j in range(t.ndim))
                piece = t.cast(dt).pad(pads)
                out = piece if out is None else out + piece
            off += n
        return out if out is not None else ref.cast(dt).reshape(ref.shape[:d] + (0,) + ref.shape[d + 1 :])

    def stack(*tensors: Any, dim: int = 0) -> Self:
        """Stack equal-shaped tensors along a new dim: Tensor.stack([a, b], 1), Tensor.stack(a, b, dim=1)."""
        ts, dim = _tensor_args(tensors, dim)
        if not ts:
            raise ValueError("stack expects a non-empty list of tensors")
        for i, t in enumerate(ts):
            if t.shape != ts[0].shape:
                raise ValueError(
                    f"stack expects each tensor to be equal size, but got {ts[0].shape} at entry 0 "
                    f"and {t.shape} at entry {i}"
                )
        d = norm_dim(dim, ts[0].ndim + 1)
        return MovementMixin.cat([t.unsqueeze(d) for t in ts], dim=d)


def _tensor_args(args: Sequence, dim: int) -> tuple[list[MovementMixin], int]:
    """The tensors and dim of Tensor.cat(a, b) / Tensor.cat([a, b], 1) / a.cat([b, c], dim=1) (also for stack)."""
    args = list(args)
    if len(args) >= 2 and is_int(args[-1]):  # a trailing positional int is the dim, as in torch.cat(ts, 1)
        dim = args.pop()
    out: list[MovementMixin] = []
    for a in args:
        for t in a if isinstance(a, (list, tuple)) else [a]:
            if not isinstance(t, MovementMixin):
                raise TypeError(f"expected Tensors, got {type(t).__name__}")
            out.append(t)
    return out, dim

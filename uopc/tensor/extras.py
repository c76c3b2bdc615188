"""The rest of the Tensor API users reach for: einsum, roll, diag, unfold, meshgrid, repeat_interleave, linspace,
padding modes, item assignment, and the losses on probabilities (nll_loss, binary cross-entropies).

All of them are movement ops, ALU ops and reductions on the shape graph. Item assignment is lazy: `x[1:3] = v`
assigns x the SETITEM of its region (x with those elements replaced by v); nothing runs until x is used, and then
a copy of x and a kernel writing the region alone (under TinyJit, in place: the copy is skipped).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

from uopc.tensor.elementwise import opmath
from uopc.tensor.shape import Axis, basic_index, is_int, norm_dim
from uopc.uop import Span
from uopc.uop.dtype import dtypes, to_dtype
from uopc.uop.variable import Variable, merge_vars

_REDUCTIONS = ("mean", "sum", "none")


def _reduce_loss(loss: Any, reduction: str) -> Any:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def _log_clamped(p: Any) -> Any:
    """max(log(p), -100) whose gradient is 0, not 0 * inf = NaN, where p = 0: the log only sees p > 0."""
    pos = p > 0
    return pos.where(pos.where(p, 1.0).log().maximum(-100.0), -100.0)


def _einsum_letters(term: str) -> bool:
    return all(c.isascii() and c.isalpha() for c in term)


def _einsum_term(term: str, t: Any, ell: str, formula: str) -> str:
    """One operand's letters with its "..." spelled out as the last dims of `ell` (checked against its rank)."""
    if term.count("...") > 1 or not _einsum_letters(term.replace("...", "")):
        raise ValueError(f"einsum: term {term!r} of {formula!r} must be letters with at most one '...'")
    if "..." in term:
        n = t.ndim - (len(term) - 3)
        if n < 0:
            raise ValueError(f"einsum: term {term!r} has more letters than its operand has dims (shape {t.shape})")
        term = term.replace("...", ell[len(ell) - n :] if n else "")
    if len(term) != t.ndim:
        raise ValueError(f"einsum: term {term!r} has {len(term)} letters but its operand has shape {t.shape}")
    return term


def _einsum_diagonals(t: Any, term: str, formula: str) -> tuple[Any, str]:
    """A letter repeated in one operand ("ii") takes the diagonal of those dims, which moves last."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        i, j = term.index(c), term.index(c, term.index(c) + 1)
        if t.shape[i] != t.shape[j]:
            raise ValueError(
                f"einsum {formula!r}: letter {c!r} repeats in {term!r} over dims of sizes {t.shape[i]} and {t.shape[j]}"
            )
        t = t.diagonal(0, i, j)
        term = "".join(x for k, x in enumerate(term) if k not in (i, j)) + c
    return t, term


class ExtrasMixin:
    """Composite ops of Tensor that are neither pure movement nor elementwise math."""

    # ---------------------------------------------------------------- copies and shapes

    def clone(self) -> Self:
        """A copy in a new buffer (a materialization point); gradients flow through it."""
        return self.contiguous()

    def pad_to(self, *shape: Any) -> Self:
        """Zero-pad at the end of each dim up to `shape` (None keeps a dim)."""
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return self.pad(tuple((0, 0 if s is None else s - d) for s, d in zip(shape, self.shape, strict=True)))

    def shrink_to(self, *shape: Any) -> Self:
        """Keep the first `shape` entries of each dim (None keeps a dim)."""
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return self.shrink(tuple(None if s is None else (0, s) for s in shape))

    def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Self:
        """Rotate elements along `dims` by `shifts` (flattened first if dims is None), as PyTorch."""
        if dims is None:
            return self.flatten().roll(shifts, 0).reshape(self.shape)
        shifts = [shifts] if is_int(shifts) else list(shifts)
        dims = [dims] if is_int(dims) else list(dims)
        if len(shifts) != len(dims):
            raise ValueError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
        x = self
        for s, d in zip(shifts, dims, strict=True):
            d = norm_dim(d, x.ndim)
            n = x.shape[d]
            s = int(s) % n if n else 0
            if s:
                head = x.shrink(tuple((n - s, n) if i == d else None for i in range(x.ndim)))
                tail = x.shrink(tuple((0, n - s) if i == d else None for i in range(x.ndim)))
                x = head.cat(tail, dim=d)
        return x

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Self:
        """The diagonal of dims dim1 and dim2 (above it for offset > 0, below for < 0) as a new last dim, as PyTorch:
        both dims move last, are cut to the m x m block the diagonal crosses, and (m, m) is flattened, padded by m
        and viewed (m, m + 1), whose column 0 is the diagonal."""
        if self.ndim < 2:
            raise ValueError(f"diagonal needs at least 2 dims, got shape {self.shape}")
        if not is_int(offset):
            raise TypeError(f"diagonal: offset must be an int, got {offset!r}")
        d1, d2 = norm_dim(dim1, self.ndim), norm_dim(dim2, self.ndim)
        if d1 == d2:
            raise ValueError(f"diagonal: dim1 and dim2 must differ, both are {d1}")
        rest = [i for i in range(self.ndim) if i not in (d1, d2)]
        x = self.permute(*rest, d1, d2)
        lead = x.shape[:-2]
        n1, n2 = x.shape[-2:]
        r0, c0 = max(0, -offset), max(0, offset)
        m = max(0, min(n1 - r0, n2 - c0))
        keep = tuple((0, s) for s in lead)
        x = x.shrink(keep + ((min(r0, n1), min(r0, n1) + m), (min(c0, n2), min(c0, n2) + m)))
        if m == 0:
            return x.reshape(*lead, 0)
        x = x.reshape(*lead, m * m).pad(((0, 0),) * len(lead) + ((0, m),)).reshape(*lead, m, m + 1)
        return x.shrink(keep + ((0, m), (0, 1))).reshape(*lead, m)

    def diag(self, diagonal: int = 0) -> Self:
        """A 1-D tensor becomes a matrix with it on the `diagonal`-th diagonal; a matrix gives that diagonal."""
        if self.ndim == 1:
            n, k = self.shape[0], int(diagonal)
            out = self.eye(n, dtype=dtypes.bool).where(self.reshape(1, n), 0).cast(self.dtype)
            return out.pad(((0, k), (k, 0)) if k >= 0 else ((-k, 0), (0, -k)))
        if self.ndim == 2:
            return self.diagonal(diagonal)
        raise ValueError(f"diag needs a 1-D or 2-D tensor, got shape {self.shape}")

    def unfold(self, dim: int, size: int, step: int) -> Self:
        """Windows of `size` every `step` along `dim`, as a new last dim (PyTorch's Tensor.unfold)."""
        d = norm_dim(dim, self.ndim)
        n = self.shape[d] if self.ndim else 1
        if size < 0 or size > n or step <= 0:
            raise ValueError(f"unfold: size {size} and step {step} do not fit dim {dim} of size {n}")
        count = (n - size) // step + 1
        # tile the axis count times (count * n), pad rows to n + step and view (count, n + step): row r starts at
        # r * (n + step) = r * n + r * step, which is element r * step of tile r; keep the first `size` of each row
        x = self.transpose(d, -1) if d != self.ndim - 1 else self
        lead = x.shape[:-1]
        tiled = x.unsqueeze(-2).expand(*lead, count, n).reshape(*lead, count * n)
        rows = tiled.pad(((0, 0),) * len(lead) + ((0, count * step),)).reshape(*lead, count, n + step)
        win = rows.shrink(tuple((0, s) for s in lead) + ((0, count), (0, size)))
        return win.transpose(d, -2) if d != self.ndim - 1 else win

    def repeat_interleave(self, repeats: int, dim: int | None = None) -> Self:
        """Each element repeated `repeats` times along `dim` (flattened if None)."""
        if not is_int(repeats) or repeats < 0:
            raise ValueError(f"repeat_interleave needs a non-negative int of repeats, got {repeats!r}")
        x = self.flatten() if dim is None else self
        d = 0 if dim is None else norm_dim(dim, x.ndim)
        shape = x.shape[: d + 1] + (repeats,) + x.shape[d + 1 :]
        return x.unsqueeze(d + 1).expand(shape).flatten(d, d + 1)

    def meshgrid(*tensors: Any, indexing: str = "ij") -> tuple[Any, ...]:
        """Coordinate grids from 1-D tensors ("ij": matrix indexing, "xy": Cartesian): Tensor.meshgrid(a, b),
        Tensor.meshgrid([a, b]) as torch, or a.meshgrid(b) as tinygrad (not a staticmethod, so self is a grid)."""
        ts = [t for x in tensors for t in (x if isinstance(x, (list, tuple)) else (x,))]
        if not ts or not all(isinstance(t, ExtrasMixin) for t in ts):
            raise TypeError(f"meshgrid expects Tensors, got {[type(t).__name__ for t in ts]}")
        if indexing not in ("ij", "xy"):
            raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
        xy = indexing == "xy" and len(ts) >= 2
        if xy:  # Cartesian: the ij grids of (b, a, ...), with the first two outputs swapped back
            ts[0], ts[1] = ts[1], ts[0]
        shape = tuple(t.numel() for t in ts)
        out = [t.reshape((1,) * i + (-1,) + (1,) * (len(ts) - i - 1)).expand(shape) for i, t in enumerate(ts)]
        if xy:
            out[0], out[1] = out[1], out[0]
        return tuple(out)

    @classmethod
    def linspace(cls, start: float, stop: float, steps: int, dtype: Any = None) -> Self:
        """`steps` evenly spaced values from start to stop inclusive (the second half counted back from stop)."""
        if steps < 0:
            raise ValueError(f"linspace: steps must be >= 0, got {steps}")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if steps <= 1:
            return cls.full((steps,), start, dtype=dt)
        i = cls.arange(steps).cast(dtypes.float64)
        step = (stop - start) / (steps - 1)
        out = (i < steps // 2).where(i * step + start, stop - (steps - 1 - i) * step)
        return out.cast(dt)

    def var_mean(self, axis: Axis = None, keepdim: bool = False, correction: int = 1) -> tuple[Self, Self]:
        """(var, mean) over `axis`, as torch.var_mean."""
        return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

    def std_mean(self, axis: Axis = None, keepdim: bool = False, correction: int = 1) -> tuple[Self, Self]:
        """(std, mean) over `axis`, as torch.std_mean."""
        return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

    # ---------------------------------------------------------------- data-dependent sizes (these realize)

    def _compact(self, mask: Any, values: Any) -> Any:
        """values[mask] in flat order: count the Trues (realizes), then scatter-add each kept value to its rank
        (cumsum of the mask); dropped values go to one extra slot that is cut off."""
        m = mask.reshape(-1)
        n = int(m.sum().item())
        rank = m.cumsum(0) - 1
        dest = m.where(rank, n).cast(dtypes.int32)
        vals = values.reshape(-1, *values.shape[mask.ndim :])
        dest = dest.reshape(-1, *(1,) * (vals.ndim - 1))._broadcast_to(vals.shape, keep_const=False)
        out = type(self).zeros(n + 1, *vals.shape[1:], dtype=vals.dtype)
        return out.scatter_add(0, dest, vals).shrink(((0, n),) + tuple((0, s) for s in vals.shape[1:]))

    def masked_select(self, mask: Any) -> Self:
        """The elements where `mask` (broadcast to self's shape) is True, as a 1-D tensor. Its length depends on the
        data, so this realizes the mask's count first."""
        mask = mask if isinstance(mask, ExtrasMixin) else type(self)(mask)
        if not mask.dtype.is_bool:
            raise TypeError(f"masked_select needs a bool mask, got {mask.dtype!r}")
        mask = mask._broadcast_to(self.shape, keep_const=False)
        return self._compact(mask, self)

    def nonzero(self, as_tuple: bool = False) -> Self | tuple[Self, ...]:
        """The indices (n, ndim) of the nonzero elements in row-major order (int32), or with as_tuple one 1-D index
        tensor per dim; realizes the count first."""
        if as_tuple:
            if self.ndim == 0:
                return (self.reshape(1).nonzero()[:, 0],)
            idx = self.nonzero()
            return tuple(idx[:, d] for d in range(self.ndim))
        if self.ndim == 0:
            return self.reshape(1).nonzero()[:, :0]
        mask = self != 0 if not self.dtype.is_bool else self
        grids = [self.arange(s).reshape((1,) * i + (s,) + (1,) * (self.ndim - i - 1)) for i, s in enumerate(self.shape)]
        coords = type(self).stack([g._broadcast_to(self.shape, keep_const=False) for g in grids], dim=-1)
        return self._compact(mask, coords)

    # ---------------------------------------------------------------- einsum

    @staticmethod
    @opmath
    def einsum(formula: str, *operands: Any) -> Any:
        """Einstein summation as PyTorch's ("ij,jk->ik", "ii->i", "...ij->...ji"): a letter repeated in one operand
        takes that diagonal; every operand is then permuted and broadcast to all the letters, and the product is
        summed over the letters missing from the output (without "->": the letters used once, sorted)."""
        ops = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
        lhs, arrow, rhs = formula.replace(" ", "").partition("->")
        ins = lhs.split(",")
        if len(ins) != len(ops):
            raise ValueError(f"einsum: {formula!r} names {len(ins)} operands but {len(ops)} were given")
        n_ell = max((t.ndim - len(term.replace("...", "")) for term, t in zip(ins, ops) if "..." in term), default=0)
        ell = "".join(chr(0x3B1 + i) for i in range(n_ell))  # the ellipsis dims as letters no formula uses
        terms = [_einsum_term(term, t, ell, formula) for term, t in zip(ins, ops, strict=True)]
        if not arrow:
            used = "".join(terms)
            rhs = ell + "".join(sorted(c for c in set(used) if used.count(c) == 1 and c not in ell))
        elif "..." in rhs:
            rhs = rhs.replace("...", ell, 1)
        letters = sorted(set("".join(terms)))
        if not set(rhs) <= set(letters) or len(set(rhs)) != len(rhs):
            raise ValueError(f"einsum: output {rhs!r} must use distinct letters from the inputs ({formula!r})")
        sizes: dict[str, int] = {}
        where: dict[str, str] = {}
        tensors = []
        for k, (term, t) in enumerate(zip(terms, ops, strict=True)):
            t, term = _einsum_diagonals(t, term, formula)
            tensors.append((term, t))
            for c, s in zip(term, t.shape, strict=True):
                if c in sizes and s != sizes[c] and 1 not in (s, sizes[c]):
                    name = "an ellipsis dim" if c in ell else f"letter {c!r}"
                    raise ValueError(
                        f"einsum {formula!r}: {name} has size {sizes[c]} in {where[c]} but {s} in operand {k} "
                        f"(shape {ops[k].shape})"
                    )
                if s != 1 or c not in sizes:
                    sizes[c], where[c] = s, f"operand {k} (shape {ops[k].shape})"
        order = list(rhs) + [c for c in letters if c not in rhs]
        full = tuple(sizes[c] for c in order)
        prod_t = None
        for term, t in tensors:
            perm = sorted(range(len(term)), key=lambda i: order.index(term[i]))
            tp = t.permute(*perm) if t.ndim else t
            tp = tp.reshape(tuple(t.shape[term.index(c)] if c in term else 1 for c in order)).expand(full)
            prod_t = tp if prod_t is None else prod_t * tp
        n_sum = len(order) - len(rhs)
        return prod_t.sum(tuple(range(len(rhs), len(order)))) if n_sum else prod_t

    # ---------------------------------------------------------------- losses on probabilities

    @opmath
    def nll_loss(self, target: Any, weight: Any = None, ignore_index: int = -100, reduction: str = "mean") -> Self:
        """PyTorch's nll_loss on log-probabilities with the class dim 1 (or 0 for a 1-D input)."""
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        target = target if isinstance(target, ExtrasMixin) else type(self)(target)
        if not target.dtype.is_int:
            raise TypeError(f"nll_loss: targets must be class indices (an int tensor), got {target.dtype!r}")
        cdim = 1 if self.ndim > 1 else 0
        n_cls = self.shape[cdim]
        cls = self.arange(n_cls).reshape((n_cls,) + (1,) * (self.ndim - cdim - 1))
        hit = cls == target.unsqueeze(cdim)
        w = hit.where(1.0 if weight is None else weight.reshape((n_cls,) + (1,) * (self.ndim - cdim - 1)), 0.0)
        keep = target != ignore_index
        wt = keep.where(w.sum(cdim), 0.0)
        loss = keep.where(-(hit.where(self, 0) * w).sum(cdim), 0.0)
        if reduction == "none":
            return loss
        return loss.sum() if reduction == "sum" else loss.sum() / wt.sum()

    @opmath
    def binary_crossentropy(self, Y: Any, reduction: str = "mean") -> Self:
        """-(y log p + (1 - y) log(1 - p)) on probabilities, each log clamped at -100 as PyTorch."""
        p = self._to_float()
        loss = -(Y * _log_clamped(p) + (1 - Y) * _log_clamped(1 - p))
        return _reduce_loss(loss, reduction)

    @opmath
    def binary_crossentropy_logits(self, Y: Any, reduction: str = "mean", pos_weight: Any = None) -> Self:
        """BCE on logits without overflow: (1 - y) x + (1 + (w - 1) y) softplus(-x)."""
        x = self._to_float()
        sp = -x.logsigmoid()  # softplus(-x), stable on both sides
        loss = (1 - Y) * x + (sp if pos_weight is None else (1 + (pos_weight - 1) * Y) * sp)
        return _reduce_loss(loss, reduction)

    binary_cross_entropy_with_logits = binary_crossentropy_logits

    # ---------------------------------------------------------------- padding modes and item assignment

    def _pad_mode(self, pairs: list[tuple[int, int]], mode: str) -> Self:
        """reflect / replicate / circular padding, one dim at a time from pieces of the tensor itself."""
        x = self
        for d, (lo, hi) in enumerate(pairs):
            n = x.shape[d]
            if (lo or hi) and mode == "reflect" and max(lo, hi) >= n:
                raise ValueError(f"reflect padding {max(lo, hi)} must be smaller than dim {d} of size {n}")
            if (lo or hi) and mode == "circular" and max(lo, hi) > n:
                raise ValueError(f"circular padding {max(lo, hi)} must be at most dim {d} of size {n}")

            def cut(a: int, b: int, x=x, d=d) -> Self:
                return x.shrink(tuple((a, b) if i == d else None for i in range(x.ndim)))

            parts = []
            if lo:
                parts.append(
                    cut(1, lo + 1).flip(d)
                    if mode == "reflect"
                    else cut(n - lo, n)
                    if mode == "circular"
                    else cut(0, 1).expand(*(lo if i == d else s for i, s in enumerate(x.shape)))
                )
            parts.append(x)
            if hi:
                parts.append(
                    cut(n - hi - 1, n - 1).flip(d)
                    if mode == "reflect"
                    else cut(0, hi)
                    if mode == "circular"
                    else cut(n - 1, n).expand(*(hi if i == d else s for i, s in enumerate(x.shape)))
                )
            x = x.cat(*parts[1:], dim=d) if parts[0] is x else parts[0].cat(*parts[1:], dim=d)
        return x

    def __setitem__(self, index: Any, value: Any) -> None:
        """x[index] = value for basic indices (ints, slices with any step, ..., None): lazy, through assign. Only the
        indexed elements are written (a SETITEM: a copy of x, then a kernel over the region alone; TinyJit replays
        write in place). On a view made by basic indexing, x[0][1:3] = v writes x's elements, as in PyTorch."""
        region = basic_index(self.shape, index)
        v = value if isinstance(value, ExtrasMixin) else type(self)(value, dtype=self.dtype)
        shape = region.shape
        while v.ndim > len(shape) and v.shape[0] == 1:  # NumPy drops leading size-1 dims of the value
            v = v.reshape(v.shape[1:])
        if v.ndim > len(shape) or any(a not in (b, 1) for a, b in zip(reversed(v.shape), reversed(shape))):
            raise ValueError(f"item assignment: a value of shape {v.shape} cannot be broadcast to the indexed {shape}")
        v = v.cast(self.dtype)._broadcast_to(shape, keep_const=False)
        self._write_region(region.spans, v.reshape(tuple(sp.count for sp in region.spans)))

    def _viewed(self) -> Any:
        """The tensor this one is a basic-indexing view of (x for x[1:3]), if it is still alive; else None."""
        view = self._view_of
        return view.src() if view is not None else None

    def _write_region(self, spans: tuple[Span, ...], v: Any) -> None:
        """Write v (shape: the spans' counts) into the region of self; a view writes into the tensor it views (its
        region composed with the view's), then shows the new values."""
        if any(sp.count == 0 for sp in spans):
            return
        if any(type(sp.count) is Variable for sp in spans):
            raise ValueError(
                f"a write into a region of symbolic size {tuple(sp.count for sp in spans)} is not supported: "
                "select the new values over the whole tensor (where) instead"
            )
        src = self._viewed()
        if src is None:
            self._view_of = None
            self._rebind(type(self)(self.uop.setitem(v.uop, spans))._bound(merge_vars(self._vars, v._vars)))
            return
        index = self._view_of.index
        outer = basic_index(src.shape, index)
        new = list(outer.spans)  # a dim the view indexed with an int keeps its single element
        for j, d in enumerate(outer.dims):  # view dim j walks src dim d (None: a dim the view added)
            if d is not None:
                a, b = outer.spans[d], spans[j]
                new[d] = Span(a.start + a.step * b.start, a.step * b.step, b.count)
        src._write_region(tuple(new), v.reshape(tuple(sp.count for sp in new)))
        self.uop, self._graph = src[index].uop, None

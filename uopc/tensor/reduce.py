"""Reductions for Tensor (sum, max, mean, var, argmax, ...), the softmax family, and matmul.

Every reduction permutes the reduced axes last and REDUCEs the last n with ADD or MAX; the rest are built on those:

    x.mean(1)    ->  permute (0, 2, 1) -> REDUCE(ADD, 1) -> * (1/n)
    a @ b        ->  a (n, 1, k) * b.T (1, m, k), broadcast to (n, m, k) -> REDUCE(ADD, 1)
"""

from __future__ import annotations

import math
from typing import Any, Self

from uopc.helpers import prod
from uopc.tensor.creation import full_uop
from uopc.tensor.elementwise import broadcast_uop, opmath
from uopc.tensor.shape import Axis, broadcast_shape, norm_axes, norm_dim, reduced_shape
from uopc.uop import Ops, UOp, identity_element
from uopc.uop.dtype import dtypes, promote, to_dtype
from uopc.uop.variable import Variable, symbolic


class ReduceMixin:
    """The reductions and matmul of Tensor; every Tensor is a ReduceMixin (so isinstance tells a tensor operand)."""

    # ---------------------------------------------------------------- reductions

    def _reduce(self, op: Ops, axis: Axis, keepdim: bool) -> Self:
        """Reduce `axis` with ADD or MAX: permute the reduced axes last, then REDUCE the last n."""
        axes = norm_axes(axis, self.shape)
        kept = tuple(i for i in range(self.ndim) if i not in axes)
        out_shape = reduced_shape(self.shape, axes, keepdim)
        if not axes:
            return self
        if prod(self.shape[i] for i in axes) == 0 or prod(out_shape) == 0:
            if op is Ops.MAX and prod(out_shape) > 0:
                raise RuntimeError(
                    f"max/min/argmax over axis {axis} of shape {self.shape}: "
                    "the reduced dims have size 0 and max has no identity"
                )
            return self._new(full_uop(identity_element(op, self.dtype), self.dtype, out_shape))
        if axis is None and not symbolic(self.shape):  # everything: flatten to one axis first
            return self._new(self.reshape(-1).uop.reduce(op, 1)).reshape(out_shape)
        x = self.permute(*kept, *axes)
        return x._new(x.uop.reduce(op, len(axes))).reshape(out_shape)

    def sum(self, axis: Axis = None, keepdim: bool = False, dtype: Any = None) -> Self:
        """Sum over `axis` (all if None); bool and small ints give int32 (PyTorch: int64), float16 and bfloat16
        accumulate in float32 (UOp.reduce) and round once. `dtype` casts the input first and sums in that dtype."""
        if dtype is not None:
            return (
                self.cast(dtype)._reduce(Ops.ADD, axis, keepdim)
                if not to_dtype(dtype).is_bool
                else self.cast(dtype).max(axis, keepdim)
            )
        if self.dtype.is_bool or (self.dtype.is_int and self.dtype.itemsize < 4):
            return self.cast(dtypes.default_int)._reduce(Ops.ADD, axis, keepdim)
        return self._reduce(Ops.ADD, axis, keepdim)

    def max(self, axis: Axis = None, keepdim: bool = False) -> Self:
        """The largest values over `axis` (values only; NaN-propagating)."""
        return self._reduce(Ops.MAX, axis, keepdim)

    def _order_flip(self) -> Self:
        """An order-reversing involution: -x for floats, ~x for ints and bools (which cannot overflow at INT_MIN)."""
        return -self if self.dtype.is_float else ~self

    def min(self, axis: Axis = None, keepdim: bool = False) -> Self:
        """The smallest values over `axis`: -max(-x) for floats."""
        return self._order_flip().max(axis, keepdim)._order_flip()

    def _count(self, axis: Axis) -> int:
        return prod(self.shape[i] for i in norm_axes(axis, self.shape))

    def _inverse_count(self, axis: Axis, correction: int, empty: float) -> Any:
        """1 / (the number of elements over `axis` - correction), `empty` where that is <= 0: a Python float, or a
        0-d float32 tensor when a symbolic dim (uopc.uop.variable) makes it a value of the call."""
        dims = [self.shape[i] for i in norm_axes(axis, self.shape)]
        if not symbolic(dims):
            d = max(0, prod(dims) - correction)
            return 1 / d if d else empty
        n = UOp.const(prod(s for s in dims if type(s) is not Variable), dtypes.int32)
        for s in dims:
            if type(s) is Variable:  # its value in the call (what Tensor(v.bind(n)) holds)
                n = n * UOp(Ops.DEFINE_VAR, (), s, dtypes.int32)
        d = (n - correction).cast(dtypes.float32)
        return type(self)((d < 0.5).where(UOp.const(empty, dtypes.float32), d.alu(Ops.RECIP)))

    @opmath
    def mean(self, axis: Axis = None, keepdim: bool = False) -> Self:
        """sum * (1/n); ints give float32, an empty reduction NaN."""
        return self._to_float().sum(axis, keepdim) * self._inverse_count(axis, 0, math.nan)

    @opmath
    def var(self, axis: Axis = None, keepdim: bool = False, correction: int = 1) -> Self:
        """Variance with PyTorch's `correction` (1: unbiased): sum((x - mean)^2) / (n - correction)."""
        x = self._to_float()
        return (x - x.mean(axis, keepdim=True)).square().sum(axis, keepdim) * self._inverse_count(
            axis, correction, math.inf
        )

    @opmath
    def std(self, axis: Axis = None, keepdim: bool = False, correction: int = 1) -> Self:
        """sqrt(var); where var is 0 the gradient is 0 (as PyTorch), not sqrt's 1 / 0 times a zero deviation."""
        v = self.var(axis, keepdim, correction)
        zero = v == 0
        return zero.where(0, zero.where(1, v).sqrt())

    def argmax(self, axis: int | None = None, keepdim: bool = False) -> Self:
        """Index (int32) of the first largest value over `axis` (flattened if None); a NaN counts as the largest."""
        if axis is None:
            out = self.reshape(-1).argmax(0) if self.ndim else self.full_like(0, dtypes.int32)
            return out.reshape((1,) * self.ndim) if keepdim else out
        ax = norm_dim(axis, self.ndim)
        if not self.ndim:
            return self.full_like(0, dtypes.int32)
        n = self.shape[ax]
        hit = self == self.max(ax, keepdim=True)
        if self.dtype.is_float:  # max propagates NaN, and NaN == NaN is False: match the NaNs themselves
            hit = hit | (self != self)
        # weight n for index 0 down to 1 for the last: the largest weight among hits is the first hit
        rev = self.arange(n, 0, -1).reshape((n,) + (1,) * (self.ndim - ax - 1))
        return n - hit.where(rev, 0).max(ax, keepdim)

    def argmin(self, axis: int | None = None, keepdim: bool = False) -> Self:
        """Index of the first smallest value over `axis`."""
        return self._order_flip().argmax(axis, keepdim)

    @opmath
    def softmax(self, axis: int = -1) -> Self:
        """exp(x - max) / sum(exp(x - max)): three kernels (max, sum, elementwise). The shift is detached: its
        gradient is 0 in exact arithmetic, and differentiating a max of recomputed values is fragile (see autodiff)."""
        x = self._to_float()
        e = (x - x.max(axis, keepdim=True).detach()).exp()
        return e / e.sum(axis, keepdim=True)

    @opmath
    def log_softmax(self, axis: int = -1) -> Self:
        """x - max - log(sum(exp(x - max))): no overflow for large x."""
        x = self._to_float()
        s = x - x.max(axis, keepdim=True).detach()  # a constant shift, as in softmax
        return s - s.exp().sum(axis, keepdim=True).log()

    @opmath
    def logsumexp(self, axis: Axis = None, keepdim: bool = False) -> Self:
        """log(sum(exp(x))) over `axis`, shifted by the max so it does not overflow."""
        x = self._to_float()
        m = x.max(axis, keepdim=True).detach()  # a constant shift: the gradient is softmax(x) without it
        m = (m.abs() == math.inf).where(0, m)  # an all -inf (or +inf) row: inf - inf would be NaN, shift by 0 instead
        out = (x - m).exp().sum(axis, keepdim=True).log() + m
        return out if keepdim else out.reshape(reduced_shape(x.shape, norm_axes(axis, x.shape), False))

    # ---------------------------------------------------------------- matmul (the reduce axis is last)

    @opmath
    def matmul(self, other: Any) -> Self:
        """Matrix product with NumPy's rules (1-D operands, broadcast batch dims); the reduce axis is last."""
        other = other if isinstance(other, ReduceMixin) else type(self)(other)
        a, b = self, other
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError(f"both arguments to matmul need to be at least 1-D, got shapes {a.shape} and {b.shape}")
        k_a, k_b = a.shape[-1], b.shape[-2] if b.ndim > 1 else b.shape[0]
        if k_a != k_b:
            raise ValueError(
                f"mat1 and mat2 shapes cannot be multiplied "
                f"({'x'.join(map(str, a.shape))} and {'x'.join(map(str, b.shape))})"
            )
        dt = promote(a.dtype, b.dtype)
        a2 = a.cast(dt).reshape(1, k_a) if a.ndim == 1 else a.cast(dt)
        b2 = b.cast(dt).reshape(k_b, 1) if b.ndim == 1 else b.cast(dt)
        try:
            batch = broadcast_shape(a2.shape[:-2], b2.shape[:-2])
        except ValueError:
            raise ValueError(f"matmul: the batch dims of shapes {a.shape} and {b.shape} cannot be broadcast") from None
        (n, k), m = a2.shape[-2:], b2.shape[-1]
        full = (*batch, n, m, k)
        # a (.., n, 1, k) * b.T (.., 1, m, k), broadcast to `full`, summed over the last axis, built on UOps: the
        # graph of those Tensor ops without six intermediate Tensors and their checks (everything was checked
        # above; about half the Python of a 256^3 matmul's realize). Raw ADD: int8 @ int8 stays int8, as PyTorch.
        swap = (*range(b2.ndim - 2), b2.ndim - 1, b2.ndim - 2)
        ua = broadcast_uop(a2.uop.reshape((*a2.shape[:-2], n, 1, k)), full)
        ub = broadcast_uop(b2.uop.permute(swap).reshape((*b2.shape[:-2], 1, m, k)), full)
        if 0 in full:  # an empty product: _reduce fills in the identity
            out = a2._new(ua.alu(Ops.MUL, ub), b2)._reduce(Ops.ADD, -1, keepdim=False)
        else:
            out = a2._new(ua.alu(Ops.MUL, ub).reduce(Ops.ADD, 1), b2)
        if a.ndim == 1:
            out = out.squeeze(-2)
        return out.squeeze(-1) if b.ndim == 1 else out

    dot = matmul

    def __matmul__(self, x: Any) -> Self:
        return self.matmul(x)

    def __rmatmul__(self, x: Any) -> Self:
        return type(self)(x).matmul(self) if not isinstance(x, ReduceMixin) else x.matmul(self)

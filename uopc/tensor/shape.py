"""Pure argument rules for the Tensor API: dims, broadcasting, and the checks of every movement op's arguments.

Nothing here builds a UOp or a Tensor; each function takes shapes (and Python arguments) and returns the checked,
normalized form, or raises a clear exception naming the problem:

    >>> broadcast_shape((3, 1), (4,))
    (3, 4)
    >>> reshape_shape((2, 6), (3, -1))
    (3, 4)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from uopc.helpers import prod
from uopc.uop import Span
from uopc.uop.dtype import DType, dtypes
from uopc.uop.variable import Bound, Variable, as_dim

Scalar = bool | int | float
Axis = int | Sequence[int] | None


def is_int(x: Any) -> bool:
    """A Python or NumPy integer that is not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def is_scalar(x: Any) -> bool:
    """A Python or NumPy bool, int or float."""
    return isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating))


def scalar_dtype(dt: DType, x: Scalar) -> DType:
    """PyTorch's rule: a Python scalar never widens a tensor's dtype, it only lifts it to the scalar's category."""
    if isinstance(x, (bool, np.bool_)):
        return dt
    if isinstance(x, (int, np.integer)):
        return dtypes.default_int if dt.is_bool else dt
    return dt if dt.is_float else dtypes.default_float


def varargs(args: tuple) -> tuple:
    """`f(2, 3)` and `f((2, 3))` both mean (2, 3)."""
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)


def shape_arg(shape: tuple) -> tuple[int, ...]:
    """A creation shape from varargs: ints >= 0."""
    shape = varargs(shape)
    for s in shape:
        if isinstance(s, (bool, np.bool_, Bound, Variable)) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"a shape must be ints, got {type(s).__name__} {s!r} in {shape}")
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimensions are not allowed, got shape {shape}")
    return tuple(int(s) for s in shape)


def norm_dim(d: Any, ndim: int) -> int:
    """Dim `d` of an `ndim`-dim tensor, negative counting from the end; a 0-d tensor accepts 0 and -1 as PyTorch."""
    if not is_int(d):
        raise TypeError(f"a dim must be an int, got {type(d).__name__} {d!r}")
    n = max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})")
    return int(d) % n


def norm_axes(axis: Axis, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Reduced axes as sorted non-negative ints (all if None; a 0-d tensor has none)."""
    ndim = len(shape)
    if axis is None:
        return tuple(range(ndim))
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    norm = [norm_dim(a, ndim) for a in axes]
    if len(set(norm)) != len(norm):
        raise ValueError(f"axis {axis} names a dim more than once (shape {shape})")
    return tuple(sorted(norm)) if ndim else ()


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    """The shape after reducing `axes`: size 1 there if keepdim, else those dims dropped."""
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The NumPy broadcast of `shapes` (align right; each dim equal or 1)."""
    n = max(len(s) for s in shapes)
    padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded, strict=True):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ValueError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def reshape_shape(shape: tuple[int, ...], new: tuple) -> tuple[int, ...]:
    """The target of a reshape of `shape` to `new`, with its one -1 (if any) inferred."""
    new = tuple(as_dim(s) for s in new)
    size = prod(shape)
    if new.count(-1) > 1 or any(s < -1 for s in new):
        raise ValueError(f"cannot reshape {shape} to {new}: sizes must be >= 0, with at most one -1")
    known = prod(s for s in new if s != -1)
    if -1 in new:
        if known == 0:
            raise ValueError(f"cannot reshape {shape} to {new}: the -1 is ambiguous when another dim is 0")
        new = tuple(size // known if s == -1 else s for s in new)
    if prod(new) != size:
        raise ValueError(f"shape {new} is invalid for input of shape {shape} (size {size})")
    return new


def permute_order(shape: tuple[int, ...], order: tuple) -> tuple[int, ...]:
    """`order` checked to be a permutation of the dims of `shape` (negative dims allowed)."""
    if len(order) != len(shape):
        raise ValueError(f"permute order {order} has {len(order)} dims but shape {shape} has {len(shape)}")
    norm = tuple(norm_dim(d, len(shape)) for d in order)
    if len(set(norm)) != len(norm):
        raise ValueError(f"permute order {order} repeats a dim (shape {shape})")
    return norm


def expand_shape(shape: tuple[int, ...], target: tuple) -> tuple[int, ...]:
    """The target of an expand of `shape` (-1 keeps a dim; new leading dims allowed), as PyTorch checks it."""
    new = len(target) - len(shape)
    if new < 0:
        raise ValueError(f"cannot expand shape {shape} to {target}: the target has fewer dims")
    out = []
    for i, (s, t) in enumerate(zip((1,) * new + shape, target, strict=True)):
        if t == -1 and i < new:
            raise ValueError(f"cannot expand shape {shape} to {target}: -1 is not allowed for a new leading dim")
        t = s if t == -1 else as_dim(t)
        if s != t and s != 1:
            raise ValueError(
                f"cannot expand shape {shape} to {target}: "
                f"the size {s} at dim {i - new} is not 1 and does not match {t}"
            )
        out.append(t)
    return tuple(out)


def shrink_bounds(shape: tuple[int, ...], bounds: Sequence) -> tuple[tuple[int, int], ...]:
    """Per-dim [lo, hi) (None keeps a dim whole), checked against `shape`."""
    if len(bounds) != len(shape):
        raise ValueError(f"shrink {tuple(bounds)} has {len(bounds)} entries but shape {shape} has {len(shape)} dims")
    out = tuple((0, s) if b is None else (int(b[0]), as_dim(b[1])) for b, s in zip(bounds, shape, strict=True))
    if not all(0 <= lo <= hi <= s for (lo, hi), s in zip(out, shape, strict=True)):
        raise ValueError(f"shrink {tuple(bounds)} does not fit shape {shape}: need 0 <= lo <= hi <= size")
    return out


def pad_pairs(shape: tuple[int, ...], padding: Sequence) -> list[tuple[int, int]]:
    """Per-dim (before, after) from one pair (or None) per dim, or from PyTorch's flat (last_lo, last_hi, ...)."""
    padding = tuple(padding)
    ndim = len(shape)
    if all(is_int(p) for p in padding):  # the flat form, innermost dim first
        if len(padding) % 2 or len(padding) > 2 * ndim:
            raise ValueError(
                f"flat padding {padding} needs an even number of entries, at most 2 per dim of shape {shape}"
            )
        pairs = [(0, 0)] * ndim
        for i in range(len(padding) // 2):
            pairs[ndim - 1 - i] = (int(padding[2 * i]), int(padding[2 * i + 1]))
        return pairs
    if len(padding) != ndim:
        raise ValueError(f"padding {padding} has {len(padding)} entries but shape {shape} has {ndim} dims")
    pairs = []
    for p in padding:
        if p is None:
            pairs.append((0, 0))
        elif isinstance(p, (tuple, list)) and len(p) == 2 and all(is_int(v) for v in p):
            pairs.append((int(p[0]), int(p[1])))
        else:
            raise ValueError(f"padding {padding}: each entry must be a (before, after) pair of ints or None, got {p!r}")
    return pairs


def pad_cuts(shape: tuple[int, ...], pairs: list[tuple[int, int]], padding: Sequence) -> list[tuple[int, int]]:
    """The SHRINK bounds that the negative amounts of `pairs` (cuts) ask for, checked against `shape`."""
    cut = []
    for d, ((lo, hi), s) in enumerate(zip(pairs, shape, strict=True)):
        lo_cut, hi_cut = max(0, -lo), max(0, -hi)
        if lo_cut + hi_cut > s:
            raise ValueError(f"padding {tuple(padding)} cuts {lo_cut + hi_cut} from dim {d} of shape {shape}")
        cut.append((lo_cut, s - hi_cut if hi_cut else s))  # s itself: a symbolic dim stays its Variable
    return cut


def symbolic_item(it: Any, n: Variable, d: int) -> Span:
    """The span an index item selects on symbolic dim d (size n): a whole-dim slice, or an int below n's minimum."""
    if is_int(it):
        if not 0 <= it < n.vmin:
            raise IndexError(f"index {it} may be out of range for dimension {d} of symbolic size {n!r}")
        return Span(int(it), 1, 1)
    if it.start in (None, 0) and it.stop is None and it.step in (None, 1):
        return Span(0, 1, n)
    raise IndexError(f"dimension {d} has symbolic size {n!r}: index it whole (:) or by an int below {n.vmin}")


class BasicIndex(NamedTuple):
    """A basic index (ints, slices, ..., None) on a shape: the elements it selects, per dim of the indexed tensor,
    and per dim of the result the dim it walks (None: a size-1 dim the index added)."""

    spans: tuple[Span, ...]
    dims: tuple[int | None, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the indexed view."""
        return tuple(1 if d is None else self.spans[d].count for d in self.dims)


def basic_index(shape: tuple[int, ...], index: Any) -> BasicIndex:
    """The elements `x[index]` selects for an x of `shape`, as NumPy's basic indexing:

    >>> basic_index((4, 6), (1, slice(None, None, -2)))
    BasicIndex(spans=(Span(start=1, step=1, count=1), Span(start=5, step=-2, count=3)), dims=(1,))"""
    items = list(index) if isinstance(index, tuple) else [index]
    for it in items:
        if not (it is None or it is Ellipsis or is_int(it) or isinstance(it, slice)):
            raise TypeError(f"item assignment supports ints, slices and ..., got {type(it).__name__} {it!r}")
    if sum(it is Ellipsis for it in items) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(it is not None and it is not Ellipsis for it in items)
    if consumed > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}: {index!r}")
    at = next((i for i, it in enumerate(items) if it is Ellipsis), len(items))
    items[at : at + 1] = [slice(None)] * (len(shape) - consumed)
    spans: list[Span] = []
    dims: list[int | None] = []
    for it in items:
        if it is None:
            dims.append(None)
            continue
        d, n = len(spans), shape[len(spans)]
        if type(n) is Variable:
            spans.append(symbolic_item(it, n, d))
            if not is_int(it):
                dims.append(d)
            continue
        if is_int(it):
            if not -n <= it < n:
                raise IndexError(f"index {it} is out of bounds for dimension {d} with size {n}")
            spans.append(Span(int(it) % n, 1, 1))
            continue
        start, stop, step = it.indices(n)
        spans.append(Span(start, step, len(range(start, stop, step))))
        dims.append(d)
    return BasicIndex(tuple(spans), tuple(dims))

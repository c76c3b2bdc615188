"""Indexing, padding and joining for Tensor, all as movement ops (index maps): nothing here copies on the host.

A strided slice is a shrink, an optional flip, and a pad+reshape that exposes every step-th element:

    x[1:8:3]   (size 10)  ->  shrink to [1, 8) (7 elems), pad to 9, reshape (3, 3), keep column 0  ->  x[1], x[4], x[7]

Concatenation pads every piece to the full size at its offset and adds them, so it fuses into one kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from uopc.dtype import dtypes, promote
from uopc.helpers import prod
from uopc.uop import Ops, UOp

if TYPE_CHECKING:
    from uopc.tensor import Tensor


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


# ---------------------------------------------------------------- shape rules


def norm_dim(d: Any, ndim: int) -> int:
    """Dim `d` of an `ndim`-dim tensor, negative counting from the end; a 0-d tensor accepts 0 and -1 as PyTorch."""
    if not _is_int(d):
        raise TypeError(f"a dim must be an int, got {type(d).__name__} {d!r}")
    n = max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})")
    return int(d) % n


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
    new = tuple(int(s) for s in new)
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
        t = s if t == -1 else int(t)
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
    out = tuple((0, s) if b is None else (int(b[0]), int(b[1])) for b, s in zip(bounds, shape, strict=True))
    if not all(0 <= lo <= hi <= s for (lo, hi), s in zip(out, shape, strict=True)):
        raise ValueError(f"shrink {tuple(bounds)} does not fit shape {shape}: need 0 <= lo <= hi <= size")
    return out


# ---------------------------------------------------------------- pad


def pad_pairs(shape: tuple[int, ...], padding: Sequence) -> list[tuple[int, int]]:
    """Per-dim (before, after) from one pair (or None) per dim, or from PyTorch's flat (last_lo, last_hi, ...)."""
    padding = tuple(padding)
    ndim = len(shape)
    if all(_is_int(p) for p in padding):  # the flat form, innermost dim first
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
        elif isinstance(p, (tuple, list)) and len(p) == 2 and all(_is_int(v) for v in p):
            pairs.append((int(p[0]), int(p[1])))
        else:
            raise ValueError(f"padding {padding}: each entry must be a (before, after) pair of ints or None, got {p!r}")
    return pairs


def pad(x: Tensor, padding: Sequence, value: float = 0.0) -> Tensor:
    """Pad with `value`; negative amounts cut instead (a shrink first, then a pad of the positive parts)."""
    pairs = pad_pairs(x.shape, padding)
    cut = []
    for d, ((lo, hi), s) in enumerate(zip(pairs, x.shape, strict=True)):
        lo_cut, hi_cut = max(0, -lo), max(0, -hi)
        if lo_cut + hi_cut > s:
            raise ValueError(f"padding {tuple(padding)} cuts {lo_cut + hi_cut} from dim {d} of shape {x.shape}")
        cut.append((lo_cut, s - hi_cut))
    x = x.shrink(cut)
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


# ---------------------------------------------------------------- indexing


def getitem(x: Tensor, index: Any) -> Tensor:
    """x[index] for ints, slices (any step), None, ..., and one int Tensor or list of ints (a gather)."""
    from uopc.tensor import Tensor

    items = list(index) if isinstance(index, tuple) else [index]
    for i, it in enumerate(items):
        if isinstance(it, (list, np.ndarray)):  # a list of ints indexes like an int Tensor, as in NumPy
            items[i] = Tensor(it)
        elif not (it is None or it is Ellipsis or _is_int(it) or isinstance(it, (slice, Tensor))):
            raise TypeError(
                f"unsupported index {it!r} ({type(it).__name__}): use ints, slices, None, ..., or an int Tensor"
            )
    if sum(it is Ellipsis for it in items) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(it is not None and it is not Ellipsis for it in items)
    if consumed > x.ndim:
        raise IndexError(f"too many indices for tensor of dimension {x.ndim} (shape {x.shape}): {index!r}")
    if any(it is Ellipsis for it in items):  # not `Ellipsis in items`: that would compare Tensors with ==
        at = next(i for i, it in enumerate(items) if it is Ellipsis)
        items[at : at + 1] = [slice(None)] * (x.ndim - consumed)
    else:
        items += [slice(None)] * (x.ndim - consumed)
    tensors = [i for i, it in enumerate(items) if isinstance(it, Tensor)]
    if len(tensors) > 1:
        raise IndexError("only one Tensor index is supported")

    bounds, flips, steps, final, gather_at = [], [], [], [], None
    d = 0  # the input dim the next item indexes
    for it in items:
        if it is None:
            final.append(1)
            continue
        s = x.shape[d]
        if _is_int(it):
            if not -s <= it < s:
                raise IndexError(f"index {it} is out of bounds for dimension {d} with size {s}")
            bounds.append((int(it) % s, int(it) % s + 1))
            steps.append(1)
        elif isinstance(it, Tensor):
            gather_at = len(final)
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
    out = _strided(x.shrink(bounds).flip(tuple(flips)), steps).reshape(tuple(final))
    if gather_at is None:
        return out
    out = gather(out, gather_at, items[tensors[0]])
    # NumPy: ints and the Tensor are all advanced indices; if they are not adjacent, the gathered dims go first
    adv = [i for i, it in enumerate(items) if _is_int(it) or isinstance(it, Tensor)]
    if adv != list(range(adv[0], adv[-1] + 1)):
        k = items[tensors[0]].ndim
        order = list(range(gather_at, gather_at + k))
        out = out.permute(*order, *(i for i in range(out.ndim) if i not in order))
    return out


def _strided(x: Tensor, steps: list[int]) -> Tensor:
    """Every steps[d]-th element of each dim: pad to a multiple of the step, split (n, step), keep column 0."""
    if all(s == 1 for s in steps):
        return x
    counts = [-(-size // st) for size, st in zip(x.shape, steps, strict=True)]
    x = x.pad(tuple((0, n * st - size) for n, st, size in zip(counts, steps, x.shape, strict=True)))
    split = [v for n, st in zip(counts, steps, strict=True) for v in ((n, st) if st > 1 else (n,))]
    keep = [b for n, st in zip(counts, steps, strict=True) for b in (((0, n), (0, 1)) if st > 1 else ((0, n),))]
    return x.reshape(split).shrink(keep).reshape(counts)


def gather(x: Tensor, dim: int, idx: Tensor) -> Tensor:
    """x indexed along `dim` by an int tensor: a one-hot (arange == idx) select, summed over `dim`.

    The result has shape x.shape[:dim] + idx.shape + x.shape[dim+1:]; an out-of-range index gives zeros.
    """
    from uopc.tensor import Tensor

    if not idx.dtype.is_int:
        raise IndexError(
            f"tensors used as indices must be int tensors, got {idx.dtype!r} "
            "(boolean masks are not supported: their result shape depends on the data)"
        )
    n = x.shape[dim]
    if n == 0 and idx.numel():
        raise IndexError(f"cannot index dimension {dim} of size 0 (shape {x.shape})")
    idx = (idx < 0).where(idx + n, idx)  # negative indices count from the end
    rest = x.shape[dim + 1 :]
    onehot = (Tensor.arange(n) == idx.unsqueeze(-1)).reshape((1,) * dim + idx.shape + (n,) + (1,) * len(rest))
    xs = x.reshape(x.shape[:dim] + (1,) * idx.ndim + (n,) + rest)
    # a select, not a multiply: a NaN or inf elsewhere in x must not leak into the sum as NaN
    picked = onehot.where(xs, Tensor(UOp.const(0, x.dtype)))
    return picked._reduce(Ops.ADD, dim + idx.ndim, keepdim=False)  # raw ADD: keeps x's dtype (bool: OR)


# ---------------------------------------------------------------- joining and splitting


def tensor_args(args: Sequence, dim: int) -> tuple[list[Tensor], int]:
    """The tensors and dim of Tensor.cat(a, b) / Tensor.cat([a, b], 1) / a.cat([b, c], dim=1) (also for stack)."""
    from uopc.tensor import Tensor

    args = list(args)
    if len(args) >= 2 and _is_int(args[-1]):  # a trailing positional int is the dim, as in torch.cat(ts, 1)
        dim = args.pop()
    out: list[Tensor] = []
    for a in args:
        for t in a if isinstance(a, (list, tuple)) else [a]:
            if not isinstance(t, Tensor):
                raise TypeError(f"expected Tensors, got {type(t).__name__}")
            out.append(t)
    return out, dim


def cat(ts: list[Tensor], dim: int = 0) -> Tensor:
    """Concatenate along `dim` as pads + adds (each piece padded to the full size at its offset): one fused kernel."""
    if not ts:
        raise ValueError("cat expects a non-empty list of tensors")
    for i, t in enumerate(ts):
        if t.ndim == 0:
            raise ValueError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")
    ref = ts[0]
    d = norm_dim(dim, ref.ndim)
    for i, t in enumerate(ts):
        if t.ndim != ref.ndim or any(a != b for j, (a, b) in enumerate(zip(ref.shape, t.shape, strict=True)) if j != d):
            raise ValueError(f"cat: shapes {ref.shape} and {t.shape} (tensor {i}) must match except in dimension {d}")
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


def stack(ts: list[Tensor], dim: int = 0) -> Tensor:
    """Stack equal-shaped tensors along a new dim `dim`."""
    if not ts:
        raise ValueError("stack expects a non-empty list of tensors")
    for i, t in enumerate(ts):
        if t.shape != ts[0].shape:
            raise ValueError(
                f"stack expects each tensor to be equal size, but got {ts[0].shape} at entry 0 "
                f"and {t.shape} at entry {i}"
            )
    d = norm_dim(dim, ts[0].ndim + 1)
    return cat([t.unsqueeze(d) for t in ts], d)


def split(x: Tensor, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Pieces along `dim`: all of size `sizes` (the last may be smaller), or of the listed sizes."""
    d = norm_dim(dim, x.ndim)
    total = x.shape[d]
    if _is_int(sizes):
        if sizes <= 0:
            raise ValueError(f"split size must be positive, got {sizes}")
        sizes = [min(sizes, total - i) for i in range(0, total, sizes)] or [0]
    sizes = list(sizes)
    if sum(sizes) != total:
        raise ValueError(f"split sizes {sizes} sum to {sum(sizes)} but dim {d} of shape {x.shape} has size {total}")
    out, off = [], 0
    for n in sizes:
        out.append(x.shrink(tuple((off, off + n) if j == d else None for j in range(x.ndim))))
        off += n
    return tuple(out)


def repeat(x: Tensor, repeats: tuple[int, ...]) -> Tensor:
    """Tile `repeats[i]` times along dim i: view each dim s as (1, s), expand to (r, s), merge to r * s."""
    if len(repeats) < x.ndim:
        raise ValueError(f"repeat {repeats} needs at least one entry per dim of shape {x.shape}")
    shape = (1,) * (len(repeats) - x.ndim) + x.shape
    pairs = [v for s in shape for v in (1, s)]
    tiled = [v for r, s in zip(repeats, shape, strict=True) for v in (r, s)]
    return x.reshape(pairs).expand(tiled).reshape(tuple(r * s for r, s in zip(repeats, shape, strict=True)))

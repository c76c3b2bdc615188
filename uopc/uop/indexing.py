"""Movement ops as index maps: where an element of a view lives in its source.

    through(x.permute((1, 0)), (i, j))   ->   (x, (j, i), None)
    through(x.pad(((1, 0),)), (i,))      ->   (x, (i - 1,), 0 < i)        (the condition under which it is real)

Lowering (uopc.codegen.rangeify) follows a view down to its buffer one op at a time with `through`; the optimizer's
stride analysis (uopc.opt.strides) asks the same question without lowering anything (`flat_index`).
"""

from __future__ import annotations

from uopc.helpers import prod
from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes
from uopc.uop.symbolic import simplify

__all__ = ["affine_view", "and_", "flat_index", "ravel", "reshape_index", "through"]


def ravel(idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
    """The row-major flat index of `idx` in `shape`."""
    out: UOp | None = None  # no "+ 0": the same element reached by two paths gets the same index UOp (memo hits)
    stride = 1
    for i, s in reversed(list(zip(idx, shape))):
        if s != 1:
            term = i * stride if stride != 1 else i
            out = term if out is None else term + out
        stride *= s
    return UOp.const(0, idx[0].dtype if idx else dtypes.int32) if out is None else out


def reshape_index(idx: tuple[UOp, ...], out_shape: tuple[int, ...], in_shape: tuple[int, ...]) -> tuple[UOp, ...]:
    """Map an index of the reshaped value back to its source. Dims are matched in groups of equal
    product, so splitting/merging axes costs one div/mod per affected axis, not a full unravel."""
    res: list[UOp] = []
    i = j = 0
    while i < len(out_shape) or j < len(in_shape):
        # grow a group on each side until the products agree (size-1 dims join whichever side is open)
        gi, gj = [i], [j]
        pi = out_shape[i] if i < len(out_shape) else 1
        pj = in_shape[j] if j < len(in_shape) else 1
        i, j = i + 1, j + 1
        while int(pi) != int(pj):  # as ints: a Variable (its maximum) never equals an int
            if pi < pj:
                gi.append(i)
                pi *= out_shape[i]
                i += 1
            else:
                gj.append(j)
                pj *= in_shape[j]
                j += 1
        gi = [k for k in gi if k < len(out_shape)]
        gj = [k for k in gj if k < len(in_shape)]
        flat = ravel(tuple(idx[k] for k in gi), tuple(out_shape[k] for k in gi))
        stride, outer = prod(in_shape[k] for k in gj), 1
        for k in gj:
            stride //= in_shape[k]
            part = flat if stride == 1 else flat // stride
            # (no mod where every dim before it in the group has size 1: in range, flat // stride is already below
            # in_shape[k]; a PAD's index past the end, which its gate discards, then stays affine, not wrapped)
            res.append(UOp.const(0, flat.dtype) if in_shape[k] == 1 else part % in_shape[k] if outer > 1 else part)
            outer *= in_shape[k]
    return tuple(res)


def and_(a: UOp | None, b: UOp | None) -> UOp | None:
    """a & b, where None means no condition."""
    return b if a is None else a if b is None else a & b


def through(u: UOp, idx: tuple[UOp, ...]) -> tuple[UOp, tuple[UOp, ...], UOp | None]:
    """For movement op `u` at index `idx`: the node the element comes from, its index there, and the condition
    under which it is real (a PAD's; None: always). A chain of RESHAPEs is one step to the innermost source (both
    row-major), so a staged (N, H, W, C, kh, kw) read as (N, H*W, C*kh*kw) indexes without a div/mod per element."""
    op, src = u.op, u.src[0]
    if op is Ops.RESHAPE:
        while src.op is Ops.RESHAPE:
            src = src.src[0]
        return src, reshape_index(idx, u.shape, src.shape), None
    if op is Ops.EXPAND:
        zero = UOp.const(0, idx[0].dtype if idx else dtypes.int32)
        return src, tuple(zero if s == 1 else i for i, s in zip(idx, src.shape, strict=True)), None
    if op is Ops.PERMUTE:
        new: list[UOp] = [None] * len(idx)  # type: ignore[list-item]
        for i, p in enumerate(u.arg):
            new[p] = idx[i]
        return src, tuple(new), None
    if op is Ops.SHRINK:
        return src, tuple(i + lo if lo else i for i, (lo, _) in zip(idx, u.arg, strict=True)), None
    if op is Ops.FLIP:
        return src, tuple((s - 1) - i if f else i for i, s, f in zip(idx, u.shape, u.arg, strict=True)), None
    if op is Ops.PAD:
        cond: UOp | None = None
        new = []
        for i, s, (lo, _) in zip(idx, src.shape, u.arg, strict=True):
            if lo or s + lo < i.vmax + 1:
                ok = simplify((UOp.const(lo - 1, i.dtype) < i) & (i < UOp.const(lo + s, i.dtype)))
                if not (ok.op is Ops.CONST and ok.arg is True):
                    cond = and_(cond, ok)
            new.append(i - lo if lo else i)
        return src, tuple(new), cond
    raise ValueError(f"through: {op} is not a movement op")


def flat_index(view: UOp, base: UOp, idx: tuple[UOp, ...], padded: bool = False) -> UOp | None:
    """The row-major flat index into `base` of `view` at `idx`, following only movement ops from `view` down to
    `base`; None if a PAD makes the element conditional (unless `padded`: then the index where it is real) or the
    chain reaches something else first."""
    u = view
    while u is not base:
        if u.op is Ops.STAGE:
            u = u.src[0]
            continue
        if u.op not in (Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP, Ops.PAD):
            return None
        u, idx, cond = through(u, idx)
        if cond is not None and not padded:
            return None
    return ravel(idx, base.shape) if base.shape else UOp.const(0, idx[0].dtype if idx else dtypes.int32)


def reshape_strides(old: list[int], ost: list[int], new: list[int]) -> list[int] | None:
    """The strides of a strided view (old, ost) reshaped to `new`, or None when some merged dims are not laid out
    one after the other (then the reshape is no strided view). Size-1 dims take stride 0."""
    o = [(n, st) for n, st in zip(old, ost, strict=True) if n != 1]
    res = [0] * len(new)
    oi = ni = 0
    while ni < len(new) or oi < len(o):
        if ni < len(new) and new[ni] == 1:
            ni += 1
            continue
        if oi >= len(o) or ni >= len(new):
            return None
        op, np_, oj, nj = o[oi][0], new[ni], oi + 1, ni + 1
        while op != np_:  # the smallest groups of old and new dims with the same number of elements
            if op < np_:
                if oj >= len(o):
                    return None
                op, oj = op * o[oj][0], oj + 1
            else:
                if nj >= len(new):
                    return None
                np_, nj = np_ * new[nj], nj + 1
        if any(o[k][1] != o[k + 1][1] * o[k + 1][0] for k in range(oi, oj - 1)):
            return None
        st = o[oj - 1][1]
        for k in range(nj - 1, ni - 1, -1):
            res[k] = st if new[k] != 1 else 0
            st *= new[k]
        oi, ni = oj, nj
    return res


def affine_view(view: UOp, base: UOp) -> tuple[int, tuple[int, ...]] | None:
    """(offset, strides) when every element of `view` is at offset + sum(i_k * strides[k]) in `base` (row-major,
    as materialized), else None (a PAD, something other than a movement op between them, or a reshape that merges
    dims not laid out one after the other). The views are composed as strided views, exactly, from the base up. A
    symbolic dim is laid out at its maximum, so it is measured there."""
    chain = []
    u = view
    while u is not base:
        if u.op not in (Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP, Ops.PAD):
            return None
        chain.append(u)
        u = u.src[0]
    shape = [int(n) for n in base.shape]
    strides = [prod(shape[k + 1 :]) for k in range(len(shape))]
    offset = 0
    for m in reversed(chain):
        if m.op is Ops.RESHAPE:
            new = [int(n) for n in m.arg]
            got = reshape_strides(shape, strides, new)
            if got is None:
                return None
            shape, strides = new, got
        elif m.op is Ops.PERMUTE:
            shape, strides = [shape[i] for i in m.arg], [strides[i] for i in m.arg]
        elif m.op is Ops.EXPAND:
            new = [int(n) for n in m.arg]
            strides = [0 if a != b else st for a, b, st in zip(shape, new, strides, strict=True)]
            shape = new
        elif m.op is Ops.SHRINK:
            offset += sum(int(lo) * st for (lo, _), st in zip(m.arg, strides, strict=True))
            shape = [int(hi) - int(lo) for lo, hi in m.arg]
        elif m.op is Ops.FLIP:
            for k, f in enumerate(m.arg):
                if f:
                    offset, strides[k] = offset + (shape[k] - 1) * strides[k], -strides[k]
        elif any(lo or hi for lo, hi in m.arg):  # a PAD that adds elements: they are not in the base
            return None
    return offset, tuple(strides)

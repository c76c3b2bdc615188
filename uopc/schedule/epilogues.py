"""Epilogues: the REDUCEs (matmuls) that the one kernel reading them computes itself, its elementwise ops applied
to the register tile before the one store (a bias, an activation, a residual add, a BatchNorm in eval mode).

    relu(r + bias)          ->  one kernel: r's tile, then + bias, relu, store        (epilogue_fusions)
    relu(reshape(r) + b)    ->  reshape(relu(r + reshape(b)))                          (lift_epilogues)
    relu(shrink(r) * s)     ->  shrink(relu(r * s'))    (s' = s along the cut positions too)
    relu(bn(wo) + res)      ->  one kernel: Winograd's output transform, its ops over the outputs it has just
                                stored, in L1                                           (winograd_epilogues)

Decided on the shape graph before it is cut (uopc.schedule.cut), with the optimizer's say.
"""

from __future__ import annotations

from typing import Any

from uopc.schedule.fusion import MATERIALIZED, kernel_region
from uopc.uop import ALU, MOVEMENT, Ops, UOp, base_buffer
from uopc.uop.dtype import dtypes
from uopc.uop.indexing import affine_view

__all__ = ["EPILOGUE_BROADCASTS", "epilogue_fusions", "lift_epilogues", "winograd_epilogues"]


def _readers(points: list[UOp], op: Ops = Ops.REDUCE) -> dict[UOp, list[UOp]]:
    """Each node of `op` that kernels read (not one a kernel computes as its own value) -> the kernels (points)
    reading it."""
    readers: dict[UOp, list[UOp]] = {}
    for p in points:
        body = p.src[0] if p.op is Ops.STAGE else p
        for u in kernel_region(body):
            if u.op is op and u is not body:
                readers.setdefault(u, []).append(p)
    return readers


def _at_own_index(body: UOp, r: UOp) -> bool:
    """Does `body` read REDUCE `r` only through ALU ops of r's shape, so each output element reads r at its own
    index (r's elements are each computed once, by the output element that uses it)?"""
    return body.shape == r.shape and _read_of(body, r) is r


def epilogue_fusions(roots: list[UOp], points: list[UOp], accepts: Any) -> frozenset[UOp]:
    """The REDUCEs that are computed by the one kernel that reads them, as the reduce of that kernel followed by its
    elementwise ops (an epilogue: a matmul's bias, activation, residual add applied while the tile is in registers).

    The cost rule: fusing saves writing r and reading it back (2 x its bytes) and recomputes nothing, when exactly
    one kernel reads r, only through elementwise ops at r's own index, and that kernel computes no other fused
    reduce. `accepts(r, reader_body)` is the optimizer's say (it fuses only what its kernels keep fast: the GEMM
    microkernel and a window's reduce take an epilogue); without an optimizer nothing is fused, so OPT=0 keeps
    Chapter 7's kernels."""
    if accepts is None:
        return frozenset()
    rootset = set(roots)
    readers = _readers(points)
    fused: dict[UOp, UOp] = {}  # kernel -> the reduce it takes in
    taken: set[UOp] = set()
    for r, ks in readers.items():
        if r in rootset or len(ks) != 1 or ks[0].op in (Ops.REDUCE, Ops.SCATTER, Ops.SETITEM):
            continue
        k = ks[0]
        body = k.src[0] if k.op is Ops.STAGE else k
        if body.shape == r.shape and _at_own_index(body, r) and accepts(r, body):
            if k in fused:  # two matmuls in one kernel: neither gets the microkernel, so neither fuses
                taken.add(k)
            else:
                fused[k] = r
    return frozenset(r for k, r in fused.items() if k not in taken)


# what an output transform's epilogue may read and compute (each output's value by rangeify, rendered into the
# transform's C: uopc.codegen.winograd): float32 and bool values, no index checks, no symbolic sizes
_SCALAR_OPS = ALU | MOVEMENT | {Ops.CONST, Ops.BUFFER}
_SCALAR_DTYPES = (dtypes.float32, dtypes.bool)


def winograd_epilogues(
    roots: list[UOp], points: list[UOp], accepts: Any, fused: frozenset[UOp] = frozenset()
) -> frozenset[UOp]:
    """The Winograd output transforms (WINOGRAD "out") computed by the one kernel that reads them: that kernel's
    elementwise ops (a bias, a BatchNorm in eval mode, an activation, a residual add) applied to each output as the
    transform stores it, one store per element instead of a store, a second kernel's read and its store. The same
    rule as epilogue_fusions: exactly one kernel reads the transform, only through ALU ops at its own index, and
    computes no reduce of its own (`fused`: those computed inside their readers) and no other transform; its other
    reads are stored values and constants (the materialized nodes it reads, views of them, float32 or bool);
    the optimizer has its say, and without one nothing fuses."""
    if accepts is None:
        return frozenset()
    rootset = set(roots)
    found: dict[UOp, UOp] = {}  # reader kernel -> the transform it computes
    taken: set[UOp] = set()
    for r, ks in _readers(points, Ops.WINOGRAD).items():
        if r.arg.kind != "out" or r in rootset or len(ks) != 1 or ks[0].op not in ALU | {Ops.STAGE}:
            continue
        k = ks[0]
        body = k.src[0] if k.op is Ops.STAGE else k
        if body.op not in ALU or not _at_own_index(body, r) or body.dtype is not r.dtype:
            continue
        region = kernel_region(body)
        if any(u.op in MATERIALIZED and u in fused for u in region):
            continue
        inner = [u for u in region if u.op not in MATERIALIZED or u is body]
        if any(u.op not in _SCALAR_OPS for u in inner) or any(u.dtype not in _SCALAR_DTYPES for u in region):
            continue
        if not _along_rows(body, region):
            continue
        if k in found:  # two transforms read by one kernel: neither is computed there
            taken.add(k)
        elif accepts(r, body):
            found[k] = r
    return frozenset(r for k, r in found.items() if k not in taken)


def _along_rows(body: UOp, region: list[UOp]) -> bool:
    """Does `body` read each stored value of its own shape along the rows of its output, element by element (or one
    value per row)? The transform applies its epilogue plane by plane, so a value read across the rows (transposed)
    is read a cache line per element there: conv (8, 64, 28, 28) + a transposed residual, 0.59 ms as the epilogue,
    0.12 + 0.09 ms as the transform and an elementwise kernel (which orders its loops for the transposed read).
    Reads that are not affine (padded) count as along the rows."""
    under = {s for u in region if u.op in MOVEMENT for s in u.src}
    for u in region:
        if u.op not in MOVEMENT or u in under or u.shape != body.shape:
            continue
        base = u
        while base.op in MOVEMENT:
            base = base.src[0]
        if base.op is not Ops.CONST and (av := affine_view(u, base)) is not None and av[1][-1] not in (0, 1):
            return False
    return True


_VIEWS = (Ops.RESHAPE, Ops.SHRINK)  # what may lie between a matmul and its reader (the reader's ops move below it)


def _view_base(u: UOp) -> UOp:
    while u.op in _VIEWS:
        u = u.src[0]
    return u


def _read_of(body: UOp, r: UOp) -> UOp | None:
    """How `body` reads REDUCE `r` through ALU ops of its own shape: r itself, or the one chain of RESHAPEs and
    SHRINKs it reads r through; None if it reads r otherwise too (another view, another shape) or not at all."""
    found, seen, stack = None, set(), [body]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u is r or (u.op in _VIEWS and _view_base(u) is r):
            if found is not None and found is not u:
                return None
            found = u
        elif u.op in ALU and u.shape == body.shape:
            stack.extend(u.src)
        elif u.op not in MATERIALIZED and r in kernel_region(u):  # read through another view or at another shape
            return None
    return found


def _viewed_read(body: UOp, r: UOp) -> UOp | None:
    """The chain of RESHAPEs and SHRINKs through which `body` reads REDUCE `r` alone (see _read_of), else None."""
    v = _read_of(body, r)
    return v if v is not None and v is not r else None


class _NoLift(Exception):
    """An operand of the reader cannot be read at the matmul's shape."""


def _constant_along(u: UOp, axes: list[int]) -> bool:
    """Does read `u` (a view of a constant or of a stored node) have one value along each of `axes`?"""
    base = u
    while base.op in MOVEMENT:
        base = base.src[0]
    if base.op is Ops.CONST:
        return True
    if not all(type(d) is int for d in (*u.shape, *base.shape)) or (av := affine_view(u, base)) is None:
        return False
    return all(av[1][i] == 0 for i in axes)


def _undo(u: UOp, view: UOp) -> UOp:
    """Read `u`, of the view's shape, at the shape of the view's base: a reshape undone; a SHRINK undone by reading,
    along each axis it cuts, the one value u has there (a per-channel statistic along a convolution's padded
    positions; a read that varies there, a residual, raises _NoLift)."""
    while view.op in _VIEWS:
        full = view.src[0].shape
        if view.op is Ops.RESHAPE:
            u = base_buffer(u).reshape(full)
        else:
            cut = [i for i, ((lo, hi), n) in enumerate(zip(view.arg, full, strict=True)) if (lo, hi) != (0, n)]
            if not _constant_along(u, cut):
                raise _NoLift
            u = u.shrink(tuple((0, 1) if i in cut else (0, d) for i, d in enumerate(u.shape))).expand(full)
        view = view.src[0]
    return u


def _redo(u: UOp, view: UOp) -> UOp:
    """`u`, of the shape of the view's base, read through the view's chain."""
    if view.op not in _VIEWS:
        return u
    u = _redo(u, view.src[0])
    return u.reshape(view.shape) if view.op is Ops.RESHAPE else u.shrink(view.arg)


def _at_shape(u: UOp, view: UOp, r: UOp, memo: dict[UOp, UOp]) -> UOp:
    """`u`, an ALU op at the view's shape (or one of its sources), computed at r's shape: the view's reads of r are
    r itself, every ALU op of that shape is rebuilt at r's, every other source of that shape (a read) is read there
    (_undo), shape-() constants stay."""
    if (hit := memo.get(u)) is not None:
        return hit
    if u is view:
        out = r
    elif u.op in ALU and u.shape == view.shape:
        out = u.replace(src=tuple(_at_shape(s, view, r, memo) for s in u.src))
    elif u.shape == view.shape:
        out = _undo(u, view)
    else:
        out = u
    memo[u] = out
    return out


def _lifted(body: UOp, view: UOp, r: UOp) -> UOp | None:
    try:
        return _at_shape(body, view, r, {})
    except (_NoLift, ValueError):  # (ValueError: a symbolic dim that cannot be regrouped)
        return None


# an epilogue reads at most this many broadcast values (per output channel of a convolution: a BatchNorm's four)
# once lifted: a row of a GEMM's tile holds each in a register across the product's loops, and two BatchNorms' eight
# (ResNet's downsampling block: its 1x1 convolution's epilogue would apply its own and the residual's) spilled the
# tile's accumulators (1.3x the separate kernels' time, one process, alternating)
EPILOGUE_BROADCASTS = 4


def _broadcasts(body: UOp) -> int:
    """The materialized values `body` reads through an EXPAND (a bias, a BatchNorm's statistics)."""
    bases = set()
    for u in kernel_region(body):
        if u.op is Ops.EXPAND:
            b = u
            while b.op in MOVEMENT:
                b = b.src[0]
            if b.op is not Ops.CONST:
                bases.add(b)
    return len(bases)


def _flattened_readers(points: list[UOp]) -> set[UOp]:
    """The points some other kernel reads through a PERMUTE, or through a RESHAPE that changes the innermost dim (a
    GEMM's operand packed into panels, (C, H, W) read as (C, H*W) in 64-wide blocks). A max reduce (a max pool) is
    no such reader: its window's taps, permuted last and merged, are loops it takes apart again, and a position is
    an index without a division through a cut too (ResNet's stem: its BatchNorm and ReLU as the product's
    epilogue, the pool reading the product through the cut and the padding: in ResNet-18 at batch 1 the copy and the
    pool took 0.37 ms, the pool alone now 0.22-0.24)."""
    out = set()
    for p in points:
        if p.op is Ops.REDUCE and p.arg[0] is Ops.MAX:
            continue
        for u in kernel_region(p.src[0] if p.op is Ops.STAGE else p):
            if u.op is Ops.PERMUTE or (u.op is Ops.RESHAPE and u.shape[-1:] != u.src[0].shape[-1:]):
                base = u.src[0]
                while base.op in MOVEMENT:
                    base = base.src[0]
                if base is not p and base.op is Ops.STAGE:
                    out.add(base)
    return out


def lift_epilogues(roots: list[UOp], points: list[UOp], accepts: Any) -> list[UOp]:
    """`roots` with each matmul that one kernel reads only through RESHAPEs and SHRINKs and elementwise ops (a
    convolution's GEMM, (N, groups, Cout/groups, positions), read as (N, Cout, H, W) by its bias, BatchNorm, ReLU and
    residual add; a stride-1 one's positions span the padded width, cut to the output) computing those ops at the
    matmul's own shape, the view put on their result: the kernel now reads the matmul at its own index, so
    epilogue_fusions may make the ops its epilogue. Under reshapes alone it stores the same bytes; under a cut it
    stores the uncut positions too (their values never read), so it is lifted there only where every other operand
    has one value along the cut positions (a per-channel statistic, not a residual), not as an output of the plan and
    not where another kernel reads the result flattened or transposed (_flattened_readers: a depthwise convolution's
    BatchNorm and ReLU6 or SiLU, its output read into the next 1x1 convolution's panels, which through the cut took a
    division per element, 0.48 ms against 0.03: a MobileNetV2-style stack ran 1.19x slower, 1.13x with SiLU).
    The same readers and the optimizer's say as epilogue_fusions, and at most EPILOGUE_BROADCASTS broadcast values;
    nothing changes without an optimizer. (Through a transpose, a strided convolution's channels-last product, the
    result would be stored in the product's order: its readers, Winograd's input transform, then read it strided and
    ran ~2x slower.)"""
    if accepts is None:
        return roots
    readers, flattened = _readers(points), None
    lifts: dict[UOp, UOp] = {}  # kernel -> the matmul it reads through a view
    for r, ks in readers.items():
        k = ks[0]
        if len(ks) != 1 or k.op in (Ops.REDUCE, Ops.SCATTER, Ops.SETITEM) or k in lifts:
            continue
        body = k.src[0] if k.op is Ops.STAGE else k
        if body.shape == r.shape or body.op not in ALU or (view := _viewed_read(body, r)) is None:
            continue
        if any(u.op is Ops.SHRINK for u in view.toposort(stop={r})):
            if k.op is not Ops.STAGE:
                continue  # (an output of the plan is stored compact: a cut view of it would be a copy)
            if flattened is None:
                flattened = _flattened_readers(points)
            if k in flattened:
                continue
        lifted = _lifted(body, view, r)
        if lifted is not None and _broadcasts(lifted) <= EPILOGUE_BROADCASTS and accepts(r, lifted):
            lifts[k] = r
    if not lifts:
        return roots
    # rebuilt bottom-up: a lifted kernel may read another (its rebuilt sources hold the rebuilt matmul)
    new: dict[UOp, UOp] = {}
    for u in UOp(Ops.SINK, tuple(roots)).toposort()[:-1]:
        src = tuple(new[s] for s in u.src)
        n = u if src == u.src else u.replace(src=src)
        if (r := lifts.get(u)) is not None:
            body, r = (n.src[0] if n.op is Ops.STAGE else n), new[r]
            view = _viewed_read(body, r)
            lifted = _lifted(body, view, r)
            n = _redo(n.replace(src=(lifted,)) if n.op is Ops.STAGE else lifted, view)
        new[u] = n
    return [base_buffer(new[u]) for u in roots]

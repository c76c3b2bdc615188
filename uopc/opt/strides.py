"""Views and strides on the shape graph: which buffer elements a view reads, asked of the index maps.

`push_views` moves views through ALU ops so each operand's own chain of views is visible; `operand_views` lists
those chains; `last_axis_stride` is the distance in memory between neighbours along one axis of a view;
`merged_shape` an elementwise kernel's loops, with the dims every read walks in order merged
(x (128, 32, 14, 14) + y.permute(...) read in order -> one loop of 802816), `merged_reduce` a reduce's axes so.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

from uopc.uop import ALU, MOVEMENT, STORED, AxisType, Ops, RangeArg, UOp
from uopc.uop.dtype import dtypes
from uopc.uop.indexing import flat_index, reshape_strides
from uopc.uop.rewrite import PatternMatcher, UPat
from uopc.uop.symbolic import eval_int, simplify


def _push(m: UOp, a: UOp) -> UOp | None:
    # PAD is not pushed: pad(f(x)) != f(pad(x)) when f(0) != 0 (exp2, cmp, where, ...)
    if m.op is Ops.PAD:
        return None
    # operands of the ALU's own shape take the view, in the operand's dtype (a comparison's float operands under a
    # bool view stay float); shape-() operands broadcast (unless the ALU itself is 0-d)
    return a.replace(src=tuple(m.replace(src=(s,), dtype=s.dtype) if s.shape == a.shape else s for s in a.src))


# movement(alu(a, b)) -> alu(movement(a), movement(b)): exposes each operand's own chain of views;
# permute(expand(x)) -> expand(permute(x)): the broadcast goes on top, so the operand under it can be staged
# in the permuted order (a convolution's weight gradient reads its im2col rows transposed)
push_views = PatternMatcher(
    [
        (UPat(MOVEMENT, src=(UPat(ALU, name="a"),), name="m"), _push),
        (
            UPat(Ops.PERMUTE, src=(UPat(Ops.EXPAND, name="e"),), name="p"),
            lambda p, e: e.src[0].permute(p.arg).expand(p.shape),
        ),
    ]
)


def operand_views(x: UOp) -> Iterator[tuple[UOp, UOp]]:
    """The movement-op chains feeding x through ALU ops: (top of chain, materialized base)."""
    seen, stack = set(), [x]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.op in ALU:
            stack.extend(u.src)
        elif u.op in MOVEMENT:
            base = u
            while base.op in MOVEMENT:
                base = base.src[0]
            if base.op in STORED:
                yield u, base


# a pure function of hash-consed nodes, asked again and again by the layout pass and the GEMM checks (1,312 times,
# 3.9 s, in the char-GPT step's first call): each distinct question is answered once
@lru_cache(maxsize=8192)
def last_axis_stride(view: UOp, base: UOp, axis: int = -1, padded: bool = False) -> int | None:
    """Distance in memory between view[..., k] and view[..., k+1] (along `axis`, the last by default), or None
    if the view is not affine there (or pads, unless `padded`: then the distance where both elements are real).

    The index maps are the stride oracle: the view's flat index into `base` over symbolic loop indices, evaluated
    at k=0 and k=1.
    """
    if not view.shape or view.shape[axis] == 1:  # a 0-d view (e.g. reshape to ()) has no last axis to stride
        return 0
    rngs = tuple(UOp(Ops.RANGE, (UOp.const(s),), RangeArg(i, AxisType.LOOP)) for i, s in enumerate(view.shape))
    e = flat_index(view, base, rngs, padded)
    if e is None:
        return None

    last = axis % len(rngs)

    def at(k: int) -> UOp:
        return simplify(e.substitute({r: UOp.const(k if i == last else 0) for i, r in enumerate(rngs)}))

    v0 = eval_int(e, {r: 0 for r in rngs})
    v1 = eval_int(e, {r: int(i == last) for i, r in enumerate(rngs)})
    if v0 is not None and v1 is not None:
        return v1 - v0
    e0, e1 = at(0), at(1)  # something eval_int does not evaluate (a gathered index): simplify decides
    return e1.arg - e0.arg if e0.op is Ops.CONST and e1.op is Ops.CONST else None


HALF_FLOATS = (dtypes.float16, dtypes.bfloat16)


def access_strides(root: UOp) -> list[tuple[int, ...]] | None:
    """The strides, in `root`'s index space, of every buffer element an elementwise `root` reads, one tuple per read
    (a constant reads none); None when some read is no strided view of its buffer (a PAD's condition, a gather, a
    reduce, a reshape that is no view, a symbolic dim): then no two loops may be merged."""
    memo: dict[UOp, list[tuple[int, ...]] | None] = {}
    for u in root.toposort():
        # (16-bit floats keep their loops: gcc 12 vectorizes their integer conversions in a nest, not in one long
        # loop, where it tries 32 halves per vector, finds no 32-float vector and gives up)
        if any(type(n) is not int for n in u.shape) or u.dtype in HALF_FLOATS:
            return None
        if u.op is Ops.BUFFER:
            memo[u] = [(1,)]
        elif u.op is Ops.CONST or u.op is Ops.DEFINE_VAR:
            memo[u] = []
        elif u.op in ALU:
            parts = [memo[s] for s in u.src]
            memo[u] = None if any(p is None for p in parts) else [st for p in parts for st in p]  # type: ignore[union-attr]
        elif u.op in (Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP) and memo[u.src[0]] is not None:
            memo[u] = _view_strides(u, memo[u.src[0]])  # type: ignore[arg-type]
        else:
            return None
        if memo[u] is None:
            return None
    return memo[root]


def _view_strides(u: UOp, inner: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
    """The read strides `inner` of u's source, seen through movement op u (None: a reshape that is no view)."""
    src_shape = [int(n) for n in u.src[0].shape]
    out = []
    for st in inner:
        if u.op is Ops.RESHAPE:
            got = reshape_strides(src_shape, list(st), [int(n) for n in u.arg])
            if got is None:
                return None
            out.append(tuple(got))
        elif u.op is Ops.PERMUTE:
            out.append(tuple(st[i] for i in u.arg))
        elif u.op is Ops.EXPAND:
            out.append(tuple(0 if a != b else x for a, b, x in zip(src_shape, u.arg, st, strict=True)))
        elif u.op is Ops.FLIP:
            out.append(tuple(-x if f else x for f, x in zip(u.arg, st, strict=True)))
        else:  # SHRINK moves the start, not the strides
            out.append(st)
    return out


def merged_shape(root: UOp) -> tuple[int, ...]:
    """`root`'s shape with each run of adjacent dims that every read walks in order (stride of a dim = its size
    times the stride of the next, in every buffer read) merged into one: an elementwise kernel over (128, 32, 14, 14)
    is one loop of 802816, not loops of 14 that gcc vectorizes with remainders (and unrolls at length, slowly).
    Only for an elementwise root without padding or 16-bit floats: anything else keeps its shape."""
    shape = [int(n) for n in root.shape] if all(type(n) is int for n in root.shape) else []
    if len(shape) < 2 or (reads := access_strides(root)) is None:
        return tuple(root.shape)
    dims = [k for k, n in enumerate(shape) if n != 1]  # a dim of size 1 is no loop: it joins either neighbour
    if not dims:
        return (1,)
    merged = [shape[dims[-1]]]
    for a, b in zip(dims[-2::-1], dims[:0:-1], strict=True):  # each non-1 dim with the next one, innermost first
        if all(st[a] == st[b] * shape[b] for st in reads):
            merged[0] *= shape[a]
        else:
            merged.insert(0, shape[a])
    return tuple(merged)


def merged_reduce(x: UOp, n: int) -> tuple[UOp, int]:
    """The source `x` of a reduce over its last n axes, with each run of adjacent reduce axes that every read walks in
    order merged into one, and how many reduce axes are left: a BatchNorm's sum over (N, H, W) of a contiguous
    (N, C, H, W) is over (N, H*W), its leaf one loop along a row of H*W (as merged_shape merges an elementwise
    kernel's loops): the CNN step 0.95-0.96x. Only where the innermost reduce axis is contiguous in every read: merged
    at a stride (a sum over (B, T) of (B, T, C) for each C) the char-GPT step ran 1.01x. `x` as it is when a read is
    no strided view (see access_strides)."""
    reads = access_strides(x) if n > 1 else None
    if not reads or any(st[-1] not in (0, 1) for st in reads):
        return x, n
    lead, shape = len(x.shape) - n, x.shape
    merged = [shape[-1]]
    for a in range(len(shape) - 2, lead - 1, -1):
        if shape[a + 1] != 1 and all(st[a] == st[a + 1] * shape[a + 1] for st in reads):
            merged[0] *= shape[a]
        else:
            merged.insert(0, shape[a])
    return (x, n) if len(merged) == n else (x.reshape((*shape[:lead], *merged)), len(merged))

"""Views and strides on the shape graph: which buffer elements a view reads, asked of the index maps.

`push_views` moves views through ALU ops so each operand's own chain of views is visible; `operand_views` lists
those chains; `last_axis_stride` is the distance in memory between neighbours along one axis of a view.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

from uopc.uop import ALU, MOVEMENT, STORED, AxisType, Ops, RangeArg, UOp
from uopc.uop.indexing import flat_index
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
def last_axis_stride(view: UOp, base: UOp, axis: int = -1) -> int | None:
    """Distance in memory between view[..., k] and view[..., k+1] (along `axis`, the last by default), or None
    if the view is not affine there.

    The index maps are the stride oracle: the view's flat index into `base` over symbolic loop indices, evaluated
    at k=0 and k=1.
    """
    if not view.shape or view.shape[axis] == 1:  # a 0-d view (e.g. reshape to ()) has no last axis to stride
        return 0
    rngs = tuple(UOp(Ops.RANGE, (UOp.const(s),), RangeArg(i, AxisType.LOOP)) for i, s in enumerate(view.shape))
    e = flat_index(view, base, rngs)
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

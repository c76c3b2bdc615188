"""The layout pass on the shape graph: stage operands whose reduce axis is strided into contiguous copies.

    (A @ B).sum over k reads B down its columns   -->   STAGE(B.T): one transposing copy, then unit-stride reads

`last_axis_stride` asks rangeify for the stride a view reads with; `push_views` moves views through ALU ops so
each operand's own chain of views is visible.
"""

from __future__ import annotations

from uopc.helpers import prod
from uopc.machine import Machine
from uopc.opt.gemm import pack_matmuls, split_k, uses_microkernel
from uopc.opt.strides import last_axis_stride, operand_views, push_views
from uopc.uop import Ops, UOp
from uopc.uop.rewrite import graph_rewrite_all

__all__ = ["layout_pass", "push_views"]


def layout_pass(roots: list[UOp], machine: Machine) -> list[UOp]:
    """Copy operands whose reduce axis is strided into a contiguous temp (a STAGE) before they are broadcast.

    The copy costs O(operand); the reduce it feeds is usually much bigger. Only operands strictly smaller
    than the reduce input are staged (measured: staging a broadcast product cost more
    than the strided reads it saved).
    """
    roots = graph_rewrite_all(roots, push_views)
    # a long reduction into a small output is split so every thread has a part (then summed)
    # (a root split_k left alone is already rewritten: walking it again would change nothing)
    split = list(split_k(roots, machine))
    changed = [i for i, (r, o) in enumerate(zip(split, roots, strict=True)) if r is not o]
    if changed:
        for i, r in zip(changed, graph_rewrite_all([split[i] for i in changed], push_views), strict=True):
            split[i] = r
    roots = split
    # a matmul gets its operands packed into panels for the register-blocked microkernel (uopc.opt.gemm)
    roots = pack_matmuls(roots, machine)
    todo: set[UOp] = set()
    for r in UOp(Ops.SINK, tuple(roots)).toposort():
        if r.op is not Ops.REDUCE or uses_microkernel(r, machine):
            continue
        for view, base in operand_views(r.src[0]):
            s = last_axis_stride(view, base)
            if s in (0, 1, None):
                continue
            c = view
            while c.op is Ops.EXPAND:  # stage before the broadcast
                c = c.src[0]
            if prod(c.shape) > prod(base.shape) or prod(c.shape) >= prod(r.src[0].shape) or c in todo:
                continue
            staged = UOp(Ops.STAGE, (c,))
            if last_axis_stride(view.substitute({c: staged}), staged) == 1:
                todo.add(c)
    return UOp.wrap(roots, todo, lambda n: UOp(Ops.STAGE, (n,))) if todo else roots

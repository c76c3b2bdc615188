"""Lowering a Winograd transform: a WINOGRAD body -> a SINK the renderer writes as one loop over tiles.

    WINOGRAD(x view)             ->  SINK(WINOGRAD(buf0, out buf; WinogradKernel(...)))
    relu(WINOGRAD(y view) + r)   ->  SINK(WINOGRAD(buf0, out buf, relu(out[i] + r[i]); WinogradKernel(...)))

As for fused attention (uopc.codegen.attention), the loops are fixed (channel and image on threads, tiles inside,
each tile's two small products unrolled with the matrices' constants) and only sizes and strides vary, so lowering
measures the source: an affine view of a buffer (the scheduler stages any other, uopc.schedule.fusion), whose
offset and strides go into the record uopc.renderer.winograd turns into C.

An output transform may carry an epilogue: the elementwise ops of the one kernel that reads it
(uopc.schedule.epilogues.winograd_epilogues). Its value at output (n, k, p), p the position in the OH x OW plane, is
what rangeify makes of that kernel's body there, with the transform replaced by a read of the output buffer at the
same element: the renderer applies it to the outputs the transform has just stored, in place. The three loops of the
index are RANGEs 0-2 of the expression (the lowered node's third source), which the renderer names after its own.
"""

from __future__ import annotations

from typing import NamedTuple

from uopc.codegen.rangeify import Ctx, rangeify
from uopc.helpers import prod
from uopc.uop import Ops, UOp, Winograd
from uopc.uop.indexing import affine_view, ravel
from uopc.uop.symbolic import simplify
from uopc.uop.winograd import winograd_of

__all__ = ["WinogradKernel", "lower_winograd"]


class WinogradKernel(NamedTuple):
    """The arg of a lowered WINOGRAD: everything its C depends on (uopc.renderer.winograd)."""

    op: Winograd
    src_shape: tuple[int, ...]  # the input (N, C, H, W), or the products (alpha^2, K, tiles)
    offset: int  # where the source's element (0, ...) is in its buffer
    strides: tuple[int, ...]  # per dim of src_shape, in elements


def lower_winograd(body: UOp, out: UOp) -> UOp:
    """The lowered SINK of one WINOGRAD body whose source is a view of a BUFFER, writing BUFFER `out`; or of an
    output transform's epilogue, elementwise ops over one (see the module's docstring)."""
    node = winograd_of(body)
    if node is None:
        raise RuntimeError(f"winograd: a {body.op} body computes no transform")
    s = node.src[0]
    b = s
    while b.op is not Ops.BUFFER:
        b = b.src[0]
    av = affine_view(s, b)
    if av is None:
        raise RuntimeError(f"winograd: source {s.shape} is not an affine view of a buffer (it must be staged)")
    if prod(node.shape) >= 1 << 31 or prod(b.arg.shape) >= 1 << 31:
        raise ValueError(f"winograd: {s.shape} -> {node.shape} is too large for one kernel")
    arg = WinogradKernel(node.arg, tuple(int(d) for d in s.shape), av[0], tuple(av[1]))
    epilogue = () if node is body else (_epilogue(body, node, out),)
    return UOp(Ops.SINK, (UOp(Ops.WINOGRAD, (b, out, *epilogue), arg),))


def _epilogue(body: UOp, node: UOp, out: UOp) -> UOp:
    """The scalar value of `body` at output (n, k, p) of (N, K, OH * OW), the RANGEs 0-2 of a fresh lowering context,
    with output transform `node` read as `out` at that element: a function of the position in the plane, so that the
    renderer applies it over whole planes or rows in one loop."""
    if node.arg.kind != "out" or body.shape != node.shape or len(body.shape) != 4:
        raise RuntimeError(f"winograd: only an output transform takes an epilogue, at its own shape: {body.shape}")
    ctx = Ctx()
    N, K, OH, OW = body.shape
    n, k, p = ctx.rng(N), ctx.rng(K), ctx.rng(OH * OW)
    idx = (n, k, p // OW, p % OW)
    value = simplify(rangeify(body.substitute({node: out.reshape(node.shape)}), idx, ctx))
    own = simplify(ravel(idx, node.shape))
    for u in value.toposort():
        if u.op is Ops.INDEX and u.src[0] is out and (len(u.src) > 2 or u.src[1] is not own):
            raise RuntimeError("winograd: an epilogue reads the transform at another element than its own")
    return value

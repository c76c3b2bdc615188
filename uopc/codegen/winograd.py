"""Lowering a Winograd transform: a WINOGRAD body -> a SINK the renderer writes as one loop over tiles.

    WINOGRAD(x view)  ->  SINK(WINOGRAD(buf0, out buf; WinogradKernel(...)))

As for fused attention (uopc.codegen.attention), the loops are fixed (channel and image on threads, tiles inside,
each tile's two small products unrolled with the matrices' constants) and only sizes and strides vary, so lowering
measures the source: an affine view of a buffer (the scheduler stages any other, uopc.schedule.fusion), whose
offset and strides go into the record uopc.renderer.winograd turns into C.
"""

from __future__ import annotations

from typing import NamedTuple

from uopc.helpers import prod
from uopc.uop import Ops, UOp, Winograd
from uopc.uop.indexing import affine_view

__all__ = ["WinogradKernel", "lower_winograd"]


class WinogradKernel(NamedTuple):
    """The arg of a lowered WINOGRAD: everything its C depends on (uopc.renderer.winograd)."""

    op: Winograd
    src_shape: tuple[int, ...]  # the input (N, C, H, W), or the products (alpha^2, K, tiles)
    offset: int  # where the source's element (0, ...) is in its buffer
    strides: tuple[int, ...]  # per dim of src_shape, in elements


def lower_winograd(body: UOp, out: UOp) -> UOp:
    """The lowered SINK of one WINOGRAD body whose source is a view of a BUFFER, writing BUFFER `out`."""
    s = body.src[0]
    b = s
    while b.op is not Ops.BUFFER:
        b = b.src[0]
    av = affine_view(s, b)
    if av is None:
        raise RuntimeError(f"winograd: source {s.shape} is not an affine view of a buffer (it must be staged)")
    if prod(body.shape) >= 1 << 31 or prod(b.arg.shape) >= 1 << 31:
        raise ValueError(f"winograd: {s.shape} -> {body.shape} is too large for one kernel")
    arg = WinogradKernel(body.arg, tuple(int(d) for d in s.shape), av[0], tuple(av[1]))
    return UOp(Ops.SINK, (UOp(Ops.WINOGRAD, (b, out), arg),))

"""Lowering a fused attention kernel: an ATTENTION body -> a SINK the renderer writes as one blocked loop nest.

    ATTENTION(q view, k view, v view)      ->  SINK(ATTENTION(buf0, buf0, buf0, out buf; AttnKernel(...)))

Unlike the other kernels, attention is not lowered op by op: its loops (query blocks on threads, key blocks streamed
with a running max and sum, the packed key and value blocks) are fixed, and what varies is sizes, strides and masks.
So lowering only measures: each source must be an affine view of a buffer (the scheduler stages any other source,
uopc.schedule.fusion.stage_attention_operands; uopc.uop.indexing.affine_view), and its offset and strides go into
the AttnKernel record that uopc.renderer.attention turns into C. A symbolic key length (a KV cache's positions
seen) is a DEFINE_VAR source.
"""

from __future__ import annotations

from typing import NamedTuple

from uopc.helpers import prod
from uopc.uop import Attention, Ops, UOp
from uopc.uop.attention import widened_source
from uopc.uop.dtype import dtypes
from uopc.uop.indexing import affine_view
from uopc.uop.variable import Variable

__all__ = ["AttnKernel", "SourceView", "lower_attention"]


ROWS_MAX, ROWS_MIN = 64, 8


class SourceView(NamedTuple):
    """Where element (*lead, row, col) of one source is in its buffer: offset + lead . strides + row * rs + col * cs."""

    offset: int
    lead: tuple[int, ...]
    row: int
    col: int


class AttnKernel(NamedTuple):
    """The arg of a lowered ATTENTION: everything its C depends on (uopc.renderer.attention)."""

    op: Attention
    lead: tuple[int, ...]  # the query's leading dims (batch, heads, ...)
    L: int
    S: int | Variable
    E: int
    Ev: int
    views: tuple[SourceView, ...]  # per source, in the order of the ATTENTION's sources
    width: int  # floats per SIMD vector the C is blocked for
    rows: int  # query rows per task (a block of keys and values is packed once for them all)


def _buffer_under(view: UOp) -> UOp:
    u = view
    while u.op is not Ops.BUFFER:
        u = u.src[0]
    return u


def query_rows(tasks_per_row_block: int, L: int, cores: int) -> int:
    """Query rows per task: as many as keep every core busy with several tasks (up to ROWS_MAX), since each task
    packs every key block once for its rows."""
    rows = ROWS_MAX
    while rows > ROWS_MIN and tasks_per_row_block * -(-L // rows) < 4 * cores:
        rows //= 2
    return rows


def lower_attention(body: UOp, out: UOp, width: int, cores: int = 1) -> UOp:
    """The lowered SINK of one ATTENTION body whose sources are views of BUFFERs, writing BUFFER `out`, blocked for
    SIMD vectors of `width` floats and `cores` threads."""
    q, k = body.src[0].shape, body.src[1].shape
    v = body.src[2].shape if body.arg.kind != "lse" else k
    views, bufs = [], []
    for i, s in enumerate(body.src):
        s = widened_source(body, s)  # a 16-bit float source: read as stored, widened in registers
        b = _buffer_under(s)
        av = affine_view(s, b)
        if av is None:
            raise RuntimeError(f"attention: source {s.shape} is not an affine view of a buffer (it must be staged)")
        st = av[1]
        if body.arg.kind in ("dq", "ds", "dkv") and i in (4, 5):  # lse and delta: one value per row
            views.append(SourceView(av[0], st[:-1], st[-1], 0))
        else:
            views.append(SourceView(av[0], st[:-2], st[-2], st[-1]))
        bufs.append(b)
    S = k[-2]
    defs = [UOp(Ops.DEFINE_VAR, (), S, dtypes.int32)] if isinstance(S, Variable) else []
    rows = query_rows(prod(q[:-2]), q[-2], cores)
    arg = AttnKernel(body.arg, tuple(q[:-2]), q[-2], S, q[-1], v[-1], tuple(views), width, rows)
    if prod(q[:-2]) * q[-2] >= 1 << 31 or out.arg.shape[0] >= 1 << 31:
        raise ValueError(f"attention: {q} is too large for one kernel")
    return UOp(Ops.SINK, (UOp(Ops.ATTENTION, (*bufs, out, *defs), arg),))

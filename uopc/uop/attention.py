"""Building ATTENTION nodes (ops.Attention): the one place their sources' shapes are checked.

    attention_uop(q, k, v, Attention("out", scale=0.125, causal=True))     # (B, H, L, E) x2, (B, H, S, Ev)

The front end (Tensor.scaled_dot_product_attention, its gradient rule) and the scheduler's recognition of the
softmax(q k^T) v pattern (uopc.schedule.attention) build them here.
"""

from __future__ import annotations

from uopc.uop.dtype import dtypes
from uopc.uop.ops import Attention, Ops
from uopc.uop.uop import UOp

__all__ = ["HEAD_MAX", "attention_uop", "fused_attention", "heads_first", "widened_source"]


def attention_uop(q: UOp, k: UOp, v: UOp | None, arg: Attention, *rest: UOp) -> UOp:
    """ATTENTION(q, k, [v], *rest) (see ops.Attention for the sources of each kind), its shapes checked."""
    srcs = (q, k, *([v] if v is not None else []), *rest)
    qs, kk = q.shape, k.shape
    if len(qs) < 3 or len(kk) != len(qs) or qs[-1] != kk[-1] or arg.groups < 1:
        raise ValueError(f"attention: query {qs} and key {kk} do not fit")
    if kk[:-3] != qs[:-3] or qs[-3] != kk[-3] * arg.groups:
        raise ValueError(f"attention: query {qs} and key {kk} do not fit with {arg.groups} query heads per key head")
    if v is not None and (v.shape[:-1] != kk[:-1]):
        raise ValueError(f"attention: key {kk} and value {v.shape} do not fit")
    want = {"out": 3, "lse": 2, "dq": 6, "ds": 6, "dkv": 6}.get(arg.kind)
    if want is None or len(srcs) != want + bool(arg.mask):
        raise ValueError(f"attention: kind {arg.kind!r} with mask {arg.mask!r} does not take {len(srcs)} sources")
    if arg.mask and srcs[-1].shape != qs[:-1] + kk[-2:-1]:
        raise ValueError(f"attention: mask {srcs[-1].shape} is not (*lead, L, S) = {qs[:-1] + kk[-2:-1]}")
    return UOp(Ops.ATTENTION, srcs, arg, q.dtype)


def widened_source(node: UOp, s: UOp) -> UOp:
    """What a fused attention kernel reads of its source `s`: the 16-bit float view under a widening to float32 (a
    bfloat16 KV cache read as float32), which it loads and widens in registers (uopc.renderer.attention); else `s`.
    Staging reads through it (uopc.schedule.fusion) and so does lowering (uopc.codegen.attention)."""
    if node.op is Ops.ATTENTION and s.op is Ops.CAST and s.dtype is dtypes.float32 and s.src[0].dtype.is_16bit_float:
        return s.src[0]
    return s


# the largest head size the fused kernel takes: its packed key and value blocks live in L1, one set per thread
HEAD_MAX = 256


def _broadcast(*shapes: tuple) -> tuple | None:
    n = max(len(s) for s in shapes)
    out = []
    for dims in zip(*((1,) * (n - len(s)) + tuple(s) for s in shapes), strict=True):
        big = {d for d in dims if d != 1}
        if len(big) > 1:
            return None
        out.append(big.pop() if big else 1)
    return tuple(out)


def fused_attention(
    q: UOp, k: UOp, v: UOp, mask: UOp | None, scale: float, causal: bool, groups: int = 1
) -> UOp | None:
    """softmax(q k^T * scale + mask) v as an ATTENTION node over q (..., L, E), k (..., S, E), v (..., S, Ev) and
    the mask (bool: keep, float: added; broadcast to (..., L, S)), with the leading dims broadcast (at least one:
    heads), its output (*batch, L, H, Ev); or None where the fused kernel does not apply (not float32, a head over
    HEAD_MAX, a symbolic query length, an empty tensor, shapes that do not broadcast)."""
    f32 = dtypes.float32
    if q.dtype is not f32 or k.dtype is not f32 or v.dtype is not f32 or type(q.shape[-2]) is not int:
        return None
    if max(q.shape[-1], v.shape[-1]) > HEAD_MAX or 0 in q.shape + k.shape + v.shape or k.shape[-2] != v.shape[-2]:
        return None
    if mask is not None and not (mask.dtype.is_bool or mask.dtype is f32):
        return None
    L, S = q.shape[-2], k.shape[-2]
    rank = max(q.ndim, k.ndim, v.ndim, 3, mask.ndim if mask is not None else 0)
    q, k, v = (t.reshape((1,) * (rank - t.ndim) + t.shape) for t in (q, k, v))
    kv_lead = _broadcast(k.shape[:-2], v.shape[:-2])
    lead = _broadcast(q.shape[:-2], kv_lead[:-1] + (kv_lead[-1] * groups,)) if kv_lead is not None else None
    if lead is None or lead[-1] % groups:
        return None
    kv_lead = lead[:-1] + (lead[-1] // groups,)
    if any(_broadcast(a, b) != b for a, b in ((q.shape[:-2], lead), (k.shape[:-2], kv_lead), (v.shape[:-2], kv_lead))):
        return None
    q, k, v = q.expand(lead + q.shape[-2:]), k.expand(kv_lead + k.shape[-2:]), v.expand(kv_lead + v.shape[-2:])
    rest = ()
    if mask is not None:
        m = mask.reshape((1,) * (rank - mask.ndim) + mask.shape)
        if _broadcast(m.shape, lead + (L, S)) != lead + (L, S):
            return None
        rest = (m.expand(lead + (L, S)),)
    kind = "" if mask is None else "bool" if mask.dtype.is_bool else "float"
    return attention_uop(q, k, v, Attention("out", float(scale), causal, 0, kind, groups), *rest)


def heads_first(out: UOp) -> UOp:
    """An attention output (*batch, L, H, Ev), as stored, seen as (*batch, H, L, Ev)."""
    n = out.ndim
    return out.permute((*range(n - 3), n - 2, n - 3, n - 1))

"""Attention written out, recognized: softmax(q @ k^T * scale [+ mask | masked to -inf]) @ v becomes one fused
ATTENTION (uopc.uop.attention), whatever front end built it: a hand-written attention, an ONNX export's MatMul, Div,
Add, Softmax, MatMul, or scaled_dot_product_attention with dropout off but built by other code.

    REDUCE(ADD)(MUL(expand(P), expand(v^T)))         P = e * 1/sum(e),  e = 2^((X - max X) * log2 e)
                                                    X = scale * REDUCE(ADD)(MUL(expand(q), expand(k)))  [+ mask]

It applies only where nothing else reads the scores or the probabilities (a training step's backward reads them:
there the graph stays as written), for float32 operands and a constant scale. The scheduler asks first, with an
optimizer (OPT=0 keeps Chapter 7's cuts).
"""

from __future__ import annotations

from uopc.uop import Ops, UOp
from uopc.uop.attention import fused_attention, heads_first
from uopc.uop.dtype import dtypes

__all__ = ["recognize_attention"]

LOG2E = 1.4426950408889634


def _unexpand(u: UOp) -> UOp:
    return u.src[0] if u.op is Ops.EXPAND else u


def _sum_of_product(r: UOp) -> tuple[UOp, UOp] | None:
    """The operands (before broadcasting) of REDUCE(ADD, 1)(MUL(a, b))."""
    if r.op is not Ops.REDUCE or r.arg != (Ops.ADD, 1) or r.src[0].op is not Ops.MUL:
        return None
    return _unexpand(r.src[0].src[0]), _unexpand(r.src[0].src[1])


def _const(u: UOp) -> float | None:
    while u.op in (Ops.EXPAND, Ops.RESHAPE):
        u = u.src[0]
    return float(u.arg) if u.op is Ops.CONST else None


def _other(m: UOp, x: UOp) -> UOp | None:
    """The operand of binary m that is not x (None if x is not one)."""
    return m.src[1] if m.src[0] is x else m.src[0] if m.src[1] is x else None


def _row_stat(u: UOp, rop: Ops, x: UOp, seen: list[UOp]) -> bool:
    """Is u EXPAND(RESHAPE(REDUCE(rop, 1)(x))), the keepdim row statistic of x broadcast back along the row?"""
    chain = [u]
    while chain[-1].op in (Ops.EXPAND, Ops.RESHAPE):
        chain.append(chain[-1].src[0])
    r = chain[-1]
    if r.op is Ops.REDUCE and r.arg == (rop, 1) and r.src[0] is x:
        seen.extend(chain)
        return True
    return False


def _softmax_input(p: UOp, seen: list[UOp]) -> UOp | None:
    """X when p is softmax(X, -1) as Tensor.softmax builds it: e * recip(sum(e)), e = exp2((X - max X) * log2 e)."""
    if p.op is not Ops.MUL:
        return None
    for e, inv in ((p.src[0], p.src[1]), (p.src[1], p.src[0])):
        if e.op is not Ops.EXP2 or inv.op is not Ops.RECIP or e.src[0].op is not Ops.MUL:
            continue
        lin = e.src[0]
        shifted = next((s for s in lin.src if s.op is Ops.ADD), None)
        if shifted is None or _const(_other(lin, shifted) or shifted) != LOG2E:
            continue
        for x, neg in ((shifted.src[0], shifted.src[1]), (shifted.src[1], shifted.src[0])):
            if neg.op is not Ops.MUL or (c := next((s for s in neg.src if _const(s) == -1.0), None)) is None:
                continue
            part: list[UOp] = [p, e, inv, lin, shifted, neg]
            if _row_stat(_other(neg, c), Ops.MAX, x, part) and _row_stat(inv.src[0], Ops.ADD, e, part):
                seen.extend(part)
                if x.op is Ops.STAGE and x.arg is None:  # an input staged for the softmax alone (ONNX's Softmax)
                    seen.append(x)
                    x = x.src[0]
                return x
    return None


def _scores(x: UOp, seen: list[UOp]) -> tuple[UOp, UOp, float, UOp | None] | None:
    """(q, k, scale, mask) when x is scale * q @ k^T, masked (a bool keep mask: where(m, s, -inf) or
    where(~m, -inf, s), as masked_fill writes it) or plus a float mask, else None."""
    mask = None
    seen.append(x)
    if x.op is Ops.WHERE:
        cond, a, b = x.src
        if _const(a) == float("-inf"):  # negated under its broadcast, so that it stays as small as it was given
            base = cond
            while base.op in (Ops.EXPAND, Ops.RESHAPE, Ops.PERMUTE):
                base = base.src[0]
            if base.op is Ops.XOR and _const(base.src[1]) == 1.0:  # masked_fill(~m): the negation undone
                keep = cond.substitute({base: base.src[0]})
            else:
                keep = cond.substitute({base: base.alu(Ops.XOR, UOp.const(True, dtypes.bool))})
            x = b
        elif _const(b) == float("-inf"):
            keep, x = cond, a
        else:
            return None
        mask = keep
        seen.append(x)
    elif x.op is Ops.ADD:
        for s, m in ((x.src[0], x.src[1]), (x.src[1], x.src[0])):
            if _qk(_scale(s)[0]) is not None:
                mask, x = m, s
                seen.append(x)
                break
        else:
            return None
    qk, scale, part = _scale(x)
    operands = _qk(qk)
    if operands is None:
        return None
    seen.extend([*part, qk])
    return operands[0], operands[1], scale, mask


def _scale(x: UOp) -> tuple[UOp, float, list[UOp]]:
    if x.op is Ops.MUL:
        for s, c in ((x.src[0], x.src[1]), (x.src[1], x.src[0])):
            if (v := _const(c)) is not None:
                return s, v, [x]
    return x, 1.0, []


def _qk(r: UOp) -> tuple[UOp, UOp] | None:
    """(q (..., L, E), k (..., S, E)) when r is the matmul q @ k^T as Tensor.matmul builds it: the sum over E of
    q (..., L, 1, E) times k (..., 1, S, E)."""
    ops = _sum_of_product(r)
    if ops is None:
        return None
    for a, b in (ops, ops[::-1]):
        if a.ndim >= 3 and a.shape[-2] == 1 and b.shape[-3] == 1 and a.shape[-1] == b.shape[-1]:
            return a.reshape(a.shape[:-2] + a.shape[-1:]), b.reshape(b.shape[:-3] + b.shape[-2:])
    return None


def _attention_of(r: UOp) -> tuple[UOp, list[UOp]] | None:
    """The fused ATTENTION (as r's shape) and the pattern's inner nodes, when r is softmax(scores) @ v."""
    ops = _sum_of_product(r)
    if ops is None:
        return None
    for pv, vt in (ops, ops[::-1]):
        if pv.op is not Ops.RESHAPE or pv.ndim < 3 or pv.shape[-2] != 1 or vt.shape[-3] != 1:
            continue
        seen: list[UOp] = [r, r.src[0], pv, *(s for s in r.src[0].src if s.op is Ops.EXPAND and s.src[0] is pv)]
        x = _softmax_input(pv.src[0], seen)
        if x is None or (sc := _scores(x, seen)) is None:
            continue
        q, k, scale, mask = sc
        v = vt.reshape(vt.shape[:-3] + vt.shape[-2:])
        v = v.permute((*range(v.ndim - 2), v.ndim - 1, v.ndim - 2))
        out = fused_attention(q, k, v, mask, scale, False)
        if out is None:
            return None
        return heads_first(out).reshape(r.shape), seen
    return None


def recognize_attention(roots: list[UOp]) -> list[UOp]:
    """Replace each softmax(scores) @ v whose scores and probabilities nothing else reads by a fused ATTENTION."""
    topo = UOp(Ops.SINK, tuple(roots)).toposort()
    hits = [(u, hit) for u in topo if u.op is Ops.REDUCE and u.dtype is dtypes.float32 and (hit := _attention_of(u))]
    if not hits:  # (most graphs: no readers map to build)
        return roots
    users: dict[UOp, set[UOp]] = {}
    for u in topo:
        for s in u.src:
            users.setdefault(s, set()).add(u)
    rootset = set(roots)
    found: dict[UOp, UOp] = {}
    for u, (fused, inner) in hits:
        inside = set(inner)
        if all(n is u or (n not in rootset and users.get(n, set()) <= inside) for n in inner):
            found[u] = fused
    if not found:
        return roots
    return list(UOp(Ops.SINK, tuple(roots)).substitute(found).src)

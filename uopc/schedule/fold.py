"""Fold a factor per output channel of a convolution into its weight: BatchNorm in eval mode, a channel scale.

    bn(conv(x, w) + b) = (conv(x, w) + b - mean) * invstd * gamma + beta
                       = conv(x, w * s) + (b - mean) * s + beta              s = invstd * gamma, per channel

A convolution's output channel k is linear in its filter w[k], so a factor that depends only on the channel moves
onto the filter, whichever kernels compute the convolution (a GEMM, Winograd's transforms and products, a direct
loop). The folded weight and the shift are computed from the model's weights and statistics alone, so a plan keeps
them from call to call (uopc.engine.kept) as it keeps a weight's packing or Winograd transform: per call, the
output's reader adds one term per element where it computed a subtract, two multiplies and an add (and the
statistics' square root per element or per row). PyTorch (torch.fx's fuser) and onnxruntime fold the same way.

A convolution is found by its autodiff marker (CUSTOM_GRAD "conv": Tensor.conv2d marks every convolution's value
with its input and weight). The scheduler folds only what it would not compute twice: the convolution, and every
add between it and the factor, has one reader (a convolution also read by a residual add keeps its weight).

uopc.schedule.cut folds only under UOPC_FOLD_BN=1: on the machines measured the fold did not make ResNet-18 or
MobileNetV2 faster, and each folded weight is one more kernel to compile on a model's first call (docs/design.md).
"""

from __future__ import annotations

from collections import Counter

from uopc.uop import ALU, Ops, UOp
from uopc.uop.dtype import dtypes

__all__ = ["fold_channel_factors"]


def _is_conv(u: UOp) -> bool:
    return u.op is Ops.CUSTOM_GRAD and u.arg.rule == "conv"


def fold_channel_factors(roots: list[UOp]) -> list[UOp]:
    """The graph with each factor per output channel of a convolution (MUL(conv + shifts per channel, factor))
    folded into the convolution's weight, and the shifts per channel added to it summed into one; the graph itself
    where there is none. Each folded weight and summed shift is staged (a kernel of its own, kept by its plan)."""
    topo = UOp(Ops.SINK, tuple(roots)).toposort()
    if not any(_is_conv(u) for u in topo):
        return roots
    readers = Counter(s for u in topo for s in u.src)
    memo: dict[UOp, UOp | None] = {}  # _per_channel's answers (a graph's elementwise DAG is walked once)
    made: dict[UOp, tuple[UOp, UOp | None]] = {}  # a folded value -> its convolution, its summed shift
    new: dict[UOp, UOp] = {}
    for u in topo[:-1]:
        src = tuple(new[s] for s in u.src)
        n = u if src == u.src else u.replace(src=src)
        readers[n] = readers[u]  # (a rebuilt node has its original's readers)
        if n.op in (Ops.MUL, Ops.ADD) and (folded := _fold(n, readers, memo)) is not None:
            n, conv, shift = folded
            readers[n], readers[conv] = readers[u], 1
            made[n] = (conv, shift)
        new[u] = n
    out = [new[r] for r in roots]
    if not made:
        return roots
    # only the last fold's weight and shift are staged (an earlier one's, as BatchNorm's 1/std before its gamma, is
    # part of them)
    final = set(UOp(Ops.SINK, tuple(out)).toposort())
    todo = {t for v, (conv, shift) in made.items() if v in final for t in (conv.src[2], shift) if t is not None}
    return UOp.wrap(out, todo, lambda t: UOp(Ops.STAGE, (t,)))


def _chain(p: UOp, shape: tuple, readers: Counter, memo: dict) -> tuple[UOp, list[UOp]] | None:
    """p as conv + c1 + c2 .. (adds read once each, every c per channel): the convolution and the c's (each of shape
    (1, C, 1, ..) or a scalar constant), or None."""
    shifts: list[UOp] = []
    while p.op is Ops.ADD and (not shifts or readers[p] == 1):  # (the top add is p itself: its readers stay its)
        a, b = p.src
        if (c := _per_channel(b, shape, memo)) is not None:
            p = a
        elif (c := _per_channel(a, shape, memo)) is not None:
            p = b
        else:
            return None
        shifts.append(c)
    if not _is_conv(p) or readers[p] != 1 or p.shape != shape or any(p in c.toposort() for c in shifts):
        return None
    return p, shifts


def _fold(n: UOp, readers: Counter, memo: dict) -> tuple[UOp, UOp, UOp | None] | None:
    """n = MUL(conv + c1 + .., s) as conv' + (c1 + ..) * s, conv' the convolution of its input with weight * s, or
    n = conv + c1 + c2 + .. as conv + (c1 + c2 + ..): (the new value, its convolution, its shift or None). None
    where n is not that (not per channel, a node read twice, a dtype that would round differently)."""
    shape = n.shape
    if len(shape) < 2 or n.dtype not in (dtypes.float32, dtypes.float64):
        return None
    if n.op is Ops.ADD:
        if (found := _chain(n, shape, readers, memo)) is None or len(found[1]) < 2:
            return None
        conv, (shift, *rest) = found
        for c in rest:
            shift = shift + c
        return conv + (shift.expand(shape) if shift.shape else shift), conv, shift if shift.shape else None
    for p, s in (n.src, n.src[::-1]):
        if readers[p] != 1 or (found := _chain(p, shape, readers, memo)) is None:
            continue
        conv, shifts = found
        x, w = conv.src[1:]
        if w.dtype is not n.dtype or w.shape[:1] != shape[1:2] or x is w:
            continue
        if (scale := _per_channel(s, shape, memo)) is None or conv in scale.toposort():
            continue
        w2 = w * (scale.reshape((shape[1],) + (1,) * (w.ndim - 1)).expand(w.shape) if scale.shape else scale)
        folded = conv.replace(src=(conv.src[0].substitute({w: w2, x: x}), x, w2))  # (x's own graph stays as is)
        if not shifts:
            return folded, folded, None
        shift = shifts[0]
        for c in shifts[1:]:
            shift = shift + c
        shift = shift * scale
        return folded + (shift.expand(shape) if shift.shape else shift), folded, shift if shift.shape else None
    return None


def _per_channel(v: UOp, shape: tuple, memo: dict) -> UOp | None:
    """v (of `shape`, (N, C, *spatial)) as a value of shape (1, C, 1, ..) or a scalar constant, where it is one
    broadcast along every dim but the channel's (a BatchNorm's statistics, reshaped and expanded); else None."""
    if v.op is Ops.CONST and not v.shape:
        return v
    if v.shape != shape or (v.op is not Ops.EXPAND and v.op not in ALU):
        return None
    if v in memo:
        return memo[v]
    memo[v] = None  # (until answered)
    if v.op is Ops.EXPAND:
        t = v.src[0]
        if t.ndim == len(shape) and all(d == 1 for i, d in enumerate(t.shape) if i != 1):
            memo[v] = t.expand((1, shape[1]) + (1,) * (len(shape) - 2))
    else:
        srcs = tuple(_per_channel(s, shape, memo) for s in v.src)
        memo[v] = None if any(s is None for s in srcs) else v.replace(src=srcs)
    return memo[v]

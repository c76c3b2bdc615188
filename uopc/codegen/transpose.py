"""Transposed tiles: W gathers that together read a W x W block of memory become W vector loads and a transpose in
registers.

A kernel that writes along one axis what it reads along another (a channels-last product read as NCHW, a permuted
copy) gets a W x W register tile (uopc.opt.heuristic): its vectors run along the output's rows, while each of its W
copies reads W elements a row apart, a gather (VECTORIZE of scalar loads, as codegen.lanes and codegen.vectorize
build them). Copy a's lane l reads element I_l + a, so the W gathers hold the block whose rows are W vector loads:

    g_a = {x[I_0 + a], x[I_1 + a], ..., x[I_15 + a]}        ->      v_l = *(f32x16*)(x + I_l)      (l = 0..15)
                                                                    g_a = lane a of every v_l: the transpose of v

The transpose is log2(W) stages of two-input shuffles (SHUFFLE, gcc's __builtin_shuffle): each stage swaps the
off-diagonal blocks of every 2h x 2h block of the tile (h = W/2, ..., 1), 4 x 8 x 2 shuffles for 16 x 16 floats
where the gathers took a scalar load and an insert per element. A hand-written C kernel of the transposing read of
a (12544, 64) channels-last tensor (ResNet-18's stem as rows) with a ReLU, 2 threads on the Xeon VM: 0.27-0.29 ms
with scalar loads, 0.24 with the gathers as gcc builds them from the vector initializers, 0.08 transposed in
registers.
"""

from __future__ import annotations

from uopc.codegen.vectorize import buffer_of
from uopc.uop import Ops, UOp

__all__ = ["transpose_gathers", "transpose_lanes"]


def transpose_lanes(w: int) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """The stages of a w x w transpose of vectors r[0..w-1] in place, as (h, lo, hi): for each i with i & h == 0,
    r[i], r[i + h] = shuffle(r[i], r[i + h], lo), shuffle(r[i], r[i + h], hi) (lane indices into the two vectors
    concatenated). Afterwards lane k of r[i] is what lane i of r[k] was."""
    stages, h = [], w // 2
    while h >= 1:
        lo, hi = [], []
        for k in range(w):
            blk, off = k // (2 * h) * 2 * h, k % (2 * h)
            lo.append(blk + off if off < h else w + blk + off - h)
            hi.append(blk + h + off if off < h else w + blk + off)
        stages.append((h, tuple(lo), tuple(hi)))
        h //= 2
    return stages


def _split(i: UOp) -> tuple[UOp | None, int]:
    """An index as (symbolic part, constant offset)."""
    if i.op is Ops.CONST:
        return None, i.arg
    if i.op is Ops.ADD and i.src[1].op is Ops.CONST:
        return i.src[0], i.src[1].arg
    return i, 0


def _lanes(g: UOp, w: int) -> tuple[UOp, tuple[UOp | None, ...], tuple[int, ...]] | None:
    """A gather's buffer, and the symbolic part and constant offset of each lane's index; None for anything else."""
    if g.op is not Ops.VECTORIZE or len(g.src) != w or any(s.op is not Ops.LOAD for s in g.src):
        return None
    idxs = [s.src[0] for s in g.src]
    buf = idxs[0].src[0]
    if any(len(i.src) != 2 or i.src[0] is not buf for i in idxs) or buffer_of(idxs[0]).op is not Ops.BUFFER:
        return None  # gated, or not one buffer's memory
    parts = [_split(i.src[1]) for i in idxs]  # (simplified as each lane was built: codegen.lanes._each_lane)
    return buf, tuple(p[0] for p in parts), tuple(p[1] for p in parts)


def transpose_gathers(nodes: list[UOp], w: int) -> list[UOp]:
    """`nodes` with every family of w gathers that read a w x w block (copy a's lane l at I_l + a) replaced by w
    vector loads transposed in registers."""
    if w < 2 or w & (w - 1):
        return nodes
    families: dict[tuple, dict[int, UOp]] = {}
    for u in UOp(Ops.SINK, tuple(nodes)).toposort():
        if (lanes := _lanes(u, w)) is not None:
            buf, syms, offs = lanes
            families.setdefault((buf, syms, tuple(o - offs[0] for o in offs)), {})[offs[0]] = u
    mapping: dict[UOp, UOp] = {}
    for (buf, _, _), by_off in families.items():
        for start in sorted(by_off):
            run = [by_off.get(start + a) for a in range(w)]
            if any(g is None or g in mapping for g in run):
                continue
            vt = run[0].dtype
            rows = [
                UOp(Ops.LOAD, (UOp(Ops.INDEX, (buf, s.src[0].src[1]), None, s.src[0].dtype.vec(w)),), None, vt)
                for s in run[0].src
            ]
            for h, lo, hi in transpose_lanes(w):
                for i in range(w):
                    if not i & h:
                        a, b = rows[i], rows[i + h]
                        rows[i], rows[i + h] = (UOp(Ops.SHUFFLE, (a, b), lo, vt), UOp(Ops.SHUFFLE, (a, b), hi, vt))
            mapping.update(zip(run, rows))  # type: ignore[arg-type]
    if not mapping:
        return nodes
    return list(UOp(Ops.SINK, tuple(nodes)).substitute(mapping).src)

"""Transposed tiles: W loads that together read a W x W block of memory become W vector loads and a transpose in
registers.

A kernel that writes along one axis what it reads along another (a permuted copy; a channels-last product read as
NCHW) may get a W x W register tile (uopc.opt.heuristic._transpose_axis): its vectors run along the output's rows,
while each of its W copies reads W elements a row apart, which would be a gather (a VECTORIZE of W scalar loads).
Copy a's lane l reads element I_l + a, so together the W copies read the block whose rows are W vector loads:

    g_a = {x[I_0 + a], x[I_1 + a], ..., x[I_15 + a]}        ->      v_l = *(f32x16*)(x + I_l)      (l = 0..15)
                                                                    g_a = lane a of every v_l: the transpose of v

codegen.lanes asks for the tiles before it widens a region's stores (transposed_tiles): the W scalar loads of one
buffer whose indices step S != 1 with the LANE (I_l = I_0 + l*S) and differ only in a constant a = 0..W-1 are a tile,
and each one's vector is the tile's; no lane of them is built alone (built as gathers and matched afterwards, the
256 scalar loads and their indices of a 16 x 16 tile cost 20-50 ms of lowering).

The transpose is log2(W) stages of two-input shuffles (SHUFFLE; renderer.c's UOPC_SHUFFLE: gcc's __builtin_shuffle,
clang's __builtin_shufflevector): each stage swaps the off-diagonal blocks of every 2h x 2h block of the tile
(h = W/2, ..., 1), 4 x 8 x 2 shuffles for 16 x 16 floats where the gathers took a scalar load and an insert per
element. The transposing read of a (12544, 64) tensor with a ReLU, 2 threads on the Xeon VM: 0.27-0.29 ms with
scalar loads, 0.24 in hand-written C with gcc's own gathers from vector initializers, 0.08 there transposed in
registers, 0.11-0.12 as uopc's tile.
"""

from __future__ import annotations

from uopc.codegen.vectorize import index_step, split_offset
from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes

__all__ = ["transpose_lanes", "transposed_tiles"]


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


def transposed_tiles(stores: list[UOp], lane: UOp, w: int, index_of) -> dict[UOp, UOp]:
    """{scalar load: its vector} for every tile of w loads among `stores` (the module docstring): load a's index
    is b + a + S*LANE (S != 1, b free of the LANE) for a = 0..w-1. `index_of(idx)` is an INDEX's index as the caller
    simplified it. Empty for a width that is no power of two."""
    if w < 2 or w & (w - 1):
        return {}
    zero = UOp.const(0, lane.dtype)
    tiles: dict[tuple, dict[int, UOp]] = {}
    bases: dict[UOp, UOp] = {}
    for u in UOp(Ops.SINK, tuple(stores)).toposort():
        if u.op is not Ops.LOAD or len(u.src[0].src) != 2 or u.src[0].src[0].op is not Ops.BUFFER:
            continue  # (gated loads and local arrays are read lane by lane)
        if u.dtype is dtypes.bool:
            continue  # gcc has no vectors of _Bool (a cumsum's triangular mask): read lane by lane
        i = index_of(u.src[0])
        if (step := index_step(i, lane)) in (None, 0, 1):
            continue
        base, off = split_offset(i)
        if base is None:
            continue
        if (b0 := bases.get(base)) is None:
            b0 = bases[base] = base.substitute({lane: zero})
        tiles.setdefault((u.src[0].src[0], b0, step, u.dtype), {})[off] = u
    out: dict[UOp, UOp] = {}
    for (buf, b0, step, dt), by_off in tiles.items():
        for start in sorted(by_off):
            run = [by_off.get(start + a) for a in range(w)]
            if any(x is None or x in out for x in run):
                continue
            vt, idx = dt.vec(w), run[0].src[0]  # type: ignore[union-attr]
            rb, rc = split_offset(b0)
            rows = []
            for row in range(w):  # row l: the tile's elements b + l*S .. + w-1, one vector load
                c = UOp.const(rc + start + row * step, lane.dtype)
                at = c if rb is None else rb + c
                rows.append(UOp(Ops.LOAD, (UOp(Ops.INDEX, (buf, at), None, idx.dtype.vec(w)),), None, vt))
            for h, lo, hi in transpose_lanes(w):
                for k in range(w):
                    if not k & h:
                        a, b = rows[k], rows[k + h]
                        rows[k], rows[k + h] = UOp(Ops.SHUFFLE, (a, b), lo, vt), UOp(Ops.SHUFFLE, (a, b), hi, vt)
            out.update(zip(run, rows))  # type: ignore[arg-type]
    return out

"""The shapes of loop nests, apart from what they compute: the levels a long reduction runs in, the regions an
output splits into under register tiles and the loops of each (the ones they share, cache blocks, copies), a merged
loop split back into its factors, and the merging of the END of loops that unrolled copies share.
uopc.codegen.rangeify builds every kernel's loops with these.

    levels((4096,))                 -> [[(0, 512)], [(0, 8)]]       a leaf of 512 elements, then 8 leaf sums
    regions((10, 20), {0: 4, 1: 8}) -> whole tiles, then the remainder rows and columns, each a tile and a nest
    split_loops: r in range(576) read as r // 9, (r // 3) % 3, r % 3   -> loops (64, 3, 3)
    size_argument: for (i = 0; i < 200704; i++) ...                          -> for (i = 0; i < uopc_n; i++) ...
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from uopc.helpers import prod
from uopc.opt.opts import Opts
from uopc.uop import AxisType, Ops, UOp
from uopc.uop.dtype import dtypes
from uopc.uop.symbolic import simplify
from uopc.uop.variable import SizeArg, Variable

__all__ = [
    "LEAF",
    "LEVEL",
    "PARALLEL_MIN",
    "REGION_THREAD_MIN",
    "TILE_LEVELS_MIN",
    "axis_order",
    "axis_parts",
    "block_loops",
    "combos",
    "largest_divisor",
    "levels",
    "merge_ends",
    "output_parts",
    "region_opts",
    "regions",
    "shared_loops",
    "size_argument",
    "split_loops",
]


# A float sum accumulates in levels: the innermost level runs over up to LEAF elements (gcc vectorizes it: LEAF/16
# adds per lane, then a tree over the lanes), each level above adds up to LEVEL partial sums of the level below.
# Every serial chain is short, so the error grows like log n (measured: 2^24 x 0.1f is off by 7.5e-8 relative with
# 512/16; one accumulator per vector lane is off by 1%). A leaf of 512, not 256: gcc's code for a 128- or 256-long
# leaf streamed rows at ~29 GB/s where 64 or 512 and more reach ~34 (C kernels of the same shape, Zen 4, 2 threads);
# row-sum 8192^2 went from 1.3x to 1.05x PyTorch eager (bench/bench_membound.py).
LEAF, LEVEL = 512, 16
# a full reduction at least this long runs its outermost level as an OpenMP loop writing one partial per iteration
# (the same tree, so the same result with any thread count); below it a parallel region costs more than it saves
PARALLEL_MIN = 1 << 16
TILE_LEVELS_MIN = 4096


def largest_divisor(s: int, cap: int) -> int:
    if type(s) is Variable:  # a symbolic size: no divisor is known, the loop stays whole
        return 1
    return next(d for d in range(min(s, cap), 0, -1) if s % d == 0)


def levels(rshape: tuple[int, ...], leaf: int = LEAF) -> list[list[tuple[int, int]]]:
    """Split the reduce axes into levels of loops, innermost level first: each a list of (axis, size) pieces, inner
    piece of an axis first. A level holds at most LEAF (first) or LEVEL (later) iterations unless a size has no
    divisor that fits (a large prime stays one loop)."""
    levels: list[list[tuple[int, int]]] = [[]]
    prod_ = 1
    for k in reversed(range(len(rshape))):
        s = rshape[k]
        while s > 1:
            cap = (leaf if len(levels) == 1 else LEVEL) // prod_
            d = largest_divisor(s, cap) if cap > 1 else 1
            if d == 1 and prod_ > 1:  # nothing fits: close this level
                levels.append([])
                prod_ = 1
                continue
            d = s if d == 1 else d
            levels[-1].append((k, d))
            prod_ *= d
            s //= d
    return [lv for lv in levels if lv]


def split_loops(
    ctx: Any, parts: list[tuple[UOp, int]], val: UOp, kinds: tuple | None = None, in_place: bool = False
) -> list[tuple[UOp, int]]:
    """Loops that `val` only takes apart again, split into nested loops: an index r that reaches the loads
    as r // 9, (r // 3) % 3 and r % 3 (a convolution's merged (channel, kh, kw) axis, a GEMM's K) is run as loops
    (K/9, 3, 3) over r = a*9 + b*3 + c, and simplification turns those into a, b, c: no division or modulo is
    left in the loop body (a 3x3 conv, 64 channels at 56x56, Zen 3: 34-41 -> 59-63 GFLOP/s). A loop is split at
    the divisors it is divided or taken modulo by, when each divides the next and the loop's size. `kinds`: only
    loops of these AxisTypes (the reduce loops' caller passes none: all of them).

    An elementwise kernel's output loops split the same way: max pool's backward over (128, 16, 28, 28) reads its
    window's gradient and argmax at (r // 2) and its tap at r % 2 (3.4 ms, at 3.4 GB/s). There the pieces must
    nest where their loop did (`in_place`): loops nest by number, and a piece made now would nest inside every
    later axis: the CNN step's NCHW -> NHWC copy (2, 50176, 16), read as n = r // 784 and hw = r % 784, wrote 16
    floats apart from its innermost loop, 16 passes over its output (720 us a call, 136 with the pieces in place)."""
    out, topo = [], simplify(val).toposort()
    pieces: dict[UOp, tuple[int, int]] = {}  # a piece -> (the number of the loop it splits, its place among them)
    for b, f in parts:
        size = b.src[0].arg if b.op is Ops.RANGE and b.src[0].op is Ops.CONST else 1
        if kinds is not None and b.op is Ops.RANGE and b.arg.kind not in kinds:
            size = 1
        cuts = sorted(
            {
                u.src[1].arg
                for u in topo
                if u.op in (Ops.IDIV, Ops.MOD)
                and u.src[0] is b
                and u.src[1].op is Ops.CONST
                and 1 < u.src[1].arg < size
                and size % u.src[1].arg == 0
            }
        )
        if not cuts or any(hi % lo for lo, hi in zip(cuts, cuts[1:])):
            out.append((b, f))
            continue
        strides = [*reversed(cuts), 1]  # outer loop first: r = a*cuts[-1] + ... + z
        sizes = [size // strides[0]] + [hi // lo for hi, lo in zip(strides, strides[1:])]
        loops = [ctx.rng(s, b.arg.kind) for s in sizes]
        pieces.update((r, (b.arg.idx, j)) for j, r in enumerate(loops))
        out.append((sum((r * s for r, s in zip(loops[1:], strides[1:])), loops[0] * strides[0]), 1))
    return _renest(ctx, out, pieces) if in_place and pieces else out


def _renest(ctx: Any, parts: list[tuple[UOp, int]], pieces: dict[UOp, tuple[int, int]]) -> list[tuple[UOp, int]]:
    """The loops of `parts` from the first split one on, numbered anew (after every loop made so far) in the order
    they should nest: each split loop's pieces where it was, outer piece first."""
    first = min(n for n, _ in pieces.values())
    loops = {r for x, _ in parts for r in x.toposort() if r.op is Ops.RANGE and r.arg.idx > first}
    order = sorted(loops, key=lambda r: pieces.get(r, (r.arg.idx, 0)))
    if order == sorted(loops, key=lambda r: r.arg.idx):  # no later loop: they already nest in place
        return parts
    sub = {}
    for r in order:
        sub[r] = ctx.rng(r.src[0].arg, r.arg.kind)
        ctx.threads.discard(r)
    return [(x.substitute(sub), f) for x, f in parts]


def merge_ends(root: UOp) -> UOp:
    """Unrolled copies each END the same shared loop: merge them into one END over a SINK.

    Every group of copies merges in one pass; a group nested in another (an inner loop's copies inside the outer
    loop's) merges in the next pass, inside the merged outer one."""
    while True:
        groups: dict[tuple, list[UOp]] = {}
        for u in root.toposort():
            if u.op is Ops.END:
                groups.setdefault(u.src[1:], []).append(u)
        mapping = {}
        for dup in groups.values():
            if len(dup) > 1:
                merged = UOp(Ops.END, (UOp(Ops.SINK, tuple(e.src[0] for e in dup)), *dup[0].src[1:]))
                mapping.update((e, merged) for e in dup)
        if not mapping:
            return root
        root = root.substitute(mapping)


def regions(
    shape: tuple[int, ...], upcast: dict[int, int], vec: int = 0, masked: bool = False
) -> list[tuple[tuple, tuple, dict, int | None]]:
    """The output as regions (offsets, sizes, copies per axis, valid): an axis its upcast factor does not divide
    splits into whole tiles and a remainder (no padding of the output), the remainder one tile of its own size (a
    GEMM's 4 rows past 12 as one 4-row tile, not 4 one-row passes: 4 FMA chains over all of B for each row). On the
    last axis under SIMD (`vec`), the remainder is its whole vectors as one tile, then single elements; or, when
    `masked` (a kernel lowered in vectors, codegen.lanes), one tile of whole vectors whose last one is partial: the
    region's last size is rounded up to vectors and `valid` says how many of its elements exist (else None)."""
    per_axis: list[list[tuple[int, int, int, int | None]]] = []
    for k, s in enumerate(shape):
        f = upcast.get(k, 1)
        if type(s) is Variable:  # a symbolic axis is one region, never tiled (the optimizer upcasts none)
            per_axis.append([(0, s, 1, None)])
            continue
        parts, start, last = [], 0, k == len(shape) - 1
        if last and masked and 1 < vec <= f and f % vec == 0 and s % f % vec:
            if s >= f:
                parts.append((0, s // f * f, f, None))
            tail = -(-(s % f) // vec) * vec
            per_axis.append([*parts, (s // f * f, tail, tail, s % f)])
            continue
        last_vec = last and 1 < vec < f
        rem = (s % f) // vec * vec if last_vec else s % f
        for step in (f, rem, 1) if rem > 1 else (f, 1):
            n = (s - start) // step * step
            if n:
                parts.append((start, n, step, None))
                start += n
        per_axis.append(parts or [(0, s, 1, None)])
    out = []
    for combo in itertools.product(*per_axis):
        ups = {k: f for k, (_, _, f, _) in enumerate(combo) if f > 1}
        out.append((tuple(c[0] for c in combo), tuple(c[1] for c in combo), ups, combo[-1][3] if combo else None))
    return out


def size_argument(ast: UOp) -> UOp:
    """A lowered kernel of one loop (an elementwise kernel whose reads all walk in order: merged_shape) with that
    loop's end as a kernel argument, a SizeArg holding its value, instead of a constant in its C. Kernels that
    differ only in that size then render to one C function, compiled once: AdamW's three updates of each of a
    model's parameters were three kernels per parameter shape (the CNN's 101 compiled units held 35 one-loop
    kernels of 18 bodies). Any other kernel is returned as it is. (Under UOPC_CHECK_OOB each index check writes its
    buffer's size into the C: kernels of different sizes stay apart there.)

    Replacing the end by a parameter equal to it changes nothing a call computes, whatever else the kernel holds;
    only the loop's bounds widen to the argument's range for what reads them later (the renderer's clamps)."""
    ranges = [u for u in ast.toposort() if u.op in (Ops.RANGE, Ops.DEFINE_VAR)]
    if len(ranges) != 1 or ranges[0].op is not Ops.RANGE or ranges[0].src[0].op is not Ops.CONST:
        return ast
    if ranges[0].src[0].dtype is not dtypes.int32:  # (a 64-bit loop, past 2^31 elements: the argument's range)
        return ast
    rng, end = ranges[0], ranges[0].src[0]
    arg = UOp(Ops.DEFINE_VAR, (), SizeArg("uopc_n", end.arg), end.dtype)
    return ast.substitute({rng: rng.replace(src=(arg,))})


def axis_parts(ctx: Any, size: int, factor: int, kind: AxisType) -> tuple[UOp, int]:
    """An axis of `size` as (loop or CONST 0, copies): index = loop * factor + c for c in 0..factor-1."""
    if factor > 1 and type(size) is not Variable and size % factor == 0:
        return (ctx.rng(size // factor, kind) if size > factor else UOp.const(0, ctx.idx)), factor
    return (ctx.rng(size, kind) if size > 1 else UOp.const(0, ctx.idx)), 1


def combos(parts: list[tuple[UOp, int]]) -> list[tuple[UOp, ...]]:
    """Every index tuple obtained by fixing the unrolled part of each axis to a constant."""
    out: list[tuple[UOp, ...]] = [()]
    for b, f in parts:
        zero = b.op is Ops.CONST and b.arg == 0
        out = [c + (UOp.const(k, b.dtype) if zero else (b * f + k if f > 1 else b),) for c in out for k in range(f)]
    return out


def axis_order(o: Opts, n: int) -> list[tuple[int, AxisType]]:
    """The n output axes and their loop kinds, in the order their loops are made (and nest): the THREAD axis first."""
    order = ([o.thread] if o.thread is not None else []) + [k for k in range(n) if k != o.thread]
    return [(k, AxisType.THREAD if k == o.thread else AxisType.LOOP) for k in order]


def block_loops(
    ctx: Any, shape: tuple[int, ...], ups: dict[int, int], chunked: bool = False, shared: dict[int, UOp] | None = None
) -> dict[int, UOp]:
    """The cache-block loops of one region's output axes (`shape`, `ups` copies per axis): axis -> loop over its
    blocks. A block of outputs reuses the same operand rows: all block loops go outside, so they stay in cache.
    The THREAD axis's loop is made first and nests outermost: when other axes are blocked or the reduction is
    `chunked` (Opts.ktile), an untiled THREAD axis becomes a block loop of its own (one parallel region per call:
    nested inside the blocks or chunks, a pack ran 98 regions a call at 0.6 GB/s, a weight gradient 196)."""
    o = ctx.opts
    tiled = {k for k in o.tile if 0 <= k < len(shape) and _tiled(o, shape, ups, k)}
    th, n = o.thread, len(shape)
    own = th is not None and th < n and th not in tiled and (tiled or chunked) and type(shape[th]) is not Variable
    own = own and th not in (shared or {})  # (a loop all regions share is made once, outside them: shared_loops)
    whole = {th} if own and shape[th] % ups.get(th, 1) == 0 else set()
    sizes = {k: shape[k] // o.tile[k] if k in tiled else shape[k] // ups.get(k, 1) for k in tiled | whole}
    return {k: ctx.rng(sizes[k], kind) for k, kind in axis_order(o, n) if k in sizes}


def _tiled(o: Opts, shape: tuple, ups: dict[int, int], k: int) -> bool:
    """Is axis k of a region (`shape`, `ups` copies per axis) cut into cache blocks: a tile that divides it into
    whole register tiles?"""
    t = o.tile.get(k, 1)
    return type(shape[k]) is not Variable and 1 < t < shape[k] and shape[k] % t == 0 and t % ups.get(k, 1) == 0


# a region whose THREAD axis loops once takes another axis on threads (region_opts) from this much work (outputs x
# reduce size): a parallel region costs a few microseconds, which 4 rows of a (4096 x 256) product do not pay back
REGION_THREAD_MIN = 1 << 21


def region_opts(o: Opts, shape: tuple, ups: dict[int, int], shared: dict[int, UOp], rsize: int) -> Opts:
    """The Opts one region of the output (`shape`, `ups` copies per axis; regions) is lowered with: the kernel's,
    except where its THREAD axis, not a loop the regions share, loops once in this region (a remainder of the rows
    it threads: a GEMM's last 4 rows past whole 6-row tiles), which would run on one thread while the others wait;
    there, given REGION_THREAD_MIN work (`rsize` a reduce's length per output), the first other axis that loops at
    least twice is the region's THREAD axis. ResNet-18's stem (64 x 147 @ 147 x 12928, row blocks on threads) ran
    its last 4 rows over every column on one thread: the kernel took 0.96-1.03 ms at batch 1, now 0.90-0.97."""

    def trips(k: int) -> int:  # how often the region's outermost loop over axis k runs (0: a symbolic size)
        if type(shape[k]) is Variable:
            return 0
        return shape[k] // o.tile[k] if _tiled(o, shape, ups, k) else shape[k] // ups.get(k, 1)

    th = o.thread
    if th is None or th >= len(shape) or th in shared or trips(th) >= 2:
        return o
    if prod(s for s in shape if type(s) is int) * rsize < REGION_THREAD_MIN:
        return o
    alt = next((k for k in range(len(shape)) if k != th and trips(k) >= 2), None)
    return o if alt is None else replace(o, thread=alt)


def shared_loops(ctx: Any, shape: tuple[int, ...], n_regions: int, chunked: bool) -> dict[int, UOp]:
    """The loops every region of the output runs inside, axis -> loop: the outermost axes (THREAD first) that no
    region tiles, blocks or splits. The tile nest and its remainder nests then run one after another for each of
    their iterations, on operands still in cache: a batch of 16 products of (16 x 512) x (512 x 512) as 6-row
    tiles and a 4-row remainder (a Winograd convolution's) read each product's 1 MiB of B a third time from memory
    when the remainder was a nest of its own, after every product's tiles (1.02 against 0.58-0.64 ms)."""
    if n_regions < 2 or chunked:
        return {}
    o, loops = ctx.opts, {}
    for k, kind in axis_order(o, len(shape)):
        s = shape[k]
        if type(s) is Variable or s < 2 or o.upcast.get(k, 1) > 1 or 1 < o.tile.get(k, 1) < s:
            break
        loops[k] = ctx.rng(s, kind)
    return loops


def output_parts(
    ctx: Any, shape: tuple[int, ...], ups: dict[int, int], blocks: dict[int, UOp], shared: dict[int, UOp]
) -> list[tuple[UOp, int]]:
    """The index parts (loop or CONST 0, copies) of one region's output axes: the loops all regions share
    (`shared`, outermost), the loops within a cache block (`blocks`, from block_loops, nest outside them), THREAD
    first, `ups` copies per axis."""
    o = ctx.opts
    parts: dict[int, tuple[UOp, int]] = {}
    for k, kind in axis_order(o, len(shape)):
        f = ups.get(k, 1)
        if k in shared:
            parts[k] = (shared[k], 1)
        elif k in blocks:  # the block loop's trips divide the axis: a tile's, or 1 (a THREAD axis's own, untiled)
            inner = shape[k] // (blocks[k].vmax + 1) // f
            parts[k] = (blocks[k] * inner + ctx.rng(inner) if inner > 1 else blocks[k], f)
        else:
            parts[k] = axis_parts(ctx, shape[k], f, kind)
    return [parts[k] for k in range(len(shape))]

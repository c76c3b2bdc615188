"""Lowering: one shaped value -> a SINK of STOREs over explicit RANGE loops.

`rangeify(value, idx, ctx)` is the scalar expression of `value` at the output index `idx`:
movement ops rewrite the index, a BUFFER becomes LOAD(INDEX), an ALU op applies to its sources'
values, and a REDUCE allocates an accumulator that lives in exactly the loops its index mentions.

    x (4, 8) -> x - max(x, axis=1)      becomes      for r0: acc = -inf; for r2: acc = max(acc, x[r0*8+r2])
                                                             for r1: out[r0*8+r1] = x[r0*8+r1] - acc

`lower(root, out, ctx)` makes the output loops (shaped by `Opts`: THREAD outermost, UPCAST copies,
cache-block tiles), stores every element and simplifies. Loop-invariant loads are hoisted by where
the linearizer places them, not by a separate pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from uopc import helpers
from uopc.codegen import loops as loop_shapes
from uopc.codegen.error_record import ERROR_RECORD, error_slot
from uopc.codegen.lanes import NoLanes, copies, lane_of, lane_stats, partial_width, widen
from uopc.codegen.loops import (
    LEAF,
    LEVEL,
    PARALLEL_MIN,
    TILE_LEVELS_MIN,
    axis_parts,
    block_loops,
    combos,
    merge_ends,
    output_parts,
    region_opts,
    regions,
    shared_loops,
    split_loops,
)
from uopc.codegen.vectorize import vectorize
from uopc.helpers import deep_recursion, prod
from uopc.opt.opts import Opts
from uopc.opt.strides import merged_reduce
from uopc.uop import ALU, MOVEMENT, AxisType, Ops, ParamArg, RangeArg, UOp, epilogue_reduce, identity_element, sink
from uopc.uop.dtype import DType, dtypes
from uopc.uop.indexing import and_, ravel, through
from uopc.uop.symbolic import simplify
from uopc.uop.variable import Variable, symbolic

__all__ = ["AxisType", "Ctx", "Opts", "lanes", "lower", "lower_scatter", "lower_setitem", "rangeify", "ranges_in"]


class Ctx:
    """Per-kernel lowering state: numbering of loops and accumulators, and memo tables."""

    def __init__(self, opts: Opts | None = None):
        self.opts = opts or Opts()
        self.n_ranges = 0
        self.n_allocs = 0
        self.reduce_ranges: dict[tuple, list[tuple[UOp, int]]] = {}
        self.memo: dict[tuple, UOp] = {}
        self.idx: DType = dtypes.int32  # index arithmetic: int64 when a buffer or a shape reaches 2^31 elements
        self.err: UOp | None = None  # the error record data-dependent index checks write to (a BUFFER parameter)
        self.checks: dict[UOp, int] = {}  # GATHER -> its number in the error record
        self.threads: set[UOp] = set()  # the THREAD loops made so far
        self.row_out: UOp | None = None  # the output BUFFER, where a staged row may live in it (_row_staged)

    def rng(self, size: int, kind: AxisType = AxisType.LOOP) -> UOp:
        """A new loop 0..size-1, numbered in creation order (lower numbers nest outside); a reduce loop carries
        Opts.prefetch. A symbolic size (uopc.uop.variable) ends its loop at a kernel argument, its bound value."""
        end = UOp(Ops.DEFINE_VAR, (), size, self.idx) if type(size) is Variable else UOp.const(size, self.idx)
        far = self.opts.prefetch if kind is AxisType.REDUCE else 0
        r = UOp(Ops.RANGE, (end,), RangeArg(self.n_ranges, kind, far), self.idx)
        self.n_ranges += 1
        if kind is AxisType.THREAD:
            self.threads.add(r)
        return r

    def alloc(self, dtype: DType, size: int = 1) -> UOp:
        """A new accumulator (a local variable, or a small local array when size > 1)."""
        a = UOp(Ops.ALLOC, (), (self.n_allocs, size), dtype)
        self.n_allocs += 1
        return a


class KChunk(NamedTuple):
    """Opts.ktile on a root REDUCE: its innermost axis runs in chunks, one iteration of `loop` per chunk (a loop
    between the cache-block loops and the register tiles); the partial result lives in `out` between chunks."""

    loop: UOp  # the chunk loop
    size: int  # elements of the reduce axis per chunk
    out: UOp  # the output BUFFER, read back at the start of every chunk after the first


def ranges_in(*xs: UOp) -> list[UOp]:
    """The RANGE loops an expression mentions, outermost (lowest number) first."""
    loops = _NO_LOOPS.union(*(_loops_of(x) for x in xs))
    return sorted(loops, key=lambda r: r.arg.idx)


class _LoopsKnown:
    """toposort's stop set for _loops_of: the nodes whose loops are already recorded."""

    def __contains__(self, u: UOp) -> bool:
        return "loops" in u.__dict__


_KNOWN, _NO_LOOPS = _LoopsKnown(), frozenset()


def _loops_of(u: UOp) -> frozenset[UOp]:
    """The RANGEs under `u`, recorded on each node it reaches (a node never changes, so neither does its answer):
    a GEMM tile asks this for each of its hundreds of outputs over shared index expressions, which walked the same
    subgraphs again (76,000 toposorts in the char-GPT step's first call)."""
    if (hit := u.__dict__.get("loops")) is not None:
        return hit
    for n in u.toposort(_KNOWN):
        d = n.__dict__
        if "loops" in d:
            continue
        loops = _NO_LOOPS.union(*(s.__dict__["loops"] for s in n.src)) if n.src else _NO_LOOPS
        d["loops"] = loops | {n} if n.op is Ops.RANGE else loops
    return u.__dict__["loops"]


def rangeify(u: UOp, idx: tuple[UOp, ...], ctx: Ctx, valid: UOp | None = None) -> UOp:
    """The scalar value of shaped `u` at index `idx`. `valid` (from PAD) gates every load under it."""
    key = (u, idx, valid)
    if (hit := ctx.memo.get(key)) is not None:
        return hit
    ret = _rangeify(u, idx, ctx, valid)
    ctx.memo[key] = ret
    return ret


def _rangeify(u: UOp, idx: tuple[UOp, ...], ctx: Ctx, valid: UOp | None) -> UOp:
    op, src = u.op, u.src
    if op is Ops.CONST:
        return u
    if op is Ops.BUFFER:
        i = idx[0] if idx else UOp.const(0, ctx.idx)
        if valid is not None and 0 <= i.vmin and i.vmax < prod(u.arg.shape):
            # in range wherever the loops go: the PAD's own select gives the padded value, and the load, ungated,
            # may move out of loops the gate uses (a BatchNorm's per-channel scale before a pooling's padding)
            valid = None
        return u.index(i, valid).load()
    if op is Ops.STAGE:
        if isinstance(u.arg, tuple) and u.arg[0] == "row" and valid is None:
            return _row_staged(u, idx, ctx)
        return rangeify(src[0], idx, ctx, valid)
    if op in MOVEMENT:
        inner, new, cond = through(u, idx)
        if cond is None:
            return rangeify(inner, new, ctx, valid)
        v = rangeify(inner, new, ctx, and_(valid, cond))  # (a load gated by cond alone is 0 where cond fails)
        return v if v.op is Ops.LOAD and v.src[0].src[2:] == (cond,) else cond.where(v, UOp.const(0, u.dtype))
    if op is Ops.REDUCE:
        return _reduce(u, idx, ctx, valid)
    if op is Ops.GATHER:
        return _gather(u, idx, ctx, valid)
    if op in (Ops.SCATTER, Ops.SETITEM):
        raise NotImplementedError(f"rangeify: a {op.name} is its own kernel (the scheduler materializes it)")
    if op in ALU:
        return u.replace(src=tuple(rangeify(s, idx, ctx, valid) for s in src))
    if op is Ops.DEFINE_VAR:  # a symbolic size as a value (a mean's count): the kernel argument, at its dtype
        d = UOp(Ops.DEFINE_VAR, (), u.arg, ctx.idx)
        return d if d.dtype is u.dtype else d.cast(u.dtype)
    raise NotImplementedError(f"rangeify: {op} is not a shape-graph op")


def _row_staged(u: UOp, idx: tuple[UOp, ...], ctx: Ctx) -> UOp:
    """STAGE(value, ("row", n)) at idx (uopc.schedule.fusion.stage_rows): the value over the row's last n axes is
    computed once per row into a local array, in a loop of its own, and every pass over the row loads it."""
    n = u.arg[1]
    row, cols, shape = idx[: len(idx) - n], idx[len(idx) - n :], u.shape[len(idx) - n :]
    key = (u, row)
    if (hit := ctx.memo.get(key)) is None:
        loops = tuple(ctx.rng(s) if s > 1 else UOp.const(0, ctx.idx) for s in shape)
        val = rangeify(u.src[0], row + loops, ctx, None)
        at = ravel(loops, shape) if shape else UOp.const(0, ctx.idx)
        # ("row", n, "out"): the output's own row (fusion._fills_output), unless threads share the row's elements
        if u.arg[2:] == ("out",) and ctx.row_out is not None and ctx.threads <= set(ranges_in(*row)):
            scratch, base = ctx.row_out, ravel(row + (UOp.const(0, ctx.idx),) * n, u.shape)
        else:
            scratch, base = ctx.alloc(u.dtype, prod(shape)).after(*ranges_in(*row)), UOp.const(0, ctx.idx)
        buf = scratch.after(scratch.index(base + at).store(val).end(*ranges_in(*loops)))
        hit = ctx.memo[key] = (buf, base)
    buf, base = hit
    return buf.index(base + ravel(cols, shape) if shape else base).load()


def _gather(u: UOp, idx: tuple[UOp, ...], ctx: Ctx, valid: UOp | None) -> UOp:
    """x at idx with axis `dim` replaced by the index tensor's value there, checked against x's size."""
    dim = u.arg[0]
    j = _checked_index(u, idx, ctx, valid)
    return rangeify(u.src[0], idx[:dim] + (j,) + idx[dim + 1 :], ctx, valid)


def _checked_index(u: UOp, idx: tuple[UOp, ...], ctx: Ctx, valid: UOp | None = None) -> UOp:
    """The index tensor of GATHER or SCATTER `u` at idx, as a CHECK against the size of the axis it indexes."""
    x, index, (dim, _, wrap) = u.src[0], u.src[1], u.arg[:3]
    if ctx.err is None:
        raise RuntimeError(f"rangeify: a {u.op.name} needs the error record that lower() sets up")
    j = rangeify(index, idx, ctx, valid)
    j = j if j.dtype is ctx.idx else j.cast(ctx.idx)
    if valid is not None:  # a padded position's index is never used: 0, not what its (ungated) loads computed
        j = valid.where(j, UOp.const(0, ctx.idx))
    n = x.shape[dim]
    lo = -n if wrap else 0  # wrap: negative indices count from the end, as in NumPy
    # a symbolic axis is checked against the value bound in the call (its third source), not its maximum
    size = (UOp(Ops.DEFINE_VAR, (), n, ctx.idx),) if type(n) is Variable else ()
    return UOp(Ops.CHECK, (j, ctx.err, *size), (n, ctx.checks[u], lo))


def _level_loops(ctx: Ctx, rshape: tuple[int, ...], parallel: bool) -> tuple[list[list[UOp]], tuple[UOp, ...]]:
    """The loops of each level, innermost level first (created outermost first, so they nest outside), and the
    reduce index per axis. With `parallel` the outermost loop is a THREAD loop."""
    # checked loads (UOPC_CHECK_OOB=1) keep gcc from vectorizing the leaf, which would then be one serial chain
    levels = loop_shapes.levels(rshape, LEVEL if helpers.settings().CHECK_OOB else LEAF)
    loops: list[list[UOp]] = [[] for _ in levels]
    pieces: dict[int, list[tuple[UOp, int]]] = {}
    for li in reversed(range(len(levels))):
        for k, d in reversed(levels[li]):  # outer piece of an axis first
            kind = AxisType.THREAD if parallel and ctx.n_ranges == 0 and len(levels) > 1 else AxisType.REDUCE
            r = ctx.rng(d, kind)
            loops[li].append(r)
            pieces.setdefault(k, []).append((r, d))
    ridx = []
    for k in range(len(rshape)):
        i: UOp = UOp.const(0, ctx.idx)
        for r, d in pieces.get(k, []):  # outer to inner: i = i * d + r
            i = i * d + r
        ridx.append(i)
    return loops, tuple(ridx)


def _split_leaf(
    ctx: Ctx, loops: list[list[UOp]], ridx: tuple[UOp, ...], x: UOp, idx: tuple[UOp, ...], valid: UOp | None
) -> tuple[list[list[UOp]], tuple[UOp, ...]]:
    """`_level_loops`' loops and index, the leaf's loops that the loads take apart again split (as _one_acc's). A
    BatchNorm's statistics over a convolution's output read through its cut (28 of every 30 positions) had a 392-long
    leaf read at r // 28 * 30 + r % 28, which gcc keeps scalar: 0.40 ms a call in the CNN step, 0.10 as (14, 28)."""
    if (leaf := loops[0])[0].arg.kind is AxisType.THREAD:
        return loops, ridx
    parts = split_loops(ctx, [(r, 1) for r in leaf], rangeify(x, idx + ridx, ctx, valid))
    sub = {r: p for r, (p, _) in zip(leaf, parts, strict=True) if p is not r}  # (none: the same loops)
    split = [piece for r in leaf for piece in ([r] if r not in sub else ranges_in(sub[r]))]
    return [split, *loops[1:]], tuple(i.substitute(sub) for i in ridx)


def _accumulate(ctx: Ctx, rop: Ops, dtype: DType, val: UOp, loops: list[UOp], scope: list[UOp]) -> UOp:
    """acc = identity; for loops: acc = rop(acc, val); the value of acc after the loops (acc lives in `scope`)."""
    acc0 = ctx.alloc(dtype).after(*scope)
    init = acc0.index(0).store(UOp.const(identity_element(rop, dtype), dtype))
    accl = acc0.after(init, *loops)
    upd = accl.index(0).store(UOp(rop, (accl.index(0).load(), val)))
    return acc0.after(upd.end(*loops)).index(0).load()


def _reduce(u: UOp, idx: tuple[UOp, ...], ctx: Ctx, valid: UOp | None, chunk: KChunk | None = None) -> UOp:
    """The value of REDUCE `u` at output index `idx`, lowered by the strategy _strategy picks; `chunk` (the root
    reduce under Opts.ktile, from lower) always takes the single accumulator, which can resume a partial result."""
    # unrolled copies of one reduce differ only by constants in idx: they share one set of loops (this memo key); each
    # region of the output has its own chunk loop (a one-tile region and its remainder may use no output loop at all)
    key = (u, frozenset(ranges_in(*idx)), valid, chunk.loop if chunk is not None else None)
    # the accumulators live inside the loops the output index (and a PAD gate over it) uses: their scope
    scope = ranges_in(*idx, *([valid] if valid is not None else []))
    if chunk is not None:
        return _one_acc(u, idx, ctx, valid, key, scope, chunk)
    return _strategy(u, ctx.opts)(u, idx, ctx, valid, key, scope)


def _rshape(u: UOp) -> tuple[int, ...]:
    """The reduced axes of REDUCE `u` (the last n of its source)."""
    x, n = u.src[0], u.arg[1]
    return x.shape[len(x.shape) - n :]


def _strategy(u: UOp, o: Opts) -> Callable[..., UOp]:
    """How REDUCE `u` is lowered: a long float sum as a tree of levels, a float max over whole lanes as lanes()
    accumulators, anything else as one accumulator. Each is called (u, idx, ctx, valid, memo key, scope)."""
    rop, rshape = u.arg[0], _rshape(u)
    # a register tile (GEMM) keeps one chain up to K = TILE_LEVELS_MIN: its 16 outer accumulators would be live across
    # the inner loop (gcc -S at N=1024: 33 stack references against 16), and the GEMM microkernel is its own work
    long = prod(rshape) > (TILE_LEVELS_MIN if len(o.upcast) >= 2 else LEAF)
    # levels win over Opts.unroll (the search may pick it for a long sum): gcc vectorizes the leaf anyway
    if rop is Ops.ADD and u.dtype.is_float and long:
        return _tree_sum
    n = lanes()
    lanes_fit = type(rshape[-1]) is not Variable and rshape[-1] % n == 0 and rshape[-1] >= 2 * n
    if rop is Ops.MAX and u.dtype.is_float and lanes_fit and o.unroll == 1:
        return _lane_max
    return _one_acc


def _tree_sum(u: UOp, idx: tuple[UOp, ...], ctx: Ctx, valid: UOp | None, key: tuple, scope: list[UOp]) -> UOp:
    """A float ADD reduce as nested levels of accumulators (see LEAF), over its axes merged (merged_reduce)."""
    (x, n), rop = merged_reduce(u.src[0], u.arg[1]), u.arg[0]
    rshape = x.shape[len(x.shape) - n :]
    if (hit := ctx.reduce_ranges.get(key)) is None:
        # a whole-tensor sum has no output loop to spread over threads: its outermost level becomes one
        parallel = not key[1] and ctx.opts.thread is None and prod(rshape) >= PARALLEL_MIN and not symbolic(rshape)
        hit = ctx.reduce_ranges[key] = _split_leaf(ctx, *_level_loops(ctx, rshape, parallel), x, idx, valid)
    loops, ridx = hit
    val = rangeify(x, idx + ridx, ctx, valid)
    for li, lv in enumerate(loops):  # innermost level first; each accumulator lives inside the levels above it
        if lv[0].arg.kind is AxisType.THREAD:  # each iteration stores its partial; one thread then adds them up
            size = prod(r.src[0].arg for r in lv)
            partial = ctx.alloc(u.dtype, size)
            done = partial.after(partial.index(ravel(tuple(lv), tuple(r.src[0].arg for r in lv))).store(val).end(*lv))
            r = ctx.rng(size, AxisType.REDUCE)
            return _accumulate(ctx, rop, u.dtype, done.index(r).load(), [r], scope)
        above = [r for upper in loops[li + 1 :] for r in upper]
        val = _accumulate(ctx, rop, u.dtype, val, lv, scope + above)
    return val


# gcc vectorizes no float max reduction without -ffinite-math-only (the NaN-propagating select is no MAX_EXPR), so a
# max runs independent accumulators in a small array, whose loop is an elementwise select gcc vectorizes: one AVX-512
# vector's 16 under uopc's flags, whose units peel loops of up to 4 iterations (renderer.flags), 64 under a user's
# CFLAGS, where gcc unrolls a 16-iteration loop completely and keeps it scalar (softmax 512x512: 138 us against 62).
# Under uopc's flags 16 against 64: softmax 512x512 compiled in 68 ms against 77 and ran in 59.0 us against 60.3, a
# max over 8192x1024 in 0.71-0.81 ms against 0.99-1.04, softmax 4096^2 in 4.87-5.01 against 5.19-5.29 (3 rounds).
def lanes() -> int:
    """How many accumulators a float max keeps (see above)."""
    return 16 if helpers.settings().CFLAGS is None else 64


def _lane_max(u: UOp, idx: tuple[UOp, ...], ctx: Ctx, valid: UOp | None, key: tuple, scope: list[UOp]) -> UOp:
    """A float MAX reduce over n = lanes() lanes: lane[l] = max(lane[l], x[.., a*n + l]), then folded in halves."""
    x, rop, rshape, n = u.src[0], u.arg[0], _rshape(u), lanes()
    folds = [n >> k for k in range(1, n.bit_length())]  # n/2, n/4, ..., 1
    if (hit := ctx.reduce_ranges.get(key)) is None:
        init_loop = ctx.rng(n)
        outer = [ctx.rng(s, AxisType.REDUCE) if s > 1 else UOp.const(0, ctx.idx) for s in rshape[:-1]]
        a, lane = ctx.rng(rshape[-1] // n, AxisType.REDUCE), ctx.rng(n, AxisType.REDUCE)
        hit = ctx.reduce_ranges[key] = (init_loop, outer, a, lane, [ctx.rng(h) for h in folds])
    init_loop, outer, a, lane, fold_loops = hit
    val = rangeify(x, idx + (*outer, a * n + lane), ctx, valid)
    loops = [r for r in outer if r.op is Ops.RANGE] + [a, lane]
    acc0 = ctx.alloc(u.dtype, n).after(*scope)
    init = acc0.index(init_loop).store(UOp.const(identity_element(rop, u.dtype), u.dtype)).end(init_loop)
    acc = acc0.after(init, *loops)
    cur = acc0.after(acc.index(lane).store(UOp(rop, (acc.index(lane).load(), val))).end(*loops))
    # fold the lanes in halves, lanes[r] = max(lanes[r], lanes[r + h]) for h = n/2, ..., 1: short loops gcc
    # vectorizes, where an unrolled tree was 63 selects per reduce in the C (a softmax's row max: 26 KB, 300 ms of gcc)
    for r, h in zip(fold_loops, folds, strict=True):
        upd = cur.index(r).store(UOp(rop, (cur.index(r).load(), cur.index(r + h).load())))
        cur = acc0.after(upd.end(r))
    return cur.index(UOp.const(0, ctx.idx)).load()


def _one_acc(
    u: UOp, idx: tuple[UOp, ...], ctx: Ctx, valid: UOp | None, key: tuple, scope: list[UOp], chunk: KChunk | None = None
) -> UOp:
    """A reduce into one accumulator, the Opts.unroll copies of its innermost axis combined in a balanced tree. Under
    K chunking (`chunk`) the innermost axis is chunk * size + inner and each chunk resumes the partial result the
    chunks before it stored in the output."""
    x, rop, rshape = u.src[0], u.arg[0], _rshape(u)
    if (parts := ctx.reduce_ranges.get(key)) is None:
        unroll = ctx.opts.unroll
        last = len(rshape) - 1
        parts = [axis_parts(ctx, s, unroll if k == last else 1, AxisType.REDUCE) for k, s in enumerate(rshape)]
        inner = None
        if chunk is not None:  # the chunk loop was made by lower, outside the output's register tiles
            inner = ctx.rng(chunk.size, AxisType.REDUCE)
            parts[-1] = (chunk.loop * chunk.size + inner, 1)
        ctx.reduce_ranges[key] = parts
        if all(f == 1 for _, f in parts):  # loops the loads take apart again are split (a chunk's inner loop too)
            val = rangeify(x, idx + combos(parts)[0], ctx, valid)
            if inner is None:
                parts = split_loops(ctx, parts, val)
            else:
                ((split, _),) = split_loops(ctx, [(inner, 1)], val)
                parts[-1] = (chunk.loop * chunk.size + split, 1)
            ctx.reduce_ranges[key] = parts
    outside = [chunk.loop] if chunk is not None else []
    real = [r for r in ranges_in(*(b for b, _ in parts)) if r not in outside]
    vals = [rangeify(x, idx + c, ctx, valid) for c in combos(parts)]
    while len(vals) > 1:  # unrolled reduce axis: combine the copies in a balanced tree
        vals = [UOp(rop, (vals[i], vals[i + 1])) if i + 1 < len(vals) else vals[i] for i in range(0, len(vals), 2)]
    if not real:
        return vals[0]
    # the accumulator lives inside the loops the output index uses (and the chunk loop)...
    acc0 = ctx.alloc(u.dtype).after(*ranges_in(*scope, *outside))
    start = UOp.const(identity_element(rop, u.dtype), u.dtype)
    if chunk is not None:  # later chunks continue from the partial result already stored in the output
        # the load is AFTER the chunk loop: its index does not depend on the chunk, and hoisted out of the loop it
        # would read the output once, before any chunk stored into it (16x784 @ 784x32 was off by 78)
        partial = chunk.out.after(chunk.loop).index(ravel(idx, u.shape)).load()
        start = (chunk.loop < 1).where(start, partial)
    init = acc0.index(0).store(start)
    accl = acc0.after(init, *real)  # ...is read and updated every iteration of the reduce loops...
    upd = accl.index(0).store(UOp(rop, (accl.index(0).load(), vals[0])))
    return acc0.after(upd.end(*real)).index(0).load()  # ...and read once more after they end


def lower(root: UOp, out: UOp, ctx: Ctx | None = None, more: tuple[tuple[UOp, UOp], ...] = ()) -> UOp:
    """Lower shaped `root` into a SINK that stores every element into BUFFER `out` (row-major). `more`: further
    (value, BUFFER) pairs of root's shape, elementwise, stored in the same loops (uopc.schedule.groups)."""
    with deep_recursion():
        return _lower(((root, out), *more), ctx or Ctx())


def _lower(pairs: tuple[tuple[UOp, UOp], ...], ctx: Ctx) -> UOp:
    opts = ctx.opts
    if ctx.opts.vec > 1:  # SIMD: one expression per vector of the tile's last axis, widened (codegen.lanes)
        try:
            ast = _lower_nests(pairs, ctx, lanes=True)
            lane_stats["lanes"] += 1
            return ast
        except NoLanes:  # some value has no vector form: lower element by element, regroup what vectorizes
            lane_stats["elements"] += 1
            ctx = Ctx(opts)
    return _lower_nests(pairs, ctx, lanes=False)


def _lower_nests(pairs: tuple[tuple[UOp, UOp], ...], ctx: Ctx, lanes: bool) -> UOp:
    """The kernel as one loop nest per output region; with `lanes`, the vectorized copies as LANE expressions. The
    first pair's value shapes the loops; each pair stores its value at every index of them."""
    (root, out), ctx.idx = pairs[0], dtypes.int32
    if any(_needs_64bit(r, o) for r, o in pairs):
        ctx.idx = dtypes.int64
    _setup_checks(ctx, root, pairs[-1][1])
    ktile = _ktile(root, ctx.opts)
    nests, parts = [], regions(root.shape, ctx.opts.upcast, ctx.opts.vec, masked=lanes)
    # a staged row may live in the output (_row_staged) where one nest writes the output whole and no cache block
    # loops over it (a second nest, or the next block of columns, would fill the rows again over what was stored), and
    # no chunked reduce keeps partial sums there
    ctx.row_out = out if len(parts) == 1 and not ctx.opts.tile and not ktile else None
    shared = shared_loops(ctx, root.shape, len(parts), bool(ktile))
    opts, red = ctx.opts, epilogue_reduce(root)
    rsize = prod(s for s in red.src[0].shape[len(red.shape) :] if type(s) is int) if red is not None else 1
    # each region (whole tiles, the remainders) is a loop nest of its own, inside the loops they share
    for offs, sizes, ups, last_valid in parts:
        ctx.opts = region_opts(opts, sizes, ups, shared, rsize)
        blocks = block_loops(ctx, sizes, ups, chunked=bool(ktile), shared=shared)
        # ktile: the reduce-chunk loop sits between the block loops and the loops within a block
        chunk = KChunk(ctx.rng(red.src[0].shape[-1] // ktile), ktile, out) if ktile else None
        plist = output_parts(ctx, sizes, ups, blocks, shared)
        if not ups and chunk is None and _elementwise(root):  # output loops the loads take apart again are split
            probe = tuple(i + o if o else i for (i, _), o in zip(plist, offs))
            vals = sink(*(rangeify(r, probe, ctx) for r, _ in pairs))
            split = split_loops(ctx, plist, vals, kinds=(AxisType.LOOP,), in_place=True)
            plist = [plist[k] if k in shared else p for k, p in enumerate(split)]
        lane = lane_of(ctx.opts.vec, ups.get(len(sizes) - 1, 1), ctx.idx) if lanes and sizes else None
        if lane is None:
            indices = combos(plist)
        else:  # the last axis in vectors: one index per vector of its copies
            indices = [c + (v,) for c in combos(plist[:-1]) for v in copies(plist[-1], lane)]
        indices = [tuple(i + o if o else i for i, o in zip(idx, offs)) for idx in indices]
        stores = []
        for r, o in pairs:
            st = []
            for idx in indices:
                # a chunked root reduce is lowered here, with its chunk: nothing under it is chunked
                val = rangeify(r, idx, ctx) if chunk is None else _chunked(r, idx, ctx, chunk)
                st.append(o.index(ravel(idx, r.shape) if r.shape else UOp.const(0, ctx.idx)).store(val))
            stores += st if lane is None else _widened(st, lane, last_valid, sizes)
        loops = ranges_in(*(b for b, _ in plist), *([chunk.loop] if chunk is not None else []))
        loops = [r for r in loops if r not in shared.values()]
        nests.append((stores[0] if len(stores) == 1 else UOp(Ops.SINK, tuple(stores))).end(*loops))
    ctx.opts = opts
    ast = sink(sink(*nests).end(*shared.values())) if shared else sink(*nests)
    if ctx.opts.vec > 1 and not lanes:  # copies of an upcast axis whose index is contiguous become vector ops
        ast = vectorize(ast, ctx.opts.vec)
    return _keep_checks(simplify(merge_ends(ast)), ctx)


def _widened(stores: list[UOp], lane: UOp, last_valid: int | None, sizes: tuple[int, ...]) -> list[UOp]:
    """A region's stores of one output, one per vector of its copies, widened into vector stores; with
    `last_valid`, the last vector of each row of the tile is partial (its valid lanes)."""
    if last_valid is None:
        return widen(stores, lane, _loops_of)
    w = lane.src[0].arg
    nv = sizes[-1] // w  # vectors per row of the tile: the last of each row is the partial one
    part = [i % nv == nv - 1 for i in range(len(stores))]
    valid = last_valid - (nv - 1) * w
    whole = iter(widen([x for x, p in zip(stores, part) if not p], lane, _loops_of))
    tail = [x for x, p in zip(stores, part) if p]
    if valid == 1 and nv == 1:  # one column alone: scalar (simplified together, their shared parts once)
        zero = {lane: UOp.const(0, lane.dtype)}
        tail = list(simplify(UOp(Ops.SINK, tuple(x.substitute(zero) for x in tail))).src)
    else:  # beside whole vectors even one column is a vector: it shares their broadcasts (codegen.lanes)
        tail = widen(tail, lane, _loops_of, valid, partial_width(valid, w), share=nv > 1)
    rest = iter(tail)
    return [next(rest) if p else next(whole) for p in part]


def _elementwise(root: UOp) -> bool:
    """No reduction anywhere in `root` (lowering it twice, to find the loops to split, makes no accumulators)."""
    return all(u.op not in (Ops.REDUCE, Ops.ATTENTION, Ops.WINOGRAD, Ops.SCATTER) for u in root.toposort())


INT32_LIMIT = 2**31 - 1


def _setup_checks(ctx: Ctx, root: UOp, out: UOp) -> None:
    """Number the kernel's index checks (as uopc.schedule.checks_of lists them) and make its error record parameter."""
    checked = [u for u in root.toposort() if u.op in (Ops.GATHER, Ops.SCATTER)]
    if checked:  # the error record is the parameter after the output (see error_slot)
        ctx.checks = {g: i for i, g in enumerate(checked)}
        ctx.err = UOp(Ops.BUFFER, (), ParamArg(error_slot(out), dtypes.int64, (ERROR_RECORD,)))


def _keep_checks(ast: UOp, ctx: Ctx) -> UOp:
    """`ast` plus a loop nest checking every index of each GATHER or SCATTER whose checks simplification deleted.

    A check goes when the value read no longer depends on the index (a constant source, a size-1 axis, an int
    value times 0): the read may fold away, the check of the index data may not. A check whose index is proven in
    range (symbolic folds it) needs no nest."""
    if not ctx.checks:
        return ast
    kept = {u.arg[1] for u in ast.toposort() if u.op is Ops.CHECK}
    nests = []
    for u, which in ctx.checks.items():
        if which in kept or prod(u.src[1].shape) == 0:
            continue
        loops = tuple(ctx.rng(s) if s > 1 else UOp.const(0, ctx.idx) for s in u.src[1].shape)
        chk = simplify(_checked_index(u, loops, ctx))
        if chk.op is Ops.CHECK:  # a statement of its own: the checked value is not used
            nests.append(UOp(Ops.SINK, (chk,)).end(*ranges_in(chk)))
    return simplify(sink(*ast.src, *nests)) if nests else ast


def lower_scatter(root: UOp, out: UOp, ctx: Ctx | None = None) -> UOp:
    """The accumulating half of SCATTER(base, index, values): for every element of values, in order,
    out[target] = rop(out[target], value) (rop: ADD, MUL or MAX, the arg's last entry).

    `out` already holds the base (an ordinary kernel copies it there first). The loop runs serially, in order, so
    repeated indices accumulate deterministically; each index is checked like a GATHER's."""
    ctx = ctx or Ctx()
    values, dim = root.src[2], root.arg[0]
    with deep_recursion():
        ctx.idx = dtypes.int64 if _needs_64bit(root, out) else dtypes.int32
        _setup_checks(ctx, root, out)
        loops = [ctx.rng(s) if s > 1 else UOp.const(0, ctx.idx) for s in values.shape]
        idx = tuple(loops)
        j = _checked_index(root, idx, ctx)
        target = out.index(ravel(idx[:dim] + (j,) + idx[dim + 1 :], root.shape))
        st = target.store(UOp(root.arg[3], (target.load(), rangeify(values, idx, ctx))))
        return _keep_checks(simplify(sink(st.end(*ranges_in(*loops)))), ctx)


def lower_setitem(root: UOp, out: UOp, thread: int | None = None) -> UOp:
    """The writing half of SETITEM(base, value): out[.., start + step * i, ..] = value[.., i, ..] over the region
    alone, one loop per dim of the value (the region's counts), axis `thread` on threads (its elements are distinct).

    `out` already holds the base (an ordinary kernel copies it there first)."""
    ctx, value = Ctx(Opts(thread=thread)), root.src[1]
    with deep_recursion():
        ctx.idx = dtypes.int64 if _needs_64bit(root, out) else dtypes.int32
        _setup_checks(ctx, value, out)
        kinds = [AxisType.THREAD if k == thread else AxisType.LOOP for k in range(len(value.shape))]
        idx = tuple(ctx.rng(s, kd) if s > 1 else UOp.const(0, ctx.idx) for s, kd in zip(value.shape, kinds))
        at = tuple(i * sp.step + sp.start for i, sp in zip(idx, root.arg))
        st = out.index(ravel(at, root.shape)).store(rangeify(value, idx, ctx))
        return _keep_checks(simplify(sink(st.end(*ranges_in(*idx)))), ctx)


def _needs_64bit(root: UOp, out: UOp) -> bool:
    """Whether some buffer or some view in the kernel has 2^31 elements or more: then every index is 64-bit.

    Decided per kernel, so kernels on ordinary sizes keep 32-bit index arithmetic (cheaper, and it vectorizes)."""
    if out.arg.shape[0] > INT32_LIMIT:
        return True
    return any(
        prod(u.shape) > INT32_LIMIT or (u.op is Ops.BUFFER and u.arg.shape[0] > INT32_LIMIT) for u in root.toposort()
    )


def _chunked(root: UOp, idx: tuple[UOp, ...], ctx: Ctx, chunk: KChunk) -> UOp:
    """The value a chunk of K stores: the partial sum, and after the last chunk the epilogue applied to it."""
    r = epilogue_reduce(root)
    acc = _reduce(r, idx, ctx, None, chunk)
    if r is root:
        return acc
    ctx.memo[(r, idx, None)] = acc  # the epilogue reads this chunk's accumulator for r
    not_last = chunk.loop < (r.src[0].shape[-1] // chunk.size - 1)
    return not_last.where(acc, rangeify(root, idx, ctx))


def _ktile(root: UOp, o: Opts) -> int:
    """The chunk Opts.ktile splits the root reduce's innermost axis into (the root, or the reduce of an epilogue:
    epilogue_reduce), or 0 where it does not apply: it must be an ADD/MAX reduce whose innermost axis the chunk
    divides. The partial result lives in the output buffer between chunks; an epilogue is applied by the last."""
    r = epilogue_reduce(root)
    # the output holds the partial sums between chunks: it must have the reduce's dtype (a bfloat16 output of a
    # float32 sum would round every partial sum)
    if not o.ktile or r is None or r.dtype is not root.dtype or o.unroll > 1:
        return 0
    root = r
    if type(root.src[0].shape[-1]) is Variable:  # a symbolic axis is never split
        return 0
    if root.arg[0] is Ops.ADD and root.dtype.is_float and len(o.upcast) < 2:  # a float sum keeps its levels
        return 0
    size = root.src[0].shape[-1]
    if o.ktile >= size or size % o.ktile:
        return 0
    return o.ktile

"""The CPU optimizer: a layout pass on the shape graph, then Opts per kernel (hand heuristic or search).

    A @ B  (B read down its columns)   --layout_pass-->   STAGE(B.T) -> a contiguous copy, then
    r_N_N with Opts(upcast={0: 4, 1: 4}, thread=0): a 4x4 register tile, rows split among OpenMP threads

OPT=0 runs nothing here; OPT=1 (default) is HandOpt; OPT=2 is SearchOpt, which times candidates once
per kernel and remembers the winner on disk (so a second run does no timing).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import tempfile
import time
from functools import cache

import numpy as np

from uopc import helpers
from uopc.helpers import prod
from uopc.rangeify import Ctx, Opts, lower, rangeify
from uopc.rewrite import PatternMatcher, UPat, graph_rewrite
from uopc.symbolic import simplify
from uopc.uop import ALU, MOVEMENT, Ops, ParamArg, UOp

# ---------------------------------------------------------------------------------------------------
# machine facts (read from the machine, not assumed)


@cache
def l2_bytes() -> int:
    """Per-core L2 size from sysfs (1 MiB if the machine does not say)."""
    for i in range(8):
        base = f"/sys/devices/system/cpu/cpu0/cache/index{i}"
        try:
            with open(f"{base}/level") as f:
                if f.read().strip() != "2":
                    continue
            with open(f"{base}/size") as f:
                txt = f.read().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20}.get(txt[-1], 1)
            return int(txt.rstrip("KM")) * mult
        except (OSError, ValueError):
            continue
    return 1 << 20


@cache
def num_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# below this much work (output elements x reduce size) waking OpenMP threads costs more than it saves;
# measured on a 2-core Zen 4: an elementwise kernel of 2^15 floats runs in ~5 us, a parallel region ~3 us
THREAD_MIN_WORK = 1 << 16
# unroll only reductions shorter than this (and untiled): longer ones are vectorized by gcc, and unrolled
# copies in front of a register tile defeat its vectorizer (10.10)
UNROLL_MAX_REDUCE = 64


# ---------------------------------------------------------------------------------------------------
# the layout pass


def _push(m: UOp, a: UOp) -> UOp | None:
    # PAD is not pushed: pad(f(x)) != f(pad(x)) when f(0) != 0 (exp2, cmp, where, ...)
    if m.op is Ops.PAD:
        return None
    # operands of the ALU's own shape take the view; shape-() operands broadcast (unless the ALU itself is 0-d)
    return a.replace(src=tuple(m.replace(src=(s,)) if s.shape == a.shape else s for s in a.src))


# movement(alu(a, b)) -> alu(movement(a), movement(b)): exposes each operand's own chain of views
push_views = PatternMatcher([(UPat(MOVEMENT, src=(UPat(ALU, name="a"),), name="m"), _push)])


def _views(x: UOp):
    """The movement-op chains feeding x through ALU ops: (top of chain, materialized base)."""
    seen, stack = set(), [x]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.op in ALU:
            stack.extend(u.src)
        elif u.op in MOVEMENT:
            base = u
            while base.op in MOVEMENT:
                base = base.src[0]
            if base.op in (Ops.BUFFER, Ops.REDUCE, Ops.STAGE):
                yield u, base


def _last_axis_stride(view: UOp, base: UOp) -> int | None:
    """Distance in memory between view[..., k] and view[..., k+1], or None if the view is not affine there.

    Rangeify is the stride oracle: lower the view against a fake buffer, evaluate its index at k=0 and k=1.
    """
    if not view.shape or view.shape[-1] == 1:  # a 0-d view (e.g. reshape to ()) has no last axis to stride
        return 0
    fake = UOp(Ops.BUFFER, (), ParamArg(-999, base.dtype, (max(1, prod(base.shape)),)))
    v = view.substitute({base: fake.reshape(base.shape) if base.shape != fake.shape else fake})
    ctx = Ctx()
    rngs = tuple(ctx.rng(s) for s in v.shape)
    val = rangeify(v, rngs, ctx)
    if val.op is not Ops.LOAD or val.src[0].op is not Ops.INDEX:
        return None
    e = val.src[0].src[1]

    def at(k: int) -> UOp:
        last = len(rngs) - 1
        return simplify(e.substitute({r: UOp.const(k if i == last else 0) for i, r in enumerate(rngs)}))

    e0, e1 = at(0), at(1)
    return e1.arg - e0.arg if e0.op is Ops.CONST and e1.op is Ops.CONST else None


def layout_pass(roots: list[UOp]) -> list[UOp]:
    """Copy operands whose reduce axis is strided into a contiguous temp (a STAGE) before they are broadcast.

    The copy costs O(operand); the reduce it feeds is usually much bigger. Only operands strictly smaller
    than the reduce input are staged (NOTES 21: a staged broadcast product cost more than it saved).
    """
    roots = [graph_rewrite(r, push_views) for r in roots]
    todo: set[UOp] = set()
    for r in UOp(Ops.SINK, tuple(roots)).toposort():
        if r.op is not Ops.REDUCE:
            continue
        for view, base in _views(r.src[0]):
            s = _last_axis_stride(view, base)
            if s in (0, 1, None):
                continue
            c = view
            while c.op is Ops.EXPAND:  # stage before the broadcast
                c = c.src[0]
            if prod(c.shape) > prod(base.shape) or prod(c.shape) >= prod(r.src[0].shape) or c in todo:
                continue
            staged = UOp(Ops.STAGE, (c,))
            if _last_axis_stride(view.substitute({c: staged}), staged) == 1:
                todo.add(c)
    return UOp.wrap(roots, todo, lambda n: UOp(Ops.STAGE, (n,))) if todo else roots


# ---------------------------------------------------------------------------------------------------
# the hand heuristic


def _reduce_size(body: UOp) -> int:
    """Elements reduced per output element (the largest REDUCE in the kernel; 1 if none)."""
    return max(
        (prod(u.src[0].shape[len(u.src[0].shape) - u.arg[1] :]) for u in body.toposort() if u.op is Ops.REDUCE),
        default=1,
    )


def hand_opt_choice(body: UOp) -> Opts:
    """Register tile on the last two output axes, unroll short untiled reductions, threads above a work threshold."""
    shape, rsize = body.shape, _reduce_size(body)
    o = Opts()
    if rsize > 1:
        # 4x4 tile: 16 accumulators + 8 operand vectors. That spills a few on AVX2's 16 registers, fits in
        # AVX-512's 32; measured, it beats 2x8, 4x8 and 8x8 on both kinds of machine
        budget = 16
        for axis in (len(shape) - 1, len(shape) - 2):
            if axis < 0:
                continue
            for f in (4, 2):
                if f <= budget and shape[axis] % f == 0 and shape[axis] >= f:
                    o.upcast[axis] = f
                    budget //= f
                    break
        if not o.upcast and rsize % 4 == 0 and rsize < UNROLL_MAX_REDUCE:
            o.unroll = 4
        # cache blocks when the operand rows one row-strip walks through do not fit in L2 (measured on a Zen 4,
        # N=1024: 4x4 tile 99 GFLOP/s, + 128x128 blocks 173)
        if len(shape) >= 2 and o.upcast and shape[-1] * rsize * body.dtype.itemsize > l2_bytes():
            o.tile.update(_block(shape, rsize * body.dtype.itemsize))
    elif len(shape) >= 2 and min(shape[-2:]) >= 64 and _strided_read(body):
        # a transposing copy: 32x32 blocks keep the strided side's cache lines in L1 until all 16 floats of
        # each are used (measured: a 1024x1024 transpose 3.6 ms -> 0.57 ms)
        o.tile.update({len(shape) - 2: 32, len(shape) - 1: 32})
    work = prod(shape or (1,)) * rsize
    if work >= THREAD_MIN_WORK and num_cores() > 1:
        for axis, s in enumerate(shape):
            if s // o.upcast.get(axis, 1) >= 2:
                o.thread = axis
                break
    return o


def _block(shape: tuple[int, ...], row_bytes: int) -> dict[int, int]:
    """The largest square output block whose operand rows (block rows + block cols, each `row_bytes` long)
    fill at most half of L2, leaving room for a second hardware thread and the output."""
    for t in (256, 128, 64, 32):
        if 2 * t * row_bytes <= l2_bytes() // 2 and all(s % t == 0 and s > t for s in shape[-2:]):
            return {len(shape) - 2: t, len(shape) - 1: t}
    return {}


def _strided_read(body: UOp) -> bool:
    """Does the kernel read some buffer with a non-unit stride along its innermost output axis?"""
    tops = [body] if body.op in MOVEMENT else [view for view, _ in _views(body)]
    for view in tops:
        base = view
        while base.op in MOVEMENT:
            base = base.src[0]
        if base.op is Ops.BUFFER and _last_axis_stride(view, base) not in (0, 1, None):
            return True
    return False


def hand_opt(body: UOp, out: UOp) -> tuple[UOp, Opts]:
    o = hand_opt_choice(body)
    return lower(body, out, Ctx(opts=o)), o


class HandOpt:
    """The default optimizer: layout pass + hand-chosen Opts."""

    layout = staticmethod(layout_pass)
    lower = staticmethod(hand_opt)


# ---------------------------------------------------------------------------------------------------
# search


def candidate_opts(body: UOp) -> list[Opts]:
    """Plausible Opts: none, the heuristic's, register tiles of the last two axes (+/- unroll), cache blocks."""
    shape, rsize = body.shape, _reduce_size(body)
    outs = [a for a, s in enumerate(shape) if s > 1]
    hand = hand_opt_choice(body)
    cands = [Opts(), hand]
    for a, b in itertools.product(outs[-2:], repeat=2):
        for fa, fb in [(4, 4), (8, 4), (4, 8), (8, 8), (16, 2), (2, 16)]:
            up = {a: fa} if a == b else {a: fa, b: fb}
            if all(shape[k] % f == 0 for k, f in up.items()):
                for u in (1, 4) if rsize % 4 == 0 and rsize > 1 else (1,):
                    cands.append(Opts(dict(up), hand.thread, u))
    # cache blocks of the last two output axes (help when operand rows do not fit in cache)
    for t in (32, 64, 128):
        tile = {a: t for a in outs[-2:] if shape[a] % t == 0}
        if tile:
            cands.append(Opts(dict(hand.upcast), hand.thread, hand.unroll, tile=tile))
            # and the reduce axis blocked too (exercise 6): partial sums kept in the output between chunks
            if rsize > 256 and rsize % 256 == 0 and body.op is Ops.REDUCE:
                cands.append(Opts(dict(hand.upcast), hand.thread, 1, tile=tile, ktile=256))
    return cands


def _dedup(cands: list[Opts]) -> list[Opts]:
    """Distinct candidates, by every field of Opts (a key without `tile` once dropped all cache blocks)."""
    seen: dict[tuple, Opts] = {}
    for o in cands:
        seen.setdefault(o.key(), o)
    return list(seen.values())


def _search_cache_path(body: UOp, out: UOp) -> str:
    from uopc.kernelize import _structure_key

    key = repr((_structure_key([body]), out.dtype.name, out.arg.shape, num_cores(), helpers.CC))
    h = hashlib.sha256(key.encode()).hexdigest()[:32]
    return os.path.join(helpers.cache_dir(), "search", f"{h}.json")


def search_opt(body: UOp, out: UOp, reps: int = 3) -> tuple[UOp, Opts]:
    """Time every distinct candidate on random data and keep the fastest; remember the winner on disk."""
    path = _search_cache_path(body, out)
    try:
        with open(path) as f:
            d = json.load(f)
        o = Opts(
            {int(k): v for k, v in d["upcast"].items()},
            d["thread"],
            d["unroll"],
            {int(k): v for k, v in d["tile"].items()},
            d.get("ktile", 0),
        )
        return lower(body, out, Ctx(opts=o)), o
    except (OSError, ValueError, KeyError, TypeError):
        pass
    best, best_o, best_t = None, None, float("inf")
    for o, t, ast in time_candidates(body, out, reps):
        if t < best_t:
            best, best_o, best_t = ast, o, t
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        json.dump(
            {
                "upcast": best_o.upcast,
                "thread": best_o.thread,
                "unroll": best_o.unroll,
                "tile": best_o.tile,
                "ktile": best_o.ktile,
            },
            f,
        )
    os.replace(tmp, path)
    return best, best_o


search_stats = {"timed": 0}


def time_candidates(body: UOp, out: UOp, reps: int = 3):
    """Yield (opts, best seconds, ast) for every distinct candidate, run on random inputs."""
    from uopc.render_c import render_c
    from uopc.runtime import Program

    bufs = sorted({u for u in body.toposort() if u.op is Ops.BUFFER}, key=lambda u: u.arg.slot)
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(b.arg.shape[0]).astype(b.dtype.np) for b in bufs]
    res = np.zeros(out.arg.shape[0], out.dtype.np)
    for o in _dedup(candidate_opts(body)):
        ast = lower(body, out, Ctx(opts=o))
        prg = Program(render_c(ast, "k"), "k")
        search_stats["timed"] += 1
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            prg(*data, res)
            ts.append(time.perf_counter() - t0)
        yield o, min(ts), ast


class SearchOpt:
    """OPT=2: layout pass + timed search over candidate Opts (results cached on disk)."""

    layout = staticmethod(layout_pass)
    lower = staticmethod(search_opt)

"""The kernelizer: cut a shape graph into kernels (fusion and fission), cache the plan by structure.

A node is materialized (computed by its own kernel into a buffer) if it is a root the user asked for
(unless it already is a contiguous buffer), a STAGE, or a REDUCE (unless fuse_reduce). Everything
between materialization points fuses into the kernel of its nearest materialized consumer.

    softmax(x (4, 8))   ->   r_4   [in 0]               -> tmp 0   (row max)
                             r_4   [in 0, tmp 0]        -> tmp 1   (row sum of exp(x - max))
                             e_4_8 [in 0, tmp 0, tmp 1] -> out 0

A Plan holds no UOps: kernels refer to buffers as ("in", i), ("tmp", j), ("out", r), so one plan
runs any inputs of the same structure. `_plans` maps a structure key (the graph with buffer slots
dropped, constants kept) to its plan: that dictionary is the whole JIT.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from uopc import helpers
from uopc.dtype import DType
from uopc.helpers import prod
from uopc.rangeify import lower
from uopc.rewrite import PatternMatcher, UPat, graph_rewrite
from uopc.uop import ALU, MOVEMENT, Ops, ParamArg, UOp, _argkey

# ---------------------------------------------------------------------------------------------------
# buffers: a BUFFER UOp owns its NumPy array; when the last graph using it dies, so does the memory

_next_slot = 0


ALIGN = 64  # bytes: a cache line, and a multiple of every vector width the kernels use


def aligned_empty(n: int, dtype: DType) -> np.ndarray:
    """An uninitialized flat array whose data starts on an ALIGN boundary.

    NumPy's large allocations start 16 bytes into a page; with 32-byte vector loads every other load would then
    split a cache line (measured: a 1024^3 GEMM kernel 175 vs 192 GFLOP/s at 16 vs 32-byte alignment).
    """
    raw = np.empty(n * dtype.itemsize + ALIGN, np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off : off + n * dtype.itemsize].view(dtype.np)


def new_buffer(dtype: DType, size: int, data: np.ndarray | None = None) -> UOp:
    """A fresh BUFFER (a new positive slot, so hash-consing never merges two buffers); `data` is copied in.

    The copy is aligned and owned by uopc: changing the caller's array later does not change the tensor.
    """
    global _next_slot
    _next_slot += 1
    u = UOp(Ops.BUFFER, (), ParamArg(_next_slot, dtype, (max(size, 1),)))
    if data is not None:
        flat = np.asarray(data).reshape(-1)
        arr = aligned_empty(max(size, 1), dtype)
        arr[: flat.size] = flat
        u.__dict__["np"] = arr
    return u


def _output_buffer(dtype: DType, size: int) -> UOp:
    """A BUFFER for a kernel to write: aligned and uninitialized (the kernel writes every element)."""
    u = new_buffer(dtype, size)
    u.__dict__["np"] = aligned_empty(max(size, 1), dtype)
    return u


def buffer_data(u: UOp) -> np.ndarray:
    """The flat array of a BUFFER UOp (zero-filled on first use)."""
    arr = u.__dict__.get("np")
    if arr is None:
        arr = u.__dict__["np"] = aligned_empty(u.arg.shape[0], u.dtype)
        arr.fill(0)
    return arr


def base_buffer(u: UOp) -> UOp:
    while u.op is Ops.RESHAPE:
        u = u.src[0]
    return u


def is_contiguous_buffer(u: UOp) -> bool:
    """A BUFFER, or RESHAPEs of one: the data is already where a realize would put it."""
    return base_buffer(u).op is Ops.BUFFER


# ---------------------------------------------------------------------------------------------------
# the plan


@dataclass
class Kernel:
    name: str
    src: str
    refs: list[tuple[str, int]]  # one per parameter: ("in", i) | ("tmp", j) | ("out", r)
    program: Any = None
    flops: int = 0
    opts: Any = None  # the Opts it was lowered with (printed at DEBUG>=3)


@dataclass
class Plan:
    kernels: list[Kernel]
    temps: list[tuple[DType, int]]
    outs: list[tuple]  # per root: ("in", i) or ("out", r) alias, or (dtype, size) for a fresh buffer
    temp_arrays: list | None = None  # allocated on the first run, then reused: no page faults every step


def _materialize_points(roots: list[UOp], fuse_reduce: bool) -> list[UOp]:
    """The nodes that get their own kernel, producers before consumers (the schedule order)."""
    rootset = set(roots)
    points = []
    for u in UOp(Ops.SINK, tuple(roots)).toposort()[:-1]:
        if u.op is Ops.STAGE or (u.op is Ops.REDUCE and not fuse_reduce):
            points.append(u)
        elif u in rootset and not is_contiguous_buffer(u):
            points.append(u)
    return points


# Tensor.detach() wraps a node in STAGE("detach"): autodiff stops there, execution ignores it
strip_detach = PatternMatcher([(UPat(Ops.STAGE, arg="detach", src=(UPat.var("x"),)), lambda x: x)])


def _fused_work(u: UOp) -> int:
    """ALU ops times elements that recomputing `u` would cost (stopping at materialized nodes)."""
    n, seen, stack = 0, set(), [u]
    while stack:
        x = stack.pop()
        if x in seen or x.op in (Ops.BUFFER, Ops.REDUCE, Ops.STAGE):
            continue
        seen.add(x)
        n += x.op in ALU
        stack.extend(x.src)
    return n * prod(u.shape)


def stage_broadcast_compute(roots: list[UOp], factor: int = 4, min_work: int = 4096) -> list[UOp]:
    """Materialize a computed value that an EXPAND copies `factor`+ times, when recomputing it is expensive.

    Fusion is free only if nothing is recomputed: a LayerNorm output feeding a matmul would otherwise be
    recomputed for every output column. Tiny values (softmax's 1/sum) and bare CASTs are left fused.
    """
    todo: set[UOp] = set()
    for u in UOp(Ops.SINK, tuple(roots)).toposort():
        if u.op is not Ops.EXPAND or prod(u.shape) < factor * prod(u.src[0].shape):
            continue
        base = u.src[0]
        while base.op in MOVEMENT:
            base = base.src[0]
        if base.op in ALU and base.op is not Ops.CAST and base.shape and _fused_work(base) >= min_work:
            todo.add(base)
    return UOp.wrap(roots, todo, lambda n: UOp(Ops.STAGE, (n,))) if todo else roots


def _kernel_name(body: UOp) -> str:
    red = any(u.op is Ops.REDUCE for u in body.toposort())
    return ("r_" if red else "e_") + "_".join(map(str, body.shape or (1,)))


def _flops(body: UOp) -> int:
    """Rough FLOP count: one per element of every ALU node, plus one per reduced element."""
    topo = body.toposort()
    alu = sum(prod(x.shape or (1,)) for x in topo if x.op in ALU)
    return alu + sum(prod(x.src[0].shape) for x in topo if x.op is Ops.REDUCE)


def make_plan(roots: list[UOp], fuse_reduce: bool = False, opt: Any = None) -> tuple[Plan, list[UOp]]:
    """Kernelize. Returns the plan and the input BUFFERs it refers to as ("in", i) (topological order)."""
    from uopc.render_c import render_c

    inputs = [u for u in UOp(Ops.SINK, tuple(roots)).toposort() if u.op is Ops.BUFFER]
    in_idx = {u: i for i, u in enumerate(inputs)}
    # 1. strip detach markers (they only stop gradients) and reshapes of roots (outputs are flat buffers anyway,
    #    and a reshaped reduce would otherwise be a reduce kernel plus a copy)
    roots = [base_buffer(graph_rewrite(r, strip_detach)) for r in roots]
    # 2. stage broadcast computations ("never write the big intermediate" under fuse_reduce: skip)
    if not fuse_reduce:
        roots = stage_broadcast_compute(roots)
    # 3. the optimizer's layout pass (Chapter 10) may stage transposed operands
    if opt is not None:
        roots = opt.layout(roots)
    # 4. cut: every materialization point gets a reference and a placeholder buffer
    points = _materialize_points(roots, fuse_reduce)
    ref, temps, outs = _assign_refs(points, roots, in_idx)
    place: dict[UOp, UOp] = {}
    for u in points:  # negative slots: placeholders can never collide with real buffers
        ph = UOp(Ops.BUFFER, (), ParamArg(-1 - len(place), u.dtype, (max(1, prod(u.shape)),)))
        place[u] = ph.reshape(u.shape) if u.shape != ph.shape else ph
    ph_ref = {base_buffer(place[u]).arg.slot: ref[u] for u in points}
    # 5. lower each piece into its own kernel
    kernels = []
    for u in points:
        body = u.src[0] if u.op is Ops.STAGE else u
        body = body.substitute({p: v for p, v in place.items() if p is not u})
        # renumber buffers 0..n-1 in topological order (output last): identical kernels render identical C
        bufs = [b for b in body.toposort() if b.op is Ops.BUFFER]
        local = {b: UOp(Ops.BUFFER, (), ParamArg(i, b.dtype, b.arg.shape)) for i, b in enumerate(bufs)}
        out = UOp(Ops.BUFFER, (), ParamArg(len(bufs), u.dtype, (max(1, prod(u.shape)),)))
        body = body.substitute(local)
        name = _kernel_name(body)
        ast, opts = opt.lower(body, out) if opt is not None else (lower(body, out), None)
        src = render_c(ast, name)
        refs = [ph_ref[b.arg.slot] if b.arg.slot < 0 else ("in", in_idx[b]) for b in bufs] + [ref[u]]
        # simplification can delete a read (x*0 -> 0): the C signature then has fewer parameters,
        # so bind exactly the slots that survive lowering, or every later argument shifts by one
        alive = sorted({b.arg.slot for b in ast.toposort() if b.op is Ops.BUFFER})
        kernels.append(Kernel(name, src, [refs[s] for s in alive], flops=_flops(body), opts=opts))
    return Plan(kernels, temps, outs), inputs


def _assign_refs(points: list[UOp], roots: list[UOp], in_idx: dict[UOp, int]):
    """Temps for the inner points, outputs for the roots (a root that is already a buffer aliases its input)."""
    ref: dict[UOp, tuple[str, int]] = {}
    temps: list[tuple[DType, int]] = []
    rootset = set(roots)
    for u in points:
        if u not in rootset:
            ref[u] = ("tmp", len(temps))
            temps.append((u.dtype, max(1, prod(u.shape))))
    outs: list[tuple] = []
    for r, u in enumerate(roots):
        if is_contiguous_buffer(u):
            outs.append(("in", in_idx[base_buffer(u)]))
        elif u in ref and ref[u][0] == "out":  # the same value as an earlier root (e.g. x.sum(1) and its keepdim)
            outs.append(ref[u])
        else:
            ref[u] = ("out", r)
            outs.append((u.dtype, max(1, prod(u.shape))))
    return ref, temps, outs


# ---------------------------------------------------------------------------------------------------
# the structural cache ("JIT"): same graph shape -> same plan, whatever the buffers hold

_plans: OrderedDict[tuple, Plan] = OrderedDict()
plan_cache_size = helpers.PLAN_CACHE_SIZE


def _structure(roots: list[UOp]) -> tuple[tuple, list[UOp]]:
    """The structure key and the input BUFFERs, from one walk of the graph.

    The key is the graph in topological order as (op, dtype, arg, source positions); a BUFFER is only its dtype
    and size, so graphs that differ only in which buffers they read share a plan (inputs bind by position).
    """
    ids: dict[UOp, int] = {}
    key = []
    inputs = []
    for u in UOp(Ops.SINK, tuple(roots)).toposort():
        ids[u] = len(ids)
        if u.op is Ops.BUFFER:
            inputs.append(u)
            arg = ("buf", u.dtype.name, u.arg.shape)
        else:
            arg = _argkey(u.arg)
        key.append((u.op, u.dtype, arg, tuple(ids[s] for s in u.src)))
    return tuple(key), inputs


def _structure_key(roots: list[UOp]) -> tuple:
    return _structure(roots)[0]


def default_opt() -> Any:
    """The optimizer the OPT setting selects: None (OPT=0), HandOpt (1, default) or SearchOpt (2)."""
    if helpers.OPT <= 0:
        return None
    try:
        from uopc import opt as _opt
    except ImportError:  # the optimizer module is optional: without it, kernels are unoptimized
        return None
    return _opt.SearchOpt if helpers.OPT >= 2 else _opt.HandOpt


def _compile(plan: Plan) -> None:
    from uopc.runtime import Program

    for k in plan.kernels:
        k.program = Program(k.src, k.name)
        if helpers.DEBUG >= 4:
            print(k.src)


def realize(roots: list[UOp], fuse_reduce: bool = False, opt: Any = None) -> list[UOp]:
    """Compute each root. Returns, per root, a BUFFER UOp holding the result."""
    uniq = list(dict.fromkeys(roots))
    t0 = time.perf_counter()
    skey, inputs = _structure(uniq)
    key = (skey, fuse_reduce, opt)
    plan = _plans.get(key)
    if plan is None:
        plan, _ = make_plan(uniq, fuse_reduce, opt)
        _compile(plan)
        _plans[key] = plan
        while len(_plans) > max(1, plan_cache_size):  # least recently used plans go first
            _plans.popitem(last=False)
    else:
        _plans.move_to_end(key)
    t1 = time.perf_counter()
    if plan.temp_arrays is None:
        plan.temp_arrays = [aligned_empty(n, d) for d, n in plan.temps]
    temps = plan.temp_arrays
    # fresh outputs are fully written by their kernel: uninitialized, not zeros (no 4 MB memset per 1024^2 result)
    outs: list[UOp] = []
    for o in plan.outs:
        if o[0] == "in":
            outs.append(inputs[o[1]])
        elif o[0] == "out":
            outs.append(outs[o[1]])
        else:
            outs.append(_output_buffer(o[0], o[1]))
    arrays = {"in": [buffer_data(b) for b in inputs], "tmp": temps, "out": [buffer_data(o) for o in outs]}
    for k in plan.kernels:
        args = [arrays[kind][i] for kind, i in k.refs]
        ts = time.perf_counter()
        k.program(*args)
        if helpers.DEBUG >= 2:
            _print_kernel(k, args, time.perf_counter() - ts)
    if helpers.DEBUG >= 1:
        t2 = time.perf_counter()
        print(f"realize: {len(plan.kernels)} kernels, schedule {(t1 - t0) * 1e3:.1f} ms, run {(t2 - t1) * 1e3:.1f} ms")
    by_root = dict(zip(uniq, outs))
    return [by_root[r] for r in roots]


def _print_kernel(k: Kernel, args: list[np.ndarray], dt: float) -> None:
    extra = ""
    if helpers.DEBUG >= 3:  # run again: warm caches, no first-touch page faults
        ts = time.perf_counter()
        k.program(*args)
        extra = f"  (again: {(time.perf_counter() - ts) * 1e3:.3f} ms)"
        if k.opts is not None:
            extra += f"  {k.opts}"
    print(f"  {k.name:30s} {dt * 1e3:8.3f} ms  {k.flops / max(dt, 1e-9) / 1e9:7.2f} GFLOP/s{extra}")

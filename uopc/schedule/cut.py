"""The scheduler: cut a shape graph into kernels (fusion and fission). No lowering and no C here: `schedule`
returns unlowered ScheduleItems, and the engine (uopc.engine.lower) lowers them into the Plan's kernels.

A node is materialized (computed by its own kernel into a buffer) if it is a root the user asked for
(unless it already is a contiguous buffer), a STAGE, or a REDUCE (unless fuse_reduce). Everything
between materialization points fuses into the kernel of its nearest materialized consumer.

    softmax(x (4, 8))   ->   r_4   [in 0]               -> tmp 0   (row max)
                             r_4n1 [in 0, tmp 0]        -> tmp 1   (row sum of exp(x - max))
                             e_4_8 [in 0, tmp 0, tmp 1] -> out 0

Once lowered, two different kernels of one plan never share a name: a later one whose shape name is taken gets a
suffix n1, n2.. (identical kernels keep one name, so they share one C source and one compile).

A Plan holds no UOps of the user's graph: kernels refer to buffers as Ref(RefKind.IN, i), Ref(RefKind.TMP, j) or
Ref(RefKind.OUT, r) (printed in[i], tmp[j], out[r]), so one plan runs any inputs of the same structure
(uopc.engine.realize
caches plans by structure).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from uopc import helpers
from uopc.helpers import prod
from uopc.schedule.plan import Copy, Out, Ref, RefKind, Schedule, ScheduleItem, Temp
from uopc.uop import ALU, MOVEMENT, Ops, ParamArg, UOp, base_buffer
from uopc.uop.rewrite import PatternMatcher, UPat, graph_rewrite

__all__ = [
    "checks_of",
    "epilogue_fusions",
    "kernel_name",
    "kernel_op",
    "moved_bytes",
    "schedule",
    "stage_broadcast_compute",
    "stage_recomputed",
    "stage_shared_chains",
    "strip_detach",
]


def _materialize_points(roots: list[UOp], fuse_reduce: bool, epilogues: frozenset[UOp] = frozenset()) -> list[UOp]:
    """The nodes that get their own kernel, producers before consumers (the schedule order). A REDUCE in
    `epilogues` is computed by the kernel that reads it (see epilogue_fusions)."""
    rootset = set(roots)
    points = []
    for u in UOp(Ops.SINK, tuple(roots)).toposort()[:-1]:
        if u.op in (Ops.STAGE, Ops.SCATTER, Ops.SETITEM):
            points.append(u)
        elif u.op is Ops.REDUCE and not fuse_reduce and u not in epilogues:
            points.append(u)
        elif u in rootset and base_buffer(u).op is not Ops.BUFFER:
            points.append(u)
    return points


def _region(body: UOp) -> list[UOp]:
    """The nodes a kernel computing `body` evaluates: its graph down to the materialized nodes it reads (included,
    not entered)."""
    out, seen, stack = [], set(), [body]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        out.append(u)
        if u is body or u.op not in _MATERIALIZED:
            stack.extend(u.src)
    return out


def _at_own_index(body: UOp, r: UOp) -> bool:
    """Does `body` read REDUCE `r` only through ALU ops of r's shape, so each output element reads r at its own
    index (r's elements are each computed once, by the output element that uses it)?"""
    found, seen, stack = False, set(), [body]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u is r:
            found = True
        elif u.op in ALU and u.shape == r.shape:
            stack.extend(u.src)
        elif u.op not in _MATERIALIZED and r in _region(u):  # read through a view or at another shape
            return False
    return found


def epilogue_fusions(roots: list[UOp], points: list[UOp], accepts: Any) -> frozenset[UOp]:
    """The REDUCEs that are computed by the one kernel that reads them, as the reduce of that kernel followed by its
    elementwise ops (an epilogue: a matmul's bias, activation, residual add applied while the tile is in registers).

    The cost rule: fusing saves writing r and reading it back (2 x its bytes) and recomputes nothing, when exactly
    one kernel reads r, only through elementwise ops at r's own index, and that kernel computes no other fused
    reduce. `accepts(r, reader_body)` is the optimizer's say (it fuses only what its kernels keep fast: the GEMM
    microkernel takes an epilogue); without an optimizer nothing is fused, so OPT=0 keeps Chapter 7's kernels."""
    if accepts is None:
        return frozenset()
    rootset = set(roots)
    readers: dict[UOp, list[UOp]] = {}
    for p in points:
        body = p.src[0] if p.op is Ops.STAGE else p
        for u in _region(body):
            if u.op is Ops.REDUCE and u is not body:
                readers.setdefault(u, []).append(p)
    fused: dict[UOp, UOp] = {}  # kernel -> the reduce it takes in
    taken: set[UOp] = set()
    for r, ks in readers.items():
        if r in rootset or len(ks) != 1 or ks[0].op in (Ops.REDUCE, Ops.SCATTER, Ops.SETITEM):
            continue
        k = ks[0]
        body = k.src[0] if k.op is Ops.STAGE else k
        if body.shape == r.shape and _at_own_index(body, r) and accepts(r, body):
            if k in fused:  # two matmuls in one kernel: neither gets the microkernel, so neither fuses
                taken.add(k)
            else:
                fused[k] = r
    return frozenset(r for k, r in fused.items() if k not in taken)


# Tensor.detach() wraps a node in STAGE("detach"): autodiff stops there, execution ignores it; a CUSTOM_GRAD marker
# only tells autodiff which rule differentiates its value: execution computes the value
strip_detach = PatternMatcher(
    [
        (UPat(Ops.STAGE, arg="detach", src=(UPat.var("x"),)), lambda x: x),
        (UPat(Ops.CUSTOM_GRAD, name="m"), lambda m: m.src[0]),
    ]
)


# a node's kernel reads what it was computed from: buffers and other kernels' results
_MATERIALIZED = (Ops.BUFFER, Ops.REDUCE, Ops.STAGE, Ops.SCATTER, Ops.SETITEM)


def _fused_work(u: UOp) -> int:
    """ALU ops times elements that recomputing `u` would cost (stopping at materialized nodes)."""
    n, seen, stack = 0, set(), [u]
    while stack:
        x = stack.pop()
        if x in seen or x.op in _MATERIALIZED:
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
        src = u.src[0]
        while src.op in MOVEMENT:
            src = src.src[0]
        if src.op in ALU and src.op is not Ops.CAST and src.shape and _fused_work(src) >= min_work:
            todo.add(src)
    return UOp.wrap(roots, todo, lambda n: UOp(Ops.STAGE, (n,))) if todo else roots


def stage_shared_chains(roots: list[UOp], min_reads: int = 3) -> list[UOp]:
    """Materialize an elementwise value that two or more kernels would each recompute from `min_reads` or more
    materialized inputs of its own size (buffers, reductions, staged values; a broadcast bias or statistic is not
    counted: re-reading it is cheap).

    Fusion recomputes an unmaterialized value in every kernel that reads it. That is free for a short chain, but a
    transformer's residual stream x + attn_1 + mlp_1 + ... + mlp_L, read by layer L's LayerNorm reductions, grew by
    two full-size reads per layer: GPT-2's 12 layers had 49 distinct LayerNorm kernels (6.5 KB to 12.7 KB of C each,
    none shared between layers, quadratic work to lower, compile and run). Staged once it reaches `min_reads`, the
    stream restarts from one buffer and every layer schedules to the same kernels. Bottom-up, a staged value counts
    as one read for the values built on it. Counting only full-size reads leaves alone the many-input but
    non-growing elementwise chains of a BatchNorm backward (staging those measured 10% slower on the CNN step)."""
    order = UOp(Ops.SINK, tuple(roots)).toposort()[:-1]
    kernels = _computing_kernels(order, set(roots))
    # per node: the materialized inputs its recomputation reads, with their element counts
    reads: dict[UOp, frozenset[tuple[UOp, int]]] = {}
    todo: set[UOp] = set()
    for u in order:
        if u.op in _MATERIALIZED:
            reads[u] = frozenset(((u, prod(u.shape)),))
            continue
        r = frozenset().union(*(reads[x] for x in u.src))
        if u.op in ALU and u.op is not Ops.CAST and u.shape and len(kernels.get(u, ())) >= 2:
            n = prod(u.shape)
            if sum(size >= n for _, size in r) >= min_reads:
                todo.add(u)
                r = frozenset(((u, n),))
        reads[u] = r
    return UOp.wrap(roots, todo, lambda n: UOp(Ops.STAGE, (n,))) if todo else roots


def _computing_kernels(order: list[UOp], rootset: set[UOp]) -> dict[UOp, set[UOp]]:
    """The kernels that would compute each node of `order` (topological): a materialized consumer is one kernel,
    other consumers pass theirs on (stage_recomputed walks the same way, deciding as it goes)."""
    kernels: dict[UOp, set[UOp]] = {}
    for u in reversed(order):
        if u in rootset:
            kernels.setdefault(u, set()).add(u)
        mine = kernels.get(u, set())
        for x in u.src:
            if x.op in _MATERIALIZED or x.op is Ops.CONST:
                continue
            kernels.setdefault(x, set()).update({u} if u.op in _MATERIALIZED else mine)
    return kernels


# ALU ops per element that recomputing a value costs, by op: a square root, a division or a transcendental takes
# the time of several adds (their throughput on x86 vectors is a fraction of an add's)
_OP_COST = {Ops.SQRT: 8, Ops.RECIP: 8, Ops.EXP2: 8, Ops.LOG2: 8, Ops.SIN: 16, Ops.IDIV: 8, Ops.MOD: 8}
# staging a value writes it once and reads it back once (8 bytes per float32 element) in place of recomputing it:
# worth it when the kernels besides the first would together spend more than RECOMPUTE_OPS_PER_BYTE ALU ops per
# byte that adds (elementwise code runs at a few ops per byte of memory traffic on the CPUs we target)
RECOMPUTE_OPS_PER_BYTE = 2
# ...and when the ops it saves in all come to more than a kernel launch costs (a few microseconds: stage_broadcast_
# compute's 4096): a scalar that 40 kernels recompute per element is not worth a kernel of its own
RECOMPUTE_MIN_GAIN = 4096


def stage_recomputed(roots: list[UOp], ops_per_byte: int = RECOMPUTE_OPS_PER_BYTE) -> list[UOp]:
    """Materialize an elementwise value that several kernels would each recompute when, by the cost rule, the
    recomputation costs more than one write and one read of it (Chapter 7, exercise 9: ALU ops against bytes, at a
    machine balance of `ops_per_byte`).

    A CNN's activation relu(batchnorm(conv)) is read by the max-pool, by its backward (where the maximum is) and by
    BatchNorm's backward reductions: five kernels each recomputing the normalization (a square root and a division
    per element) measured 1.5x slower than the step with it staged. Weighed from the consumers down, so a chain's
    top is staged first and the values under it are then computed once, by its kernel."""
    order = UOp(Ops.SINK, tuple(roots)).toposort()[:-1]
    rootset, todo = set(roots), set()
    # per node, bottom-up: ALU ops per element to compute it, and the materialized nodes computing it reads
    work: dict[UOp, int] = {}
    reads: dict[UOp, frozenset] = {}
    for u in order:
        if u.op in _MATERIALIZED or u.op is Ops.CONST:
            work[u], reads[u] = 0, frozenset((u,)) if u.op is not Ops.CONST else frozenset()
        else:
            work[u] = sum(work[x] for x in u.src) + (_OP_COST.get(u.op, 1) if u.op in ALU else 0)
            reads[u] = frozenset().union(*(reads[x] for x in u.src))
    # top-down, consumers first: the kernels that compute each node, given what was staged above it; a staged value
    # is computed once, by its own kernel, so the values under it are weighed with that
    kernels: dict[UOp, set[UOp]] = {}
    for u in reversed(order):
        if u in rootset:
            kernels.setdefault(u, set()).add(u)
        k = len(kernels.get(u, ()))
        if u.op in ALU and u.op is not Ops.CAST and u.shape and k >= 2:
            n, size = prod(u.shape), u.dtype.itemsize
            # bytes per element of u that computing it reads (a broadcast input: its share)
            in_bytes = sum(x.dtype.itemsize * min(1.0, prod(x.shape) / n) for x in reads[u])
            # k kernels recomputing u: (k-1) extra computations and reads of its inputs; staged: its inputs read
            # once, u written once and read k times
            gain = (k - 1) * work[u] + ops_per_byte * ((k - 1) * in_bytes - (k + 1) * size)
            if gain * n > RECOMPUTE_MIN_GAIN:  # and it pays for the staging kernel's own launch
                todo.add(u)
        mine = {u} if u in todo else kernels.get(u, set())
        for x in u.src:
            if x.op in _MATERIALIZED or x.op is Ops.CONST:
                continue
            kernels.setdefault(x, set()).update({u} if u.op in _MATERIALIZED else mine)
    return UOp.wrap(roots, todo, lambda n: UOp(Ops.STAGE, (n,))) if todo else roots


def kernel_name(body: UOp) -> str:
    """r_ for a kernel with a reduction, e_ otherwise, then the output shape (r_4_8)."""
    red = any(u.op is Ops.REDUCE for u in body.toposort())
    return ("r_" if red else "e_") + "_".join(map(str, body.shape or (1,)))


def kernel_op(body: UOp) -> str:
    """A short description of what a kernel computes: the reduction (sum, max, matmul) and the elementwise ops."""
    topo = body.toposort()
    alu = list(dict.fromkeys(x.op.name.lower() for x in topo if x.op in ALU and x.op is not Ops.CAST))
    red = [x for x in topo if x.op is Ops.REDUCE]
    if not red:
        return "elementwise " + " ".join(alu[:4]) + (" ..." if len(alu) > 4 else "") if alu else "copy"
    r = red[-1]
    src = r.src[0]
    while src.op is Ops.CAST:
        src = src.src[0]
    # a sum of products of two broadcast operands is a contraction: the matmul of Tensor.__matmul__ / dot
    contraction = r.arg[0] is Ops.ADD and src.op is Ops.MUL and all(_broadcast(s) for s in src.src)
    what = "matmul" if contraction else {Ops.ADD: "sum", Ops.MAX: "max"}.get(r.arg[0], str(r.arg[0]))
    inner = [a for a in alu if not (contraction and a in ("mul", "add"))]
    return what + (f" ({' '.join(inner[:3])}{' ...' if len(inner) > 3 else ''})" if inner else "")


def _broadcast(u: UOp) -> bool:
    """Whether `u` reads buffers and every one is smaller than `u`: its values are broadcast (a matmul operand)."""
    sizes = [prod(b.arg.shape) for b in u.toposort() if b.op is Ops.BUFFER]
    return bool(sizes) and max(sizes) < prod(u.shape)


def _flops(body: UOp) -> int:
    """Rough FLOP count: one per element of every ALU node, plus one per reduced element."""
    topo = body.toposort()
    alu = sum(prod(x.shape or (1,)) for x in topo if x.op in ALU)
    return alu + sum(prod(x.src[0].shape) for x in topo if x.op is Ops.REDUCE)


def schedule(roots: list[UOp], fuse_reduce: bool = False, opt: Any = None) -> tuple[Schedule, list[UOp]]:
    """Kernelize, up to lowering. Returns the schedule and the input BUFFERs it refers to as Ref(RefKind.IN, i)
    (topological order); uopc.kernelize.make_plan lowers it into a Plan.

    `opt` is the optimizer (uopc.opt.HandOpt or SearchOpt): its `layout` pass runs on the graph here (it chooses
    each kernel's Opts when the kernel is lowered). None: no layout pass.
    """
    inputs = [u for u in UOp(Ops.SINK, tuple(roots)).toposort() if u.op is Ops.BUFFER]
    in_idx = {u: i for i, u in enumerate(inputs)}
    # 1. strip detach and custom-gradient markers (they only steer gradients) and reshapes of roots (outputs are
    #    flat buffers anyway, and a reshaped reduce would otherwise be a reduce kernel plus a copy)
    roots = [base_buffer(graph_rewrite(r, strip_detach)) for r in roots]
    # 2. stage broadcast computations ("never write the big intermediate" under fuse_reduce: skip)
    if not fuse_reduce:
        roots = stage_shared_chains(stage_broadcast_compute(roots))
        if opt is not None:  # the cost rule weighs ops against bytes for optimized kernels (OPT=0: Chapter 7's cuts)
            roots = stage_recomputed(roots)
    # 3. the optimizer's layout pass may stage transposed operands
    if opt is not None:
        with helpers.phase("layout"):
            roots = opt.layout(roots)
    # 4. cut: every materialization point gets a reference and a placeholder buffer; a matmul whose one reader is
    #    elementwise at its own index is computed by that reader (an epilogue), if the optimizer takes it
    points = _materialize_points(roots, fuse_reduce)
    if not fuse_reduce:
        fused = epilogue_fusions(roots, points, getattr(opt, "epilogue", None))
        if fused:
            points = _materialize_points(roots, fuse_reduce, fused)
    ref, temps, outs = _assign_refs(points, roots, in_idx)
    place: dict[UOp, UOp] = {}
    for u in points:  # negative slots: placeholders can never collide with real buffers
        ph = UOp(Ops.BUFFER, (), ParamArg(-1 - len(place), u.dtype, (max(1, prod(u.shape)),)))
        place[u] = ph.reshape(u.shape) if u.shape != ph.shape else ph
    ph_ref = {base_buffer(place[u]).arg.slot: ref[u] for u in points}
    # 5. one item per piece (a SCATTER or SETITEM is two: copy its base, then write the values in)
    items: list[ScheduleItem] = []
    n_err = 0  # error records so far: a kernel with index checks gets the next one
    for u in points:
        body = u.src[0] if u.op is Ops.STAGE else u
        body = body.substitute({p: v for p, v in place.items() if p is not u})
        for piece in (body.src[0], body) if body.op in (Ops.SCATTER, Ops.SETITEM) else (body,):
            item = _item(piece, ref[u], ph_ref, in_idx, n_err)
            if piece is not body and base_buffer(piece) in in_idx:  # the base copied as it is
                item = replace(item, copy=Copy(Ref(RefKind.IN, in_idx[base_buffer(piece)]), ref[u]))
            n_err += bool(item.checks)
            items.append(item)
    return Schedule(tuple(items), tuple(temps), tuple(outs), n_err), inputs


def _item(body: UOp, out_ref: Ref, ph_ref: dict[int, Ref], in_idx: dict[UOp, int], n_err: int) -> ScheduleItem:
    """One piece of the graph, writing `out_ref`: its buffers renumbered, its parameters bound to refs."""
    # renumber buffers 0..n-1 in topological order (output last): identical kernels are one body
    bufs = [b for b in body.toposort() if b.op is Ops.BUFFER]
    local = {b: UOp(Ops.BUFFER, (), ParamArg(i, b.dtype, b.arg.shape)) for i, b in enumerate(bufs)}
    out = UOp(Ops.BUFFER, (), ParamArg(len(bufs), body.dtype, (max(1, prod(body.shape)),)))
    body = body.substitute(local)
    work = body.src[1] if body.op is Ops.SETITEM else body  # what it computes: a region write, its value alone
    refs = [ph_ref[b.arg.slot] if b.arg.slot < 0 else Ref(RefKind.IN, in_idx[b]) for b in bufs] + [out_ref]
    checks = checks_of(work)
    if checks:  # the error record is the parameter after the output; one record per kernel that checks
        refs.append(Ref(RefKind.ERR, n_err))
    if body.op is Ops.SCATTER:  # the accumulating half: named by the values it adds in
        name, op = "s_" + "_".join(map(str, body.src[2].shape or (1,))), f"scatter_{body.arg[3].name.lower()}"
    elif body.op is Ops.SETITEM:  # the region write: named by the region (w_ and its counts)
        name, op = "w_" + "_".join(map(str, work.shape or (1,))), f"setitem ({kernel_op(work)})"
    else:
        name, op = kernel_name(body), kernel_op(body)
    return ScheduleItem(name, body, out, tuple(refs), _flops(work), checks, op)


def checks_of(root: UOp) -> tuple[str, ...]:
    """The labels of the data-dependent index checks of a kernel body (its GATHERs and SCATTERs), in the order
    lowering numbers them."""
    return tuple(u.arg[1] for u in root.toposort() if u.op in (Ops.GATHER, Ops.SCATTER))


def moved_bytes(item: ScheduleItem, slots: list[int]) -> int:
    """Bytes a kernel must move at least: each buffer it still reads once (its `slots` that survive lowering), and
    its output once (a region write: the region)."""
    bufs = {b.arg.slot: b for b in item.body.toposort() if b.op is Ops.BUFFER}
    read = sum(prod(bufs[i].arg.shape) * bufs[i].dtype.itemsize for i in slots if i in bufs and bufs[i] is not item.out)
    written = prod(item.body.src[1].shape) if item.body.op is Ops.SETITEM else prod(item.out.arg.shape)
    return read + written * item.out.dtype.itemsize


def _assign_refs(
    points: list[UOp], roots: list[UOp], in_idx: dict[UOp, int]
) -> tuple[dict[UOp, Ref], list[Temp], list[Out]]:
    """Temps for the inner points, outputs for the roots (a root that is already a buffer aliases its input)."""
    ref: dict[UOp, Ref] = {}
    temps: list[Temp] = []
    rootset = set(roots)
    for u in points:
        if u not in rootset:
            ref[u] = Ref(RefKind.TMP, len(temps))
            temps.append(Temp(u.dtype, max(1, prod(u.shape))))
    outs: list[Out] = []
    for r, u in enumerate(roots):
        if (b := base_buffer(u)).op is Ops.BUFFER:
            outs.append(Out(b.dtype, prod(b.arg.shape), Ref(RefKind.IN, in_idx[b])))
        elif u in ref and ref[u].kind is RefKind.OUT:  # the same value as an earlier root (x.sum(1) and its keepdim)
            outs.append(outs[ref[u].i]._replace(alias=ref[u]))
        else:
            ref[u] = Ref(RefKind.OUT, r)
            outs.append(Out(u.dtype, max(1, prod(u.shape))))
    return ref, temps, outs

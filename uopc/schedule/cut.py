"""The scheduler: cut a shape graph into kernels (fusion and fission). No lowering and no C here: `schedule`
returns unlowered ScheduleItems, and the engine (uopc.engine.lower) lowers them into the Plan's kernels.

A node is materialized (computed by its own kernel into a buffer) if it is a root the user asked for
(unless it already is a contiguous buffer), a STAGE, or a REDUCE (unless fuse_reduce). Everything
between materialization points fuses into the kernel of its nearest materialized consumer.

    softmax(x (4, 8))   ->   r_4   [in 0]               -> tmp 0   (row max)
                             r_4n1 [in 0, tmp 0]        -> tmp 1   (row sum of exp(x - max))
                             e_4_8 [in 0, tmp 0, tmp 1] -> out 0

That is Chapter 7's cut (OPT=0). With an optimizer, the rules of uopc.schedule.fusion also stage values several
kernels would recompute, and let a kernel compute the reduces it reads as a matmul's epilogue or per row: softmax
is then one kernel, r_4_8, its max and sum in loops over each row before the loop that writes it.

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
from uopc.schedule.attention import recognize_attention
from uopc.schedule.epilogues import epilogue_fusions, lift_epilogues, winograd_epilogues
from uopc.schedule.fold import fold_channel_factors
from uopc.schedule.fusion import (
    contraction,
    read_staged,
    row_fusions,
    stage_attention_operands,
    stage_broadcast_compute,
    stage_recomputed,
    stage_rows,
    stage_shared_chains,
)
from uopc.schedule.groups import update_groups
from uopc.schedule.plan import Copy, Out, Ref, RefKind, Schedule, ScheduleItem, Temp
from uopc.uop import ALU, OWN_KERNEL, Ops, ParamArg, UOp, base_buffer, sink
from uopc.uop.rewrite import PatternMatcher, UPat, graph_rewrite_all
from uopc.uop.winograd import winograd_of

__all__ = [
    "checks_of",
    "epilogue_fusions",
    "kernel_name",
    "kernel_op",
    "moved_bytes",
    "row_fusions",
    "schedule",
    "stage_broadcast_compute",
    "stage_rows",
    "stage_recomputed",
    "stage_shared_chains",
    "strip_detach",
]


def _materialize_points(roots: list[UOp], fuse_reduce: bool, epilogues: frozenset[UOp] = frozenset()) -> list[UOp]:
    """The nodes that get their own kernel, producers before consumers (the schedule order). A REDUCE in
    `epilogues` (or Winograd output transform) is computed by the kernel that reads it (see epilogue_fusions,
    winograd_epilogues)."""
    rootset = set(roots)
    points = []
    for u in UOp(Ops.SINK, tuple(roots)).toposort()[:-1]:
        if u.op in (Ops.STAGE, Ops.SCATTER, Ops.SETITEM) or (u.op in OWN_KERNEL and u not in epilogues):
            points.append(u)
        elif u.op is Ops.REDUCE and not fuse_reduce and u not in epilogues:
            points.append(u)
        elif u in rootset and base_buffer(u).op is not Ops.BUFFER:
            points.append(u)
    return points


# Tensor.detach() wraps a node in STAGE("detach"): autodiff stops there, execution ignores it; a CUSTOM_GRAD marker
# only tells autodiff which rule differentiates its value: execution computes the value
strip_detach = PatternMatcher(
    [
        (UPat(Ops.STAGE, arg="detach", src=(UPat.var("x"),)), lambda x: x),
        (UPat(Ops.CUSTOM_GRAD, name="m"), lambda m: m.src[0]),
    ]
)


def kernel_name(body: UOp) -> str:
    """r_ for a kernel with a reduction, e_ otherwise, then the output shape (r_4_8); fa_ for fused attention, wi_
    wo_ and ww_ for a Winograd convolution's input, output and weight transforms (an output transform with its
    epilogue too)."""
    if body.op is Ops.ATTENTION:
        return "fa_" + "_".join(map(str, body.shape))
    if (w := winograd_of(body)) is not None:
        return f"w{w.arg.kind[0]}_" + "_".join(map(str, body.shape))
    red = any(u.op is Ops.REDUCE for u in body.toposort())
    return ("r_" if red else "e_") + "_".join(map(str, body.shape or (1,)))


_REDUCE_NAMES = {Ops.ADD: "sum", Ops.MAX: "max"}


def kernel_op(body: UOp) -> str:
    """A short description of what a kernel computes: the reduction (sum, max, matmul) and the elementwise ops."""
    if body.op is Ops.ATTENTION:
        kind = "" if body.arg.kind == "out" else f" {body.arg.kind}"
        return "attention" + kind + (" causal" if body.arg.causal else "")
    topo = body.toposort()
    alu = list(dict.fromkeys(x.op.name.lower() for x in topo if x.op in ALU and x.op is not Ops.CAST))
    if (w := winograd_of(body)) is not None:
        what = {"in": "input", "out": "output", "w": "weight"}[w.arg.kind]
        inner = f" ({' '.join(alu[:3])}{' ...' if len(alu) > 3 else ''})" if alu else ""
        return f"winograd F({w.arg.m},3) {what} transform{inner}"
    red = [x for x in topo if x.op is Ops.REDUCE]
    if not red:
        return "elementwise " + " ".join(alu[:4]) + (" ..." if len(alu) > 4 else "") if alu else "copy"
    r = red[-1]
    # a row kernel (uopc.schedule.fusion.row_fusions) computes several reduces per row: each is named, in order
    rows = [_REDUCE_NAMES.get(x.arg[0], str(x.arg[0])) for x in red[:-1]]
    matmul = contraction(r)  # the matmul of Tensor.__matmul__ / dot
    what = "matmul" if matmul else _REDUCE_NAMES.get(r.arg[0], str(r.arg[0]))
    inner = [a for a in alu if not (matmul and a in ("mul", "add"))]
    what = ", ".join(list(dict.fromkeys(rows)) + [what])
    return what + (f" ({' '.join(inner[:3])}{' ...' if len(inner) > 3 else ''})" if inner else "")


def _flops(body: UOp) -> int:
    """Rough FLOP count: one per element of every ALU node, plus one per reduced element."""
    if body.op is Ops.ATTENTION:  # the two products q k^T and p v (the backward's: four), causal or not
        q, k = body.src[0].shape, body.src[1].shape
        return (2 if body.arg.kind in ("out", "lse") else 4) * prod(q[:-1]) * int(k[-2]) * (q[-1] + k[-1])
    if body.op is Ops.WINOGRAD:
        return _winograd_flops(body)
    topo = body.toposort()
    alu = sum(prod(x.shape or (1,)) for x in topo if x.op in ALU)
    alu += sum(_winograd_flops(x) for x in topo if x.op is Ops.WINOGRAD)  # an output transform's epilogue's
    return alu + sum(prod(x.src[0].shape) for x in topo if x.op is Ops.REDUCE)


def _winograd_flops(w: UOp) -> int:
    """Per tile, B^T d B (or A^T y A) as two small products of constant matrices."""
    a = w.arg.m + 2
    if w.arg.kind == "w":  # per filter, G g (alpha x 3 x 3) then (G g) G^T (alpha x alpha x 3)
        return prod(w.shape) // a // a * 2 * 3 * a * (3 + a)
    tiles = prod(w.shape) // a // a if w.arg.kind == "in" else prod(w.src[0].shape) // a // a
    return tiles * 2 * a * a * (a + (a if w.arg.kind == "in" else w.arg.m))


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
    #    (with an optimizer and UOPC_FOLD_BN=1, a factor per channel of a convolution is folded into its weight
    #    first: the markers say where the convolutions are)
    if opt is not None and not fuse_reduce and helpers.settings().FOLD_BN:
        roots = fold_channel_factors(roots)
    roots = [base_buffer(r) for r in graph_rewrite_all(roots, strip_detach)]
    #    a fused attention reads its sources where they are stored: any other source is materialized first (before
    #    the layout pass moves views below elementwise ops, so that q, k and v share their projection's one buffer)
    if opt is not None and not fuse_reduce:  # attention written out is fused too (with an optimizer)
        roots = recognize_attention(roots)
    roots, barriers = stage_attention_operands(roots, _materialize_points(roots, fuse_reduce))
    # 2. stage broadcast computations ("never write the big intermediate" under fuse_reduce: skip)
    if not fuse_reduce:
        if opt is not None:  # (a value stored anyway is read stored by every reader: OPT=0 keeps Chapter 7's cuts)
            roots = read_staged(roots)
        roots = stage_shared_chains(stage_broadcast_compute(roots))
        if opt is not None:  # the cost rule weighs ops against bytes for optimized kernels (OPT=0: Chapter 7's cuts)
            # it counts the kernels a value is computed in, so it asks which reduces will be computed per row first
            rowwise = row_fusions(roots, _materialize_points(roots, False), getattr(opt, "row_fusion", None))
            roots = stage_recomputed(roots, rowwise=rowwise)
    # 3. the optimizer's layout pass may stage transposed operands
    if opt is not None:
        with helpers.phase("layout"):
            roots = opt.layout(roots)
    if barriers:  # (stage_attention_operands' barriers have kept the layout pass's views off their sources)
        roots = graph_rewrite_all(roots, strip_detach)
    # 4. cut: every materialization point gets a reference and a placeholder buffer; a matmul whose one reader is
    #    elementwise at its own index is computed by that reader (an epilogue), if the optimizer takes it
    points = _materialize_points(roots, fuse_reduce)
    if not fuse_reduce:
        # (a matmul read through a reshape, a convolution's GEMM as NCHW: its reader's ops move to the matmul's shape)
        if (lifted := lift_epilogues(roots, points, getattr(opt, "epilogue", None))) is not roots:
            roots, points = lifted, _materialize_points(lifted, fuse_reduce)
        fused = epilogue_fusions(roots, points, getattr(opt, "epilogue", None))
        fused |= row_fusions(roots, points, getattr(opt, "row_fusion", None), fused)
        fused |= winograd_epilogues(roots, points, getattr(opt, "epilogue", None), fused)
        if fused:
            points = _materialize_points(roots, fuse_reduce, fused)
    ref, temps, outs = _assign_refs(points, roots, in_idx)
    place: dict[UOp, UOp] = {}
    for u in points:  # negative slots: placeholders can never collide with real buffers
        ph = UOp(Ops.BUFFER, (), ParamArg(-1 - len(place), u.dtype, (max(1, prod(u.shape)),)))
        place[u] = ph.reshape(u.shape) if u.shape != ph.shape else ph
    ph_ref = {base_buffer(place[u]).arg.slot: ref[u] for u in points}
    # 5. one item per piece (a SCATTER or SETITEM is two: copy its base, then write the values in); with an
    #    optimizer, a run of elementwise updates (an optimizer step's, per parameter) is one item (groups)
    bodies = {
        u: (u.src[0] if u.op is Ops.STAGE else u).substitute({p: v for p, v in place.items() if p is not u})
        for u in points
    }
    grouped = update_groups(points, bodies, place, ref, getattr(opt, "group", None)) if not fuse_reduce else []
    group_of = {run[0][0]: run for run in grouped}
    later = {u for run in grouped for u, _ in run[1:]}
    items: list[ScheduleItem] = []
    n_err = 0  # error records so far: a kernel with index checks gets the next one
    for u in points:
        if u in later:
            continue
        if u in group_of:
            items.append(_item([(v, ref[m]) for m, v in group_of[u]], ph_ref, in_idx, n_err, row_buffers=False))
            continue
        body = bodies[u]
        for piece in (body.src[0], body) if body.op in (Ops.SCATTER, Ops.SETITEM) else (body,):
            item = _item([(piece, ref[u])], ph_ref, in_idx, n_err, row_buffers=opt is not None)
            if piece is not body and base_buffer(piece) in in_idx:  # the base copied as it is
                item = replace(item, copy=Copy(Ref(RefKind.IN, in_idx[base_buffer(piece)]), ref[u]))
            n_err += bool(item.checks)
            items.append(item)
    return Schedule(tuple(items), tuple(temps), tuple(outs), n_err), inputs


def _item(
    pieces: list[tuple[UOp, Ref]], ph_ref: dict[int, Ref], in_idx: dict[UOp, int], n_err: int, row_buffers: bool
) -> ScheduleItem:
    """One piece of the graph, writing its Ref (a group of updates: several, each its value): buffers renumbered,
    parameters bound to refs; with `row_buffers` (an optimizer's plan), values its passes over a row share kept in
    row buffers (stage_rows)."""
    # renumber buffers 0..n-1 in topological order (outputs last): identical kernels are one body
    bufs = [b for b in sink(*(v for v, _ in pieces)).toposort() if b.op is Ops.BUFFER]
    local = {b: UOp(Ops.BUFFER, (), ParamArg(i, b.dtype, b.arg.shape)) for i, b in enumerate(bufs)}
    outs = [
        UOp(Ops.BUFFER, (), ParamArg(len(bufs) + j, v.dtype, (max(1, prod(v.shape)),)))
        for j, (v, _) in enumerate(pieces)
    ]
    values = [v.substitute(local) for v, _ in pieces]
    body, out = values[0], outs[0]
    if row_buffers and body.op not in (Ops.SCATTER, Ops.SETITEM) and body.op not in OWN_KERNEL:
        body = stage_rows(body)
    work = body.src[1] if body.op is Ops.SETITEM else body  # what it computes: a region write, its value alone
    refs = [ph_ref[b.arg.slot] if b.arg.slot < 0 else Ref(RefKind.IN, in_idx[b]) for b in bufs] + [r for _, r in pieces]
    checks = checks_of(work)
    if checks:  # the error record is the parameter after the output; one record per kernel that checks
        refs.append(Ref(RefKind.ERR, n_err))
    if body.op is Ops.SCATTER:  # the accumulating half: named by the values it adds in
        name, op = "s_" + "_".join(map(str, body.src[2].shape or (1,))), f"scatter_{body.arg[3].name.lower()}"
    elif body.op is Ops.SETITEM:  # the region write: named by the region (w_ and its counts)
        name, op = "w_" + "_".join(map(str, work.shape or (1,))), f"setitem ({kernel_op(work)})"
    elif len(values) > 1:  # a group of updates: each value's ops, once
        name, op = kernel_name(body), f"{len(values)} updates, " + kernel_op(sink(*values)).removeprefix("elementwise ")
    else:
        name, op = kernel_name(body), kernel_op(body)
    more = tuple(zip(values[1:], outs[1:], strict=True))
    flops = _flops(work) + sum(_flops(v) for v in values[1:])
    return ScheduleItem(name, body, out, tuple(refs), flops, checks, op, more=more)


def checks_of(root: UOp) -> tuple[str, ...]:
    """The labels of the data-dependent index checks of a kernel body (its GATHERs and SCATTERs), in the order
    lowering numbers them."""
    return tuple(u.arg[1] for u in root.toposort() if u.op in (Ops.GATHER, Ops.SCATTER))


def moved_bytes(item: ScheduleItem, slots: list[int]) -> int:
    """Bytes a kernel must move at least: each buffer it still reads once (its `slots` that survive lowering), and
    its output once (a region write: the region)."""
    outs = [item.out, *(o for _, o in item.more)]
    bufs = {b.arg.slot: b for b in sink(item.body, *(v for v, _ in item.more)).toposort() if b.op is Ops.BUFFER}
    read = sum(prod(bufs[i].arg.shape) * bufs[i].dtype.itemsize for i in slots if i in bufs and bufs[i] not in outs)
    if item.body.op is Ops.SETITEM:
        return read + prod(item.body.src[1].shape) * item.out.dtype.itemsize
    return read + sum(prod(o.arg.shape) * o.dtype.itemsize for o in outs)


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

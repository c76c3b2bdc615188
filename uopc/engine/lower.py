"""A schedule lowered into a plan: each kernel's Opts from the optimizer, its loop AST from codegen.

    plan, inputs = make_plan(roots, fuse_reduce, opt)    # schedule(...), then lower_schedule(...)

A model's repeated layers schedule to identical kernel bodies (renumbered buffers, hash-consed: one object), so a
kernel is optimized and lowered once per process (`lowered`), not once per layer and plan. After lowering, kernels
keep only the parameters their AST still reads, get names unique within the plan, and the memory planner places
the temps.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from uopc import helpers
from uopc.codegen.attention import lower_attention
from uopc.codegen.loops import size_argument
from uopc.codegen.rangeify import Ctx, lower, lower_scatter, lower_setitem
from uopc.codegen.winograd import lower_winograd
from uopc.helpers import prod
from uopc.opt.strides import merged_shape
from uopc.schedule import Kernel, Plan, Schedule, ScheduleItem, moved_bytes, plan_memory, schedule
from uopc.uop import Ops, UOp
from uopc.uop.variable import Variable
from uopc.uop.winograd import winograd_of

__all__ = ["clear_lowered", "lower_schedule", "lowered", "lowered_stats", "make_plan"]


def make_plan(
    roots: list[UOp], fuse_reduce: bool = False, opt: Any = None, on_kernel: Callable[[Kernel, int], None] | None = None
) -> tuple[Plan, list[UOp]]:
    """Kernelize (Chapter 7): schedule the graph, then lower every kernel. Returns the plan and the input BUFFERs
    its kernels refer to as Ref(RefKind.IN, i). `opt` (uopc.opt.HandOpt or SearchOpt, or None for unoptimized
    kernels) runs its layout pass on the graph and chooses each kernel's Opts. `on_kernel` sees each kernel as soon
    as it is lowered, with the number of kernels still to lower (the engine starts compiling it there)."""
    sched, inputs = schedule(roots, fuse_reduce, opt)
    return lower_schedule(sched, opt, on_kernel), inputs


def lower_schedule(sched: Schedule, opt: Any, on_kernel: Callable[[Kernel, int], None] | None = None) -> Plan:
    """Lower each item into a Kernel (handed at once to `on_kernel`, if given, with how many items are left), name
    the kernels uniquely, and plan the temps' memory."""
    kernels = []
    for i, item in enumerate(sched.items):
        kernels.append(_kernel(item, opt))
        if on_kernel is not None:
            on_kernel(kernels[-1], len(sched.items) - 1 - i)
    names = _unique_names([k.name for k in kernels], [k.ast for k in kernels])
    kernels = [k if k.name == n else replace(k, name=n) for k, n in zip(kernels, names, strict=True)]
    arena = plan_memory(kernels, list(sched.temps))
    plan_vars = tuple(sorted({v for k in kernels for v in k.vars}, key=lambda v: (v.name, v.vmin, v.vmax)))
    return Plan(tuple(kernels), sched.temps, sched.outs, sched.n_err, arena.offsets, arena.nbytes, plan_vars)


def _kernel(item: ScheduleItem, opt: Any) -> Kernel:
    if item.body.op is Ops.SCATTER:  # the accumulating half: serial, in order (threads would race on repeated indices)
        ast, opts = lower_scatter(item.body, item.out), None
    elif item.body.op is Ops.ATTENTION:  # fused attention: fixed loops, sized and strided here (codegen.attention)
        machine = getattr(opt, "machine", None)
        width, cores = (machine.vector_bytes // 4, machine.cores) if machine else (8, 1)
        ast, opts = lower_attention(item.body, item.out, width, cores), None
    elif winograd_of(item.body) is not None:  # a Winograd transform (and its epilogue): fixed loops, sized and
        ast, opts = lower_winograd(item.body, item.out), None  # strided (codegen.winograd)
    elif item.body.op is Ops.SETITEM:  # the region write: its loops cover the region alone
        ast, opts = lower_setitem(item.body, item.out, _region_thread(item.body, opt)), None
    else:
        ast, opts = lowered(item.body, item.out, opt, item.more)
        ast = size_argument(ast)  # (a one-loop kernel: its size as an argument, one function for every size)
    # simplification can delete a read (x*0 -> 0): the C signature then has fewer parameters,
    # so bind exactly the slots that survive lowering, or every later argument shifts by one
    topo = ast.toposort()
    alive = sorted({b.arg.slot for b in topo if b.op is Ops.BUFFER})
    refs = tuple(item.refs[s] for s in alive)
    kvars = tuple(
        sorted({u.arg for u in topo if u.op is Ops.DEFINE_VAR and type(u.arg) is Variable}, key=lambda v: v.name)
    )
    return Kernel(
        item.name, ast, refs, item.flops, opts, item.checks, moved_bytes(item, alive), item.op, item.copy, kvars
    )


# a region write moves its elements once, as an elementwise kernel does: threads pay off from the same size
# (opt.heuristic's THREAD_MIN_WORK, measured there: a parallel region costs ~3 us)
REGION_THREAD_MIN = 1 << 16


def _region_thread(body: UOp, opt: Any) -> int | None:
    """The axis of SETITEM `body`'s region write that runs on threads: its outermost of 2+ elements, when an optimizer
    runs and the region is large (None: serial)."""
    counts = body.src[1].shape
    if opt is None or prod(counts) < REGION_THREAD_MIN:
        return None
    return next((k for k, c in enumerate(counts) if c >= 2), None)


def _unique_names(names: list[str], asts: list[UOp]) -> list[str]:
    """One name per distinct AST: a repeated AST keeps its first name (two bodies of different shapes can lower to
    one AST); a name already used by a different AST gets the suffix n1, n2 .."""
    seen: dict[str, list[UOp]] = {}
    named: dict[UOp, str] = {}
    out = []
    for name, ast in zip(names, asts, strict=True):
        if ast not in named:
            taken = seen.setdefault(name, [])
            named[ast] = name if not taken else f"{name}n{len(taken)}"
            taken.append(ast)
        out.append(named[ast])
    return out


# (optimizer, body, output, index checks) -> (ast, opts). Bounded: the entries keep their UOps alive.
_LOWERED_MAX = 1024
_lowered_memo: OrderedDict[tuple, tuple[UOp, Any]] = OrderedDict()
_lowered_lock = threading.Lock()
lowered_stats = {"hits": 0, "misses": 0}


def lowered(body: UOp, out: UOp, opt: Any, more: tuple[tuple[UOp, UOp], ...] = ()) -> tuple[UOp, Any]:
    """The loop AST of one kernel body and the Opts it was lowered with (None: unoptimized), memoized. `more`: a
    group of updates' further values and outputs (ScheduleItem.more), lowered in the loops `body` chooses."""
    key = (opt, body, out, more, helpers.settings().CHECK_OOB, helpers.settings().CFLAGS is None)  # (rangeify.lanes)
    with _lowered_lock:
        hit = _lowered_memo.get(key)
        if hit is not None:
            _lowered_memo.move_to_end(key)
            lowered_stats["hits"] += 1
            return hit
    with helpers.phase("lower"):
        # adjacent dims that every read walks in order run as one loop (the kernel keeps its name and output)
        if (shape := merged_shape(body)) != body.shape and all(merged_shape(v) == shape for v, _ in more):
            body, more = body.reshape(shape), tuple((v.reshape(shape), o) for v, o in more)
        opts = opt.choose(body, out) if opt is not None else None
        res = lower(body, out, Ctx(opts=opts), more), opts
    with _lowered_lock:
        lowered_stats["misses"] += 1
        _lowered_memo[key] = res
        while len(_lowered_memo) > _LOWERED_MAX:
            _lowered_memo.popitem(last=False)
    return res


def clear_lowered() -> None:
    """Forget every memoized lowering (for tests that count lowerings; the memo's key already holds every input)."""
    with _lowered_lock:
        _lowered_memo.clear()

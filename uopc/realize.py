"""Realize: turn roots into computed BUFFERs through the plan cache (the structural JIT), compile, run, print.

    >>> out, = realize([(a + b).uop])    # schedule (or fetch the cached plan), compile each kernel, run them

`_plans` maps a plan key (the graph's structure key with buffers abstracted away, plus every setting that changes
the generated code) to a compiled plan: the same graph shape reuses the same compiled kernels, whatever the
buffers hold.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uopc import helpers
from uopc.buffer import aligned_empty, buffer_data, output_buffer
from uopc.opt import HandOpt, SearchOpt
from uopc.rangeify import ERROR_RECORD
from uopc.render_c import render_c
from uopc.runtime import Program
from uopc.schedule import Kernel, Plan, make_plan
from uopc.uop import Ops, UOp, structure_key

__all__ = ["CompiledPlan", "default_opt", "explain_miss", "plan_key", "realize", "set_kernel_hook"]


@dataclass
class CompiledPlan:
    """A Plan with its kernels rendered and compiled, and the temp arrays its runs share."""

    plan: Plan
    srcs: list[str]
    programs: list[Program]
    temp_arrays: list[np.ndarray] | None = field(default=None)  # allocated on the first run, then reused

    @property
    def kernels(self) -> tuple[Kernel, ...]:
        return self.plan.kernels


_plans: OrderedDict[tuple, CompiledPlan] = OrderedDict()
# called after every kernel run as hook(kernel, seconds) when set (uopc profile sets it)
_kernel_hook: Callable[[Kernel, float], None] | None = None


def set_kernel_hook(hook: Callable[[Kernel, float], None] | None) -> Callable[[Kernel, float], None] | None:
    """Time every kernel and call `hook(kernel, seconds)` after it runs (None: stop). Returns the previous hook."""
    global _kernel_hook
    old, _kernel_hook = _kernel_hook, hook
    return old


def default_opt() -> Any:
    """The optimizer the OPT setting selects: None (OPT=0), HandOpt (1, default) or SearchOpt (2)."""
    if helpers.OPT <= 0:
        return None
    return SearchOpt if helpers.OPT >= 2 else HandOpt


def plan_key(skey: tuple, fuse_reduce: bool, opt: Any) -> tuple:
    """Everything that decides a plan's code: the structure, the fusion rule, the optimizer, the bounds checks."""
    return (skey, fuse_reduce, opt, helpers.CHECK_OOB)


def compile_plan(plan: Plan) -> CompiledPlan:
    """Render each kernel to C and compile it (each kernel is cached on disk by its source and flags)."""
    srcs = [render_c(k.ast, k.name) for k in plan.kernels]
    programs = [Program(src, k.name) for src, k in zip(srcs, plan.kernels, strict=True)]
    if helpers.DEBUG >= 4:
        for src in srcs:
            print(src)
    return CompiledPlan(plan, srcs, programs)


def realize(roots: list[UOp], fuse_reduce: bool = False, opt: Any = None) -> list[UOp]:
    """Compute each root. Returns, per root, a BUFFER UOp holding the result."""
    uniq = list(dict.fromkeys(roots))
    t0 = time.perf_counter()
    skey, inputs = structure_key(uniq)
    key = plan_key(skey, fuse_reduce, opt)
    cp = _plans.get(key)
    if cp is None:
        if helpers.DEBUG >= 1 and (why := explain_miss(key)):
            print(why)
        cp = compile_plan(make_plan(uniq, fuse_reduce, opt)[0])
        _plans[key] = cp
        while len(_plans) > max(1, helpers.PLAN_CACHE_SIZE):  # least recently used plans go first
            _plans.popitem(last=False)
    else:
        _plans.move_to_end(key)
    t1 = time.perf_counter()
    plan = cp.plan
    if cp.temp_arrays is None:
        cp.temp_arrays = [aligned_empty(n, d) for d, n in plan.temps]
    # fresh outputs are fully written by their kernel: uninitialized, not zeros (no 4 MB memset per 1024^2 result)
    outs: list[UOp] = []
    for o in plan.outs:
        if o[0] == "in":
            outs.append(inputs[o[1]])
        elif o[0] == "out":
            outs.append(outs[o[1]])
        else:
            outs.append(output_buffer(o[0], o[1]))
    arrays = {"in": [buffer_data(b) for b in inputs], "tmp": cp.temp_arrays, "out": [buffer_data(o) for o in outs]}
    # error records of data-dependent index checks: per call, so concurrent realizes never see each other's
    arrays["err"] = [np.zeros(ERROR_RECORD, np.int64) for _ in range(plan.n_err)]
    hook, timed = _kernel_hook, helpers.DEBUG >= 2 or _kernel_hook is not None
    for k, prg in zip(plan.kernels, cp.programs, strict=True):
        args = [arrays[kind][i] for kind, i in k.refs]
        ts = time.perf_counter()
        prg(*args)
        if timed:
            dt = time.perf_counter() - ts
            if hook is not None:
                hook(k, dt)
            if helpers.DEBUG >= 2:
                _print_kernel(k, prg, args, dt)
    if plan.n_err:
        _raise_index_errors(plan, arrays["err"])
    if helpers.DEBUG >= 1:
        t2 = time.perf_counter()
        print(f"realize: {len(plan.kernels)} kernels, schedule {(t1 - t0) * 1e3:.1f} ms, run {(t2 - t1) * 1e3:.1f} ms")
    by_root = dict(zip(uniq, outs, strict=True))
    return [by_root[r] for r in roots]


def _raise_index_errors(plan: Plan, records: list[np.ndarray]) -> None:
    """After a run: raise IndexError for the first kernel whose data-dependent index check failed."""
    for k in plan.kernels:
        rec = next((records[i] for kind, i in k.refs if kind == "err"), None)
        if rec is not None and rec[0]:
            value, lo, size, which = (int(v) for v in rec[1:])
            raise IndexError(
                f"uopc: {k.checks[which]}: index {value} is out of range for a dimension of size {size} "
                f"(valid indices {lo}..{size - 1}, in kernel {k.name})"
            )


def _print_kernel(k: Kernel, prg: Program, args: list[np.ndarray], dt: float) -> None:
    extra = ""
    if helpers.DEBUG >= 3:  # run again: warm caches, no first-touch page faults
        ts = time.perf_counter()
        prg(*args)
        extra = f"  (again: {(time.perf_counter() - ts) * 1e3:.3f} ms)"
        if k.opts is not None:
            extra += f"  {k.opts}"
    dt = max(dt, 1e-9)
    print(
        f"  {k.name:24s} {dt * 1e3:8.3f} ms  {k.flops / dt / 1e9:7.2f} GFLOP/s  {k.nbytes / dt / 1e9:7.2f} GB/s  "
        f"{k.op}{extra}"
    )


def _arg(arg: Any) -> str:
    """A structure-key arg as the user wrote it (floats are keyed by their hex form)."""
    if isinstance(arg, tuple) and len(arg) == 2 and arg[0] is float:
        return f"{float.fromhex(arg[1]):.6g}"
    if isinstance(arg, tuple) and len(arg) == 2 and arg[0] is bool:
        return repr(arg[1])
    return repr(arg)


def _describe(node: tuple) -> str:
    op, dtype, arg, _ = node
    if op is Ops.BUFFER:
        return f"BUFFER {arg[1]}[{', '.join(map(str, arg[2]))}]"
    return f"{op.name} {_arg(arg)}" if op is Ops.CONST else f"{op.name} {dtype.name} {_arg(arg)}"


def explain_miss(key: tuple, limit: int = 256) -> str | None:
    """Why a plan-cache miss missed, in words: the closest cached structure of the same size and where it differs.

    Only the `limit` most recently used plans are compared (a miss is rare in a steady loop, so this is cheap).
    """
    skey = key[0]
    best, best_same = None, -1
    for other in list(reversed(_plans))[:limit]:
        if other[1:] != key[1:] or len(other[0]) != len(skey):
            continue
        same = sum(a == b for a, b in zip(skey, other[0], strict=True))
        if same > best_same:
            best, best_same = other[0], same
    if best is None:
        return None
    i = next(j for j, (a, b) in enumerate(zip(skey, best, strict=True)) if a != b)
    new, old = skey[i], best[i]
    ndiff = len(skey) - best_same
    where = f"at node {i} of {len(skey)} ({ndiff} node{'s differ' if ndiff != 1 else ' differs'})"
    if new[0] is Ops.CONST and old[0] is Ops.CONST and new[1] == old[1]:
        kind = "float" if isinstance(new[2], tuple) and new[2][:1] == (float,) else "number"
        what = f"CONST {_arg(new[2])} (was {_arg(old[2])}) {where}: a Python {kind} that changes every step: "
        what += "pass it as a Tensor"
    elif new[0] is Ops.BUFFER and old[0] is Ops.BUFFER:
        what = f"{_describe(new)} (was {_describe(old)}) {where}: an input of another shape or dtype"
    elif new[0] is old[0] and new[1] == old[1] and new[3] == old[3]:
        what = f"{_describe(new)} (was {_arg(old[2])}) {where}: the same op with another argument (shape, axis)"
    else:
        what = f"{_describe(new)} (was {_describe(old)}) {where}: a different computation"
    return f"realize: plan cache miss; the closest cached plan differs first at {what}"

"""Realize: turn roots into computed BUFFERs through the plan cache (the structural JIT), compile, run, print.

    >>> out, = realize([(a + b).uop])    # schedule (or fetch the cached plan), compile each kernel, run them

`_plans` maps a plan key (the graph's structure key with buffers abstracted away, plus every setting that changes
the generated code) to a compiled plan: the same graph shape reuses the same compiled kernels, whatever the
buffers hold.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from uopc import helpers
from uopc.buffer import buffer_data, output_buffer, pool
from uopc.opt import HandOpt, SearchOpt
from uopc.rangeify import ERROR_RECORD
from uopc.render_c import render_c
from uopc.runtime import Program
from uopc.schedule import Kernel, Plan, make_plan
from uopc.uop import UOp, structure_key

__all__ = ["CompiledPlan", "default_opt", "plan_key", "realize"]


@dataclass
class CompiledPlan:
    """A Plan with its kernels rendered and compiled, and the temp arrays its runs share."""

    plan: Plan
    srcs: list[str]
    programs: list[Program]

    @property
    def kernels(self) -> tuple[Kernel, ...]:
        return self.plan.kernels


_plans: OrderedDict[tuple, CompiledPlan] = OrderedDict()


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


_plans_lock = threading.Lock()
_building: dict[tuple, threading.Lock] = {}  # plan key -> the lock its one builder holds


def _get_plan(key: tuple, roots: list[UOp], fuse_reduce: bool, opt: Any) -> CompiledPlan:
    """The cached plan for `key`, else build it; threads racing for one key build it once (the others wait)."""
    with _plans_lock:
        cp = _plans.get(key)
        if cp is not None:
            _plans.move_to_end(key)
            return cp
        lock = _building.setdefault(key, threading.Lock())
    with lock:
        cp = _plans.get(key)
        if cp is None:
            cp = compile_plan(make_plan(roots, fuse_reduce, opt)[0])
            with _plans_lock:
                _plans[key] = cp
                _building.pop(key, None)
                while len(_plans) > max(1, helpers.PLAN_CACHE_SIZE):  # least recently used plans go first
                    _plans.popitem(last=False)
    return cp


def realize(roots: list[UOp], fuse_reduce: bool = False, opt: Any = None) -> list[UOp]:
    """Compute each root. Returns, per root, a BUFFER UOp holding the result."""
    uniq = list(dict.fromkeys(roots))
    t0 = time.perf_counter()
    skey, inputs = structure_key(uniq)
    key = plan_key(skey, fuse_reduce, opt)
    cp = _get_plan(key, uniq, fuse_reduce, opt)
    t1 = time.perf_counter()
    plan = cp.plan
    # the temps' arena is taken from the pool for this call only: two threads running one plan never share it
    arena = pool.alloc(plan.arena_bytes) if plan.temps else None
    temps = [arena[o : o + n * d.itemsize].view(d.np) for o, (d, n) in zip(plan.temp_offsets, plan.temps, strict=True)]
    # fresh outputs are fully written by their kernel: uninitialized, not zeros (no 4 MB memset per 1024^2 result)
    outs: list[UOp] = []
    for o in plan.outs:
        if o[0] == "in":
            outs.append(inputs[o[1]])
        elif o[0] == "out":
            outs.append(outs[o[1]])
        else:
            outs.append(output_buffer(o[0], o[1]))
    arrays = {"in": [buffer_data(b) for b in inputs], "tmp": temps, "out": [buffer_data(o) for o in outs]}
    # error records of data-dependent index checks: per call, so concurrent realizes never see each other's
    arrays["err"] = [np.zeros(ERROR_RECORD, np.int64) for _ in range(plan.n_err)]
    args: list[np.ndarray] = []
    try:
        for k, prg in zip(plan.kernels, cp.programs, strict=True):
            args = [arrays[kind][i] for kind, i in k.refs]
            ts = time.perf_counter()
            prg(*args)
            if helpers.DEBUG >= 2:
                _print_kernel(k, prg, args, time.perf_counter() - ts)
    finally:
        del arrays["tmp"], temps, args
        if arena is not None:
            pool.free(arena)
    if plan.n_err:
        _raise_index_errors(plan, arrays["err"])
    if helpers.DEBUG >= 1:
        t2 = time.perf_counter()
        print(
            f"realize: {len(plan.kernels)} kernels, schedule {(t1 - t0) * 1e3:.1f} ms, run {(t2 - t1) * 1e3:.1f} ms, "
            f"temps {plan.temp_bytes} -> {plan.arena_bytes} bytes"
        )
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
    print(f"  {k.name:30s} {dt * 1e3:8.3f} ms  {k.flops / max(dt, 1e-9) / 1e9:7.2f} GFLOP/s{extra}")

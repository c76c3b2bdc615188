"""Realize: turn roots into computed BUFFERs through the plan cache (the structural JIT), compile, run, print.

    >>> out, = realize([(a + b).uop])    # schedule (or fetch the cached plan), compile it, run it: one ctypes call

`_plans` maps a plan key (the graph's structure key with buffers abstracted away, plus every setting that changes
the generated code) to a compiled plan: the same graph shape reuses the same compiled object, whatever the buffers
hold. A plan is one shared object with an entry point that runs its kernels in order over one array of buffer
pointers: one ctypes call runs the whole plan. A small plan is one C translation unit; in a bigger one each distinct
kernel is its own unit, its object file cached by its source, so plans share kernels (see ONE_UNIT_CHARS). Plans are
also stored across processes (uopc.engine.plan_store).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from uopc import helpers
from uopc.codegen.error_record import ERROR_RECORD, ErrorField, check_error, oob_error
from uopc.engine import plan_store
from uopc.engine.explain import closest_difference, print_kernels
from uopc.engine.kept import Kept
from uopc.engine.lower import make_plan
from uopc.engine.tune import KernelTimer
from uopc.machine import Machine
from uopc.opt import HandOpt, SearchOpt
from uopc.renderer.plan import kernel_unit, render_plan
from uopc.runtime.buffer import buffer_ptr, bump_version, output_buffer, pool
from uopc.runtime.compiler import Program, cancel_prefetches, compiler_identity, machine, prefetch
from uopc.runtime.threads import ensure_threads
from uopc.schedule import Copy, Kernel, Plan, Ref, RefKind
from uopc.uop import Ops, UOp, structure_key, track
from uopc.uop.variable import Variable

__all__ = [
    "Captured",
    "CompiledPlan",
    "capture",
    "compile_plan",
    "default_opt",
    "explain_miss",
    "inplace_ok",
    "plan_key",
    "profile",
    "realize",
    "run_plan",
    "set_kernel_hook",
]


@dataclass
class CompiledPlan:
    """A Plan compiled into one object: `fn(bufs, ns, err)` runs every kernel in order.

    `bufs` holds the inputs, then one slot per root, then the temps (at their offsets in one per-call arena), then
    the error records of data-dependent index checks (per call, so concurrent realizes never see each other's), then
    one flag per kept kernel (`kept`): NULL skips the kernel, its temp still holding what it computed last time;
    last, for a plan over symbolic sizes, the values of its Variables (`plan.vars`, long longs), per call.
    """

    plan: Plan
    src: str
    fn: Any  # the ctypes entry point (None for a plan without kernels)
    n_in: int
    names: tuple[str, ...]  # each kernel's name in the plan, k0_e_4_8 ... (its C function: shape name + digest)
    check_oob: bool = False  # built with UOPC_CHECK_OOB: its entry point then reads an error record, always
    srcs: list[str] = field(default_factory=list)  # the translation units src joins (what the plan store keeps)

    def __post_init__(self) -> None:
        plan = self.plan
        # kernels whose temps outlive the call, with a run flag each at the end of bufs (uopc.engine.kept)
        self.kept = Kept(plan, self.n_in + len(plan.outs) + len(plan.temps) + plan.n_err)
        self.nbufs = self.kept.first_flag + len(self.kept)
        self.var_slot = self.nbufs if plan.vars else None
        self.nbufs += 1 if plan.vars else 0
        self.ptr_array = ctypes.c_void_p * self.nbufs
        self.fresh = tuple(r for r, o in enumerate(plan.outs) if o.alias is None)  # roots a kernel writes
        # a kernel stores into one of the plan's inputs: running the plan twice is not running it once (DEBUG=3)
        self.written_inputs = tuple(sorted({r.i for k in plan.kernels for r in k.refs[-1:] if r.kind is RefKind.IN}))
        self.writes_input = bool(self.written_inputs)
        self._in_place: dict[tuple[int, int | None], bool] = {}
        # the kernels with data-dependent index checks and their error records, found once, not on every call
        self.checked = tuple((k, r.i) for k in plan.kernels for r in k.refs if r.kind is RefKind.ERR)

    def can_write_in_place(self, r: int, i: int | None) -> bool:
        """Whether root `r` may be written into the storage of input `i` (None: storage the plan does not read),
        decided once per plan (see inplace_ok); the caller still checks that nothing else reads that storage."""
        key = (r, i)
        if key not in self._in_place:
            self._in_place[key] = inplace_ok(self, r, i)
        return self._in_place[key]

    @property
    def kernels(self) -> tuple[Kernel, ...]:
        return self.plan.kernels

    def where(self, ref: Ref) -> int:
        """The index in `bufs` of a kernel parameter."""
        if ref.kind is RefKind.IN:
            return ref.i
        if ref.kind is RefKind.OUT:
            return self.n_in + ref.i
        if ref.kind is RefKind.ERR:
            return self.n_in + len(self.plan.outs) + len(self.plan.temps) + ref.i
        return self.n_in + len(self.plan.outs) + ref.i


class Assign(NamedTuple):
    """What the caller says of a root it realizes: the object assigned to it (a Tensor, which TinyJit follows from
    replay to replay) and the BUFFER the assign replaces (None if the object held no buffer before)."""

    owner: Any
    replaces: UOp | None


@dataclass
class Captured:
    """One realize seen while capturing (uopc.engine.jit.TinyJit): the plan, the BUFFERs it read, the BUFFERs it wrote
    (per unique root), and per unique root the Assign the caller gave for it (None: no assign)."""

    cp: CompiledPlan
    inputs: list[UOp]
    outs: list[UOp]
    assigns: list[Assign | None]


class _CaptureState(threading.local):
    calls: list[Captured] | None = None  # per thread: a capture in one thread never sees another's realizes


_capture = _CaptureState()


class capture:
    """`with capture() as calls:` records every realize of this thread into `calls` (a list of Captured)."""

    def __enter__(self) -> list[Captured]:
        if _capture.calls is not None:
            raise RuntimeError("uopc: a capture is already running in this thread (nested TinyJit calls?)")
        _capture.calls = []
        return _capture.calls

    def __exit__(self, *exc: Any) -> None:
        _capture.calls = None


def capturing() -> list[Captured] | None:
    """The current thread's capture list, or None."""
    return _capture.calls


class _ProfileState(threading.local):
    stats: dict[str, int] | None = None


_profile = _ProfileState()


class profile:
    """`with profile() as p:` sums, over this thread's plan runs, the calls, the time inside the plan object
    (`call_ns`) and the time its kernels' own timers measured (`kernel_ns`); the difference is launch overhead."""

    def __enter__(self) -> dict[str, int]:
        _profile.stats = {"calls": 0, "kernels": 0, "call_ns": 0, "kernel_ns": 0}
        return _profile.stats

    def __exit__(self, *exc: Any) -> None:
        _profile.stats = None


_plans: OrderedDict[tuple, CompiledPlan] = OrderedDict()
_plans_lock = threading.Lock()
_building: dict[tuple, threading.Lock] = {}  # plan key -> the lock its one builder holds


def _new_locks_in_child() -> None:
    # a plan another thread was building at fork time is never finished in the child: its key's lock goes too
    global _plans_lock
    _plans_lock = threading.Lock()
    _building.clear()


helpers.in_forked_child(_new_locks_in_child)
# called after every kernel run as hook(kernel, seconds) when set (uopc profile sets it)
_kernel_hook: Callable[[Kernel, float], None] | None = None


def set_kernel_hook(hook: Callable[[Kernel, float], None] | None) -> Callable[[Kernel, float], None] | None:
    """Time every kernel and call `hook(kernel, seconds)` after it runs (None: stop). Returns the previous hook."""
    global _kernel_hook
    old, _kernel_hook = _kernel_hook, hook
    return old


def default_opt(s: helpers.Settings | None = None, m: Machine | None = None) -> Any:
    """The optimizer the OPT setting selects, for the machine the compiler targets: None (OPT=0), HandOpt (1,
    default) or SearchOpt (2)."""
    s = s or helpers.settings()
    if s.OPT <= 0:
        return None
    m = m or machine()
    key = (s.OPT >= 2, m)
    if (o := _opts.get(key)) is None:
        o = _opts[key] = SearchOpt(m, KernelTimer()) if s.OPT >= 2 else HandOpt(m)
    return o


_opts: dict[tuple, Any] = {}  # one optimizer object per (kind, Machine): asked on every realize


def plan_key(skey: tuple, fuse_reduce: bool, opt: Any, s: helpers.Settings, m: Machine) -> tuple:
    """Everything that decides a plan's code: the structure, the fusion rule, the optimizer, the settings that
    change generated code (index checks, compiler, flags) and the machine record."""
    return (skey, fuse_reduce, opt, s.code_key(), m)


# a plan with less kernel C than this compiles as one unit: one gcc run beats a run per kernel plus the link there
# (the suite's thousands of small plans: 580 s per pass per kernel); bigger ones compile per kernel, in parallel.
# At 100_000, GPT-2's forward (~100 K of kernel C once its GEMMs lost their remainder regions) became one unit: gcc
# 0.71-0.79 s on one core against 0.37-0.48 s per kernel on two, its first call 1.92 -> 2.13 s (Zen 4, 3 rounds)
ONE_UNIT_CHARS = 64_000


class _EarlyCompile:
    """make_plan's `on_kernel`: once the plan will compile a unit per kernel (ONE_UNIT_CHARS of C lowered, or
    expected: those and the kernels left at their mean size reach twice it), every distinct kernel so far goes to
    gcc in the background (uopc.runtime.compiler.prefetch), each later one as soon as it is lowered, while Python
    lowers the rest; compile_plan's link waits for them. Expected, gcc starts with the first kernels (ResNet-18's
    first call 2.40 -> 2.30 s, the CNN step's 2.23 -> 2.06 s on a Zen 4); a plan smaller after all cancels them.
    The units are render_plan's (uopc.renderer.plan.kernel_unit, memoized: rendered once)."""

    def __init__(self) -> None:
        self.units: dict[str, str] = {}  # function name -> unit source
        self.chars = 0
        self.seen = 0  # kernels handed in, repeats included
        self.prefetched: list[str] = []  # the object keys of the units handed to gcc early

    def __call__(self, k: Kernel, left: int = 0) -> None:  # (left: how many of the plan's kernels are still to lower)
        self.seen += 1
        with helpers.phase("render early"):
            u = kernel_unit(k.ast, k.name, k.register_tile)
        if u.sym in self.units:
            return
        self.units[u.sym] = u.src
        self.chars += len(u.fn.definition(u.sym))
        if self.prefetched:
            self.prefetched.append(prefetch(u.src))
        elif self.chars >= ONE_UNIT_CHARS or self.chars + left * self.chars / self.seen >= 2 * ONE_UNIT_CHARS:
            self.prefetched += [prefetch(src) for src in self.units.values()]


def compile_plan(plan: Plan, n_in: int, s: helpers.Settings | None = None) -> CompiledPlan:
    """Render the plan's kernels and a `plan` entry point that calls them in order and compile them into one shared
    object: one translation unit under ONE_UNIT_CHARS of kernel C, else a unit per distinct kernel (each object
    cached by its own source, compiled in parallel when missing) linked with the entry's. The compiled plan records
    the settings it was built with."""
    s = s or helpers.settings()
    names = tuple(f"k{i}_{k.name}" for i, k in enumerate(plan.kernels))
    cp = CompiledPlan(plan, "", None, n_in, names, bool(s.CHECK_OOB))
    if not plan.kernels:
        return cp
    with helpers.phase("render"):
        kernels = [(k.ast, nm, [cp.where(r) for r in k.refs]) for k, nm in zip(plan.kernels, names, strict=True)]
        copies = {i: (cp.where(k.copy.src), cp.where(k.copy.dst)) for i, k in enumerate(plan.kernels) if k.copy}
        guards = {i: cp.kept.flag(n) for n, i in enumerate(cp.kept.kernels)}
        srcs = render_plan(
            kernels,
            one_unit_below=ONE_UNIT_CHARS,
            copies=copies,
            guards=guards,
            var_slot=cp.var_slot,
            plan_vars=plan.vars,
            tiled=frozenset(i for i, k in enumerate(plan.kernels) if k.register_tile),
        )
    cp.src = "\n".join(srcs)
    if s.DEBUG >= 4:
        print(cp.src)
    _load_entry(cp, srcs)
    cp.srcs = srcs
    return cp


def _load_entry(cp: CompiledPlan, srcs: list[str]) -> None:
    """Compile (or find in the compile cache) the plan's C and bind its entry point."""
    ptr = ctypes.POINTER(ctypes.c_longlong)
    cp.fn = Program(srcs[0] if len(srcs) == 1 else tuple(srcs), "plan").entry(
        [ctypes.POINTER(ctypes.c_void_p), ptr, ptr]
    )


def _stored_plan(name: str) -> CompiledPlan | None:
    """A plan a previous process built with this digest (uopc.engine.plan_store), loaded and bound; None if there is
    none."""
    d = plan_store.load(name)
    if d is None:
        return None
    cp = CompiledPlan(d["plan"], "\n".join(d["srcs"]), None, d["n_in"], d["names"], d["check_oob"])
    if d["srcs"]:
        _load_entry(cp, d["srcs"])
    cp.srcs = d["srcs"]
    return cp


def _get_plan(key: tuple, roots: list[UOp], fuse_reduce: bool, opt: Any, s: helpers.Settings) -> CompiledPlan:
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
            if s.DEBUG >= 1 and (why := explain_miss(key)):
                print(why)
            before = helpers.phase_totals()
            name = plan_store.digest(key, compiler_identity())
            with helpers.phase("stored"):
                cp = _stored_plan(name)
            if cp is not None:
                if s.DEBUG >= 1:
                    ms = phase_split(before, helpers.phase_totals()).get("stored", 0.0) * 1e3
                    print(f"realize: plan of {len(cp.kernels)} kernels read from the plan store in {ms:.1f} ms")
            else:
                early = _EarlyCompile()
                try:
                    with helpers.phase("schedule"):
                        plan, inputs = make_plan(roots, fuse_reduce, opt, on_kernel=early)
                    cp = compile_plan(plan, len(inputs), s)
                finally:  # the plan's object was in the cache, or the build failed: no link claimed them
                    cancel_prefetches(early.prefetched)
                plan_store.save(name, plan, cp.srcs, cp.names, cp.n_in, cp.check_oob)
                if s.DEBUG >= 1:
                    print(built_line(plan, before, helpers.phase_totals()))
            with _plans_lock:
                _plans[key] = cp
                _building.pop(key, None)
                while len(_plans) > max(1, s.PLAN_CACHE):  # least recently used plans go first
                    _plans.popitem(last=False)
    return cp


def phase_split(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Seconds per phase between two `helpers.phase_totals()`; schedule without the layout and lower inside it."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    early = d.pop("render early", 0.0)  # kernels rendered while the plan was lowered (_EarlyCompile)
    d["schedule"] = d.get("schedule", 0.0) - d.get("layout", 0.0) - d.get("lower", 0.0) - early
    d["render"] = d.get("render", 0.0) + early
    return {k: v for k, v in d.items() if v > 0}


PHASES = ("autodiff", "stored", "schedule", "layout", "lower", "render", "gcc", "load")


def built_line(plan: Plan, before: dict[str, float], after: dict[str, float]) -> str:
    """DEBUG=1's line for a plan build: where its time went, phase by phase."""
    d = phase_split(before, after)
    parts = ", ".join(f"{k} {d[k] * 1e3:.1f} ms" for k in PHASES if k in d and k not in ("autodiff", "stored"))
    return f"realize: built plan of {len(plan.kernels)} kernels: {parts}"


def realize(
    roots: list[UOp],
    fuse_reduce: bool = False,
    opt: Any = None,
    assigns: list[Assign | None] | None = None,
    var_vals: dict[Variable, int] | None = None,
) -> list[UOp]:
    """Compute each root. Returns, per root, a BUFFER UOp holding the result. `var_vals` gives the values of the
    Variables in the graph (uopc.uop.variable): not part of the plan's key, only of this call. `assigns` (per root;
    None: no root is an assign) says which roots are assigns. Under a TinyJit capture their fresh buffers are tracked
    from birth (uopc.uop.track: a replay may write them in place) and the capture records them; outside one nothing
    consults the readers of storage, so nothing is tracked and building on the result records nothing (an eager
    training loop pays no bookkeeping; its tensors move to tracked storage at the capture, which rebinds them).

    The settings are read once, here, into a snapshot that keys the plan and travels with it."""
    s = helpers.settings()
    uniq = list(dict.fromkeys(roots))
    t0 = time.perf_counter()
    skey, inputs = structure_key(uniq)
    cp = _get_plan(plan_key(skey, fuse_reduce, opt, s, machine()), uniq, fuse_reduce, opt, s)
    t1 = time.perf_counter()
    calls = _capture.calls
    if calls is None:  # nothing consults the readers of storage outside a capture: nothing is tracked
        outs = run_plan(cp, inputs, debug=s.DEBUG, var_vals=var_vals)
    else:
        first: dict[UOp, Assign | None] = {}
        for r, a in zip(roots, assigns or (), strict=False):
            if first.get(r) is None:  # a root realized for several tensors: the first one assigned to it
                first[r] = a
        tracked = tuple(i for i, r in enumerate(uniq) if first.get(r) is not None)
        outs = run_plan(cp, inputs, debug=s.DEBUG, tracked=tracked, var_vals=var_vals)
        calls.append(Captured(cp, list(inputs), list(outs), [first.get(r) for r in uniq]))
    if s.DEBUG >= 1:
        t2 = time.perf_counter()
        plan = cp.plan
        print(
            f"realize: {len(plan.kernels)} kernels, plan {(t1 - t0) * 1e3:.1f} ms, run {(t2 - t1) * 1e3:.1f} ms, "
            f"temps {plan.temp_bytes} -> {plan.arena_bytes} bytes"
        )
    if len(uniq) == len(roots):
        return outs
    by_root = dict(zip(uniq, outs, strict=True))
    return [by_root[r] for r in roots]


def run_plan(
    cp: CompiledPlan,
    inputs: list[UOp],
    outs: list[UOp | None] | None = None,
    debug: int | None = None,
    tracked: tuple[int, ...] = (),
    var_vals: dict[Variable, int] | None = None,
    prefilled: tuple[Any, tuple[int, ...]] | None = None,
) -> list[UOp]:
    """Run a compiled plan on `inputs` (BUFFERs bound by position) and `var_vals`, a value for each of its
    Variables. Returns a BUFFER per root: fresh ones from the
    pool, or the given `outs[r]` where not None (the plan writes into that storage); the fresh buffers of the roots
    in `tracked` are tracked from birth (uopc.uop.track). `debug` is the DEBUG level (default: the current setting);
    whether index checks are read is what the plan was built with. `prefilled`: the addresses of the inputs that are
    the same BUFFERs call after call (a TinyJit replay's constants; 0 for the others), and the others' positions."""
    if debug is None:
        debug = helpers.settings().DEBUG
    plan = cp.plan
    n_in = cp.n_in
    values = _var_values(plan.vars, var_vals) if plan.vars else None  # checked before anything is allocated
    ptrs = cp.ptr_array()
    if prefilled is None:
        ptrs[:n_in] = list(map(buffer_ptr, inputs))  # (one slice assignment: a decode step binds ~200 inputs)
    else:
        ctypes.memmove(ptrs, prefilled[0], ctypes.sizeof(prefilled[0]))
        for k in prefilled[1]:
            ptrs[k] = buffer_ptr(inputs[k])
    res: list[Any] = [None] * len(plan.outs)
    for r in cp.fresh:
        # fresh outputs are fully written by their kernel: uninitialized, not zeros
        o = plan.outs[r]
        if outs is not None and outs[r] is not None:
            u = outs[r]
        else:
            u = output_buffer(o.dtype, o.size)
            if r in tracked:
                track(u)
        res[r] = u
        ptrs[n_in + r] = buffer_ptr(u)
    if len(cp.fresh) != len(res):  # roots that alias an input or an earlier root
        for r, o in enumerate(plan.outs):
            if o.alias is not None:
                res[r] = inputs[o.alias.i] if o.alias.kind is RefKind.IN else res[o.alias.i]
    if cp.fn is None:
        return res
    # the temps' arena is taken from the pool for this call only: two threads running one plan never share it
    arena = pool.alloc(plan.arena_bytes) if plan.temps else None
    if arena is not None:
        base, t = arena.addr, n_in + len(plan.outs)
        for j, off in enumerate(plan.temp_offsets):
            ptrs[t + j] = base + off
    computed = cp.kept.bind(inputs, ptrs, cp.where) if cp.kept else None
    if values is not None:
        ptrs[cp.var_slot] = ctypes.addressof(values)
    records = np.zeros((plan.n_err, ERROR_RECORD), np.int64) if plan.n_err else None
    if records is not None:
        base, t = records.ctypes.data, n_in + len(plan.outs) + len(plan.temps)
        for j in range(plan.n_err):
            ptrs[t + j] = base + j * ERROR_RECORD * 8
    prof = _profile.stats
    hook = _kernel_hook
    timed = debug >= 2 or prof is not None or hook is not None
    ns = (ctypes.c_longlong * len(plan.kernels))() if timed else None
    err = (ctypes.c_longlong * ERROR_RECORD)() if cp.check_oob else None
    try:
        ensure_threads()
        tc = time.perf_counter_ns()
        cp.fn(ptrs, ns, err)
        if prof is not None:
            prof["calls"] += 1
            prof["call_ns"] += time.perf_counter_ns() - tc
            prof["kernel_ns"] += sum(ns)
            prof["kernels"] += len(plan.kernels)
        if ns is not None and hook is not None:
            skipped = cp.kept.skipped(ptrs)
            for i, (k, t) in enumerate(zip(plan.kernels, ns, strict=True)):
                if i not in skipped:
                    hook(k, t * 1e-9)
        if ns is not None and debug >= 2:
            # a plan that writes into storage it was given (TinyJit's in-place updates) must not run twice
            writes_given = outs is not None and any(o is not None for o in outs)
            print_kernels(cp, ptrs, ns, debug, writes_given)
    finally:
        if arena is not None:
            pool.free(arena)
        # the storage this call wrote in place has new contents: what was kept from its old ones is stale
        for i in cp.written_inputs:
            bump_version(inputs[i])
        for u in outs or ():
            if u is not None:
                bump_version(u)
        if computed is not None:
            cp.kept.release()
    if records is not None:
        _raise_index_errors(cp, records)
    if err is not None and err[ErrorField.FAILED]:
        raise oob_error(err, plan.kernels[err[ErrorField.KERNEL]].name)
    if computed:  # the run completed: the kept kernels that ran hold their new temps
        cp.kept.commit(computed)
    return res


def _var_values(plan_vars: tuple[Variable, ...], var_vals: dict[Variable, int] | None) -> Any:
    """The values of a plan's Variables as the long long array its entry point reads; ValueError (before anything
    runs) for one not bound or bound outside its range."""
    var_vals = var_vals or {}
    values = (ctypes.c_longlong * len(plan_vars))()
    for j, v in enumerate(plan_vars):
        n = var_vals.get(v)
        if n is None:
            raise ValueError(f"{v!r} is in the computation's shapes but bound to no value: use {v.name}.bind(n)")
        if not v.vmin <= n <= v.vmax:
            raise ValueError(f"{v!r} is bound to {n}, outside [{v.vmin}, {v.vmax}]")
        values[j] = n
    return values


def inplace_ok(cp: CompiledPlan, r: int, i: int | None) -> bool:
    """Whether root `r` may be written into the storage of input `i` (None: an input the plan does not read):
    every read of the input's old value comes before the first kernel that writes the root, or is in that kernel
    at exactly the element it stores (an elementwise update p - lr * g). A kernel copying the input into the root
    (the first half of a slice write) is skipped when both are one storage: it writes nothing there."""
    plan = cp.plan
    if plan.outs[r].alias is not None:
        return False  # an alias of an input or of another root: nothing is written for it
    if i is None:
        return True
    out, src = Ref(RefKind.OUT, r), Ref(RefKind.IN, i)
    kernels = [k for k in plan.kernels if k.copy != Copy(src, out)]
    w0 = next(w for w, k in enumerate(kernels) if out in k.refs)
    for w, k in enumerate(kernels):
        if src in k.refs and (w > w0 or (w == w0 and not _same_element(k, src, out))):
            return False
    return True


def _same_element(k: Kernel, src: Ref, out: Ref) -> bool:
    """In kernel `k`, every load of `src` reads the element the store it feeds writes to `out`, ungated."""
    slots = sorted({b.arg.slot for b in k.ast.toposort() if b.op is Ops.BUFFER})
    slot_of = dict(zip(k.refs, slots, strict=True))
    s_in, s_out = slot_of[src], slot_of[out]
    fed: set[UOp] = set()
    for st in (u for u in k.ast.toposort() if u.op is Ops.STORE):
        idx = st.src[0]
        if idx.src[0].op is not Ops.BUFFER or idx.src[0].arg.slot != s_out:
            continue
        for ld in st.src[1].toposort():
            if ld.op is Ops.LOAD and ld.src[0].src[0].op is Ops.BUFFER and ld.src[0].src[0].arg.slot == s_in:
                if len(ld.src[0].src) != 2 or ld.src[0].src[1] is not idx.src[1] or len(idx.src) != 2:
                    return False
                fed.add(ld)
    loads = [u for u in k.ast.toposort() if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.BUFFER]
    return all(ld in fed for ld in loads if ld.src[0].src[0].arg.slot == s_in)


def _raise_index_errors(cp: CompiledPlan, records: np.ndarray) -> None:
    """After a run: raise IndexError for the first kernel whose data-dependent index check failed."""
    for k, i in cp.checked:
        if records[i, ErrorField.FAILED]:
            raise check_error(records[i], k.name, k.checks)


def explain_miss(key: tuple, limit: int = 256) -> str | None:
    """Why a plan-cache miss missed, in words: the closest of the `limit` most recently used plans' structures of the
    same size and where it differs (uopc.engine.explain; a miss is rare in a steady loop, so this is cheap)."""
    with _plans_lock:
        recent = list(reversed(_plans))[:limit]
    return closest_difference(key, recent)

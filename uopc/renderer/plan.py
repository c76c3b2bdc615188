"""A plan as C: one translation unit per distinct kernel (cached as an object by its own C), and an entry point that
calls them in order with the plan's buffers.

    srcs = render_plan([(ast, "k0_r_64_64", [0, 1, 2])])    # [the kernel's unit, the entry's unit]
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict
from typing import NamedTuple

from uopc import helpers
from uopc.codegen.error_record import ErrorField
from uopc.renderer.c import PRELUDE, CFunction, Helper, _helper_text, _render_function, optimize_attribute
from uopc.renderer.flags import flags_line
from uopc.uop import UOp
from uopc.uop.variable import SizeArg, Variable

__all__ = ["KernelUnit", "kernel_unit", "render_plan"]


class KernelUnit(NamedTuple):
    """One kernel of a plan as its own translation unit: the same kernel in any plan is the same unit, so its object
    compiles once into the object cache (uopc.runtime.compiler)."""

    sym: str  # its function's name: the kernel's shape name and a digest of its C
    fn: CFunction
    src: str  # the whole unit: the prelude, the helpers it uses and the (hidden) definition
    attr: str = ""  # the attributes its definition carries (TILED_OPTIMIZE or none)


# hidden: a plan's entry point calls each kernel directly, not through the PLT, and no other object can interpose it.
# A definition is also weak: the runtime may compile several units into one object (uopc.runtime.objects), so a
# plan's link can meet one kernel in two objects, the same code under the same name; the linker keeps one.
_HIDDEN = '__attribute__((visibility("hidden"))) '
_DEFINED = '__attribute__((visibility("hidden"), weak)) '
# (ast, shape name, index checks) -> KernelUnit: the engine renders a big plan's kernels as it lowers them (to start
# gcc early) and render_plan renders them again. Bounded: the entries keep their ASTs alive.
_UNITS_MAX = 1024
_units: OrderedDict[tuple, KernelUnit] = OrderedDict()
_units_lock = threading.Lock()


def kernel_unit(ast: UOp, name: str, tiled: bool = False) -> KernelUnit:
    """The translation unit of one lowered kernel named `name` in a plan (its k0_ prefix and n1 suffix are not part
    of the unit; a kernel whose loop ends at a SizeArg is e_n, whatever its size), memoized. `tiled`: it keeps a
    register tile (Opts.register_tile): see renderer.c.TILED_OPTIMIZE."""
    base = re.sub(r"n\d+$", "", re.sub(r"^k\d+_", "", name))
    attr = optimize_attribute(tiled)
    key = (ast, base, bool(helpers.settings().CHECK_OOB), attr, helpers.settings().CFLAGS is None)  # (flags line)
    with _units_lock:
        if (hit := _units.get(key)) is not None:
            _units.move_to_end(key)
            return hit
    fn = _render_function(ast, oob_param=True, guarded=True)
    if any(isinstance(v, SizeArg) for v in fn.vars):  # one function for every size: named without it
        base = base.split("_")[0] + "_n"
    helper_text = _helper_text(fn.helpers)
    digest = hashlib.sha256((PRELUDE + helper_text + attr + fn.definition("uopc_kernel")).encode()).hexdigest()
    sym = f"{base}_{digest[:16]}"
    src = flags_line([ast]) + PRELUDE + helper_text + "\n" + _DEFINED + attr + fn.definition(sym)
    unit = KernelUnit(sym, fn, src, attr)
    with _units_lock:
        _units[key] = unit
        while len(_units) > _UNITS_MAX:
            _units.popitem(last=False)
    return unit


# The entry point only calls the kernels in order: gcc's -O0 compiles char-GPT's 311 calls in 0.18 s where -O3 took
# 0.69 s, and the calls run no slower (each passes pointers read from `bufs`). Under uopc's default flags only, as
# renderer.c.optimize_attribute.
_ENTRY_OPTIMIZE = '__attribute__((optimize("O0"))) '
# The entry's clock: POSIX's clock_gettime declared here, its timespec read as two 64-bit fields (x86-64 Linux's
# layout) and the clock's number taken from Python, so that no header is parsed: <time.h> was 2 ms of the 60 ms gcc
# took on a one-kernel plan (a 512x512 softmax, best of 11).
_PLAN_TIMER = f"""#ifndef UOPC_HAVE_NOW
#define UOPC_HAVE_NOW
int clock_gettime(int, void*);
static inline __attribute__((always_inline)) long long uopc_now(void) {{
  long long t[2];  /* struct timespec: seconds, nanoseconds */
  clock_gettime({time.CLOCK_MONOTONIC}, t);
  return t[0] * 1000000000LL + t[1];
}}
#endif
"""


def render_plan(
    kernels: list[tuple[UOp, str, list[int]]],
    entry: str = "plan",
    one_unit_below: int = 0,
    copies: dict[int, tuple[int, int]] | None = None,
    guards: dict[int, int] | None = None,
    var_slot: int | None = None,
    plan_vars: tuple[Variable, ...] = (),
    tiled: frozenset[int] = frozenset(),
) -> list[str]:
    """A plan as C translation units: one per distinct kernel, whose function is named by its shape name and a
    digest of its own C (so the same kernel in any plan is the same unit, compiled once into the object cache), then
    the unit of `void entry(void** bufs, long long* ns, long long* err)`, which calls them in order. A plan whose
    kernels come to fewer than `one_unit_below` characters of C is one unit instead (one compiler run: spawning and
    linking several costs more than sharing saves there).
    Each kernel is (ast, its name in the plan, index into bufs of each parameter). `copies` maps kernel i to the
    (source, destination) bufs of the copy it is: the entry point skips it when both are one storage. `guards` maps
    kernel i to the bufs slot of its run flag: the entry point skips it when that is NULL (a kept temp, still valid).
    `bufs[var_slot]` holds the values of `plan_vars` (long longs): kernels get those they use as arguments.
    `tiled`: the kernels (by number) that keep a register tile (kernel_unit).

    `ns` (or NULL) receives each kernel's nanoseconds. With UOPC_CHECK_OOB every kernel gets `err` (an error record,
    uopc.codegen.error_record) as its parameter uopc_oob, so threads running one plan never mix their reports: the
    first bad index fills it, and the plan records the kernel's number and stops after that kernel.
    """
    check = bool(helpers.settings().CHECK_OOB)
    units: dict[str, KernelUnit] = {}  # by the name of its function
    done: dict[UOp, KernelUnit] = {}
    calls = []
    for i, (ast, name, where) in enumerate(kernels):
        if ast not in done:
            done[ast] = unit = kernel_unit(ast, name, i in tiled)
            units[unit.sym] = unit
        sym, ptrs = done[ast].sym, done[ast].fn.ptr_types
        args = [f"({t}*)bufs[{w}]" for t, w in zip(ptrs, where, strict=True)]
        args += [
            str(v.value) if isinstance(v, SizeArg) else f"((long long*)bufs[{var_slot}])[{plan_vars.index(v)}]"
            for v in done[ast].fn.vars
        ]
        args += ["err"] * check
        call = f"{sym}({', '.join(args)});"
        if copies and i in copies:  # a copy onto itself (a write in place) does nothing
            call = f"if (bufs[{copies[i][0]}] != bufs[{copies[i][1]}]) {call}"
        if guards and i in guards:
            call = f"if (bufs[{guards[i]}]) {call}"
        calls.append(f"  {call}")
        calls.append(f"  if (ns) {{ long long t = uopc_now(); ns[{i}] = t - t0; t0 = t; }}")
        if check:
            calls.append(f"  if (err[{ErrorField.FAILED.value}]) {{ err[{ErrorField.KERNEL.value}] = {i}; return; }}")
    attr = _ENTRY_OPTIMIZE if helpers.settings().CFLAGS is None else ""
    body = f"{attr}void {entry}(void** bufs, long long* ns, long long* err) {{\n  long long t0 = ns ? uopc_now() : 0;\n"
    body += "\n".join(calls) + "\n}\n"
    defs = {sym: u.attr + u.fn.definition(sym) for sym, u in units.items()}
    if sum(len(d) for d in defs.values()) < one_unit_below:
        hs: dict[str, Helper] = {}
        for u in units.values():
            hs.update(u.fn.helpers)
        fns = "\n".join("static " + d for d in defs.values())
        return [flags_line(list(done)) + PRELUDE + _helper_text(hs) + _PLAN_TIMER + fns + body]
    protos = "".join(_HIDDEN + u.fn.declaration(sym) + ";\n" for sym, u in units.items())
    return [*(u.src for u in units.values()), PRELUDE + _PLAN_TIMER + protos + body]

"""What the scheduler hands on: the plan's records (Ref, Temp, Out, Kernel, Plan, ScheduleItem, Schedule) and the
memory planner that places a plan's temps in one arena (temps with disjoint live ranges share storage).

A Plan holds no UOps of the user's graph: kernels refer to buffers as Ref(RefKind.IN, i), Ref(RefKind.TMP, j) or
Ref(RefKind.OUT, r) (printed in[i], tmp[j], out[r]), so one plan runs any inputs of the same structure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

from uopc.uop import UOp
from uopc.uop.dtype import DType
from uopc.uop.variable import Variable

__all__ = [
    "Arena",
    "Copy",
    "Kernel",
    "Out",
    "Plan",
    "Ref",
    "RefKind",
    "Schedule",
    "ScheduleItem",
    "Temp",
    "plan_memory",
]


class RefKind(Enum):
    """The plan arrays a kernel parameter can bind to."""

    IN = "in"  # an input BUFFER (make_plan's second result, by position)
    TMP = "tmp"  # a temp, in the arena the temps share
    OUT = "out"  # a root's fresh output buffer
    ERR = "err"  # an error record for data-dependent index checks


class Ref(NamedTuple):
    """Which array a kernel parameter binds to: the i-th input, temp, output or error record of the plan."""

    kind: RefKind
    i: int

    def __repr__(self) -> str:
        return f"{self.kind.value}[{self.i}]"


class Temp(NamedTuple):
    """A temp of a plan: `size` elements of `dtype`."""

    dtype: DType
    size: int


class Out(NamedTuple):
    """Where a root's value ends up: `size` elements of `dtype`, in a fresh buffer a kernel writes, or, with `alias`,
    in the input or the earlier root (Ref IN or OUT) it already is; nothing is written for an alias."""

    dtype: DType
    size: int
    alias: Ref | None = None


@dataclass(frozen=True)
class Kernel:
    """One loop nest of a plan: its lowered AST, and the plan arrays its parameters bind to, in order."""

    name: str
    ast: UOp
    refs: tuple[Ref, ...]
    flops: int = 0
    opts: Any = None  # the Opts it was lowered with (printed at DEBUG>=3)
    checks: tuple[str, ...] = ()  # labels of its data-dependent index checks (GATHERs), by their number
    nbytes: int = 0  # bytes it must move: every buffer it reads, once, plus its output
    op: str = ""  # the Tensor-level operation it computes, derived from the graph ("sum", "matmul", "exp2 mul ...")
    copy: Copy | None = None  # it copies an input unchanged: nothing to do when the output is that input's storage
    vars: tuple[Variable, ...] = ()  # the symbolic sizes its loops run to (uopc.uop.variable), by name

    @property
    def register_tile(self) -> bool:
        """Was it lowered with a tile of SIMD vectors in registers (Opts.register_tile: the GEMM microkernel)?"""
        return self.opts is not None and self.opts.register_tile


class Copy(NamedTuple):
    """A kernel that copies input `src` element for element into `dst` (the first half of a SETITEM or SCATTER
    whose base is an input buffer): when both are one storage (a write in place) it is skipped."""

    src: Ref
    dst: Ref


@dataclass(frozen=True)
class Plan:
    """Kernels in run order, the temps they share, and where each root's value ends up."""

    kernels: tuple[Kernel, ...]
    temps: tuple[Temp, ...]
    outs: tuple[Out, ...]  # per root
    n_err: int = 0  # error records (one per kernel with index checks), zeroed before each run, read after
    temp_offsets: tuple[int, ...] = ()  # byte offset of each temp in the one arena the temps share
    arena_bytes: int = 0  # size of that arena (the memory planner's result)
    vars: tuple[Variable, ...] = ()  # the symbolic sizes its loops run to (uopc.uop.variable), by name: per call

    @property
    def temp_bytes(self) -> int:
        """What the temps would take without sharing (each in its own array)."""
        return sum(_padded(t.size * t.dtype.itemsize) for t in self.temps)


def _padded(nbytes: int) -> int:
    return -(-nbytes // 64) * 64  # every temp starts on a cache line


@dataclass(frozen=True)
class ScheduleItem:
    """One kernel as the scheduler cuts it, not lowered yet: its body with buffers renumbered 0..n-1 in topological
    order (identical kernels of a model's repeated layers are one object), the BUFFER it writes (slot n; a group of
    updates writes more, `more`), and the plan array each slot binds to (then the kernel's error record, if it
    checks indices). The engine lowers it."""

    name: str
    body: UOp
    out: UOp
    refs: tuple[Ref, ...]
    flops: int
    checks: tuple[str, ...]  # labels of its data-dependent index checks (GATHERs), by their number
    op: str  # the Tensor-level operation it computes ("sum", "matmul", "exp2 mul ...")
    copy: Copy | None = None  # a copy of an input buffer (Kernel.copy)
    # further (value, BUFFER) pairs it stores in the same loops, the BUFFERs in slots n+1.. (uopc.schedule.groups)
    more: tuple[tuple[UOp, UOp], ...] = ()


@dataclass(frozen=True)
class Schedule:
    """make_plan's first half: the kernels in run order (unlowered), the temps, where each root ends up, and how
    many error records the kernels with index checks need."""

    items: tuple[ScheduleItem, ...]
    temps: tuple[Temp, ...]
    outs: tuple[Out, ...]
    n_err: int = 0


class Arena(NamedTuple):
    """The memory planner's result: each temp's byte offset in the one arena the temps share, and its size."""

    offsets: tuple[int, ...]
    nbytes: int


@dataclass
class _Slot:
    """A stretch of the arena: its size so far, and the last kernel using what it holds."""

    nbytes: int
    last: int


class _Placed(NamedTuple):
    temp: int
    slot: int


def plan_memory(kernels: list[Kernel], temps: list[Temp]) -> Arena:
    """Place the temps in one arena: temps whose live ranges (first to last kernel using them) do not overlap
    share storage.

    Ranges are inclusive: a kernel that reads one temp for the last time never writes another temp over it.
    """
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for ki, k in enumerate(kernels):
        for ref in k.refs:
            if ref.kind is RefKind.TMP:
                first.setdefault(ref.i, ki)
                last[ref.i] = ki
    slots: list[_Slot] = []
    placed: list[_Placed] = []
    for t in sorted(range(len(temps)), key=lambda t: (first.get(t, -1), t)):
        need = _padded(temps[t].size * temps[t].dtype.itemsize)
        start = first.get(t, -1)
        free = [i for i, sl in enumerate(slots) if sl.last < start]
        fits = [i for i in free if slots[i].nbytes >= need]
        if fits:  # the smallest free slot that fits, else grow the largest free one
            i = min(fits, key=lambda i: slots[i].nbytes)
        elif free:
            i = max(free, key=lambda i: slots[i].nbytes)
            slots[i].nbytes = need
        else:
            i = len(slots)
            slots.append(_Slot(need, 0))
        slots[i].last = last.get(t, start)
        placed.append(_Placed(t, i))
    base_of, pos = [], 0
    for sl in slots:
        base_of.append(pos)
        pos += sl.nbytes
    offsets = [0] * len(temps)
    for p in placed:
        offsets[p.temp] = base_of[p.slot]
    return Arena(tuple(offsets), pos)

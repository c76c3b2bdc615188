"""Kept kernels: a kernel that computes a temp only from plan inputs its plan does not write (directly, or through
other kept temps) runs once per change of those inputs, not once per call.

    weight W (an input no kernel writes) --pack--> tmp[0] (kept) --> r_128_2304 (runs every call)

Such a kernel (a weight packed into the microkernel's panels, a convolution weight reordered) computes the same temp
from the same input contents, so its temp lives in storage of the plan's own, and the plan's entry point skips the
kernel (a run flag per kept kernel in `bufs`) while its inputs are the same BUFFERs at the same versions
(uopc.runtime.buffer.version: uopc's writes into existing storage; a handed-out NumPy view makes the contents unknown,
and nothing computed from it is kept). As onnxruntime and oneDNN prepack weights once per weight, not per call.

One call at a time uses a plan's kept temps (a lock); a concurrent call of the same plan runs every kernel into its
own arena. A plan that writes its weights (a training step: TinyJit writes them in place) keeps its packs, but their
inputs change every call, so they run every call.
"""

from __future__ import annotations

import operator
import threading
from typing import Any, NamedTuple

import numpy as np

from uopc.runtime.buffer import aligned_empty, version
from uopc.schedule import Plan, Ref, RefKind
from uopc.uop import AxisType, Ops, UOp

__all__ = ["Kept", "invariant_kernels"]


# a kept temp may be this many times the bytes its kernel reads: a copy in another layout (1x), a Winograd weight
# transform (F(4,3): 36 values per 9 taps, 4x, written in the product's NR-column panels, whose last one is padded
# with zeros: 40 filters in two 32-column panels make 6.4x), not a broadcast of a small input over a large shape.
# (At 4, a transform with a partial panel ran every call: 160 channels' at 28x28, in 48-column panels, 4.3x.)
KEPT_EXPANSION = 8


# ...and reduces at most this many elements per value: a reorder, a fold or a transform of a weight is kept, a
# product is not (a GEMM whose inputs did not change, a benchmark's fixed input, still runs: kept temps are a
# weight's preprocessing, not a memo of the model's work)
KEPT_REDUCTION = 16


def _reduction(ast: UOp) -> int:
    """How many elements a lowered kernel reduces per value: the product of its reduction loops' trip counts."""
    n = 1
    for u in ast.toposort():
        if u.op is Ops.RANGE and u.arg.kind is AxisType.REDUCE:
            end = u.src[0]
            n *= end.arg if end.op is Ops.CONST else 1 << 30
    return n


def invariant_kernels(plan: Plan) -> dict[int, tuple[int, ...]]:
    """The kernels a plan can keep from call to call, each with the plan inputs its temp is computed from: it
    computes a temp (no other kernel writes it) only from plan inputs that no kernel of the plan writes and from
    other kept temps (a weight folded with a BatchNorm's statistics, then reordered: both kept), checks no index,
    loops over no symbolic size, makes at most KEPT_EXPANSION times the bytes it reads and reduces at most
    KEPT_REDUCTION elements per value."""
    written_inputs = {r.i for k in plan.kernels for r in k.refs[-1:] if r.kind is RefKind.IN}
    writers: dict[Ref, int] = {}
    for k in plan.kernels:
        writers[k.refs[-1]] = writers.get(k.refs[-1], 0) + 1
    kept: dict[int, tuple[int, ...]] = {}
    made_by: dict[Ref, int] = {}  # a kept temp -> the kernel that computes it
    for i, k in enumerate(plan.kernels):
        out, ins = k.refs[-1], k.refs[:-1]
        # (a kernel over a symbolic size computes something else for each value bound: never kept)
        if out.kind is not RefKind.TMP or writers[out] != 1 or k.copy is not None or not ins or k.vars:
            continue
        roots: set[int] = set()
        for r in ins:
            if r.kind is RefKind.IN and r.i not in written_inputs:
                roots.add(r.i)
            elif r in made_by:
                roots.update(kept[made_by[r]])
            else:
                break
        else:
            t = plan.temps[out.i]
            made = t.size * t.dtype.itemsize
            if made <= KEPT_EXPANSION * (k.nbytes - made) and _reduction(k.ast) <= KEPT_REDUCTION:
                kept[i] = tuple(sorted(roots))
                made_by[out] = i
    return kept


class _Steady(NamedTuple):
    """Kept kernels skipped at once: while `pick(inputs)` (all but its last item) are the same BUFFERs at the same
    versions as `state` records, the kernels not in `rest` keep their temps (`fill`: the bufs entries of their temps
    and run flags); the kernels in `rest` (indices into Kept.kernels) are checked one by one."""

    pick: Any
    state: tuple
    fill: tuple[tuple[int, int | None], ...]
    rest: tuple[int, ...]


class Kept:
    """The kept kernels of one compiled plan and their temps. `first_flag` is the index in `bufs` of the first run
    flag (the others follow, one per kept kernel); `where(ref)` the index in `bufs` of a kernel parameter."""

    def __init__(self, plan: Plan, first_flag: int):
        self.roots = invariant_kernels(plan)  # kernel index -> the plan inputs its temp is computed from
        self.plan, self.kernels, self.first_flag = plan, tuple(self.roots), first_flag
        self.temps: dict[int, tuple[tuple, np.ndarray]] = {}  # kernel index -> (input slots and versions, its temp)
        self.lock = threading.Lock()
        # the steady state (see _Steady): the kept kernels the last full check found valid, skipped by the next calls
        # that see their inputs unchanged in one comparison
        self.steady: _Steady | None = None

    def __len__(self) -> int:
        return len(self.kernels)

    def flag(self, n: int) -> int:
        """The index in `bufs` of the run flag of kept kernel number `n` (an index into `kernels`)."""
        return self.first_flag + n

    def skipped(self, ptrs: Any) -> set[int]:
        """The kept kernels a call with these `bufs` skips (their temps still valid)."""
        return {i for n, i in enumerate(self.kernels) if ptrs[self.flag(n)] is None}

    def bind(self, inputs: list[UOp], ptrs: Any, where: Any) -> list[tuple[int, tuple, np.ndarray]] | None:
        """Point each kept kernel's temp at its storage that outlives the call and set its run flag: skip it where
        its inputs are the BUFFERs, at the versions, it last ran on. Returns the kernels that run, with the versions
        they read (commit them once the call completes; release() either way), holding the lock; None, with every
        flag set and the temps left in the arena, when another call holds it."""
        if not self.lock.acquire(blocking=False):
            for n in range(len(self.kernels)):
                ptrs[self.flag(n)] = 1
            return None
        todo: Any = range(len(self.kernels))
        if (st := self.steady) is not None:
            bufs = st.pick(inputs)[:-1] if st.pick is not None else ()  # (a tuple even for one input)
            if (bufs, tuple(map(version, bufs))) == st.state:
                for at, value in st.fill:
                    ptrs[at] = value
                todo = st.rest
            else:
                self.steady = None
        computed = []
        for n in todo:
            i = self.kernels[n]
            k = self.plan.kernels[i]
            ins = [inputs[j] for j in self.roots[i]]
            versions = [version(b) for b in ins]
            # None: a view of the storage is handed out, its contents unknown: an empty key, which never matches
            key = () if None in versions else tuple((b.arg.slot, v) for b, v in zip(ins, versions, strict=True))
            rec = self.temps.pop(i, None)
            if rec is None:
                t = self.plan.temps[k.refs[-1].i]
                rec = ((), aligned_empty(t.size, t.dtype))
            ptrs[where(k.refs[-1])] = rec[1].ctypes.data
            if key and rec[0] == key:
                self.temps[i] = rec
                ptrs[self.flag(n)] = None
            else:
                ptrs[self.flag(n)] = 1
                computed.append((i, key, rec[1]))
        if self.steady is None or len(computed) < len(todo):  # (kernels found valid that the steady state checks)
            self.steady = self._steady(inputs, ptrs, where, {i for i, _, _ in computed})
        return computed

    def _steady(self, inputs: list[UOp], ptrs: Any, where: Any, computed: set[int]) -> _Steady:
        """The steady state after a full check: the kept kernels it found valid (none of their inputs handed out) and
        the buffers and versions of their inputs, so that a call seeing the same ones skips those kernels at once and
        checks only the rest (the kernels of an input that is new each call, as a model's own input is)."""
        skip = [n for n, i in enumerate(self.kernels) if i not in computed]
        ins = sorted({j for n in skip for j in self.roots[self.kernels[n]]})
        pick = operator.itemgetter(*ins, *ins[:1]) if ins else None
        bufs = pick(inputs)[:-1] if pick is not None else ()
        at = [a for n in skip for a in (where(self.plan.kernels[self.kernels[n]].refs[-1]), self.flag(n))]
        rest = tuple(n for n, i in enumerate(self.kernels) if i in computed)
        return _Steady(pick, (bufs, tuple(map(version, bufs))), tuple((a, ptrs[a]) for a in at), rest)

    def release(self) -> None:
        self.lock.release()

    def commit(self, computed: list[tuple[int, tuple, np.ndarray]]) -> None:
        """After a completed call: the kept kernels that ran hold the temps of the versions they read."""
        with self.lock:
            for i, key, arr in computed:  # (an empty key never matches; the storage is reused by the next call)
                self.temps[i] = (key, arr)

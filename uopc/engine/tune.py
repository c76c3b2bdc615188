"""The autotuner's timer: a kernel body lowered with each candidate Opts, rendered, compiled and run on random data.

    SearchOpt(machine, KernelTimer())      # what OPT=2 runs (uopc.engine.realize.default_opt)

The search (uopc.opt.search) chooses and remembers; this module is its one contact with codegen, the renderer and
the runtime, which sit to the optimizer's right in the pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from uopc.codegen.error_record import ERROR_RECORD
from uopc.codegen.rangeify import Ctx, lower
from uopc.opt.opts import Opts
from uopc.renderer.c import render_c
from uopc.runtime.buffer import aligned_empty
from uopc.runtime.compiler import Program, compiler_identity
from uopc.runtime.threads import get_num_threads
from uopc.schedule import checks_of
from uopc.uop import Ops, UOp
from uopc.uop.dtype import DType

__all__ = ["KernelTimer"]


@dataclass(frozen=True)
class KernelTimer:
    """Times candidate Opts of one kernel body; part of SearchOpt (and so of the plan key), equal to every other."""

    def key(self) -> tuple:
        """What a timing depends on besides the kernel: the compiler, its flags and the CPU, and the thread count."""
        return (compiler_identity(), get_num_threads())

    def __call__(self, body: UOp, out: UOp, cands: list[Opts], reps: int = 3) -> Iterator[tuple[Opts, float]]:
        """(opts, best of `reps` seconds) for each candidate, run on random inputs."""
        bufs = sorted({u for u in body.toposort() if u.op is Ops.BUFFER}, key=lambda u: u.arg.slot)
        rng = np.random.default_rng(0)
        # aligned as uopc's own buffers are: a vector access proven aligned may use an aligned instruction
        data = [_aligned(rng.standard_normal(b.arg.shape[0]), b.dtype) for b in bufs]
        res = _aligned(np.zeros(out.arg.shape[0]), out.dtype)
        # a kernel with data-dependent index checks takes an error record after its output (random indices fail
        # them: the checks replace bad indices by 0, so timing is unaffected)
        args = [*data, res] + ([np.zeros(ERROR_RECORD, np.int64)] if checks_of(body) else [])
        for o in cands:
            prg = Program(render_c(lower(body, out, Ctx(opts=o)), "k", o.register_tile), "k")
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                prg(*args)
                ts.append(time.perf_counter() - t0)
            yield o, min(ts)


def _aligned(x: np.ndarray, dtype: DType) -> np.ndarray:
    a = aligned_empty(x.size, dtype)
    a[:] = x
    return a

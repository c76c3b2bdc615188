"""The timed search (OPT=2): lower a kernel with every plausible Opts, time each on random data, keep the fastest.

The winner is remembered on disk under a key of everything the timing depends on (see `search_key`), so a second
run does no timing, and a result timed under other flags, another compiler, CPU or thread count is not reused.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from dataclasses import dataclass

import numpy as np

from uopc import helpers
from uopc.buffer import aligned_empty
from uopc.dtype import DType
from uopc.helpers import atomic_write
from uopc.machine import Machine
from uopc.opt.heuristic import hand_opt_choice, reduce_size
from uopc.opt.layout import layout_pass
from uopc.opts import Opts
from uopc.rangeify import ERROR_RECORD, Ctx, checks_of, lower
from uopc.render_c import render_c
from uopc.runtime import Program, compiler_identity
from uopc.threads import get_num_threads
from uopc.uop import Ops, UOp, structure_key


def candidate_opts(body: UOp, machine: Machine) -> list[Opts]:
    """Plausible Opts: none, the heuristic's, register tiles of the last two axes (+/- unroll), cache blocks."""
    shape, rsize = body.shape, reduce_size(body)
    outs = [a for a, s in enumerate(shape) if s > 1]
    hand = hand_opt_choice(body, machine)
    cands = [Opts(), hand]
    for a, b in itertools.product(outs[-2:], repeat=2):
        for fa, fb in [(4, 4), (8, 4), (4, 8), (8, 8), (16, 2), (2, 16)]:
            up = {a: fa} if a == b else {a: fa, b: fb}
            if all(shape[k] % f == 0 for k, f in up.items()):
                for u in (1, 4) if rsize % 4 == 0 and rsize > 1 else (1,):
                    cands.append(Opts(dict(up), hand.thread, u))
    # cache blocks of the last two output axes (help when operand rows do not fit in cache)
    for t in (32, 64, 128):
        tile = {a: t for a in outs[-2:] if shape[a] % t == 0}
        if tile:
            cands.append(Opts(dict(hand.upcast), hand.thread, hand.unroll, tile=tile))
            # and the reduce axis blocked too (exercise 6): partial sums kept in the output between chunks
            if rsize > 256 and rsize % 256 == 0 and body.op is Ops.REDUCE:
                cands.append(Opts(dict(hand.upcast), hand.thread, 1, tile=tile, ktile=256))
    return cands


def _dedup(cands: list[Opts]) -> list[Opts]:
    """Distinct candidates, by every field of Opts (a key without `tile` once dropped all cache blocks)."""
    seen: dict[tuple, Opts] = {}
    for o in cands:
        seen.setdefault(o.key(), o)
    return list(seen.values())


def search_key(body: UOp, out: UOp, machine: Machine) -> str:
    """What a timing depends on: the kernel's structure and output, the compiler and its flags, the CPU, the
    Machine record the candidates were made for, and the thread count they ran with."""
    parts = (structure_key([body])[0], out.dtype.name, out.arg.shape, compiler_identity(), machine, get_num_threads())
    return repr(parts)


def _search_cache_path(body: UOp, out: UOp, machine: Machine) -> str:
    h = hashlib.sha256(search_key(body, out, machine).encode()).hexdigest()[:32]
    return os.path.join(helpers.cache_dir(), "search", f"{h}.json")


def search_opt(body: UOp, out: UOp, machine: Machine, reps: int = 3) -> tuple[UOp, Opts]:
    """Time every distinct candidate on random data and keep the fastest; remember the winner on disk."""
    path = _search_cache_path(body, out, machine)
    try:
        with open(path) as f:
            o = Opts.from_json(json.load(f))
        return lower(body, out, Ctx(opts=o)), o
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # no entry yet, or an unreadable one: search again and overwrite it
    best, best_o, best_t = None, None, float("inf")
    for o, t, ast in time_candidates(body, out, machine, reps):
        if t < best_t:
            best, best_o, best_t = ast, o, t
    atomic_write(path, json.dumps(best_o.to_json()).encode())
    return best, best_o


search_stats = {"timed": 0}


def time_candidates(body: UOp, out: UOp, machine: Machine, reps: int = 3):
    """Yield (opts, best seconds, ast) for every distinct candidate, run on random inputs."""
    bufs = sorted({u for u in body.toposort() if u.op is Ops.BUFFER}, key=lambda u: u.arg.slot)
    rng = np.random.default_rng(0)
    # aligned as uopc's own buffers are: a vector access proven aligned may use an aligned instruction
    data = [_aligned(rng.standard_normal(b.arg.shape[0]), b.dtype) for b in bufs]
    res = _aligned(np.zeros(out.arg.shape[0]), out.dtype)
    # a kernel with data-dependent index checks takes an error record after its output (random indices fail them:
    # the checks replace bad indices by 0, so timing is unaffected)
    args = [*data, res] + ([np.zeros(ERROR_RECORD, np.int64)] if checks_of(body) else [])
    for o in _dedup(candidate_opts(body, machine)):
        ast = lower(body, out, Ctx(opts=o))
        prg = Program(render_c(ast, "k"), "k")
        search_stats["timed"] += 1
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            prg(*args)
            ts.append(time.perf_counter() - t0)
        yield o, min(ts), ast


def _aligned(x: np.ndarray, dtype: DType) -> np.ndarray:
    a = aligned_empty(x.size, dtype)
    a[:] = x
    return a


@dataclass(frozen=True)
class SearchOpt:
    """OPT=2 for one machine: layout pass + timed search over candidate Opts (results cached on disk)."""

    machine: Machine

    def layout(self, roots: list[UOp]) -> list[UOp]:
        return layout_pass(roots, self.machine)

    def lower(self, body: UOp, out: UOp) -> tuple[UOp, Opts]:
        return search_opt(body, out, self.machine)

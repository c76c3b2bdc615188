"""The timed search (OPT=2): time a kernel lowered with every plausible Opts on random data, keep the fastest.

The timing itself is the engine's (uopc.engine.tune.KernelTimer, handed to SearchOpt): lowering, rendering and
running code are stages to the optimizer's right, which it never imports. The winner is remembered on disk under a
key of everything the timing depends on (see `search_key`), so a second run does no timing, and a result timed
under other flags, another compiler, CPU or thread count is not reused.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from uopc import helpers
from uopc.helpers import atomic_write
from uopc.machine import Machine
from uopc.opt.heuristic import (
    fit_symbolic,
    groupable,
    hand_opt_choice,
    reduce_size,
    row_fits,
    symbolic_kernel,
    takes_epilogue,
)
from uopc.opt.layout import layout_pass
from uopc.opt.opts import Opts
from uopc.uop import Ops, UOp, epilogue_reduce, structure_key


class Timer(Protocol):
    """What the search needs from the engine: the seconds a body takes lowered with each Opts, and what those
    timings depend on beyond the body (compiler, flags, thread count)."""

    def key(self) -> tuple: ...

    def __call__(self, body: UOp, out: UOp, cands: list[Opts], reps: int) -> Iterator[tuple[Opts, float]]: ...


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
            if rsize > 256 and rsize % 256 == 0 and epilogue_reduce(body) is not None:
                cands.append(Opts(dict(hand.upcast), hand.thread, 1, tile=tile, ktile=256))
    return cands


def _dedup(cands: list[Opts]) -> list[Opts]:
    """Distinct candidates, by every field of Opts (a key without `tile` once dropped all cache blocks)."""
    seen: dict[tuple, Opts] = {}
    for o in cands:
        seen.setdefault(o.key(), o)
    return list(seen.values())


def search_key(body: UOp, out: UOp, machine: Machine, timer: Timer) -> str:
    """What a timing depends on: the kernel's structure and output, the Machine record the candidates were made
    for, and the timer's own key (the compiler and its flags, the CPU, the thread count)."""
    return repr((structure_key([body])[0], out.dtype.name, out.arg.shape, machine, timer.key()))


def _search_cache_path(body: UOp, out: UOp, machine: Machine, timer: Timer) -> str:
    h = hashlib.sha256(search_key(body, out, machine, timer).encode()).hexdigest()[:32]
    return os.path.join(helpers.cache_dir(), "search", f"{h}.json")


search_stats = {"timed": 0}


def search_opt(body: UOp, out: UOp, machine: Machine, timer: Timer, reps: int = 3) -> Opts:
    """Time every distinct candidate on random data and keep the fastest; remember the winner on disk."""
    path = _search_cache_path(body, out, machine, timer)
    try:
        with open(path) as f:
            return Opts.from_json(json.load(f))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # no entry yet, or an unreadable one: search again and overwrite it
    best_o, best_t = None, float("inf")
    for o, t in timer(body, out, _dedup(candidate_opts(body, machine)), reps):
        search_stats["timed"] += 1
        if t < best_t:
            best_o, best_t = o, t
    atomic_write(path, json.dumps(best_o.to_json()).encode())
    return best_o


@dataclass(frozen=True)
class SearchOpt:
    """OPT=2 for one machine: layout pass + timed search over candidate Opts (results cached on disk), timed by
    the engine's `timer`."""

    machine: Machine
    timer: Timer

    def layout(self, roots: list[UOp]) -> list[UOp]:
        return layout_pass(roots, self.machine)

    def choose(self, body: UOp, out: UOp) -> Opts:
        """The fastest candidate Opts for one kernel body (the engine lowers it); a kernel over a symbolic axis
        takes the hand choice (its time depends on the value bound, and its axes are not split anyway), and so does
        one that reads a bound value (a decode step's position: the timer has no value to pass it, and a position
        taken from a stray register indexed out of bounds)."""
        if symbolic_kernel(body) or any(u.op is Ops.DEFINE_VAR for u in body.toposort()):
            return fit_symbolic(hand_opt_choice(body, self.machine), body)
        return search_opt(body, out, self.machine, self.timer)

    def epilogue(self, r: UOp, reader: UOp) -> bool:
        """As HandOpt.epilogue: a matmul the microkernel runs takes its reader's elementwise ops where they have a
        vector form."""
        return takes_epilogue(r, reader, self.machine)

    def row_fusion(self, r: UOp, reader: UOp) -> bool:
        """As HandOpt.row_fusion: a reduce is computed per row inside its reader when a row fits in cache."""
        return row_fits(r, self.machine)

    def group(self, first: UOp, value: UOp) -> bool:
        """As HandOpt.group: values whose reads walk their elements alike share one kernel's loops."""
        return groupable(first, value)

"""Roots one kernel stores together: consecutive elementwise roots of one shape that read the same data, or each
other's values, are computed in one loop nest, each stored into its own output. An optimizer step is such a run for
every parameter:

    AdamW, one parameter:  e_n [m, g] -> m'     e_n [v, g] -> v'     e_n [p, m', v', ...] -> p'
    grouped:               e_n [m, g, v, p, ...] -> m', v', p'

The grouped kernel reads the gradient once and computes p' from the values of m' and v', not from their stores: 28
bytes an element moved, not 40. AdamW over 4 parameters of 2048^2 took 3.2-4.1 ms in kernels, against 4.8-5.0
(DEBUG=3 second runs; it needs gcc's wider overlap checks, uopc.renderer.flags). A CNN training step keeps 88 of
its 108 kernels (2.5 MB a step less moved), the char-GPT step 227 of 311.

The optimizer has the last word (HandOpt.group): a group runs as the loops its first member would, so members must
walk their reads alike (the same merged_shape). A member whose value reads an earlier member's at its own index (an
ALU operand of the same shape) takes that value in; any other read of it (a view, a broadcast) keeps the members
apart. The group runs where its first member did: members are consecutive in the schedule, so every value a later
one reads is computed before it, or by the group. Which roots may write into their inputs' storage is still decided
per root after the plan is built (uopc.engine.realize.inplace_ok): a grouped kernel reads an input only at the
element it stores, or it writes a fresh buffer.
"""

from __future__ import annotations

from collections.abc import Callable

from uopc.schedule.plan import Ref, RefKind
from uopc.uop import ALU, OWN_KERNEL, Ops, UOp, base_buffer

__all__ = ["update_groups"]

# what a member's value may not hold: a reduction, a gather's index check, a write of its own, a fused kernel
_NOT_ELEMENTWISE = frozenset({Ops.REDUCE, Ops.GATHER, Ops.SCATTER, Ops.SETITEM, *OWN_KERNEL})


def update_groups(
    points: list[UOp],
    bodies: dict[UOp, UOp],
    place: dict[UOp, UOp],
    ref: dict[UOp, Ref],
    may: Callable[[UOp, UOp], bool] | None = None,
) -> list[list[tuple[UOp, UOp]]]:
    """The runs of consecutive points (in schedule order) that one kernel computes, two or more each: (point, its
    value with the earlier members' values taken in) per member. `bodies`: each point's value over placeholders
    (`place`: point -> its placeholder view); `ref`: where each point is stored. `may(first, body)`: the optimizer's
    last word on the first member's value and a candidate's own body, before earlier members' values are taken in
    (HandOpt.group: values whose reads walk their elements alike; taken in, a value would read as its source does);
    None: no groups."""
    groups: list[list[tuple[UOp, UOp]]] = []
    run: list[tuple[UOp, UOp]] = []
    if may is None:
        return groups
    for u in points:
        body = bodies[u]
        if run and _member(u, body, ref) and (value := _joined(run, body, place)) is not None and may(run[0][1], body):
            run.append((u, value))
            continue
        if len(run) > 1:
            groups.append(run)
        run = [(u, body)] if _member(u, body, ref) else []
    if len(run) > 1:
        groups.append(run)
    return groups


def _member(u: UOp, body: UOp, ref: dict[UOp, Ref]) -> bool:
    """A root's elementwise value. (Roots only: the rest of the engine takes a kernel that writes a temp to write
    that one array, its last parameter, and uopc.engine.kept keeps such kernels from call to call. Temps grouped
    as well, under the same rule, saved 10 of the CNN step's 392 MB moved, in no time measurably less.)"""
    return ref[u].kind is RefKind.OUT and not any(x.op in _NOT_ELEMENTWISE for x in body.toposort())


def _joined(run: list[tuple[UOp, UOp]], body: UOp, place: dict[UOp, UOp]) -> UOp | None:
    """`body` with the values of the run's members it reads taken in, if it joins the run (None: it does not). It
    joins when it has the run's shape and dtype and reads a member's value or some buffer a member reads, and every
    read of a member's value is an ALU operand at its own index."""
    first = run[0][1]
    if body.shape != first.shape or body.dtype is not first.dtype:
        return None
    views = {place[m]: value for m, value in run}
    bases = {base_buffer(v): v for v in views}
    topo = body.toposort()
    taken = False
    for x in topo:
        for s in x.src:
            if s in views:
                if x.op not in ALU or x.shape != body.shape:
                    return None
                taken = True
            elif s in bases and x is not bases[s]:  # the placeholder under another view of a member's value
                return None
    if body in views:
        return None
    if not taken:
        reads = {b for b in topo if b.op is Ops.BUFFER}
        if not any(reads & {b for b in value.toposort() if b.op is Ops.BUFFER} for _, value in run):
            return None
    return body.substitute(views) if taken else body

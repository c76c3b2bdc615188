"""Ordering and scoping: a lowered SINK becomes a tree of loops holding statements, in a valid order.

Every node lives in the innermost loop among the RANGEs it depends on (an END removes the ranges it
closes), so a load that does not depend on an inner loop is placed outside it. A loop's parents are
the loops every node inside it also uses. An ALLOC is declared in the deepest scope common to its
users, which puts an accumulator inside an OpenMP parallel loop, and so makes it thread-private.

    SINK(STORE(out[r0], LOAD(acc after END(...r1...))))   ->   [Loop(r0, [alloc, init, Loop(r1, [...]), store])]
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from uopc.uop import Ops, UOp


@dataclass
class Loop:
    """One loop of the nest: its RANGE and its body, in execution order (UOps and nested Loops)."""

    rng: UOp | None
    body: list = field(default_factory=list)


@dataclass
class Linearized:
    """The linearized program: the loop tree, each node's scope, and each node's users."""

    root: Loop
    scope: dict[UOp, tuple[UOp, ...]]
    users: dict[UOp, list[UOp]]


def linearize(sink: UOp) -> Linearized:
    """Place every node of a lowered program in a loop scope and order each scope topologically."""
    topo = sink.toposort()
    pos = {u: i for i, u in enumerate(topo)}
    users: dict[UOp, list[UOp]] = {u: [] for u in topo}
    for u in topo:
        for s in dict.fromkeys(u.src):
            users[s].append(u)

    # live ranges of each node: the loops that must be open where it is computed
    live: dict[UOp, frozenset[UOp]] = {}
    none: frozenset[UOp] = frozenset()
    for u in topo:
        if u.op is Ops.RANGE:
            live[u] = frozenset((u,))
        elif u.op is Ops.END:
            live[u] = frozenset().union(*(live[s] for s in u.src)) - frozenset(u.src[1:])
        elif not u.src:
            live[u] = none
        else:  # (most nodes live where their sources all do: that set itself, not a union of copies)
            first = live[u.src[0]]
            live[u] = first if all(live[s] is first for s in u.src[1:]) else first.union(*(live[s] for s in u.src))

    # each loop's ancestors: the lower-numbered loops that are live wherever it is
    around: dict[UOp, set[UOp]] = {}
    for ls in {id(ls): ls for ls in live.values()}.values():  # (each distinct live set once)
        for r in ls:
            around.setdefault(r, set()).update(ls)
    path: dict[UOp, tuple[UOp, ...]] = {}
    for r in sorted(around, key=lambda r: r.arg.idx):
        anc = [a for a in around[r] if a.arg.idx < r.arg.idx]
        # r nests inside the deepest of them (whose own ancestors it inherits, mentioned or not)
        parent = max((path[a] for a in anc), key=len, default=())
        path[r] = parent + (r,)
        if not set(anc) <= set(parent):
            raise RuntimeError(f"linearize: loop ridx{r.arg.idx} is not properly nested in {[a.arg.idx for a in anc]}")

    scope: dict[UOp, tuple[UOp, ...]] = {}
    deepest: dict[int, tuple[UOp, ...]] = {}  # per live set (by identity: most nodes share their sources' set)
    for u in topo:
        if u.op is Ops.RANGE:
            scope[u] = path[u][:-1]
        elif (sc := deepest.get(id(live[u]))) is not None:
            scope[u] = sc
        else:
            scope[u] = deepest[id(live[u])] = max((path[r] for r in live[u]), key=len, default=())
    # an ALLOC is declared in the deepest scope common to its users
    for u in topo:
        if u.op is Ops.ALLOC:
            scopes = [scope[x] for x in users[u]]
            common = scopes[0] if scopes else ()
            for s in scopes[1:]:
                n = 0
                while n < min(len(common), len(s)) and common[n] is s[n]:
                    n += 1
                common = common[:n]
            scope[u] = common

    # within each scope an item is a node, or a child loop standing for everything inside it
    def item(u: UOp, depth: int) -> UOp:
        sc = scope[u] if u.op is not Ops.RANGE else path[u]
        return u if len(sc) == depth and u.op is not Ops.RANGE else sc[depth]

    items: dict[tuple, dict[UOp, int]] = {}  # scope -> item -> first position
    edges: dict[UOp, set[UOp]] = {}
    # per scope: the item dicts of its prefixes, outermost first (each node registers in all of them)
    chains: dict[tuple, list[dict[UOp, int]]] = {}
    for u in topo:
        if u.op is Ops.RANGE:
            continue
        sc = scope[u]
        if (chain := chains.get(sc)) is None:
            chain = chains[sc] = [items.setdefault(sc[:d], {}) for d in range(len(sc) + 1)]
        p = pos[u]
        for d, members in enumerate(chain[:-1]):  # in each enclosing scope the node is the loop holding it
            it = sc[d]
            if members.get(it, p) >= p:
                members[it] = p
        chain[-1].setdefault(u, p)
        for s in u.src:
            if s.op is Ops.RANGE:
                continue
            ss = scope[s]
            if ss is sc:  # (the same scope: both are items of it)
                edges.setdefault(s, set()).add(u)
                continue
            n, top = 0, min(len(sc), len(ss))
            while n < top and sc[n] is ss[n]:
                n += 1
            a, b = item(u, n), item(s, n)
            if a is not b:
                edges.setdefault(b, set()).add(a)

    def build(sc: tuple[UOp, ...], loop: Loop) -> Loop:
        members = items.get(sc, {})
        indeg = {m: 0 for m in members}
        for m in members:
            for t in edges.get(m, ()):
                if t in indeg:
                    indeg[t] += 1
        ready = [(p, m.arg.idx if m.op is Ops.RANGE else -1, id(m), m) for m, p in members.items() if indeg[m] == 0]
        heapq.heapify(ready)
        while ready:
            _, _, _, m = heapq.heappop(ready)
            if m.op is Ops.RANGE:
                loop.body.append(build(sc + (m,), Loop(m)))
            else:
                loop.body.append(m)
            for t in edges.get(m, ()):
                if t in indeg:
                    indeg[t] -= 1
                    if indeg[t] == 0:
                        heapq.heappush(ready, (members[t], t.arg.idx if t.op is Ops.RANGE else -1, id(t), t))
        if len(loop.body) != len(members):
            raise RuntimeError("linearize: dependency cycle between statements of one scope")
        return loop

    return Linearized(build((), Loop(None)), scope, users)

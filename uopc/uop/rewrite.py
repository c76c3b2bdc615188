"""Pattern rewriting: rules are data.

    pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("c", 1))), lambda x, c: x)])   # x*1 -> x
    graph_rewrite(root, pm)   # bottom-up, each node rewritten until no rule applies

A rule's function receives the named sub-matches as keyword arguments (plus `ctx` if it asks for it)
and returns a replacement UOp, or None to decline. A matcher of pure rules may keep each node's result on the node
(`memo`), so that a later rewrite with it does not walk that node's graph again.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable
from typing import Any

from uopc.uop import Ops, UOp
from uopc.uop.dtype import DType

_ANY = object()


def _same_arg(want: Any, arg: Any) -> bool:
    """A pattern's arg matches by value: a number matches an int or a float of that value (one rule for `x+0`,
    not one for 0 and one for 0.0), but a bool matches only a bool (True == 1 in Python; a bool CONST is a bool)."""
    if isinstance(want, bool) or isinstance(arg, bool):
        return type(want) is type(arg) and want == arg
    if isinstance(want, numbers.Real) and isinstance(arg, numbers.Real):
        return want == arg
    return type(want) is type(arg) and want == arg


class UPat:
    """A pattern over UOps: op (one or a set), dtype, arg, sources, and a name to bind the match to."""

    def __init__(
        self,
        op: Ops | tuple[Ops, ...] | frozenset[Ops] | None = None,
        dtype: DType | tuple[DType, ...] | None = None,
        src: tuple[UPat, ...] | None = None,
        arg: Any = _ANY,
        name: str | None = None,
        allow_any_len: bool = False,
    ):
        self.ops = None if op is None else frozenset((op,) if isinstance(op, Ops) else op)
        self.dtypes = None if dtype is None else ((dtype,) if isinstance(dtype, DType) else tuple(dtype))
        self.src, self.arg, self.name, self.allow_any_len = src, arg, name, allow_any_len

    @staticmethod
    def var(name: str | None = None, dtype: DType | tuple[DType, ...] | None = None) -> UPat:
        """Matches any node."""
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, value: Any = _ANY, dtype: DType | tuple[DType, ...] | None = None) -> UPat:
        """Matches a CONST (with the given value, if any: `value=0` matches 0 and 0.0, never False)."""
        return UPat(Ops.CONST, dtype, arg=value, name=name)

    def match(self, u: UOp, store: dict[str, UOp]) -> bool:
        if self.ops is not None and u.op not in self.ops:
            return False
        if self.dtypes is not None and u.dtype not in self.dtypes:
            return False
        if self.arg is not _ANY and not _same_arg(self.arg, u.arg):
            return False
        if self.name is not None:
            if self.name in store and store[self.name] is not u:
                return False
            store[self.name] = u
        if self.src is None:
            return True
        if len(u.src) != len(self.src) and not (self.allow_any_len and len(u.src) >= len(self.src)):
            return False
        return all(p.match(s, store) for p, s in zip(self.src, u.src))

    def __repr__(self) -> str:
        ops = "*" if self.ops is None else "|".join(sorted(o.name for o in self.ops))
        return f"UPat({ops}, name={self.name!r})"


class PatternMatcher:
    """An ordered list of (pattern, function) rules, indexed by op for speed.

    `memo`: the rules are a pure function of the graph (no ctx, no settings), so what a rewrite gives for a node
    holds for every later rewrite with them: it is kept on the node under this name (as toposort keeps its order)
    and a later graph_rewrite that reaches the node takes it without walking what lies below. Lowering simplifies
    the same index arithmetic again and again (a third of the nodes the CNN step's first call simplified had been
    simplified before); `symbolic` keeps one."""

    def __init__(self, rules: list[tuple[UPat, Callable[..., UOp | None]]], memo: str | None = None):
        self.rules, self.memo = rules, memo
        self.by_op: dict[Ops, list[tuple[UPat, Callable, bool]]] = {o: [] for o in Ops}
        for pat, fn in rules:
            wants_ctx = "ctx" in inspect.signature(fn).parameters
            for o in pat.ops if pat.ops is not None else Ops:
                self.by_op[o].append((pat, fn, wants_ctx))

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        """The first rule's replacement for `u`, or None if no rule applies."""
        for pat, fn, wants_ctx in self.by_op[u.op]:
            store: dict[str, UOp] = {}
            if pat.match(u, store):
                ret = fn(**store, ctx=ctx) if wants_ctx else fn(**store)
                if ret is not None and ret is not u:
                    return ret
        return None


def graph_rewrite(root: UOp, pm: PatternMatcher, ctx: Any = None) -> UOp:
    """Rewrite bottom-up to a fixed point: sources first, then the node, then whatever a rule returned.

    Iterative (no recursion limit on deep graphs); memoized, so shared nodes are rewritten once.
    """
    return graph_rewrite_all([root], pm, ctx)[0]


def graph_rewrite_all(roots: list[UOp], pm: PatternMatcher, ctx: Any = None) -> list[UOp]:
    """graph_rewrite of each root, with one memo for all: the subgraph roots share (a training step's 128 updates
    share its whole forward and backward graph) is rewritten once, not once per root (the char-GPT step's first
    call spent 3.7 s walking it again, 128 times over, in the layout pass and the scheduler)."""
    done: dict[UOp, UOp] = {}
    waiting: dict[UOp, UOp] = {}  # node -> the replacement whose own rewrite it waits for
    memo = pm.memo if ctx is None else None
    for root in roots:
        _rewrite_into(root, pm, ctx, done, waiting, memo)
    return [done[r] for r in roots]


_FIXED = object()  # a memo entry: the node is its own rewrite (not the node itself: it would hold itself)


def _remember(u: UOp, r: UOp, memo: str) -> None:
    u.__dict__[memo] = _FIXED if r is u else r


def _rewrite_into(
    root: UOp, pm: PatternMatcher, ctx: Any, done: dict[UOp, UOp], waiting: dict[UOp, UOp], memo: str | None = None
) -> None:
    stack = [root]
    while stack:
        u = stack[-1]
        if u in done:
            stack.pop()
            continue
        if memo is not None and (m := u.__dict__.get(memo)) is not None:
            done[u] = u if m is _FIXED else m
            stack.pop()
            continue
        if u in waiting:
            r = waiting[u]
            if r in done:
                done[u] = done[r]
                if memo is not None:
                    _remember(u, done[r], memo)
                stack.pop()
            else:
                stack.append(r)
            continue
        pending = [s for s in u.src if s not in done]
        if pending:
            stack.extend(reversed(pending))
            continue
        new_src = tuple(done[s] for s in u.src)
        n = u if new_src == u.src else u.replace(src=new_src)
        r = pm.rewrite(n, ctx)
        if r is None:
            done[u] = n
            if n is not u:
                done.setdefault(n, n)
            if memo is not None:
                _remember(u, n, memo)
                if n is not u:
                    _remember(n, n, memo)
            stack.pop()
        else:
            waiting[u] = r

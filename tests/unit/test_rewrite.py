"""Tests for uopc.uop.rewrite: UPat matching (ops, dtypes, args, named bindings), PatternMatcher rules and `ctx`, and
graph_rewrite (bottom-up, to a fixed point, shared nodes once, no recursion limit on deep graphs)."""

from __future__ import annotations

import sys

from tests.helpers import buf
from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes
from uopc.uop.rewrite import PatternMatcher, UPat, graph_rewrite
from uopc.uop.symbolic import simplify

MUL_ONE = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("c", 1))), lambda x, c: x)])  # x*1 -> x


def test_x_times_one_rule():
    x = buf(0, 4, dtypes.i32)
    assert MUL_ONE.rewrite(x * 1) is x
    assert MUL_ONE.rewrite(x * 2) is None
    assert MUL_ONE.rewrite(x + 1) is None
    assert graph_rewrite((x * 1) + (x * 1), MUL_ONE) is x + x
    # a constant matches by value whatever its Python type: the int 1 matches the float 1.0, never True
    xf = buf(1, 4)
    assert MUL_ONE.rewrite(xf * 1.0) is xf
    assert MUL_ONE.rewrite(buf(2, 4, dtypes.bool) * True) is None


def test_constant_pattern_matches_int_and_float_never_bool():
    zero, false = UPat.cvar(value=0), UPat.cvar(value=False)
    for dt in (dtypes.i32, dtypes.u8, dtypes.i64, dtypes.f32, dtypes.f64, dtypes.f16):
        assert zero.match(UOp.const(0, dt), {}), dt
        assert not zero.match(UOp.const(1, dt), {}), dt
        assert not false.match(UOp.const(0, dt), {}), dt
    assert zero.match(UOp.const(-0.0, dtypes.f32), {})  # -0.0 == 0: a rule that must tell them apart checks the sign
    assert not zero.match(UOp.const(False, dtypes.bool), {})
    assert false.match(UOp.const(False, dtypes.bool), {})
    assert UPat.cvar(value=0.5).match(UOp.const(0.5, dtypes.f32), {})
    assert not UPat.cvar(value=True).match(UOp.const(1, dtypes.i32), {})
    # a dtype on the pattern still restricts it
    assert not UPat.cvar(value=0, dtype=dtypes.i32).match(UOp.const(0.0, dtypes.f32), {})
    # args that are not numbers compare as before: by type and value
    assert UPat(Ops.STAGE, arg="detach").match(UOp(Ops.STAGE, (buf(0, 4),), "detach"), {})
    assert not UPat(arg=(1,)).match(UOp(Ops.RESHAPE, (buf(0, 4),), [1]), {})


def test_named_var_bound_twice_matches_only_identical_nodes():
    pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x"))), lambda x: x * 2)])
    a, b = buf(0, 4, dtypes.i32), buf(1, 4, dtypes.i32)
    assert pm.rewrite(a + a) is a * 2
    assert pm.rewrite(a + b) is None
    # structurally equal subgraphs are one object (hash-consing), so they match
    assert pm.rewrite((a * 3) + (a * 3)) is (a * 3) * 2
    assert pm.rewrite((a * 3) + (b * 3)) is None


def test_upat_filters_by_op_set_dtype_and_src_length():
    hit = []
    pm = PatternMatcher([(UPat((Ops.ADD, Ops.MUL), dtype=dtypes.f32, name="u"), lambda u: hit.append(u))])
    xf, xi = buf(0, 4), buf(1, 4, dtypes.i32)
    for u in (xf + 1.0, xf * 2.0, xi + 1, xf.maximum(1.0)):
        pm.rewrite(u)
    assert hit == [xf + 1.0, xf * 2.0]
    short = UPat(Ops.WHERE, src=(UPat.var("c"),))
    anylen = UPat(Ops.WHERE, src=(UPat.var("c"),), allow_any_len=True)
    w = (xf < 0.0).where(xf, 0.0)
    assert not short.match(w, {}) and anylen.match(w, {})


def test_rules_apply_in_order_and_none_declines():
    x = buf(0, 4, dtypes.i32)
    pm = PatternMatcher(
        [
            (UPat(Ops.ADD, name="u"), lambda u: None),  # declines
            (UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("c"))), lambda a, c: a * c),
            (UPat(Ops.ADD, name="u"), lambda u: u.src[0]),
        ]
    )
    assert pm.rewrite(x + 3) is x * 3
    assert pm.rewrite(x + x) is x


def test_ctx_is_passed_to_rules_that_ask_for_it():
    seen = []

    def with_ctx(x, ctx):
        ctx.append(x)
        return None

    pm = PatternMatcher([(UPat(Ops.NEG, src=(UPat.var("x"),)), with_ctx)]) + MUL_ONE
    x = buf(0, 4, dtypes.i32)
    assert graph_rewrite(-(x * 1), pm, ctx=seen) is -x
    assert seen == [x]
    assert len(pm.rules) == 2


def test_graph_rewrite_is_bottom_up():
    order = []

    def log(u, ctx):
        ctx.append(u)
        return None

    pm = PatternMatcher([(UPat(name="u"), log)])
    x = buf(0, 4)
    a = x * 2.0
    root = a.alu(Ops.EXP2) + a
    graph_rewrite(root, pm, ctx=order)
    pos = {id(u): i for i, u in enumerate(order)}
    assert order[-1] is root
    for u in order:
        for s in u.src:
            assert pos[id(s)] < pos[id(u)], "a node was visited before its sources"


def test_graph_rewrite_reaches_a_fixed_point():
    # CONST n -> CONST n-1 until 0: one node needs many rewrites; the parent sees only the final result
    dec = PatternMatcher(
        [
            (UPat.cvar("c", dtype=dtypes.i32), lambda c: UOp.const(c.arg - 1, dtypes.i32) if c.arg > 0 else None),
        ]
    )
    x = buf(0, 4, dtypes.i32)
    assert graph_rewrite(x + UOp.const(5, dtypes.i32), dec) is x + UOp.const(0, dtypes.i32)
    # a rewrite that enables a rule on its parent, and a replacement whose new sources need rewriting
    pm = PatternMatcher(
        [
            (UPat(Ops.NEG, src=(UPat.var("x"),)), lambda x: x * -1),  # -x -> x*-1 (new node, rewritten again)
            (
                UPat(Ops.MUL, src=(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("a"))), UPat.cvar("b"))),
                lambda x, a, b: x * (a.arg * b.arg),
            ),  # (x*a)*b -> x*(a*b)
            (UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar(value=1))), lambda x: x),  # x*1 -> x
        ]
    )
    neg = -x
    assert graph_rewrite(-neg, pm) is x  # -(-x): two rewrites below, one fold above
    neg2 = -neg
    neg3 = -neg2
    assert graph_rewrite(neg3 + neg, pm) is (x * -1) + (x * -1)


def test_shared_nodes_are_rewritten_once():
    calls = []

    def count(u, ctx):
        ctx.append(u)
        return None

    x = buf(0, 4)
    shared = x.alu(Ops.EXP2)
    pm = PatternMatcher([(UPat(Ops.EXP2, name="u"), count)])
    root = (shared + shared) * shared.maximum(shared + 1.0)
    graph_rewrite(root, pm, ctx=calls)
    assert calls == [shared]

    # a shared node that IS rewritten is replaced everywhere by the same new node
    calls.clear()

    def to_sqrt(u, ctx):
        ctx.append(u)
        return UOp(Ops.SQRT, u.src)

    out = graph_rewrite(root, PatternMatcher([(UPat(Ops.EXP2, name="u"), to_sqrt)]), ctx=calls)
    s = x.alu(Ops.SQRT)
    assert calls == [shared]
    assert out is (s + s) * s.maximum(s + 1.0)


def test_deep_chain_does_not_hit_the_recursion_limit():
    assert sys.getrecursionlimit() < 5000
    x = buf(0, 4, dtypes.i32)
    y = x
    for _ in range(5000):
        y = y * 1 + x  # 10000 nodes deep
    out = graph_rewrite(y, MUL_ONE)
    n, u = 0, out
    while u is not x:
        assert u.op is Ops.ADD and u.src[1] is x
        u, n = u.src[0], n + 1
    assert n == 5000


def test_deep_chain_simplify():
    # symbolic rules (canonical order, folding) on a 5000-deep ADD chain, for floats and ints
    for dt in (dtypes.f32, dtypes.i32):
        x = buf(0, 4, dt)
        y = x
        for _ in range(5000):
            y = y + x
        assert simplify(y).op is Ops.ADD
        z = x
        for _ in range(5000):
            z = z + UOp.const(1, dt)
        s = simplify(z)
        if dt is dtypes.i32:  # integer reassociation folds the constants: x + 5000
            assert s is x + UOp.const(5000, dtypes.i32)
        else:  # float additions are not reassociated
            assert s.op is Ops.ADD and s.src[1] is UOp.const(1.0, dt)


def test_a_memo_keeps_each_nodes_rewrite_across_calls():
    # a matcher with `memo` (pure rules: symbolic's) keeps each node's result on the node: a later rewrite that
    # reaches the node, under a new root, neither walks below it nor asks the rules again
    calls = []

    def fold(x, c):
        calls.append(x)
        return x

    pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("c", 1))), fold)], memo="_test_memo")
    x, y = buf(0, 4, dtypes.i32), buf(1, 4, dtypes.i32)
    inner = (x * 1 + y * 1) * 1
    assert graph_rewrite(inner, pm) is x + y and len(calls) == 3
    calls.clear()
    assert graph_rewrite(inner * 1 + 2, pm) is x + y + 2 and calls == [x + y]  # only the new MUL asked
    # a node that is its own rewrite is remembered too, without holding itself
    assert graph_rewrite(x + y, pm) is x + y and (x + y).__dict__["_test_memo"] is not x + y
    # with a ctx the rules may read it, so nothing is taken from the memo or kept
    calls.clear()
    assert graph_rewrite(inner, pm, ctx=object()) is x + y and len(calls) == 3
    # the same memo on symbolic: a result read back equals one computed fresh
    e = (x * 4 + 8) // 4 + (y % 4) * 0
    assert simplify(e) is simplify(e) is x + 2

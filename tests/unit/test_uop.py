"""Tests for uopc.uop: hash-consing, freeing, immutability, graph utilities (toposort, substitute, replace, wrap),
and the shape rules and error messages of the movement, reduce and ALU builders."""

from __future__ import annotations

import gc
import math
import pickle
import weakref

import numpy as np
import pytest

from tests.helpers import buf
from uopc.uop import ALU, MOVEMENT, Ops, ParamArg, Span, UOp, identity_element, sink
from uopc.uop.dtype import dtypes

# ------------------------------------------------------------------ hash-consing


def test_same_construction_is_same_object():
    a = buf(0, 16)
    assert buf(0, 16) is a
    assert (a.reshape((4, 4)) * 2.0) is (a.reshape((4, 4)) * 2.0)
    assert UOp(Ops.BUFFER, (), ParamArg(0, dtypes.f32, (16,))) is a
    assert buf(1, 16) is not a and buf(0, 16, dtypes.f64) is not a and buf(0, 8) is not a


def test_hash_consing_through_shared_subgraphs():
    def build():
        x = buf(0, 12).reshape((3, 4))
        shared = (x * 2.0).alu(Ops.EXP2)
        return (shared + shared.maximum(x)).reduce(Ops.ADD, 1), shared

    (g1, s1), (g2, s2) = build(), build()
    assert g1 is g2 and s1 is s2
    # the shared node appears once in the graph, reached through both users
    assert sum(u is s1 for u in g1.toposort()) == 1
    add = g1.src[0]
    assert add.src[0] is s1 and add.src[1].src[0] is s1


def test_constants_are_distinguished_by_value_type_and_sign():
    pz, nz, iz, bz = UOp.const(0.0), UOp.const(-0.0), UOp.const(0), UOp.const(False)
    assert len({id(pz), id(nz), id(iz), id(bz)}) == 4
    assert math.copysign(1.0, nz.arg) == -1.0 and math.copysign(1.0, pz.arg) == 1.0
    assert (pz.dtype, iz.dtype, bz.dtype) == (dtypes.f32, dtypes.i32, dtypes.bool)
    assert UOp.const(0.0) is pz and UOp.const(-0.0) is nz
    # same value, different dtype
    assert UOp.const(1.0, dtypes.f64) is not UOp.const(1.0, dtypes.f32)
    # the stored Python type follows the dtype
    assert type(UOp.const(3, dtypes.f32).arg) is float and type(UOp.const(2.7, dtypes.i32).arg) is int
    assert UOp.const(3, dtypes.f32) is UOp.const(3.0, dtypes.f32)
    # NaN is one constant (its key is its bit pattern, not `==`)
    assert UOp.const(math.nan) is UOp.const(float("nan"))


def test_unreferenced_uop_is_freed():
    u = UOp.const(123456.5, dtypes.f64) * UOp.const(7.25, dtypes.f64)
    ref = weakref.ref(u)
    del u
    gc.collect()
    assert ref() is None
    # and a new construction builds a fresh node, not a stale cache entry
    v = UOp.const(123456.5, dtypes.f64) * UOp.const(7.25, dtypes.f64)
    assert v.op is Ops.MUL and v.src[0].arg == 123456.5


def test_buffer_array_is_freed_with_its_uop():
    from uopc.runtime.buffer import buffer_data, new_buffer

    b = new_buffer(dtypes.f32, 1024, np.ones(1024, np.float32))
    arr = buffer_data(b)  # storage sits in buffer.py's weak side table, not in the UOp
    aref, bref = weakref.ref(arr), weakref.ref(b)
    graph = (b.reshape((32, 32)) + 1.0).reduce(Ops.ADD, 1)
    del arr, b
    gc.collect()
    assert aref() is not None, "the graph still refers to the buffer: its array must stay alive"
    del graph
    gc.collect()
    assert bref() is None and aref() is None


def test_pickle_round_trip_gives_the_same_object():
    g = (buf(0, 8).reshape((2, 4)) * 3.0).reduce(Ops.MAX, 1)
    assert pickle.loads(pickle.dumps(g)) is g


# ------------------------------------------------------------------ immutability


@pytest.mark.parametrize("name", ["op", "src", "arg", "dtype", "shape", "anything"])
def test_setting_an_attribute_raises(name: str):
    u = buf(0, 4) + 1.0
    with pytest.raises(AttributeError, match="immutable"):
        setattr(u, name, None)
    assert u.op is Ops.ADD and u.shape == (4,)


def test_rebinding_a_field_keeps_the_node_unchanged():
    u = buf(0, 4)
    with pytest.raises(AttributeError):
        u.arg = ParamArg(1, dtypes.f32, (4,))
    assert u.arg.slot == 0 and buf(0, 4) is u


def test_deleting_an_attribute_raises():
    # regression: UOp had __setattr__ but no __delattr__, so `del u.op` mutated a hash-consed (shared) node
    u = UOp.const(424242, dtypes.i64)
    with pytest.raises(AttributeError, match="immutable"):
        del u.op
    assert u.op is Ops.CONST


# ------------------------------------------------------------------ graph utilities


def _diamond():
    x = buf(0, 8)
    a = x * 2.0
    b = a.alu(Ops.EXP2)
    c = a + x
    return x, a, b, c, b.maximum(c)


def test_toposort_sources_first_each_node_once():
    x, a, b, c, root = _diamond()
    order = root.toposort()
    assert order[-1] is root
    assert len(order) == len({id(u) for u in order})
    pos = {id(u): i for i, u in enumerate(order)}
    for u in order:
        for s in u.src:
            assert pos[id(s)] < pos[id(u)]
    expected = {id(u) for u in (x, a, b, c, root, UOp.const(2.0))}
    assert set(pos) == expected


def test_toposort_deep_chain_is_iterative():
    x = buf(0, 4)
    y = x
    for _ in range(5000):
        y = y + x
    order = y.toposort()
    assert len(order) == 5001 and order[0] is x and order[-1] is y


def test_replace():
    x = buf(0, 8)
    u = x + 1.0
    assert u.replace() is u
    assert u.replace(op=Ops.MUL) is x * 1.0
    assert u.replace(src=(x, UOp.const(2.0))) is x + 2.0
    c = UOp.const(5, dtypes.i32)
    assert c.replace(arg=6) is UOp.const(6, dtypes.i32)
    assert c.replace(dtype=dtypes.i64, arg=5) is UOp.const(5, dtypes.i64)


def test_substitute():
    x, a, b, c, root = _diamond()
    y = buf(1, 8)
    new = root.substitute({x: y})
    assert new is (((y * 2.0).alu(Ops.EXP2)).maximum((y * 2.0) + y))
    assert root.substitute({}) is root
    assert root.substitute({buf(5, 8): y}) is root  # nothing to replace: the very same graph
    # replacements are not recursed into: mapping a -> a*a keeps the inner a
    aa = a * a
    assert root.substitute({a: aa}).src[0].src[0] is aa


def _count(roots, op):
    return sum(u.op is op for u in sink(*roots).toposort())


def test_wrap_composes_nested_targets():
    # substitute() loses the inner STAGE of nested targets, wrap() keeps both
    x = buf(0, 16).reshape((4, 4))
    inner = x * 2.0 + 1.0
    outer = UOp(Ops.EXP2, (inner,)) * inner
    root = outer.reduce(Ops.ADD, 1)
    sub = root.substitute({inner: UOp(Ops.STAGE, (inner,)), outer: UOp(Ops.STAGE, (outer,))})
    assert _count([sub], Ops.STAGE) == 1
    (wrapped,) = UOp.wrap([root], {inner, outer}, lambda n: UOp(Ops.STAGE, (n,)))
    assert _count([wrapped], Ops.STAGE) == 2
    staged_inner = UOp(Ops.STAGE, (inner,))
    assert wrapped is UOp(Ops.STAGE, (UOp(Ops.EXP2, (staged_inner,)) * staged_inner,)).reduce(Ops.ADD, 1)
    assert wrapped.shape == root.shape


def test_wrap_multiple_roots_and_no_targets():
    x = buf(0, 4)
    r1, r2 = x + 1.0, x * 3.0
    assert UOp.wrap([r1, r2], set(), lambda n: n) == [r1, r2]
    w1, w2 = UOp.wrap([r1, r2], {x}, lambda n: UOp(Ops.STAGE, (n,)))
    sx = UOp(Ops.STAGE, (x,))
    assert w1 is sx + 1.0 and w2 is sx * 3.0


# ------------------------------------------------------------------ shapes


def test_movement_op_shapes():
    x = buf(0, 24).reshape((2, 3, 4))
    assert x.shape == (2, 3, 4) and x.ndim == 3 and x.size == 24
    assert x.reshape((6, 4)).shape == (6, 4)
    assert x.reshape((1, 24, 1)).shape == (1, 24, 1)
    assert x.permute((2, 0, 1)).shape == (4, 2, 3)
    assert x.pad(((1, 0), (0, 2), (3, 3))).shape == (3, 5, 10)
    assert x.shrink(((0, 1), (1, 3), (0, 4))).shape == (1, 2, 4)
    assert x.shrink(((1, 1), (0, 3), (0, 4))).shape == (0, 3, 4)
    assert x.flip((0, 2)).shape == (2, 3, 4)
    y = x.reshape((2, 1, 3, 4))
    assert y.expand((2, 5, 3, 4)).shape == (2, 5, 3, 4)
    assert x.reduce(Ops.ADD, 1).shape == (2, 3)
    assert x.reduce(Ops.MAX, 3).shape == ()
    assert UOp(Ops.STAGE, (x,)).shape == (2, 3, 4)
    assert UOp.const(1.0).shape == () and buf(0, 1).reshape(()).shape == ()


def test_movement_ops_build_the_right_nodes():
    x = buf(0, 6).reshape((2, 3))
    assert x.op is Ops.RESHAPE and x.arg == (2, 3)
    assert x.permute((1, 0)).arg == (1, 0)
    assert x.pad(((1, 0), (0, 0))).arg == ((1, 0), (0, 0))
    assert x.shrink(((0, 1), (0, 3))).arg == ((0, 1), (0, 3))
    assert x.flip((1,)).arg == (False, True)  # the node's arg is one bool per dim
    assert {x.op, x.permute((1, 0)).op, x.flip((0,)).op} <= MOVEMENT


def test_identity_movement_ops_return_self():
    x = buf(0, 6).reshape((2, 3))
    assert x.reshape((2, 3)) is x
    assert x.permute((0, 1)) is x
    assert x.pad(((0, 0), (0, 0))) is x
    assert x.shrink(((0, 2), (0, 3))) is x
    assert x.expand((2, 3)) is x
    assert x.flip(()) is x
    assert x.reshape((1, 3, 2)).flip((0,)).op is Ops.RESHAPE  # flipping a size-1 dim is a no-op
    assert x.reduce(Ops.ADD, 0) is x
    assert x.cast(dtypes.f32) is x


def test_alu_shapes_and_dtypes():
    x = buf(0, 6).reshape((2, 3))
    assert (x + 1.0).shape == (2, 3) and (1.0 + x).shape == (2, 3)
    assert (x < 1.0).dtype is dtypes.bool and x.ne(x).dtype is dtypes.bool
    assert x.cast(dtypes.i32).dtype is dtypes.i32
    cond = x < 0.0
    w = cond.where(x, 0.0)
    assert w.shape == (2, 3) and w.dtype is dtypes.f32 and w.op is Ops.WHERE
    assert (x * x).alu(Ops.SQRT).op in ALU
    assert x.reduce(Ops.ADD, 1).dtype is dtypes.f32


def test_identity_elements():
    assert identity_element(Ops.ADD, dtypes.f32) == 0
    assert identity_element(Ops.MAX, dtypes.f32) == -math.inf
    assert identity_element(Ops.MAX, dtypes.i32) == -(2**31)
    assert identity_element(Ops.MAX, dtypes.u8) == 0
    assert identity_element(Ops.MAX, dtypes.bool) is False


# ------------------------------------------------------------------ errors name both shapes

X = buf(0, 6).reshape((2, 3))


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda: X.reshape((4,)), ["(2, 3)", "(4,)"]),
        (lambda: X.reshape((-1, 6)), ["(2, 3)", "(-1, 6)"]),
        (lambda: X.expand((4, 3)), ["(2, 3)", "(4, 3)"]),
        (lambda: X.expand((2, 3, 1)), ["(2, 3)", "(2, 3, 1)"]),
        (lambda: X.permute((0, 0)), ["(0, 0)", "(2, 3)"]),
        (lambda: X.permute((1, 0, 2)), ["(1, 0, 2)", "(2, 3)"]),
        (lambda: X.pad(((1, 1),)), ["((1, 1),)", "(2, 3)"]),
        (lambda: X.pad(((0, 0), (-1, 0))), ["((0, 0), (-1, 0))", "(2, 3)"]),
        (lambda: X.shrink(((0, 2),)), ["((0, 2),)", "(2, 3)"]),
        (lambda: X.shrink(((0, 2), (0, 4))), ["((0, 2), (0, 4))", "(2, 3)"]),
        (lambda: X.shrink(((0, 2), (2, 1))), ["((0, 2), (2, 1))", "(2, 3)"]),
        (lambda: X.shrink(((-1, 2), (0, 3))), ["((-1, 2), (0, 3))", "(2, 3)"]),
        (lambda: X.flip((2,)), ["2", "(2, 3)"]),
        (lambda: X.flip((-1,)), ["-1", "(2, 3)"]),
        (lambda: X.reduce(Ops.ADD, 3), ["3", "(2, 3)"]),
        (lambda: X + buf(1, 6).reshape((3, 2)), ["(2, 3)", "(3, 2)"]),
        (lambda: X.where(X, buf(1, 3)), ["(2, 3)", "(3,)"]),
    ],
    ids=[
        "reshape_size",
        "reshape_negative",
        "expand_non1_dim",
        "expand_ndim",
        "permute_repeat",
        "permute_length",
        "pad_length",
        "pad_negative",
        "shrink_length",
        "shrink_past_end",
        "shrink_reversed",
        "shrink_negative",
        "flip_axis",
        "flip_negative_axis",
        "reduce_too_many",
        "alu_shapes",
        "where_shapes",
    ],
)
def test_bad_arguments_raise_value_error_naming_both_shapes(build, words):
    with pytest.raises(ValueError) as e:
        build()
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_reduce_rejects_non_reduce_ops():
    with pytest.raises(ValueError, match="MUL"):
        X.reduce(Ops.MUL, 1)


def test_setitem_builds_one_node_per_region_and_checks_it():
    x = buf(0, 12).reshape((3, 4))
    v = buf(1, 2).reshape((1, 2))
    w = x.setitem(v, ((1, 1, 1), (3, -2, 2)))  # x[1, 3::-2] = v
    assert w.op is Ops.SETITEM and w.shape == (3, 4) and w.src == (x, v)
    assert w.arg == (Span(1, 1, 1), Span(3, -2, 2))
    assert x.setitem(v, ((1, 7, 1), (3, -2, 2))) is w  # a single element's step does not matter
    assert x.setitem(buf(1, 0).reshape((0, 2)), ((0, 1, 0), (0, 1, 2))) is x  # an empty region writes nothing
    whole = x.setitem(x.flip((1,)), ((0, 1, 3), (3, -1, 4)))  # every element: the value itself, flipped back
    assert whole.op is Ops.FLIP and whole.src[0].src[0] is x
    for region, words in [
        (((1, 1, 1),), ["1 entries", "(3, 4)"]),
        (((1, 1, 1), (3, 2, 2)), ["dim 1 of size 4", "Span(start=3, step=2, count=2)"]),
        (((3, 1, 1), (0, 1, 2)), ["dim 0 of size 3"]),
        (((1, 1, 1), (0, 0, 2)), ["step=0"]),
        (((0, 1, 2), (0, 1, 1)), ["value shape (1, 2)", "counts (2, 1)"]),
    ]:
        with pytest.raises(ValueError) as e:
            x.setitem(v, region)
        assert all(wd in str(e.value) for wd in words), (region, str(e.value))
    with pytest.raises(TypeError, match="dtype"):
        x.setitem(buf(1, 2, dtypes.int32).reshape((1, 2)), ((1, 1, 1), (0, 1, 2)))


def test_hash_consing_is_thread_safe():
    # regression: UOp() checked its table and then inserted, so two threads could build twins of one node and
    # structural equality (`is`) silently failed. 4 threads build the same fresh chain; every node must be shared.
    import sys
    import threading

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, to make the race likely without the lock
    try:
        for trial in range(20):
            results: list[list[UOp]] = [[] for _ in range(4)]
            start = threading.Barrier(4)

            def build(out: list[UOp], trial: int = trial) -> None:
                start.wait()
                x = UOp.const(float(trial) + 0.5, dtypes.f32)
                for i in range(300):
                    x = x * UOp.const(float(i) + 0.25, dtypes.f32) + UOp.const(float(trial), dtypes.f32)
                    out.append(x)

            threads = [threading.Thread(target=build, args=(r,)) for r in results]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for r in results[1:]:
                assert all(a is b for a, b in zip(results[0], r, strict=True))
    finally:
        sys.setswitchinterval(old)

"""One test per bug found while building uopc (each names the bug it guards). Reference: NumPy, exact."""

from __future__ import annotations

import numpy as np

from uopc.engine.realize import realize
from uopc.opt import HandOpt
from uopc.runtime import compiler as runtime
from uopc.runtime.buffer import buffer_data
from uopc.tensor import Tensor
from uopc.uop import UOp


def test_narrow_ints_wrap_like_numpy():
    # bug: C computes int8/uint8 arithmetic in int, so 100 + 100 compared as 200 instead of wrapping to -56
    a8 = np.array([100, -100, 7], np.int8)
    np.testing.assert_array_equal((Tensor(a8) + 100 < 0).numpy(), (a8 + np.int8(100)) < 0)
    u8 = np.array([200, 3, 0], np.uint8)
    np.testing.assert_array_equal((Tensor(u8) * 2 > 200).numpy(), (u8 * np.uint8(2)) > 200)
    np.testing.assert_array_equal((Tensor(u8) - 5).numpy(), u8 - np.uint8(5))


def test_requires_grad_twice_does_not_compare_tensors():
    # bug: the registry was a WeakSet, whose membership test called Tensor.__eq__ (a graph) and then bool() on it
    t = Tensor(np.ones(3, np.float32), requires_grad=True)
    t.requires_grad_()
    t.requires_grad_()
    assert t.requires_grad


def test_view_of_constant_only_alu_keeps_its_shape():
    # bug: push_views dropped a reshape/expand over an ALU whose operands were all shape-() constants
    (b,) = realize([(UOp.const(2.0) * UOp.const(3.0)).reshape((1, 1)).expand((3, 4))], opt=HandOpt(runtime.machine()))
    np.testing.assert_array_equal(buffer_data(b), np.full(12, 6.0, np.float32))


def test_deep_graph_shapes_do_not_recurse():
    # bug: UOp.shape was a recursive cached property; a 5,000-op chain hit the recursion limit
    x = Tensor(np.zeros(4, np.float32))
    for _ in range(5000):
        x = x + 1.0
    assert x.shape == (4,)
    np.testing.assert_array_equal(x.numpy(), np.full(4, 5000.0, np.float32))


def test_two_roots_with_one_value():
    # bug: x.sum(1) and x.sum(1, keepdim=True) realized together became one REDUCE root after make_plan stripped
    # the reshape; the second output buffer was never written (np.empty garbage)
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    t = Tensor(x)
    a, b = t.sum(1), t.sum(1, keepdim=True)
    Tensor.realize_all(a, b)
    np.testing.assert_allclose(a.numpy(), x.sum(1), rtol=1e-5)
    np.testing.assert_allclose(b.numpy(), x.sum(1, keepdims=True), rtol=1e-5)


def test_uopc_owned_arrays_are_aligned_and_copied():
    # perf guard: NumPy's large arrays start 16 bytes into a page and every other 32-byte load split a cache line
    # (a 1024^3 GEMM: 175 vs 192 GFLOP/s); inputs are copied into 64-byte aligned storage that uopc owns
    from uopc.runtime.buffer import ALIGN
    from uopc.uop import base_buffer

    x = np.arange(300_000, dtype=np.float32)
    t = Tensor(x)
    y = (t * 2).realize()
    for u in (t.uop, y.uop):
        assert buffer_data(base_buffer(u)).ctypes.data % ALIGN == 0
    x[0] = 42.0  # the tensor holds a copy: changing the caller's array does not change it
    assert t.numpy()[0] == 0.0

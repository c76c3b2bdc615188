"""Slice assignment (`x[a:b] = v`, `x[a:b].assign(v)`) against NumPy and PyTorch: values, gradients, kernels, TinyJit.

A slice write is a SETITEM: a copy of the base into the result's storage, then a kernel over the region alone. Under
TinyJit the result is written into the base's own storage where nothing else reads it, and the copy is skipped.
Reference: NumPy's basic indexing (PyTorch has no negative steps); gradients: PyTorch, to 1e-6.
"""

from __future__ import annotations

import gc
import re

import numpy as np
import pytest
import torch

from uopc import Tensor, dtypes
from uopc.engine.jit import TinyJit
from uopc.engine.lower import make_plan
from uopc.engine.realize import compile_plan, realize
from uopc.opt import HandOpt
from uopc.runtime.buffer import buffer_data, buffer_ptr
from uopc.runtime.compiler import machine
from uopc.tensor.shape import basic_index
from uopc.uop import AxisType, Ops, UOp, base_buffer

rng = np.random.default_rng(0)

S = slice
INDICES = {
    (7,): [3, -1, S(1, 5), S(None, None, 2), S(None, None, -1), S(5, 1, -2), ..., (None, S(2, 4)), S(3, 3), S(None)],
    (4, 6): [
        (1, 2),
        (-1,),
        (S(1, 3), S(None, None, 2)),
        (Ellipsis, -1),
        (S(None, None, -2), 1),
        (None, 0, S(1, None, 3)),
        (S(None), S(4, 0, -3)),
    ],
    (3, 4, 5): [(1, S(None), S(0, 5, 2)), (Ellipsis, 2), (S(2, None, -1), None, 0, S(1, 3)), (-2, -1)],
    (2, 3, 4, 5): [(S(None), 1, Ellipsis, S(None, None, -1)), (1, 2, 3, 4), (Ellipsis, S(1, 4, 2), S(0, 5, 4)), (0,)],
}
CASES = [(shape, idx) for shape, idxs in INDICES.items() for idx in idxs]


def _data(shape: tuple[int, ...], np_dtype) -> np.ndarray:
    return (rng.integers(-50, 50, shape) if np_dtype == np.int32 else rng.normal(size=shape)).astype(np_dtype)


def _ptr(t: Tensor) -> int:
    return buffer_ptr(base_buffer(t.uop))


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32, dtypes.float16], ids=lambda d: d.name)
@pytest.mark.parametrize("shape,idx", CASES, ids=[f"{s}-{i}" for s, i in CASES])
def test_values_match_numpy(shape, idx, dtype):
    x = _data(shape, dtype.np)
    view = x[idx].shape
    values = {"scalar": 7, "full": _data(view, dtype.np), "broadcast": _data(view[-1:], dtype.np)}
    for k, (kind, val) in enumerate(values.items()):
        for lazy in (False, True) if dtype is dtypes.float32 else ((k % 2 == 1),):
            t = Tensor(x) + 0 if lazy else Tensor(x)  # a lazy base, or one read from its buffer
            t[idx] = val if kind == "scalar" else Tensor(val)
            ref = x.copy()
            ref[idx] = val
            np.testing.assert_array_equal(t.numpy(), ref, err_msg=f"{idx} {kind} lazy={lazy}")


def test_value_is_cast_and_numpy_rules_hold():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    t = Tensor(x)
    t[1] = 2.7  # a float into an int tensor truncates, as NumPy
    t[0, ::3] = Tensor(np.array([[1.0, -2.0]], np.float32))  # leading size-1 dims of the value are dropped
    ref = x.copy()
    ref[1] = 2.7
    ref[0, ::3] = np.array([[1.0, -2.0]], np.float32)
    np.testing.assert_array_equal(t.numpy(), ref)


def test_writes_chain_and_read_the_old_value():
    x = np.arange(10, dtype=np.float32)
    t, ref = Tensor(x), x.copy()
    old = t * 1  # read before the writes: keeps the old value
    t[2:5] = t[0:3]  # the value reads the base: the old elements, NumPy's copy semantics
    t[-1] = 100
    t[::3] = t[::3] * 2
    ref[2:5] = ref[0:3].copy()
    ref[-1] = 100
    ref[::3] = ref[::3] * 2
    np.testing.assert_array_equal(t.numpy(), ref)
    np.testing.assert_array_equal(old.numpy(), x)


def test_errors_name_the_bad_index():
    t = Tensor(np.zeros((4, 6), np.float32))
    with pytest.raises(TypeError, match="item assignment supports ints, slices and"):
        t[Tensor([0])] = 1.0
    with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 4"):
        t[7] = 1.0
    with pytest.raises(IndexError, match="too many indices"):
        t[0, 1, 2] = 1.0
    with pytest.raises(IndexError, match="single ellipsis"):
        t[..., 0, ...] = 1.0
    with pytest.raises(ValueError, match=r"shape \(3, 6\) cannot be broadcast to the indexed \(2, 6\)"):
        t[1:3] = Tensor(np.zeros((3, 6), np.float32))
    b = t.uop
    with pytest.raises(ValueError, match=r"does not fit shape \(4, 6\): dim 1 of size 6"):
        b.setitem(UOp.const(1.0, dtypes.float32).reshape((1, 1)).expand((1, 2)), ((0, 1, 1), (5, 1, 2)))
    with pytest.raises(ValueError, match=r"value shape \(2, 1\) differs from the region's counts \(1, 2\)"):
        b.setitem(UOp.const(1.0, dtypes.float32).reshape((1, 1)).expand((2, 1)), ((0, 1, 1), (0, 1, 2)))
    with pytest.raises(TypeError, match="dtype"):
        b.setitem(UOp.const(1, dtypes.int32).reshape((1, 1)), ((0, 1, 1), (0, 1, 1)))


# ---------------------------------------------------------------- views write through (PyTorch's copy_ on a view)


def test_assign_to_a_slice_writes_the_tensor():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    t, ref = Tensor(x), x.copy()
    view = t[1:3, ::2]
    view.assign(Tensor(np.full((2, 3), -1.0, np.float32)))
    ref[1:3, ::2] = -1.0
    np.testing.assert_array_equal(t.numpy(), ref)
    np.testing.assert_array_equal(view.numpy(), ref[1:3, ::2])  # the view shows the new values
    row = t[2]
    row[1:4] = Tensor(np.array([7.0, 8.0, 9.0], np.float32))  # item assignment on a view of a view
    t[0][::-1][0] = 5.0
    ref[2, 1:4] = [7.0, 8.0, 9.0]
    ref[0, -1] = 5.0
    np.testing.assert_array_equal(t.numpy(), ref)
    np.testing.assert_array_equal(row.numpy(), ref[2])
    t[None, 3, None].assign(t[None, 3, None] + 1)  # None dims and a whole-row view
    ref[3] += 1
    np.testing.assert_array_equal(t.numpy(), ref)


def test_assign_to_a_view_whose_tensor_is_gone_rebinds_it():
    view = Tensor(np.zeros(5, np.float32))[1:3]
    gc.collect()
    view.assign(Tensor(np.ones(2, np.float32)))
    np.testing.assert_array_equal(view.numpy(), [1.0, 1.0])


def test_assign_to_a_reshape_only_rebinds_it():
    t = Tensor(np.zeros(6, np.float32))
    r = t.reshape(2, 3)
    r.assign(Tensor(np.ones((2, 3), np.float32)))
    np.testing.assert_array_equal(t.numpy(), np.zeros(6))  # documented: only basic-indexing views write through


# ---------------------------------------------------------------- gradients against PyTorch


def _ascending(sp) -> slice:
    """The slice of a span's elements in ascending order."""
    first = min(sp.start, sp.start + (sp.count - 1) * sp.step)
    return S(first, first + (sp.count - 1) * abs(sp.step) + 1, abs(sp.step))


@pytest.mark.parametrize(
    "idx", [(1, S(None)), (S(1, 3), S(None, None, 2)), (Ellipsis, -1), (None, -2, S(4, 0, -1)), (S(None), 2)]
)
def test_gradients_match_torch(idx):
    x = rng.normal(size=(4, 5)).astype(np.float32)
    w = rng.normal(size=(4, 5)).astype(np.float32)
    v = rng.normal(size=x[idx].shape).astype(np.float32)
    # PyTorch has no negative steps: the reference writes the same elements ascending, its value flipped there
    bi = basic_index(x.shape, idx)
    walked = [d for d in bi.dims if d is not None]
    tidx = tuple(_ascending(sp) if d in walked else sp.start for d, sp in enumerate(bi.spans))
    back = [j for j, d in enumerate(bi.dims) if d is not None and bi.spans[d].step < 0]
    tx, tv = Tensor(x, requires_grad=True), Tensor(v, requires_grad=True)
    y = tx * 2
    y[idx] = tv * 3
    gx, gv = (y * Tensor(w)).sum().gradient(tx, tv)
    px, pv = torch.tensor(x, requires_grad=True), torch.tensor(v, requires_grad=True)
    py = px * 2
    py[tidx] = ((pv * 3).flip(back) if back else pv * 3).reshape(x[tidx].shape)
    (py * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(y.numpy(), py.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gx.numpy(), px.grad.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gv.numpy(), pv.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_gradient_through_a_value_that_reads_the_base():
    x = rng.normal(size=(6,)).astype(np.float32)
    tx = Tensor(x, requires_grad=True)
    y = tx.exp()
    y[1:4] = y[0:3] * tx[3:6]
    (g,) = y.sum().gradient(tx)
    px = torch.tensor(x, requires_grad=True)
    py = px.exp() * 1  # PyTorch's exp saves its output for backward: write a copy
    py[1:4] = py[0:3].clone() * px[3:6]
    py.sum().backward()
    np.testing.assert_allclose(g.numpy(), px.grad.numpy(), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- kernels


def _plan(t: Tensor):
    plan, _ = make_plan([t.uop])
    return plan


def _loop_elements(ast: UOp) -> int:
    """Iterations of the kernel's loop nest (the product of its RANGE sizes)."""
    return int(np.prod([u.src[0].arg for u in ast.toposort() if u.op is Ops.RANGE]))


def _threaded(ast: UOp) -> bool:
    return any(u.op is Ops.RANGE and u.arg.kind is AxisType.THREAD for u in ast.toposort())


def test_a_slice_write_is_a_copy_and_a_region_kernel():
    base = Tensor(np.zeros((64, 32), np.float32))
    base[5:9, 1::2] = Tensor(rng.normal(size=(4, 16)).astype(np.float32))
    plan = _plan(base)
    assert [k.name for k in plan.kernels] == ["e_64_32", "w_4_16"]
    copy, region = plan.kernels
    assert copy.copy is not None and region.copy is None  # the copy of an input buffer may be skipped
    assert _loop_elements(region.ast) == 4 * 16  # the region kernel loops over the region only
    assert region.nbytes == 2 * 4 * 16 * 4 and region.flops == 0  # reads the value, writes the region
    lazy = Tensor(np.zeros((64, 32), np.float32)) * 2  # a computed base fuses into the first kernel
    lazy[0] = 1.0
    ks = _plan(lazy).kernels
    assert [k.name for k in ks] == ["e_64_32", "w_1_32"] and ks[0].copy is None
    whole = Tensor(np.zeros((8,), np.float32))
    whole[::-1] = Tensor(np.arange(8, dtype=np.float32))  # the whole tensor: no SETITEM, one copy of the value
    assert [k.name for k in _plan(whole).kernels] == ["e_8"]
    np.testing.assert_array_equal(whole.numpy(), np.arange(8)[::-1])


def test_a_large_region_runs_on_threads_and_the_copy_is_guarded():
    base = Tensor(np.zeros((512, 512), np.float32))
    base[:, 256:] = 1.0
    plan, inputs = make_plan([base.uop], opt=None)
    assert not _threaded(plan.kernels[1].ast)  # no optimizer: nothing threads
    plan, inputs = make_plan([base.uop], opt=HandOpt(machine()))  # the default optimizer, whatever OPT says
    assert _threaded(plan.kernels[1].ast)
    cp = compile_plan(plan, len(inputs))
    # the copy onto itself is skipped (a one-loop copy: its function is e_n, whatever its size)
    assert re.search(r"if \(bufs\[0\] != bufs\[\d\]\) e_n_[0-9a-f]{16}\(", cp.src)


# ---------------------------------------------------------------- TinyJit: in place, and what must never be overwritten


def test_jit_kv_cache_writes_in_place():
    B, T, D = 2, 8, 16
    k_cache, v_cache = Tensor(np.zeros((B, T, D), np.float32)), Tensor(np.zeros((B, T, D), np.float32))
    ref_k, ref_v = np.zeros((B, T, D), np.float32), np.zeros((B, T, D), np.float32)

    @TinyJit
    def step(k: Tensor, v: Tensor, q: Tensor) -> Tensor:
        k_cache[:, 3] = k
        v_cache[:, 3].assign(v)
        att = (k_cache[:, :4] * q.reshape(B, 1, D)).sum(-1)  # reads the updated cache in the same plan
        Tensor.realize_all(k_cache, v_cache, att)
        return att

    ptrs = []
    for _ in range(6):
        k, v, q = (rng.normal(size=(B, D)).astype(np.float32) for _ in range(3))
        att = step(Tensor(k), Tensor(v), Tensor(q))
        ref_k[:, 3], ref_v[:, 3] = k, v
        np.testing.assert_array_equal(k_cache.numpy(), ref_k)
        np.testing.assert_array_equal(v_cache.numpy(), ref_v)
        np.testing.assert_allclose(att.numpy(), (ref_k[:, :4] * q[:, None]).sum(-1), rtol=1e-5, atol=1e-5)
        ptrs.append((_ptr(k_cache), _ptr(v_cache)))
    assert len(set(ptrs[1:])) == 1, "replays must write both caches into the storage the capture made"
    names = [k.name for c in step._calls for k in c.cp.kernels]
    assert names.count("w_2_1_16") == 2 and len(names) == 5, names  # two copies, two region writes, the attention
    assert all(u.in_place for c in step._calls for u in c.updates)


def test_jit_optimizer_like_update_of_a_slice_is_in_place():
    w = Tensor(np.arange(10, dtype=np.float32))
    ref = np.arange(10, dtype=np.float32)

    @TinyJit
    def update(g: Tensor) -> None:
        w[2:8] = w[2:8] - 0.5 * g  # reads the elements it writes: still in place
        w.realize()

    ptrs = []
    for i in range(5):
        g = np.full(6, float(i), np.float32)
        update(Tensor(g))
        ref[2:8] -= 0.5 * g
        np.testing.assert_array_equal(w.numpy(), ref)
        ptrs.append(_ptr(w))
    assert len(set(ptrs[1:])) == 1


def test_jit_slice_write_keeps_old_values_for_readers():
    cache = Tensor(np.zeros((4, 8), np.float32))

    @TinyJit
    def step(row: Tensor) -> None:
        cache[1] = row
        cache.realize()

    for i in range(3):
        step(Tensor(np.full(8, float(i), np.float32)))
    old = cache * 1  # a lazy graph built between replays
    snapshot = cache.numpy()
    step(Tensor(np.full(8, 10.0, np.float32)))
    np.testing.assert_array_equal(old.numpy(), snapshot)  # it sees the old value
    assert cache.numpy()[1, 0] == 10.0
    del old
    gc.collect()
    view = buffer_data(base_buffer(cache.uop))  # a NumPy view of the storage: never overwritten
    before = view.copy()
    for i in range(3):
        step(Tensor(np.full(8, 20.0 + i, np.float32)))
    np.testing.assert_array_equal(view, before)
    np.testing.assert_array_equal(cache.numpy()[1], np.full(8, 22.0))
    ptr = _ptr(cache)
    step(Tensor(np.full(8, 30.0, np.float32)))  # nothing views the new storage: in place again
    assert _ptr(cache) == ptr


def test_unjitted_slice_write_goes_to_fresh_storage():
    t = Tensor(np.zeros(8, np.float32))
    ptr = _ptr(t)
    (out,) = realize([t.uop.setitem(UOp.const(1.0, dtypes.float32).reshape((1,)).expand((2,)), ((1, 1, 2),))])
    assert buffer_ptr(out) != ptr
    np.testing.assert_array_equal(buffer_data(out), [0, 1, 1, 0, 0, 0, 0, 0])

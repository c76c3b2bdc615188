"""GATHER: a load whose index comes from data, checked when the kernel runs.

Reference: NumPy's take_along_axis. A bad index raises IndexError after the plan runs, naming the op, the value and
the valid range; it never reads outside the buffer (the check substitutes 0) and never fails silently.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from uopc.buffer import buffer_data, new_buffer
from uopc.dtype import dtypes
from uopc.realize import default_opt, realize
from uopc.uop import Ops, UOp

rng = np.random.default_rng(0)


def buf(a: np.ndarray) -> UOp:
    dt = {np.dtype(np.float32): dtypes.f32, np.dtype(np.int32): dtypes.int32, np.dtype(np.int64): dtypes.int64}
    return new_buffer(dt[a.dtype], a.size, a).reshape(a.shape)


def run(u: UOp) -> np.ndarray:
    (b,) = realize([u], opt=default_opt())
    return buffer_data(b).reshape(u.shape).copy()


@pytest.mark.parametrize("opt", [0, 1, 2])
@pytest.mark.parametrize("shape,dim,ishape", [((5, 7), 1, (5, 3)), ((6, 4), 0, (9, 4)), ((3, 4, 5), 2, (3, 2, 6))])
def test_gather_matches_take_along_axis(context, opt, shape, dim, ishape):
    context(OPT=opt)
    x = rng.standard_normal(shape).astype(np.float32)
    idx = rng.integers(0, shape[dim], ishape).astype(np.int32)
    got = run(buf(x).gather(buf(idx), dim) * 2.0 + 1.0)
    # PyTorch's gather allows an index smaller than the input off `dim`: the reference cuts the input to match
    cut = tuple(slice(0, s) if d != dim else slice(None) for d, s in enumerate(ishape))
    np.testing.assert_array_equal(got, np.take_along_axis(x[cut], idx, dim) * 2.0 + 1.0)


def test_gather_of_computed_values_with_computed_int64_index():
    x = rng.standard_normal((8, 16)).astype(np.float32)
    idx = rng.integers(0, 15, (8, 4)).astype(np.int64)
    got = run((buf(x) * 3.0).gather(buf(idx) + 1, 1).reduce(Ops.ADD, 1))
    np.testing.assert_allclose(got, (np.take_along_axis(x * 3.0, idx + 1, 1)).sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [4, 1000, -1])
def test_out_of_range_index_raises_naming_op_value_and_range(bad):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[0, 3], [2, bad], [1, 1]], np.int32)
    with pytest.raises(IndexError, match=rf"embedding lookup: index {bad} is out of range .*valid indices 0\.\.3"):
        run(buf(x).gather(buf(idx), 1, "embedding lookup"))


def test_index_check_is_always_on(context):
    context(CHECK_OOB=0, OPT=1)  # the full bounds checker is off; data-dependent checks stay on
    x = np.ones((2, 3), np.float32)
    with pytest.raises(IndexError, match="index 3"):
        run(buf(x).gather(buf(np.array([[0], [3]], np.int32)), 1))


def test_bad_gather_arguments_raise_before_compiling():
    x = buf(np.ones((3, 4), np.float32))
    with pytest.raises(TypeError, match="integer"):
        x.gather(buf(np.ones((3, 2), np.float32)), 1)
    with pytest.raises(ValueError, match="do not fit"):
        x.gather(buf(np.zeros((3,), np.int32)), 1)
    with pytest.raises(ValueError, match="larger"):
        x.gather(buf(np.zeros((4, 2), np.int32)), 1)


def test_error_records_are_per_call_across_threads():
    # concurrent realizes of one plan: only the calls whose own index is bad raise
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    good, bad = np.array([[1], [2], [3], [4]], np.int32), np.array([[1], [2], [9], [4]], np.int32)
    results: dict[int, str] = {}

    def work(i: int) -> None:
        try:
            out = run(buf(x).gather(buf(bad if i % 2 else good), 1) + 0.5)
            results[i] = "ok" if np.array_equal(out, np.take_along_axis(x, good, 1) + 0.5) else "wrong"
        except IndexError:
            results[i] = "raised"

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[i] == ("raised" if i % 2 else "ok") for i in range(16)), results


def _scatter_ref(base: np.ndarray, idx: np.ndarray, vals: np.ndarray, dim: int) -> np.ndarray:
    out = base.copy()
    for pos in np.ndindex(*idx.shape):
        tgt = list(pos)
        tgt[dim] = idx[pos]
        out[tuple(tgt)] += vals[pos]
    return out


@pytest.mark.parametrize("opt", [0, 1])
@pytest.mark.parametrize("shape,dim,ishape", [((5, 7), 1, (5, 9)), ((6, 4), 0, (9, 4)), ((3, 4, 5), 2, (3, 2, 6))])
def test_scatter_add_accumulates_repeated_indices(context, opt, shape, dim, ishape):
    context(OPT=opt)
    base = rng.standard_normal(shape).astype(np.float32)
    idx = rng.integers(0, shape[dim], ishape).astype(np.int32)  # more indices than slots: repeats are certain
    vals = rng.standard_normal(ishape).astype(np.float32)
    got = run((buf(base) * 2.0).scatter_add(buf(idx), buf(vals) + 1.0, dim) - 1.0)
    np.testing.assert_allclose(got, _scatter_ref(base * 2.0, idx, vals + 1.0, dim) - 1.0, rtol=1e-5, atol=1e-5)


def test_scatter_add_checks_its_indices():
    base, vals = np.zeros((2, 3), np.float32), np.ones((2, 2), np.float32)
    with pytest.raises(IndexError, match=r"embedding backward: index -2 is out of range .*valid indices 0\.\.2"):
        run(buf(base).scatter_add(buf(np.array([[0, 1], [-2, 2]], np.int32)), buf(vals), 1, "embedding backward"))


def test_scatter_plan_is_a_copy_then_a_serial_accumulate(context):
    from uopc.schedule import make_plan

    context(OPT=1)
    base, idx, vals = (
        buf(np.zeros((4, 8), np.float32)),
        buf(np.zeros((4, 3), np.int32)),
        buf(np.ones((4, 3), np.float32)),
    )
    plan, _ = make_plan([base.scatter_add(idx, vals, 1)])
    assert [k.name for k in plan.kernels] == ["e_4_8", "s_4_3"]
    assert plan.kernels[0].refs[-1] == plan.kernels[1].refs[-2] == ("out", 0)  # both write the output
    assert plan.n_err == 1 and plan.kernels[1].checks == ("scatter_add",)

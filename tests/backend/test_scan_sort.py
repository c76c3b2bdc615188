"""Scans and sorting at the sizes users run: cumsum of 2^20 elements, sort/argsort/topk of 2^16 along an axis,
against NumPy and PyTorch (timings are in bench/bench_scan_sort.py, not here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from uopc import Tensor, dtypes

rng = np.random.default_rng(0)


def test_cumsum_2_20():
    x = rng.normal(size=1 << 20).astype(np.float32)
    ref = np.cumsum(x.astype(np.float64))
    # float32 running sums: the error grows like sqrt(n) * eps * |partial sums|
    np.testing.assert_allclose(Tensor(x).cumsum().numpy(), ref, rtol=1e-4, atol=2e-3)
    i = rng.integers(-1000, 1000, 1 << 20).astype(np.int32)
    np.testing.assert_array_equal(Tensor(i).cumsum(0).numpy(), np.cumsum(i))


def test_cumsum_axes_and_dtypes():
    x = rng.normal(size=(5, 300, 3)).astype(np.float32)
    for ax in (0, 1, 2, -1):
        np.testing.assert_allclose(Tensor(x).cumsum(ax).numpy(), np.cumsum(x, ax), rtol=1e-5, atol=1e-4)
    b = rng.random((4, 100)) < 0.5
    out = Tensor(b).cumsum(1)
    assert out.dtype is dtypes.int32 and out.tolist() == np.cumsum(b, 1).tolist()
    h = Tensor(np.ones(100, np.float16)).cumsum()
    assert h.dtype is dtypes.float16 and h.numpy()[-1] == 100


def test_cummax_cummin_cumprod():
    x = rng.normal(size=(3, 5000)).astype(np.float32)
    np.testing.assert_array_equal(Tensor(x).cummax(1).numpy(), np.maximum.accumulate(x, 1))
    np.testing.assert_array_equal(Tensor(x).cummin(1).numpy(), np.minimum.accumulate(x, 1))
    i = rng.integers(-50, 50, (200, 4)).astype(np.int32)
    np.testing.assert_array_equal(Tensor(i).cummax(0).numpy(), np.maximum.accumulate(i, 0))
    p = rng.integers(-3, 4, (3, 20)).astype(np.int64)
    np.testing.assert_array_equal(Tensor(p).cumprod(1).numpy(), np.cumprod(p, 1))  # exact for ints
    f = rng.uniform(0.9, 1.1, (2, 1000)).astype(np.float32)
    np.testing.assert_allclose(Tensor(f).cumprod(1).numpy(), np.cumprod(f.astype(np.float64), 1), rtol=1e-4)


def test_cumsum_gradient_large():
    x = rng.normal(size=(2, 5000)).astype(np.float32)
    t = Tensor(x, requires_grad=True)
    w = rng.normal(size=(2, 5000)).astype(np.float32)
    (g,) = (t.cumsum(1) * Tensor(w)).sum().gradient(t)
    ref = np.cumsum(w[:, ::-1].astype(np.float64), 1)[:, ::-1]  # d/dx_j sum_i w_i cumsum_i = sum_{i>=j} w_i
    np.testing.assert_allclose(g.numpy(), ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("axis,n", [(1, 1 << 16), (0, 1 << 12)])
def test_sort_argsort_along_axis(axis, n):
    x = rng.normal(size=(2, n)).astype(np.float32)
    x = x if axis == 1 else np.ascontiguousarray(x.T)
    vals, idx = Tensor(x).sort(axis)
    Tensor.realize_all(vals, idx)
    np.testing.assert_array_equal(vals.numpy(), np.sort(x, axis))
    np.testing.assert_array_equal(idx.numpy(), np.argsort(x, axis, kind="stable"))
    d = Tensor(x).argsort(axis, descending=True).numpy()
    np.testing.assert_array_equal(d, np.argsort(-x, axis, kind="stable"))


def test_topk_2_16():
    x = rng.normal(size=(2, 1 << 16)).astype(np.float32)
    v, i = Tensor(x).topk(10)
    tv, ti = torch.topk(torch.tensor(x), 10)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    v, i = Tensor(x[:, :5000]).topk(5, dim=1, largest=False)
    tv, ti = torch.topk(torch.tensor(x[:, :5000]), 5, dim=1, largest=False)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())


def test_sort_ints_ties_and_odd_lengths():
    x = rng.integers(-5, 5, (3, 1000)).astype(np.int32)  # many ties: stability decides the indices
    v, i = Tensor(x).sort(1)
    np.testing.assert_array_equal(v.numpy(), np.sort(x, 1))
    np.testing.assert_array_equal(i.numpy(), np.argsort(x, 1, kind="stable"))
    v, i = Tensor(x).sort(1, descending=True)
    tv, ti = torch.sort(torch.tensor(x), dim=1, descending=True, stable=True)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    big = np.array([2**31 - 1, -(2**31), 0, 7, 2**31 - 1], np.int32)  # the padding value itself appears
    v, i = Tensor(big).sort()
    assert v.tolist() == sorted(big.tolist()) and i.tolist() == np.argsort(big, kind="stable").tolist()
    assert Tensor([3.0]).sort()[0].tolist() == [3.0]
    b = Tensor([True, False, True]).sort()[0]
    assert b.dtype is dtypes.bool and b.tolist() == [False, True, True]
    with pytest.raises(ValueError):
        Tensor([1.0, 2.0]).topk(3)

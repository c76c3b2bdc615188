"""scatter and scatter_reduce against PyTorch: every reduce, include_self both ways, dims, forward and gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from uopc import Tensor

rng = np.random.default_rng(0)


def _case(dim: int, unique: bool):
    x = rng.normal(size=(4, 5)).astype(np.float32)
    src = rng.normal(size=(3, 4)).astype(np.float32)
    n = x.shape[dim]
    if unique:  # a permutation per line: no target written twice
        idx = np.stack([rng.permutation(n)[: src.shape[dim]] for _ in range(src.shape[1 - dim])], 1 - dim)
    else:
        idx = rng.integers(0, n, src.shape)
    return x, idx.astype(np.int64), src


def _both(ours, theirs, x, idx, src):
    t, s = Tensor(x, requires_grad=True), Tensor(src, requires_grad=True)
    tx, ts = torch.tensor(x, requires_grad=True), torch.tensor(src, requires_grad=True)
    out, ref = ours(t, Tensor(idx), s), theirs(tx, torch.tensor(idx), ts)
    w = rng.normal(size=ref.shape).astype(np.float32)
    gx, gs = (out * Tensor(w)).sum().gradient(t, s)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-6, atol=1e-6)
    (ref * torch.tensor(w)).sum().backward()
    return gx.numpy(), gs.numpy(), tx.grad.numpy(), ts.grad.numpy()


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_reduce_matches_torch(reduce, include_self, dim):
    x, idx, src = _case(dim, unique=False)  # repeated targets: the reduction matters
    gx, gs, tgx, tgs = _both(
        lambda a, i, b: a.scatter_reduce(dim, i, b, reduce, include_self=include_self),
        lambda a, i, b: a.scatter_reduce(dim, i, b, reduce, include_self=include_self),
        x,
        idx,
        src,
    )
    np.testing.assert_allclose(gx, tgx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gs, tgs, rtol=1e-5, atol=1e-6)


def test_scatter_reduce_ties_share_the_gradient_and_prod():
    x = np.array([[1.0, 5.0, 2.0]], np.float32)
    src = np.array([[5.0, 5.0, 0.5]], np.float32)
    idx = np.array([[1, 1, 2]], np.int64)
    gx, gs, tgx, tgs = _both(
        lambda a, i, b: a.scatter_reduce(1, i, b, "amax"),
        lambda a, i, b: a.scatter_reduce(1, i, b, "amax"),
        x,
        idx,
        src,
    )
    np.testing.assert_allclose(gx, tgx, rtol=1e-6)  # three elements tie at 5: a third each
    np.testing.assert_allclose(gs, tgs, rtol=1e-6)
    for include_self in (True, False):
        out = Tensor(x).scatter_reduce(1, Tensor(idx), Tensor(src), "prod", include_self=include_self).numpy()
        ref = torch.tensor(x).scatter_reduce(1, torch.tensor(idx), torch.tensor(src), "prod", include_self=include_self)
        np.testing.assert_allclose(out, ref.numpy(), rtol=1e-6)


@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_matches_torch(dim):
    x, idx, src = _case(dim, unique=True)
    gx, gs, tgx, tgs = _both(lambda a, i, b: a.scatter(dim, i, b), lambda a, i, b: a.scatter(dim, i, b), x, idx, src)
    np.testing.assert_allclose(gx, tgx)
    np.testing.assert_allclose(gs, tgs)
    out = Tensor(x).scatter(dim, Tensor(idx), 2.5).numpy()
    np.testing.assert_allclose(out, torch.tensor(x).scatter(dim, torch.tensor(idx), 2.5).numpy())
    for reduce in ("add", "multiply"):
        out = Tensor(x).scatter(dim, Tensor(idx), Tensor(src), reduce=reduce).numpy()
        ref = torch.tensor(x).scatter(dim, torch.tensor(idx), torch.tensor(src), reduce=reduce)
        np.testing.assert_allclose(out, ref.numpy(), rtol=1e-6)


def test_scatter_repeated_index_last_writer_wins_and_ints():
    x = np.zeros(4, np.int32)
    idx = np.array([1, 3, 1, 1], np.int64)
    src = np.array([10, 20, 30, 40], np.int32)
    assert Tensor(x).scatter(0, Tensor(idx), Tensor(src)).tolist() == [0, 40, 0, 20]
    big = np.array([7, -3, 2, 9], np.int32)
    for reduce, ref in (("amax", [7, 40, 2, 20]), ("amin", [7, -3, 2, 9])):
        assert Tensor(big).scatter_reduce(0, Tensor(idx), Tensor(src), reduce).tolist() == ref
    assert Tensor(big).scatter_reduce(0, Tensor(idx), Tensor(src), "mean", include_self=False).tolist() == [
        7,
        26,
        2,
        20,
    ]


def test_scatter_errors():
    x = Tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="reduce must be"):
        x.scatter_reduce(0, Tensor(np.zeros((1, 3), np.int64)), Tensor(np.ones((1, 3), np.float32)), "max")
    with pytest.raises(IndexError, match="scatter"):
        x.scatter(1, Tensor(np.array([[0, 5, 1]], np.int64)), 1.0).numpy()

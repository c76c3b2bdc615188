"""In-graph random numbers (Philox), dropout, training and no_grad modes.

Statistical bounds are set at about five standard deviations of the statistic, so a correct generator fails one
with probability well below 1e-6 (and the seeds are fixed, so a run is deterministic anyway).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from uopc import Tensor, dtypes, no_grad
from uopc.engine import realize as realize_mod

N = 1 << 20


def test_uniform_moments_and_histogram():
    Tensor.manual_seed(1)
    u = Tensor.rand(N).numpy()
    assert u.dtype == np.float32 and u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / N)
    assert abs(u.var() - 1 / 12) < 5 * np.sqrt(1 / 180 / N)
    counts, _ = np.histogram(u, bins=128, range=(0, 1))
    expected = N / 128
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 127 + 5 * np.sqrt(2 * 127), chi2  # chi-square with 127 degrees of freedom


def test_normal_moments():
    Tensor.manual_seed(2)
    z = Tensor.randn(N).numpy()
    assert abs(z.mean()) < 5 / np.sqrt(N)
    assert abs(z.var() - 1) < 5 * np.sqrt(2 / N)
    assert abs((z > 1.959964).mean() - 0.025) < 5 * np.sqrt(0.025 * 0.975 / N)  # the tail, not just moments
    x = Tensor.normal(1000, 100, mean=3.0, std=0.5).numpy()
    assert abs(x.mean() - 3) < 5 * 0.5 / np.sqrt(1e5) and abs(x.std() - 0.5) < 0.01


def test_successive_draws_are_independent():
    Tensor.manual_seed(3)
    a, b = Tensor.rand(N).numpy(), Tensor.rand(N).numpy()
    assert not np.array_equal(a, b)
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(N)
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 5 / np.sqrt(N)  # neighbours within one draw


def test_manual_seed_reproduces():
    Tensor.manual_seed(42)
    a = [Tensor.rand(3, 5).numpy(), Tensor.randn(7).numpy(), Tensor.randint(4, low=-3, high=9).numpy()]
    Tensor.manual_seed(42)
    b = [Tensor.rand(3, 5).numpy(), Tensor.randn(7).numpy(), Tensor.randint(4, low=-3, high=9).numpy()]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    Tensor.manual_seed(43)
    assert not np.array_equal(Tensor.rand(3, 5).numpy(), a[0])


def test_seeded_block_draws_its_own_stream_and_leaves_the_outer_one():
    Tensor.manual_seed(7)
    outer = [Tensor.rand(6).numpy(), Tensor.rand(6).numpy()]
    with Tensor.seeded(11):
        inner = Tensor.rand(6).numpy()
    Tensor.manual_seed(11)
    np.testing.assert_array_equal(inner, Tensor.rand(6).numpy())  # the block's stream is seed 11 from counter 0
    Tensor.manual_seed(7)
    first = Tensor.rand(6).numpy()
    with Tensor.seeded(11):
        Tensor.rand(100).realize()
    np.testing.assert_array_equal(first, outer[0])
    np.testing.assert_array_equal(Tensor.rand(6).numpy(), outer[1])  # as if the block had drawn nothing


def test_replayed_plan_draws_fresh_numbers():
    Tensor.manual_seed(5)
    x = Tensor.rand(64) + 1  # realized with the counter's advance, in one plan
    x.realize()
    n_plans = len(realize_mod._plans)
    y = Tensor.rand(64) + 1
    y.realize()
    assert len(realize_mod._plans) == n_plans  # the same plan ran again (the seed and counter are data)
    assert not np.array_equal(x.numpy(), y.numpy())


def test_lazy_draws_in_one_realize_differ():
    Tensor.manual_seed(6)
    a, b = Tensor.rand(100), Tensor.rand(100)
    Tensor.realize_all(b, a)
    assert not np.array_equal(a.numpy(), b.numpy())
    Tensor.manual_seed(6)
    np.testing.assert_array_equal(Tensor.rand(100).numpy(), a.numpy())  # draw order, not realize order


def test_ranges_and_dtypes():
    Tensor.manual_seed(7)
    r = Tensor.randint(100000, low=-5, high=12).numpy()
    assert r.dtype == np.int32 and r.min() == -5 and r.max() == 11
    counts = np.bincount(r + 5)
    assert len(counts) == 17 and np.all(np.abs(counts - 100000 / 17) < 5 * np.sqrt(100000 / 17))
    u = Tensor.uniform(10000, low=-2.0, high=3.0).numpy()
    assert u.min() >= -2 and u.max() < 3 and abs(u.mean() - 0.5) < 0.1
    assert Tensor.rand(4, dtype=dtypes.float16).dtype is dtypes.float16
    d = Tensor.rand(10000, dtype=dtypes.float64).numpy()
    assert d.dtype == np.float64 and len(np.unique(d)) == 10000
    like = Tensor.zeros(2, 3, dtype=dtypes.float64)
    assert like.rand_like().shape == (2, 3) and like.randn_like().dtype is dtypes.float64
    assert Tensor.rand(0, 3).shape == (0, 3) and Tensor.random_bits(5).dtype is dtypes.uint32
    with pytest.raises(ValueError):
        Tensor.randint(3, low=2, high=2)
    with pytest.raises(TypeError):
        Tensor.rand(3, dtype=dtypes.int32)


def test_randperm_and_multinomial():
    Tensor.manual_seed(8)
    p = Tensor.randperm(1000).numpy()
    assert sorted(p.tolist()) == list(range(1000)) and not np.array_equal(p, np.arange(1000))
    w = np.array([1.0, 0.0, 3.0, 6.0], np.float32)
    s = Tensor(w).multinomial(40000, replacement=True).numpy()
    freq = np.bincount(s, minlength=4) / 40000
    np.testing.assert_allclose(freq, w / w.sum(), atol=5 * np.sqrt(0.25 / 40000))
    rows = Tensor(np.tile(w, (500, 1))).multinomial(3, replacement=False).numpy()
    assert rows.shape == (500, 3) and all(len(set(r)) == 3 and 1 not in r for r in rows.tolist())
    first = np.bincount(rows[:, 0], minlength=4) / 500  # the first draw follows the weights
    np.testing.assert_allclose(first, w / w.sum(), atol=5 * np.sqrt(0.25 / 500))
    with pytest.raises(ValueError):
        Tensor(w).multinomial(5)


def test_initializers():
    Tensor.manual_seed(9)
    t = Tensor.kaiming_uniform(256, 128).numpy()
    bound = np.sqrt(3) * np.sqrt(2 / (1 + 0.01**2)) / np.sqrt(128)
    assert np.abs(t).max() <= bound and np.abs(t).max() > 0.99 * bound
    k = Tensor.kaiming_normal(512, 64, a=0.0).numpy()
    assert abs(k.std() - np.sqrt(2 / 64)) < 0.01 * np.sqrt(2 / 64) * 5
    g = Tensor.glorot_uniform(100, 300).numpy()
    assert np.abs(g).max() <= np.sqrt(6 / 400)
    s = Tensor.scaled_uniform(10, 10).numpy()
    assert np.abs(s).max() <= 0.1


def test_dropout():
    x = Tensor(np.ones((500, 400), np.float32))
    assert x.dropout(0.3) is x  # not training: identity
    with Tensor.train():
        assert Tensor.training
        Tensor.manual_seed(10)
        y = x.dropout(0.3).numpy()
        Tensor.manual_seed(10)
        np.testing.assert_array_equal(x.dropout(0.3).numpy(), y)
        assert abs((y == 0).mean() - 0.3) < 5 * np.sqrt(0.21 / y.size)
        np.testing.assert_allclose(y[y != 0], 1 / 0.7, rtol=1e-6)
        assert not np.array_equal(x.dropout(0.3).numpy(), y)
        w = Tensor(np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32), requires_grad=True)
        Tensor.manual_seed(11)
        out = w.dropout(0.5)
        (g,) = out.sum().gradient(w)
        np.testing.assert_allclose(g.numpy(), (out.numpy() != 0) * 2.0)
        assert x.dropout(1.0).numpy().sum() == 0
    assert not Tensor.training
    with pytest.raises(ValueError):
        x.dropout(1.5)


def test_training_and_no_grad_modes():
    assert Tensor.training is False and Tensor.no_grad is False

    @Tensor.train()
    def inside():
        return Tensor.training

    assert inside() is True and Tensor.training is False
    w = Tensor([1.0, 2.0], requires_grad=True)
    with no_grad():
        assert Tensor.no_grad
        assert (w * 2).requires_grad is None
    with Tensor.test():
        assert (w * 2).requires_grad is None
    assert Tensor.no_grad is False and (w * 2).requires_grad
    with Tensor.train(False):
        assert Tensor.training is False


def test_dropout_matches_torch_scaling():
    # torch's mask differs (another generator); the expectation of the output is the input in both
    Tensor.manual_seed(12)
    x = np.random.default_rng(1).normal(size=(200, 500)).astype(np.float32)
    with Tensor.train():
        ours = Tensor(x).dropout(0.2).numpy()
    ref = torch.nn.functional.dropout(torch.tensor(x), 0.2, training=True).numpy()
    for y in (ours, ref):
        np.testing.assert_allclose(y[y != 0], x[y != 0] / 0.8, rtol=1e-6)
    assert abs((ours == 0).mean() - (ref == 0).mean()) < 0.01


def test_nn_dropout_layer():
    from uopc.nn import Dropout

    x = Tensor(np.ones((64, 64), np.float32))
    drop = Dropout(0.25)
    np.testing.assert_array_equal(drop(x).numpy(), x.numpy())  # not training: the identity
    with Tensor.train():
        y = drop(x).numpy()
    kept = y != 0
    assert 0.7 < kept.mean() < 0.8  # 4096 draws: the kept fraction is 0.75 +- 0.02
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    with pytest.raises(ValueError, match="p must be in"):
        Dropout(1.5)

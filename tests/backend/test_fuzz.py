"""Differential fuzzing against NumPy (uopc.tools.fuzz): a bounded seeded run, and one test per bug the fuzzer found.

Tolerances: float32 rtol 1e-3, atol 1e-4 (chains of up to six ops); ints and bools exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from uopc import dtypes
from uopc.tensor import Tensor
from uopc.tools import fuzz_opts
from uopc.tools.fuzz import MODES, SKIPPED, _threaded, check


@pytest.mark.parametrize("block", range(6))
def test_fuzz_bounded_run(block):
    # 300 programs in 6 blocks; program i runs in mode i % 4 (OPT 0/1 x fuse_reduce off/on)
    bad = [rep for s in range(block * 50, block * 50 + 50) if (rep := check(s))]
    assert not bad, bad[0]


@pytest.mark.parametrize("block", range(2))
def test_fuzz_gradients_against_torch(block):
    # --grad: 40 programs, d sum(out * W) / d input against PyTorch autograd (same tolerances)
    reps = [check(s, grad=True) for s in range(block * 20, block * 20 + 20)]
    bad = [r for r in reps if r and r != SKIPPED]
    assert not bad, bad[0]
    assert reps.count(SKIPPED) < len(reps)  # most programs have a float value to differentiate


def test_fuzz_threads_check_every_program():
    # --threads: 40 programs on 4 threads, each mode's seeds together; every result is checked
    reps = _threaded(list(range(300, 340)), False, 4)
    assert len(reps) == 40 and not any(reps), next(r for r in reps if r)


@pytest.mark.parametrize("block", range(2))
def test_fuzz_lowering_under_random_opts(block):
    # uopc.tools.fuzz_opts: 16 seeds of one-kernel programs lowered under random Opts, against NumPy (rtol 1e-4 of the
    # result's scale, 2e-3 for half precision), each seed with one of the convolutions' chains of kernels, each kernel
    # under Opts of its own (a chain compiles three kernels: all four in every seed doubled the test's time); before
    # 24b0c80's vectorize fix, seed 1 gave 2 mismatches (a softmax's row read in vectors), and before the K-chunk memo
    # fix seed 6 gave 1 (a row max in chunks of K, one tile and a remainder)
    single = [p for p in fuzz_opts.PROGRAMS if not p.chain]
    chains = [p for p in fuzz_opts.PROGRAMS if p.chain]
    seeds = range(block * 8, block * 8 + 8)
    bad = [rep for s in seeds for rep in fuzz_opts.check(s, [*single, chains[s % len(chains)]])]
    assert not bad, bad[0]


def test_max_gradient_after_x_minus_max():
    # bug (fuzz --grad seed 39): gcc contracts a*b - max into an FMA, so x - max(x) is a rounding residual at the max,
    # not 0, and the max's gradient compared values recomputed differently in two kernels; PyTorch gives 0 here
    torch = pytest.importorskip("torch")
    a = np.array([[-0.04878097, 1.9228946], [-0.83760935, 0.5638864]], np.float32)
    b = np.array([[-0.11331628, 1.0099504], [1.3706797, 1.3743685]], np.float32)
    x = Tensor(a)
    xy = x * Tensor(b)
    (g,) = (xy - xy.max(-1, keepdim=True)).max().gradient(x)
    t = torch.tensor(a, requires_grad=True)
    ty = t * torch.tensor(b)
    (tg,) = torch.autograd.grad((ty - ty.amax(-1, keepdim=True)).amax(), t)
    np.testing.assert_allclose(g.numpy(), tg.numpy(), atol=1e-6)


@pytest.mark.parametrize("seed", [39, 416, 6780, 7483, 8336, 8400])
def test_fuzz_grad_regression_seeds(seed):
    # --grad found: 416, a NaN gradient of max over a softmax; 39, a softmax-shift tie (now detached); 6780, max
    # passing NaN to its loser; 7483 (a crash), 8336, 8400: gradients through size-0 values
    assert check(seed, grad=True) is None


def test_max_gradient_of_a_recomputed_value_is_finite():
    # bug (fuzz --grad seed 416): max's gradient compared the recomputed input with the max kernel's result; gcc
    # rounded the two differently, no element matched, ties = 0 and the gradient was 0 * inf = NaN
    x1 = Tensor(np.array([[0.3261318802833557]], np.float32))
    s = (Tensor(np.array([[4, -5]], np.int32)) - x1).softmax(-1)
    (g,) = s.max((0, 1), keepdim=True).sum().gradient(x1)
    a = 4 - 0.3261318802833557
    p = 1 / (1 + np.exp(-9.0))  # softmax([a, a - 9])[0]; d/dx1 of it is 0 (both entries shift by -x1)
    assert np.isfinite(g.numpy()).all() and abs(float(g.numpy()[0, 0])) < 1e-6, (g.numpy(), a, p)


def test_gradient_through_a_size_0_value_is_zero():
    # bug (fuzz --grad seeds 8336, 8400): a size-0 value's gradient reduced over nothing in a kernel that wrote
    # nothing, so the broadcast operand's gradient was whatever the output buffer held
    x = Tensor(np.array([[0.5], [1.5]], np.float32))
    y = (Tensor.zeros(2, 0) + x).pad(((1, 0), (0, 1)))
    (g,) = (y * 3).sum().gradient(x)
    np.testing.assert_array_equal(g.numpy(), [[0.0], [0.0]])


def test_maximum_loser_gets_zero_even_under_a_nan_gradient():
    # bug (fuzz --grad seed 6780): max sent g * 0 to the losing operand, NaN where g was NaN (sqrt'(0) * abs'(0));
    # PyTorch masks it to 0
    b = Tensor(np.array([-0.5, 0.25], np.float32))
    (g,) = Tensor([0.0, 0.0]).maximum(b).abs().sqrt().sum().gradient(b)
    np.testing.assert_allclose(g.numpy(), [0.0, 1.0], rtol=1e-6)


# seeds the fuzzer once failed on (each also has a direct test below)
@pytest.mark.parametrize("seed", [442, 499, 1095, 2289, 2959])
def test_fuzz_regression_seeds(seed):
    assert check(seed) is None


@pytest.fixture(params=MODES, ids=lambda m: f"opt{m[0]}-fuse{int(m[1])}")
def mode(context, request, monkeypatch):
    context(OPT=request.param[0])
    monkeypatch.setattr(Tensor, "fuse_reduce", request.param[1])


def test_reduce_under_pad_resets_its_accumulator(mode):
    # bug (seed 499): a reduction under a PAD kept one accumulator for all padded positions (never re-zeroed)
    a = np.arange(1, 5, dtype=np.float32).reshape(2, 2, 1)
    t = (Tensor(a).sum((0, 1), keepdim=True) * Tensor(a)).pad(((0, 0), (1, 1), (1, 1)))
    np.testing.assert_allclose(t.numpy(), np.pad(a.sum((0, 1), keepdims=True) * a, ((0, 0), (1, 1), (1, 1))))


def test_bool_add_is_or(mode):
    # bug (seed 442): bool + bool rendered as C int addition (True + True == 2) inside a larger expression
    x = np.array([[True], [False], [True]])
    t = Tensor(x)
    got = Tensor(np.ones((3, 1), bool)).where(t + t, Tensor(np.zeros((3, 1), np.float32))).expand((3, 3))
    np.testing.assert_array_equal(got.numpy(), np.broadcast_to((x | x).astype(np.float32), (3, 3)))


def test_view_of_a_0d_value_is_kept(mode):
    # bug (seeds 1095, 2289, 2959): push_views treated a 0-d operand as a broadcast constant and dropped the view
    x = Tensor(np.array(3, np.int32))
    np.testing.assert_array_equal(x.neg().neg().reshape((1,)).expand((2,)).numpy(), [3, 3])


def test_layout_pass_on_0d_reduce(mode):
    # bug (first 200 seeds): the layout pass asked a 0-d view for its last axis
    x = Tensor(np.array(True)).cast(dtypes.int32)
    np.testing.assert_array_equal((-x).reshape((1,)).square().max((0,), keepdim=True).numpy(), [1])

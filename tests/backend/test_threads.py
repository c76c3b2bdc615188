"""Concurrent realizes from Python threads: per-call temps, one plan build per key, results equal to NumPy."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from uopc.engine import realize
from uopc.nn import AdamW, Linear, parameters
from uopc.runtime.buffer import pool
from uopc.tensor import Tensor


def _run_threads(fn, n: int = 4) -> list:
    errors: list = []

    def body(tid: int) -> None:
        try:
            fn(tid)
        except BaseException as e:  # surfaced in the main thread below
            errors.append(e)

    ts = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# mixed structures: each has temps (softmax, var) or none (add); reference in float64, tolerance 1e-5
_PROGRAMS = [
    (lambda t: t.softmax(-1), _softmax),
    (lambda t: (t * 2 + 1).sum(0), lambda x: (x * 2 + 1).sum(0)),
    (lambda t: t.var(-1), lambda x: x.var(-1, ddof=1)),
    (lambda t: (t - t.mean()).exp().max(1), lambda x: np.exp(x - x.mean()).max(1)),
]


def test_threads_mixed_structures_vs_numpy():
    """4 threads x 100 realizes of 4 structures on their own inputs: zero wrong results."""
    wrong: list = []

    def work(tid: int) -> None:
        g = np.random.default_rng(tid)
        for i in range(100):
            x = g.standard_normal((48, 64)).astype(np.float32)
            f, ref = _PROGRAMS[(i + tid) % len(_PROGRAMS)]
            got = f(Tensor(x)).numpy()
            if not np.allclose(got, ref(x.astype(np.float64)), rtol=1e-4, atol=1e-5):
                wrong.append((tid, i))

    assert not _run_threads(work)
    assert wrong == []


def test_threads_softmax_race():
    """Regression: 4 threads realizing softmax of their own 256x256 input 60 times each got 139 of 240 wrong,
    because the cached plan shared its temp arrays between concurrent calls."""
    wrong: list = []

    def work(tid: int) -> None:
        x = np.random.default_rng(100 + tid).standard_normal((256, 256)).astype(np.float32) * (tid + 1)
        ref = _softmax(x.astype(np.float64))
        for i in range(60):
            got = Tensor(x).softmax(-1).numpy()
            if not np.allclose(got, ref, rtol=1e-4, atol=1e-6):
                wrong.append((tid, i))

    assert not _run_threads(work)
    assert wrong == []


def test_threads_build_one_plan_per_key(monkeypatch):
    """Threads racing on a new structure build its plan once (the others wait for it)."""
    # an empty plan cache of its own: after a long test run the shared one is full and stops growing
    monkeypatch.setattr(realize, "_plans", OrderedDict())
    n0 = len(realize._plans)
    got: list = []
    built: list = []
    make_plan = realize.make_plan

    def counting(*a, **kw):
        built.append(1)
        return make_plan(*a, **kw)

    monkeypatch.setattr(realize, "make_plan", counting)

    def work(tid: int) -> None:
        x = np.full((7, 13), tid, np.float32)
        got.append(((Tensor(x) * 3.5).exp2().sum(1).numpy(), tid))

    assert not _run_threads(work, 4)
    assert len(realize._plans) == n0 + 1 and len(built) == 1
    for v, tid in got:
        np.testing.assert_allclose(v, np.full(7, 13 * 2.0 ** (3.5 * tid)), rtol=1e-6)


def test_pool_reuses_storage_after_warmup():
    """After one warm-up step a repeated computation takes no new memory from the system (no pool misses)."""
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    for _ in range(2):
        Tensor(x).softmax(-1).numpy()
    misses = pool.misses
    for _ in range(10):
        Tensor(x).softmax(-1).numpy()
    assert pool.misses == misses


def test_threads_train_two_models():
    """Two threads each train their own MLP with AdamW (one plan per step); each equals the same training run
    alone in this thread."""
    g = np.random.default_rng(5)
    data = [(g.standard_normal((16, 20)).astype(np.float32), g.integers(0, 5, 16).astype(np.int32)) for _ in range(6)]

    def model(seed: int):  # built in the main thread: the random generator is global
        Tensor.manual_seed(seed)
        return Linear(20, 12), Linear(12, 5)

    def train(l1, l2) -> list[np.ndarray]:
        opt = AdamW(parameters([l1, l2]), lr=1e-2)
        for x, y in data:
            loss = l2(l1(Tensor(x)).relu()).cross_entropy(Tensor(y))
            opt.zero_grad()
            loss.backward(opt.params)
            opt.step(loss)
        return [p.numpy() for p in parameters([l1, l2])]

    ref = {s: train(*model(s)) for s in (1, 2)}
    models = {s: model(s) for s in (1, 2)}
    got: dict = {}
    assert not _run_threads(lambda tid: got.__setitem__(tid + 1, train(*models[tid + 1])), 2)
    for s in (1, 2):
        for a, b in zip(ref[s], got[s], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)

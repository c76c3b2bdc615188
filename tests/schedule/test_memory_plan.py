"""The memory planner: temps whose live ranges do not overlap share storage, and results stay right."""

from __future__ import annotations

import numpy as np

from uopc.engine.realize import default_opt
from uopc.kernelize import make_plan
from uopc.nn import AdamW, Linear, parameters
from uopc.opt import HandOpt
from uopc.runtime import machine
from uopc.schedule import RefKind
from uopc.tensor import Tensor


def _check_no_overlap(plan) -> None:
    """Two temps that share bytes of the arena are never both live in one kernel."""
    spans = {}
    for ki, k in enumerate(plan.kernels):
        for ref in k.refs:
            if ref.kind is RefKind.TMP:
                a, b = spans.get(ref.i, (ki, ki))
                spans[ref.i] = (min(a, ki), max(b, ki))
    for t, tmp in enumerate(plan.temps):
        lo, hi = plan.temp_offsets[t], plan.temp_offsets[t] + tmp.size * tmp.dtype.itemsize
        assert hi <= plan.arena_bytes and lo % 64 == 0
        for u, tmp2 in enumerate(plan.temps[:t]):
            lo2, hi2 = plan.temp_offsets[u], plan.temp_offsets[u] + tmp2.size * tmp2.dtype.itemsize
            if lo < hi2 and lo2 < hi:  # they share bytes: their live ranges must be disjoint
                (a, b), (c, e) = spans[t], spans[u]
                assert b < c or e < a, (t, u, spans[t], spans[u])


def test_softmax_plan_temps():
    # cut at every reduce (no optimizer: Chapter 7's kernels), softmax's row max and row sum are both read by the
    # last kernel: nothing can share, both stay
    x = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32)
    plan, _ = make_plan([Tensor(x).softmax(-1).uop])
    assert len(plan.temps) == 2 and plan.arena_bytes == plan.temp_bytes == 2 * 64 * 4
    _check_no_overlap(plan)
    # the optimizer computes both per row inside the one kernel that writes the result: no temporaries at all
    plan, _ = make_plan([Tensor(x).softmax(-1).uop], opt=HandOpt(machine()))  # (make test's OPT=0 pass has none)
    assert [k.name for k in plan.kernels] == ["r_64_96"] and plan.temps == () and plan.arena_bytes == 0
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(Tensor(x).softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_mnist_training_plan_shares_temps():
    """The MNIST MLP training step (784-128-10, batch 128, AdamW): the arena is smaller than the temps' sum."""
    Tensor.manual_seed(0)
    l1, l2 = Linear(784, 128), Linear(128, 10)
    opt = AdamW(parameters([l1, l2]), lr=1e-3)
    g = np.random.default_rng(0)
    x = Tensor(g.standard_normal((128, 784)).astype(np.float32))
    y = Tensor(g.integers(0, 10, 128).astype(np.int32))
    loss = l2(l1(x).relu()).cross_entropy(y)
    opt.zero_grad()
    loss.backward(opt.params)
    plan, _ = make_plan([t.uop for t in opt._updates()] + [loss.uop], opt=default_opt())
    assert plan.arena_bytes < plan.temp_bytes
    _check_no_overlap(plan)
    print(f"MNIST training plan: {len(plan.temps)} temps, {plan.temp_bytes} -> {plan.arena_bytes} bytes")


def test_debug_prints_temp_bytes(context, capsys):
    context(DEBUG=1, OPT=0)  # softmax in three kernels: its row max and row sum are temporaries
    Tensor(np.ones((8, 8), np.float32)).softmax(-1).realize()
    assert "temps 128 -> 128 bytes" in capsys.readouterr().out

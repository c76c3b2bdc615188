"""The training step as the kernelizer sees it: the MLP training schedule, and no recompiles after step 2.

A training step (forward, backward, optimizer update, loss) is one realize; from the second step on, its graph has
the same structure as the step before, so the structural cache answers and gcc is never called again.
"""

from __future__ import annotations

import numpy as np
import pytest

from uopc.engine import realize
from uopc.kernelize import make_plan
from uopc.nn import SGD, AdamW, Linear, parameters
from uopc.runtime import compiler as runtime
from uopc.tensor import Tensor


def test_chapter_7_12_schedule(context, monkeypatch):
    context(OPT=0)
    X = Tensor.randn(32, 64).realize()  # random numbers are lazy: computed here, so the plan below is the step
    W = Tensor.randn(64, 10, requires_grad=True).realize()
    loss = (X @ W).relu().square().mean()
    loss.backward([W])
    plan, _ = make_plan([loss.uop, W.grad.uop])
    # forward matmul (shared by loss and gradient), sum of squares, the 1/320 scale, the gradient matmul
    # X^T @ dL/dh with the relu and square derivatives fused in, and the copy into W's (64, 10) layout
    assert [k.name for k in plan.kernels] == ["r_32_10", "r_1", "e_1", "r_10_64", "e_64_10"]


def test_adamw_steps_reuse_one_plan():  # NOTES 17
    Tensor.manual_seed(0)
    lin = Linear(4, 2)
    opt = AdamW([lin.weight, lin.bias], lr=1e-2)
    x = Tensor(np.random.randn(8, 4).astype(np.float32))

    def step():
        loss = lin(x).square().mean()
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss)

    step()
    step()
    n = len(realize._plans)
    for _ in range(3):
        step()
    assert len(realize._plans) == n  # no new plans: nothing recompiled


@pytest.mark.parametrize(
    "opt_cls,kw",
    [(AdamW, {"lr": 1e-3}), (SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-4})],
)
def test_no_plan_or_compile_after_step_two(opt_cls, kw, monkeypatch):
    calls = []
    real = realize.realize
    monkeypatch.setattr(realize, "realize", lambda *a, **k: calls.append(1) or real(*a, **k))
    Tensor.manual_seed(0)
    g = np.random.default_rng(0)
    l1, l2 = Linear(20, 16), Linear(16, 5)
    opt = opt_cls(parameters([l1, l2]), **kw)
    seen = []
    for i in range(6):
        X = Tensor(g.standard_normal((16, 20)).astype(np.float32))  # fresh data every step: new buffers
        Y = Tensor(g.integers(0, 5, 16).astype(np.int32))
        loss = l2(l1(X).relu()).cross_entropy(Y)
        calls.clear()
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss)
        loss.item()  # already computed by the step: no second realize
        assert len(calls) == 1  # the whole step (grads, updates, loss) is one realize
        if i == 3:
            opt.lr = opt.lr * 0.5  # a schedule changes data, not structure
        seen.append((len(realize._plans), runtime.stats["compiles"]))
    assert seen[2:] == [seen[1]] * 4  # after step 2: no plan built, nothing compiled

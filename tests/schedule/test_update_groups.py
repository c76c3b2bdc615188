"""Updates one kernel stores together (uopc.schedule.groups): an optimizer step's per-parameter updates, and what
keeps roots apart."""

from __future__ import annotations

import numpy as np
import pytest

from uopc.engine.lower import make_plan
from uopc.engine.realize import default_opt
from uopc.helpers import Context
from uopc.nn import SGD, AdamW
from uopc.tensor import Tensor

SHAPES = ((300, 70), (70,), (5, 3))


def _params(rng: np.random.Generator) -> list[Tensor]:
    return [Tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True) for s in SHAPES]


def _plan(roots: list[Tensor], opt: int):
    with Context(OPT=opt):
        plan, _ = make_plan([r.uop for r in roots], opt=default_opt())
    return plan


def _step_plan(make_optimizer, opt: int):
    """The plan of one step of a fresh optimizer over fresh parameters with gradients (its updates are assigns: an
    optimizer whose updates were asked for once would apply them twice)."""
    rng = np.random.default_rng(9)
    ps = _params(rng)
    for p in ps:
        p.grad = Tensor(rng.standard_normal(p.shape).astype(np.float32))
    return _plan(make_optimizer(ps)._updates(), opt)


@pytest.mark.parametrize("opt", [0, 1])
def test_an_adamw_step_stores_each_parameters_m_v_and_update_in_one_kernel(opt):
    # with an optimizer, each parameter's m, v and p are one kernel (3 outputs); at OPT=0, Chapter 7's cut, three
    # kernels. Then 3 steps against NumPy's AdamW in float64: rtol 1e-5 (float32 updates)
    plan = _step_plan(lambda ps: AdamW(ps, lr=0.05, weight_decay=0.1), opt)
    grouped = [k for k in plan.kernels if k.op.startswith("3 updates")]
    assert len(grouped) == (len(SHAPES) if opt else 0), [(k.name, k.op) for k in plan.kernels]
    assert len(plan.kernels) == 1 + (1 if opt else 3) * len(SHAPES)  # (+ the step count's kernel)
    rng = np.random.default_rng(0)
    ps = _params(rng)
    adam = AdamW(ps, lr=0.05, weight_decay=0.1)
    w = [p.numpy().astype(np.float64) for p in ps]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    for t in range(1, 4):
        grads = [rng.standard_normal(p.shape).astype(np.float32) for p in ps]
        for p, g in zip(ps, grads, strict=True):
            p.grad = Tensor(g)
        with Context(OPT=opt):
            adam.step()
        for i, g in enumerate(grads):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g.astype(np.float64) ** 2
            mh, vh = m[i] / (1 - 0.9**t), v[i] / (1 - 0.999**t)
            w[i] = w[i] * (1 - 0.05 * 0.1) - 0.05 * mh / (np.sqrt(vh) + 1e-8)
    for p, want, mi, mo in zip(ps, w, m, adam.m, strict=True):
        np.testing.assert_allclose(p.numpy(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mo.numpy(), mi, rtol=1e-5, atol=1e-7)


def test_momentum_sgd_stores_the_buffer_and_the_parameter_in_one_kernel():
    # buf = momentum * buf + g; p -= lr * (g + momentum * buf) (Nesterov): two updates of each parameter, one
    # kernel. reference: NumPy float64, 2 steps, rtol 1e-6
    plan = _step_plan(lambda ps: SGD(ps, lr=0.1, momentum=0.9, nesterov=True), 1)
    assert [k.op.split(",")[0] for k in plan.kernels] == ["2 updates"] * len(SHAPES), [k.op for k in plan.kernels]
    rng = np.random.default_rng(1)
    ps = _params(rng)
    sgd = SGD(ps, lr=0.1, momentum=0.9, nesterov=True)
    w = [p.numpy().astype(np.float64) for p in ps]
    buf = [np.zeros_like(x) for x in w]
    for _ in range(2):
        grads = [rng.standard_normal(p.shape).astype(np.float32) for p in ps]
        for p, g in zip(ps, grads, strict=True):
            p.grad = Tensor(g)
        sgd.step()
        for i, g in enumerate(grads):
            buf[i] = 0.9 * buf[i] + g
            w[i] = w[i] - 0.1 * (g + 0.9 * buf[i])
    for p, want in zip(ps, w, strict=True):
        np.testing.assert_allclose(p.numpy(), want, rtol=1e-6, atol=1e-6)


def test_roots_that_read_no_common_data_or_each_other_through_a_view_stay_apart():
    # a and b read nothing in common; c reads a transposed (not at its own index): three kernels. d reads x, as a
    # does, at its own index: it joins a. reference: NumPy, rtol 1e-6, atol 1e-6 (mul-add contracts to an FMA)
    rng = np.random.default_rng(2)
    xn, yn = (rng.standard_normal((32, 32)).astype(np.float32) for _ in range(2))
    x, y = Tensor(xn), Tensor(yn)
    a = x * 2
    b = y * 3
    c = a.T + 1
    assert len(_plan([a, b, c], 1).kernels) == 3
    plan = _plan([a, x * 5 + 1], 1)
    assert [k.op for k in plan.kernels] == ["2 updates, mul add"]
    d = x * 5 + 1
    Tensor.realize_all(a, b, c, d)
    np.testing.assert_allclose(c.numpy(), xn.T * 2 + 1, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(d.numpy(), xn * 5 + 1, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(a.numpy(), xn * 2)
    np.testing.assert_array_equal(b.numpy(), yn * 3)


def test_roots_whose_reads_walk_their_elements_differently_stay_apart():
    # a walks x in order (one loop of 1024), b walks it transposed (32 x 32 loops): the loops one suits are not the
    # other's (HandOpt.group), so two kernels, though both read x. reference: NumPy, rtol 1e-6, atol 1e-6
    rng = np.random.default_rng(5)
    xn = rng.standard_normal((32, 32)).astype(np.float32)
    x = Tensor(xn)
    a, b = x * 2, x.T * 3 + 1
    assert [k.op for k in _plan([a, b], 1).kernels] == ["elementwise mul", "elementwise mul add"]
    Tensor.realize_all(a, b)
    np.testing.assert_array_equal(a.numpy(), xn * 2)
    np.testing.assert_allclose(b.numpy(), xn.T * 3 + 1, rtol=1e-6, atol=1e-6)


def test_a_group_that_reads_an_input_reversed_does_not_write_that_input_in_place():
    # x.assign(x * 2) grouped with b = x.flip(0) * 3 + 1 (one loop each, so one kernel), which reads the old x
    # across the kernel's elements: x's new value may not go into x's storage while b still reads it
    # (uopc.engine.realize.inplace_ok). reference: NumPy
    rng = np.random.default_rng(3)
    xn = rng.standard_normal(4096).astype(np.float32)
    x = Tensor(xn.copy())
    x.realize()
    b = x.flip(0) * 3 + 1
    assert [k.op for k in _plan([b, x * 2], 1).kernels] == ["2 updates, mul add"]
    x.assign(x * 2)
    Tensor.realize_all(b, x)
    np.testing.assert_allclose(b.numpy(), xn[::-1] * 3 + 1, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(x.numpy(), xn * 2)

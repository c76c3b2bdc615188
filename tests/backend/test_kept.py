"""Kept kernels: a kernel that computes a temp only from inputs its plan does not write (a weight packed into the
microkernel's panels) runs once per change of those inputs, not per call (uopc.engine.realize.invariant_kernels).

Every test changes a weight some way uopc can write it and checks the next result against NumPy: a kept temp that
outlived its weight's change would give the old weight's product.
"""

import threading

import numpy as np
import pytest

from uopc import Tensor, helpers
from uopc.engine import realize
from uopc.engine.jit import TinyJit
from uopc.nn.optim import SGD
from uopc.runtime.buffer import buffer_data
from uopc.runtime.compiler import machine
from uopc.uop import base_buffer

rng = np.random.default_rng(0)
# B (the weight, transposed) larger than half of L2, so the layout pass packs it (uopc.opt.gemm.pack_matmuls)
N = max(256, machine().l2_bytes // (4 * 256)) // 16 * 16
K = 256


def _w() -> np.ndarray:
    return rng.standard_normal((N, K)).astype(np.float32)


def _x(m: int = 32) -> np.ndarray:
    return rng.standard_normal((m, K)).astype(np.float32)


def _ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.maximum(x @ w.T, 0)


def _check(y: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    np.testing.assert_allclose(y, _ref(x, w), rtol=1e-4, atol=1e-4)


def _runs() -> dict[str, int]:
    """A kernel hook counting the calls of each kernel that ran (a skipped kept kernel reports nothing)."""
    counts: dict[str, int] = {}

    def hook(k, dt):
        counts[k.op] = counts.get(k.op, 0) + 1

    realize.set_kernel_hook(hook)
    return counts


@pytest.fixture(autouse=True)
def _no_hook():
    yield
    realize.set_kernel_hook(None)


def test_a_packed_weight_is_packed_once_and_the_product_stays_right():
    if helpers.settings().OPT < 1:
        pytest.skip("packing is the optimizer's layout pass (OPT=0 has none)")
    wn = _w()
    w = Tensor(wn)
    counts = _runs()
    for _ in range(4):
        x = _x()
        _check((Tensor(x) @ w.T).relu().numpy(), x, wn)
    assert counts.get("copy") == 1, counts  # the pack ran on the first call only
    # the product (with or without its relu as an epilogue, as the optimizer decides) ran on every call
    assert sum(n for op, n in counts.items() if op.startswith("matmul")) == 4, counts


def test_a_step_that_updates_its_weight_in_place_packs_it_every_call():
    if helpers.settings().OPT < 1:  # (a product is never kept: KEPT_REDUCTION)
        pytest.skip("packing is the optimizer's layout pass (OPT=0 has none)")
    w = Tensor(_w(), requires_grad=True)
    opt = SGD([w], lr=0.1)
    x = Tensor(_x())

    @TinyJit
    def step():
        opt.zero_grad()
        loss = (x @ w.T).relu().sum()
        loss.backward()
        opt.step()
        return loss

    ran: dict[str, int] = {}
    realize.set_kernel_hook(lambda k, dt: ran.__setitem__(id(k), ran.get(id(k), 0) + 1))
    with Tensor.train():
        for _ in range(5):
            step()
    kept = [(c, i) for c in step._calls for i in c.cp.kept.kernels]
    assert kept  # the forward's pack of w is a kept kernel of its plan
    assert any(up.in_place for c in step._calls for up in c.updates)  # the replays write w's storage
    for c, i in kept:  # ... and still runs on every call of its plan: w changed since the last
        calls = max(ran.get(id(k), 0) for j, k in enumerate(c.cp.kernels) if j not in c.cp.kept.kernels)
        assert calls >= 4 and ran[id(c.cp.kernels[i])] == calls


def test_an_in_place_update_by_a_replayed_step_invalidates_the_kept_pack():
    """Inference and training alternate: the training plan writes the weight in place (TinyJit), the inference
    plan's kept pack of the old weight must not be reused."""
    w = Tensor(_w(), requires_grad=True)
    opt = SGD([w], lr=0.05)
    xt = Tensor(_x())

    @TinyJit
    def step():
        opt.zero_grad()
        (xt @ w.T).relu().sum().backward()
        opt.step()

    @TinyJit
    def infer(x):
        return (x @ w.T).relu()

    for _ in range(4):
        with Tensor.train():
            step()
        x = _x()
        _check(infer(Tensor(x)).numpy(), x, w.numpy())


def test_a_host_write_through_a_handed_out_view_is_seen():
    wn = _w()
    w = Tensor(wn).realize()
    view = buffer_data(base_buffer(w.uop))  # a NumPy view of uopc's storage: whoever holds it may write it
    x = _x()
    _check((Tensor(x) @ w.T).relu().numpy(), x, wn)
    view[:] = (2 * wn).reshape(-1)
    _check((Tensor(x) @ w.T).relu().numpy(), x, 2 * wn)


def test_an_assign_and_a_new_weight_are_seen():
    wn = _w()
    w = Tensor(wn)
    x = _x()
    _check((Tensor(x) @ w.T).relu().numpy(), x, wn)
    w2 = _w()
    w.assign(Tensor(w2)).realize()
    _check((Tensor(x) @ w.T).relu().numpy(), x, w2)
    w3 = _w()
    _check((Tensor(x) @ Tensor(w3).T).relu().numpy(), x, w3)  # the same plan, another weight buffer


def test_two_threads_with_two_weights_share_one_plan():
    ws = [_w(), _w()]
    ts = [Tensor(w).realize() for w in ws]
    x = _x()
    (Tensor(x) @ ts[0].T).relu().numpy()  # build the plan once
    errors: list[BaseException] = []

    def work(j: int) -> None:
        try:
            for _ in range(6):
                _check((Tensor(x) @ ts[j].T).relu().numpy(), x, ws[j])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(j,)) for j in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_the_steady_state_skips_every_pack_and_still_sees_a_change():
    """Once a call finds every kept temp valid, the next calls on the same inputs at the same versions skip the
    kept kernels in one comparison (a decode step keeps ~50): no pack runs, and an assign, a second weight or a
    host write afterwards is still seen."""
    if helpers.settings().OPT < 1:
        pytest.skip("packing is the optimizer's layout pass (OPT=0 has none)")
    wn = _w()
    w = Tensor(wn).realize()
    x = _x()
    f = lambda: (Tensor(x) @ w.T).relu().numpy()
    for _ in range(3):
        _check(f(), x, wn)
    counts = _runs()
    for _ in range(3):
        _check(f(), x, wn)
    assert counts and "copy" not in counts, counts  # the pack was skipped every time
    w2 = _w()
    w.assign(Tensor(w2)).realize()
    _check(f(), x, w2)
    _check(f(), x, w2)
    buffer_data(base_buffer(w.uop))[:] = (2 * w2).reshape(-1)
    _check(f(), x, 2 * w2)
    _check((Tensor(x) @ Tensor(wn).T).relu().numpy(), x, wn)


def test_a_new_input_each_call_leaves_the_weights_packs_skipped_in_one_comparison():
    """A kept kernel of the call's own input (its scaled copy, packed for the product) runs every call, as a new
    input each call makes it; the weight's pack is skipped through the steady state of the inputs that stayed the
    same (one comparison, not a key per kept kernel: ResNet-18 keeps ~40), and a change of the weight is still seen."""
    if helpers.settings().OPT < 1:
        pytest.skip("packing is the optimizer's layout pass (OPT=0 has none)")
    wn = _w()
    w = Tensor(wn).realize()

    def f(x):
        return ((Tensor(x) * 2 + 1) @ w.T).relu().numpy()

    for _ in range(2):
        x = _x(96)
        _check(f(x), 2 * x + 1, wn)
    kept = next(cp.kept for cp in reversed(realize._plans.values()) if cp.kept)
    scale, pack = [kept.plan.kernels[i].name for i in kept.kernels]  # the input's kernel, the weight's pack
    runs: list[str] = []
    realize.set_kernel_hook(lambda k, dt: runs.append(k.name))
    for _ in range(3):
        x = _x(96)
        _check(f(x), 2 * x + 1, wn)
    assert runs.count(scale) == 3 and pack not in runs, runs
    # the steady state covers the weight's pack and leaves the input's kernel to its own check
    assert kept.steady is not None and [kept.kernels[n] for n in kept.steady.rest] == [kept.kernels[0]]
    w2 = _w()
    w.assign(Tensor(w2)).realize()
    x = _x(96)
    runs.clear()
    _check(f(x), 2 * x + 1, w2)
    assert runs.count(pack) == 1, runs
    buffer_data(base_buffer(w.uop))[:] = (2 * w2).reshape(-1)
    for _ in range(2):
        x = _x(96)
        _check(f(x), 2 * x + 1, 2 * w2)

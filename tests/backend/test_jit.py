"""TinyJit: capture on the 2nd call, replay later calls; bit-exact against unjitted steps; in-place state."""

from __future__ import annotations

import math

import numpy as np
import pytest

from uopc import TinyJit
from uopc.nn import SGD, AdamW, LayerNorm, Linear, parameters
from uopc.runtime import compiler as runtime
from uopc.runtime.buffer import buffer_ptr, pool
from uopc.tensor import Tensor
from uopc.uop import base_buffer


def _mlp(seed: int = 0, hidden: int = 32):
    Tensor.manual_seed(seed)
    l1, l2 = Linear(784, hidden), Linear(hidden, 10)
    return l1, l2


def _data(n: int, batch: int = 16):
    g = np.random.default_rng(1)
    return [
        (g.standard_normal((batch, 784)).astype(np.float32), g.integers(0, 10, batch).astype(np.int32))
        for _ in range(n)
    ]


def _trainer(opt_cls=AdamW, **kw):
    l1, l2 = _mlp()
    opt = opt_cls(parameters([l1, l2]), **kw)

    def step(x: Tensor, y: Tensor) -> Tensor:
        loss = l2(l1(x).relu()).cross_entropy(y)
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss)
        return loss

    return step, opt, [l1, l2]


def test_jit_mnist_adamw_20_steps_bit_exact():
    """20 jitted AdamW steps equal 20 unjitted ones bit for bit (same thread count, same plans)."""
    runtime.set_num_threads(2)
    data = _data(20)
    plain, _, m_plain = _trainer(lr=1e-3)
    jitted, _, m_jit = _trainer(lr=1e-3)
    jstep = TinyJit(jitted)
    for x, y in data:
        l_a = plain(Tensor(x), Tensor(y)).numpy()
        l_b = jstep(Tensor(x), Tensor(y)).numpy()
        assert np.array_equal(l_a, l_b)
    assert jstep.cnt == 2
    for a, b in zip(parameters(m_plain), parameters(m_jit), strict=True):
        assert np.array_equal(a.numpy(), b.numpy())


def test_jit_replay_writes_state_in_place_and_takes_no_new_memory():
    step, opt, model = _trainer(lr=1e-3)
    jstep = TinyJit(step)
    data = _data(3)
    for x, y in data * 2:
        jstep(Tensor(x), Tensor(y))
    state = [*parameters(model), *opt.m, *opt.v, opt._t]
    ptrs = [buffer_ptr(base_buffer(t.uop)) for t in state]
    misses = pool.misses
    for x, y in data * 2:
        jstep(Tensor(x), Tensor(y)).numpy()
    # every parameter, moment and the step count is updated where it lies
    assert [buffer_ptr(base_buffer(t.uop)) for t in state] == ptrs
    assert pool.misses == misses  # after warm-up a step takes no new memory from the system
    assert opt.t == 12


def test_jit_lr_change_and_cosine_schedule():
    """A changed opt.lr reaches the replayed plan; a cosine schedule under the JIT equals it without."""
    data = _data(8)
    runs = []
    for use_jit in (False, True):
        step, opt, model = _trainer(SGD, lr=0.1, momentum=0.9)
        f = TinyJit(step) if use_jit else step
        losses = []
        for i, (x, y) in enumerate(data):
            opt.lr = 0.05 * (1 + math.cos(math.pi * i / len(data)))
            losses.append(f(Tensor(x), Tensor(y)).item())
        runs.append((losses, [p.numpy() for p in parameters(model)]))
    assert runs[0][0] == runs[1][0]
    for a, b in zip(runs[0][1], runs[1][1], strict=True):
        assert np.array_equal(a, b)
    # lr = 0 under replay: the parameters stop changing
    step, opt, model = _trainer(SGD, lr=0.1)
    jstep = TinyJit(step)
    for x, y in data[:3]:
        jstep(Tensor(x), Tensor(y))
    opt.lr = 0.0
    before = model[0].weight.numpy()
    jstep(Tensor(data[3][0]), Tensor(data[3][1]))
    assert np.array_equal(model[0].weight.numpy(), before)
    opt.lr = 0.1
    jstep(Tensor(data[4][0]), Tensor(data[4][1]))
    assert not np.array_equal(model[0].weight.numpy(), before)


def test_jit_returned_tensors_stay_valid():
    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return (a * b + 1).sum(1)

    outs, refs = [], []
    for i in range(5):
        a, b = np.full((3, 4), i, np.float32), np.ones((3, 4), np.float32)
        outs.append(f(Tensor(a), Tensor(b)))
        refs.append((a * b + 1).sum(1))
    for o, r in zip(outs, refs, strict=True):
        np.testing.assert_allclose(o.numpy(), r, rtol=0, atol=0)


def test_jit_writes_a_dropped_result_again_and_never_one_still_held():
    # a replay writes its output into the last replay's when nothing holds that any more (no new pool storage);
    # a result still held as a tensor, read by a lazy graph or seen by a NumPy view keeps its values
    f = TinyJit(lambda a: (a * 2).realize())
    x = Tensor(np.arange(16, dtype=np.float32))
    f(x), f(x)
    slot = lambda t: base_buffer(t.uop).arg.slot  # noqa: E731  (the BUFFER's identity, without holding it)
    held = f(x)
    other = f(Tensor(np.ones(16, np.float32)))
    assert slot(other) != slot(held)
    last = slot(other)
    del other
    again = f(x)
    assert slot(again) == last  # dropped: its storage written again
    lazy = again + 1
    del again
    third = f(Tensor(np.full(16, 5, np.float32)))
    assert slot(third) != last
    view = third.numpy()  # a copy: the tensor may go
    del third
    misses = pool.misses
    fourth = f(x)
    assert pool.misses == misses
    np.testing.assert_array_equal(held.numpy(), np.arange(16) * 2)
    np.testing.assert_array_equal(lazy.numpy(), np.arange(16) * 2 + 1)
    np.testing.assert_array_equal(view, np.full(16, 10))
    np.testing.assert_array_equal(fourth.numpy(), np.arange(16) * 2)


def test_jit_replays_an_assign_it_does_not_return():
    """A step that assigns into a tensor it neither returns nor realizes (a KV cache written at a position given
    as a tensor): the capture realizes the assign with the step, so every replay writes it."""
    L, D = 8, 4
    cache = Tensor(np.zeros((L, D), np.float32)).realize()
    ref = np.zeros((L, D), np.float32)

    @TinyJit
    def write(row: Tensor, pos: Tensor) -> Tensor:
        cache.assign(cache.scatter(0, pos.reshape(1, 1).expand(1, D), row))
        return cache.sum()

    for p in range(6):
        row = np.full((1, D), p + 1, np.float32)
        ref[p] = row[0]
        total = write(Tensor(row), Tensor(np.array([p], np.int32)))
        assert total.numpy() == ref.sum()
        np.testing.assert_array_equal(cache.numpy(), ref)


def test_jit_signature_change_raises():
    @TinyJit
    def f(a: Tensor, k: float) -> Tensor:
        return (a * k).realize()

    f(Tensor(np.ones(4, np.float32)), 2.0)
    f(Tensor(np.ones(4, np.float32)), 2.0)
    with pytest.raises(ValueError, match=r"argument 0 is Tensor\(shape=\(5,\), dtype=float32\).*shape=\(4,\)"):
        f(Tensor(np.ones(5, np.float32)), 2.0)
    with pytest.raises(ValueError, match=r"argument 1 is float 3.0, but the captured call had float 2.0"):
        f(Tensor(np.ones(4, np.float32)), 3.0)
    with pytest.raises(ValueError, match=r"argument 0 is Tensor\(shape=\(4,\), dtype=int32\)"):
        f(Tensor(np.ones(4, np.int32)), 2.0)
    f.reset()
    np.testing.assert_array_equal(f(Tensor(np.ones(5, np.float32)), 3.0).numpy(), np.full(5, 3.0))


def test_assign_keeps_old_value_for_held_lazy_graph():
    """A lazy graph the user holds that reads p's old value keeps seeing it, jitted or not."""
    p = Tensor(np.arange(6, dtype=np.float32))

    @TinyJit
    def bump() -> None:
        p.assign(p + 1).realize()

    for _ in range(3):
        bump()  # run, capture, replay
    np.testing.assert_array_equal(p.numpy(), np.arange(6) + 3)
    old = p * 10  # lazy: reads p's current buffer
    bump()
    np.testing.assert_array_equal(p.numpy(), np.arange(6) + 4)
    np.testing.assert_array_equal(old.numpy(), (np.arange(6) + 3) * 10)
    ptr = buffer_ptr(base_buffer(p.uop))
    bump()  # nothing else holds p's buffer now: written in place
    assert buffer_ptr(base_buffer(p.uop)) == ptr
    np.testing.assert_array_equal(p.numpy(), np.arange(6) + 5)
    q = Tensor(np.zeros(6, np.float32))
    held = q * 1
    q.assign(q + 7).realize()  # unjitted
    np.testing.assert_array_equal(held.numpy(), np.zeros(6))
    np.testing.assert_array_equal(q.numpy(), np.full(6, 7))


class _Block:
    """A small pre-LayerNorm transformer block (causal attention + GELU MLP), as in examples/gpt.py."""

    def __init__(self, dim: int = 16, heads: int = 2):
        self.heads = heads
        self.ln1, self.ln2 = LayerNorm(dim), LayerNorm(dim)
        self.qkv, self.proj = Linear(dim, 3 * dim), Linear(dim, dim)
        self.fc, self.out = Linear(dim, 4 * dim), Linear(4 * dim, dim)

    def __call__(self, x: Tensor, mask: Tensor) -> Tensor:
        B, T, C = x.shape
        hd = C // self.heads
        h = self.ln1(x)
        q, k, v = (t.reshape(B, T, self.heads, hd).permute(0, 2, 1, 3) for t in self.qkv(h).split(C, dim=2))
        att = ((q @ k.transpose(-1, -2)) * (1 / math.sqrt(hd)) + mask).softmax(-1) @ v
        x = x + self.proj(att.permute(0, 2, 1, 3).reshape(B, T, C))
        return x + self.out(self.fc(self.ln2(x)).gelu())


def test_jit_gpt_block_adamw_bit_exact():
    """8 jitted AdamW steps of a transformer block equal 8 unjitted ones bit for bit."""
    runtime.set_num_threads(2)
    g = np.random.default_rng(3)
    data = [(g.standard_normal((2, 8, 16)).astype(np.float32), g.standard_normal((2, 8, 16)).astype(np.float32))]
    data = data * 8
    mask = np.triu(np.full((8, 8), -np.inf, np.float32), 1)
    results = []
    for use_jit in (False, True):
        Tensor.manual_seed(0)
        block = _Block()
        opt = AdamW(parameters(block), lr=1e-2)

        def step(x: Tensor, y: Tensor, block=block, opt=opt) -> Tensor:
            loss = (block(x, Tensor(mask)) - y).square().mean()
            opt.zero_grad()
            loss.backward(opt.params)
            opt.step(loss)
            return loss

        f = TinyJit(step) if use_jit else step
        losses = [f(Tensor(x), Tensor(y)).item() for x, y in data]
        results.append((losses, [p.numpy() for p in parameters(block)]))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1], results[1][1], strict=True):
        assert np.array_equal(a, b)


def test_jit_keyword_tensors_bind_by_name():
    @TinyJit
    def f(a: Tensor, *, scale: Tensor, shift: Tensor) -> Tensor:
        return a * scale + shift

    for i in range(4):
        a, sc, sh = (np.full(3, v, np.float32) for v in (i, 2.0, i * 10.0))
        # the keywords in a different order on every other call: they bind by name
        out = (
            f(Tensor(a), shift=Tensor(sh), scale=Tensor(sc))
            if i % 2
            else f(Tensor(a), scale=Tensor(sc), shift=Tensor(sh))
        )
        np.testing.assert_array_equal(out.numpy(), a * sc + sh)


def test_jit_notices_training_and_no_grad_changes():
    """Dropout's graph depends on Tensor.training and tracking on no_grad: a capture made in one mode refuses to
    replay in the other (as it refuses another shape), naming the mode."""
    x = Tensor(np.ones((4, 8), np.float32))
    f = TinyJit(lambda t: (t.dropout(0.5) * 2).sum())
    with Tensor.train():
        for _ in range(3):
            got = f(x).item()
            assert got in {2.0 * k * 2 for k in range(33)}  # kept elements are scaled by 1/(1-p) = 2
    with pytest.raises(ValueError, match="Tensor.training is bool False, but the captured call had bool True"):
        f(x)
    g = TinyJit(lambda t: t * 3)
    for _ in range(3):
        g(x)
    with Tensor.test(), pytest.raises(ValueError, match="Tensor.no_grad"):
        g(x)
    f.reset()
    for _ in range(3):  # captured again outside training: dropout is the identity
        assert f(x).item() == 64.0

"""What `assign` means, jitted and not (issue: in-place writes with defined semantics, no reference counts).

(a) a lazy graph that read `w` before `w.assign(...)` realizes to the old value, wherever it was built;
(b) a NumPy view of uopc storage (buffer_data) is never overwritten, and the pool never reuses its storage;
and TinyJit replays write an assigned tensor in place when nothing else reads its storage.
"""

import gc

import numpy as np

from uopc import Tensor, dtypes
from uopc.engine import realize
from uopc.engine.jit import TinyJit
from uopc.nn import AdamW, Linear, parameters
from uopc.runtime.buffer import buffer_data, buffer_ptr, new_buffer, pool
from uopc.uop import base_buffer, read_only_by, track


def _ptr(t: Tensor) -> int:
    return buffer_ptr(base_buffer(t.uop))


def _bump_step(p: Tensor) -> TinyJit:
    @TinyJit
    def bump() -> None:
        p.assign(p * 2 + 1).realize()

    return bump


def test_replay_writes_in_place_when_nothing_else_reads():
    p = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))  # a RESHAPE over its BUFFER
    bump, ref = _bump_step(p), np.arange(12, dtype=np.float32).reshape(3, 4)
    ptrs = []
    for _ in range(6):
        bump()
        ref = ref * 2 + 1
        ptrs.append(_ptr(p))
    np.testing.assert_array_equal(p.numpy(), ref)
    assert len(set(ptrs[2:])) == 1, "replays 3..6 must write into one storage"


def test_lazy_graph_built_outside_the_step_keeps_the_old_value():
    p = Tensor(np.ones((2, 3), np.float32))
    early = p + 100  # lazy, built before the step ever ran
    bump = _bump_step(p)
    for _ in range(4):
        bump()
    between = p * 10  # lazy, built between two replays
    bump()
    np.testing.assert_array_equal(p.numpy(), np.full((2, 3), 63.0))
    np.testing.assert_array_equal(early.numpy(), np.full((2, 3), 101.0))
    np.testing.assert_array_equal(between.numpy(), np.full((2, 3), 310.0))


def test_unjitted_assign_keeps_the_old_value_for_lazy_graphs():
    w = Tensor(np.arange(4, dtype=np.float32))
    old = w * 3
    w.assign(w + 1).realize()
    again = w * 3
    w.assign(w + 1).realize()
    np.testing.assert_array_equal(old.numpy(), np.arange(4) * 3)
    np.testing.assert_array_equal(again.numpy(), (np.arange(4) + 1) * 3)
    np.testing.assert_array_equal(w.numpy(), np.arange(4) + 2)


def test_another_tensor_on_the_same_storage_keeps_its_value():
    p = Tensor(np.zeros(5, np.float32))
    bump = _bump_step(p)
    for _ in range(3):
        bump()
    alias = Tensor(p.uop)  # shares p's storage view (a realized tensor, not a graph)
    snapshot = p.numpy()
    bump()
    np.testing.assert_array_equal(alias.numpy(), snapshot)
    np.testing.assert_array_equal(p.numpy(), snapshot * 2 + 1)
    del alias
    gc.collect()
    ptr = _ptr(p)
    bump()  # the alias is gone: in place again
    assert _ptr(p) == ptr


def test_numpy_view_is_never_overwritten_nor_reused():
    p = Tensor(np.full(64, 5.0, np.float32))
    bump = _bump_step(p)
    for _ in range(3):
        bump()
    view = buffer_data(base_buffer(p.uop))  # views p's storage
    before = view.copy()
    for _ in range(3):
        bump()
    np.testing.assert_array_equal(view, before)
    np.testing.assert_array_equal(p.numpy(), ((before * 2 + 1) * 2 + 1) * 2 + 1)
    p.assign(Tensor(np.zeros(64, np.float32))).realize()  # the viewed buffer dies now
    gc.collect()
    fresh = [new_buffer(dtypes.float32, 64, np.full(64, -1.0, np.float32)) for _ in range(8)]
    assert all(buffer_ptr(b) != view.ctypes.data for b in fresh)
    np.testing.assert_array_equal(view, before)


def test_pool_reuses_storage_nobody_views():
    b = new_buffer(dtypes.float32, 1000, np.zeros(1000, np.float32))
    addr = buffer_ptr(b)
    hits = pool.hits
    del b
    gc.collect()
    c = new_buffer(dtypes.float32, 1000)
    assert buffer_ptr(c) == addr and pool.hits == hits + 1


def test_adamw_replays_update_every_state_tensor_in_place():
    Tensor.manual_seed(0)
    model = Linear(8, 4)
    opt = AdamW(parameters(model), lr=1e-2)
    x, y = Tensor(np.ones((3, 8), np.float32)), Tensor(np.zeros((3, 4), np.float32))

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        loss = (model(x) - y).square().mean()
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss)
        return loss

    losses = [step(x, y).item() for _ in range(3)]
    state = [t for t in (*opt.params, *opt.m, *opt.v)]
    ptrs = [_ptr(t) for t in state]
    losses += [step(x, y).item() for _ in range(3)]
    assert [_ptr(t) for t in state] == ptrs
    assert losses == sorted(losses, reverse=True)


def test_read_only_by_sees_every_kind_of_reader():
    b = new_buffer(dtypes.float32, 6, np.zeros(6, np.float32))
    assert not read_only_by(b, None)  # untracked storage: its readers are unknown, so never "only"
    track(b)
    t = Tensor(b.reshape((2, 3)))
    assert read_only_by(t.uop, t)
    graph = t.uop * 2  # a node built on the view
    assert not read_only_by(t.uop, t)
    del graph
    assert read_only_by(t.uop, t)
    direct = b.reshape((3, 2))  # another view of the same BUFFER
    assert not read_only_by(t.uop, t)
    del direct
    other = Tensor(t.uop)  # another tensor holding the view
    assert not read_only_by(t.uop, t)
    other.hold(b.reshape((6,)))  # rebound: it reads b through another view still
    assert not read_only_by(t.uop, t)
    del other
    assert read_only_by(t.uop, t)


def test_only_assigned_storage_is_tracked():
    """Readers are recorded only on an assign's storage realized under a TinyJit capture, from its birth: building
    on other buffers, or on an assign realized eagerly (nothing consults its readers), costs nothing."""
    x = Tensor(np.ones(4, np.float32))
    y = (x + 1).realize()
    assert not base_buffer(x.uop).tracked and not base_buffer(y.uop).tracked
    w = Tensor(np.zeros(4, np.float32))
    w.assign(w + 1).realize()
    assert not base_buffer(w.uop).tracked
    with realize.capture():
        w.assign(w + 1).realize()
    assert base_buffer(w.uop).tracked and read_only_by(w.uop, w)
    lazy = w * 2
    assert not read_only_by(w.uop, w)
    np.testing.assert_array_equal(lazy.numpy(), np.full(4, 4.0))


def test_a_masked_update_in_place_writes_only_the_selected_rows_and_is_right_either_way():
    """p.assign(where(row == r, v, p)) (a KV cache's write at a position): rendered as a store of the selected
    elements plus a copy of the others that only runs when the output is not the input's storage; correct in place
    (TinyJit's replays) and out of place (the first calls, and a plan whose output is fresh storage)."""
    rows, cols = 8, 16
    p = Tensor(np.zeros((rows, cols), np.float32)).realize()
    ref = np.zeros((rows, cols), np.float32)
    at = Tensor(np.arange(rows, dtype=np.int32)).reshape(rows, 1)

    @TinyJit
    def put(v: Tensor, r: Tensor) -> None:
        p.assign((at == r.reshape(1, 1)).where(v.reshape(1, cols), p)).realize()

    before = set(realize._plans)
    ptrs = []
    for i in range(rows):
        v = np.full(cols, i + 1, np.float32)
        ref[i] = v
        put(Tensor(v), Tensor(np.array([i], np.int32)))
        np.testing.assert_array_equal(p.numpy(), ref)
        ptrs.append(_ptr(p))
    assert len(set(ptrs[2:])) == 1  # the replays write in place
    src = "".join(cp.src for key, cp in realize._plans.items() if key not in before)
    assert "else if ((void*)data" in src, "the masked update is not a predicated store"

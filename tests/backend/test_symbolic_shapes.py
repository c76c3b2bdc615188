"""Symbolic shapes (uopc.uop.variable): one plan for every value of a Variable, loops that run to the value bound.

Every test runs at OPT=0, 1 and 2 (the fixture below), and make test's second pass runs them all again with every index
checked (UOPC_CHECK_OOB=1): the values are compared with NumPy or PyTorch for each value the Variable can take."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from uopc import Tensor, TinyJit, Variable
from uopc.engine import realize
from uopc.engine.lower import make_plan
from uopc.helpers import Context
from uopc.runtime import compiler
from uopc.uop import Ops

rng = np.random.default_rng(15)


@pytest.fixture(autouse=True, params=[0, 1, 2], ids=lambda o: f"OPT={o}")
def opt_level(request):
    with Context(OPT=request.param):
        yield request.param


def _counts() -> tuple[frozenset, int]:
    """The plan cache's keys (not its size: the cache is bounded, and a long test process fills it) and compiles."""
    return frozenset(realize._plans), compiler.stats["compiles"]


def test_a_variable_bound_across_its_whole_range_uses_one_plan():
    """Reductions over a symbolic axis (sum, max, mean, var), elementwise ops and a reduce along a fixed axis of a
    symbolic-shaped value, for every value 1..max; after the first value nothing new is built or compiled."""
    n_max = 13  # prime: a split of the axis by any factor would show at some value
    v = Variable("rows", 1, n_max)
    a = rng.standard_normal((n_max, 7)).astype(np.float32)
    x = Tensor(a)
    seen = []
    for n in range(1, n_max + 1):
        y = x[: v.bind(n)]
        assert y.shape == (v, 7)
        got = [(y * 2 + 1).numpy(), y.sum(0).numpy(), y.max(0).numpy(), y.mean(0).numpy(), y.exp().sum(1).numpy()]
        want = [a[:n] * 2 + 1, a[:n].sum(0), a[:n].max(0), a[:n].mean(0), np.exp(a[:n]).sum(1)]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        if n > 1:
            np.testing.assert_allclose(y.var(0).numpy(), a[:n].var(0, ddof=1), rtol=1e-4, atol=1e-6)
        seen.append(_counts())
    assert len(set(seen[2:])) == 1, f"plans or compiles grew with the value: {seen}"


def test_matmuls_and_softmax_over_a_symbolic_axis():
    """Attention at one query: q @ k[:n].T, softmax over the n keys, @ v[:n] (a product reducing over n), and a
    product with n rows, against PyTorch for values across the range."""
    n_max, d = 40, 16
    v = Variable("keys", 1, n_max)
    k, val = (rng.standard_normal((1, 2, n_max, d)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((1, 2, 1, d)).astype(np.float32)
    w = rng.standard_normal((d, 24)).astype(np.float32)
    kt, vt = Tensor(k), Tensor(val)
    for n in (1, 2, 7, 16, 33, 40):
        b = v.bind(n)
        out = Tensor(q).scaled_dot_product_attention(kt[:, :, :b], vt[:, :, :b]).numpy()
        ref = torch.nn.functional.scaled_dot_product_attention(
            torch.tensor(q), torch.tensor(k[:, :, :n]), torch.tensor(val[:, :, :n])
        )
        np.testing.assert_allclose(out, ref.numpy(), rtol=1e-5, atol=1e-5)
        rows = (kt[0, 0, :b] @ Tensor(w)).numpy()
        np.testing.assert_allclose(rows, k[0, 0, :n] @ w, rtol=1e-5, atol=1e-5)


def test_convolutions_over_a_symbolic_batch():
    """A 3x3 convolution with 16 output channels over the first n images, at stride 1 (the padded input read in
    place) and 2 (the positions as the GEMM's rows: a symbolic batch stays a dim of its own, not merged into them),
    and a depthwise one."""
    v = Variable("images", 1, 3)
    a = rng.standard_normal((3, 3, 9, 10)).astype(np.float32)
    w = rng.standard_normal((16, 3, 3, 3)).astype(np.float32)
    x, wt = Tensor(a), Tensor(w)
    for n in (1, 3):
        for stride in (1, 2):
            out = x[: v.bind(n)].conv2d(wt, stride=stride, padding=1).numpy()
            ref = torch.nn.functional.conv2d(torch.tensor(a[:n]), torch.tensor(w), stride=stride, padding=1)
            np.testing.assert_allclose(out, ref.numpy(), rtol=1e-5, atol=1e-5)
            # depthwise (a direct loop over each output's window; at stride 1 its rows in vectors)
            wd = rng.standard_normal((3, 1, 3, 3)).astype(np.float32)
            out = x[: v.bind(n)].conv2d(Tensor(wd), stride=stride, padding=1, groups=3).numpy()
            ref = torch.nn.functional.conv2d(torch.tensor(a[:n]), torch.tensor(wd), stride=stride, padding=1, groups=3)
            np.testing.assert_allclose(out, ref.numpy(), rtol=1e-5, atol=1e-5)


def test_tinyjit_replays_with_each_new_value():
    """A jitted step takes the Variable bound as an argument: the replay runs the captured plan with the new value,
    builds no graph and compiles nothing; the result has the symbolic shape and the new value's elements."""
    n_max = 24
    v = Variable("pos", 1, n_max)
    table = rng.standard_normal((n_max, 8)).astype(np.float32)
    t = Tensor(table)
    calls = []

    @TinyJit
    def step(x: Tensor, n) -> Tensor:
        calls.append(1)
        return (t[:n] * x).softmax(0).realize()

    counts = []
    for n in range(1, n_max + 1):
        x = rng.standard_normal(8).astype(np.float32)
        out = step(Tensor(x), v.bind(n))
        assert out.shape == (v, 8)
        np.testing.assert_allclose(out.numpy(), torch.softmax(torch.tensor(table[:n] * x), 0).numpy(), rtol=1e-5)
        counts.append(_counts())
    assert len(calls) == 2, "the step's Python ran after the capture"
    assert len(set(counts[2:])) == 1


def test_a_bound_value_indexes_a_table():
    """Tensor(v.bind(n)) is the value as data: a table row taken at n - 1 (a decode step's position embedding). The
    index is proven in range from the Variable's, so it is not checked; the autotuner (OPT=2) must not time that
    kernel with no value to pass (it read a stray register and segfaulted), and indexing keeps the binding."""
    n_max = 4096
    v = Variable("pos", 1, n_max)
    table = rng.standard_normal((n_max, 64)).astype(np.float32)
    t = Tensor(table)
    step = TinyJit(lambda n: (t[Tensor(n) - 1] * 2).realize())
    for n in (1, 7, n_max, 5):
        np.testing.assert_allclose(step(v.bind(n)).numpy(), table[n - 1] * 2)


def test_binding_outside_the_range_raises_before_anything_runs():
    v = Variable("n", 2, 9)
    with pytest.raises(ValueError, match=r"\[2, 9\]"):
        v.bind(1)
    with pytest.raises(ValueError, match=r"\[2, 9\]"):
        v.bind(10)
    with pytest.raises(TypeError):
        v.bind(3.0)
    t = Tensor(np.ones(9, np.float32))[: v.bind(4)]
    np.testing.assert_array_equal((t + Tensor(v.bind(4))).numpy(), np.full(4, 5, np.float32))  # a value, too
    with pytest.raises(ValueError, match="bound to 4 and to 3"):  # one value per computation
        t + Tensor(v.bind(3))
    with pytest.raises(ValueError, match="bound to no value"):
        (Tensor(np.ones(9, np.float32))[:v] + 1).numpy()


def test_plans_key_on_the_variable_and_its_range_not_its_value():
    """Two values share a plan; another range, or another name, is another plan (its C differs in its bounds)."""
    x = Tensor(rng.standard_normal(16).astype(np.float32))
    a, b = Variable("n", 1, 16), Variable("n", 1, 8)
    np.testing.assert_allclose(x[: a.bind(3)].sum().numpy(), x.numpy()[:3].sum(), rtol=1e-6)
    plans = set(realize._plans)
    np.testing.assert_allclose(x[: a.bind(11)].sum().numpy(), x.numpy()[:11].sum(), rtol=1e-6)
    assert set(realize._plans) <= plans  # no new key (the bounded cache may have dropped an old one)
    np.testing.assert_allclose(x[: b.bind(3)].sum().numpy(), x.numpy()[:3].sum(), rtol=1e-6)
    assert len(set(realize._plans) - plans) == 1
    assert a != b and a != 16 and hash(a) != hash(16) and Variable("n", 1, 16) == a


def test_an_index_check_at_the_bound():
    """A gather along a symbolic axis is checked against the value bound (not the maximum): the last element is
    read, one past it raises IndexError after the kernel, and a negative index counts from the value."""
    v = Variable("n", 1, 8)
    a = np.arange(24, dtype=np.float32).reshape(8, 3)
    x = Tensor(a)[: v.bind(5)]
    np.testing.assert_array_equal(x[Tensor(np.array([0, 4], np.int32))].numpy(), a[[0, 4]])
    np.testing.assert_array_equal(x[Tensor(np.array([-1], np.int32))].numpy(), a[[4]])
    with pytest.raises(IndexError, match="size 5"):
        x[Tensor(np.array([5], np.int32))].numpy()
    full = Tensor(a)[: v.bind(8)]  # at the maximum: every element, no index error under UOPC_CHECK_OOB
    np.testing.assert_array_equal((full * 1).numpy(), a)


def test_the_index_width_follows_the_maximum():
    """A view as large as 2^31 elements at the Variable's maximum gets 64-bit index arithmetic, whatever the value
    bound (nothing that large is allocated: the view is an expand)."""
    v = Variable("rows", 1, 1 << 29)
    x = Tensor(np.ones((1, 8), np.float32)).expand(v, 8).sum(1)
    plan, _ = make_plan([x.uop])
    (kernel,) = plan.kernels
    ranges = [u for u in kernel.ast.toposort() if u.op is Ops.RANGE]
    assert ranges and all(r.dtype.itemsize == 8 for r in ranges)
    small = Tensor(np.ones((1, 8), np.float32)).expand(Variable("rows", 1, 64), 8).sum(1)
    plan, _ = make_plan([small.uop])
    assert all(r.dtype.itemsize == 4 for r in plan.kernels[0].ast.toposort() if r.op is Ops.RANGE)
    np.testing.assert_array_equal(x._bound({v: 3}).numpy(), np.full(3, 8, np.float32))


def test_shape_rules_name_the_problem():
    v = Variable("n", 1, 6)
    x = Tensor(np.ones((6, 4), np.float32))[: v.bind(2)]
    with pytest.raises(ValueError, match="symbolic dim must stay a dim of its own"):
        x.reshape(-1)
    with pytest.raises(ValueError, match="symbolic dim cannot be padded"):
        x.pad(((0, 1), None))
    with pytest.raises(ValueError, match="symbolic dim cannot be flipped"):
        x.flip(0)
    with pytest.raises(ValueError, match="cannot be broadcast"):
        x + Tensor(np.ones((6, 4), np.float32))
    with pytest.raises(TypeError, match="a shape must be ints"):
        Tensor.zeros(v, 4)
    with pytest.raises(ValueError, match="bound to 2 and to 3"):
        x + Tensor(np.ones((6, 4), np.float32))[: v.bind(3)]
    with pytest.raises(ValueError, match="symbolic size"):
        x[:] = 1.0
    with pytest.raises(ValueError, match="identifier"):
        Variable("not a name", 1, 4)
    with pytest.raises(ValueError, match="max >= 2"):
        Variable("n", 0, 1)
    assert x.reshape(1, v, 2, 2).shape == (1, v, 2, 2)  # splitting the fixed dims around it is fine
    np.testing.assert_array_equal(x.reshape(1, v, 2, 2).numpy(), np.ones((1, 2, 2, 2), np.float32))


SYMBOLIC_CHILD = """
import json, sys, numpy as np
from uopc import Tensor, Variable
from uopc.engine import lower as lowering
v = Variable("n", 1, 32)
x = Tensor(np.arange(64, dtype=np.float32).reshape(32, 2) / 10)
out = [x[: v.bind(n)].softmax(0).numpy().tolist() for n in (int(a) for a in sys.argv[1:])]
print(json.dumps({"lowered": lowering.lowered_stats["misses"], "out": out}))
"""


def test_a_plan_store_entry_serves_another_process_and_value(tmp_path, opt_level):
    """The persisted plan (its Variables pickled with it) is read by a second process, which binds other values."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "UOPC_CACHE": str(tmp_path),
        "OPT": str(opt_level),
    }

    def child(*ns: int) -> dict:
        p = subprocess.run(
            [sys.executable, "-c", SYMBOLIC_CHILD, *map(str, ns)], env=env, capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.strip().splitlines()[-1])

    first, second = child(3), child(5, 32)
    assert first["lowered"] > 0 and second["lowered"] == 0
    a = np.arange(64, dtype=np.float32).reshape(32, 2) / 10
    for n, got in zip((5, 32), second["out"], strict=True):
        np.testing.assert_allclose(got, torch.softmax(torch.tensor(a[:n]), 0).numpy(), rtol=1e-5)

"""The scheduler's staging rules (uopc.schedule.fusion): what a value read by several kernels costs stored against
recomputed. Kernel counts under the hand optimizer for this machine's record; values against NumPy."""

from __future__ import annotations

import numpy as np

from uopc.kernelize import make_plan
from uopc.opt import HandOpt
from uopc.runtime import machine
from uopc.schedule.fusion import read_staged
from uopc.tensor import Tensor
from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes

rng = np.random.default_rng(0)


def r(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_a_relus_comparison_is_not_stored_apart_from_its_value():
    """relu(a + b) read by two reductions: each recomputes it (an add, a compare, a select per element, reading a
    and b). Storing the compare alone (a bool, one byte) saves neither read, since the select reads a + b as well:
    it once made two more kernels, the compare's and then a + b's (read by three)."""
    a, b = r(96, 80), r(96, 80)
    z = (Tensor(a) + Tensor(b)).relu()
    s, m = z.sum(0), z.max(1)
    plan, _ = make_plan([s.uop, m.uop], opt=HandOpt(machine()))
    assert len(plan.kernels) == 2, [k.name for k in plan.kernels]
    assert all(t.dtype is not dtypes.bool for t in plan.temps), plan.temps
    ref = np.maximum(a + b, 0)
    Tensor.realize_all(s, m)
    np.testing.assert_allclose(s.numpy(), ref.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.numpy(), ref.max(1), rtol=1e-6)


def test_a_stored_value_is_read_stored_by_every_reader():
    """v is stored for one reader (contiguous(), as a convolution stores its input); another reader of v reads that
    buffer instead of recomputing v from x (as many bytes read, less work): read_staged."""
    x = Tensor(r(32, 48))
    v = x * 2.0 + 1.0
    roots = [v.contiguous().sum().uop, (v + 3.0).uop]
    out = read_staged(roots)
    adds = [u for u in UOp(Ops.SINK, tuple(out)).toposort() if u.op is Ops.ADD and u.shape == (32, 48)]
    outer = next(u for u in adds if any(s.op is Ops.CONST and s.arg == 3.0 for s in u.src))
    assert any(s.op is Ops.STAGE for s in outer.src), outer.pretty(3)
    # a value computed from smaller inputs only (a broadcast) is cheaper recomputed than read: left alone
    w = Tensor(r(1, 48)).expand(32, 48) * 2.0
    roots = [w.contiguous().sum().uop, (w + 3.0).uop]
    assert read_staged(roots) == roots

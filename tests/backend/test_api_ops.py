"""The API-breadth ops (math.py, extras.py, scan.py) against PyTorch: forward values and gradients.

Tolerances: float32 results within rtol 1e-5 / atol 1e-6 of PyTorch unless a row says otherwise (erf-based rows use
Abramowitz-Stegun 7.1.26, |error| <= 1.5e-7 absolute, so they get atol 1e-6); gradients within 1e-4.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from uopc import Tensor, dtypes

rng = np.random.default_rng(0)


def _data(domain: str, shape=(3, 7)) -> np.ndarray:
    if domain == "unit":  # (-1, 1), away from the ends
        return rng.uniform(-0.95, 0.95, shape).astype(np.float32)
    if domain == "pos1":  # > 1
        return rng.uniform(1.05, 4, shape).astype(np.float32)
    if domain == "pos":
        return rng.uniform(0.05, 4, shape).astype(np.float32)
    x = rng.normal(0, 2, shape).astype(np.float32)
    x[0, :3] = [1e-6, -1e-5, 0.0] if shape[1] >= 3 else x[0, :3]
    return x


# name, uopc fn, torch fn, input domain, atol
UNARY = [
    ("asin", lambda t: t.asin(), torch.asin, "unit", 1e-6),
    ("acos", lambda t: t.acos(), torch.acos, "unit", 1e-6),
    ("atan", lambda t: t.atan(), torch.atan, "any", 1e-6),
    ("sinh", lambda t: t.sinh(), torch.sinh, "any", 1e-5),
    ("cosh", lambda t: t.cosh(), torch.cosh, "any", 1e-5),
    ("asinh", lambda t: t.asinh(), torch.asinh, "any", 1e-6),
    ("acosh", lambda t: t.acosh(), torch.acosh, "pos1", 1e-6),
    ("atanh", lambda t: t.atanh(), torch.atanh, "unit", 1e-6),
    ("log10", lambda t: t.log10(), torch.log10, "pos", 1e-6),
    ("log1p", lambda t: t.log1p(), torch.log1p, "unit", 1e-7),
    ("expm1", lambda t: t.expm1(), torch.expm1, "any", 1e-6),
    ("erf", lambda t: t.erf(), torch.erf, "any", 1e-6),
    ("gelu", lambda t: t.gelu(), F.gelu, "any", 1e-6),
    ("gelu_tanh", lambda t: t.gelu(approximate="tanh"), lambda x: F.gelu(x, approximate="tanh"), "any", 1e-6),
    ("quick_gelu", lambda t: t.quick_gelu(), lambda x: x * torch.sigmoid(1.702 * x), "any", 1e-6),
    ("elu", lambda t: t.elu(), F.elu, "any", 1e-6),
    ("elu_a", lambda t: t.elu(0.5), lambda x: F.elu(x, 0.5), "any", 1e-6),
    ("selu", lambda t: t.selu(), F.selu, "any", 1e-6),
    ("celu", lambda t: t.celu(0.7), lambda x: F.celu(x, 0.7), "any", 1e-6),
    ("mish", lambda t: t.mish(), F.mish, "any", 1e-6),
    ("swish", lambda t: t.swish(), F.silu, "any", 1e-6),
    ("hardswish", lambda t: t.hardswish(), F.hardswish, "any", 1e-6),
    ("hardsigmoid", lambda t: t.hardsigmoid(), F.hardsigmoid, "any", 1e-6),
    ("hardtanh", lambda t: t.hardtanh(), F.hardtanh, "any", 1e-6),
    ("relu6", lambda t: (t * 3).relu6(), lambda x: F.relu6(x * 3), "any", 1e-6),
    ("softsign", lambda t: t.softsign(), F.softsign, "any", 1e-6),
    ("logsigmoid", lambda t: t.logsigmoid(), F.logsigmoid, "any", 1e-6),
    ("softmin", lambda t: t.softmin(1), lambda x: F.softmin(x, 1), "any", 1e-6),
    ("round", lambda t: (t * 2).round(), lambda x: torch.round(x * 2), "any", 0),
    ("cumsum", lambda t: t.cumsum(1), lambda x: torch.cumsum(x, 1), "any", 1e-5),
    ("cumsum0", lambda t: t.cumsum(0), lambda x: torch.cumsum(x, 0), "any", 1e-5),
    ("cumprod", lambda t: t.cumprod(1), lambda x: torch.cumprod(x, 1), "pos", 1e-4),
    ("cummax", lambda t: t.cummax(1), lambda x: torch.cummax(x, 1).values, "any", 0),
    ("cummin", lambda t: t.cummin(0), lambda x: torch.cummin(x, 0).values, "any", 0),
    ("logcumsumexp", lambda t: t.logcumsumexp(1), lambda x: torch.logcumsumexp(x, 1), "any", 1e-5),
    ("prod", lambda t: t.prod(1), lambda x: torch.prod(x, 1), "pos", 1e-4),
    ("prod_all", lambda t: (t * 0.5).prod(), lambda x: torch.prod(x * 0.5), "pos", 1e-4),
    ("sort", lambda t: t.sort(1)[0], lambda x: torch.sort(x, 1).values, "any", 0),
    (
        "sort_desc0",
        lambda t: t.sort(0, descending=True)[0],
        lambda x: torch.sort(x, 0, descending=True).values,
        "any",
        0,
    ),
    ("topk", lambda t: t.topk(3, 1)[0], lambda x: torch.topk(x, 3, 1).values, "any", 0),
    ("roll", lambda t: t.roll(2, 1), lambda x: torch.roll(x, 2, 1), "any", 0),
    ("roll2", lambda t: t.roll((1, -3), (0, 1)), lambda x: torch.roll(x, (1, -3), (0, 1)), "any", 0),
    ("roll_flat", lambda t: t.roll(5), lambda x: torch.roll(x, 5), "any", 0),
    ("unfold", lambda t: t.unfold(1, 3, 2), lambda x: x.unfold(1, 3, 2), "any", 0),
    ("unfold_big_step", lambda t: t.unfold(1, 2, 4), lambda x: x.unfold(1, 2, 4), "any", 0),
    ("unfold0", lambda t: t.unfold(0, 2, 1), lambda x: x.unfold(0, 2, 1), "any", 0),
    ("repeat_interleave", lambda t: t.repeat_interleave(3, 1), lambda x: x.repeat_interleave(3, 1), "any", 0),
    ("repeat_interleave_flat", lambda t: t.repeat_interleave(2), lambda x: x.repeat_interleave(2), "any", 0),
    ("var_mean", lambda t: t.var_mean(1)[0] + t.var_mean(1)[1], lambda x: sum(torch.var_mean(x, 1)), "any", 1e-5),
    ("std_mean", lambda t: t.std_mean(0)[0] * t.std_mean(0)[1], lambda x: math.prod(torch.std_mean(x, 0)), "any", 1e-5),
    ("pad_reflect", lambda t: t.pad((2, 1), mode="reflect"), lambda x: F.pad(x, (2, 1), mode="reflect"), "any", 0),
    (
        "pad_replicate",
        lambda t: t.pad((1, 3, 2, 0), mode="replicate"),
        lambda x: F.pad(x[None], (1, 3, 2, 0), mode="replicate")[0],
        "any",
        0,
    ),
    (
        "pad_circular",
        lambda t: t.pad((2, 2, 1, 1), mode="circular"),
        lambda x: F.pad(x[None, None], (2, 2, 1, 1), mode="circular")[0, 0],
        "any",
        0,
    ),
    (
        "pad_constant",
        lambda t: t.pad((1, 1), mode="constant", value=2.5),
        lambda x: F.pad(x, (1, 1), value=2.5),
        "any",
        0,
    ),
    ("lerp", lambda t: t.lerp(t * 2 + 1, 0.3), lambda x: torch.lerp(x, x * 2 + 1, 0.3), "any", 1e-6),
    ("fmod", lambda t: t.fmod(1.5), lambda x: torch.fmod(x, 1.5), "any", 1e-6),
    ("logaddexp", lambda t: t.logaddexp(t * 0.5), lambda x: torch.logaddexp(x, x * 0.5), "any", 1e-6),
    ("copysign", lambda t: (t + 3).copysign(t), lambda x: torch.copysign(x + 3, x), "any", 0),
    ("clone", lambda t: t.clone(), lambda x: x.clone(), "any", 0),
    ("diag_1d", lambda t: t[0].diag(), lambda x: torch.diag(x[0]), "any", 0),
    ("diag_2d", lambda t: t[:, :3].diag(), lambda x: torch.diag(x[:, :3]), "any", 0),
    ("layernorm", lambda t: t.layernorm(), lambda x: F.layer_norm(x, (7,)), "any", 1e-5),
    (
        "bce",
        lambda t: t.sigmoid().binary_crossentropy(Tensor(_Y)),
        lambda x: F.binary_cross_entropy(torch.sigmoid(x), torch.tensor(_Y)),
        "any",
        1e-5,
    ),
    (
        "bce_logits",
        lambda t: t.binary_crossentropy_logits(Tensor(_Y)),
        lambda x: F.binary_cross_entropy_with_logits(x, torch.tensor(_Y)),
        "any",
        1e-5,
    ),
    (
        "bce_logits_pw",
        lambda t: t.binary_crossentropy_logits(Tensor(_Y), pos_weight=Tensor(_PW)),
        lambda x: F.binary_cross_entropy_with_logits(x, torch.tensor(_Y), pos_weight=torch.tensor(_PW)),
        "any",
        1e-5,
    ),
    (
        "nll",
        lambda t: t.log_softmax(1).nll_loss(Tensor(_T)),
        lambda x: F.nll_loss(F.log_softmax(x, 1), torch.tensor(_T)),
        "any",
        1e-5,
    ),
    (
        "nll_w",
        lambda t: t.log_softmax(1).nll_loss(Tensor(_T), weight=Tensor(_W), ignore_index=2),
        lambda x: F.nll_loss(F.log_softmax(x, 1), torch.tensor(_T), weight=torch.tensor(_W), ignore_index=2),
        "any",
        1e-5,
    ),
    (
        "nll_none",
        lambda t: t.log_softmax(1).nll_loss(Tensor(_T), reduction="none"),
        lambda x: F.nll_loss(F.log_softmax(x, 1), torch.tensor(_T), reduction="none"),
        "any",
        1e-5,
    ),
    (
        "einsum_mm",
        lambda t: Tensor.einsum("ij,kj->ik", t, t * 2),
        lambda x: torch.einsum("ij,kj->ik", x, x * 2),
        "any",
        1e-4,
    ),
    ("einsum_sum", lambda t: Tensor.einsum("ij->j", t), lambda x: torch.einsum("ij->j", x), "any", 1e-5),
    ("einsum_implicit", lambda t: Tensor.einsum("ij,ij", t, t), lambda x: torch.einsum("ij,ij", x, x), "any", 1e-4),
    (
        "einsum_outer",
        lambda t: Tensor.einsum("i,j->ji", t[0], t[1]),
        lambda x: torch.einsum("i,j->ji", x[0], x[1]),
        "any",
        1e-5,
    ),
]
_Y = rng.uniform(0, 1, (3, 7)).astype(np.float32)
_PW = rng.uniform(0.5, 2, (7,)).astype(np.float32)
_T = np.array([1, 6, 2], np.int64)
_W = rng.uniform(0.5, 2, (7,)).astype(np.float32)


@pytest.mark.parametrize("name,fn,tfn,domain,atol", UNARY, ids=[r[0] for r in UNARY])
def test_forward_and_grad(name, fn, tfn, domain, atol):
    x = _data(domain)
    t = Tensor(x, requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    out, ref = fn(t), tfn(tx)
    w = rng.normal(size=ref.shape).astype(np.float32)
    (g,) = (out * Tensor(w)).sum().gradient(t)  # built before out is realized: realize drops the graph
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=atol)
    if name in ("round", "cummax", "cummin", "copysign"):  # piecewise-constant or select: checked separately
        return
    (ref * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(g.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_special_values():
    x = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.5, -2.5, 0.5, 1.5], np.float32)
    t, tx = Tensor(x), torch.tensor(x)
    for name in ("isnan", "isinf", "isfinite", "round"):
        np.testing.assert_array_equal(getattr(t, name)().numpy(), getattr(torch, name)(tx).numpy(), err_msg=name)
    np.testing.assert_array_equal(t.isinf(detect_negative=False).numpy(), torch.isposinf(tx).numpy())
    for name in ("atan", "erf", "sinh", "cosh", "expm1", "log1p", "asinh"):
        with np.errstate(all="ignore"):
            ref = getattr(torch, name)(tx).numpy()
        np.testing.assert_allclose(getattr(t, name)().numpy(), ref, rtol=1e-5, atol=1e-6, err_msg=name)
    i = Tensor([1, 2, 3])
    assert i.isnan().tolist() == [False] * 3 and i.isfinite().tolist() == [True] * 3


def test_any_all_and_names():
    x = np.array([[0, 1, 0], [0, 0, 0], [2, 3, 4]], np.int32)
    t, tx = Tensor(x), torch.tensor(x)
    np.testing.assert_array_equal(t.any(1).numpy(), tx.any(1).numpy())
    np.testing.assert_array_equal(t.all(1).numpy(), tx.all(1).numpy())
    np.testing.assert_array_equal(t.any(0, keepdim=True).numpy(), tx.any(0, keepdim=True).numpy())
    assert t.any().item() is True and t.all().item() is False
    assert t.eq(0).tolist() == (tx == 0).tolist() and t.ne(0).tolist() == (tx != 0).tolist()
    assert (t.bitwise_and(6).tolist(), t.bitwise_or(1).tolist()) == ((tx & 6).tolist(), (tx | 1).tolist())
    assert (t.bitwise_xor(3).tolist(), t.bitwise_not().tolist()) == ((tx ^ 3).tolist(), (~tx).tolist())
    assert t.element_size() == 4 and t.nbytes() == 36 and not t.is_floating_point() and t.short().dtype is dtypes.int16
    assert Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.0 + 1e-7])) and not Tensor([1.0]).allclose(Tensor([1.1]))
    np.testing.assert_array_equal(
        Tensor([1.0, np.nan, 2.0]).isclose(Tensor([1.0, np.nan, 3.0]), equal_nan=True).numpy(), [True, True, False]
    )


def test_shifts_and_int_fmod():
    x = np.array([-17, -8, -1, 0, 1, 7, 100, 2**30], np.int32)
    t, tx = Tensor(x), torch.tensor(x)
    for n in (0, 1, 3, 31):
        assert (t << n).tolist() == (tx << n).tolist(), n
        assert (t >> n).tolist() == (tx >> n).tolist(), n
    assert t.fmod(3).tolist() == torch.fmod(tx, 3).tolist()
    assert t.fmod(-5).tolist() == torch.fmod(tx, -5).tolist()
    with pytest.raises(TypeError):
        Tensor([1.0]) << 1


def test_sum_dtype_and_exact_int_prod():
    x = np.array([[3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]], np.int64)
    assert Tensor(x).prod().item() == int(np.prod(x))  # 7420738134810: beyond float32's exact range
    assert Tensor(x).prod(1, keepdim=True).tolist() == [[int(np.prod(x))]]
    assert Tensor([[2, 3], [4, 5]], dtype=dtypes.int8).prod(0).tolist() == [8, 15]
    assert Tensor([]).prod().item() == 1.0
    t = Tensor(np.full(1000, 0.1, np.float32))
    assert t.sum(dtype=dtypes.float64).dtype is dtypes.float64
    assert abs(t.sum(dtype=dtypes.float64).item() - 100.0000014901) < 1e-6
    assert Tensor([200, 100], dtype=dtypes.uint8).sum(dtype=dtypes.int32).item() == 300


def test_meshgrid_linspace():
    a, b = np.arange(3.0, dtype=np.float32), np.arange(4.0, dtype=np.float32)
    for ix in ("ij", "xy"):
        ours = Tensor.meshgrid(Tensor(a), Tensor(b), indexing=ix)
        ref = torch.meshgrid(torch.tensor(a), torch.tensor(b), indexing=ix)
        for o, r in zip(ours, ref, strict=True):
            np.testing.assert_array_equal(o.numpy(), r.numpy())
    for start, stop, n in ((0, 1, 5), (-3.5, 7.25, 11), (2, -2, 4), (1, 1, 1), (0, 1, 0)):
        np.testing.assert_allclose(
            Tensor.linspace(start, stop, n).numpy(), torch.linspace(start, stop, n).numpy(), rtol=1e-6, atol=1e-6
        )


def test_item_assignment():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    cases = [
        (0, 5.0),
        ((1, 2), -1.0),
        ((slice(1, 3), slice(None, None, 2)), np.array([[10, 20, 30], [40, 50, 60]], np.float32)),
        ((Ellipsis, -1), np.arange(4, dtype=np.float32)),
        ((slice(None, None, -2), 1), np.array([7, 8], np.float32)),
        (slice(2, 2), 1.0),
    ]
    for idx, val in cases:
        t, ref = Tensor(x), x.copy()  # NumPy as the reference: PyTorch has no negative slice steps
        t[idx] = val if np.isscalar(val) else Tensor(val)
        ref[idx] = val
        np.testing.assert_array_equal(t.numpy(), ref, err_msg=str(idx))
    t = Tensor(x)
    t[0] = 1.0
    assert "(lazy)" in repr(t)  # assignment is lazy: nothing ran
    with pytest.raises(TypeError):
        t[Tensor([0])] = 1.0
    with pytest.raises(IndexError):
        t[7] = 1.0


def test_repr_and_realize_many():
    assert repr(Tensor([[1.0, 2.0], [3.0, 4.0]])) == "Tensor([[1., 2.],\n        [3., 4.]], dtype=dtypes.f32)"
    lazy = Tensor([1.0, 2.0]) * 2
    assert repr(lazy) == "<Tensor shape=(2,) dtype=dtypes.f32 (lazy)>"
    assert "(lazy)" in repr(lazy)  # repr did not realize it
    big = Tensor(np.zeros(1000, np.float32))
    assert repr(big) == "<Tensor shape=(1000,) dtype=dtypes.f32>"
    a, b = Tensor([1.0]) + 1, Tensor([2.0]) + 1
    assert a.realize(b) is a
    assert "(lazy)" not in repr(b) and b.tolist() == [3.0]


def test_errors_are_clear():
    with pytest.raises(ValueError, match="approximate"):
        Tensor([1.0]).gelu(approximate="fast")
    with pytest.raises(ValueError, match="pad mode"):
        Tensor([1.0, 2.0]).pad((1, 1), mode="wrap")
    with pytest.raises(ValueError, match="reflect"):
        Tensor([1.0, 2.0]).pad((2, 0), mode="reflect")
    with pytest.raises(ValueError, match="einsum"):  # a trace needs a square pair of dims
        Tensor.einsum("ii->i", Tensor(np.ones((2, 3), dtype=np.float32)))
    with pytest.raises(ValueError, match="einsum"):
        Tensor.einsum("ij,jk->ik", Tensor(np.eye(2, dtype=np.float32)))


def test_masked_select_and_nonzero():
    x = rng.normal(size=(5, 6)).astype(np.float32)
    m = x > 0.3
    t, tx = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, ref = t.masked_select(Tensor(m)), tx.masked_select(torch.tensor(m))
    (g,) = (out * 3).sum().gradient(t)
    (ref * 3).sum().backward()
    np.testing.assert_array_equal(out.numpy(), ref.detach().numpy())
    np.testing.assert_array_equal(g.numpy(), tx.grad.numpy())
    row = m[1]  # broadcast over the rows, as PyTorch
    np.testing.assert_array_equal(Tensor(x).masked_select(Tensor(row)).numpy(), x[:, row].reshape(-1))
    i = rng.integers(-1, 2, (4, 3, 2)).astype(np.int32)
    np.testing.assert_array_equal(Tensor(i).nonzero().numpy(), torch.tensor(i).nonzero().numpy())
    assert Tensor(np.zeros(3, np.float32)).nonzero().shape == (0, 1)
    with pytest.raises(TypeError):
        Tensor(x).masked_select(Tensor(x))

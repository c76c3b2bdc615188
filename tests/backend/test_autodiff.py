"""Gradients: every differentiable Tensor op against central finite differences in float64 (and against torch
autograd where torch imports), the chapter's cases, accumulation, gradient(), detach, max ties, errors.

    GRAD_CASES row: (name, fn(*tensors) -> Tensor, input shapes, input domain)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from uopc.tensor import Tensor, autodiff
from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes

rng = np.random.default_rng(0)

# input domains: turn a standard-normal sample into one where the op is smooth
NORMAL = lambda x: x
POS = lambda x: np.abs(x) + 0.5  # sqrt, log, 1/x, x**1.5
SMALL = lambda x: 0.3 * x  # tan stays away from its poles
NONZERO = lambda x: np.where(np.abs(x) < 0.2, x + np.sign(x + 1e-9) * 0.3, x)  # abs, prod, sign kinks


def _pad_flat(a):
    return a.pad((1, 2, 0, 1))  # PyTorch's flat form: last dim (1, 2), then the first (0, 1)


GRAD_CASES = [
    # elementwise unary
    ("neg", lambda a: -a, [(3, 4)], NORMAL),
    ("reciprocal", lambda a: a.reciprocal(), [(3, 4)], POS),
    ("sqrt", lambda a: a.sqrt(), [(3, 4)], POS),
    ("rsqrt", lambda a: a.rsqrt(), [(3, 4)], POS),
    ("exp", lambda a: a.exp(), [(3, 4)], NORMAL),
    ("exp2", lambda a: a.exp2(), [(3, 4)], NORMAL),
    ("log", lambda a: a.log(), [(3, 4)], POS),
    ("log2", lambda a: a.log2(), [(3, 4)], POS),
    ("sin", lambda a: a.sin(), [(3, 4)], NORMAL),
    ("cos", lambda a: a.cos(), [(3, 4)], NORMAL),
    ("tan", lambda a: a.tan(), [(3, 4)], SMALL),
    ("sigmoid", lambda a: a.sigmoid(), [(3, 4)], NORMAL),
    ("tanh", lambda a: a.tanh(), [(3, 4)], NORMAL),
    ("relu", lambda a: a.relu(), [(3, 4)], NONZERO),
    ("leaky_relu", lambda a: a.leaky_relu(0.1), [(3, 4)], NONZERO),
    ("gelu", lambda a: a.gelu(approximate="tanh"), [(3, 4)], NORMAL),
    ("silu", lambda a: a.silu(), [(3, 4)], NORMAL),
    ("softplus", lambda a: a.softplus(), [(3, 4)], NORMAL),
    ("abs", lambda a: a.abs(), [(3, 4)], NONZERO),
    ("square", lambda a: a.square(), [(3, 4)], NORMAL),
    ("pow_int", lambda a: a**3, [(3, 4)], NORMAL),
    ("pow_float", lambda a: a**1.5, [(3, 4)], POS),
    ("rpow", lambda a: 3.0**a, [(3, 4)], NORMAL),
    ("clip", lambda a: a.clip(-0.5, 0.7), [(3, 4)], NONZERO),
    ("contiguous", lambda a: (a * 2).contiguous().sin(), [(3, 4)], NORMAL),
    # binary, with broadcasting (the gradient of a broadcast operand is summed)
    ("add", lambda a, b: a + b, [(3, 4), (4,)], NORMAL),
    ("sub", lambda a, b: a - b, [(3, 4), (3, 1)], NORMAL),
    ("mul", lambda a, b: a * b, [(3, 4), (3, 4)], NORMAL),
    ("div", lambda a, b: a / b, [(3, 4), (1, 4)], POS),
    ("pow_tensor", lambda a, b: a**b, [(3, 4), (3, 4)], POS),
    ("maximum", lambda a, b: a.maximum(b), [(3, 4), (3, 4)], NORMAL),
    ("minimum", lambda a, b: a.minimum(b), [(3, 4), (4,)], NORMAL),
    ("where", lambda a, b: (a > b).where(a * 2, b * b), [(3, 4), (3, 4)], NORMAL),
    ("matmul", lambda a, b: a @ b, [(3, 4), (4, 5)], NORMAL),
    ("matmul_batched", lambda a, b: a @ b, [(2, 3, 4), (4, 2)], NORMAL),
    ("matvec", lambda a, b: a @ b, [(3, 4), (4,)], NORMAL),
    # reductions
    ("sum_all", lambda a: a.sum(), [(3, 4)], NORMAL),
    ("sum_axis", lambda a: a.sum(1), [(3, 4)], NORMAL),
    ("sum_keepdim", lambda a: a.sum((0, 2), keepdim=True), [(2, 3, 4)], NORMAL),
    ("mean", lambda a: a.mean(0), [(3, 4)], NORMAL),
    ("var", lambda a: a.var(1), [(3, 4)], NORMAL),
    ("std", lambda a: a.std(0), [(3, 4)], NORMAL),
    ("max_axis", lambda a: a.max(1), [(3, 4)], NORMAL),
    ("max_all", lambda a: a.max(), [(3, 4)], NORMAL),
    ("min_axis", lambda a: a.min(0), [(3, 4)], NORMAL),
    ("prod", lambda a: a.prod(1), [(3, 4)], NONZERO),
    ("softmax", lambda a: a.softmax(-1), [(3, 4)], NORMAL),
    ("log_softmax", lambda a: a.log_softmax(0), [(3, 4)], NORMAL),
    ("logsumexp", lambda a: a.logsumexp(1), [(3, 4)], NORMAL),
    # movement
    ("reshape", lambda a: a.reshape(2, 6), [(3, 4)], NORMAL),
    ("permute", lambda a: a.permute(2, 0, 1), [(2, 3, 4)], NORMAL),
    ("transpose", lambda a: a.T, [(3, 4)], NORMAL),
    ("expand", lambda a: a.expand(2, 3, 4), [(3, 1)], NORMAL),
    ("pad", _pad_flat, [(3, 4)], NORMAL),
    ("shrink", lambda a: a.shrink(((1, 3), (0, 2))), [(3, 4)], NORMAL),
    ("flip", lambda a: a.flip(0, 1), [(3, 4)], NORMAL),
    ("getitem", lambda a: a[1:, ::2], [(3, 4)], NORMAL),
    ("cat", lambda a, b: Tensor.cat([a, b], dim=1), [(3, 4), (3, 2)], NORMAL),
    ("stack", lambda a, b: Tensor.stack([a, b], dim=1), [(3, 4), (3, 4)], NORMAL),
    ("repeat", lambda a: a.repeat(2, 1), [(3, 4)], NORMAL),
    ("squeeze_unsqueeze", lambda a: a.unsqueeze(1).squeeze(1).flatten(), [(3, 4)], NORMAL),
    # losses
    ("cross_entropy", lambda a: a.cross_entropy(Tensor(np.array([0, 3, 1], np.int32))), [(3, 4)], NORMAL),
]


def _inputs(shapes, domain, seed):
    r = np.random.default_rng(seed)
    return [domain(r.standard_normal(s)).astype(np.float64) for s in shapes]


def _weighted(fn, ts, w):
    """A scalar loss that sees every output element with its own weight, so a permuted gradient shows."""
    out = fn(*ts)
    return (out * Tensor(w)).sum() if out.shape else out * float(w)


def _finite_diff(fn, xs, w, eps=1e-6):
    """Central differences of the weighted loss in float64, computed with uopc's own forward pass."""
    grads = []
    for k, x in enumerate(xs):
        g = np.zeros_like(x)
        for i in range(x.size):
            vals = []
            for d in (eps, -eps):
                xp = [v.copy() for v in xs]
                xp[k].flat[i] += d
                vals.append(_weighted(fn, [Tensor(v) for v in xp], w).item())
            g.flat[i] = (vals[0] - vals[1]) / (2 * eps)
        grads.append(g)
    return grads


def _analytic(fn, xs, w):
    ts = [Tensor(x, requires_grad=True) for x in xs]
    _weighted(fn, ts, w).backward(ts)
    return [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("name,fn,shapes,domain", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_grad_matches_finite_differences(name, fn, shapes, domain):
    xs = _inputs(shapes, domain, seed=len(name))
    out_shape = fn(*[Tensor(x) for x in xs]).shape
    w = np.random.default_rng(1).uniform(0.5, 1.5, out_shape)
    for got, want in zip(_analytic(fn, xs, w), _finite_diff(fn, xs, w), strict=True):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # reference: central differences, eps 1e-6


# the same cases against torch autograd (float64); names whose torch spelling differs get their own function
def _torch_fns():
    import torch
    import torch.nn.functional as F

    return {
        "leaky_relu": lambda a: F.leaky_relu(a, 0.1),
        "gelu": lambda a: F.gelu(a, approximate="tanh"),
        "silu": F.silu,
        "softplus": F.softplus,
        "rpow": lambda a: 3.0**a,
        "contiguous": lambda a: (a * 2).contiguous().sin(),
        "where": lambda a, b: torch.where(a > b, a * 2, b * b),
        "sum_keepdim": lambda a: a.sum((0, 2), keepdim=True),
        "max_axis": lambda a: a.max(1).values,
        "min_axis": lambda a: a.min(0).values,
        "softmax": lambda a: a.softmax(-1),
        "log_softmax": lambda a: a.log_softmax(0),
        "pad": lambda a: F.pad(a, (1, 2, 0, 1)),
        "shrink": lambda a: a[1:3, 0:2],
        "flip": lambda a: a.flip((0, 1)),
        "cat": lambda a, b: torch.cat([a, b], dim=1),
        "stack": lambda a, b: torch.stack([a, b], dim=1),
        "cross_entropy": lambda a: F.cross_entropy(a, torch.tensor([0, 3, 1])),
        "clip": lambda a: a.clamp(-0.5, 0.7),
    }


@pytest.mark.parametrize("name,fn,shapes,domain", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_grad_matches_torch(name, fn, shapes, domain):
    torch = pytest.importorskip("torch")
    xs = _inputs(shapes, domain, seed=len(name))
    out_shape = fn(*[Tensor(x) for x in xs]).shape
    w = np.random.default_rng(1).uniform(0.5, 1.5, out_shape)
    tfn = _torch_fns().get(name, fn)
    ts = [torch.tensor(x, requires_grad=True) for x in xs]
    out = tfn(*ts)
    (out * torch.tensor(w)).sum().backward()
    for got, t in zip(_analytic(fn, xs, w), ts, strict=True):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-6, atol=1e-9)  # reference: torch autograd, f64


# ---------------------------------------------------------------------------------------------------
# chapter cases (float32 input, float64 NumPy finite differences)


def r(*s):
    return rng.standard_normal(s).astype(np.float32)


def numgrad(f, x, eps=1e-3):
    g = np.zeros_like(x, dtype=np.float64)
    for i in np.ndindex(x.shape):
        xp, xm = x.astype(np.float64), x.astype(np.float64)
        xp[i] += eps
        xm[i] -= eps
        g[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


def _log_softmax_np(x):
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


CHAPTER_CASES = [
    ("tanh_sum", lambda t: t.tanh().sum(), lambda x: np.tanh(x).sum()),
    ("softmax_xent", lambda t: t.log_softmax(-1)[:, 1].sum(), lambda x: _log_softmax_np(x)[:, 1].sum()),
    ("max", lambda t: (t.max(-1) * t.sum(0).max()).sum(), lambda x: (x.max(-1) * x.sum(0).max()).sum()),
    (
        "pad_shrink",
        lambda t: t.pad(((1, 1), (0, 2)))[1:3, 1:].square().sum(),
        lambda x: (np.pad(x, ((1, 1), (0, 2)))[1:3, 1:] ** 2).sum(),
    ),
    ("sqrt_recip", lambda t: (t.square() + 1).sqrt().reciprocal().sum(), lambda x: (1 / np.sqrt(x**2 + 1)).sum()),
    ("matmul", lambda t: (t @ t.T).sin().sum(), lambda x: np.sin(x @ x.T).sum()),
]


@pytest.mark.parametrize("name,fn,npfn", CHAPTER_CASES, ids=[c[0] for c in CHAPTER_CASES])
def test_gradients(name, fn, npfn):
    x = r(3, 4)
    t = Tensor(x, requires_grad=True)
    fn(t).backward([t])
    np.testing.assert_allclose(t.grad.numpy(), numgrad(npfn, x), rtol=2e-2, atol=2e-3)


def test_item_before_backward_and_detach():
    w = Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    loss = (w * w).sum()
    loss.item()  # realizing the loss must keep its graph
    loss.backward([w])
    np.testing.assert_allclose(w.grad.numpy(), [2.0, 4.0])
    w.grad = None
    (w.detach() * w).sum().backward([w])  # d/dw (c * w) with c = w held constant
    np.testing.assert_allclose(w.grad.numpy(), [1.0, 2.0])


# ---------------------------------------------------------------------------------------------------
# semantics


def test_gradients_accumulate_until_cleared():
    w = Tensor(np.array([1.0, -3.0], np.float32), requires_grad=True)
    for _ in range(3):
        (w * w).sum().backward([w])
    np.testing.assert_allclose(w.grad.numpy(), [6.0, -18.0])  # 3 * 2w
    w.grad = None
    (w * 5).sum().backward([w])
    np.testing.assert_allclose(w.grad.numpy(), [5.0, 5.0])


def test_backward_without_params_finds_requires_grad_tensors():
    a = Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    b = Tensor(np.array([3.0, 4.0], np.float32), requires_grad=True)
    unused = Tensor(np.array([1.0], np.float32), requires_grad=True)
    const = Tensor(np.array([5.0, 6.0], np.float32), requires_grad=False)
    undecided = Tensor(np.array([7.0, 8.0], np.float32))  # requires_grad None: filled when backward reaches it
    (a * b + const + undecided).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [3.0, 4.0])
    np.testing.assert_allclose(b.grad.numpy(), [1.0, 2.0])
    np.testing.assert_allclose(undecided.grad.numpy(), [1.0, 1.0])
    assert unused.grad is None and const.grad is None


def test_gradient_form_returns_list_and_zeros_for_unrelated():
    a = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    other = Tensor(np.ones((2, 2)), requires_grad=True)
    ga, go = (a.square().sum()).gradient(a, other)
    np.testing.assert_allclose(ga.numpy(), [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(go.numpy(), np.zeros((2, 2)))
    assert a.grad is None  # gradient() does not touch .grad
    loss = (a * 3).sum()  # the UOp-level form that Tensor.gradient calls
    gb = autodiff.compute_gradient(loss.uop, UOp.const(1.0, loss.dtype), [a.uop])[a.uop]
    np.testing.assert_allclose(Tensor(gb).numpy(), [3.0, 3.0, 3.0])


def test_gradient_is_a_lazy_graph_sharing_forward_nodes():
    x = Tensor(np.array([0.5, 1.0, 2.0], np.float32), requires_grad=True)
    y = x.exp()
    (g,) = y.sum().gradient(x)
    assert y.uop in set(g.uop.toposort())  # d exp(x) = exp(x): the forward node itself, hash-consed
    np.testing.assert_allclose(g.numpy(), np.exp([0.5, 1.0, 2.0]), rtol=1e-6)


def test_a_product_with_the_seed_is_no_multiply():
    # (out * g).sum() injects an upstream gradient g (as torch.autograd.grad(out, x, g) does): d/d out is the seed's
    # broadcast 1.0 times g, which is g itself, the stored buffer. As a product it was a copy kernel before a
    # convolution's input-gradient transform, which reads its input from storage (conv benchmark: 0.64-0.8 of 32 ms)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    out, g = Tensor(a, requires_grad=True), Tensor(a[::-1].copy())
    (d,) = (out * g).sum().gradient(out)
    assert d.uop is g.uop
    np.testing.assert_array_equal(d.numpy(), a[::-1])
    (d,) = (g * out * 2.0).sum().gradient(out)  # a product with other ones still multiplies
    np.testing.assert_array_equal(d.numpy(), a[::-1] * 2)


def test_detach_stops_and_contiguous_passes_gradients():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    (g,) = ((x * x).detach() * x).sum().gradient(x)
    np.testing.assert_allclose(g.numpy(), [1.0, 4.0])  # x^2 held constant
    (g,) = ((x * x).contiguous() * x).sum().gradient(x)
    np.testing.assert_allclose(g.numpy(), [3.0, 12.0])  # d x^3 = 3 x^2
    (g,) = x.detach().sum().gradient(x)
    np.testing.assert_array_equal(g.numpy(), [0.0, 0.0])


def test_max_ties_split_the_gradient_evenly():
    x = Tensor(np.array([[1.0, 3.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0]], np.float32), requires_grad=True)
    x.max(1).sum().backward([x])
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5, 0], [0.25, 0.25, 0.25, 0.25]])
    a = Tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    b = Tensor(np.array([1.0, 5.0, 0.0], np.float32), requires_grad=True)
    a.maximum(b).sum().backward([a, b])
    np.testing.assert_allclose(a.grad.numpy(), [0.5, 0.0, 1.0])
    np.testing.assert_allclose(b.grad.numpy(), [0.5, 1.0, 0.0])


def test_relu_gradient_at_zero_is_zero():
    # relu is a select (0 < x), not maximum(x, 0): no half gradient at exactly 0
    x = Tensor(np.array([-1.0, 0.0, 2.0], np.float32), requires_grad=True)
    x.relu().sum().backward([x])
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 1.0])


def test_non_scalar_backward_raises():
    x = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    with pytest.raises(RuntimeError, match="scalar outputs, got shape \\(2, 3\\)"):
        (x * 2).backward([x])


def test_one_element_loss_is_allowed():
    x = Tensor(np.array([2.0], np.float32), requires_grad=True)
    (x * x).backward([x])  # shape (1,): one element, like PyTorch
    np.testing.assert_allclose(x.grad.numpy(), [4.0])


def test_cast_sends_gradient_back_in_the_source_dtype():
    x = Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    (x.double() * Tensor(np.array([3.0, 4.0]))).sum().backward([x])
    assert x.grad.dtype is dtypes.float32
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 4.0])


def test_integer_paths_carry_no_gradient():
    x = Tensor(np.array([1.5, -2.5, 3.5]), requires_grad=True)
    idx = (x * 2).cast(dtypes.int32)  # a float -> int cast: piecewise constant
    (g,) = (idx.cast(dtypes.float64) * x).sum().gradient(x)
    np.testing.assert_allclose(g.numpy(), [3.0, -5.0, 7.0])


def test_gradient_reaches_a_tensor_realized_after_the_forward():
    # the forward was built on w's lazy graph; realizing w afterwards must not cut the gradient
    w = Tensor(np.array([1.0, 2.0], np.float32)) * 3
    w.requires_grad = True
    loss = (w * w).sum()
    w.realize()
    loss.backward([w])
    np.testing.assert_allclose(w.grad.numpy(), [6.0, 12.0])


def test_gradient_flows_through_an_intermediate_realized_before_the_loss_is_built():
    # PyTorch keeps the autograd graph of a value that was printed or read: out.numpy(); f(out).backward() must
    # reach the parameters, and the backward reads the realized value instead of recomputing it
    x = Tensor(np.array([[1.0, -2.0], [3.0, 0.5]], np.float32), requires_grad=True)
    h = (x * 2).exp()
    h.numpy()
    y = (h * x).relu()
    y.realize()  # a second realized link in the chain: its graph reads h's buffer
    (y * y).sum().backward()
    xt = torch.tensor(x.numpy(), requires_grad=True)
    ht = (xt * 2).exp()
    yt = (ht * xt).relu()
    (yt * yt).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5)
    loss = (y * 3).sum()
    (g,) = loss.gradient(x)
    assert h.uop in set(g.uop.toposort())  # the realized buffer, not exp(2x) again
    assert not any(u.op is Ops.EXP2 for u in g.uop.toposort())


def test_float64_stays_float64():
    x = Tensor(np.array([0.1, 0.2]), requires_grad=True)
    x.exp().sum().backward([x])
    assert x.grad.dtype is dtypes.float64
    np.testing.assert_allclose(x.grad.numpy(), np.exp([0.1, 0.2]), rtol=1e-14)


def test_shared_subexpression_gradient_is_summed():
    x = Tensor(np.array([0.3, -0.7]), requires_grad=True)
    y = x.sin()
    (y * y + y).sum().backward([x])  # d (s^2 + s) = (2s + 1) cos x
    s = np.sin([0.3, -0.7])
    np.testing.assert_allclose(x.grad.numpy(), (2 * s + 1) * np.cos([0.3, -0.7]), rtol=1e-12)


def test_no_rule_for_lowered_ops_raises():
    from uopc.uop import Ops, UOp

    bad = UOp(Ops.LOAD, (UOp.const(1.0, dtypes.f32),), dtype=dtypes.f32)
    with pytest.raises(NotImplementedError, match="LOAD"):
        autodiff.compute_gradient(bad, UOp.const(1.0, dtypes.f32), [bad.src[0]])


def test_gradient_of_a_staged_value_is_staged():
    # y = contiguous(...) is materialized in the forward pass; its gradient (read by two reductions here) is
    # materialized in the backward pass too, and a gradient that is already a reduction's output is not copied
    xs = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    x = Tensor(xs, requires_grad=True)
    y = (x * 0.5).exp().contiguous()
    z = y.reshape(2, 2, 3, 2).max((1, 3))
    (gx,) = ((z * z).sum() + (z.exp() * y.sum()).sum()).gradient(x)
    stages = [u for u in gx.uop.toposort() if u.op is Ops.STAGE]
    assert len(stages) >= 2  # the forward STAGE and the gradient's
    xt = torch.tensor(xs, requires_grad=True)
    yt = (xt * 0.5).exp()
    zt = yt.reshape(2, 2, 3, 2).amax((1, 3))
    ((zt * zt).sum() + (zt.exp() * yt.sum()).sum()).backward()
    np.testing.assert_allclose(gx.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fuse", [False, True])
def test_abs_gradient_at_zero_is_g_times_sign_as_torch(monkeypatch, fuse):
    """d|x|/dx at 0 is g * 0: an infinite incoming gradient (sqrt's at 0) gives NaN, as PyTorch (fuzz --grad seeds
    2856, 4111); abs(-0.0) is +0 and abs(NaN) is NaN, fused or not."""
    monkeypatch.setattr(Tensor, "fuse_reduce", fuse)
    v = np.array([0.0, -0.0, -2.0, 3.0, np.nan, -np.inf], np.float32)
    t = Tensor(v, requires_grad=True)
    (g,) = (t.abs().sqrt() * 1.0).sum().gradient(t)
    tt = torch.tensor(v, requires_grad=True)
    tt.abs().sqrt().sum().backward()
    np.testing.assert_array_equal(g.numpy(), tt.grad.numpy())
    a = (Tensor(v).abs() + 0).numpy()
    assert np.array_equal(a, np.abs(v), equal_nan=True) and not np.signbit(a[1])


# ---------------------------------------------------------------------------------------------------
# custom gradient rules (autodiff.with_gradient): a composite op differentiated by its own rule


def _scaled_rule(g, m):  # a rule that returns other graph ops: d/dx = params[0] * g * y, d/dy = None
    (k,) = m.arg.params
    return g * m.src[2] * UOp.const(float(k), g.dtype), None


autodiff.CUSTOM_RULES["test_scaled"] = _scaled_rule


def test_custom_rule_replaces_the_values_own_gradient():
    # the value is x * y, but the rule says d/dx = 3 * g * y and gives y nothing: autodiff follows the rule, and
    # execution computes the value (the marker is stripped before the kernels are cut)
    x = Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    y = Tensor(np.array([5.0, 7.0], np.float32), requires_grad=True)
    out = Tensor(autodiff.with_gradient((x * y).uop, (x.uop, y.uop), "test_scaled", (3,)))
    assert out.uop.op is Ops.CUSTOM_GRAD
    gx, gy = (out * Tensor(np.array([1.0, 10.0], np.float32))).sum().gradient(x, y)
    np.testing.assert_array_equal(out.numpy(), [5.0, 14.0])
    np.testing.assert_array_equal(gx.numpy(), [15.0, 210.0])
    np.testing.assert_array_equal(gy.numpy(), [0.0, 0.0])  # the rule gave y nothing (x*y's own rule would give x)


def test_custom_rule_errors_name_the_rule():
    x = Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    with pytest.raises(KeyError, match="no_such_rule"):
        autodiff.with_gradient(x.uop, (x.uop,), "no_such_rule")
    autodiff.CUSTOM_RULES["test_two_grads"] = lambda g, m: (g, g)  # two gradients for one input
    out = Tensor(autodiff.with_gradient((x * 2).uop, (x.uop,), "test_two_grads"))
    with pytest.raises(RuntimeError, match="test_two_grads.*2 gradients for 1 inputs"):
        out.sum().gradient(x)


def test_conv_gradient_comes_from_its_rule_and_is_differentiable_again():
    # conv2d marks its output: the input gradient is itself a conv2d (marked again), so a second derivative works;
    # d/dw of sum(dx * p) for dx = conv_transpose(g, w) against torch's double backward
    rng = np.random.default_rng(1)
    xa, wa = rng.standard_normal((2, 3, 6, 7)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    ga, pa = rng.standard_normal((2, 4, 6, 7)).astype(np.float32), rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    x, w = Tensor(xa, requires_grad=True), Tensor(wa, requires_grad=True)
    out = x.conv2d(w, padding=1)
    assert out.uop.op is Ops.CUSTOM_GRAD and out.uop.arg.rule == "conv"
    (dx,) = (out * Tensor(ga)).sum().gradient(x)
    assert dx.uop.op is Ops.CUSTOM_GRAD  # the input gradient is a convolution
    (dw2,) = (dx * Tensor(pa)).sum().gradient(w)
    tx, tw = torch.tensor(xa, requires_grad=True), torch.tensor(wa, requires_grad=True)
    (tdx,) = torch.autograd.grad((torch.nn.functional.conv2d(tx, tw, padding=1) * torch.tensor(ga)).sum(), tx,
                                 create_graph=True)  # fmt: skip
    (tdw2,) = torch.autograd.grad((tdx * torch.tensor(pa)).sum(), tw)
    np.testing.assert_allclose(dw2.numpy(), tdw2.numpy(), rtol=1e-4, atol=1e-4 * np.abs(tdw2.numpy()).max())


def test_erf_gradient_is_exact_and_reads_only_its_input():
    """erf's gradient is 2/sqrt(pi) e^(-x^2) from x alone (a custom rule): GELU's backward is one kernel over x and
    the incoming gradient, not one reading every intermediate of the polynomial the forward evaluates."""
    from uopc.engine.lower import make_plan
    from uopc.engine.realize import default_opt
    from uopc.schedule import RefKind

    x = np.linspace(-6, 6, 4096, dtype=np.float32).reshape(64, 64)
    g = rng.standard_normal((64, 64)).astype(np.float32)
    t = Tensor(x, requires_grad=True)
    y = t.gelu()
    (y * Tensor(g)).sum().backward()
    # the forward and the backward in one plan, as a training step has them (differentiated through the polynomial:
    # 11 kernels, the backward's reading 10 staged intermediates). Each kernel reads at most x, the incoming
    # gradient and one staged value (the forward's output and the gradient, both roots, may be one kernel: groups)
    plan, _ = make_plan([y.uop, t.grad.uop], opt=default_opt())
    reads = [[r for r in k.refs[:-1] if r.kind is not RefKind.OUT] for k in plan.kernels]  # (the last: written)
    assert len(plan.kernels) <= 3 and max(map(len, reads)) <= 3, [(k.name, k.refs) for k in plan.kernels]
    tt = torch.from_numpy(x).requires_grad_()
    (torch.nn.functional.gelu(tt) * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), atol=1e-6, rtol=1e-5)
    e = Tensor(x, requires_grad=True)
    e.erf().sum().backward()
    np.testing.assert_allclose(e.grad.numpy(), 2 / np.sqrt(np.pi) * np.exp(-(x.astype(np.float64) ** 2)), atol=1e-7)

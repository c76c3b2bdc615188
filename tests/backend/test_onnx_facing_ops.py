"""The Tensor ops ONNX's importer builds on (issue 23, item 7), where the torch sweep cannot reach: dtypes it does not
draw (uint8, int8, int64, bfloat16), data-dependent results, and every bad input raising a clear exception before
anything compiles (or, for a bad index, when the kernel runs). References: PyTorch; integer results exact, float
results within atol 1e-6 + rtol 1e-5 unless a test says otherwise."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from uopc import Tensor, dtypes

RNG = np.random.default_rng(23)


def _eq(ours: Tensor, ref: torch.Tensor) -> None:
    """Exact equality, dtype included (PyTorch's int64 results are int32 here)."""
    r = ref.numpy()
    o = ours.numpy()
    assert o.dtype == r.dtype or (r.dtype == np.int64 and o.dtype == np.int32), (o.dtype, r.dtype)
    np.testing.assert_array_equal(o, r)


# ---------------------------------------------------------------- interpolate keeps integer dtypes


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_interpolate_nearest_keeps_uint8_exactly(mode):
    x = RNG.integers(0, 256, (2, 3, 5, 6)).astype(np.uint8)
    for kw in (dict(size=(7, 4)), dict(scale_factor=1.5), dict(scale_factor=(0.5, 2))):
        _eq(Tensor(x).interpolate(mode=mode, **kw), F.interpolate(torch.tensor(x), mode=mode, **kw))
    x1 = RNG.integers(0, 256, (1, 2, 9)).astype(np.uint8)
    _eq(Tensor(x1).interpolate(size=4, mode=mode), F.interpolate(torch.tensor(x1), size=4, mode=mode))


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_interpolate_uint8_rounds_back_within_one(mode):
    """PyTorch's uint8 kernels use fixed-point weights: ours (float weights, rounded once) is within 1 of them."""
    x = RNG.integers(0, 256, (1, 3, 6, 7)).astype(np.uint8)
    for kw in (dict(size=(9, 4)), dict(scale_factor=2, align_corners=True)):
        o = Tensor(x).interpolate(mode=mode, **kw).numpy()
        r = F.interpolate(torch.tensor(x), mode=mode, **kw).numpy()
        assert o.dtype == np.uint8
        assert np.abs(o.astype(np.int32) - r.astype(np.int32)).max() <= 1


def test_interpolate_int32_nearest_and_float64():
    x = RNG.integers(-1000, 1000, (1, 2, 4, 5)).astype(np.int32)
    ref = F.interpolate(torch.tensor(x).float(), size=(6, 3), mode="nearest").int()
    _eq(Tensor(x).interpolate(size=(6, 3)), ref)
    xd = RNG.standard_normal((1, 2, 4, 5))
    np.testing.assert_allclose(
        Tensor(xd).interpolate(size=(3, 8), mode="bicubic").numpy(),
        F.interpolate(torch.tensor(xd), size=(3, 8), mode="bicubic").numpy(),
        rtol=1e-12,
        atol=1e-12,
    )


def test_interpolate_errors():
    x = Tensor.zeros(1, 2, 4, 4)
    with pytest.raises(ValueError, match="mode 'cubic' is not supported"):
        x.interpolate(size=2, mode="cubic")
    with pytest.raises(ValueError, match="'trilinear' does not fit a 2-D"):
        x.interpolate(size=2, mode="trilinear")
    with pytest.raises(ValueError, match="'bicubic' does not fit a 1-D"):
        Tensor.zeros(1, 2, 4).interpolate(size=2, mode="bicubic")
    with pytest.raises(ValueError, match="align_corners only applies"):
        x.interpolate(size=2, mode="nearest", align_corners=True)
    with pytest.raises(ValueError, match="exactly one of size and scale_factor"):
        x.interpolate(size=2, scale_factor=2)
    with pytest.raises(ValueError, match="positive numbers"):
        x.interpolate(scale_factor=-1.0)
    with pytest.raises(ValueError, match=r"expects \(N, C, \*spatial\)"):
        Tensor.zeros(4, 4).interpolate(size=2)


# ---------------------------------------------------------------- division, shifts


def test_div_rounding_modes_int_edges():
    a = np.array([-7, 7, -7, 7, 0, -1, 6, -6, 2**31 - 1, -(2**31) + 1], np.int32)
    b = np.array([2, -2, -2, 2, 3, 5, -4, 4, 2, 3], np.int32)
    for mode in ("trunc", "floor"):
        _eq(
            Tensor(a).div(Tensor(b), rounding_mode=mode),
            torch.div(torch.tensor(a), torch.tensor(b), rounding_mode=mode),
        )
        _eq(Tensor(a).div(3, rounding_mode=mode), torch.div(torch.tensor(a), 3, rounding_mode=mode))
    x = np.array([-7.5, 7.5, -0.5, 1e30, -3.0], np.float32)
    for mode in (None, "trunc", "floor"):
        _eq(Tensor(x).div(2.0, rounding_mode=mode), torch.div(torch.tensor(x), 2.0, rounding_mode=mode))
    with pytest.raises(ValueError, match="rounding_mode must be None, 'trunc' or 'floor'"):
        Tensor(a).div(2, rounding_mode="round")
    with pytest.raises(TypeError, match="bool"):
        Tensor([True]).div(Tensor([True]), rounding_mode="trunc")


@pytest.mark.parametrize("dt", [np.uint8, np.int8, np.int16, np.int32, np.int64])
def test_shifts_every_int_dtype(dt):
    bits = np.dtype(dt).itemsize * 8
    info = np.iinfo(dt)
    v = np.array([0, 1, 5, info.max, info.min, 3, info.max // 3, 7], np.int64).astype(dt)
    sh = np.array([0, 1, 2, bits - 1, bits - 1, bits, bits + 3, 3], dt)
    if info.min < 0:
        sh[-1] = -2  # a negative amount shifts everything out, as PyTorch
    for f in (lambda a, b: a << b, lambda a, b: a >> b):
        _eq(f(Tensor(v), Tensor(sh)), f(torch.tensor(v), torch.tensor(sh)))
        for n in (0, 1, bits - 1, bits, bits + 5):
            _eq(f(Tensor(v), n), f(torch.tensor(v), n))


def test_shift_errors():
    with pytest.raises(TypeError, match="needs int tensors"):
        Tensor([1.0]) << 1
    with pytest.raises(TypeError, match="needs int tensors"):
        Tensor([1]) >> Tensor([1.0])
    with pytest.raises(TypeError, match="an int shift"):
        Tensor([1]) << 1.5


# ---------------------------------------------------------------- softplus, pad, einsum, diagonal


def test_softplus_beta_threshold_and_gradient():
    x = np.array([-30.0, -1.0, 0.0, 1.4, 1.6, 10.0, 20.0, 25.0, 300.0], np.float32)
    for beta, threshold in ((1.0, 20.0), (2.0, 3.0), (0.5, 1.0)):
        t = Tensor(x, requires_grad=True)
        out = t.softplus(beta, threshold)
        (g,) = out.sum().gradient(t)
        tt = torch.tensor(x, requires_grad=True)
        ref = F.softplus(tt, beta, threshold)
        ref.sum().backward()
        np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g.numpy(), tt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_pad_modes_any_rank_and_errors():
    x = RNG.standard_normal((2, 3, 4, 5, 6)).astype(np.float32)
    for mode in ("reflect", "replicate", "circular"):
        pads = (1, 2, -1, 3, 2, 0)
        _eq(Tensor(x).pad(pads, mode=mode), F.pad(torch.tensor(x), pads, mode=mode))
    # a 1-D tensor and a dim past PyTorch's three: tinygrad's any-rank rule, checked against NumPy's pad
    v = np.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(Tensor(v).pad((2, 3), mode="reflect").numpy(), np.pad(v, (2, 3), mode="reflect"))
    np.testing.assert_array_equal(Tensor(v).pad((2, 3), mode="replicate").numpy(), np.pad(v, (2, 3), mode="edge"))
    np.testing.assert_array_equal(Tensor(v).pad((2, 3), mode="circular").numpy(), np.pad(v, (2, 3), mode="wrap"))
    y = Tensor(x[0, 0])
    with pytest.raises(ValueError, match="reflect padding 5 must be smaller than dim"):
        y.pad((0, 0, 5, 0), mode="reflect")
    with pytest.raises(ValueError, match="circular padding 7 must be at most dim"):
        y.pad((7, 0), mode="circular")
    with pytest.raises(ValueError, match="pad mode must be"):
        y.pad((1, 1), mode="wrap")
    with pytest.raises(ValueError, match="cuts"):
        y.pad((-4, -3), mode="replicate")


def test_einsum_checks_shapes_and_terms():
    a, b = Tensor.zeros(3, 4), Tensor.zeros(5, 6)
    with pytest.raises(ValueError, match=r"letter 'j' has size 4 in operand 0 \(shape \(3, 4\)\) but 5 in operand 1"):
        Tensor.einsum("ij,jk->ik", a, b)
    with pytest.raises(ValueError, match="letter 'i' repeats in 'ii' over dims of sizes 3 and 4"):
        Tensor.einsum("ii->i", a)
    with pytest.raises(ValueError, match="has 3 letters but its operand has shape"):
        Tensor.einsum("ijk->i", a)
    with pytest.raises(ValueError, match="names 2 operands but 1 were given"):
        Tensor.einsum("ij,jk", a)
    with pytest.raises(ValueError, match="output 'iz' must use distinct letters from the inputs"):
        Tensor.einsum("ij->iz", a)
    with pytest.raises(ValueError, match="output 'ii' must use distinct letters"):
        Tensor.einsum("ij->ii", a)
    with pytest.raises(ValueError, match="at most one '...'"):
        Tensor.einsum("...i...->i", a)
    with pytest.raises(ValueError, match="ellipsis dim has size"):
        Tensor.einsum("...i,...i->...", Tensor.zeros(2, 3), Tensor.zeros(4, 3))
    # size-1 dims broadcast, as in PyTorch
    x, y = RNG.standard_normal((1, 4)).astype(np.float32), RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(
        Tensor.einsum("ij,ij->i", Tensor(x), Tensor(y)).numpy(),
        torch.einsum("ij,ij->i", torch.tensor(x), torch.tensor(y)).numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


def test_diagonal_errors():
    with pytest.raises(ValueError, match="at least 2 dims"):
        Tensor.zeros(3).diagonal()
    with pytest.raises(ValueError, match="dim1 and dim2 must differ"):
        Tensor.zeros(3, 3).diagonal(0, 1, -1)
    with pytest.raises(IndexError, match="Dimension out of range"):
        Tensor.zeros(3, 3).diagonal(0, 0, 2)


# ---------------------------------------------------------------- one_hot, masked_select, nonzero (data-dependent)


def test_one_hot_infers_classes_and_checks_them():
    y = np.array([[0, 3], [2, 1]], np.int64)
    _eq(Tensor(y).one_hot(), F.one_hot(torch.tensor(y)))
    _eq(Tensor(y.astype(np.uint8)).one_hot(6), F.one_hot(torch.tensor(y), 6))
    assert Tensor.zeros(0, 3, dtype=dtypes.int32).one_hot(4).shape == (0, 3, 4)
    with pytest.raises(IndexError, match="one_hot class: index 4 is out of range"):
        Tensor(y + 1).one_hot(4).numpy()
    with pytest.raises(IndexError, match="one_hot class: index -1 is out of range"):
        Tensor(y - 1).one_hot(5).numpy()
    with pytest.raises(TypeError, match="int tensor of class indices"):
        Tensor([0.0, 1.0]).one_hot(2)
    with pytest.raises(ValueError, match="cannot infer num_classes"):
        Tensor.zeros(0, dtype=dtypes.int32).one_hot()
    with pytest.raises(ValueError, match="num_classes must be"):
        Tensor(y).one_hot(-3)


def test_masked_select_and_nonzero_sizes():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    m = x > 0.3
    _eq(Tensor(x).masked_select(Tensor(m)), torch.tensor(x).masked_select(torch.tensor(m)))
    _eq(Tensor(x).masked_select(Tensor(np.zeros(4, bool))), torch.tensor(x).masked_select(torch.zeros(4, dtype=bool)))
    _eq(Tensor(m).nonzero(), torch.tensor(m).nonzero())
    for ours, ref in zip(Tensor(x).nonzero(as_tuple=True), torch.tensor(x).nonzero(as_tuple=True), strict=True):
        _eq(ours, ref)
    assert Tensor.zeros(2, 0, 3).nonzero().shape == (0, 3)
    _eq(Tensor(np.float32(0)).nonzero(), torch.tensor(0.0).nonzero())
    with pytest.raises(TypeError, match="needs a bool mask"):
        Tensor(x).masked_select(Tensor(x))
    with pytest.raises(ValueError, match="cannot expand"):
        Tensor(x).masked_select(Tensor(np.ones(3, bool)))


# ---------------------------------------------------------------- bitcast


def test_bitcast_reinterprets_bytes():
    f = np.array([1.0, -0.0, np.inf, -np.inf, 1e-45, 3.4e38], np.float32)
    nan = np.array([0x7FC00001, 0xFFC00000], np.uint32).view(np.float32)  # NaNs with payload and sign
    v = np.concatenate([f, nan])
    _eq(Tensor(v).bitcast(dtypes.int32), torch.tensor(v).view(torch.int32))
    back = Tensor(v).bitcast(dtypes.uint32).bitcast(dtypes.float32).numpy()
    np.testing.assert_array_equal(back.view(np.uint32), v.view(np.uint32))
    _eq(Tensor(v.reshape(2, 4)).bitcast(dtypes.uint8), torch.tensor(v.reshape(2, 4)).view(torch.uint8))
    _eq(Tensor(v.reshape(2, 4)).bitcast(dtypes.int64), torch.tensor(v.reshape(2, 4)).view(torch.int64))
    h = np.array([1.5, -2.0, 65504.0, 6e-8], np.float16)
    _eq(Tensor(h).bitcast(dtypes.int16), torch.tensor(h).view(torch.int16))
    bf = Tensor([1.0, -3.5, 256.0]).bfloat16().bitcast(dtypes.int16)
    _eq(bf, torch.tensor([1.0, -3.5, 256.0]).bfloat16().view(torch.int16))
    lazy = (Tensor([1, 2, 3]) * 2).bitcast(dtypes.float32)  # a lazy input is computed first
    _eq(lazy, torch.tensor([2, 4, 6], dtype=torch.int32).view(torch.float32))
    assert Tensor.zeros(0, 4).bitcast(dtypes.int8).shape == (0, 16)


def test_bitcast_errors():
    with pytest.raises(ValueError, match="needs a last dim whose bytes divide"):
        Tensor.zeros(3, 3, dtype=dtypes.int16).bitcast(dtypes.float32)
    with pytest.raises(ValueError, match="needs a last dim"):
        Tensor(1.0).bitcast(dtypes.int16)
    with pytest.raises(TypeError, match="bitcast to bool"):
        Tensor([1], dtype=dtypes.uint8).bitcast(dtypes.bool)


# ---------------------------------------------------------------- pooling and unpooling


def test_max_pool_indices_unbatched_and_unpool_errors():
    x = (RNG.permutation(2 * 6 * 7).reshape(2, 6, 7) * 0.5).astype(np.float32)
    v, i = Tensor(x).max_pool2d(3, 2, 1, return_indices=True)
    rv, ri = F.max_pool2d(torch.tensor(x), 3, 2, 1, return_indices=True)
    _eq(v, rv)
    _eq(i, ri)
    _eq(v.max_unpool2d(i, 3, 2, 1, output_size=(6, 7)), F.max_unpool2d(rv, ri, 3, 2, 1, output_size=(6, 7)))
    with pytest.raises(ValueError, match="indices of shape"):
        v.max_unpool2d(i[:, :1], 3, 2, 1)
    with pytest.raises(TypeError, match="indices must be an int tensor"):
        v.max_unpool2d(i.float(), 3, 2, 1)
    with pytest.raises(ValueError, match="output_size"):
        v.max_unpool2d(i, 3, 2, 1, output_size=(9, 9))
    with pytest.raises(IndexError, match="out of range"):
        v.max_unpool2d(i + 40, 3, 2, 1).numpy()  # a bad index is data: it raises when the kernel has run


def test_pool3d_errors():
    with pytest.raises(ValueError, match="avg_pool3d expects a 4-D"):
        Tensor.zeros(2, 3, 4).avg_pool3d(2)
    with pytest.raises(ValueError, match="max_pool3d expects a 4-D"):
        Tensor.zeros(2, 3, 4).max_pool3d(2)
    with pytest.raises(ValueError, match="padding"):
        Tensor.zeros(1, 1, 4, 4, 4).avg_pool3d(2, padding=2)
    with pytest.raises(ValueError, match="divisor_override"):
        Tensor.zeros(1, 1, 4, 4, 4).avg_pool3d(2, divisor_override=0)


def test_avg_pool_float64_keeps_its_dtype():
    x = RNG.standard_normal((1, 2, 5, 6, 4))
    out = Tensor(x).avg_pool3d(3, 2, 1, ceil_mode=True)
    ref = F.avg_pool3d(torch.tensor(x), 3, 2, 1, ceil_mode=True)
    assert out.dtype is dtypes.float64
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-12)


# ---------------------------------------------------------------- scatter_reduce's errors


def test_scatter_reduce_errors_before_compiling_and_index_errors_after():
    x, src = Tensor.zeros(4, 5), Tensor.ones(4, 3)
    idx = Tensor(np.zeros((4, 3), np.int32))
    with pytest.raises(ValueError, match="reduce must be sum, prod, mean, amax or amin, got 'max'"):
        x.scatter_reduce(1, idx, src, "max")
    with pytest.raises(TypeError, match="the index must be an integer tensor"):
        x.scatter_reduce(1, idx.float(), src, "sum")
    with pytest.raises(TypeError, match="values of dtype"):
        x.scatter_reduce(1, idx, src.int(), "sum")
    with pytest.raises(ValueError, match=r"index shape \(5, 3\) is larger than \(4, 5\) off dim 1"):
        x.scatter_reduce(1, Tensor(np.zeros((5, 3), np.int32)), Tensor.ones(5, 3), "sum")
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.scatter_reduce(2, idx, src, "sum")
    with pytest.raises(IndexError, match="scatter_reduce amax: index 5 is out of range for a dimension of size 5"):
        x.scatter_reduce(1, idx + 5, src, "amax").numpy()
    with pytest.raises(IndexError, match="scatter_reduce mean: index -1 is out of range"):
        x.scatter_reduce(1, idx - 1, src, "mean").numpy()


# ---------------------------------------------------------------- roll, unfold, meshgrid, copysign edges


def test_roll_unfold_meshgrid_copysign_edges():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    _eq(Tensor(x).roll(-5, 1), torch.tensor(x).roll(-5, 1))
    _eq(Tensor.zeros(0, 3).roll(2, 0), torch.zeros(0, 3).roll(2, 0))
    with pytest.raises(ValueError, match="roll: 2 shifts for 1 dims"):
        Tensor(x).roll((1, 2), 0)
    _eq(Tensor(x).unfold(0, 3, 2), torch.tensor(x).unfold(0, 3, 2))
    with pytest.raises(ValueError, match="unfold: size 5"):
        Tensor(x).unfold(1, 5, 1)
    with pytest.raises(ValueError, match="indexing must be 'ij' or 'xy'"):
        Tensor.meshgrid(Tensor(x[0]), Tensor(x[1]), indexing="ji")
    for ours, ref in zip(Tensor.meshgrid(Tensor(x[0])), torch.meshgrid(torch.tensor(x[0]), indexing="ij"), strict=True):
        _eq(ours, ref)
    for ours, ref in zip(
        Tensor(x[0]).meshgrid(Tensor(x[1, :3])),
        torch.meshgrid(torch.tensor(x[0]), torch.tensor(x[1, :3]), indexing="ij"),
        strict=True,
    ):
        _eq(ours, ref)  # tinygrad's spelling: self is the first grid
    with pytest.raises(TypeError, match="meshgrid expects Tensors"):
        Tensor.meshgrid([1, 2], [3])
    a, b = np.array([3, -2, 0], np.int32), np.array([-1, 5, -7], np.int32)
    _eq(Tensor(a).copysign(Tensor(b)), torch.tensor(a).copysign(torch.tensor(b)))
    _eq(Tensor([1.5, -2.0]).copysign(-1.0), torch.tensor([1.5, -2.0]).copysign(-1.0))
    assert math.isnan(Tensor([math.nan]).copysign(1.0).item())

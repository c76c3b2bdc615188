"""uopc.uop.indexing.affine_view: a chain of movement ops as one strided view (offset, strides), checked against
NumPy applying the same ops to arange: every element where the strides say, or None where no strides can say it.
And uopc.opt.strides.merged_shape, which reads the same strides to merge an elementwise kernel's loops."""

from __future__ import annotations

import numpy as np
import pytest

from uopc.opt.strides import merged_shape
from uopc.tensor import Tensor
from uopc.uop import Ops, ParamArg, UOp
from uopc.uop.dtype import dtypes
from uopc.uop.indexing import affine_view


def _buffer(n: int) -> UOp:
    return UOp(Ops.BUFFER, (), ParamArg(0, dtypes.float32, (n,)))


def _agrees(view: UOp, base: UOp, want: np.ndarray) -> None:
    got = affine_view(view, base)
    assert got is not None, view
    offset, strides = got
    idx = np.indices(view.shape).reshape(view.ndim, -1)
    flat = offset + sum(i * s for i, s in zip(idx, strides, strict=True))
    np.testing.assert_array_equal(flat, want.reshape(-1))


def test_heads_split_transposed_and_regrouped():
    """An ONNX export's q: (10, 3*32) -> (10, 12, 8) -> heads first -> (3, 4, 10, 8): affine, through a reshape of
    permuted dims that an index simplifier has to prove."""
    b, a = _buffer(960), np.arange(960)
    v = b.reshape((10, 12, 8)).permute((1, 0, 2)).reshape((3, 4, 10, 8)).permute((0, 1, 3, 2))
    v = v.reshape((3, 4, 1, 8, 10)).reshape((3, 4, 8, 10)).permute((0, 1, 3, 2))
    _agrees(v, b, a.reshape(10, 12, 8).transpose(1, 0, 2).reshape(3, 4, 10, 8))


def test_shrink_flip_expand_permute():
    b, a = _buffer(960), np.arange(960)
    v = b.reshape((10, 96)).shrink(((2, 7), (10, 60))).flip((0,)).reshape((5, 5, 10)).permute((2, 0, 1))
    _agrees(v, b, a.reshape(10, 96)[2:7, 10:60][::-1].reshape(5, 5, 10).transpose(2, 0, 1))
    v = b.reshape((1, 96, 10)).expand((4, 96, 10))
    _agrees(v, b, np.broadcast_to(a.reshape(1, 96, 10), (4, 96, 10)))


@pytest.mark.parametrize("seed", range(20))
def test_random_chains_agree_with_numpy(seed):
    rng = np.random.default_rng(seed)
    b, a = _buffer(720), np.arange(720)
    v, want = b.reshape((6, 10, 12)), a.reshape(6, 10, 12)
    for _ in range(4):
        k = rng.integers(4)
        if k == 0:
            order = tuple(int(i) for i in rng.permutation(v.ndim))
            v, want = v.permute(order), want.transpose(order)
        elif k == 1:
            bounds = tuple((int(lo), int(lo) + max(1, int(rng.integers(1, n - lo + 1)))) for n in v.shape
                           for lo in [int(rng.integers(0, n))])  # fmt: skip
            v, want = v.shrink(bounds), want[tuple(slice(lo, hi) for lo, hi in bounds)]
        elif k == 2:
            axes = tuple(i for i in range(v.ndim) if rng.random() < 0.5)
            v, want = v.flip(axes), np.flip(want, axes) if axes else want
        else:
            v, want = v.reshape((1, *v.shape)).expand((2, *v.shape)), np.broadcast_to(want, (2, *want.shape))
    _agrees(v, b, want)


def test_merging_dims_that_are_not_adjacent_in_memory_is_no_strided_view():
    b = _buffer(960)
    assert affine_view(b.reshape((10, 96)).shrink(((0, 10), (0, 50))).reshape((500,)), b) is None
    assert affine_view(b.reshape((10, 96)).pad(((1, 0), (0, 0))), b) is None
    assert affine_view(b.reshape((10, 96)).permute((1, 0)).reshape((960,)), b) is None


# ---------------------------------------------------------------------------------------------------
# merged_shape: the loops of an elementwise kernel, with the dims every read walks in order merged


def _t(shape, seed=0):
    return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).realize()


@pytest.mark.parametrize(
    "name, make, want",
    [
        ("contiguous", lambda a, c: a + 1, (8 * 4 * 5 * 6,)),
        ("per-channel operand", lambda a, c: a * c, (8, 4, 30)),
        ("last two dims swapped", lambda a, c: a.permute(0, 1, 3, 2) + 1, (32, 6, 5)),
        ("inner dim shrunk", lambda a, c: a[:, :, :, 1:] + 1, (160, 5)),
        ("rows shrunk", lambda a, c: a[:, :, 1:, :] + 1, (32, 24)),
        ("size-1 dims between", lambda a, c: a.reshape(8, 4, 1, 30, 1) * 2, (8 * 4 * 30,)),
        ("flipped inner dim", lambda a, c: a.flip(3) + 1, (160, 6)),
        ("padded", lambda a, c: a.pad(((0, 0), (0, 0), (1, 1), (1, 1))) + 1, (8, 4, 7, 8)),
        ("a reduce", lambda a, c: a.sum(3) + 1, (8, 4, 5)),
    ],
)
def test_merged_shape_merges_the_dims_every_read_walks_in_order(name, make, want):
    a, c = _t((8, 4, 5, 6)), _t((4, 1, 1), 1)
    assert merged_shape(make(a, c).uop) == want, name


def test_merged_shape_keeps_a_broadcast_dim_apart():
    a, b = _t((6, 5)), _t((1, 5), 1)
    assert merged_shape((a + b).uop) == (6, 5)  # b's rows have stride 0: (6, 5) is no run of b's elements


def test_merged_shape_leaves_16_bit_float_kernels_alone():
    # gcc 12 vectorizes the half conversions in a nest, not in one long loop (tests/backend/test_half.py)
    a = Tensor(np.ones((16, 300), np.float16)).realize()
    assert merged_shape((a * a).uop) == (16, 300)
    assert merged_shape((a.float() * 2).uop) == (16, 300)

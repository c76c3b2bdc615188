"""Float sums accumulate in levels (a tree of short serial chains), so their error grows like log n, not n.

Each target comes from the correctness issue's table; the references are exact sums or NumPy in float64.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.helpers import buf, render_graph, run
from uopc import Tensor
from uopc.codegen.loops import LEAF, LEVEL
from uopc.codegen.loops import levels as _levels
from uopc.codegen.rangeify import Opts
from uopc.uop import Ops

F01 = float(np.float32(0.1))


@pytest.fixture(params=[0, 1, 2], ids=["OPT0", "OPT1", "OPT2"])
def opt(request, context):
    context(OPT=request.param)
    return request.param


def test_sum_of_2_24_tenths(opt):
    # regression: one accumulator per vector lane gave 1694269.5 (1% off). reference: exact; rtol 1e-6
    got = Tensor(np.full(2**24, 0.1, np.float32)).sum().item()
    assert abs(got - 2**24 * F01) <= 1e-6 * 2**24 * F01, got


def test_sum_of_a_million_tenths(opt):
    # regression: 100060.0 before. reference: exact (100000 up to float32's 0.1); rtol 1e-6
    got = Tensor(np.full(10**6, 0.1, np.float32)).sum().item()
    assert abs(got - 10**6 * F01) <= 1e-6 * 10**6 * F01, got


def test_var_and_mean_far_from_zero():
    # regression: var was 93.09 (the mean was off by ~10). reference: NumPy float64; rtol 1e-4
    x = np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32)
    x64 = x.astype(np.float64) + 1000
    np.testing.assert_allclose((Tensor(x) + 1000).var().item(), x64.var(ddof=1), rtol=1e-4)
    np.testing.assert_allclose((Tensor(x) + 1000).mean().item(), x64.mean(), rtol=1e-4)


def test_row_sums_and_odd_sizes(context):
    # sizes that do not split evenly (a prime, a prime times a power of two), several axes, rows with upcast copies;
    # reference: NumPy float64; rtol 1e-6
    rng = np.random.default_rng(1)
    for shape, axis in [((10007,), None), ((3, 2 * 4099), 1), ((8, 1000, 7), (1, 2)), ((64, 3000), 1), ((517, 9), 0)]:
        a = (rng.standard_normal(shape) + 3).astype(np.float32)
        ref = a.astype(np.float64).sum(axis=axis)
        np.testing.assert_allclose(Tensor(a).sum(axis=axis).numpy(), ref, rtol=1e-6, err_msg=str(shape))


def test_float16_sums_accumulate_in_float32():
    # 20000 x float16(0.1): a float16 accumulator stalls at 256. reference: NumPy float64, rounded to float16
    a = np.full(20000, 0.1, np.float16)
    got = Tensor(a).sum()
    np.testing.assert_allclose(float(got.item()), a.astype(np.float64).sum(), rtol=1e-3)


def test_levels_split_every_reduce_axis():
    # the innermost level holds <= LEAF iterations, each level above <= LEVEL; the pieces multiply back to the shape
    for rshape in [(2**24,), (10**6,), (4096, 4096), (10007,), (7, 1000), (3, 5, 7, 11)]:
        levels = _levels(rshape)
        sizes = {}
        for lv in levels:
            for k, d in lv:
                sizes[k] = sizes.get(k, 1) * d
        assert all(sizes.get(k, 1) == s for k, s in enumerate(rshape)), (rshape, levels)
        assert np.prod([d for _, d in levels[0]]) <= LEAF or len(levels[0]) == 1
        assert all(np.prod([d for _, d in lv]) <= LEVEL or len(lv) == 1 for lv in levels[1:])


def test_whole_sum_runs_its_outer_level_on_threads(context):
    # a full reduction has no output loop: its outermost level is the parallel loop, partials summed after it
    src = render_graph(buf(0, 2**20).reduce(Ops.ADD, 1), 1)
    assert "#pragma omp parallel for" in src
    a = np.random.default_rng(2).standard_normal(2**20).astype(np.float32)
    np.testing.assert_allclose(run(buf(0, 2**20).reduce(Ops.ADD, 1), [a]), a.astype(np.float64).sum(), rtol=1e-5)


def test_sums_under_the_bounds_checker(context):
    # UOPC_CHECK_OOB=1: the partials array and the level indices stay in range; the checked loads keep gcc from
    # vectorizing, so the leaf level is 16 long there too. reference: exact; rtol 1e-6
    context(CHECK_OOB=1)
    for n in (10**6, 2**24):
        got = Tensor(np.full(n, 0.1, np.float32)).sum().item()
        assert abs(got - n * F01) <= 1e-6 * n * F01, (n, got)


@pytest.mark.parametrize(
    "rop,opts",
    [
        (Ops.MAX, Opts(upcast={0: 8}, ktile=3)),  # rows 0-7 one tile, 8-11 the remainder: no output loop in either
        (Ops.MAX, Opts(upcast={0: 8}, ktile=11, vec=8)),
        (Ops.ADD, Opts(upcast={0: 8, 1: 2}, ktile=3)),  # (a float sum takes chunks under a register tile only)
    ],
    ids=["max", "max-vec", "sum-tile"],
)
def test_a_reduce_in_k_chunks_whose_regions_have_no_output_loop(rop, opts):
    # regression (tools.fuzz_opts seed 6): each region of the output runs its own loop over the chunks of K, but the
    # reduce's loops were memoized by the output loops its index uses, and a one-tile region and its remainder use
    # none: the remainder's rows read the tile's chunk loop, inside it (row max of 12 x 33 off by 3.0).
    # reference: NumPy in float64; rtol 1e-5
    x = np.random.default_rng(6).standard_normal((12, 2, 33)).astype(np.float32)
    if rop is Ops.MAX:
        got, want = run(buf(0, x.size).reshape((12, 66)).reduce(rop, 1), [x], opts=opts), x.reshape(12, 66).max(-1)
    else:
        got, want = run(buf(0, x.size).reshape((12, 2, 33)).reduce(rop, 1), [x], opts=opts), x.sum(-1, dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opts", [Opts(unroll=4), Opts(ktile=1000)], ids=["unroll", "ktile"])
def test_levels_win_over_unroll_and_ktile(opts):
    # regression: under OPT=2 the search may pick unroll or ktile for a long sum, which kept one serial chain.
    # reference: exact; rtol 1e-6
    got = run(buf(0, 10**6).reduce(Ops.ADD, 1), [np.full(10**6, 0.1, np.float32)], opts=opts)
    assert abs(float(got) - 10**6 * F01) <= 1e-6 * 10**6 * F01, got


@pytest.mark.parametrize("opts", [Opts(), Opts(upcast={0: 4}, thread=0)], ids=["plain", "channels-upcast"])
def test_a_leaf_read_through_a_cut_runs_as_rows(opts, context):
    # a BatchNorm's statistics over a convolution's output read through its cut: 28 of every 30 positions of each
    # row, summed over (N, H, W) per channel. The leaf level (14 rows of 28 = 392) was one loop read at
    # r // 28 * 30 + r % 28, which gcc keeps scalar (the CNN step's statistics at 12-18 GB/s); its loads take the
    # loop apart, so it runs as loops (14, 28), no division left in the C (the bounds checker's leaf is 16 long: not
    # here). reference: NumPy float64; rtol 1e-5
    context(CHECK_OOB=0)
    x = np.random.default_rng(3).standard_normal((8, 16, 28, 30)).astype(np.float32)
    view = buf(0, x.size).reshape((8, 16, 28, 30)).shrink(((0, 8), (0, 16), (0, 28), (0, 28)))
    graph = view.permute((1, 0, 2, 3)).reshape((16, 8, 784)).reduce(Ops.ADD, 2)  # (H, W) merged, as BatchNorm's
    src = render_graph(graph, 1, opts)
    assert "/" not in src.split("{", 1)[1] and "%" not in src.split("{", 1)[1], src
    assert re.search(r"ridx\d+ < 14;", src) and re.search(r"ridx\d+ < 28;", src), src
    want = x[:, :, :, :28].astype(np.float64).sum(axis=(0, 2, 3))
    np.testing.assert_allclose(run(graph, [x], opts=opts), want, rtol=1e-5)


def test_reduce_axes_walked_in_order_merge(context):
    # a BatchNorm's sum over (N, H, W) of a contiguous (N, C, H, W): H and W are one run in memory, so the leaf is one
    # loop along it (784 = 2 x 392), not rows of 28 (gcc's vectorized rows each end in a horizontal sum). Summed over
    # (B, T) of (B, T, C) for each C the innermost axis has stride C: nothing merges. reference: NumPy float64;
    # rtol 1e-5
    context(CHECK_OOB=0)
    x = np.random.default_rng(4).standard_normal((8, 16, 28, 28)).astype(np.float32)
    graph = buf(0, x.size).reshape((8, 16, 28, 28)).permute((1, 0, 2, 3)).reduce(Ops.ADD, 3)
    src = render_graph(graph, 1)
    assert re.search(r"ridx\d+ < 392;", src) and not re.search(r"ridx\d+ < 28;", src), src
    np.testing.assert_allclose(run(graph, [x]), x.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-5)
    y = np.random.default_rng(5).standard_normal((32, 64, 16)).astype(np.float32)
    cols = buf(0, y.size).reshape((32, 64, 16)).permute((2, 0, 1)).reduce(Ops.ADD, 2)
    assert re.search(r"ridx\d+ < 64;", render_graph(cols, 1))
    np.testing.assert_allclose(run(cols, [y]), y.astype(np.float64).sum(axis=(0, 1)), rtol=1e-5)

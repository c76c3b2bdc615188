"""Transposing copies: a W x W tile read as W vector loads and transposed in registers (uopc.codegen.transpose), W
the machine's vector of the elements, from heuristic.TRANSPOSE_MIN_ELEMENTS on (the mechanism's tests lower it to
0, with the plans built fresh). Values against NumPy (exact: a copy, a ReLU, a doubling), the C against what the
tile must hold."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from uopc.codegen.transpose import transpose_lanes
from uopc.engine import lower as lowering
from uopc.engine import realize
from uopc.engine.realize import capture
from uopc.helpers import Context
from uopc.opt import heuristic
from uopc.renderer.c import render_c
from uopc.runtime import compiler as runtime
from uopc.tensor import Tensor

MACHINE = runtime.machine()


def lanes(dtype) -> int:
    return MACHINE.vector_bytes // np.dtype(dtype).itemsize


@pytest.mark.parametrize("w", [2, 4, 8, 16])
def test_the_shuffle_stages_transpose_a_tile(w):
    rows = [[(i, k) for k in range(w)] for i in range(w)]  # lane k of vector i: element (i, k)
    for h, lo, hi in transpose_lanes(w):
        for i in range(w):
            if not i & h:
                both = rows[i] + rows[i + h]
                rows[i], rows[i + h] = [both[j] for j in lo], [both[j] for j in hi]
    assert rows == [[(k, i) for k in range(w)] for i in range(w)]


@pytest.fixture
def tiles(monkeypatch, tmp_path):
    """Every transposing copy tiled, in plans built for this test (none kept from before, none left after)."""
    monkeypatch.setattr(heuristic, "TRANSPOSE_MIN_ELEMENTS", 0)
    monkeypatch.setenv("UOPC_CACHE", str(tmp_path / "cache"))
    realize._plans.clear()
    lowering.clear_lowered()
    yield
    realize._plans.clear()
    lowering.clear_lowered()


def _kernels(fn):
    with capture() as calls:
        out = fn()
    return out, [k for c in calls for k in c.cp.plan.kernels]


CASES = [
    ((12544, 64), (1, 0), np.float32),  # ResNet-18's stem as rows, read as NCHW
    ((2, 20, 33, 48), (0, 3, 1, 2), np.float32),  # NHWC -> NCHW, a batch of 2
    ((3, 128, 40), (0, 2, 1), np.float32),  # rows not a whole number of tiles: a remainder region
    ((37, 53), (1, 0), np.float32),  # neither side a multiple of the tile
    ((96, 80), (1, 0), np.float64),
    ((64, 100), (1, 0), np.int32),
]


@pytest.mark.parametrize("shape,perm,dtype", CASES)
def test_a_transposing_copy_is_transposed_in_registers(shape, perm, dtype, tiles):
    a = (np.random.default_rng(0).standard_normal(shape) * 100).astype(dtype)
    ref = a.transpose(perm)
    relu = dtype is not np.int32  # (an int ReLU has no vector form: the tile is a plain copy there)
    with Context(OPT=1):  # (make test's second pass runs at OPT=0: no tiles)
        out, kernels = _kernels(
            lambda: (Tensor(a).permute(*perm).relu() if relu else Tensor(a).permute(*perm)).realize()
        )
    np.testing.assert_array_equal(out.numpy(), np.maximum(ref, 0) if relu else ref)
    (k,) = kernels
    w = lanes(dtype)
    src = render_c(k.ast, "k")
    # the (strided read's contiguous axis, last axis) tile of w x w, w vector loads and log2(w) stages of w shuffles
    assert k.opts.vec == w and sorted(k.opts.upcast.values()) == [w, w], k.opts
    if min(shape[perm[-1]], shape[-1]) >= w:  # (a tile's code in each region of whole tiles)
        assert src.count("= UOPC_SHUFFLE(") >= w * (w.bit_length() - 1), src


def test_a_transposing_copy_shorter_than_the_tile_is_a_gather(tiles):
    # 5 rows: no 16 x 16 tile fits, the vectors along the output's rows gather their elements (no shuffle)
    a = np.random.default_rng(1).standard_normal((64, 5)).astype(np.float32)
    with Context(OPT=1):
        out, (k,) = _kernels(lambda: Tensor(a).permute(1, 0).realize())
    np.testing.assert_array_equal(out.numpy(), a.T)
    assert "= UOPC_SHUFFLE(" not in render_c(k.ast, "k")


@pytest.mark.parametrize("check", [0, 1])
def test_a_channels_last_product_is_read_as_nchw_in_tiles(check, tiles):
    # a 3x3 stride-2 convolution's product is channels-last (its positions are the GEMM's rows); the root it is
    # realized as reads it transposed, a tile of vector loads at a time; under index checks too
    g = np.random.default_rng(2)
    x, w = g.standard_normal((2, 24, 33, 33)).astype(np.float32), g.standard_normal((64, 24, 3, 3)).astype(np.float32)
    with Context(CHECK_OOB=check, OPT=1):
        out, kernels = _kernels(lambda: Tensor(x).conv2d(Tensor(w), stride=2, padding=1).relu().realize())
    ref = F.relu(F.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=2, padding=1)).numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert kernels[-1].name == "e_2_64_17_17" and "= UOPC_SHUFFLE(" in render_c(kernels[-1].ast, "k")


def test_only_large_transposing_copies_take_the_tile():
    # lowering a tile costs more than it saves a small copy (heuristic.TRANSPOSE_MIN_ELEMENTS): 64 x 1000 stays a
    # scalar loop, 2048 x (TRANSPOSE_MIN_ELEMENTS / 2048) takes the tile
    g = np.random.default_rng(3)
    for shape, tiled in (((1000, 64), False), ((2048, heuristic.TRANSPOSE_MIN_ELEMENTS // 2048), True)):
        a = g.standard_normal(shape).astype(np.float32)
        with Context(OPT=1):
            out, (k,) = _kernels(lambda a=a: Tensor(a).permute(1, 0).realize())
        np.testing.assert_array_equal(out.numpy(), a.T)
        assert ("= UOPC_SHUFFLE(" in render_c(k.ast, "k")) == tiled, (shape, k.opts)

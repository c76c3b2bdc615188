"""Register tiles lowered once per vector (codegen.lanes): the same vector program as lowering every element and
regrouping (codegen.vectorize), and the same values as NumPy; a tile with no vector form falls back to elements."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.helpers import buf, gemm_graph, lower_graph, run
from uopc.codegen import lanes, rangeify
from uopc.codegen.rangeify import Ctx
from uopc.opt.opts import Opts
from uopc.render_c import render_c
from uopc.runtime import compiler as runtime
from uopc.uop import Ops, UOp

W = runtime.machine().vector_bytes // 4  # float32 lanes per vector on this machine


def _names(c: str) -> str:
    """C with the accumulators numbered in order of appearance (element lowering numbers one per element)."""
    seen: dict[str, str] = {}
    return re.sub(r"\bacc\d+\b", lambda m: seen.setdefault(m.group(0), f"acc{len(seen)}"), c)


def _by_elements(graph: UOp, n_inputs: int, opts: Opts) -> str:
    out = buf(n_inputs, graph.size, graph.dtype)
    return render_c(rangeify._lower_nests(graph, out, Ctx(opts), lanes=False), "k")


def _tile(m_up: int, vectors: int, **kw) -> Opts:
    return Opts(upcast={0: m_up, 1: vectors * W}, vec=W, thread=0, **kw)


M, N, K = 12, 8 * W + 3, 40  # N: whole tiles, a remainder of whole vectors, then single elements
CASES = {
    "gemm": (gemm_graph(M, N, K), 2, _tile(4, 4)),
    "gemm_bt": (gemm_graph(M, N, K, bt=True), 2, _tile(6, 2)),  # B's lanes are K apart: gathered
    "gemm_plus_bias": (gemm_graph(M, N, K) + buf(2, N).reshape((1, N)).expand((M, N)), 3, _tile(4, 2)),
    "gemm_ktile": (gemm_graph(M, 4 * W, 64), 2, _tile(4, 2, ktile=16)),
    # the output's last axis split in two (attention heads): its index is (j // W) * W + j % W
    "gemm_heads": (gemm_graph(M, 4 * W, K).reshape((M, 2, 2 * W)), 2, Opts(upcast={0: 4, 2: 2 * W}, vec=W)),
}


def _inputs(graph: UOp, n: int, rng) -> list[np.ndarray]:
    sizes = {u.arg.slot: u.arg.shape[0] for u in graph.toposort() if u.op is Ops.BUFFER}
    return [rng.standard_normal(sizes[s]).astype(np.float32) for s in range(n)]


@pytest.mark.parametrize("name", list(CASES))
def test_lanes_give_the_element_lowerings_vector_program(name: str):
    graph, n, opts = CASES[name]
    before = dict(lanes.lane_stats)
    by_lanes = render_c(lower_graph(graph, n, opts), "k")
    assert lanes.lane_stats["lanes"] == before["lanes"] + 1, "the tile was lowered element by element"
    assert f"f32x{W}" in by_lanes
    assert _names(by_lanes) == _names(_by_elements(graph, n, opts))


@pytest.mark.parametrize("name", list(CASES))
def test_lane_tiles_compute_the_product(name: str):
    graph, n, opts = CASES[name]
    ins = _inputs(graph, n, np.random.default_rng(0))
    ref = run(graph, ins)  # unoptimized: one scalar loop nest
    np.testing.assert_allclose(run(graph, ins, opts), ref, rtol=1e-5, atol=1e-4)


def test_an_op_with_no_vector_form_runs_lane_by_lane():
    # max (relu) has no lane-wise C operator on gcc vectors: the epilogue takes each lane of the accumulator vector,
    # applies the scalar op and packs the lanes again; the tile keeps its vector accumulators
    graph = gemm_graph(M, 4 * W, K).maximum(0.0)
    before = dict(lanes.lane_stats)
    ins = _inputs(graph, 2, np.random.default_rng(1))
    got = run(graph, ins, _tile(4, 2))
    assert lanes.lane_stats["lanes"] == before["lanes"] + 1
    a, b = ins[0].reshape(M, K), ins[1].reshape(K, 4 * W)
    np.testing.assert_allclose(got, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-4)

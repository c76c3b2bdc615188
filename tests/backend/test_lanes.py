"""Register tiles lowered once per vector (codegen.lanes): the same vector program as lowering every element and
regrouping (codegen.vectorize), and the same values as NumPy; a tile with no vector form falls back to elements."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import tempfile

import numpy as np
import pytest

from tests.helpers import buf, gemm_graph, lower_graph, run
from uopc.codegen import lanes, rangeify
from uopc.codegen import loops as loop_shapes
from uopc.codegen.rangeify import Ctx
from uopc.helpers import Context
from uopc.opt.opts import Opts
from uopc.render_c import render_c
from uopc.renderer.c_masked import masked_helpers
from uopc.runtime import compiler as runtime
from uopc.tensor import Tensor
from uopc.tools import fuzz_opts
from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes

W = runtime.machine().vector_bytes // 4  # float32 lanes per vector on this machine


def _names(c: str) -> str:
    """C with the accumulators numbered in order of appearance (element lowering numbers one per element)."""
    seen: dict[str, str] = {}
    return re.sub(r"\bacc\d+\b", lambda m: seen.setdefault(m.group(0), f"acc{len(seen)}"), c)


def _by_elements(graph: UOp, n_inputs: int, opts: Opts) -> str:
    out = buf(n_inputs, graph.size, graph.dtype)
    return render_c(rangeify._lower_nests(((graph, out),), Ctx(opts), lanes=False), "k")


def _tile(m_up: int, vectors: int, **kw) -> Opts:
    return Opts(upcast={0: m_up, 1: vectors * W}, vec=W, thread=0, **kw)


def _cases(N: int) -> dict[str, tuple[UOp, int, Opts]]:
    return {
        "gemm": (gemm_graph(M, N, K), 2, _tile(4, 4)),
        "gemm_bt": (gemm_graph(M, N, K, bt=True), 2, _tile(6, 2)),  # B's lanes are K apart: gathered
        "gemm_plus_bias": (gemm_graph(M, N, K) + buf(2, N).reshape((1, N)).expand((M, N)), 3, _tile(4, 2)),
        "gemm_ktile": (gemm_graph(M, 4 * W, 64), 2, _tile(4, 2, ktile=16)),
        # the output's last axis split in two (attention heads): its index is (j // W) * W + j % W
        "gemm_heads": (gemm_graph(M, 4 * W, K).reshape((M, 2, 2 * W)), 2, Opts(upcast={0: 4, 2: 2 * W}, vec=W)),
    }


# N: whole tiles, then a remainder that ends in a partial vector (masked), or in whole vectors (CASES_WHOLE: the
# element lowering's program, which ends a remainder in single elements, differs only there)
M, K = 12, 40
CASES, CASES_WHOLE = _cases(8 * W + 3), _cases(6 * W)


def _inputs(graph: UOp, n: int, rng) -> list[np.ndarray]:
    sizes = {u.arg.slot: u.arg.shape[0] for u in graph.toposort() if u.op is Ops.BUFFER}
    return [rng.standard_normal(sizes[s]).astype(np.float32) for s in range(n)]


@pytest.mark.parametrize("name", list(CASES_WHOLE))
def test_lanes_give_the_element_lowerings_vector_program(name: str):
    graph, n, opts = CASES_WHOLE[name]
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


def test_an_index_that_is_the_lane_alone():
    # a 2x2 max pool over one output row (1, 1, 1, 15) with its size-1 axes upcast too: every term of a load's index
    # but the LANE folds to 0, and taking the lane out of that index raised (found by uopc.tools.fuzz_opts, seed 1070)
    x = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)
    item, inputs = fuzz_opts.one_kernel(Tensor(x).reshape(1, 1, 2, 16).max_pool2d(2, 1).uop)
    got = fuzz_opts.run_kernel(item, inputs, Opts(upcast={0: 3, 1: 8, 3: 16}, unroll=4, vec=4))
    np.testing.assert_array_equal(got, np.maximum(np.maximum(x[0, :-1], x[0, 1:]), np.maximum(x[1, :-1], x[1, 1:])))


def test_a_tile_of_bool_loads_a_row_apart_is_read_lane_by_lane():
    # a cumsum over rows of 16 reads its triangular mask (bool) a row apart in each lane: gcc has no vectors of
    # _Bool, so those loads are not transposed in registers (the C did not compile; found by uopc.tools.fuzz_opts,
    # seed 5005)
    x = np.random.default_rng(5).standard_normal((33, 16)).astype(np.float32)
    item, inputs = fuzz_opts.one_kernel(Tensor(x).cumsum(-1).uop)
    got = fuzz_opts.run_kernel(item, inputs, Opts(upcast={1: 8}, unroll=4, vec=4))
    np.testing.assert_allclose(got.reshape(33, 16), np.cumsum(x, -1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("valid", [1, 4])
def test_a_partial_vector_shares_its_rows_broadcast_with_the_whole_vectors(valid: int):
    # a tile of 3 whole vectors and a partial one (a 1x1 convolution over 7x7 positions: 49 columns): each row's A
    # element is broadcast once, to the whole vectors' width, and the partial vector takes that broadcast's first
    # lanes (gcc then loads it as a broadcast from memory; a broadcast of its own, or a scalar FMA, made it load the
    # scalar and shuffle it on an FMA port)
    if W < 8:
        pytest.skip("a partial vector needs vectors wider than 4 floats")
    N = 3 * W + valid
    graph = gemm_graph(8, N, K)
    c = render_c(lower_graph(graph, 2, _tile(4, 4)), "k")
    low = re.findall(rf"f32x4 (alu\d+) = uopc_low_f32x4_f32x{W}\((alu\d+)\);", c)
    assert len(low) == 4, c  # one per row of the tile
    for _, full in low:  # the rows' whole-width broadcasts, which the whole vectors' FMAs read too
        assert re.search(rf"f32x{W} {full} = \(\(f32x{W}\)\{{val\d+,", c) and len(re.findall(rf"\b{full}\b", c)) > 2
    assert not re.search(r"\bfloat acc\d+;", c), c  # no scalar column
    ins = _inputs(graph, 2, np.random.default_rng(4))
    with Context(CHECK_OOB=1):
        got = run(graph, ins, _tile(4, 4))
    np.testing.assert_allclose(got, ins[0].reshape(8, K) @ ins[1].reshape(K, N), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [12, 13])
@pytest.mark.parametrize("extra", [1, 3, W - 1, W + 2, W + 1])
def test_a_partial_vector_ends_a_remainder_in_one_masked_nest(rows: int, extra: int):
    # the columns past the whole tiles are one tile of vectors, the last masked to the columns that exist (in the
    # narrowest vector of 4, 8 or 16 floats that holds them; a single column too, unless it is the remainder's only
    # vector: then a scalar): per row region, one nest for the tiles and one for the remainder, every value as
    # NumPy's, and no load or store outside a buffer (UOPC_CHECK_OOB checks the valid lanes)
    N = 4 * W + extra
    graph = gemm_graph(rows, N, K) + buf(2, N).reshape((1, N)).expand((rows, N))
    opts = _tile(4, 4)
    c = render_c(lower_graph(graph, 3, opts), "k")
    valid = extra % W
    width = min(W, next(n for n in (4, 8, 16) if n >= valid))
    masked = re.findall(rf"uopc_mstore_f32x{width}\(data3\+[^;]*, {valid}\);", c)
    scalar = re.findall(r"data3\[[^]]*\] = ", c)
    alone = valid == 1 and extra < W
    assert (bool(masked), bool(scalar)) == (not alone, alone), c
    assert len(loop_shapes.regions((rows, N), opts.upcast, W, masked=True)) == (2 if rows % 4 == 0 else 4)
    ins = _inputs(graph, 3, np.random.default_rng(2))
    a, b, bias = ins[0].reshape(rows, K), ins[1].reshape(K, N), ins[2]
    with Context(CHECK_OOB=1):
        got = run(graph, ins, opts)
    np.testing.assert_allclose(got, a @ b + bias, rtol=1e-5, atol=1e-4)


MASKED_TYPES = [(dtypes.float32, 4), (dtypes.float32, 8), (dtypes.float32, 16), (dtypes.float64, 2),
                (dtypes.float64, 4), (dtypes.float64, 8)]  # fmt: skip


@pytest.mark.parametrize("march", ["native", "x86-64-v3", "x86-64"])  # AVX-512 (where present), AVX2, none
def test_masked_loads_and_stores_touch_the_valid_lanes_only(march: str):
    # every instruction the helpers choose from (AVX-512's masked moves, AVX's vmaskmov, a copy through memory):
    # lanes from m on load as 0 and are not written, for every vector type a lane tile can have
    typedefs, fns = [], []
    for sc, n in MASKED_TYPES:
        vt = sc.vec(n)
        typedefs.append(f"typedef {sc.cname} {vt.cname} __attribute__((vector_size({vt.itemsize})));")
        fns.append(masked_helpers(vt)[1])
        fns.append(
            f"void k_{vt.cname}(const {sc.cname}* src, {sc.cname}* dst, {sc.cname}* seen, int m) {{\n"
            f"  {vt.cname} v = uopc_mload_{vt.cname}(src, m);\n  __builtin_memcpy(seen, &v, sizeof(v));\n"
            f"  uopc_mstore_{vt.cname}(dst, v + 1, m);\n}}\n"
        )
    with tempfile.TemporaryDirectory() as d:
        c, so = os.path.join(d, "m.c"), os.path.join(d, "m.so")
        with open(c, "w") as f:
            f.write("\n".join(typedefs + fns))
        cc = runtime._resolve_compiler()
        subprocess.run([cc, "-O2", f"-march={march}", "-Wno-psabi", "-shared", "-fPIC", "-o", so, c], check=True)
        lib = ctypes.CDLL(so)
        for sc, n in MASKED_TYPES:
            np_t = np.float32 if sc is dtypes.float32 else np.float64
            fn = getattr(lib, f"k_{sc.vec(n).cname}")
            for m in range(1, n):
                src = np.arange(1, 2 * n + 1, dtype=np_t)  # lanes past m hold values a wrong load would show
                dst, seen = np.full(2 * n, -7, np_t), np.full(n, -7, np_t)
                fn(*(x.ctypes.data_as(ctypes.c_void_p) for x in (src, dst, seen)), ctypes.c_int(m))
                np.testing.assert_array_equal(seen, np.where(np.arange(n) < m, src[:n], 0), err_msg=f"{sc} x{n} m={m}")
                want = np.where(np.arange(2 * n) < m, src + 1, -7)
                np.testing.assert_array_equal(dst, want, err_msg=f"{sc} x{n} m={m}")

"""The CPU optimizer: Opts in lowering, the layout pass, the heuristic, the search and its cache.

Numeric references: NumPy (float32 GEMMs: rtol 1e-4, atol 1e-4, accumulation order differs between Opts).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.helpers import buf, gemm_graph
from uopc import opt
from uopc.codegen.rangeify import Ctx, Opts, lower
from uopc.engine.tune import KernelTimer
from uopc.helpers import Context
from uopc.machine import Machine
from uopc.opt import candidate_opts, gemm, hand_opt_choice, layout_pass, search_opt
from uopc.opt.search import _dedup
from uopc.renderer.c import render_c
from uopc.runtime import compiler as runtime
from uopc.runtime.compiler import Program
from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes

rng = np.random.default_rng(0)
M = runtime.machine()  # what the compiler targets with the current CC and CFLAGS
TIMER = KernelTimer()  # the engine's timer, as OPT=2 uses it
# the chapter's machine: 2 cores, 1 MiB of L2 per core (a Zen 4), AVX-512
ZEN4 = Machine(
    model="chapter",
    isa=frozenset({"avx2", "fma", "avx512f"}),
    vector_bytes=64,
    auto_vector_bytes=64,
    vector_registers=32,
    cores=2,
    l1d_bytes=32 << 10,
    l2_bytes=1 << 20,
)


def run_gemm(M, N, K, opts, bt=False):
    a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
    c = np.zeros(M * N, np.float32)
    src = render_c(lower(gemm_graph(M, N, K, bt=bt), buf(2, M * N), Ctx(opts=opts)), "k")
    Program(src, "k")(a, np.ascontiguousarray(b.T) if bt else b, c)
    return src, c.reshape(M, N), a @ b


def test_layout_pass_stages_transposed_operand():
    # below GEMM_MIN_WORK (no packed microkernel): a strided operand is staged as a contiguous copy
    (g2,) = layout_pass([gemm_graph(16, 16, 16)], M)
    assert any(u.op is Ops.STAGE for u in g2.toposort())
    (g3,) = layout_pass([gemm_graph(16, 16, 16, bt=True)], M)  # already contiguous: nothing to do
    assert not any(u.op is Ops.STAGE for u in g3.toposort())


def test_upcast_shares_reduce_loop():
    src = render_c(lower(gemm_graph(8, 8, 8), buf(2, 64), Ctx(opts=Opts(upcast={0: 2, 1: 2}))), "k")
    assert src.count("for (") == 3  # 2 output loops + ONE shared reduce loop
    assert src.count("float acc") >= 4


@pytest.mark.parametrize("tile", [{0: 8, 1: 16}, {1: 32}, {0: 16}])
def test_cache_blocking_correct(tile):
    src, got, ref = run_gemm(32, 64, 48, Opts(upcast={0: 4, 1: 4}, thread=0, tile=tile))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert src.count("for (") == 3 + len(tile)  # one extra block loop per tiled axis


def test_ignored_tiles():
    # a tile that does not divide, is not a multiple of the upcast, or covers the whole axis is ignored
    for tile in ({0: 7}, {0: 6}, {0: 32}):
        src, got, ref = run_gemm(32, 32, 8, Opts(upcast={0: 4}, tile=tile))
        assert src.count("for (") == 3
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_reduce_unroll_has_no_inner_loop():
    x = buf(0, 16)
    src = render_c(lower(x.reduce(Ops.ADD, 1), buf(1, 1), Ctx(opts=Opts(unroll=16))), "k")
    assert "for (" not in src  # a 16-element sum as straight-line code, added in a balanced tree
    data = rng.standard_normal(16).astype(np.float32)
    out = np.zeros(1, np.float32)
    Program(src, "k")(data, out)
    np.testing.assert_allclose(out[0], data.sum(), rtol=1e-5)


def test_reduce_unroll_tree():
    src, got, ref = run_gemm(8, 8, 64, Opts(unroll=4), bt=True)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert "for (int ridx2 = 0; ridx2 < 16;" in src


def test_thread_accumulator_is_private():
    src = render_c(lower(gemm_graph(64, 64, 64, bt=True), buf(2, 64 * 64), Ctx(opts=Opts(thread=0))), "k")
    lines = src.splitlines()
    pragma = next(i for i, ln in enumerate(lines) if "#pragma omp parallel for" in ln)
    decl = next(i for i, ln in enumerate(lines) if "float acc0;" in ln)
    assert decl > pragma + 1  # declared inside the parallel loop: each thread has its own
    indent = lambda ln: len(ln) - len(ln.lstrip())
    assert indent(lines[decl]) > indent(lines[pragma + 1])


def _body(shape, rsize=None):
    if rsize is None:
        return buf(0, int(np.prod(shape))).reshape(shape) * 2.0
    return buf(0, int(np.prod(shape)) * rsize).reshape((*shape, rsize)).reduce(Ops.MAX, 1)


def test_hand_opt_choice_on_the_chapter_shapes(monkeypatch):
    # the plain register tile and cache blocks (the packed microkernel is tested in tests/backend/test_gemm.py)
    monkeypatch.setattr(gemm, "GEMM_MIN_WORK", 1 << 62)
    g = hand_opt_choice(gemm_graph(1024), ZEN4)
    assert (g.upcast, g.thread) == ({0: 4, 1: 4}, 0)
    # B^T (4 MiB) does not fit this 1 MiB L2: square blocks whose 2 x 64 rows of 4 KiB fill half of it
    assert g.tile == {0: 64, 1: 64}
    # the same kernel for an L2 of 2 MiB (the Xeon's): blocks of 128, and none on one core
    assert hand_opt_choice(gemm_graph(1024), replace(ZEN4, l2_bytes=2 << 20)).tile == {0: 128, 1: 128}
    assert hand_opt_choice(gemm_graph(1024), replace(ZEN4, cores=1)).thread is None
    small = hand_opt_choice(gemm_graph(256), ZEN4)
    assert small.tile == {}  # 256 KiB of operand rows fit in L2: no blocks
    rm = hand_opt_choice(_body((128,), 10), ZEN4)  # the log_softmax row max of the MNIST step: a short max, whole
    assert (rm.upcast, rm.thread, rm.unroll) == ({}, None, 10)
    # a max pool's window (2 x 2 at stride 2) likewise; a long max keeps the register tile
    pool = buf(0, 64 * 113 * 113).reshape((64, 113, 113)).pad(((0, 0), (0, 1), (0, 1)))
    pool = pool.reshape((64, 57, 2, 57, 2)).shrink(((0, 64), (0, 56), (0, 2), (0, 56), (0, 2)))
    windows = pool.permute((0, 1, 3, 2, 4)).reshape((64, 56, 56, 4))
    mp = hand_opt_choice(windows.reduce(Ops.MAX, 1), ZEN4)
    assert (mp.upcast, mp.unroll) == ({}, 4)
    # a sum over that window too: a register tile would reuse no load (the input moves along both of its axes); a
    # short matmul keeps its tile (A stays the same along its columns, B along its rows)
    ap = hand_opt_choice(windows.reduce(Ops.ADD, 1), ZEN4)
    assert (ap.upcast, ap.unroll) == ({}, 4)
    short = hand_opt_choice(gemm_graph(64, 64, 16), ZEN4)
    assert (short.upcast, short.unroll) == ({0: 4, 1: 4}, 1)
    assert hand_opt_choice(_body((1024,), 512), ZEN4).upcast == {0: 4}
    ew = hand_opt_choice(_body((784, 128)), ZEN4)
    assert (ew.upcast, ew.thread) == ({}, 0)
    assert hand_opt_choice(_body((128,)), ZEN4) == Opts()
    s = hand_opt_choice(buf(0, 16).reduce(Ops.ADD, 1), ZEN4)
    assert (s.upcast, s.thread, s.unroll) == ({}, None, 4)


def test_a_transposing_elementwise_kernel_gets_blocks_also_when_its_loops_merge():
    # relu of a (P, C) product read as (C, 8, 8): the two spatial dims merge into one loop (merged_shape), which puts
    # a view on top of the ALU ops; the strided read is still seen, so the transposing kernel gets 32 x 32 blocks
    from uopc.opt.strides import merged_shape

    x = buf(0, 64 * 128).reshape((64, 128)).permute((1, 0)).reshape((128, 8, 8))
    body = x.alu(Ops.MAX, UOp.const(0.0, dtypes.float32).reshape((1, 1, 1)).expand((128, 8, 8)))
    shape = merged_shape(body)
    assert shape == (128, 64)
    assert hand_opt_choice(body.reshape(shape), ZEN4).tile == {0: 32, 1: 32}
    assert hand_opt_choice(buf(0, 64 * 128).reshape((128, 64)).alu(Ops.NEG), ZEN4).tile == {}  # read in order


def test_a_transposing_copy_runs_on_threads_from_fewer_elements():
    # a read at a stride along the innermost axis costs several times a contiguous one: a transposing copy takes
    # threads from THREAD_MIN_WORK / STRIDED_WORK elements, a copy that reads in order only from THREAD_MIN_WORK
    from uopc.opt import heuristic

    n = heuristic.THREAD_MIN_WORK // heuristic.STRIDED_WORK

    def transposing(size: int) -> UOp:
        return buf(0, size).reshape((size // 64, 64)).permute((1, 0)).alu(Ops.NEG)

    assert hand_opt_choice(transposing(n), ZEN4).thread == 0
    assert hand_opt_choice(transposing(n // 2), ZEN4).thread is None
    assert hand_opt_choice(transposing(n), replace(ZEN4, cores=1)).thread is None
    assert hand_opt_choice(buf(0, n).reshape((64, n // 64)).alu(Ops.NEG), ZEN4).thread is None


def test_dedup_key_keeps_cache_blocks(monkeypatch):
    # regression: a key of (upcast, thread, unroll) silently dropped every cache-blocked candidate
    monkeypatch.setattr(gemm, "GEMM_MIN_WORK", 1 << 62)  # the plain heuristic's candidate (no cache blocks)
    cands = _dedup(candidate_opts(gemm_graph(256, bt=True), M))
    assert sum(1 for o in cands if o.tile) == 3
    assert len({o.key() for o in cands}) == len(cands)


GRAPHS = {
    "gemm_odd": lambda: gemm_graph(24, 40, 36),
    "gemm_bt_odd": lambda: gemm_graph(40, 24, 12, bt=True),
    "rowsum": lambda: buf(0, 96 * 20).reshape((96, 20)).reduce(Ops.ADD, 1),
    "colmax": lambda: buf(0, 20 * 96).reshape((20, 96)).permute((1, 0)).reduce(Ops.MAX, 1),
}


def _softmax_graph():
    x = buf(0, 32 * 48).reshape((32, 48))
    m = x.reduce(Ops.MAX, 1).reshape((32, 1)).expand((32, 48))
    e = ((x - m) * 1.4426950408889634).alu(Ops.EXP2)
    return e * e.reduce(Ops.ADD, 1).reshape((32, 1)).expand((32, 48)).alu(Ops.RECIP)


def _layernorm_graph():
    x = buf(0, 16 * 64).reshape((16, 64))
    mean = (x.reduce(Ops.ADD, 1) * (1 / 64)).reshape((16, 1)).expand((16, 64))
    d = x - mean
    var = ((d * d).reduce(Ops.ADD, 1) * (1 / 64) + 1e-5).alu(Ops.SQRT).alu(Ops.RECIP)
    return d * var.reshape((16, 1)).expand((16, 64))


GRAPHS["softmax_fused"] = _softmax_graph
GRAPHS["layernorm_fused"] = _layernorm_graph


@pytest.mark.parametrize("name", list(GRAPHS))
def test_every_candidate_matches_opt0(name):
    g = GRAPHS[name]()
    bufs = sorted({u for u in g.toposort() if u.op is Ops.BUFFER}, key=lambda u: u.arg.slot)
    data = [rng.standard_normal(b.arg.shape[0]).astype(np.float32) for b in bufs]
    out = buf(len(bufs), g.size)

    def run(o):
        res = np.zeros(g.size, np.float32)
        Program(render_c(lower(g, out, Ctx(opts=o)), "k"), "k")(*data, res)
        return res

    ref = run(Opts())
    cands = _dedup(candidate_opts(g, M))
    assert len(cands) > 2
    for o in cands:
        np.testing.assert_allclose(run(o), ref, rtol=1e-4, atol=1e-5, err_msg=str(o))


@pytest.mark.single_pass  # the search cache's keys: nothing here depends on OPT or index checks
def test_search_result_is_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("UOPC_CACHE", str(tmp_path / "cache"))
    g = gemm_graph(32, 32, 32, bt=True)
    out = buf(2, 32 * 32)
    before = opt.search_stats["timed"]
    o1 = search_opt(g, out, M, TIMER)
    timed = opt.search_stats["timed"] - before
    assert timed >= 10
    o2 = search_opt(g, out, M, TIMER)  # a second run reads the winner from disk: no timing
    assert opt.search_stats["timed"] - before == timed
    assert o1.key() == o2.key()


@pytest.mark.single_pass  # the search cache's keys: nothing here depends on OPT or index checks
@pytest.mark.parametrize("change", ["cflags", "compiler_version", "cpu", "threads"])
def test_search_result_not_reused_under_other_code_or_machine(change, tmp_path, monkeypatch):
    # regression: the search key once left out CFLAGS and the compiler version, so a choice timed under one set of
    # flags was applied under another. Flags, compiler, CPU and thread count all decide what was measured.
    monkeypatch.setenv("UOPC_CACHE", str(tmp_path / "cache"))
    g, out = gemm_graph(16, 16, 16, bt=True), buf(2, 16 * 16)
    search_opt(g, out, M, TIMER)
    key = opt.search_key(g, out, runtime.machine(), TIMER)
    flags = Context(CFLAGS=[*runtime.base_cflags(), "-fno-unroll-loops"]) if change == "cflags" else None
    if flags is not None:
        flags.__enter__()
    elif change == "compiler_version":
        cc = runtime._resolve_compiler()
        monkeypatch.setitem(runtime._version_cache, cc, runtime._compiler_version(cc) + " (patched)")
    elif change == "cpu":
        monkeypatch.setattr(runtime, "cpu_fingerprint", lambda: "another-cpu")
    else:
        n = runtime.get_num_threads()
        runtime.set_num_threads(1 if n > 1 else 2)
    try:
        assert opt.search_key(g, out, runtime.machine(), TIMER) != key
        before = opt.search_stats["timed"]
        search_opt(g, out, M, TIMER)
        assert opt.search_stats["timed"] > before, "a result timed under other conditions was reused"
    finally:
        if change == "threads":
            runtime.set_num_threads(n)
        if flags is not None:
            flags.__exit__(None, None, None)


def test_tensor_matmul_at_every_opt_level(context, monkeypatch):
    from uopc.tensor import Tensor

    a, b = rng.standard_normal((48, 40)).astype(np.float32), rng.standard_normal((40, 56)).astype(np.float32)
    for level in (0, 1, 2):
        context(OPT=level)
        np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_debug3_prints_opts(context, monkeypatch, capsys):
    from uopc.tensor import Tensor

    context(DEBUG=3)
    context(OPT=1)
    (Tensor(rng.standard_normal((64, 96)).astype(np.float32)) @ Tensor(np.ones((96, 32), np.float32))).realize()
    assert "Opts(upcast=" in capsys.readouterr().out


def test_dtypes_and_opts():
    # an int GEMM under a register tile + threads, vs NumPy (exact)
    a = rng.integers(-5, 5, (16, 12)).astype(np.int32)
    b = rng.integers(-5, 5, (12, 8)).astype(np.int32)
    g = gemm_graph(16, 8, 12)
    g = g.substitute({u: buf(u.arg.slot, u.arg.shape[0], dtypes.int32) for u in g.toposort() if u.op is Ops.BUFFER})
    c = np.zeros(16 * 8, np.int32)
    Program(render_c(lower(g, buf(2, 128, dtypes.int32), Ctx(opts=Opts(upcast={0: 4, 1: 4}, thread=0))), "k"), "k")(
        a, b, c
    )
    np.testing.assert_array_equal(c.reshape(16, 8), a @ b)


@pytest.mark.parametrize("ktile", [16, 32])
def test_reduce_axis_blocking(ktile):
    # exercise 6: the reduce-chunk loop sits between the block loops and the register tiles; partial sums live in
    # the output between chunks. K=48 is not a power of two
    o = Opts(upcast={0: 4, 1: 4}, thread=0, tile={0: 16, 1: 16}, ktile=ktile)
    src, got, ref = run_gemm(32, 32, 96, o, bt=True)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert src.count("for (") == 3 + 2 + 1  # 2 outputs + 1 reduce, 2 block loops, 1 chunk loop


@pytest.mark.parametrize(
    "opts",
    [
        Opts(upcast={0: 4, 1: 4}, thread=0, tile={1: 16}),  # another axis blocked, the thread axis not
        Opts(upcast={0: 4, 1: 4}, thread=0, ktile=32),  # the reduction in chunks
        Opts(upcast={0: 4, 1: 4}, thread=1, tile={0: 8}, ktile=32),  # both, threads on the second axis
    ],
)
def test_the_thread_loop_is_outermost_under_blocks_and_chunks(opts):
    # the THREAD axis's loop nests outside every block and chunk loop: inside them it started a parallel region per
    # block (a panel copy of the CNN step ran 98 regions a call at 0.6 GB/s; a weight gradient, one per K chunk)
    src, got, ref = run_gemm(32, 32, 96, opts, bt=True)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    lines = [ln.strip() for ln in src.splitlines()]
    first = next(i for i, ln in enumerate(lines) if ln.startswith("for ("))
    assert lines[first - 1] == "#pragma omp parallel for" and src.count("#pragma omp parallel for") == 1, src


def test_reduce_axis_blocking_ignored_after_the_reduce():
    # a value computed after the reduce (here relu) would be applied to partial sums: ktile must not apply
    g = gemm_graph(16, 16, 64, bt=True)
    relu = (UOp.const(0.0) < g).where(g, UOp.const(0.0))
    plain = render_c(lower(relu, buf(2, 256), Ctx(opts=Opts(upcast={0: 4}, tile={0: 8}))), "k")
    blocked = render_c(lower(relu, buf(2, 256), Ctx(opts=Opts(upcast={0: 4}, tile={0: 8}, ktile=16))), "k")
    assert plain == blocked

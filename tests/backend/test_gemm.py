"""Vector dtypes and ops, the vectorize pass, the packed GEMM microkernel and split-K.

Numeric references: NumPy in float64, rounded to float32 (rtol 1e-4, atol 1e-4 scaled by sqrt(K): the microkernel
sums in another order than NumPy's). The `gcc -S` checks compile the kernel the heuristic chooses with uopc's own
CFLAGS and read the assembly.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace

import numpy as np
import pytest

from tests.helpers import buf, gemm_graph, run
from uopc import helpers
from uopc.codegen.linearize import Loop
from uopc.codegen.loops import REGION_THREAD_MIN
from uopc.codegen.rangeify import Ctx, Opts, lower
from uopc.kernelize import make_plan
from uopc.opt import HandOpt, hand_opt_choice, layout_pass
from uopc.opt.gemm import (
    FAR_PREFETCH_BYTES,
    FAR_PREFETCH_TILES,
    GEMM_MIN_WORK,
    KC_MIN,
    SPLITK_MAX_OUT,
    _row_block,
    gemm_opts,
    microkernel,
)
from uopc.renderer.c import render_c
from uopc.renderer.flags import unit_cflags
from uopc.renderer.prefetch import PREFETCH_BYTES, PREFETCH_MIN_STEPS, streamed_loads
from uopc.runtime import compiler as runtime
from uopc.runtime.buffer import aligned_empty
from uopc.runtime.compiler import Program
from uopc.tensor import Tensor
from uopc.uop import AxisType, Ops, UOp
from uopc.uop.dtype import dtypes

rng = np.random.default_rng(0)
MACHINE = runtime.machine()  # what the compiler targets with the current CC and CFLAGS
W = MACHINE.vector_bytes // 4  # floats per vector register
MR, NR, _ = microkernel(1024, 1024, 4, MACHINE)


def _aligned(x: np.ndarray) -> np.ndarray:
    a = aligned_empty(x.size, dtypes.from_np(x.dtype))
    a[:] = x.reshape(-1)
    return a


def _check_matmul(a: np.ndarray, b: np.ndarray, got: np.ndarray) -> None:
    ref = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    k = a.shape[-1]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, k**0.5))


# ------------------------------------------------------------------ the IR: vector dtypes, VECTORIZE, GEP


def test_vector_dtype():
    v = dtypes.f32.vec(8)
    assert v is dtypes.float32.vec(8) and v.count == 8 and v.itemsize == 32 and v.scalar() is dtypes.f32
    assert v.cname == "f32x8" and repr(v) == "dtypes.f32.vec(8)" and dtypes.f32.vec(1) is dtypes.f32
    with pytest.raises(ValueError, match="power of two"):
        dtypes.f32.vec(3)
    with pytest.raises(ValueError, match="already a vector"):
        v.vec(2)
    x = UOp.const(1.0)
    assert UOp(Ops.VECTORIZE, (x,) * 8).dtype is v
    assert UOp(Ops.GEP, (UOp(Ops.VECTORIZE, (x,) * 8),), 3).dtype is dtypes.f32


def test_gep_and_vectorize_render():
    # out[i] = (x[i] * 2) with the 8 copies packed into one vector by hand, then read back lane by lane (GEP)
    x, out = buf(0, 8), buf(1, 8)
    lanes = tuple(x.index(UOp.const(i, dtypes.int32)).load() * 2.0 for i in range(8))
    v = UOp(Ops.VECTORIZE, lanes)
    ast = UOp(Ops.SINK, tuple(out.index(UOp.const(i, dtypes.int32)).store(UOp(Ops.GEP, (v,), i)) for i in range(8)))
    src = render_c(ast, "k")
    assert "typedef float f32x8 __attribute__((vector_size(32)));" in src and "[7])" in src
    a, o = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    Program(src, "k")(a, o)
    np.testing.assert_array_equal(o, a * 2)


@pytest.mark.parametrize("n", [64, 72, 5, 11])
def test_vectorize_elementwise(n):
    # an upcast of the contiguous last axis becomes vector loads, ops and stores; a remainder ends in a partial
    # vector, its loads and stores masked to the elements that exist (codegen.lanes)
    x = buf(0, 3 * n).reshape((3, n))
    g = x * 2.0 + 1.0
    src = render_c(lower(g, buf(1, 3 * n), Ctx(opts=Opts(upcast={1: 8}, vec=8))), "k")
    a, o = _aligned(rng.standard_normal(3 * n).astype(np.float32)), _aligned(np.zeros(3 * n, np.float32))
    Program(src, "k")(a, o)
    np.testing.assert_allclose(o, a * 2 + 1, rtol=1e-6)
    assert ("(*(f32x8" in src) == (n >= 8)  # vector loads and stores
    assert ("uopc_mstore_f32x8(data1+" in src) == (n % 8 > 4)
    assert ("uopc_mstore_f32x4(data1+" in src) == (0 < n % 8 < 4)
    assert not re.search(r"data1\[", src), "an element stored alone"


def test_vectorize_selects_on_a_vector_mask():
    # gcc's vector extension has no ?: on vectors in C: a ReLU's select on a float compare is the compare of whole
    # vectors (a mask of all-ones or all-zeros lanes) and the two values' bits ANDed with it and its complement; a
    # NaN, a -0.0 and a negative give +0.0, as where(0 < x, x, 0) does element by element
    x = buf(0, 64).reshape((4, 16))
    g = (UOp.const(0.0) < x).where(x, UOp.const(0.0))
    src = render_c(lower(g, buf(1, 64), Ctx(opts=Opts(upcast={1: 8}, vec=8))), "k")
    assert "((f32x8)(((i32x8)" in src and "?" not in src.split("void k", 1)[1] and "(*(f32x8" in src
    xs = np.arange(64, dtype=np.float32) - 31.5
    xs[[3, 17, 40]] = [np.nan, -0.0, np.inf]
    a, o = _aligned(xs), _aligned(np.full(64, 7.0, np.float32))
    Program(src, "k")(a, o)
    np.testing.assert_array_equal(o, np.where(0 < xs, xs, np.float32(0)))
    assert not np.signbit(o).any()


def test_vectorize_checks_bounds(context):
    context(CHECK_OOB=1)
    x = buf(0, 64).reshape((4, 16))
    src = render_c(lower(x * 3.0, buf(1, 64), Ctx(opts=Opts(upcast={1: 16}, vec=16))), "k")
    assert re.search(r"uopc_check\(uopc_oob, \w+, 16, 0, 64, 0\)", src)  # the whole span of the vector load
    a, o = _aligned(np.arange(64, dtype=np.float32)), _aligned(np.zeros(64, np.float32))
    Program(src, "k")(a, o)
    np.testing.assert_array_equal(o, a * 3)


# ------------------------------------------------------------------ the microkernel in gcc -S


def _gemm_kernel(m: int, n: int, k: int) -> str:
    """The C of the matmul kernel the layout pass and heuristic make for an (m, k) @ (k, n) product."""
    plan, _ = make_plan([gemm_graph(m, n, k)], opt=HandOpt(MACHINE))
    (kern,) = [x for x in plan.kernels if x.name.startswith("r_")]
    return render_c(kern.ast, "gemm")


def _asm(src: str) -> str:
    """The assembly gcc makes of `src` under the default flags and its unit's own (renderer.flags), as a plan's."""
    cmd = [runtime._resolve_compiler(), *runtime.cflags(), *unit_cflags(src), "-S", "-x", "c", "-", "-o", "-"]
    return subprocess.run(cmd, input=src, capture_output=True, text=True, check=True).stdout


def test_gemm_inner_loop_uses_packed_fma_and_does_not_spill():
    # whole tiles only (no remainder loop nests): every FMA in the kernel is the microkernel's
    asm = _asm(_gemm_kernel(4 * MR, 2 * NR, 256))
    reg = {64: "zmm", 32: "ymm"}.get(MACHINE.vector_bytes, "xmm")  # the microkernel's explicit vectors
    packed = re.findall(rf"vfmadd\w+ps\s+[^\n]*%{reg}", asm)
    assert len(packed) >= MR * NR // W, f"expected >= {MR * NR // W} packed FMAs on {reg}, found {len(packed)}"
    assert not re.search(r"vfmadd\w+ss", asm), "scalar FMA in the GEMM kernel"
    # no vector register is stored to or reloaded from the stack: the MR x NR tile fits in registers
    spills = re.findall(rf"vmov\w+\s+(%{reg}\d+, )?-?\d*\(%r[sb]p\)(, %{reg}\d+)?", asm)
    assert not spills, f"{len(spills)} vector spills: {spills[:3]}"


def test_microkernel_prefetches_the_operand_it_streams():
    # each vector load of B in the k loop (a panel, or B in place: NR or n floats a step) prefetches the element
    # PREFETCH_BYTES ahead, rounded up to whole steps, or PREFETCH_MIN_STEPS steps ahead if that is further (here K =
    # 256: a quarter of it is more); A's broadcasts (scalar loads) and the stores do not (with index checks, the
    # loads' indices are checked and the prefetches' are not: they read nothing)
    src = _gemm_kernel(4 * MR, 2 * NR, 256)
    b_loads = re.findall(r"\(\*\(f32x\d+(?:_u)?\*\)\(data1\+", src)
    pf = re.findall(r"__builtin_prefetch\(data(\d+)\+\(?(\w+(?:\+\d+)?)\)?\+(\d+)\);", src)
    assert pf and len(pf) == len(b_loads) and {b for b, _, _ in pf} == {"1"}
    ahead = {int(d) for _, _, d in pf}
    steps = [(max(-(-PREFETCH_BYTES // (s * 4)), PREFETCH_MIN_STEPS), s) for s in (NR, 2 * NR)]
    assert len(ahead) == 1 and ahead.pop() in {n * s for n, s in steps}
    if not helpers.settings().CHECK_OOB:  # each right after its load, at its address
        loads = re.findall(r"\(\*\(f32x\d+(?:_u)?\*\)\(data1\+\(?(\w+(?:\+\d+)?)\)?\)\);", src)
        assert [e for _, e, _ in pf] == loads
        assert "prefetcht0" in _asm(src)


def test_streamed_loads_step_through_memory():
    # only vector loads that move a vector or more per iteration of their own reduce loop prefetch: PREFETCH_BYTES
    # ahead, or PREFETCH_MIN_STEPS iterations if that is further (at most a quarter of the loop's: a load that jumps
    # 16 KiB an iteration prefetches 16 iterations ahead in a loop of 64, 8 in a loop of 32, not the one iteration
    # its bytes would give), and where the loop carries a distance of its own (Opts.prefetch) that far too, in whole
    # steps
    ctx, far = Ctx(), Ctx(Opts(prefetch=5000))
    r, inner, rf = ctx.rng(64, AxisType.REDUCE), ctx.rng(4, AxisType.REDUCE), far.rng(64, AxisType.REDUCE)
    assert rf.arg.prefetch == 5000 and far.rng(8).arg.prefetch == 0  # (reduce loops only)
    base, v16 = buf(0, 1 << 16), dtypes.float32.vec(16)

    def load(i: UOp, dt=v16) -> UOp:
        return UOp(Ops.LOAD, (UOp(Ops.INDEX, (base, i), None, dt),), None, dt)

    panel, slow, scalar = load(r * 64 + 32), load(r * 4), load(r * 64, dtypes.float32)
    nested = load(inner * 64 + r)
    body = [panel, slow, scalar, Loop(inner, [nested])]
    near = max(-(-PREFETCH_BYTES // 256), min(PREFETCH_MIN_STEPS, 64 // 4)) * 64
    assert streamed_loads(Loop(r, body)) == {panel: (near, 0)}
    assert streamed_loads(Loop(inner, [nested])) == {nested: (-(-PREFETCH_BYTES // 256) * 64, 0)}  # 4 iterations
    streamed = load(rf * 64)
    assert streamed_loads(Loop(rf, [streamed])) == {streamed: (near, -(-5000 // 256) * 64)}
    # a row of 4096 floats an iteration (B read in place, one row of an activation per k)
    short = ctx.rng(32, AxisType.REDUCE)
    rows, rows_short = load(r * 4096), load(short * 4096)
    assert PREFETCH_BYTES <= 4096 * 4 and PREFETCH_MIN_STEPS >= 8
    assert streamed_loads(Loop(r, [rows])) == {rows: (min(PREFETCH_MIN_STEPS, 16) * 4096, 0)}
    assert streamed_loads(Loop(short, [rows_short])) == {rows_short: (8 * 4096, 0)}


def test_few_tiles_over_a_large_b_prefetch_it_far_ahead(context):
    # B larger than L2 read by at most FAR_PREFETCH_TILES register tiles per block (few rows: a Winograd product's
    # tiles, a 128-token projection) is prefetched FAR_PREFETCH_BYTES ahead into L2 as well (Opts.prefetch, carried
    # by the kernel's reduce loops); many rows, a B that fits L2 or a one-row tile (a GEMV) are not. Sizes from this
    # machine's L2 and tile, with more outputs than split-K takes
    rows = 2 * MR + 4
    n = -(-(SPLITK_MAX_OUT // rows + 1) // NR) * NR
    k = 256
    while k * n * 4 <= MACHINE.l2_bytes:
        k *= 2

    def prefetch(m: int, kk: int) -> int:
        return gemm_opts(layout_pass([gemm_graph(m, n, kk)], MACHINE)[0], MACHINE).prefetch

    assert prefetch(rows, k) == FAR_PREFETCH_BYTES
    # (over rows, at most 4 blocks a thread: each more than FAR_PREFETCH_TILES tiles)
    assert prefetch((FAR_PREFETCH_TILES + 1) * MR * 4 * max(MACHINE.cores, 1), k) == 0
    assert prefetch(rows, 64) == 0  # B in L2
    assert prefetch(1, k) == 0
    graph = gemm_graph(rows, n, k)
    plan, _ = make_plan([graph], opt=HandOpt(MACHINE))
    (kern,) = [x for x in plan.kernels if x.name.startswith("r_")]
    assert kern.opts.prefetch == FAR_PREFETCH_BYTES and ", 0, 2);" in render_c(kern.ast, "gemm")
    a = rng.standard_normal((rows, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    _check_matmul(a, b, run(layout_pass([graph], MACHINE)[0], [a, b], kern.opts))


def test_a_tile_three_vectors_wide_where_whole_tiles_then_cover_more_columns(context):
    """Columns that 3-vector tiles cover (all but one of ResNet-18's 49 output positions at 7x7) but 2- or 4-vector
    tiles leave to the remainder region take 3 vectors and the rows the accumulator budget then holds (8x48 on
    AVX-512); where 4-vector tiles cover as many, 4 stay, unless only the 3-vector tile's rows divide the output's
    (512 rows: 8x48, not 6x64 with 2 rows left over). A machine with 16 vector registers has no 3-vector tile of
    6 rows and keeps 2. The 3-vector tile keeps its accumulators in registers and computes the product."""
    for vector_bytes, registers in [(64, 32), (32, 16)]:
        m = replace(MACHINE, vector_bytes=vector_bytes, vector_registers=registers)
        w, budget = vector_bytes // 4, registers * 3 // 4
        three = budget // 3 >= 6
        assert microkernel(512, 3 * w + 1, 4, m) == ((budget // 3, 3 * w, w) if three else (6, 2 * w, w))
        assert microkernel(512, 6 * w + 2, 4, m)[1] == (3 if three else 2) * w  # 4-vector tiles: 4w columns
        assert microkernel(510, 12 * w + 2, 4, m)[1] == (4 if budget // 4 >= 6 else 2) * w  # as many: the widest
        # ... unless its rows leave a remainder that the narrower tile's rows do not: 512 rows in 8-row tiles
        rows8 = three and budget // 4 >= 6 and budget // 3 == 8
        assert microkernel(512, 12 * w + 2, 4, m) == ((8, 3 * w, w) if rows8 else microkernel(510, 12 * w + 2, 4, m))
    mr, nr, w = microkernel(512, 3 * W + 1, 4, MACHINE)
    if nr != 3 * w:
        return
    if not helpers.settings().CHECK_OOB:  # (index checks add a branch per load to the loop gcc compiles)
        asm = _asm(_gemm_kernel(4 * mr, 2 * nr, 256))
        reg = {64: "zmm", 32: "ymm"}.get(MACHINE.vector_bytes, "xmm")
        spills = re.findall(rf"vmov\w+\s+(%{reg}\d+, -?\d*\(%r[sb]p\)|-?\d*\(%r[sb]p\), %{reg}\d+)", asm)
        assert not spills, f"{len(spills)} vector spills: {spills[:3]}"
    for opt in (0, 1):
        context(OPT=opt)
        a = rng.standard_normal((2 * mr + 3, 300)).astype(np.float32)
        b = rng.standard_normal((300, 3 * w + 1)).astype(np.float32)
        _check_matmul(a, b, (Tensor(a) @ Tensor(b)).numpy())


def test_one_masked_tile_covers_a_narrow_output_whose_a_outgrows_l2(context):
    """An output narrower than 4 vectors (ResNet-50's 1x1 convolutions at 7x7: 2048 x 512 @ 512 x 49) whose whole
    tiles leave a remainder of columns: the remainder's pass streams A again, from memory where A outgrows L2. There
    one tile covers every column, its last vector masked (6x64 on AVX-512 for 49 columns); with A in L2 the 3-vector
    tile and its one-column remainder stay (MobileNetV2's 1280 x 320 @ 320 x 49). A machine with 16 vector registers
    has no 4-vector tile of 6 rows and keeps 2 vectors. The product is right either way."""
    for vector_bytes, registers in [(64, 32), (32, 16)]:
        m = replace(MACHINE, vector_bytes=vector_bytes, vector_registers=registers)
        w, budget = vector_bytes // 4, registers * 3 // 4
        big_k = 2 * m.l2_bytes // (512 * 4)  # A of 512 rows: twice L2
        narrow = microkernel(512, 3 * w + 1, 4, m)
        assert microkernel(512, 3 * w + 1, 4, m, k=8) == narrow  # A in L2: as without k
        one = (min(12, budget // 4), 4 * w, w) if budget // 4 >= 6 else narrow
        assert microkernel(512, 3 * w + 1, 4, m, k=big_k) == one
        assert microkernel(512, 4 * w, 4, m, k=big_k) == microkernel(512, 4 * w, 4, m)  # no remainder: unchanged
    rows = MACHINE.l2_bytes // (4 * 300) + 7  # A (rows x 300) past L2, rows no multiple of the tile's
    g = np.random.default_rng(11)
    for opt in (0, 1):
        context(OPT=opt)
        a = g.standard_normal((rows, 300)).astype(np.float32)
        b = g.standard_normal((300, 3 * W + 1)).astype(np.float32)
        _check_matmul(a, b, (Tensor(a) @ Tensor(b)).numpy())


def test_few_rows_over_a_long_k_and_a_large_b_take_one_tile(context):
    """At most FEW_ROWS rows that the usual tiles split (16 as 6 + 6 + 4 on AVX-512), over a long K and a B of a
    quarter of L2 or more per product (ResNet-18's 7x7 Winograd products at batch 1, a 16-token prompt's
    projections): one tile of every row, as many vectors wide as the register file has accumulators for, so B streams
    once. Not over a short K (MobileNetV2's 16 x 32 @ 32 x 12544), a small B, or more rows. The product is right."""
    for vector_bytes, registers in [(64, 32), (32, 16)]:
        m = replace(MACHINE, vector_bytes=vector_bytes, vector_registers=registers)
        w, big = vector_bytes // 4, m.l2_bytes // 4
        for rows in (8, 12, 16):
            usual = microkernel(rows, 512, 4, m, 512)
            one = (rows, max(1, registers // rows) * w, w) if usual[0] < rows else usual
            assert microkernel(rows, 512, 4, m, 512, big) == one
            assert microkernel(rows, 512, 4, m, 32, big) == microkernel(rows, 512, 4, m, 32)  # a short K
            assert microkernel(rows, 512, 4, m, 512, big // 2) == usual  # a small B
        assert microkernel(16, 512, 4, m, 512, big)[0] == 16  # (16 rows are split in the usual tiles of both)
        assert microkernel(17, 512, 4, m, 512, big) == microkernel(17, 512, 4, m, 512)
    k = 512
    n = max(256, -(-MACHINE.l2_bytes // (4 * k * 4) // (4 * W)) * 4 * W)  # B (k x n) a quarter of L2 or more
    o = gemm_opts(layout_pass([gemm_graph(16, n, k)], MACHINE)[0], MACHINE)
    mr, nr, _ = microkernel(16, n, 4, MACHINE, k, k * n * 4)
    assert o is not None and o.upcast == {0: mr, 1: nr} and mr == 16, o
    g = np.random.default_rng(12)
    b = g.standard_normal((k, n)).astype(np.float32)
    bt = Tensor(b).realize()
    for opt in (0, 1):
        context(OPT=opt)
        a = g.standard_normal((16, k)).astype(np.float32)
        _check_matmul(a, b, (Tensor(a) @ bt).numpy())
        a3 = g.standard_normal((4, 16, k)).astype(np.float32)  # a batch of products, B shared
        _check_matmul(a3, b, (Tensor(a3) @ bt).numpy())
    b3 = g.standard_normal((3, k, n)).astype(np.float32)  # a batch of products, a B each (Winograd's points)
    b3t = Tensor(b3).realize()
    for opt in (0, 1):
        context(OPT=opt)
        a3 = g.standard_normal((3, 16, k)).astype(np.float32)
        _check_matmul(a3, b3, (Tensor(a3) @ b3t).numpy())


def test_few_row_tiles_over_a_large_b_take_rows_that_divide_the_output(context):
    """A few row tiles (at most FEW_TILES) that would leave a remainder of rows, over a B past L2: the remainder's
    region streams B again from memory for each of its rows, so the tile takes rows that divide m (ResNet's stride-2
    products over 7x7 outputs, 49 x 2304 @ 2304 x 512: 7x48 on AVX-512, not 6x64 and a one-row pass). Not with B in
    L2, nor over many tiles. The product is right."""
    for vector_bytes, registers in [(64, 32), (32, 16)]:
        m = replace(MACHINE, vector_bytes=vector_bytes, vector_registers=registers)
        w, budget, big = vector_bytes // 4, registers * 3 // 4, 2 * m.l2_bytes
        for rows in (49, 50, 20):
            usual = microkernel(rows, 512, 4, m, 2304)
            mr, nr, _ = microkernel(rows, 512, 4, m, 2304, big)
            assert microkernel(rows, 512, 4, m, 2304, m.l2_bytes // 2) == usual  # B in L2
            if rows % usual[0] == 0:
                assert (mr, nr) == usual[:2]
            elif (mr, nr) != usual[:2]:  # (where no tile's rows divide m, the usual one)
                assert rows % mr == 0 and mr * (nr // w) <= budget and mr >= budget // (nr // w) * 2 // 3
        assert microkernel(392, 512, 4, m, 2304, big) == microkernel(392, 512, 4, m, 2304)  # 65 tiles
    wide = replace(MACHINE, vector_bytes=64, vector_registers=32)
    assert microkernel(49, 512, 4, wide, 2304, 2 * wide.l2_bytes)[:2] == (7, 48)
    assert microkernel(50, 512, 4, wide, 2304, 2 * wide.l2_bytes)[:2] == (5, 64)
    n = 16 * W
    assert 49 * n > SPLITK_MAX_OUT  # (so K is not split)
    k = 2 * MACHINE.l2_bytes // (4 * n) // 16 * 16  # B (k x n) twice L2
    mr, nr, _ = microkernel(49, n, 4, MACHINE, k, k * n * 4)
    o = gemm_opts(layout_pass([gemm_graph(49, n, k)], MACHINE)[0], MACHINE)
    assert o is not None and o.upcast == {0: mr, 1: nr}, o
    g = np.random.default_rng(13)
    b = Tensor(g.standard_normal((k, n)).astype(np.float32)).realize()
    for opt in (0, 1):
        context(OPT=opt)
        a = g.standard_normal((49, k)).astype(np.float32)
        _check_matmul(a, b.numpy(), (Tensor(a) @ b).numpy())


def test_a_tile_wider_than_the_output_shares_its_rows_without_blocks():
    """Under the one masked tile (above) the tile reads A once, so the threads share its row tiles with no row blocks
    (blocks keep A's chunk in L2 for the next column tile: there is none; a weight gradient's keep theirs:
    test_row_blocks_are_the_fewest_that_share_out_evenly)."""
    w = MACHINE.vector_bytes // 4
    m_, n_, k_ = 2048, 3 * w + 1, 2 * MACHINE.l2_bytes // (2048 * 4) + 64
    mr, nr, _ = microkernel(m_, n_, 4, MACHINE, k_)
    if MACHINE.cores < 2 or nr < n_:
        pytest.skip("row blocks are for threads; a machine with 16 vector registers has no such tile")
    o = gemm_opts(layout_pass([gemm_graph(m_, n_, k_)], MACHINE)[0], MACHINE)
    assert o is not None and o.upcast == {0: mr, 1: nr} and o.thread == 0 and 0 not in o.tile, o


@pytest.mark.parametrize("m", [1, 2, 5])
def test_skinny_tiles_use_packed_fma_and_do_not_spill(m):
    """Fewer than 6 rows (a decode step's products) take all their rows and more vectors per row
    (gemm.microkernel's SKINNY_VECTORS): those accumulators fit in registers too."""
    if helpers.settings().CHECK_OOB:
        pytest.skip("index checks (make test's second pass) add a branch per load to the loop gcc compiles")
    mr, nr, w = microkernel(m, 4096, 4, MACHINE)
    assert mr == m and nr >= W
    asm = _asm(_gemm_kernel(m, 2 * nr, 1024))  # at least GEMM_MIN_WORK multiply-adds
    reg = {64: "zmm", 32: "ymm"}.get(MACHINE.vector_bytes, "xmm")
    assert len(re.findall(rf"vfmadd\w+ps\s+[^\n]*%{reg}", asm)) >= m * nr // w
    # a vector register of the tile's width stored to or loaded from the stack (not OpenMP's xmm argument copy)
    spills = re.findall(rf"vmov\w+\s+(%{reg}\d+, -?\d*\(%r[sb]p\)|-?\d*\(%r[sb]p\), %{reg}\d+)", asm)
    assert not spills, f"{len(spills)} vector spills: {spills[:3]}"


@pytest.mark.parametrize("m,n,k", [(1, 768, 3072), (1, 3072, 768), (3, 2304, 768)])
def test_skinny_products_thread_over_column_panels_without_cache_blocks(m, n, k):
    """A skinny product's register tile holds all its rows, so each B panel is read once: no cache block of columns
    is kept in L2 for more rows, and the threads share the NR-column panels themselves (768 columns in 3 blocks of
    256 left one of 2 threads idle a third of the decode step's GEMV)."""
    o = gemm_opts(layout_pass([gemm_graph(m, n, k)], MACHINE)[0], MACHINE)
    assert o is not None and o.upcast[0] == m and 1 not in o.tile
    if MACHINE.cores > 1:
        assert o.thread == 1


def test_gemm_opts_shape():
    o = gemm_opts(layout_pass([gemm_graph(1024)], MACHINE)[0], MACHINE)
    assert o is not None and o.upcast == {0: MR, 1: NR} and o.vec == W
    # B is packed into NR-column panels when it does not fit in L2 or is strided along N; A is read in place
    for m, bt, kernels in [(1024, False, ["e_", "r_"]), (256, False, ["r_"]), (256, True, ["e_", "r_"])]:
        plan, _ = make_plan([gemm_graph(m, bt=bt)], opt=HandOpt(MACHINE))
        assert [k.name[:2] for k in plan.kernels] == kernels, (m, bt)
        assert plan.kernels[-1].opts.vec == W
    # a computed A (here relu(A)) is packed too: computed once, not once per column block
    a = gemm_graph(256).src[0].src[0]
    relu_a = (UOp.const(0.0) < a).where(a, UOp.const(0.0))
    plan, _ = make_plan([(relu_a * gemm_graph(256).src[0].src[1]).reduce(Ops.ADD, 1)], opt=HandOpt(MACHINE))
    assert [k.name[:2] for k in plan.kernels] == ["e_", "r_"]


def test_wide_products_share_columns_among_threads():
    # few rows against a B larger than the last-level cache (an LM head): threads take blocks of columns and run
    # every row over them, so B is streamed once. So do few rows in more row blocks than threads (here one register
    # tile each) against a B larger than half of L2 (GPT-2's projections: over rows, B came from L3 once per block).
    # Where B fits in half of L2, and for a square product whose rows' chunk of A (rows x KC) outgrows half of L2,
    # threads stay on rows. Sizes come from this machine's tile and caches (2 MiB of L2 per core on a Sapphire
    # Rapids: there A's chunk of a 1024-square product fits)
    small_l3, big_l3 = replace(MACHINE, l3_bytes=256 << 10), replace(MACHINE, l3_bytes=64 << 20)
    wide = layout_pass([gemm_graph(8 * MR, 64 * NR, 256, bt=True)], small_l3)[0]
    rows = 4 * MACHINE.cores * MR  # (as many one-tile row blocks as the heuristic wants for load balance)
    k = 256
    while k * 64 * NR * 4 <= MACHINE.l2_bytes // 2:
        k *= 2
    in_l3 = layout_pass([gemm_graph(rows, 64 * NR, k)], big_l3)[0]
    in_l2 = layout_pass([gemm_graph(rows, 4 * NR, 64)], big_l3)[0]
    threads = [gemm_opts(x, m).thread for x, m in ((wide, small_l3), (in_l3, big_l3), (in_l2, big_l3))]
    square = 1024
    while square * KC_MIN * 4 <= MACHINE.l2_bytes // 2:
        square *= 2
    threads.append(gemm_opts(layout_pass([gemm_graph(square)], small_l3)[0], small_l3).thread)
    # and columns that share out unevenly keep threads on rows: 3 tiles and 4 columns (a stride-2 convolution's 196
    # positions) give one thread twice the other's work on 2 cores
    # (with more outputs than split-K takes: with 2 MiB of L2, B's K reaches SPLITK_MIN_K under AVX2's 16 columns)
    uneven = 3 * NR + 4
    k = 256
    while k * uneven * 4 <= MACHINE.l2_bytes // 2:
        k *= 2
    need = SPLITK_MAX_OUT // uneven + 1
    rows = max(rows, -(-need // MR) * MR)
    threads.append(gemm_opts(layout_pass([gemm_graph(rows, uneven, k)], big_l3)[0], big_l3).thread)
    # and rows too few for blocks of tiles (two register tiles a thread: MobileNetV2's 24-channel projections at
    # batch 1) against a B larger than half of L2: shared out a tile at a time, each tile would stream all of B
    k = 64
    while k * 64 * NR * 4 <= MACHINE.l2_bytes // 2:
        k *= 2
    # (and one tile a thread: MobileNetV2's first 16-channel projection)
    few = gemm_opts(layout_pass([gemm_graph(2 * MACHINE.cores * MR, 64 * NR, k)], big_l3)[0], big_l3)
    one = gemm_opts(layout_pass([gemm_graph(MACHINE.cores * MR, 64 * NR, k)], big_l3)[0], big_l3)
    threads += [few.thread, one.thread]
    assert threads == ([1, 1, 0, 0, 0, 1, 1] if MACHINE.cores > 1 else [None] * 7)
    # threads over columns with K in one chunk take NR-column tiles, no blocks of NC columns (each B panel is read
    # by every row's tile while it is in L1; 7 blocks on 2 threads left one idle a seventh of the time)
    assert few.ktile or 1 not in few.tile
    # and the column-threaded kernel computes the product
    a = rng.standard_normal((8 * MR, 256)).astype(np.float32)
    w = rng.standard_normal((64 * NR, 256)).astype(np.float32)
    _check_matmul(a, w.T, run(wide, [a, w], gemm_opts(wide, small_l3)))


def test_row_blocks_are_the_fewest_that_share_out_evenly():
    # each row block streams all of B, and OpenMP's static schedule gives each thread a run of whole blocks: so the
    # fewest blocks that are a multiple of the threads and whose chunk of A fits (here 48 tiles of 6 rows on 2 threads:
    # 2 blocks of 144, a conv weight gradient's 288 rows), more where A would not fit, and where no multiple of the
    # threads divides the tiles (85 of them, 512 rows) at least 4 blocks a thread, not 5 shared 3 to 2
    assert _row_block(288, 6, 2, 1000) == 144
    assert _row_block(288, 6, 2, 100) == 72  # 4 blocks: 144 rows would not fit
    assert _row_block(288, 6, 4, 1000) == 72
    assert _row_block(510, 6, 2, 1000) == 30  # 17 blocks
    assert _row_block(12, 6, 2, 1000) == 0  # one tile a thread: no blocks
    # and the heuristic's blocks for a weight gradient's shape on this machine share out evenly among its threads
    if MACHINE.cores > 1:
        rows = 48 * MR
        o = gemm_opts(layout_pass([gemm_graph(rows, NR, 8192, bt=True)], MACHINE)[0], MACHINE)
        if o.thread == 0 and 0 in o.tile:
            assert (rows // o.tile[0]) % MACHINE.cores == 0, o


# ------------------------------------------------------------------ correctness of every path against NumPy

SHAPES = [
    (4 * MR, 2 * NR, 64),  # whole tiles
    (1, 200, 64),  # 1 x N: rows only in the remainder
    (200, 1, 64),  # N x 1: narrower than a vector (the plain path)
    (37, 53, 41),  # primes
    (97, 131, 67),
    (MR + 1, NR + W + 3, 300),
    (128, 128, 784),
    (16, 32, 784),  # K in chunks (ktile): later chunks load the output; that load must stay inside the chunk loop
    (128, 10, 128),  # the MNIST MLP's second layer
    (1, 1000, 768),  # skinny: a decode step's matrix-vector product
    (1, 768, 3072),  # skinny, K in chunks, several column panels per thread
    (3, 200, 300),
    (5, 77, 64),
]


@pytest.mark.parametrize("opt", [0, 1])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matmul_shapes(context, opt, m, n, k):
    context(OPT=opt)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    _check_matmul(a, b, (Tensor(a) @ Tensor(b)).numpy())


@pytest.mark.parametrize("m,n,k", [(37, 53, 41), (MR + 1, NR + W + 3, 300)])
def test_matmul_shapes_search_and_bounds(context, m, n, k):
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    context(OPT=2)
    _check_matmul(a, b, (Tensor(a) @ Tensor(b)).numpy())
    context(OPT=1, CHECK_OOB=1)
    _check_matmul(a, b, (Tensor(a) @ Tensor(b)).numpy())


@pytest.mark.parametrize("opt,oob", [(1, 0), (2, 0), (1, 1)])
def test_transposed_and_batched(context, opt, oob):
    context(OPT=opt, CHECK_OOB=oob)
    a, b = rng.standard_normal((67, 45)).astype(np.float32), rng.standard_normal((59, 45)).astype(np.float32)
    _check_matmul(a, b.T, (Tensor(a) @ Tensor(b).T).numpy())  # B transposed
    _check_matmul(a.T, a, (Tensor(a).T @ Tensor(a)).numpy())  # A transposed
    x, y = rng.standard_normal((3, 29, 47)).astype(np.float32), rng.standard_normal((3, 47, 70)).astype(np.float32)
    _check_matmul(x, y, (Tensor(x) @ Tensor(y)).numpy())
    _check_matmul(x, y[0], (Tensor(x) @ Tensor(y[0])).numpy())  # B broadcast over the batch


def test_backward_products(context):
    # a Linear layer's gradients are X.T @ dY and dY @ W.T: both run through the packed microkernel
    context(OPT=1, CHECK_OOB=1)
    x = rng.standard_normal((128, 97)).astype(np.float32)
    w = rng.standard_normal((97, 70)).astype(np.float32)
    g = rng.standard_normal((128, 70)).astype(np.float32)
    X, Wt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    ((X @ Wt) * Tensor(g)).sum().backward()
    _check_matmul(x.T, g, Wt.grad.numpy())
    _check_matmul(g, w.T, X.grad.numpy())


def test_split_k(context, monkeypatch):
    # (16, 16) from K = 65536: the reduction is split so each thread sums a part, then the parts are summed
    monkeypatch.setattr(runtime, "get_num_threads", runtime.get_num_threads)
    a = rng.standard_normal((16, 65536)).astype(np.float32)
    b = rng.standard_normal((65536, 16)).astype(np.float32)
    context(OPT=1)
    _check_matmul(a, b, (Tensor(a) @ Tensor(b)).numpy())
    plan, _ = make_plan([gemm_graph(16, 16, 65536)], opt=HandOpt(replace(MACHINE, cores=2)))
    partial = [k for k in plan.kernels if k.opts is not None and k.opts.thread is not None and k.name.startswith("r_")]
    assert partial and partial[0].name.count("_") == 3, [k.name for k in plan.kernels]  # r_S_16_16, threads over S
    assert partial[0].opts.thread == 0


def test_hand_opt_leaves_small_matmuls_alone():
    # under GEMM_MIN_WORK multiply-adds the packing copies would cost more than they save
    o = hand_opt_choice(gemm_graph(8, 16, 8), MACHINE)
    assert o.vec == 0


def test_matmul_dtypes(context):
    # float64 runs the microkernel on double vectors; a float16 operand is cast, so it is packed (computed)
    context(OPT=1)
    a, b = rng.standard_normal((67, 45)), rng.standard_normal((45, 83))
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-12, atol=1e-12)
    a16, b32 = a.astype(np.float16), b.astype(np.float32)
    _check_matmul(a16.astype(np.float32), b32, (Tensor(a16) @ Tensor(b32)).numpy())


def test_split_k_full_sum(context):
    # a plain long sum is split too (two partial sums, then one): the value matches a float64 sum
    context(OPT=1)
    x = rng.standard_normal(1 << 17).astype(np.float32)
    np.testing.assert_allclose(Tensor(x).sum().numpy(), x.astype(np.float64).sum(), rtol=1e-5, atol=1e-3)


# ------------------------------------------------------------------ epilogues: elementwise ops fused into the GEMM


def _kernels(t: Tensor, opt) -> list:
    return list(make_plan([t.uop], opt=opt)[0].kernels)


@pytest.mark.parametrize("oob", [0, 1])
def test_epilogue_bias_relu_residual(context, oob):
    # a matmul's only reader is elementwise at its own index: bias, ReLU and a residual add are applied to the
    # register tile, so no kernel stores the bare product (the plan is the packing copy, if any, and the matmul)
    context(OPT=1, CHECK_OOB=oob)
    m, k, n = 2 * MR + 3, 200, 3 * NR + W + 1  # remainders on both axes: the epilogue runs in every region
    a, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    b, res = rng.standard_normal(n).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)
    y = ((Tensor(a) @ Tensor(w) + Tensor(b)).relu() + Tensor(res)) * 0.5
    ks = _kernels(y, HandOpt(MACHINE))
    gemm = [kk for kk in ks if kk.op.startswith("matmul")]
    assert (
        len(gemm) == 1
        and "where" in gemm[0].op
        and not [kk for kk in ks if kk.name.startswith("e_") and kk.name.endswith(f"{m}_{n}")]
    )
    ref = (np.maximum(a.astype(np.float64) @ w + b, 0) + res) * 0.5
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_epilogue_with_k_chunks(context):
    # K = 2304 runs in chunks (ktile): each chunk stores its partial sum and the last one applies the epilogue
    context(OPT=1)
    a, w = rng.standard_normal((70, 2304)).astype(np.float32), rng.standard_normal((2304, 3 * NR)).astype(np.float32)
    y = (Tensor(a) @ Tensor(w) / 48.0 - 0.5).relu()
    ks = _kernels(y, HandOpt(MACHINE))
    (gemm,) = [kk for kk in ks if kk.op.startswith("matmul")]
    assert gemm.opts.ktile > 0 and "where" in gemm.op
    ref = np.maximum(a.astype(np.float64) @ w / 48.0 - 0.5, 0)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_epilogue_without_a_vector_form_stays_apart(context):
    # an op that varies along the tile's vectors with no vector form there would run once per lane, scalar (GELU's
    # exp2 did before it had one: char-GPT's MLP GEMM took 1.6-2.1 ms against 0.38 ms apart), so the GEMM stores its
    # product and a kernel of its own applies it: floor's TRUNC, log2, sin, sqrt; and exp2 of a value read in full
    # (GELU's backward, exp(-h^2) of the stored h: slower in the tile, opt.gemm.vector_epilogue). GELU of the product
    # and a bias (exp2 and 1/x of it, VECTOR_MATH) and a math function on what is constant along the vectors (a
    # per-row value) are taken
    context(OPT=1)
    a, w = rng.standard_normal((70, 300)).astype(np.float32), rng.standard_normal((300, 3 * NR)).astype(np.float32)
    s = rng.random((70, 1)).astype(np.float32) + 0.5
    h, b = rng.standard_normal((70, 3 * NR)).astype(np.float32), rng.standard_normal(3 * NR).astype(np.float32)
    p = a.astype(np.float64) @ w
    y = (Tensor(a) @ Tensor(w)).floor()
    (gemm,) = [kk for kk in _kernels(y, HandOpt(MACHINE)) if kk.op.startswith("matmul")]
    assert gemm.op == "matmul", gemm.op
    clear = np.abs(p - np.round(p)) > 1e-3  # floor: the product's rounding decides an integer step
    np.testing.assert_array_equal(y.numpy()[clear], np.floor(p)[clear])
    torch = pytest.importorskip("torch")
    gelu = torch.nn.functional.gelu
    p32 = (Tensor(a) @ Tensor(w)).numpy().astype(np.float64)  # log2 near 0 and sin amplify the product's rounding
    for y, ref, fused in [
        ((Tensor(a) @ Tensor(w)).abs().log2(), np.log2(np.abs(p32)), False),
        ((Tensor(a) @ Tensor(w)).sin(), np.sin(p32), False),
        ((Tensor(a) @ Tensor(w)).abs().sqrt(), np.sqrt(np.abs(p32)), False),
        ((Tensor(a) @ Tensor(w)) * (-(Tensor(h) * Tensor(h))).exp(), p * np.exp(-(h.astype(np.float64) ** 2)), False),
        ((Tensor(a) @ Tensor(w)).gelu(), gelu(torch.from_numpy(p)).numpy(), True),
        (
            (Tensor(a) @ Tensor(w) + Tensor(b)).gelu("tanh"),
            gelu(torch.from_numpy(p + b), approximate="tanh").numpy(),
            True,
        ),
        ((Tensor(a) @ Tensor(w)) * Tensor(s).sqrt(), p * np.sqrt(s), True),
    ]:
        (gemm,) = [kk for kk in _kernels(y, HandOpt(MACHINE)) if kk.op.startswith("matmul")]
        assert (gemm.op != "matmul") == fused, gemm.op
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_epilogue_vector_math(context):
    # float32 exp2 and 1/x on the tile's vectors (VECTOR_MATH: renderer.c_math's EXP2F_VECTOR, a division): the
    # specials (NaN, +-inf, 0, past exp2's range both ways, subnormal results) as NumPy has them, on the product the
    # GEMM alone computes (exp2 of products in the hundreds amplifies any other's rounding), and the activations
    # built from them (sigmoid, tanh, SiLU) against torch
    torch = pytest.importorskip("torch")
    context(OPT=1)
    m, k, n = 2 * MR + 1, 300, 2 * NR + 3
    a, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32) / 4
    a[1, 7], a[2, 9], a[3, 11] = np.nan, np.inf, -np.inf
    a[4], w[:, 5] = 0.0, 0.0
    a[5] *= 100  # products past exp2's range: 0 and inf
    # a row whose product with w's first column is -138 (its exp2 a subnormal), whatever the random draws were
    a[6] = (-138.0 / np.dot(w[:, 0], w[:, 0])) * w[:, 0]
    p = (Tensor(a) @ Tensor(w)).numpy()
    tp, f = torch.from_numpy(p), torch.nn.functional
    # (torch flushes a subnormal sigmoid to 0: SiLU's x * sigmoid(x) is then -0.0 where uopc's is down to -90 times
    # the smallest normal float, so its rows take that as their absolute tolerance; NumPy's rows keep subnormals)
    with np.errstate(all="ignore"):
        cases = [
            (lambda t: t.exp2(), np.exp2(p), 1e-37),
            (lambda t: t.reciprocal() + t.exp(), 1 / p + np.exp(p), 1e-37),
            (lambda t: t.sigmoid(), torch.sigmoid(tp).numpy(), 1e-37),
            (lambda t: t.tanh(), torch.tanh(tp).numpy(), 1e-37),
            (lambda t: t.silu(), f.silu(tp).numpy(), 90 * np.finfo(np.float32).tiny),
        ]
    assert np.any((p < -126) & (p > -150) & np.isfinite(p)), "no subnormal exp2 results in the test's products"
    for fn, ref, atol in cases:
        y = fn(Tensor(a) @ Tensor(w))
        (gemm,) = [kk for kk in _kernels(y, HandOpt(MACHINE)) if kk.op.startswith("matmul")]
        assert gemm.op != "matmul", gemm.op
        out = y.numpy()
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
        np.testing.assert_array_equal(np.isposinf(out), np.isposinf(ref))
        np.testing.assert_array_equal(np.isneginf(out), np.isneginf(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(out[fin], ref[fin], rtol=1e-5, atol=atol)


@pytest.mark.parametrize("act", ["relu6", "hardswish", "hardtanh", "silu"])
def test_conv_epilogue_activations(context, act):
    # ReLU6, hardswish and hardtanh select on logic of float compares (`min < x & x < max`, NOT as XOR with True):
    # one vector mask, bit ops on the compares' masks (uopc.codegen.lanes); SiLU's exp2 and reciprocal have vector
    # forms (VECTOR_MATH): a 1x1 convolution applies each to its tile. NaN, -0.0 and the clip points as torch
    torch = pytest.importorskip("torch")
    context(OPT=1)
    g = np.random.default_rng(7)
    x = (g.standard_normal((2, 24, 14, 14)) * 3).astype(np.float32)
    w, b = (g.standard_normal((32, 24, 1, 1)) * 0.6).astype(np.float32), g.standard_normal(32).astype(np.float32)
    x[0, :, 0, :4] = [np.nan, -0.0, 0.0, 3.0]  # products: NaN in every channel, the rest spread over the clip points
    w[:3, :, 0, 0] = 0.0
    b[:3] = [-0.0, 6.0, -3.0]  # channels whose values sit on ReLU6's and hardswish's edges exactly
    y = getattr(Tensor(x).conv2d(Tensor(w), Tensor(b)), act)().contiguous() * 2.0
    (gemm,) = [k for k in _kernels(y, HandOpt(MACHINE)) if k.op.startswith("matmul")]
    assert gemm.op != "matmul", gemm.op
    f = torch.nn.functional
    ref = getattr(f, act)(f.conv2d(*map(torch.from_numpy, (x, w, b)))).numpy() * 2.0
    out = y.numpy()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    if act in ("relu6", "hardtanh"):  # selects alone: the zeros' signs too (a product's are -fno-signed-zeros's)
        num = ~np.isnan(ref)
        assert np.array_equal(np.signbit(out[num]), np.signbit(ref[num]))


def test_epilogue_left_alone(context):
    # not fused: the product read by two kernels (it would be computed twice), read through a transpose (another
    # index), a root itself; and nothing at OPT=0 (Chapter 7's kernels: the product is its own kernel)
    context(OPT=1)
    a, w = rng.standard_normal((64, 48)).astype(np.float32), rng.standard_normal((48, 4 * NR)).astype(np.float32)
    p = a.astype(np.float64) @ w
    h = HandOpt(MACHINE)
    pt = Tensor(a) @ Tensor(w)
    for y, ref in [
        (pt.T + 1.0, p.T + 1.0),
        (pt.relu() + pt.sum(1, keepdim=True), np.maximum(p, 0) + p.sum(1, keepdims=True)),
    ]:
        (gemm,) = [kk for kk in _kernels(y, h) if kk.op.startswith("matmul")]
        assert gemm.op == "matmul", gemm.op
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)
    y = (Tensor(a) @ Tensor(w)).relu()
    assert [kk.op for kk in _kernels(y, None)][-2:] == ["matmul", "elementwise cmplt where"]


def test_epilogue_relu_on_nan_and_signed_zero(context):
    # the ReLU of an epilogue is a select on a compare of whole vectors (codegen.lanes' vector mask): a NaN or -0.0
    # product gives +0.0, as where(0 < x, x, 0) does element by element
    context(OPT=1)
    m, k, n = 2 * MR + 1, 400, 2 * NR + 3  # (k: past GEMM_MIN_WORK for any MR x NR tile)
    a, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    a[1, 3], a[4] = np.nan, 0.0
    w[:, 5] = -0.0
    y = (Tensor(a) @ Tensor(w)).relu()
    (gemm,) = [kk for kk in _kernels(y, HandOpt(MACHINE)) if kk.op.startswith("matmul")]
    assert "where" in gemm.op
    p = a.astype(np.float64) @ w
    ref = np.where(0 < p, p, 0.0)
    out = y.numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    assert not np.isnan(out).any() and not np.signbit(out).any()


@pytest.mark.parametrize("oob", [0, 1])
@pytest.mark.parametrize("k,stride,size", [(1, 1, 14), (1, 2, 14), (3, 2, 15)])
def test_conv_epilogue_batchnorm_relu_residual(context, oob, k, stride, size):
    # a 1x1 convolution's GEMM, read as NCHW through a reshape of (N, 1, Cout, positions), takes an eval-mode
    # BatchNorm, the residual add and the ReLU as its epilogue (uopc.schedule.epilogues.lift_epilogues): no
    # kernel stores the bare convolution. A strided 3x3's product is channels-last (read through a transpose): its
    # ops stay a kernel of their own. The values either way against torch.
    torch = pytest.importorskip("torch")
    from uopc.nn import BatchNorm2d, Conv2d

    context(OPT=1, CHECK_OOB=oob)
    g = np.random.default_rng(k + stride)
    cin, cout = 24, 32
    x = g.standard_normal((2, cin, size, size)).astype(np.float32)
    conv, bn = Conv2d(cin, cout, k, stride, k // 2, bias=False), BatchNorm2d(cout)
    bn.running_mean = Tensor(g.standard_normal(cout).astype(np.float32))
    bn.running_var = Tensor(g.random(cout).astype(np.float32) + 0.5)
    bn.weight, bn.bias = (Tensor(g.standard_normal(cout).astype(np.float32)) for _ in range(2))
    osz = (size + 2 * (k // 2) - k) // stride + 1
    res = g.standard_normal((2, cout, osz, osz)).astype(np.float32)
    y = (bn(conv(Tensor(x))) + Tensor(res)).relu().contiguous() * 2.0
    ks = _kernels(y, HandOpt(MACHINE))
    gemm = [kk for kk in ks if kk.op.startswith("matmul")]
    bare = [kk for kk in ks if "sqrt" in kk.op and not kk.op.startswith("matmul")]  # BatchNorm in a kernel of its own
    assert len(gemm) == 1 and ("cmplt" in gemm[0].op) == (k == 1) and bool(bare) == (k == 3), [kk.op for kk in ks]
    tc = torch.nn.Conv2d(cin, cout, k, stride, k // 2, bias=False)
    tc.weight.data = torch.from_numpy(conv.weight.numpy())
    tb = torch.nn.BatchNorm2d(cout).eval()
    for name in ("running_mean", "running_var", "weight", "bias"):
        getattr(tb, name).data = torch.from_numpy(getattr(bn, name).numpy())
    with torch.no_grad():
        ref = (torch.relu(tb(tc(torch.from_numpy(x))) + torch.from_numpy(res)) * 2.0).numpy()
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("k,dilation,size", [(5, 1, 13), (3, 2, 12), (1, 1, 28)])
@pytest.mark.parametrize("residual", [False, True])
def test_conv_epilogue_through_padded_positions(context, k, dilation, size, residual):
    # a stride-1 convolution's GEMM computes every position of the padded width, cut to the output by a SHRINK: its
    # BatchNorm and ReLU, constant along the cut positions, are its epilogue, stored at the GEMM's shape and read
    # through the cut; a residual add, which varies there, keeps them in a kernel of their own. A 1x1 convolution's
    # GEMM computes the output's positions only (no cut): the residual add is its epilogue too. The values either
    # way against torch
    torch = pytest.importorskip("torch")
    from uopc.nn import BatchNorm2d, Conv2d

    context(OPT=1)
    g = np.random.default_rng(k + dilation)
    cin, cout, pad = 16, 32, dilation * (k // 2)
    x = g.standard_normal((2, cin, size, size)).astype(np.float32)
    conv, bn = Conv2d(cin, cout, k, 1, pad, dilation=dilation, bias=False), BatchNorm2d(cout)
    bn.running_mean = Tensor(g.standard_normal(cout).astype(np.float32))
    bn.running_var = Tensor(g.random(cout).astype(np.float32) + 0.5)
    res = g.standard_normal((2, cout, size, size)).astype(np.float32)
    y = bn(conv(Tensor(x)))
    y = ((y + Tensor(res)) if residual else y).relu().contiguous() * 2.0
    ks = _kernels(y, HandOpt(MACHINE))
    (gemm,) = [kk for kk in ks if kk.op.startswith("matmul")]
    assert ("cmplt" in gemm.op) == (not residual or k == 1), [kk.op for kk in ks]
    tc = torch.nn.Conv2d(cin, cout, k, 1, pad, dilation=dilation, bias=False)
    tc.weight.data = torch.from_numpy(conv.weight.numpy())
    tb = torch.nn.BatchNorm2d(cout).eval()
    tb.running_mean.data, tb.running_var.data = (
        torch.from_numpy(bn.running_mean.numpy()),
        torch.from_numpy(bn.running_var.numpy()),
    )
    with torch.no_grad():
        ref = tb(tc(torch.from_numpy(x))) + (torch.from_numpy(res) if residual else 0)
        ref = (torch.relu(ref) * 2.0).numpy()
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("act", ["relu6", "silu"])
def test_an_epilogue_is_not_lifted_through_a_cut_that_a_reader_flattens(context, act):
    # a MobileNetV2 block: 1x1 expand + BatchNorm + act, depthwise 3x3 + BatchNorm + act, 1x1 project + BatchNorm,
    # residual. The depthwise convolution's GEMM computes the padded width's positions; lifted through the cut, its
    # BatchNorm and act would be stored at those positions, and the project convolution's operand packing, which reads
    # (C, H*W) in 64-wide blocks, would take each position apart with a division (0.48 ms against 0.03 at this size):
    # so it is not lifted there, and no kernel divides. Values against torch
    torch = pytest.importorskip("torch")
    from uopc.nn import BatchNorm2d, Conv2d

    context(OPT=1)
    g = np.random.default_rng(5)
    c, e = 24, 144
    convs = [Conv2d(c, e, 1, bias=False), Conv2d(e, e, 3, 1, 1, groups=e, bias=False), Conv2d(e, c, 1, bias=False)]
    bns = [BatchNorm2d(n) for n in (e, e, c)]
    for bn in bns:
        bn.running_mean = Tensor(g.standard_normal(bn.running_mean.shape).astype(np.float32))
        bn.running_var = Tensor(g.random(bn.running_var.shape).astype(np.float32) + 0.5)
    x = g.standard_normal((1, c, 56, 56)).astype(np.float32)
    h = getattr(bns[0](convs[0](Tensor(x))), act)()
    h = getattr(bns[1](convs[1](h)), act)()
    y = bns[2](convs[2](h)) + Tensor(x)
    ks = _kernels(y, HandOpt(MACHINE))
    assert sum(kk.op.startswith("matmul") for kk in ks) == 3, [kk.op for kk in ks]
    divides = [kk.name for kk in ks if any(u.op in (Ops.IDIV, Ops.MOD) for u in kk.ast.toposort())]
    assert not divides, divides
    f, t = torch.nn.functional, torch.from_numpy
    ref = t(x)
    for i, (conv, bn) in enumerate(zip(convs, bns, strict=True)):
        ref = f.conv2d(ref, t(conv.weight.numpy()), padding=conv.padding, groups=conv.groups)
        ref = f.batch_norm(ref, t(bn.running_mean.numpy()), t(bn.running_var.numpy()), eps=bn.eps)
        ref = getattr(f, act)(ref) if i < 2 else ref + t(x)
    np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cin", [8, 128])
def test_split_reduce_loop_has_no_division(context, cin):
    # a 3x3 convolution's reduction (channel, kh, kw) is one merged axis of the GEMM: it runs as three nested loops,
    # so the microkernel's index arithmetic has no division or modulo left; with 128 channels (K = 1152) K runs in
    # chunks of whole 3x3 blocks, and each chunk's loop is split the same way
    context(OPT=1)
    x = rng.standard_normal((1, cin, 12, 12)).astype(np.float32)
    w = rng.standard_normal((24, cin, 3, 3)).astype(np.float32)
    y = Tensor(x).conv2d(Tensor(w), padding=1)
    (gemm,) = [kk for kk in _kernels(y, HandOpt(MACHINE)) if kk.op.startswith("matmul")]
    assert (gemm.opts.ktile > 0) == (cin == 128) and gemm.opts.ktile % 9 == 0
    assert not [u for u in gemm.ast.toposort() if u.op in (Ops.IDIV, Ops.MOD)]
    torch = pytest.importorskip("torch")
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_a_weight_gradient_over_a_batch_keeps_its_rows_in_one_tile_and_chunks_within_an_image(context):
    # the weight gradient of a 3x3 convolution of 1 channel into 16: 9 rows (taps) x 16 filters, reduced over
    # K = N*H*W = 8*28*28. The register tile is no taller than the output's 9 rows (a taller one left every row to
    # run alone; AVX2's registers hold 6 rows of this width, AVX-512's all 9), and K runs in chunks that divide an
    # image's 784 positions (whole rows of it): the microkernel takes no position apart with a division or modulo.
    # reference: PyTorch's conv2d weight gradient
    torch = pytest.importorskip("torch")
    context(OPT=1)
    assert microkernel(9, 16, 4, MACHINE)[0] == min(9, microkernel(64, 16, 4, MACHINE)[0])
    x = rng.standard_normal((8, 1, 28, 28)).astype(np.float32)
    w = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    g = rng.standard_normal((8, 16, 28, 28)).astype(np.float32)
    wt = Tensor(w, requires_grad=True)
    (Tensor(x).conv2d(wt, padding=1) * Tensor(g)).sum().backward()
    (gemm,) = [kk for kk in _kernels(wt.grad, HandOpt(MACHINE)) if kk.op.startswith("matmul")]
    assert gemm.opts.ktile and 784 % gemm.opts.ktile == 0, gemm.opts
    chunks = 8 * 784 // gemm.opts.ktile  # only the chunk loop's index is divided (which image, which rows of it)
    for u in gemm.ast.toposort():
        if u.op in (Ops.IDIV, Ops.MOD):
            loops = [r for r in u.toposort() if r.op is Ops.RANGE]
            assert [r.src[0].arg for r in loops] == [chunks], u
    tw = torch.from_numpy(w).requires_grad_()
    (torch.nn.functional.conv2d(torch.from_numpy(x), tw, padding=1) * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(wt.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_a_batch_of_products_runs_its_remainder_rows_as_one_tile_inside_the_batch_loop(context):
    # rows past the last whole MR-row tile: one tile of their own (one FMA chain per accumulator, not one row at a
    # time), and that nest runs inside the loop over the batch beside the whole tiles' (a second parallel loop over
    # the batch read every product's B again after all the others'), with the product's values
    P, rows = 2 * MACHINE.cores, MR + max(2, MR // 2)  # (enough products for every thread)
    k = W * max(3, -(-GEMM_MIN_WORK // (P * rows * NR * W)))  # (enough work for the microkernel on every ISA)
    a = rng.standard_normal((P, rows, 1, k)).astype(np.float32)
    b = rng.standard_normal((P, 1, NR, k)).astype(np.float32)
    plan, _ = make_plan([(Tensor(a) * Tensor(b)).sum(-1).uop], opt=HandOpt(MACHINE))
    (kern,) = [x for x in plan.kernels if x.name.startswith("r_")]
    assert kern.opts.upcast[1] == MR and kern.opts.thread == (0 if MACHINE.cores > 1 else None)
    src = render_c(kern.ast, "gemm")
    assert src.count("#pragma omp parallel") == (1 if MACHINE.cores > 1 else 0)
    vectors = NR // W  # accumulators: MR rows of the whole tile, then the remainder's rows, NR // W vectors each
    assert len(re.findall(r"f32x\d+ acc\d+;", src)) == rows * vectors
    got = (Tensor(a) * Tensor(b)).sum(-1).numpy()
    ref = np.einsum("prk,pjk->prj", a[:, :, 0].astype(np.float64), b[:, 0].astype(np.float64))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("big", [True, False])
def test_a_remainder_of_the_threaded_rows_runs_on_threads_over_the_columns(big):
    # rows on threads in 6-row tiles: 28 rows leave a 4-row remainder, whose nest loops once over the rows. With
    # enough work (loops.REGION_THREAD_MIN) it takes the columns on threads instead (its own parallel loop, of 4
    # column tiles), not one thread while the others wait (ResNet-18's stem: 64 rows of 6-row tiles); with little it
    # stays one serial pass (a parallel region would cost more). The product's values either way
    rows, n = 28, 8 * W
    k = -(-REGION_THREAD_MIN // (4 * n)) if big else 40
    a = _aligned(rng.standard_normal((rows, k)).astype(np.float32))
    b = _aligned(rng.standard_normal((k, n)).astype(np.float32))
    c = aligned_empty(rows * n, dtypes.float32)
    opts = Opts(upcast={0: 6, 1: 2 * W}, thread=0, vec=W)
    src = render_c(lower(gemm_graph(rows, n, k), buf(2, rows * n), Ctx(opts=opts)), "k")
    Program(src, "k")(a, b, c)
    _check_matmul(a.reshape(rows, k), b.reshape(k, n), c.reshape(rows, n))
    lines = src.splitlines()
    trips = [int(re.search(r"< (\d+);", lines[i + 1]).group(1)) for i, ln in enumerate(lines) if "omp parallel" in ln]
    assert trips == ([4, 4] if big else [4]), trips  # the whole tiles' 4 row tiles (then the remainder's 4 columns)


def test_epilogue_exp2_matches_the_scalar_function(context):
    # exp2 in a GEMM's epilogue (renderer.c_math.EXP2F_VECTOR) against the elementwise kernel's EXP2F, over random bit
    # patterns, a dense grid of its whole finite range and the specials: a product of zeros plus a bias along the
    # vectors puts each point in a lane (0 * w + b is b exactly). Where the compiler targets AVX-512 (vscalefps on the
    # tile's vectors: AVX512F for 64 bytes, VL for 32) the results are the same bits; elsewhere within 1 ulp, NaN
    # exactly where EXP2F has NaN
    from tests.backend.test_transcendental import SPECIAL, ulp_error

    context(OPT=1)
    g = np.random.default_rng(3)
    bits = g.integers(0, 2**32, 60_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([bits, np.linspace(-151.0, 129.0, 60_000, dtype=np.float32), SPECIAL])
    x = np.concatenate([x, np.zeros((-x.size) % NR, np.float32)])
    a, w = np.zeros((MR, 64), np.float32), g.standard_normal((64, x.size)).astype(np.float32)
    y = (Tensor(a) @ Tensor(w) + Tensor(x)).exp2()
    (gemm,) = [kk for kk in _kernels(y, HandOpt(MACHINE)) if kk.op.startswith("matmul")]
    assert gemm.op != "matmul", gemm.op
    got, ref = y.numpy(), Tensor(x).exp2().numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref[None].repeat(MR, 0)))
    avx512 = "avx512f" in MACHINE.isa and (MACHINE.vector_bytes == 64 or "avx512vl" in MACHINE.isa)
    if avx512:
        np.testing.assert_array_equal(got.view(np.uint32), ref[None].repeat(MR, 0).view(np.uint32))
    else:
        assert ulp_error(got, ref[None].repeat(MR, 0)).max() <= 1

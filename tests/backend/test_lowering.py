"""Lowering end to end: shape graphs are lowered, rendered to C, compiled with gcc and run, and compared with NumPy.

Covers every movement op alone and chained, every ALU op per dtype (and CAST between all pairs of five dtypes),
reductions over trailing and permuted axes, 0-d outputs and size-1 dims, the loop structure of a matmul chain
mm(mm(A, B), C) and of x - max(x), the GEMM under each Opts, and gated PAD loads.
Every distinct kernel costs a gcc compile, so graphs are shared between tests where possible.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.helpers import buf, c_lines, c_loops, gemm_graph, mm, render_graph, run
from uopc.codegen.rangeify import Opts
from uopc.engine.lower import make_plan
from uopc.engine.realize import default_opt
from uopc.helpers import Context
from uopc.renderer.c import render_c
from uopc.runtime import compiler as runtime
from uopc.tensor import Tensor
from uopc.uop import Ops, UOp
from uopc.uop.dtype import DType, dtypes

f32, f64, i32, u8, bl = dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint8, dtypes.bool

A234 = np.arange(1, 25, dtype=np.float32).reshape(2, 3, 4)  # distinct values: any misplaced element shows
X = buf(0, 24).reshape((2, 3, 4))

# ------------------------------------------------------------------ movement ops

MOVES = {
    "reshape_merge": (lambda x: x.reshape((6, 4)), lambda a: a.reshape(6, 4)),
    "reshape_split": (lambda x: x.reshape((2, 3, 2, 2)), lambda a: a.reshape(2, 3, 2, 2)),
    "reshape_regroup": (lambda x: x.reshape((4, 6)), lambda a: a.reshape(4, 6)),
    "reshape_flat": (lambda x: x.reshape((24,)), lambda a: a.reshape(24)),
    "reshape_size1": (lambda x: x.reshape((1, 6, 1, 4, 1)), lambda a: a.reshape(1, 6, 1, 4, 1)),
    "permute": (lambda x: x.permute((2, 0, 1)), lambda a: a.transpose(2, 0, 1)),
    "pad": (lambda x: x.pad(((1, 0), (0, 2), (1, 1))), lambda a: np.pad(a, ((1, 0), (0, 2), (1, 1)))),
    "shrink": (lambda x: x.shrink(((1, 2), (1, 3), (1, 4))), lambda a: a[1:2, 1:3, 1:4]),
    "flip": (lambda x: x.flip((0, 2)), lambda a: a[::-1, :, ::-1]),
    "expand": (
        lambda x: x.reshape((2, 3, 1, 4)).expand((2, 3, 5, 4)),
        lambda a: np.broadcast_to(a.reshape(2, 3, 1, 4), (2, 3, 5, 4)),
    ),
    # non-contiguous reads: a transposed view merged or split by a reshape (index div/mod)
    "permute_then_merge": (
        lambda x: x.permute((1, 0, 2)).reshape((3, 8)),
        lambda a: a.transpose(1, 0, 2).reshape(3, 8),
    ),
    "permute_then_split": (
        lambda x: x.permute((2, 1, 0)).reshape((2, 2, 6)),
        lambda a: a.transpose(2, 1, 0).reshape(2, 2, 6),
    ),
    "flip_then_merge": (lambda x: x.flip((1,)).reshape((6, 4)).permute((1, 0)), lambda a: a[:, ::-1].reshape(6, 4).T),
    # permute -> pad -> flip -> shrink -> reshape (split) -> reshape (merge) -> expand
    "chain": (
        lambda x: (
            x.permute((2, 0, 1))
            .pad(((1, 0), (0, 1), (2, 1)))
            .flip((0, 2))
            .shrink(((1, 5), (0, 3), (1, 5)))
            .reshape((4, 3, 2, 2))
            .reshape((4, 3, 4, 1))
            .expand((4, 3, 4, 3))
        ),
        lambda a: np.broadcast_to(
            np.pad(a.transpose(2, 0, 1), ((1, 0), (0, 1), (2, 1)))[::-1, :, ::-1][1:5, 0:3, 1:5]
            .reshape(4, 3, 2, 2)
            .reshape(4, 3, 4, 1),
            (4, 3, 4, 3),
        ),
    ),
}


@pytest.mark.parametrize("name", list(MOVES))
def test_movement_ops(name: str):
    # reference: NumPy views of the same array; exact
    build, ref = MOVES[name]
    g = build(X)
    want = ref(A234)
    assert g.shape == want.shape
    np.testing.assert_array_equal(run(g, [A234]), want)


def test_shrink_expand_of_a_strided_window():
    # a 2-wide column window of a (4, 6) matrix, broadcast along a new axis; reference: NumPy; exact
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    g = buf(0, 24).reshape((4, 6)).shrink(((1, 4), (2, 4))).reshape((3, 1, 2)).expand((3, 4, 2))
    np.testing.assert_array_equal(run(g, [a]), np.broadcast_to(a[1:4, None, 2:4], (3, 4, 2)))


# ------------------------------------------------------------------ ALU ops per dtype

N = 16
_r = np.random.default_rng(1234)
DATA = {
    f32: (_r.standard_normal(N) * 3).astype(np.float32),
    f64: _r.standard_normal(N) * 3,
    i32: _r.integers(-50, 50, N).astype(np.int32),
    bl: _r.integers(0, 2, N).astype(bool),
}
DATA2 = {
    f32: np.concatenate([DATA[f32][:4], (_r.standard_normal(N - 4) * 3).astype(np.float32)]),  # some equal elements
    f64: np.concatenate([DATA[f64][:4], _r.standard_normal(N - 4) * 3]),
    i32: np.concatenate([DATA[i32][:4], _r.integers(-50, 50, N - 4).astype(np.int32)]),
    bl: _r.integers(0, 2, N).astype(bool),
}
DATA2[i32][DATA2[i32] == 0] = 7  # divisors

BINARY = {
    Ops.ADD: np.add,
    Ops.MUL: np.multiply,
    Ops.MAX: np.maximum,
    Ops.CMPLT: np.less,
    Ops.CMPNE: np.not_equal,
    Ops.IDIV: np.floor_divide,
    Ops.MOD: np.mod,
    Ops.AND: np.bitwise_and,
    Ops.OR: np.bitwise_or,
    Ops.XOR: np.bitwise_xor,
}
BINARY_CASES = [(dt, op) for dt in (f32, f64) for op in (Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE)]
BINARY_CASES += [(i32, op) for op in BINARY]
BINARY_CASES += [(bl, op) for op in BINARY if op not in (Ops.IDIV, Ops.MOD)]


@pytest.mark.parametrize("dt, op", BINARY_CASES, ids=[f"{dt.name}-{op.name}" for dt, op in BINARY_CASES])
def test_binary_alu(dt: DType, op: Ops):
    # reference: NumPy on the same dtype (bool ADD/MUL are C's _Bool or/and, like NumPy's); exact
    a, b = DATA[dt], DATA2[dt]
    got = run(buf(0, N, dt).alu(op, buf(1, N, dt)), [a, b])
    want = BINARY[op](a, b)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


UNARY = {
    Ops.NEG: (np.negative, 0),
    Ops.RECIP: (np.reciprocal, 0),
    Ops.SQRT: (np.sqrt, 0),
    Ops.TRUNC: (np.trunc, 0),
    Ops.EXP2: (np.exp2, 4),
    Ops.LOG2: (np.log2, 4),
    Ops.SIN: (np.sin, 4),
}
UNARY_CASES = [(dt, op) for dt in (f32, f64) for op in UNARY]


@pytest.mark.parametrize("dt, op", UNARY_CASES, ids=[f"{dt.name}-{op.name}" for dt, op in UNARY_CASES])
def test_unary_alu_float(dt: DType, op: Ops):
    # reference: NumPy; exact for the IEEE-exact ops (neg, recip, sqrt, trunc), libm's exp2/log2/sin within 4 ulp
    fn, ulps = UNARY[op]
    a = np.abs(DATA[dt]) + 0.25 if op in (Ops.SQRT, Ops.LOG2) else DATA[dt]
    got = run(buf(0, N, dt).alu(op), [a])
    want = fn(a)
    assert got.dtype == dt.np
    if ulps == 0:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_array_max_ulp(got, want, maxulp=ulps)


def test_neg_int32():
    # reference: NumPy; exact (INT_MIN is left out: negating it is undefined behaviour in C)
    a = np.array([0, 1, -1, 7, -50, 2**31 - 1, -(2**31) + 1, 12345], np.int32)
    np.testing.assert_array_equal(run(-buf(0, 8, i32), [a]), -a)


@pytest.mark.parametrize("dt", [f32, f64, i32, bl], ids=lambda d: d.name)
def test_where(dt: DType):
    # reference: np.where; exact
    c = DATA[bl] ^ DATA2[bl]
    g = buf(0, N, bl).where(buf(1, N, dt), buf(2, N, dt))
    np.testing.assert_array_equal(run(g, [c, DATA[dt], DATA2[dt]]), np.where(c, DATA[dt], DATA2[dt]))


def test_mixed_expression_with_constants():
    # relu(x * 2 - 1) + max(x, y) / 4, one fused kernel; reference: NumPy float32; rtol=1e-6
    x, y = buf(0, N), buf(1, N)
    t = x * 2.0 - 1.0
    g = (t < 0.0).where(0.0, t) + x.maximum(y) * UOp.const(4.0).alu(Ops.RECIP)
    a, b = DATA[f32], DATA2[f32]
    np.testing.assert_allclose(run(g, [a, b]), np.maximum(a * 2 - 1, 0) + np.maximum(a, b) / 4, rtol=1e-6)


CAST_DTYPES = [i32, f32, bl, f64, u8]
CAST_VALUES = {
    i32: np.array([0, 1, -1, 7, 200, 255, -300, 1000, 2**31 - 1, -(2**31)], np.int32),
    f32: np.array([0, 0.5, -0.75, 1.5, 2.9, -2.9, 200.2, 255.0, 1e9, -0.0], np.float32),
    f64: np.array([0, 0.5, -0.75, 1.5, 2.9, -2.9, 200.2, 255.0, 1e9, 16777217.0], np.float64),
    bl: np.array([0, 1, 1, 0, 1, 0, 0, 1, 1, 0], bool),
    u8: np.array([0, 1, 2, 127, 128, 200, 255, 3, 254, 64], np.uint8),
}
CAST_CASES = [(s, d) for s in CAST_DTYPES for d in CAST_DTYPES if s is not d]


@pytest.mark.parametrize("src, dst", CAST_CASES, ids=[f"{s.name}-to-{d.name}" for s, d in CAST_CASES])
def test_cast(src: DType, dst: DType):
    # reference: NumPy astype (C conversion: truncation toward zero, modular for unsigned, nonzero -> True); exact.
    # Float -> int values that do not fit the target are undefined behaviour in C and are left out.
    a = CAST_VALUES[src]
    if src.is_float and dst.is_int:
        a = a[(np.trunc(a) >= dst.min) & (np.trunc(a) <= dst.max)]
    got = run(buf(0, len(a), src).cast(dst), [a])
    assert got.dtype == dst.np
    np.testing.assert_array_equal(got, a.astype(dst.np))


# ------------------------------------------------------------------ reductions

R345 = (np.random.default_rng(7).standard_normal((3, 4, 5)) * 4).astype(np.float32)
X345 = buf(0, 60).reshape((3, 4, 5))


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX], ids=lambda o: o.name)
def test_reduce_trailing_axes(op: Ops, n: int):
    # reference: np.sum / np.max over the last n axes; rtol=1e-6 (float32 summation order), MAX exact
    got = run(X345.reduce(op, n), [R345])
    axes = tuple(range(3 - n, 3))
    want = R345.sum(axes) if op is Ops.ADD else R345.max(axes)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_reduce_permuted_axes():
    # sum over axis 1 and max over axis 0, by permuting the axis last; reference: NumPy; rtol=1e-6, MAX exact
    np.testing.assert_allclose(
        run(X345.permute((0, 2, 1)).reduce(Ops.ADD, 1), [R345]), R345.sum(1), rtol=1e-6, atol=1e-6
    )
    np.testing.assert_array_equal(run(X345.permute((1, 2, 0)).reduce(Ops.MAX, 1), [R345]), R345.max(0))
    # a middle and a first axis together: (3, 4, 5) -> sum over axes 0 and 1
    np.testing.assert_allclose(
        run(X345.permute((2, 0, 1)).reduce(Ops.ADD, 2), [R345]), R345.sum((0, 1)), rtol=1e-6, atol=1e-6
    )


def test_reduce_int32():
    # reference: NumPy int32; exact
    a = np.arange(-30, 30, dtype=np.int32).reshape(3, 4, 5)
    g = buf(0, 60, i32).reshape((3, 4, 5)).reduce(Ops.ADD, 2)
    np.testing.assert_array_equal(run(g, [a]), a.sum((1, 2), dtype=np.int32))


def test_reduce_then_elementwise_and_reduce_again():
    # mean of squared deviation per row; reference: NumPy float64 of the same data; rtol=1e-5
    x = X345.reshape((12, 5))
    mean = x.reduce(Ops.ADD, 1) * 0.2
    d = x - mean.reshape((12, 1)).expand((12, 5))
    got = run((d * d).reduce(Ops.ADD, 1), [R345])
    a = R345.reshape(12, 5).astype(np.float64)
    np.testing.assert_allclose(got, ((a - a.mean(1, keepdims=True)) ** 2).sum(1), rtol=1e-5)


# ------------------------------------------------------------------ 0-d outputs and size-1 dims


def test_zero_d_outputs():
    # reference: NumPy / Python arithmetic; exact
    one = buf(0, 1).reshape(())
    got = run(one * 2.0 + 1.0, [np.array([3.0], np.float32)])
    assert got.shape == () and got == 7.0
    got = run(UOp.const(3.0) + UOp.const(1.5), [])  # no inputs: the kernel only writes its output
    assert got.shape == () and got == 4.5
    got = run(UOp.const(7, i32) // UOp.const(-2, i32), [])
    assert got.shape == () and got.dtype == np.int32 and got == -4
    got = run(one.reshape((1, 1)).expand((1, 1)).reduce(Ops.MAX, 2), [np.array([-5.0], np.float32)])
    assert got.shape == () and got == -5.0


def test_size_one_dims():
    # reference: NumPy; exact (sums of two small integers in float32 are exact)
    b = np.arange(12, dtype=np.float32).reshape(1, 3, 1, 4)
    y = buf(0, 12).reshape((1, 3, 1, 4))
    np.testing.assert_array_equal(run(y.permute((3, 2, 1, 0)), [b]), b.transpose(3, 2, 1, 0))
    np.testing.assert_array_equal(run(y.reduce(Ops.ADD, 2), [b]), b.sum((2, 3)))
    np.testing.assert_array_equal(run(y.reshape((1, 3, 4, 1)).reduce(Ops.ADD, 1), [b]), b.reshape(1, 3, 4))
    np.testing.assert_array_equal(run(y.expand((2, 3, 5, 4)), [b]), np.broadcast_to(b, (2, 3, 5, 4)))
    np.testing.assert_array_equal(
        run(y.reshape((3, 4)).shrink(((1, 2), (0, 4))).reshape((1, 1, 4)), [b]), b.reshape(3, 4)[1:2].reshape(1, 1, 4)
    )


# ------------------------------------------------------------------ a matmul chain: mm(mm(A, B), C)


def _abc(n: int) -> UOp:
    a, b, c = (buf(s, n * n).reshape((n, n)) for s in range(3))
    return mm(mm(a, b), c)


def test_mm_mm_is_one_nest_of_four_loops():
    src = render_graph(_abc(4), 3)
    assert src.count("for (") == 4
    loops = c_loops(src)
    assert [d for d, _, _ in loops] == [1, 2, 3, 4]
    for (_, s0, e0), (_, s1, e1) in zip(loops, loops[1:], strict=False):
        assert s0 < s1 and e1 < e0, "each loop must be nested inside the previous one"
    # reference: NumPy float32 matmuls; rtol=1e-5
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(3))
    np.testing.assert_allclose(run(_abc(4), [a, b, c]), (a @ b) @ c, rtol=1e-5, atol=1e-5)


def test_mm_mm_n128_matches_numpy():
    # reference: NumPy float64 (A @ B) @ C; rtol=1e-3 (float32 accumulation in a different order)
    rng = np.random.default_rng(4)
    a, b, c = (rng.standard_normal((128, 128)).astype(np.float32) for _ in range(3))
    want = (a.astype(np.float64) @ b) @ c
    np.testing.assert_allclose(run(_abc(128), [a, b, c]), want, rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------ Chapter 6/7: x - max(x)


def _sub_max() -> UOp:
    x = buf(0, 32).reshape((4, 8))
    return x - x.reduce(Ops.MAX, 1).reshape((4, 1)).expand((4, 8))


def test_sub_max_reduce_loop_is_a_sibling_of_the_output_loop():
    src = render_graph(_sub_max(), 1)
    loops = c_loops(src)
    assert len(loops) == 3 and max(d for d, _, _ in loops) == 2
    lines = c_lines(src)
    (_, s_row, e_row), inner = loops[0], loops[1:]
    assert all(s_row < s and e < e_row for _, s, e in inner)

    def loop_of(pred):
        (hit,) = [(s, e) for _, s, e in inner if any(pred(lines[k]) for k in range(s, e))]
        return hit

    red = loop_of(lambda line: line.lstrip().startswith("acc"))  # the accumulator update
    out = loop_of(lambda line: line.lstrip().startswith("data1["))  # the output store
    assert red[1] < out[0], f"the max loop must close before the output column loop opens\n{src}"
    # reference: NumPy; exact
    a = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(run(_sub_max(), [a]), a - a.max(1, keepdims=True))


# ------------------------------------------------------------------ Chapter 10: GEMM under each Opts

GEMM_OPTS = {
    "naive": Opts(),
    "threads": Opts(thread=0),
    "tile4x4_threads": Opts(upcast={0: 4, 1: 4}, thread=0),
    "tile4x4_threads_blocks64": Opts(upcast={0: 4, 1: 4}, thread=0, tile={0: 64, 1: 64}),
}
_g = np.random.default_rng(10)
GA, GB = (_g.standard_normal((128, 128)).astype(np.float32) for _ in range(2))
GREF = GA.astype(np.float64) @ GB


@pytest.mark.parametrize("bt", [False, True], ids=["B_strided", "B_transposed"])
@pytest.mark.parametrize("name", list(GEMM_OPTS))
def test_gemm_n128(name: str, bt: bool):
    # reference: NumPy float64 matmul; rtol=1e-4 (float32 accumulation)
    got = run(gemm_graph(128, bt=bt), [GA, np.ascontiguousarray(GB.T) if bt else GB], GEMM_OPTS[name])
    np.testing.assert_allclose(got, GREF, rtol=1e-4, atol=1e-4)


def test_gemm_opts_shape_the_loops():
    o = GEMM_OPTS
    naive = render_graph(gemm_graph(128, bt=True), 2, o["naive"])
    assert naive.count("for (") == 3 and "#pragma omp parallel for" not in naive
    thr = render_graph(gemm_graph(128, bt=True), 2, o["threads"])
    assert thr.count("#pragma omp parallel for") == 1
    assert c_lines(thr)[0].strip() == "#pragma omp parallel for"  # the THREAD loop is the outermost one
    tiled = render_graph(gemm_graph(128, bt=True), 2, o["tile4x4_threads"])
    assert tiled.count("for (") == 3 and tiled.count("float acc") == 16
    blocked = render_graph(gemm_graph(128, bt=True), 2, o["tile4x4_threads_blocks64"])
    assert blocked.count("for (") == 5  # 2 block loops, 2 loops within a block, 1 reduce loop
    assert "ridx0 < 2;" in blocked and "ridx1 < 2;" in blocked


# ------------------------------------------------------------------ gated PAD loads


def _guarded(data: np.ndarray, guard: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """`data` as a contiguous view into a larger NaN-filled array: an ungated out-of-range read returns NaN."""
    big = np.full(data.size + 2 * guard, np.nan, data.dtype)
    big[guard : guard + data.size] = data.reshape(-1)
    return big, big[guard : guard + data.size]


def test_heavily_padded_loads_stay_in_range():
    # reference: np.pad; exact (any NaN means an out-of-range element was read)
    _, c = _guarded(np.array([1, 2, 3], np.float32))
    g = buf(0, 3).pad(((100, 200),))
    np.testing.assert_array_equal(run(g, [c]), np.pad(c, (100, 200)))
    _, d = _guarded(np.arange(1, 5, dtype=np.float32))
    g2 = buf(0, 4).reshape((2, 2)).pad(((50, 50), (60, 70)))
    np.testing.assert_array_equal(run(g2, [d]), np.pad(d.reshape(2, 2), ((50, 50), (60, 70))))
    src = render_graph(g2, 1)
    (load,) = [line for line in c_lines(src) if "data0[" in line]
    # the load is unconditional at an index clamped into the buffer; the next statement gates its value
    assert "<0?0:" in load and ">3?3:" in load, f"the index of a padded load must be clamped\n{src}"
    assert "?data0[" not in load, f"no conditional load (gcc 12.2 mis-if-converts it)\n{src}"


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.int32])
def test_a_padded_value_is_gated_once_by_its_mask_bits(dt: DType):
    # a PAD's value is its gated load (0 where the gate fails), with no select of that value by the same condition
    # after it: a float's bits ANDed with the gate's mask (uopc_keepf), which gcc vectorizes where a select became
    # a masked load it could not (a strided window's taps); an integer keeps its select. Exact against np.pad, the
    # signs of zeros and NaN included
    data = np.array([1.5, -0.0, np.nan, -2.0, 0.0, 7.0], dt.np) if dt.is_float else np.arange(1, 7, dtype=dt.np)
    _, d = _guarded(data) if dt.is_float else (None, data)
    g = buf(0, 6, dt).reshape((2, 3)).pad(((1, 2), (2, 1)))
    out, ref = run(g, [d]), np.pad(d.reshape(2, 3), ((1, 2), (2, 1)))
    np.testing.assert_array_equal(out, ref)
    if dt.is_float:
        assert np.array_equal(np.signbit(out), np.signbit(ref))
    lines = c_lines(render_graph(g, 1))
    gated = [line for line in lines if "uopc_keep" in line]
    assert len(gated) == (1 if dt.is_float else 0), lines
    assert sum("?" in line for line in lines if "data0[" not in line) == (0 if dt.is_float else 1), lines


def test_padded_reduce_and_flip_stay_in_range():
    # reference: NumPy; exact (small integers; any NaN means an out-of-range element was read)
    _, e = _guarded(np.arange(1, 7, dtype=np.float32))
    x = buf(0, 6).reshape((2, 3))
    padded = np.pad(e.reshape(2, 3), ((2, 2), (3, 3)))
    np.testing.assert_array_equal(run(x.pad(((2, 2), (3, 3))).flip((1,)).reduce(Ops.ADD, 1), [e]), padded.sum(1))
    # an elementwise op on a padded value pads with op(0), not with a read
    h = (x.pad(((1, 1), (1, 1))) + 1.0).reduce(Ops.MAX, 1)
    np.testing.assert_array_equal(run(h, [e]), (np.pad(e.reshape(2, 3), 1) + 1).max(1))


def test_padded_rows_of_a_regrouped_view_index_without_a_mod():
    """Rows padded past the end of a view whose reshape adds size-1 dims in front of the row axis (a GEMM panel
    packed from (1, 1, rows, k)): the row index stays affine (its padded part is gated), not wrapped by % rows,
    which kept the copy scalar (a stride-2 convolution's panels, 0.41 -> 0.11 ms). Reference: np.pad; exact."""
    data = np.arange(1, 2 * 7 * 5 + 1, dtype=np.float32)
    rows = buf(0, 70).reshape((2, 1, 7, 5)).shrink(((1, 2), (0, 1), (0, 7), (0, 5))).reshape((7, 5))
    g = rows.pad(((0, 3), (0, 0))).reshape((5, 2, 5))
    ref = np.pad(data.reshape(2, 7, 5)[1], ((0, 3), (0, 0))).reshape(5, 2, 5)
    np.testing.assert_array_equal(run(g, [data]), ref)
    assert "%" not in "\n".join(c_lines(render_graph(g, 1))), render_graph(g, 1)


# gcc 12.2 at -O3 if-converted and vectorized the row loop of the kernel below and summed the wrong elements while
# its PAD load was conditional (`gate ? data[i] : 0`, also `data[gate ? i : 0]`); the renderer now loads at a clamped
# index and gates the value, and the default flags keep if-conversion on.


@pytest.mark.parametrize("flip", [False, True], ids=["plain", "flipped"])
def test_padded_window_sum_under_an_invariant_loop(flip: bool):
    # regression: PAD on both axes, an EXPANDed (loop-invariant) axis between the row loop and the reduce loop:
    # gcc 12 vectorizes the row loop with AVX-512 masks and sums the wrong elements (no out-of-range read needed).
    # reference: NumPy; exact (small integers)
    a = np.arange(1, 7, dtype=np.float32)
    p = buf(0, 6).reshape((2, 3)).pad(((1, 1), (1, 1)))
    ref = np.pad(a.reshape(2, 3), 1)
    if flip:
        p, ref = p.flip((1,)), ref[:, ::-1]
    g = p.reshape((4, 1, 5)).expand((4, 4, 5)).reduce(Ops.ADD, 1)
    np.testing.assert_array_equal(run(g, [a]), np.broadcast_to(ref.sum(1)[:, None], (4, 4)))
    assert "-fno-tree-loop-if-convert" not in runtime._DEFAULT_CFLAGS


# ------------------------------------------------------------------ deep graphs


def test_deep_elementwise_chain_lowers():
    # regression: graph_rewrite/simplify are iterative, but lowering a 1000-op elementwise chain (e.g. summing 1000
    # tensors) raised RecursionError. reference: NumPy float32 (small integers: exact)
    x = buf(0, 4)
    y = x
    for _ in range(1000):
        y = y + x
    a = np.array([1, -2, 3, 7], np.float32)
    np.testing.assert_array_equal(run(y, [a]), a * 1001)


def test_a_padded_value_reads_its_per_channel_operands_once_per_channel():
    # pad(x * 1/sqrt(v[c] + eps)) (a BatchNorm before a convolution's or a pooling's padding): v[c] is in range
    # wherever the loops go, so its load is not gated by the padding and leaves the spatial loops, with the sqrt.
    # reference: NumPy float32; rtol=1e-6
    C, H, W = 3, 5, 7
    x = buf(0, C * H * W).reshape((C, H, W))
    v = buf(1, C).reshape((C, 1, 1)).expand((C, H, W))
    g = (x * (v + 1e-5).alu(Ops.SQRT).alu(Ops.RECIP)).pad(((0, 0), (1, 1), (1, 1)))
    lines = c_lines(render_graph(g, 2))
    depth = {ln.strip(): len(ln) - len(ln.lstrip()) for ln in lines}
    sqrt = next(d for ln, d in depth.items() if "sqrt" in ln)
    store = next(d for ln, d in depth.items() if ln.startswith("data2["))
    assert sqrt < store, "\n".join(lines)
    a = np.random.default_rng(6).standard_normal((C, H, W)).astype(np.float32)
    var = np.array([0.5, 2.0, 4.0], np.float32)
    want = np.pad(a / np.sqrt(var[:, None, None] + np.float32(1e-5)), ((0, 0), (1, 1), (1, 1)))
    np.testing.assert_allclose(run(g, [a, var]), want, rtol=1e-6)


@pytest.mark.parametrize("opt", [0, 1])
def test_an_elementwise_kernel_runs_the_dims_its_reads_walk_in_order_as_one_loop(opt):
    # (8, 4, 5, 7) * c[4, 1, 1] + x.permute: the two last dims of every read are one run of 35 elements; the dims
    # before them are not (c repeats over dim 0, the permuted read walks dim 1 across rows). The kernel keeps its
    # name, its loops are (8, 4, 35). reference: NumPy float32, rtol=1e-6, atol=1e-6 (the kernel contracts a*c+b to
    # an FMA)
    g = np.random.default_rng(3)
    a, c, b = (g.standard_normal(s).astype(np.float32) for s in ((8, 4, 5, 7), (4, 1, 1), (4, 8, 5, 7)))
    ta, tc, tb = Tensor(a), Tensor(c), Tensor(b)
    y = ta * tc + tb.permute(1, 0, 2, 3)
    with Context(OPT=opt):
        plan, _ = make_plan([y.uop], opt=default_opt())
        (k,) = plan.kernels
        assert k.name == "e_8_4_5_7"
        src = render_c(k.ast, k.name)
        trips = re.findall(r"ridx\d+ < (\d+);", src)
        # (the optimizer may cut the merged loop into vectors and a remainder on another machine: no 5 or 7 is left)
        assert trips == ["8", "4", "35"] if opt == 0 else not {"5", "7"} & set(trips), src
        np.testing.assert_allclose(y.numpy(), a * c + b.transpose(1, 0, 2, 3), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("opt", [0, 1])
def test_an_elementwise_kernels_output_loops_that_its_reads_take_apart_are_split(opt):
    # max pool's backward (2x2, stride 2) over (2, 3, 8, 10), through a ReLU: the kernel runs over the input's (8, 10)
    # (the ReLU's mask is read there) and reads its window's gradient at (h // 2, w // 2), the tap at (h % 2, w % 2):
    # the output loops of 8 and 10 run as (4, 2) and (5, 2), so no division or modulo is left in the kernel.
    # reference: NumPy, exact (a gradient routed, not summed)
    g = np.random.default_rng(4)
    x = g.standard_normal((2, 3, 8, 10)).astype(np.float32)
    up = g.standard_normal((2, 3, 4, 5)).astype(np.float32)
    t = Tensor(x, requires_grad=True)
    (t.relu().max_pool2d(2) * Tensor(up)).sum().backward()
    with Context(OPT=opt):
        plan, _ = make_plan([t.grad.uop], opt=default_opt())
        ks = [k for k in plan.kernels if k.name.startswith("e_2_3_8_10")]
        assert ks, [k.name for k in plan.kernels]
        for k in ks:  # (the ReLU's mask, and the gradient through it)
            body = render_c(k.ast, k.name).split(f"void {k.name}(", 1)[1]
            assert "%" not in body and "/" not in body, body
        win = np.maximum(x, 0).reshape(2, 3, 4, 2, 5, 2).transpose(0, 1, 2, 4, 3, 5).reshape(2, 3, 4, 5, 4)
        hot = np.eye(4, dtype=np.float32)[win.argmax(-1)] * up[..., None]
        want = hot.reshape(2, 3, 4, 5, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(2, 3, 8, 10) * (x > 0)
        np.testing.assert_array_equal(t.grad.numpy(), want)


@pytest.mark.parametrize("opt", [0, 1])
def test_a_split_output_loop_nests_where_it_was(opt):
    # NCHW (4, 8, 5, 6) -> NHWC rows in two halves (2, 60, 8), as a weight gradient's operand is staged: the 60 is
    # read as n = r // 30, hw = r % 30, so it runs as loops (2, 30), and those must nest where the 60 did, outside
    # the channels: made after every other loop, they nested inside them and the copy wrote 8 floats apart from
    # its innermost loop (in the CNN step, (2, 50176, 16): 720 us against 136). reference: NumPy, exact (a copy)
    x = np.random.default_rng(5).standard_normal((4, 8, 5, 6)).astype(np.float32)
    y = Tensor(x).permute(0, 2, 3, 1).reshape(2, 60, 8).contiguous()
    with Context(OPT=opt):
        plan, _ = make_plan([y.sum(1).uop], opt=default_opt())
        (k,) = [k for k in plan.kernels if k.name == "e_2_60_8"]
        trips = re.findall(r"ridx\d+ < (\d+);", render_c(k.ast, k.name))
        # (the optimizer may take the channels in vectors on another machine: then no loop of 8 is left)
        assert trips == ["2", "2", "30", "8"] if opt == 0 else "8" not in trips or trips[-1] == "8", trips
        np.testing.assert_array_equal(y.numpy(), x.transpose(0, 2, 3, 1).reshape(2, 60, 8))


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=["f32", "f64"])
def test_select_against_zero_is_a_bit_mask(dtype):
    """where(c, x, 0) and where(c, 0, x), on a mask loaded from memory or a computed condition, render as x's bits
    ANDed with the condition's (uopc_keepf / uopc_keep: no compare-and-jump where gcc keeps the loop scalar), and keep
    x exactly: -0.0, NaN and inf where the condition holds, +0.0 where it does not."""
    n = 64
    m, x = buf(0, n, dtypes.bool), buf(1, n, dtype)
    rng = np.random.default_rng(0)
    mask = rng.random(n) < 0.5
    xs = rng.standard_normal(n).astype(dtype.np)
    xs[:8] = [-0.0, np.nan, np.inf, -np.inf, 0.0, -1.5, 1e-300 if dtype is dtypes.float64 else 1e-40, -3.0]
    mask[:8] = True
    mask[8:12] = False
    name = "uopc_keepf" if dtype is dtypes.float32 else "uopc_keep"
    for g, want in (
        (m.where(x, UOp.const(0.0, dtype)), np.where(mask, xs, 0.0)),
        (m.where(UOp.const(0.0, dtype), x), np.where(mask, 0.0, xs)),
        ((m & (x < UOp.const(1.0, dtype))).where(x, UOp.const(0.0, dtype)), np.where(mask & (xs < 1.0), xs, 0.0)),
        # nested (a max-pool's backward: the ReLU mask, then the window's argmax): one mask of both conditions
        (
            m.where((x < UOp.const(1.0, dtype)).where(x, UOp.const(0.0, dtype)), UOp.const(0.0, dtype)),
            np.where(mask & (xs < 1.0), xs, 0.0),
        ),
    ):
        body = render_graph(g, 2).split("void k(")[1]
        assert f"{name}(" in body and "?" not in body, body
        got = run(g, [mask, xs])
        assert got.dtype == dtype.np and (got.view(f"u{dtype.itemsize}") == want.view(f"u{dtype.itemsize}")).all()
    computed = (x < UOp.const(1.0, dtype)).where(x, UOp.const(0.0, dtype))
    body = render_graph(computed, 2).split("void k(")[1]
    assert f"{name}(" in body and "?" not in body, body
    got = run(computed, [mask, xs])
    want = np.where(xs < 1.0, xs, 0.0).astype(dtype.np)
    assert (got.view(f"u{dtype.itemsize}") == want.view(f"u{dtype.itemsize}")).all()


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=["f32", "f64"])
def test_float_select_is_branch_free(dtype):
    """Any other float select renders as a bit select (uopc_selectf / uopc_select: a's bits where the condition
    holds, b's elsewhere), never `c ? a : b`: gcc turned a ReLU6's two selects into two compare-and-jumps wherever it
    kept the loop scalar (MobileNetV2's head, relu6(BatchNorm(x)) averaged over 1280 x 7 x 7, four channels' sums
    interleaved: 0.28 ms, 6 us with the bits in a C harness on random data); where gcc vectorizes, it makes the same
    masked move of either. Both values' bits are kept exactly: -0.0, NaN and inf. reference: NumPy"""
    n = 64
    x, y = buf(0, n, dtype), buf(1, n, dtype)
    rng = np.random.default_rng(3)
    xs, ys = (rng.standard_normal(n) * 8).astype(dtype.np), rng.standard_normal(n).astype(dtype.np)
    xs[:6], ys[:6] = [np.nan, -0.0, np.inf, -np.inf, 7.0, -7.0], [1.0, np.nan, -0.0, np.inf, np.nan, -np.inf]
    lo, hi = UOp.const(0.0, dtype), UOp.const(6.0, dtype)
    relu = (x < lo).where(lo, x)
    name = "uopc_selectf(" if dtype is dtypes.float32 else "uopc_select("
    for g, want in (
        ((hi < relu).where(hi, relu), np.where(6.0 < np.where(xs < 0, 0.0, xs), 6.0, np.where(xs < 0, 0.0, xs))),
        ((x < y).where(y, x), np.where(xs < ys, ys, xs)),
        (x.alu(Ops.CMPNE, x).where(y, x), np.where(xs != xs, ys, xs)),
    ):
        body = render_graph(g, 2).split("void k(")[1]
        assert name in body and "?" not in body, body
        got = run(g, [xs, ys])
        want = want.astype(dtype.np)
        assert got.dtype == dtype.np and (got.view(f"u{dtype.itemsize}") == want.view(f"u{dtype.itemsize}")).all()


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int64, dtypes.uint8], ids=["i32", "i64", "u8"])
def test_integer_select_against_zero_is_a_bit_mask(dtype):
    """where(c, x, 0) and where(c, 0, x) of integers render as x ANDed with 0 - c on any condition, a stored mask or a
    compare (an argmax's `hit ? weight : 0`: a max pool's backward, whose scalar loop remainders jumped on each tap),
    with the values of the select. reference: NumPy"""
    n = 64
    x, f = buf(0, n, dtype), buf(1, n, dtypes.float32)
    rng = np.random.default_rng(2)
    xs = rng.integers(0, 200, n).astype(dtype.np)
    xs[:3] = [np.iinfo(dtype.np).max, np.iinfo(dtype.np).min, 0]
    fs = rng.standard_normal(n).astype(np.float32)
    fs[:4] = [np.nan, 0.0, -0.0, np.inf]
    zero = UOp.const(0, dtype)
    for g, want in (
        ((f < UOp.const(0.5, dtypes.float32)).where(x, zero), np.where(fs < 0.5, xs, 0)),
        (f.alu(Ops.CMPNE, f).where(zero, x), np.where(fs != fs, 0, xs)),
    ):
        body = render_graph(g, 2).split("void k(")[1]
        assert "?" not in body and "& (" in body, body
        got = run(g, [xs, fs])
        assert got.dtype == dtype.np
        np.testing.assert_array_equal(got, want.astype(dtype.np))


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=["f32", "f64"])
def test_elementwise_float_max_is_the_branch_free_helper(dtype):
    """An elementwise float max renders as uopc_maxf / uopc_max (a max instruction, NaN put back), as a reduction's
    does: the one-select form ((a > b) | (a != a)) ? a : b became compare-and-jump in loops gcc kept scalar (a 2x2
    max-pool's window unrolled over stride-2 reads: 1.05 ms against 0.087 ms with the helper in a C harness on random
    data). NaN from either side propagates, as NumPy's maximum."""
    n = 64
    x, y = buf(0, n, dtype), buf(1, n, dtype)
    rng = np.random.default_rng(1)
    xs, ys = rng.standard_normal(n).astype(dtype.np), rng.standard_normal(n).astype(dtype.np)
    xs[:4], ys[:4] = [np.nan, 1.0, np.inf, -np.inf], [2.0, np.nan, np.nan, -np.inf]
    g = x.alu(Ops.MAX, y)
    body = render_graph(g, 2).split("void k(")[1]  # the kernel, after the helpers
    assert ("uopc_maxf(" if dtype is dtypes.float32 else "uopc_max(") in body and "!=" not in body
    got = run(g, [xs, ys])
    np.testing.assert_array_equal(got, np.maximum(xs, ys))

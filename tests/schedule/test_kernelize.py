"""The kernelizer of Chapter 7: kernel counts and names, plans, the structural cache, STAGE, fuse_reduce.

Kernel counts are stated at OPT=0 (no layout pass), as the chapter states them. Numeric references: NumPy.
"""

from __future__ import annotations

import re
from collections import OrderedDict

import numpy as np
import pytest

from uopc import helpers
from uopc.engine import lower as lowering
from uopc.engine import realize
from uopc.kernelize import make_plan
from uopc.renderer.c import render_c
from uopc.runtime import compiler as runtime
from uopc.runtime.buffer import buffer_data, new_buffer, pool
from uopc.runtime.compiler import Program
from uopc.schedule import Out, Ref, RefKind, Temp, cut
from uopc.tensor import Tensor
from uopc.uop import Ops, UOp, structure_key
from uopc.uop.dtype import dtypes

rng = np.random.default_rng(0)


def r(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture
def opt0(context, monkeypatch):
    context(OPT=0)


def names(*ts: Tensor, fuse_reduce: bool = False) -> list[str]:
    plan, _ = make_plan([t.uop for t in ts], fuse_reduce=fuse_reduce)
    return [k.name for k in plan.kernels]


def check_schedule(t: Tensor, n: int) -> list[str]:
    ks = names(t)
    assert len(ks) == n, ks
    return ks


@pytest.mark.parametrize(
    "name,fn,n",
    [
        ("add", lambda a, b, c: a + b, 1),  # elementwise: fused
        ("add_sum", lambda a, b, c: (a + b).sum(), 1),  # the add fuses into the reduction's loop
        ("softmax", lambda a, b, c: a.softmax(-1), 3),  # max, sum, elementwise output
        ("var", lambda a, b, c: a.var(-1), 3),  # mean, sum of squared deviations, scale
        ("chain", lambda a, b, c: (a * 2 + 1).relu() * 3, 1),
    ],
)
def test_kernel_counts(opt0, name, fn, n):
    a, b, c = (Tensor(r(64, 64)) for _ in range(3))
    check_schedule(fn(a, b, c), n)


def test_matmul_relu_matmul_stages_the_relu(opt0):
    a, b, c = (Tensor(r(64, 64)) for _ in range(3))
    # the relu (2 ALU ops x 4096 elements) is broadcast 64-fold into the second matmul: it gets its own kernel
    assert names((a @ b).relu() @ c) == ["r_64_64", "e_64_64", "r_64_64"]


def _layernorm_matmul():
    x, W = Tensor(r(128, 256)), Tensor(r(256, 256))
    m = x.mean(-1, keepdim=True)
    return ((x - m) * ((x - m).square().mean(-1, keepdim=True) + 1e-5).rsqrt()) @ W


def test_layernorm_into_matmul(opt0, monkeypatch):
    assert names(_layernorm_matmul()) == ["r_128", "r_128n1", "e_128_256", "r_128_256"]
    monkeypatch.setattr(cut, "stage_broadcast_compute", lambda roots: roots)
    assert names(_layernorm_matmul()) == ["r_128", "r_128n1", "r_128_256"]


def _residual_stack(layers: int, x0: np.ndarray, ws: list[np.ndarray], bs: list[np.ndarray]):
    """A transformer-like residual stream: x = x + relu(layernorm(x) @ W + b) per layer, then a final LayerNorm."""

    def ln(t):
        m = t.mean(-1, keepdim=True)
        return (t - m) * ((t - m).square().mean(-1, keepdim=True) + 1e-5).rsqrt()

    x = Tensor(x0)
    for w, b in zip(ws[:layers], bs[:layers], strict=True):
        x = x + (ln(x) @ Tensor(w) + Tensor(b)).relu()
    return ln(x)


def _residual_ref(layers: int, x: np.ndarray, ws, bs) -> np.ndarray:
    def ln(t):
        t = t.astype(np.float64)
        c = t - t.mean(-1, keepdims=True)
        return c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5)

    for w, b in zip(ws[:layers], bs[:layers], strict=True):
        x = x + np.maximum(ln(x) @ w + b, 0)
    return ln(x)


def test_residual_stream_is_staged_so_every_layer_has_the_same_kernels(opt0):
    """Unstaged, layer L's LayerNorm would recompute the whole stream x + f_1 + ... + f_L (2L reads): distinct,
    growing kernels per layer. stage_shared_chains materializes it at 3 full-size reads, so 3 and 6 layers
    schedule to the same set of distinct kernels, each layer's the same."""
    x0 = r(16, 32)
    ws, bs = [r(32, 32) * 0.2 for _ in range(6)], [r(32) * 0.1 for _ in range(6)]
    distinct = {}
    for layers in (3, 6):
        out = _residual_stack(layers, x0, ws, bs)
        plan, _ = make_plan([out.uop])
        distinct[layers] = {k.ast for k in plan.kernels}
        np.testing.assert_allclose(out.numpy(), _residual_ref(layers, x0, ws, bs), rtol=2e-4, atol=2e-4)
    assert distinct[3] == distinct[6]
    # a short chain read by two kernels stays fused: softmax's exp(x - max) feeds the sum and the division
    assert names(Tensor(r(4, 8)).softmax(-1)) == ["r_4", "r_4n1", "e_4_8"]


def test_softmax_plan_refs_and_temps(opt0):
    x = Tensor(r(4, 8))
    plan, inputs = make_plan([x.softmax(-1).uop])
    x0, t0, t1, o0 = Ref(RefKind.IN, 0), Ref(RefKind.TMP, 0), Ref(RefKind.TMP, 1), Ref(RefKind.OUT, 0)
    assert [(k.name, k.refs) for k in plan.kernels] == [
        ("r_4", (x0, t0)),
        ("r_4n1", (x0, t0, t1)),
        ("e_4_8", (x0, t0, t1, o0)),
    ]
    assert repr(plan.kernels[2].refs) == "(in[0], tmp[0], tmp[1], out[0])"
    assert plan.temps == (Temp(dtypes.f32, 4), Temp(dtypes.f32, 4))
    assert plan.outs == (Out(dtypes.f32, 32),)  # a fresh buffer, not an alias
    assert len(inputs) == 1 and inputs[0].op is Ops.BUFFER


def test_roots_that_are_inputs_or_earlier_roots_are_aliases(opt0):
    x = Tensor(r(4, 8))
    s = x.sum(1)
    plan, _ = make_plan([x.uop, s.uop, s.uop.reshape((4, 1))])
    assert plan.outs == (
        Out(dtypes.f32, 32, Ref(RefKind.IN, 0)),  # the input itself: nothing is written
        Out(dtypes.f32, 4),  # a fresh buffer
        Out(dtypes.f32, 4, Ref(RefKind.OUT, 1)),  # the same value as root 1
    )
    assert len(plan.kernels) == 1


def test_identical_kernels_identical_c(opt0):
    a, b = Tensor(r(16, 16)), Tensor(r(16, 16))
    plan, _ = make_plan([a.sum(1).uop, b.sum(1).uop])
    k0, k1 = plan.kernels
    assert k0.refs == (Ref(RefKind.IN, 0), Ref(RefKind.OUT, 0)) and k1.refs == (Ref(RefKind.IN, 1), Ref(RefKind.OUT, 1))
    assert k0.ast is k1.ast  # local renumbering: one AST, so one C source and one compile for both
    assert render_c(k0.ast, k0.name) == render_c(k1.ast, k1.name)


def test_plan_runs_on_new_inputs(opt0):
    x1, x2 = r(4, 8), r(4, 8)
    plan, _ = make_plan([Tensor(x1).softmax(-1).uop])
    for x in (x1, x2):  # one plan, two different inputs
        arrays = {
            RefKind.IN: [buffer_data(new_buffer(Tensor(x).dtype, 32, x))],
            RefKind.TMP: [np.empty(t.size, t.dtype.np) for t in plan.temps],
            RefKind.OUT: [np.empty(32, np.float32)],
        }
        for k in plan.kernels:
            Program(render_c(k.ast, k.name), k.name)(*(arrays[ref.kind][ref.i] for ref in k.refs))
        e = np.exp(x - x.max(1, keepdims=True))
        got = arrays[RefKind.OUT][0].reshape(4, 8)
        np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_second_realize_hits_the_cache(opt0, monkeypatch):
    # an empty plan cache of its own (after a long run the shared one is full and stops growing); every build and
    # every look-up of the disk store counted
    monkeypatch.setattr(realize, "_plans", OrderedDict())
    built, looked_up = [], []
    monkeypatch.setattr(realize, "make_plan", lambda *a, **kw: built.append(1) or make_plan(*a, **kw))
    load = realize.plan_store.load
    monkeypatch.setattr(realize.plan_store, "load", lambda name: looked_up.append(name) or load(name))
    x = r(64, 64)
    Tensor(x).softmax(-1).realize()
    assert len(realize._plans) == 1 and len(looked_up) == 1
    y = r(64, 64)
    out = Tensor(y).softmax(-1).numpy()  # same structure, different data
    assert len(realize._plans) == 1 and len(looked_up) == 1, "the second realize left the in-memory plan cache"
    assert len(built) <= 1
    e = np.exp(y - y.max(1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_python_floats_are_structure_tensors_are_data(opt0, monkeypatch):
    # an empty plan cache of its own: after a long test run the shared one is full and stops growing
    monkeypatch.setattr(realize, "_plans", OrderedDict())
    w = Tensor(r(8))
    n0 = len(realize._plans)
    for t in range(1, 4):
        (w * (1 / (1 - 0.9**t))).realize()  # a new CONST each step: a new plan each step
    assert len(realize._plans) == n0 + 3
    for t in range(1, 4):
        (w * Tensor(np.array([1 / (1 - 0.9**t)], np.float32))).realize()  # a BUFFER: one plan
    assert len(realize._plans) == n0 + 4


def test_fuse_reduce_softmax_one_kernel(opt0, monkeypatch):
    x = r(4, 8)
    t = Tensor(x).softmax(-1)
    assert names(t, fuse_reduce=True) == ["r_4_8"]
    monkeypatch.setattr(Tensor, "fuse_reduce", True)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(Tensor(x).softmax(-1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_deleted_reads_do_not_shift_kernel_arguments():
    # regression: int t*0 folds to 0, the kernel no longer reads t, and must not write into it
    t = Tensor(np.array([1, 2, 3], np.int32))
    assert (t * 0).numpy().tolist() == [0, 0, 0]
    assert t.numpy().tolist() == [1, 2, 3]


def test_contiguous_is_a_cut(opt0):
    a = Tensor(r(256, 256))
    assert names((a.exp() * 2).contiguous().sum(1)) == ["e_256_256", "r_256"]
    assert names((a.exp() * 2).sum(1)) == ["r_256"]


def test_detach_is_not_a_kernel(opt0):
    a = Tensor(r(8, 8))
    assert names(a.detach() * 2) == ["e_8_8"]


def test_wrap_nested_targets():
    # substitute() would wrap the original outer node and lose the inner STAGE; wrap() composes
    x = Tensor(r(8, 8)).uop
    inner = x * 2.0 + 1.0
    outer = UOp(Ops.EXP2, (inner,)) * inner
    root = outer.reduce(Ops.ADD, 1)
    sub = root.substitute({inner: UOp(Ops.STAGE, (inner,)), outer: UOp(Ops.STAGE, (outer,))})
    (wrapped,) = UOp.wrap([root], {inner, outer}, lambda n: UOp(Ops.STAGE, (n,)))
    assert sum(u.op is Ops.STAGE for u in sub.toposort()) == 1
    assert sum(u.op is Ops.STAGE for u in wrapped.toposort()) == 2


def test_temporaries_are_reused_across_runs(opt0):
    # temps are taken from the pool per call and given back after it: the second run allocates nothing new
    x = r(32, 32)
    Tensor(x).softmax(-1).realize()
    misses = pool.misses
    Tensor(r(32, 32)).softmax(-1).realize()
    assert pool.misses == misses


def test_plan_cache_is_bounded(context):
    context(PLAN_CACHE=8)
    for n in range(1, 30):
        (Tensor(np.ones(n, np.float32)) + 1).realize()
    assert len(realize._plans) <= 8


def test_debug4_prints_the_c(context, opt0, capsys, monkeypatch):
    context(DEBUG=4)
    (Tensor(r(3, 5)) * 7 - 1).realize()  # a structure no other test uses: a cache miss, so the C is printed
    out = capsys.readouterr().out
    # each kernel's function is named by its shape and a digest of its C (the same kernel in any plan, one object);
    # a one-loop kernel's shape is its size argument (e_n, the same function for every size), which the call passes
    assert re.search(r"void e_n_[0-9a-f]{16}\(float\* restrict data0, float\* restrict data1, int var_uopc_n", out)
    assert re.search(r"e_n_[0-9a-f]{16}\(\(float\*\)bufs\[0\], \(float\*\)bufs\[1\], 15(, err)?\);", out), out
    assert "realize: 1 kernels" in out and "GFLOP/s" in out and "  e_3_5 " in out  # the plan still names it e_3_5


def test_plan_cache_stays_bounded_over_3000_shapes(context, monkeypatch):
    # a program that sees thousands of distinct shapes: the in-memory plan cache evicts least recently used plans.
    # Compiling 3,000 kernels would take minutes, so programs are stubbed: this checks the cache, not gcc.
    context(PLAN_CACHE=64)

    def fake_compile(plan, n_in, s=None):
        return realize.CompiledPlan(plan, "", None, n_in, ())

    monkeypatch.setattr(realize, "compile_plan", fake_compile)
    for n in range(1, 3001):
        realize.realize([(Tensor.ones(n) * 2).uop])
        assert len(realize._plans) <= 64
    hot = (Tensor.ones(5) * 2).uop
    key = realize.plan_key(structure_key([hot])[0], False, None, helpers.settings(), runtime.machine())
    realize.realize([hot])
    assert next(reversed(realize._plans)) == key  # a hit moves the plan to the most-recent end


def test_plan_key_includes_bounds_checks(context, opt0):
    # regression: the plan key once left out UOPC_CHECK_OOB, so a plan built with checks off ran unchecked under
    # Context(CHECK_OOB=1). The second realize of the same structure must run the checked kernel.
    x = Tensor(r(5, 7))
    (x * 3 + 2).realize()
    context(CHECK_OOB=1)
    y = Tensor(r(5, 7))
    (y * 3 + 2).realize()
    cp = next(reversed(realize._plans.values()))
    assert "uopc_check(uopc_oob, " in cp.src


def test_strided_conv2d_is_im2col_then_a_gemm_shaped_reduce():
    # the windows are copied once (e_), position-major per tap, with the taps and the positions as loops of their
    # own, then one reduction over Cin*kh*kw = 288 reads both operands with plain ranges: no div/mod in either
    # kernel's index math (the reduction reads the staged (32, 3, 3, 5, 6) as (288, 30): a reshape of a reshape is
    # one reshape)
    x, w = Tensor(r(2, 32, 9, 11)), Tensor(r(8, 32, 3, 3))
    plan, _ = make_plan([x.conv2d(w, padding=1, stride=2).uop])
    assert [k.name for k in plan.kernels] == ["e_2_1_32_3_3_5_6", "r_2_1_8_30"]
    for k in plan.kernels:
        body = render_c(k.ast, k.name).split(f"void {k.name}(", 1)[1]  # the function only, not the helpers
        assert "%" not in body and "/" not in body, body


def test_stride1_conv2d_reads_the_padded_input_in_place():
    # no im2col: the padded input is copied once, in its padded shape with one more row of zeros for the tail (11 * 13
    # + 2 tail zeros, + 11 for the positions rounded up = 156 <= 12 * 13: e_2_32_12_13, read flat per channel), the
    # reduction over Cin*kh*kw runs over every column of the padded width (9 * 13 = 117 positions, rounded up to
    # 128: whole register tiles) reading that copy at each tap's offset, and the extra columns are cut by the
    # consumer (here a copy, the plan's output)
    x, w = Tensor(r(2, 32, 9, 11)), Tensor(r(8, 32, 3, 3))
    plan, _ = make_plan([x.conv2d(w, padding=1).uop])
    assert [k.name for k in plan.kernels] == ["e_2_32_12_13", "r_2_1_8_128", "e_2_8_9_11"]
    # a consumer fuses the cut: conv + relu is the same three kernels, the relu in the last
    plan, _ = make_plan([x.conv2d(w, padding=1).relu().uop])
    assert [k.name for k in plan.kernels] == ["e_2_32_12_13", "r_2_1_8_128", "e_2_8_9_11"]


def test_identical_kernels_are_lowered_once():
    # the layers of a deep model renumber to one kernel body (hash-consed): optimized and lowered once, and the
    # plan still binds each kernel to its own buffers
    from uopc.engine.realize import default_opt

    g = np.random.default_rng(0)
    ws = [g.standard_normal((32, 32)).astype(np.float32) for _ in range(6)]
    x0 = g.standard_normal((8, 32)).astype(np.float32)
    x = Tensor(x0)
    for w in ws:
        x = (x @ Tensor(w)).relu()
    before = dict(lowering.lowered_stats)
    plan, _ = make_plan([x.uop], opt=default_opt())
    misses = lowering.lowered_stats["misses"] - before["misses"]
    hits = lowering.lowered_stats["hits"] - before["hits"]
    # the first layer reads x in place, the middle ones pack relu(previous) first: a handful of distinct kernels
    assert misses <= 4 and hits + misses == len(plan.kernels) >= 6, (hits, misses, len(plan.kernels))
    ref = x0
    for w in ws:
        ref = np.maximum(ref @ w, 0)
    np.testing.assert_allclose(x.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_conv2d_backward_is_two_gemms_and_no_window_sum():
    # the input gradient is a stride-1 convolution of the padded output gradient (its flat copy, then a GEMM that
    # reads it in place), the weight gradient one GEMM over batch x positions (2 * 99 = 198) that reads the forward's
    # flat input: no col2im (a sum over the overlapping windows) and no im2col copy
    x, w = Tensor(r(2, 32, 9, 11), requires_grad=True), Tensor(r(8, 32, 3, 3), requires_grad=True)
    out = x.conv2d(w, padding=1)
    dx, dw = (out * Tensor(r(2, 8, 9, 11))).sum().gradient(x, w)
    plan, _ = make_plan([dx.uop, dw.uop])
    reduces = [k.name for k in plan.kernels if k.name.startswith("r_")]
    assert reduces == ["r_2_1_32_128", "r_1_288_8"], [k.name for k in plan.kernels]
    copies = [k.name for k in plan.kernels if k.name.startswith("e_")]
    assert "e_2_32_12_13" in copies and "e_2_8_12_13" in copies, copies  # the flat padded input and gradient

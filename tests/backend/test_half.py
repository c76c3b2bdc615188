"""float16 and bfloat16 as PyTorch computes them: every op in float32, its result rounded once (uopc/half.py for the
primitive ops, @opmath for the composites, UOp.reduce for sums). References: PyTorch's float16 / bfloat16 ops on the
same values; a tolerance of one 16-bit ulp where uopc's float32 math and PyTorch's may round to neighbouring halves.

The CPU-independence check compiles the C for Intel's Sapphire Rapids (AVX512-FP16) with `-S`, which needs no such
CPU, and looks for half-precision arithmetic instructions in the assembly."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import buf
from uopc import Tensor, dtypes, helpers, nn
from uopc.codegen.rangeify import Ctx, Opts, lower
from uopc.kernelize import make_plan
from uopc.renderer.c import render_c
from uopc.renderer.half import c_conversion, compute_in_float
from uopc.renderer.plan import render_plan
from uopc.runtime import compiler as runtime
from uopc.uop import ALU, Ops

rng = np.random.default_rng(16)


def ulps(got: np.ndarray, ref: torch.Tensor) -> np.ndarray:
    """|got - ref| in ulps of ref's 16-bit dtype at ref (float16: np.spacing; bfloat16: 2^(exponent - 7))."""
    r = ref.float().numpy().astype(np.float64)
    g = np.asarray(got, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):  # inf and NaN: compared as equal or not
        if ref.dtype is torch.float16:
            step = np.spacing(np.abs(r).astype(np.float16)).astype(np.float64)
        else:
            step = np.exp2(np.floor(np.log2(np.maximum(np.abs(r), 2.0**-126))) - 7)
        same = (g == r) | (np.isnan(g) & np.isnan(r))
        return np.where(same, 0.0, np.abs(g - r) / step)


# ---------------------------------------------------------------- the examples, float16 against PyTorch


def test_asinh_of_minus_300_is_not_inf():
    # x * x overflows half at |x| > 256: asinh computes in float32 and rounds once (PyTorch: -6.3984375)
    x = np.array([-300.0, -1e4, 6e4, 2.5, 0.0], np.float16)
    np.testing.assert_array_equal(Tensor(x).asinh().numpy(), torch.asinh(torch.tensor(x)).numpy())


def test_layernorm_of_values_near_160():
    # the sum of squares overflowed half (gcc's native half arithmetic returned all zeros). References: NumPy float64
    # rounded to half, within one ulp (rtol 2^-10) plus 2e-5 for float32's own rounding of the mean (160 * 2^-24,
    # times rstd ~ 2: a few ulps of outputs near 0); and F.layer_norm in half, whose CPU kernel computes
    # x * rstd - mean * rstd in float32: two terms near 160 * rstd = 320 cancel, an absolute error up to ~4e-5
    x = (160 + rng.standard_normal((4, 300)) * 0.5).astype(np.float16)
    x64 = x.astype(np.float64)
    c = x64 - x64.mean(-1, keepdims=True)
    exact = torch.tensor(c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5)).half()
    ref = F.layer_norm(torch.tensor(x), (300,))
    for got in (Tensor(x).layernorm(), nn.LayerNorm(300)(Tensor(x))):  # the layer too (its weights are float32)
        assert got.dtype is dtypes.float16
        np.testing.assert_allclose(got.numpy(), exact.numpy(), rtol=2**-10, atol=2e-5)
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=2**-10, atol=4e-5)
    assert np.abs(ref.numpy()).max() > 2  # not all zeros


def _grad_pair(f_ours, f_ref, *xs: np.ndarray) -> tuple[list[np.ndarray], list[torch.Tensor], list[torch.Tensor]]:
    """Our gradients of sum(f(xs)), PyTorch's in half, and PyTorch's float32 ones rounded to half."""
    ts = [Tensor(x, requires_grad=True) for x in xs]
    ours = [g.numpy() for g in f_ours(*ts).sum().gradient(*ts)]
    refs = []
    for dt in (torch.float16, torch.float32):
        tt = [torch.tensor(x).to(dt).requires_grad_() for x in xs]
        f_ref(*tt).sum().backward()
        refs.append([t.grad.half() for t in tt])
    return ours, refs[0], refs[1]


def test_erf_and_logaddexp_gradients_are_finite():
    # the gradients were inf/NaN in half (exp(-x^2) and e^(a-b) overflowed): finite wherever PyTorch's are, within one
    # ulp of PyTorch's float32 gradient rounded to half and of its half gradient (which rounds inside its formula)
    x = np.array([-300.0, -3.0, -1.0, 0.0, 0.5, 2.0, 300.0, 6e4], np.float16)
    y = np.array([299.0, 1.0, -1.0, 0.0, 20.0, -6e4, 300.0, 0.25], np.float16)
    for f_ours, f_ref, xs in [
        (Tensor.erf, torch.erf, (x,)),
        (Tensor.logaddexp, torch.logaddexp, (x, y)),
    ]:
        ours, ref16, ref32 = _grad_pair(f_ours, f_ref, *xs)
        for g, r16, r32 in zip(ours, ref16, ref32, strict=True):
            assert np.isfinite(g).all() and torch.isfinite(r16).all(), (f_ref.__name__, g)
            assert ulps(g, r32).max() <= 1, (f_ref.__name__, g, r32)
            assert ulps(g, r16).max() <= 2, (f_ref.__name__, g, r16)


def test_sums_accumulate_in_float():
    # partial sums past 65504 (half's largest) while the mean, and a signed total, are small: an accumulator in half
    # would be inf. Reference: NumPy float64 rounded to half (one ulp: float32 accumulation); PyTorch agrees except
    # for the signed sum, which it gives as NaN (its partial sums overflow half)
    ones = np.full(100_000, 1.5, np.float16)
    signed = np.concatenate([np.full(50_000, 2.0, np.float16), np.full(50_000, -2.0, np.float16)])
    rows = (rng.random((4, 40_000)) * 4).astype(np.float16)
    for x in (ones, signed, rows):
        t = Tensor(x)
        for got, want in ((t.mean(-1), x.astype(np.float64).mean(-1)), (t.sum(-1), x.astype(np.float64).sum(-1))):
            assert ulps(got.numpy(), torch.tensor(want).half()).max() <= 1  # inf where the sum is past 65504
    assert Tensor(signed).sum().item() == 0.0 and Tensor(ones).mean().item() == 1.5
    assert Tensor(ones).sum().item() == float("inf") and Tensor(rows).sum(1).numpy().tolist() == [float("inf")] * 4
    assert ulps(Tensor(rows).mean(1).numpy(), torch.tensor(rows).mean(1)).max() <= 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_primitive_ops_round_each_result(dtype):
    # a * b + c, and a longer chain: PyTorch rounds after every op, and so does uopc; exact
    a, b, c = (rng.standard_normal(4096).astype(np.float32) * s for s in (3, 50, 1000))
    ta, tb, tc = (torch.tensor(v).to(dtype) for v in (a, b, c))
    udt = dtypes.float16 if dtype is torch.float16 else dtypes.bfloat16
    ua, ub, uc = (Tensor(v, dtype=udt) for v in (a, b, c))
    for f in (lambda x, y, z: x * y + z, lambda x, y, z: (x * y + z) * x - y, lambda x, y, z: (x - z).maximum(y * 0.5)):
        np.testing.assert_array_equal(f(ua, ub, uc).numpy(), f(ta, tb, tc).float().numpy())


# ---------------------------------------------------------------- bfloat16 against PyTorch's bfloat16

UNARY = {
    "exp": (Tensor.exp, torch.exp, 1.0),
    "log": (Tensor.log, torch.log, -1.0),  # |x|: positive
    "sqrt": (Tensor.sqrt, torch.sqrt, -1.0),
    "tanh": (Tensor.tanh, torch.tanh, 1.0),
    "sigmoid": (Tensor.sigmoid, torch.sigmoid, 1.0),
    "erf": (Tensor.erf, torch.erf, 1.0),
    "gelu": (Tensor.gelu, F.gelu, 1.0),
    "softplus": (Tensor.softplus, F.softplus, 1.0),
    "asinh": (Tensor.asinh, torch.asinh, 100.0),
    "sin": (Tensor.sin, torch.sin, 1.0),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("name", list(UNARY))
def test_composites_round_once(dtype, name):
    # computed in float32 and rounded once, as PyTorch's kernels: within one ulp of PyTorch in the same dtype
    f_ours, f_ref, scale = UNARY[name]
    x = rng.standard_normal(2048).astype(np.float32) * abs(scale)
    x = np.abs(x) + 1e-3 if scale < 0 else x
    udt = dtypes.float16 if dtype is torch.float16 else dtypes.bfloat16
    got, ref = f_ours(Tensor(x, dtype=udt)), f_ref(torch.tensor(x).to(dtype))
    assert got.dtype is udt
    assert ulps(got.numpy(), ref).max() <= 1, name


def test_bfloat16_reductions_softmax_layernorm_matmul():
    # PyTorch's bfloat16 kernels accumulate in float32 and round once; within one bfloat16 ulp. LayerNorm's outputs
    # near 0 come from x - mean with x ~ 40 (cancellation): there both round a float32 value that differs by a few
    # 1e-6, so they may land 2 ulps apart (seen at 0.0019); those are held to an absolute 2^-9, half an ulp at 1.
    # Its own generator: the module's `rng` gives each test different data depending on what ran before it (xdist).
    g = np.random.default_rng(11)
    x = (g.standard_normal((8, 3000)) + 40).astype(np.float32)
    w = g.standard_normal((3000, 16)).astype(np.float32) * 0.02
    t, tw = Tensor(x, dtype=dtypes.bfloat16), Tensor(w, dtype=dtypes.bfloat16)
    r, rw = torch.tensor(x).bfloat16(), torch.tensor(w).bfloat16()
    cases = [
        (t.sum(1), r.sum(1)),
        (t.mean(1), r.mean(1)),
        (t.softmax(-1), r.softmax(-1)),
        (t.layernorm(), F.layer_norm(r, (3000,))),
        (t @ tw, r @ rw),
    ]
    for k, (got, ref) in enumerate(cases):
        assert got.dtype is dtypes.bfloat16, k
        off = ulps(got.numpy(), ref) > 1
        if k == 3:  # layernorm: see above
            off &= np.abs(got.numpy() - ref.float().numpy()) > 2**-9
        assert not off.any(), k


# ---------------------------------------------------------------- the kernels: no arithmetic on 16-bit floats


_UNIT = "\n/* -- next translation unit -- */\n"


def _plan_sources(*ts: Tensor) -> str:
    """A plan's C: its translation units (a kernel each, then the entry point), joined by _UNIT."""
    plan, _ = make_plan([t.uop for t in ts])
    return _UNIT.join(render_plan([(k.ast, k.name, list(range(len(k.refs)))) for k in plan.kernels]))


def _half_programs() -> dict[str, str]:
    """C sources of float16 kernels: primitive chains, composites, reductions, gradients, selects, vectors."""
    h = [Tensor(rng.standard_normal((16, 300)).astype(np.float16), requires_grad=True) for _ in range(3)]
    a, b, c = h
    x = buf(0, 256, dtypes.float16).reshape((4, 64))
    upcast = lower(x * x + x, buf(1, 256, dtypes.float16), Ctx(opts=Opts(upcast={1: 16}, vec=16)))
    return {
        "chain": _plan_sources(a * b + c, (a - b).maximum(c), (a < b).where(a, c)),
        "composites": _plan_sources(a.layernorm(), a.asinh(), a.erf(), a.logaddexp(b), a.softmax(-1), a.sqrt()),
        "reductions": _plan_sources(a.sum(1), a.max(1), a.mean(0), a @ b.T),
        "gradients": _plan_sources(*(a.erf() * b + a.sin()).sum().gradient(a, b)),
        "casts": _plan_sources(a.float().half() * 2, a.int().half(), a.double().half()),
        "upcast": render_c(upcast, "k"),
    }


def test_no_alu_computes_in_16_bits():
    # after the rewrite, a 16-bit float is only loaded, stored, selected and converted: no other ALU op has one as
    # its dtype or operand
    h = buf(0, 64, dtypes.float16).reshape((4, 16))
    bf = buf(1, 64, dtypes.bfloat16).reshape((4, 16))
    graphs = [
        h * h + h,
        (h < 1.0).where(h, h.alu(Ops.SQRT)),
        bf * bf + 1.0,
        (bf + h.cast(dtypes.bfloat16)).reduce(Ops.MAX, 1),
    ]
    asts = [lower(g, buf(2, g.size, g.dtype), Ctx(opts=o)) for g in graphs for o in (Opts(), Opts(upcast={1: 16}))]
    for ast in [compute_in_float(a) for a in asts]:
        for u in ast.toposort():
            if u.op is Ops.WHERE:
                assert not u.src[0].dtype.is_16bit_float, u
            elif u.op in ALU and u.op is not Ops.CAST:
                assert not any(v.dtype.is_16bit_float for v in (u, *u.src)), u
            if u.op is Ops.CAST and (u.dtype.is_16bit_float or u.src[0].dtype.is_16bit_float):
                assert dtypes.float32 in (u.dtype.scalar(), u.src[0].dtype.scalar()), u


def test_float32_kernels_are_untouched():
    # no 16-bit float in the kernel: the rewrite returns the same AST, so its C (and the compile cache) is as before
    x = buf(0, 64).reshape((4, 16))
    for g in (x * x + 1.0, x.reduce(Ops.ADD, 1), x.cast(dtypes.float64).alu(Ops.EXP2)):
        ast = lower(g, buf(1, g.size, g.dtype))
        assert compute_in_float(ast) is ast


# AVX512-FP16 arithmetic: packed (ph) and scalar (sh) adds, multiplies, FMAs, min/max, compares, ...; conversions
# (vcvtph2ps, vcvtps2ph, vcvtsh2ss, ...) and moves are fine
_HALF_MATH = re.compile(r"^\s*(v(?:add|sub|mul|div|sqrt|max|min|rcp|rsqrt|cmp|scalef|rndscale|reduce|getexp|getmant|"
                        r"fpclass|f(?:n)?m(?:add|sub|addsub|subadd)\d*)[ps]h)\b", re.M)  # fmt: skip


def _asm_for(src: str, march: str | None) -> str:
    """gcc -S of each translation unit of `src` with uopc's flags, or with them retargeted to `march`."""
    flags = runtime.cflags()
    if march is not None:
        flags = [f for f in flags if not f.startswith(("-march", "-mtune", "-mno-avx512fp16"))] + [f"-march={march}"]
    cmd = [runtime._resolve_compiler(), *flags, "-S", "-x", "c", "-", "-o", "-"]
    out = []
    for unit in src.split(_UNIT):
        p = subprocess.run(cmd, input=unit, capture_output=True, text=True)
        if p.returncode and "march" in p.stderr:
            pytest.skip(f"the compiler does not know -march={march}: {p.stderr.strip()[:200]}")
        assert p.returncode == 0, p.stderr
        out.append(p.stdout)
    return "\n".join(out)


@pytest.mark.parametrize("name", ["chain", "composites", "reductions", "gradients", "casts", "upcast"])
def test_no_half_arithmetic_on_sapphire_rapids(name):
    # compiled for a CPU with AVX512-FP16 (-S: nothing is assembled or run, so any host can check it), float16 code
    # computes in float32 only: its results cannot depend on the CPU. The C has no _Float16 to narrow (uopc_f16_ld/st
    # convert the bits with integer operations)
    src = _half_programs()[name]
    assert "_Float16" not in src and "uopc_f16_ld(" in src
    s = _asm_for(src, "sapphirerapids")
    bad = sorted(set(_HALF_MATH.findall(s)))
    assert not bad, f"{name}: half-precision arithmetic {bad}"
    assert re.search(r"v(?:mul|add|sub|fmadd\d+)[ps]s\t", s), f"{name}: no float math at all: not the code meant"


def test_half_kernels_vectorize():
    # the integer conversions vectorize: packed float math on the registers the Machine record says auto-vectorized
    # loops use (zmm, ymm or xmm), for a plain loop and for an upcast one (whose lanes uopc leaves scalar), no calls
    reg = runtime.machine().register
    srcs = _half_programs()
    for name in ("chain", "upcast"):
        s = _asm_for(srcs[name], None)  # what uopc compiles it with (CFLAGS decides the target)
        assert re.search(rf"v(?:mul|add|fmadd\d+)ps\t.*%{reg}", s), f"{name}: no packed float math on {reg}"
        assert re.search(rf"vps[rl]ld\t.*%{reg}", s), f"{name}: no packed conversion shifts on {reg}"
        calls = {c for c in re.findall(r"call\t(\S+)", s) if not re.fullmatch(r"[ers]_\w+_[0-9a-f]{16}", c)}
        assert calls <= {"clock_gettime@PLT"}, (name, calls)  # and the plan's timer: no libm call


def test_float16_conversions_are_exact():
    # every half to float, and floats to half with round to nearest even (each half, each midpoint between neighbours
    # and one float ulp either side of it, overflow and subnormal edges, random bit patterns), through uopc's kernels.
    # Reference: NumPy's conversions; a NaN must stay a NaN of the same sign
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    fin = halves[np.isfinite(halves)].astype(np.float32)
    fin = np.unique(fin)
    mid = ((fin[1:].astype(np.float64) + fin[:-1]) / 2).astype(np.float32)
    edges = np.array(
        [65504, 65519.996, 65520, 65536, 1e30, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-14, 1e-30], np.float32
    )
    rand = np.random.default_rng(0).integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    floats = np.concatenate([fin, mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf), edges, -edges, rand])
    with np.errstate(over="ignore"):  # past 65520 NumPy's half is inf, as it must be
        ref16 = floats.astype(np.float16)
    for src, got, ref in [
        (halves, Tensor(halves).float().numpy(), halves.astype(np.float32)),
        (floats, Tensor(floats).half().numpy(), ref16),
    ]:
        nan = np.isnan(ref)
        assert (np.isnan(got) == nan).all() and (np.signbit(got) == np.signbit(ref)).all(), src[np.isnan(got) != nan]
        bits = got[~nan].view(np.uint32 if got.dtype == np.float32 else np.uint16)
        want = ref[~nan].view(bits.dtype)
        assert (bits == want).all(), (src[~nan][bits != want][:5], got[~nan][bits != want][:5])


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["f16", "bf16"])
def test_16bit_kernel_c(dtype):
    # one mechanism for both 16-bit floats: the buffer is unsigned short bits, converted by two helpers each way
    tag = "f16" if dtype is dtypes.float16 else "bf16"
    src = render_c(lower(buf(0, 8, dtype) * 3.0 + 1.0, buf(1, 8, dtype)), "k")
    assert "unsigned short* restrict data0" in src and f"uopc_{tag}_ld(" in src and f"uopc_{tag}_st(" in src
    assert "_Float16" not in src


# ---------------------------------------------------------------- bfloat16 weights widened in the matmul


@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_bfloat16_vector_widens_in_one_zero_extend(lanes):
    """A vector of bfloat16 lanes loaded from memory widens to float32 as one zero-extending load and one shift
    (vpmovzxwd, vpslld) where the target has vectors that wide: gcc 12 split __builtin_convertvector's 16 lanes into
    two halves joined again (vpmovzxwd twice, vextracti128, vinserti64x4: 6 instructions per vector), and a bf16
    matrix-vector product (a decode step's) ran at 28-34 GB/s against 36-57 for float32. Compiled with this
    machine's flags (-S: nothing runs)."""
    if runtime.machine().vector_bytes < 4 * lanes or not {"avx2", "avx512f"} & runtime.machine().isa:
        pytest.skip(f"no {lanes} x 32-bit vectors with a zero-extending load on this target")
    fn, code, _ = c_conversion(dtypes.float32.vec(lanes), dtypes.bfloat16.vec(lanes))
    bits, floats = dtypes.bfloat16.vec(lanes).cname, dtypes.float32.vec(lanes).cname
    src = (
        f"typedef unsigned short {bits} __attribute__((vector_size({2 * lanes}), aligned(2)));\n"
        f"typedef float {floats} __attribute__((vector_size({4 * lanes})));\n{code}"
        f"{floats} widen(const {bits}* p) {{ return {fn}(*p); }}\n"
    )
    cmd = [runtime._resolve_compiler(), *runtime.cflags(), "-S", "-x", "c", "-", "-o", "-"]
    p = subprocess.run(cmd, input=src, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    body = p.stdout[p.stdout.index("widen:") :]
    body = body[: body.index("ret")]
    ops = [ln.split()[0] for ln in body.splitlines() if ln.strip() and not ln.strip().startswith((".", "widen:"))]
    assert ops.count("vpmovzxwd") == 1 and not any(op.startswith(("vextract", "vinsert", "vperm")) for op in ops), ops


@pytest.mark.parametrize("m,k,n", [(1, 768, 3072), (5, 256, 1000), (64, 384, 2304), (3, 96, 40)])
def test_bfloat16_weight_widened_in_the_matmul(m, k, n):
    """x (float32) @ W.cast(float32) with W stored in bfloat16 (a GPT-2 weight from_pretrained(dtype=bfloat16)):
    the float32 product of x with W's bfloat16 values, accumulated in float32 (rtol 1e-5 of the row's scale). Where
    the microkernel takes it, W's panels are packed in bfloat16 and each vector of them is widened in registers
    (render_c's uopc_bf16xN_ld), not converted lane by lane."""
    from uopc.engine import realize

    rng = np.random.default_rng(m + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = Tensor(rng.standard_normal((k, n)).astype(np.float32)).cast(dtypes.bfloat16).realize()
    wf = w.cast(dtypes.float32).numpy()
    before = set(realize._plans)
    got = (Tensor(x) @ w.cast(dtypes.float32)).numpy()
    ref = x.astype(np.float64) @ wf.astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(x).sum(1, keepdims=True).max() * np.abs(wf).max())
    srcs = "".join(cp.src for key, cp in realize._plans.items() if key not in before)
    width = runtime.machine().vector_bytes // 4
    # the microkernel's case (uopc.opt.gemm.uses_microkernel), with the hand heuristic's Opts (OPT=1)
    if helpers.settings().OPT == 1 and m * n * k >= 1 << 16 and n >= width:
        assert f"uopc_bf16x{width}_ld" in srcs


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["f16", "bf16"])
def test_a_select_of_16bit_values_keeps_their_bits(dtype):
    """where(mask, a, b) on 16-bit floats selects stored patterns and computes nothing: a signalling NaN's payload
    and -0.0 pass as they are (through float32 the NaN came back quieted), as torch.where keeps them, and a KV cache's
    in-place write keeps the form whose store is skipped where the mask is false."""
    g = np.random.default_rng(0)
    a = g.integers(0, 1 << 16, 256).astype(np.uint16)
    b = g.integers(0, 1 << 16, 256).astype(np.uint16)
    a[:4] = [0x7F81, 0x7C01, 0x8000, 0xFF81]  # signalling NaNs (bf16, f16), -0.0, a negative signalling NaN
    mask = np.arange(256) % 3 != 1
    got = Tensor(mask).where(Tensor(a).bitcast(dtype), Tensor(b).bitcast(dtype))._bits().view(np.uint16)
    np.testing.assert_array_equal(got, np.where(mask, a, b))
    src = render_c(lower(buf(0, 8, dtypes.bool).where(buf(1, 8, dtype), buf(2, 8, dtype)), buf(3, 8, dtype)), "k")
    assert "_ld(" not in src and "_st(" not in src

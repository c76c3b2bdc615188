"""Failing loudly: the bounds-checking mode, the IEEE guard in the prelude, threads. Reference: NumPy, exact."""

from __future__ import annotations

import re

import numpy as np
import pytest

import uopc
from uopc.codegen.rangeify import Ctx
from uopc.renderer.c import render_c
from uopc.runtime import compiler as runtime
from uopc.runtime.compiler import CompileError, Program
from uopc.tensor import Tensor
from uopc.uop import Ops, ParamArg, UOp, sink
from uopc.uop.dtype import dtypes


def _broken_kernel() -> str:
    # out[i] = a[i + 1] for i < 8: the last iteration reads one element past the end of `a`
    ctx = Ctx()
    r = ctx.rng(8)
    a = UOp(Ops.BUFFER, (), ParamArg(0, dtypes.f32, (8,)))
    out = UOp(Ops.BUFFER, (), ParamArg(1, dtypes.f32, (8,)))
    return render_c(sink(out.index(r).store(a.index(r + 1).load()).end(r)), "broken")


def test_oob_mode_catches_a_broken_index(context, monkeypatch):
    context(CHECK_OOB=1)
    src = _broken_kernel()
    with pytest.raises(IndexError, match=r"kernel broken: data0\[8\], but data0 has 8 elements"):
        Program(src, "broken")(np.zeros(8, np.float32), np.zeros(8, np.float32))


def test_oob_mode_passes_correct_kernels(context, monkeypatch):
    context(CHECK_OOB=1)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(x).pad(((1, 1), (2, 0))).flip(1)[:, ::2].sum(0)  # gated pad reads stay unchecked when invalid
    np.testing.assert_array_equal(t.numpy(), np.pad(x, ((1, 1), (2, 0)))[:, ::-1][:, ::2].sum(0))


def test_prelude_refuses_finite_math(context):
    # -ffast-math implies -ffinite-math-only, under which gcc may drop NaN/inf handling: the prelude refuses
    context(CFLAGS=[*runtime.base_cflags(), "-ffast-math"])
    src = render_c(_oob_free_kernel(), "k")
    with pytest.raises(CompileError, match="IEEE inf and NaN"):
        Program(src, "k")


def _oob_free_kernel() -> UOp:
    ctx = Ctx()
    r = ctx.rng(4)
    a = UOp(Ops.BUFFER, (), ParamArg(0, dtypes.f32, (4,)))
    return sink(UOp(Ops.BUFFER, (), ParamArg(1, dtypes.f32, (4,))).index(r).store(a.index(r).load() * 2.0).end(r))


def test_set_num_threads_public_and_deterministic():
    x = np.random.default_rng(0).standard_normal((512, 300)).astype(np.float32)
    old = uopc.get_num_threads()
    try:
        results = []
        for n in (1, 2, 2):
            uopc.set_num_threads(n)
            results.append(Tensor(x).softmax(-1).sum(0).numpy())
        assert results[1].tobytes() == results[2].tobytes()  # bitwise identical at a fixed thread count
        np.testing.assert_allclose(results[0], results[1], rtol=1e-5)
    finally:
        uopc.set_num_threads(old)
    with pytest.raises(ValueError):
        uopc.set_num_threads(0)


def _plan_c() -> str:
    from uopc.engine import realize

    return next(reversed(realize._plans.values())).src


@pytest.mark.parametrize("check_oob", [0, 1])
def test_padded_reads_stay_unclamped_within_the_storage_guard(context, check_oob):
    """uopc's storage has helpers.STORAGE_GUARD bytes of its own allocation on each side, so a plan's kernel reads a
    padded input at an index that strays a row outside the buffer without clamping it (the value is not used):
    values at both ends of the buffer stay exact. A pad that reaches past the guard is clamped, and so is every pad
    under UOPC_CHECK_OOB (whose check must see the index in range)."""
    from uopc import helpers
    from uopc.runtime.buffer import aligned_empty, buffer_from, has_guard

    context(CHECK_OOB=check_oob, OPT=0)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    got = (Tensor(x).pad(((0, 0), (0, 0), (1, 2), (2, 1))) * 2).numpy()
    np.testing.assert_array_equal(got, np.pad(x, ((0, 0), (0, 0), (1, 2), (2, 1))) * 2)
    clamped = "<0?0:" in _plan_c()
    assert clamped == bool(check_oob), _plan_c()
    wide = helpers.STORAGE_GUARD // 4 + 5  # a row longer than the guard: a row of padding reaches past it
    y = rng.standard_normal((3, wide)).astype(np.float32)
    got = (Tensor(y).pad(((1, 1), (0, 0))) + 1).numpy()
    np.testing.assert_array_equal(got, np.pad(y, ((1, 1), (0, 0))) + 1)
    assert "<0?0:" in _plan_c()
    # rows of padding past the guard, each row's reads within it (a stride-2 copy, ResNet's stem): the row part of the
    # index is clamped, not the part the innermost loop changes, so the row's loads stay affine (and vectorize)
    past = helpers.STORAGE_GUARD // 4 // 300 + 2
    z = rng.standard_normal((4, 300)).astype(np.float32)
    got = (Tensor(z).pad(((past, past), (0, 0)))[:, 1::2] + 1).numpy()
    np.testing.assert_array_equal(got, np.pad(z, ((past, past), (0, 0)))[:, 1::2] + 1)
    src = _plan_c()
    inner = re.findall(r"for \(int (ridx\d+)", src)[-1]
    (load,) = [line for line in src.splitlines() if "= data0[" in line]
    if check_oob:
        assert "<0?0:" in load, load
    else:
        assert "?" in load and load.endswith(f"+({inner}*2))];") and inner not in load.split("?")[0], load
    # storage handed to a kernel without a copy must have the guard too
    assert has_guard(aligned_empty(10, dtypes.float32))
    raw = np.empty(1024, np.uint8)  # aligned, but without the guard
    off = (-raw.ctypes.data) % 64
    with pytest.raises(ValueError, match="aligned_empty"):
        buffer_from(raw[off : off + 64].view(np.float32), dtypes.float32)

"""Failing loudly: the bounds-checking mode, the IEEE guard in the prelude, threads. Reference: NumPy, exact."""

from __future__ import annotations

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

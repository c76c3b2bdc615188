"""gcc -S checks: kernels that used to be scalar (libm calls, every `?:` select, max reductions) now use packed
vector instructions on the registers the Machine record says auto-vectorized loops use (zmm, ymm or xmm: what the
compiler targets with CFLAGS, after uopc's vector-width rule), and call nothing."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from tests.helpers import buf, render_graph, run, targets
from uopc.renderer.flags import unit_cflags
from uopc.runtime import compiler as runtime
from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes

REG = runtime.machine().register


def asm(graph: UOp, n_inputs: int = 1) -> str:
    """The assembly gcc makes of `graph` (`n_inputs` inputs) under the default flags, and its unit's own (as a plan
    compiles it: renderer.flags)."""
    src = render_graph(graph, n_inputs, name="k")
    cmd = [runtime._resolve_compiler(), *runtime.cflags(), *unit_cflags(src), "-S", "-x", "c", "-", "-o", "-"]
    return subprocess.run(cmd, input=src, capture_output=True, text=True, check=True).stdout


def packed(s: str) -> list[str]:
    return [ln for ln in s.splitlines() if f"%{REG}" in ln and ("ps\t" in ln or "pd\t" in ln)]


X = buf(0, 4096)
GRAPHS = {
    "sqrt": X.alu(Ops.SQRT),
    "exp2": X.alu(Ops.EXP2),
    "log2": X.alu(Ops.LOG2),
    "sin": X.alu(Ops.SIN),
    "relu": ((X * 2.0 + 1.0).maximum(0.0)) * 3.0,
    "max_rows": X.reshape((16, 256)).reduce(Ops.MAX, 1),
}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_packed_and_no_calls(name: str):
    if name == "sin" and not targets("avx512dq"):  # its int64 -> double conversion has no AVX2 form: scalar there
        pytest.skip("sin vectorizes with AVX-512DQ only")
    s = asm(GRAPHS[name])
    assert packed(s), f"{name}: no packed {REG} instructions\n{s}"
    assert "call" not in s, f"{name}: calls a function\n{s}"
    if name == "sqrt":
        assert "vsqrtps" in s, s


def test_max_reduction_lanes_propagate_nan():
    # 64 lanes, then a tree: NaN anywhere, -inf rows, sizes that split into lanes and ones that do not.
    # reference: NumPy's max (NaN-propagating); exact
    rng = np.random.default_rng(3)
    for rows, cols in [(5, 128), (3, 96), (2, 40), (4, 1024), (3, 192)]:
        a = rng.standard_normal((rows, cols)).astype(np.float32)
        a[1, cols - 1] = np.nan
        a[-1] = -np.inf
        got = run(buf(0, rows * cols).reshape((rows, cols)).reduce(Ops.MAX, 1), [a.reshape(-1)])
        np.testing.assert_array_equal(got, a.max(1))


def test_a_max_over_small_windows_does_not_branch_on_order():
    # a max over a few values per output (a pooling window: 9 here) with scalar accumulators is a maxss, not a
    # compare-and-jump on which value is larger (random data mispredicts it); only the NaN test (almost never
    # taken) may jump, and NaN still wins from either side. Reference: NumPy, exact
    rows = 455
    graph = buf(0, rows * 9).reshape((rows, 9)).reduce(Ops.MAX, 1)
    s = asm(graph)
    jumps = {ln.split()[0] for ln in s.splitlines() if ln.strip().startswith("j")}
    assert ("maxss" in s or "maxps" in s) and not jumps & {"ja", "jae", "jb", "jbe", "jg", "jl"}, s
    a = np.random.default_rng(4).standard_normal((rows, 9)).astype(np.float32)
    a[3, 0], a[7, 8], a[11] = np.nan, np.nan, -np.inf
    np.testing.assert_array_equal(run(graph, [a.reshape(-1)]), a.max(1))


def test_a_select_on_a_stored_mask_is_packed():
    # where(mask, x, 0) with the mask read from a bool buffer (ReLU's backward, a max-pool's routing): an elementwise
    # kernel's bool buffers are unsigned char in C, which gcc vectorizes (a `_Bool*` load kept the loop scalar).
    # Reference: np.where, exact
    n = 4096
    graph = buf(0, n, dtypes.bool).where(buf(1, n), UOp.const(0.0, dtypes.float32))
    s = asm(graph, 2)
    assert packed(s), s
    rng = np.random.default_rng(8)
    m, x = rng.random(n) < 0.5, rng.standard_normal(n).astype(np.float32)
    np.testing.assert_array_equal(run(graph, [m, x]), np.where(m, x, np.float32(0)))

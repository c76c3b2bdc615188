"""64-bit indexing: a kernel whose buffers or views reach 2^31 elements computes its indices in 64-bit.

Regression: every kernel used 32-bit `int` indices, so `Tensor(a).max()` on an int8 array of 2^31+64 elements gave
-128 (the wrapped loop never ran) and `Tensor(a)[-1]` read far outside the buffer (a segmentation fault).
Reference: the exact values NumPy holds.
"""

from __future__ import annotations

import numpy as np
import pytest

from uopc import Tensor, dtypes
from uopc.codegen.rangeify import lower
from uopc.renderer.c import render_c
from uopc.uop import Ops, ParamArg, UOp

BIG = 2**31 + 64


def _render(root: UOp, out_size: int) -> str:
    return render_c(lower(root, UOp(Ops.BUFFER, (), ParamArg(1, root.dtype, (out_size,)))), "k")


def test_big_kernels_use_64bit_indices_and_small_ones_keep_32bit():
    big = UOp(Ops.BUFFER, (), ParamArg(0, dtypes.int8, (BIG,)))
    src = _render(big.reduce(Ops.MAX, 1), 1)
    assert "for (long long ridx" in src and "for (int ridx" not in src
    tail = _render(big.shrink(((BIG - 5, BIG),)), 5)  # the offset 2^31+59 must survive as a 64-bit constant
    assert f"{BIG - 5}LL" in tail, tail
    small = UOp(Ops.BUFFER, (), ParamArg(0, dtypes.int8, (1000,)))
    assert "for (int ridx" in _render(small.reduce(Ops.MAX, 1), 1)


def _mem_available_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


@pytest.mark.skipif(_mem_available_gib() < 8, reason="needs ~6 GiB free: a 2 GiB array, uopc's copy and a result")
def test_int8_tensor_past_2_31_elements():
    a = np.zeros(BIG, np.int8)
    a[-1] = 7
    a[2**31 + 3] = -9
    t = Tensor(a)
    del a  # uopc holds its own copy
    assert t.max().item() == 7
    assert t.min().item() == -9
    assert t[-1].item() == 7
    assert t.shrink(((BIG - 64, BIG),)).numpy().tolist() == [0, 0, 0, -9] + [0] * 59 + [7]

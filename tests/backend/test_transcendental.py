"""float32 exp2/log2/sin are uopc's own vectorizable code: ulp sweeps against float64 NumPy (gcc -S: test_vectorize.py).

The sweep: every float32 bit pattern class (random bits over the whole range, a dense grid where the result is
finite and not trivially 0, and the special values), compiled through uopc, compared with NumPy's float64 result
rounded to float32; the largest distance in units in the last place must be <= 2.
"""

from __future__ import annotations

import numpy as np
import pytest

from uopc import Tensor

SPECIAL = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, 0.5, 1e-45, -1e-45, 1.17549435e-38, 1.1754942e-38,
     3.4028235e38, -3.4028235e38, 127.99999, 128.0, 128.00002, -126.0, -149.0, -149.5, -150.0, -150.00002, -151.0,
     0.99999994, 1.0000001, 0.49999997, 0.5, 3.1415927, 1.5707964, 16777216.0, 268435456.0, 105414350.0,
     1.0e22, 8.6e37],
    np.float32,
)  # fmt: skip


def _ordered(a: np.ndarray) -> np.ndarray:
    """float32 bit patterns mapped to integers that count ulps across zero (+0 and -0 both map to 0)."""
    i = a.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Distance in ulps; 0 where both are NaN, huge where exactly one is."""
    d = np.abs(_ordered(got) - _ordered(ref))
    gn, rn = np.isnan(got), np.isnan(ref)
    return np.where(gn & rn, 0, np.where(gn | rn, 1 << 40, d))


def _points(lo: float, hi: float, n: int = 2_000_000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)  # every exponent
    return np.concatenate([bits, np.linspace(lo, hi, n, dtype=np.float32), SPECIAL])


CASES = {
    "exp2": (lambda t: t.exp2(), np.exp2, (-151.0, 129.0)),
    "log2": (lambda t: t.log2(), np.log2, (0.0, 4.0)),
    "sin": (lambda t: t.sin(), np.sin, (-20.0, 20.0)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_ulp_sweep(name: str):
    # reference: NumPy float64 rounded to float32; <= 2 ulp everywhere, NaN exactly where NumPy has NaN
    fn, ref_fn, (lo, hi) = CASES[name]
    x = _points(lo, hi)
    with np.errstate(all="ignore"):
        ref = ref_fn(x.astype(np.float64)).astype(np.float32)
    got = fn(Tensor(x)).numpy()
    err = ulp_error(got, ref)
    worst = int(np.argmax(err))
    print(f"{name}: {x.size} points, max {err.max()} ulp at x={x[worst]!r} (got {got[worst]!r}, want {ref[worst]!r})")
    assert err.max() <= 2, f"{name}({x[worst]!r}) = {got[worst]!r}, want {ref[worst]!r}: {err.max()} ulp"


def test_float16_computes_in_float32():
    # reference: NumPy float64 rounded to float16; <= 1 float16 ulp (the float32 result rounds once more)
    x = np.linspace(-20, 15, 5001, dtype=np.float16)
    got = Tensor(x).exp2().numpy()
    ref = np.exp2(x.astype(np.float64)).astype(np.float16)
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=2**-10)

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


# ---------------------------------------------------------------- a multiply after exp2 in the same kernel
# Each op's result is its own correctly rounded value (<= 1 ulp), so exp2(200) * 0.25 is inf * 0.25 = inf and
# exp2(-200) * 2^60 is 0 * 2^60 = 0. gcc's -fassociative-math once regrouped the multiply into exp2's last step,
# 2^n = 2^n1 * 2^n2: p * 2^n1 * (2^n2 * 0.25) is back in range, 1.7e38 instead of inf.

F32_LOG2E = np.float32(1 / np.log(2))  # exp(x) is exp2(x * log2(e)) with the constant in float32


def exp2_ref(t: np.ndarray) -> np.ndarray:
    """2^t in float64 rounded to float32."""
    with np.errstate(all="ignore"):
        return np.exp2(t.astype(np.float64)).astype(np.float32)


def exp_ref(x: np.ndarray) -> np.ndarray:
    """e^x as uopc's ops compute it: the float32 product x * log2(e), then exp2 of that."""
    with np.errstate(all="ignore"):
        return exp2_ref(x * F32_LOG2E)


def allowed(ref: np.ndarray, c: float) -> np.ndarray:
    """float32(e * c) for e the reference and its float32 neighbours (the 1 ulp an op may be off); inf and 0,
    an overflow or underflow, have no neighbours: (3, n)."""
    up, down = np.nextafter(ref, np.float32(np.inf)), np.nextafter(ref, np.float32(-np.inf))
    edge = np.isinf(ref) | (ref == 0)
    with np.errstate(all="ignore"):
        return np.stack([np.where(edge, ref, e) * np.float32(c) for e in (down, ref, up)])


def check_after(name: str, got: np.ndarray, ref: np.ndarray, x: np.ndarray, c: float):
    ok = (got[None] == allowed(ref, c)).any(0)
    bad = np.flatnonzero(~ok)[:8]
    assert ok.all(), f"{name}(x) * {c!r} at x={x[bad]}: got {got[bad]}, want {ref[bad] * np.float32(c)}"


# (x, c): overflow and its finite neighbours with a scale down; underflow, subnormal results and their neighbours
# with a scale up
EXP2_AFTER = [
    ([200.0, 1e30, np.inf, 129.0, 128.5, 128.0, 127.99999, 127.9, 127.0, 126.5, 0.3], 0.25),
    ([200.0, 128.0, 127.99999, 127.9, 100.0], 2.0**-60),
    ([-149.0, -149.3, -149.5, -150.0, -150.00002, -150.5, -151.0, -200.0, -np.inf, -126.5, -127.3], 4.0),
    ([-200.0, -160.0, -150.5, -149.3, -149.0, -140.7, -127.3], 2.0**60),
]
EXP_AFTER = [
    ([200.0, 89.0, 88.8, 88.73, 88.72, 88.7, 88.0, 1.0], 0.25),
    ([-200.0, -110.0, -104.0, -103.9, -103.5, -103.3, -100.0, -95.0, -87.5], 2.0**60),
    ([-103.9, -103.5, -103.3, -103.0], 4.0),
]
# below x = -20 sigmoid(x) = z / (1 + z) and softplus(x) = z (1 - z/2 + z^2/3) are z = e^x exactly in float32
# (1 + z rounds to 1); above x = 20 sigmoid is 1 and softplus is x
TAIL_X = [-200.0, -110.0, -104.0, -103.9, -103.5, -100.0, -95.0, -89.0, -87.5, -30.0]
HEAD_X = [20.0, 30.0, 89.0, 100.0, 200.0, 1e30]


@pytest.mark.parametrize("reps", [1, 64])  # the scalar loop, and 16-lane vectors
@pytest.mark.parametrize("case", range(len(EXP2_AFTER)))
def test_exp2_then_multiply_keeps_overflow_and_underflow(case: int, reps: int):
    # regression: exp2(200) * 0.25 was 1.7e38 (the multiply regrouped into exp2's 2^n scaling); reference: exp2 in
    # float64 rounded to float32 (<= 1 ulp, exact inf and 0), then the float32 multiply
    xs, c = EXP2_AFTER[case]
    x = np.tile(np.array(xs, np.float32), reps)
    got = (Tensor(x).exp2() * c).numpy()
    check_after("exp2", got, exp2_ref(x), x, c)


def test_exp2_times_quarter_at_200_is_inf():
    # regression, the example; reference: exp2(200) overflows, inf * 0.25 is inf
    got = (Tensor([[200.0], [0.3]]).exp2() * 0.25).numpy()
    assert np.isinf(got[0, 0]) and got[0, 0] > 0, got
    assert got[1, 0] == np.float32(np.exp2(0.3)) * np.float32(0.25), got


@pytest.mark.parametrize("reps", [1, 64])
@pytest.mark.parametrize("case", range(len(EXP_AFTER)))
def test_exp_then_multiply_keeps_overflow_and_underflow(case: int, reps: int):
    # reference: exp2 of the float32 x * log2(e), in float64 rounded to float32 (<= 1 ulp), then the multiply
    xs, c = EXP_AFTER[case]
    x = np.tile(np.array(xs, np.float32), reps)
    got = (Tensor(x).exp() * c).numpy()
    check_after("exp", got, exp_ref(x), x, c)


@pytest.mark.parametrize("reps", [1, 64])
@pytest.mark.parametrize("c", [2.0**60, 2.0**100, 0.25])
def test_sigmoid_then_multiply_keeps_underflow(c: float, reps: int):
    # reference: e^x as in exp_ref below x = -20, 1 above 20; then the float32 multiply
    x = np.tile(np.array(TAIL_X + HEAD_X, np.float32), reps)
    ref = np.where(x < 0, exp_ref(x), np.float32(1))
    got = (Tensor(x).sigmoid() * c).numpy()
    check_after("sigmoid", got, ref, x, c)


@pytest.mark.parametrize("reps", [1, 64])
@pytest.mark.parametrize("c", [2.0**60, 2.0**100, 0.25, 2.0**-60])
def test_softplus_then_multiply_keeps_underflow(c: float, reps: int):
    # reference: e^x as in exp_ref below x = -20, x itself above 20; then the float32 multiply
    x = np.tile(np.array(TAIL_X + HEAD_X, np.float32), reps)
    ref = np.where(x < 0, exp_ref(x), x)
    got = (Tensor(x).softplus() * c).numpy()
    check_after("softplus", got, ref, x, c)

"""More elementwise math for Tensor, built from the IR's ALU ops: inverse trig and hyperbolic functions, erf, the
activation functions PyTorch and tinygrad users reach for, rounding, NaN/inf tests, shifts and bitwise names.

    atan(x):  |x| > 1 -> sign(x) pi/2 - atan(1/x);  then two halvings atan(t) = 2 atan(t / (1 + sqrt(1 + t^2)))
              bring t below 0.2, where eight terms of the Taylor series are exact to float64's last bits
    erf(x):   Abramowitz-Stegun 7.1.26 (|error| <= 1.5e-7), odd in x
"""

from __future__ import annotations

import math
from typing import Any, Self

from uopc.tensor.autodiff import with_gradient
from uopc.tensor.elementwise import opmath
from uopc.tensor.shape import Axis, is_int
from uopc.uop.dtype import dtypes

_ERF = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_SELU_ALPHA = 1.6732632423543772
_SELU_SCALE = 1.0507009873554805
_UNSIGNED = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}
_HUGE = 1e9  # above this, sqrt(x^2 ± 1) is |x| to float64's precision (and x^2 may overflow float32)


def _abs_slope1(x: Any) -> Any:
    """|x| whose gradient at 0 is +1, not abs's 0: an odd function built as sign(x) f(|x|) then keeps its slope
    f'(0) at 0 (asinh'(0) = 1, erf'(0) = 2/sqrt(pi)), as PyTorch's gradients do."""
    return (x < 0).where(-x, x)


class MathMixin:
    """Extra elementwise functions of Tensor (see the module docstring for how the transcendental ones work)."""

    # ---------------------------------------------------------------- tests for special values

    def isnan(self) -> Self:
        """True where x is NaN (never for ints)."""
        return self != self if self.dtype.is_float else self.full_like(False, dtypes.bool)

    def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Self:
        """True where x is +inf (if detect_positive) or -inf (if detect_negative)."""
        if not self.dtype.is_float:
            return self.full_like(False, dtypes.bool)
        out = self.full_like(False, dtypes.bool)
        if detect_positive:
            out = out | (self == math.inf)
        if detect_negative:
            out = out | (self == -math.inf)
        return out

    def isfinite(self) -> Self:
        """True where x is neither NaN nor infinite."""
        return self.abs() < math.inf if self.dtype.is_float else self.full_like(True, dtypes.bool)

    def is_floating_point(self) -> bool:
        """Whether the dtype is a float type."""
        return self.dtype.is_float

    def element_size(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    def nbytes(self) -> int:
        """Bytes of all elements."""
        return self.numel() * self.dtype.itemsize

    def short(self) -> Self:
        """Cast to int16."""
        return self.cast(dtypes.int16)

    # ---------------------------------------------------------------- logic, rounding, comparisons by name

    def any(self, axis: Axis = None, keepdim: bool = False) -> Self:
        """True where any element over `axis` is nonzero (a MAX of bools)."""
        return self.cast(dtypes.bool).max(axis, keepdim)

    def all(self, axis: Axis = None, keepdim: bool = False) -> Self:
        """True where every element over `axis` is nonzero."""
        return self.logical_not().any(axis, keepdim).logical_not()

    def eq(self, x: Any) -> Self:
        """Elementwise ==."""
        return self == x

    def ne(self, x: Any) -> Self:
        """Elementwise !=."""
        return self != x

    def isclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Self:
        """|a - b| <= atol + rtol |b| elementwise (infinities equal only to themselves)."""
        a, b = self._operands(other)
        d = (a - b).abs()
        close = (a == b) | (d.isfinite() & (d <= atol + rtol * b.abs()))  # inf - inf or x - inf: only a == b
        return close | (a.isnan() & b.isnan()) if equal_nan else close

    def allclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
        """Whether isclose holds everywhere (realizes)."""
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    def round(self) -> Self:
        """Round half to even, as PyTorch and NumPy (identity for ints)."""
        if not self.dtype.is_float:
            return self
        f = self.floor()
        diff = self - f
        even = (f * 0.5).floor() * 2 == f
        return (diff > 0.5).where(f + 1, (diff < 0.5).where(f, even.where(f, f + 1)))

    @opmath
    def lerp(self, end: Any, weight: Any) -> Self:
        """self + (end - self) * weight."""
        return self + (end - self) * weight

    @opmath
    def fmod(self, x: Any) -> Self:
        """C's remainder: the sign of the dividend (PyTorch's fmod; % follows the divisor)."""
        a, b = self._operands(x)
        if a.dtype.is_float:
            # a finite dividend over an infinite divisor is itself (a/b*b would be 0*inf = NaN), as C's fmod gives
            return ((b.abs() == math.inf) & (a.abs() < math.inf)).where(a, a - (a / b).trunc() * b)
        r = a % b
        return ((r != 0) & ((r < 0) != (a < 0))).where(r - b, r)

    def copysign(self, other: Any) -> Self:
        """|x| with the sign of `other` (-0.0 counts as negative only through 1/x, so it is taken as positive)."""
        a, b = self._operands(other)
        a = a._to_float()
        return (b._to_float() < 0).where(-a.abs(), a.abs())

    @opmath
    def logaddexp(self, other: Any) -> Self:
        """log(e^a + e^b) = max + log(1 + e^-|a - b|), without overflow (a tie splits the gradient evenly)."""
        a, b = self._operands(other)
        a, b = a._to_float(), b._to_float()
        first = a > b
        return first.where(a, b) + first.where(b - a, a - b).exp().log1p()

    # ---------------------------------------------------------------- bitwise names and shifts

    def bitwise_and(self, x: Any) -> Self:
        """Elementwise & of ints or bools."""
        return self & x

    def bitwise_or(self, x: Any) -> Self:
        """Elementwise | of ints or bools."""
        return self | x

    def bitwise_xor(self, x: Any) -> Self:
        """Elementwise ^ of ints or bools."""
        return self ^ x

    def bitwise_not(self) -> Self:
        """Elementwise ~ of ints or bools."""
        return ~self

    def _shift(self, other: Any, left: bool, reverse: bool = False) -> Self:
        """a << b or a >> b with PyTorch's rules: b may be a tensor; a shift outside [0, bits) gives 0, or the sign
        (-1 or 0) for >> of a signed int. Multiplies and divides by 2^b in the unsigned type of the same width, so
        nothing relies on C's signed overflow; >> of a negative a is ~(~a >> b), the arithmetic shift."""
        sym = "<<" if left else ">>"
        if not isinstance(other, MathMixin) and not is_int(other) and not reverse:
            raise TypeError(f"{sym} needs an int shift (an int or an int tensor), got {type(other).__name__}")
        a, b = self._operands(other, reverse)
        if not a.dtype.is_int:
            raise TypeError(f"{sym} needs int tensors, got {self.dtype!r} {sym} {getattr(other, 'dtype', other)!r}")
        dt, bits = a.dtype, a.dtype.itemsize * 8
        u = _UNSIGNED[a.dtype.itemsize]
        inside = (b >= 0) & (b < bits)
        bc = inside.where(b, 0)
        pow2 = None  # 2^bc in the unsigned type: the product of 2^(2^k) over the set bits k of bc
        for k in range((bits - 1).bit_length()):
            f = ((bc & (1 << k)) != 0).where(a._const(1 << (1 << k), u), a._const(1, u))
            pow2 = f if pow2 is None else pow2 * f
        if left:
            return inside.where((a.cast(u) * pow2).cast(dt), 0)
        if dt.is_unsigned:
            return inside.where(a // pow2, 0)
        neg = a < 0
        mag = neg.where(~a, a).cast(u)  # ~a >= 0 where a < 0: a logical shift of it is the arithmetic one
        r = (mag // pow2).cast(dt)
        return inside.where(neg.where(~r, r), neg.where(-1, 0).cast(dt))

    def bitwise_left_shift(self, other: Any) -> Self:
        """a << b elementwise (b an int or an int tensor; wraps as C's unsigned shift, 0 for b outside [0, bits))."""
        return self._shift(other, True)

    def bitwise_right_shift(self, other: Any) -> Self:
        """a >> b elementwise: arithmetic for signed ints (the sign fills in), logical for unsigned, as PyTorch."""
        return self._shift(other, False)

    def lshift(self, n: Any) -> Self:
        """x << n (tinygrad's name for bitwise_left_shift)."""
        return self._shift(n, True)

    def rshift(self, n: Any) -> Self:
        """x >> n (tinygrad's name for bitwise_right_shift)."""
        return self._shift(n, False)

    def __lshift__(self, n: Any) -> Self:
        return self._shift(n, True)

    def __rshift__(self, n: Any) -> Self:
        return self._shift(n, False)

    def __rlshift__(self, n: Any) -> Self:
        return self._shift(n, True, reverse=True)

    def __rrshift__(self, n: Any) -> Self:
        return self._shift(n, False, reverse=True)

    # ---------------------------------------------------------------- logs and exponentials

    @opmath
    def log10(self) -> Self:
        """Base-10 logarithm."""
        return self.log2() * math.log10(2)

    @opmath
    def log1p(self) -> Self:
        """log(1 + x), accurate near 0: log(u) * x / (u - 1) with u = 1 + x (Goldberg's trick)."""
        x = self._to_float()
        u = 1 + x
        plain = (u == 1) | (u == math.inf)
        # the untaken branch gets a safe denominator, so its gradient is never 0/0
        return plain.where(x, u.log() * (x / plain.where(1.0, u - 1)))

    @opmath
    def expm1(self) -> Self:
        """e^x - 1, accurate near 0: (u - 1) * x / log(u) with u = e^x (Kahan's trick)."""
        x = self._to_float()
        u = x.exp()
        um1 = u - 1
        plain = (u == 1) | (um1 == -1) | (u == math.inf)
        exact = (u == 1).where(x, um1)
        return plain.where(exact, um1 * (x / plain.where(math.e, u).log()))

    # ---------------------------------------------------------------- trigonometric and hyperbolic

    def _atan_small(self) -> Self:
        """atan for |t| <= 1: two argument halvings, then the Taylor series."""
        t = self
        for _ in range(2):
            t = t / (1 + (1 + t * t).sqrt())
        t2, term, s = t * t, t, t
        for k in range(1, 9):
            term = term * t2
            s = s + term * ((-1) ** k / (2 * k + 1))
        return s * 4

    @opmath
    def atan(self) -> Self:
        """Arctangent (radians)."""
        x = self._to_float()
        big = x.abs() > 1
        t = big.where(big.where(x, 1.0).reciprocal(), x)  # 1/x only where taken: no inf in the other gradient
        a = t._atan_small()
        return big.where((x < 0).where(-math.pi / 2, math.pi / 2) - a, a)

    @opmath
    def asin(self) -> Self:
        """Arcsine: atan(x / sqrt(1 - x^2)) (NaN outside [-1, 1])."""
        x = self._to_float()
        return (x / (1 - x * x).sqrt()).atan()

    @opmath
    def acos(self) -> Self:
        """Arccosine: pi/2 - asin(x)."""
        return math.pi / 2 - self.asin()

    @opmath
    def sinh(self) -> Self:
        """(e^x - e^-x) / 2, through expm1 so small x keeps its digits."""
        x = self._to_float()
        return (x.expm1() - (-x).expm1()) * 0.5

    @opmath
    def cosh(self) -> Self:
        """(e^x + e^-x) / 2."""
        x = self._to_float()
        return (x.exp() + (-x).exp()) * 0.5

    @opmath
    def asinh(self) -> Self:
        """sign(x) log(|x| + sqrt(x^2 + 1))."""
        x = self._to_float()
        a = _abs_slope1(x)
        big = a > _HUGE  # x^2 would overflow: log(2|x|), exact there
        s = big.where(1.0, a)  # each branch sees only safe values, so the untaken one has a finite gradient
        r = big.where(big.where(a, 1.0).log() + math.log(2), (s + (s * s + 1).sqrt()).log())
        return (x < 0).where(-r, r)

    @opmath
    def acosh(self) -> Self:
        """log(x + sqrt(x^2 - 1)) (NaN below 1); log(2x) for huge x, whose square would overflow."""
        x = self._to_float()
        big = x > _HUGE
        s = big.where(2.0, x)
        return big.where(big.where(x, 1.0).log() + math.log(2), (s + (s * s - 1).sqrt()).log())

    @opmath
    def atanh(self) -> Self:
        """log((1 + x) / (1 - x)) / 2."""
        x = self._to_float()
        return ((1 + x) / (1 - x)).log() * 0.5

    @opmath
    def erf(self) -> Self:
        """The error function (Abramowitz-Stegun 7.1.26, |error| <= 1.5e-7). Its gradient is the exact
        2/sqrt(pi) e^(-x^2), from x alone (_erf_grad_rule): differentiated through, the polynomial's backward read
        every intermediate of the forward, staged (the char-GPT step's GELU backward read 12 buffers per element)."""
        x = self._to_float()
        a = _abs_slope1(x)
        t = (1 + 0.3275911 * a).reciprocal()
        poly = t * (_ERF[0] + t * (_ERF[1] + t * (_ERF[2] + t * (_ERF[3] + t * _ERF[4]))))
        y = 1 - poly * (-a * a).exp()
        out = (x < 0).where(-y, y)
        if type(self).no_grad:
            return out
        return out._new(with_gradient(out.uop, (x.uop,), "erf"), x)

    @classmethod
    def _erf_grad_rule(cls, grad: Any, m: Any) -> tuple[Any]:
        """d erf(x) = 2/sqrt(pi) e^(-x^2) dx (m: CUSTOM_GRAD(erf(x), x)), as a UOp graph."""
        x = cls(m.src[1])
        return ((cls(grad) * (2 / math.sqrt(math.pi)) * (-(x * x)).exp()).uop,)

    # ---------------------------------------------------------------- activations

    @opmath
    def gelu(self, approximate: str = "none") -> Self:
        """GELU: x Phi(x) with the exact erf (approximate="none", PyTorch's default) or the tanh form ("tanh")."""
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        x = self._to_float()
        if approximate == "tanh":
            return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
        return 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())

    @opmath
    def quick_gelu(self) -> Self:
        """x * sigmoid(1.702 x)."""
        return self * (self * 1.702).sigmoid()

    @opmath
    def elu(self, alpha: float = 1.0) -> Self:
        """x where x > 0, else alpha (e^x - 1)."""
        neg = (self > 0).where(0, self)  # the exponential sees only x <= 0: no inf in the untaken gradient
        return (self > 0).where(self, neg.expm1() * alpha)

    @opmath
    def selu(self) -> Self:
        """scale * elu(x, alpha) with SELU's fixed constants."""
        return self.elu(_SELU_ALPHA) * _SELU_SCALE

    @opmath
    def celu(self, alpha: float = 1.0) -> Self:
        """x where x > 0, else alpha (e^(x/alpha) - 1)."""
        neg = (self > 0).where(0, self)
        return (self > 0).where(self, (neg / alpha).expm1() * alpha)

    @opmath
    def mish(self) -> Self:
        """x * tanh(softplus(x))."""
        return self * self._to_float()._softplus1().tanh()

    def swish(self) -> Self:
        """x * sigmoid(x) (silu)."""
        return self.silu()

    def relu6(self) -> Self:
        """min(max(x, 0), 6)."""
        return self.hardtanh(0.0, 6.0)

    def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> Self:
        """x clipped to [min_val, max_val], NaN kept, as two selects (a max and a min in the C). The gradient is
        PyTorch's, 0 on the bounds and past them (_hardtanh_grad_rule), which differentiating the selects would give
        as 1 on the bounds. The value was a select of three selects on four compares for that gradient: a padded
        copy applying BatchNorm and ReLU6 ran 10-24% slower with it (medians of 8 interleaved rounds)."""
        out = (self < min_val).where(min_val, (self > max_val).where(max_val, self))
        if type(self).no_grad:
            return out
        return out._new(with_gradient(out.uop, (self.uop,), "hardtanh", (float(min_val), float(max_val))), self)

    @classmethod
    def _hardtanh_grad_rule(cls, grad: Any, m: Any) -> tuple[Any]:
        """The gradient of hardtanh (m: CUSTOM_GRAD(out, x), params (min, max)): the output's where min < x < max,
        and where x is NaN, 0 elsewhere (PyTorch's)."""
        x, (lo, hi) = cls(m.src[1]), m.arg.params
        g = cls(grad)
        return (((x <= lo) | (x >= hi)).where(0.0, g).uop,)

    @opmath
    def hardsigmoid(self) -> Self:
        """relu6(x + 3) / 6 (PyTorch's)."""
        return (self + 3).relu6() * (1 / 6)

    @opmath
    def hardswish(self) -> Self:
        """x * relu6(x + 3) / 6."""
        return self * (self + 3).relu6() * (1 / 6)

    @opmath
    def softsign(self) -> Self:
        """x / (1 + |x|)."""
        return self / (1 + self.abs())

    def softmin(self, axis: int = -1) -> Self:
        """softmax(-x)."""
        return (-self).softmax(axis)

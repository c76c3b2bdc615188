"""Elementwise math for Tensor: broadcasting binary ops with PyTorch's dtype promotion, comparisons, logic, and the
composite functions built from the IR's small ALU set.

    exp(x) = exp2(x * log2(e))     a - b = a + b * -1     relu(x) = (0 < x).where(x, 0)     x ** 3 = x * x * x

Every operand is cast to one dtype and broadcast to one shape first (`_operands`); a Python scalar becomes a
shape-() CONST that the ALU op broadcasts itself.

Half precision as PyTorch computes it: a primitive op on float16 or bfloat16 (a + b, x * y, sqrt) is one ALU op,
which the backend computes in float32 and rounds once (uopc/half.py); a composite marked `@opmath` (exp, erf, softmax,
layernorm, ...) casts its 16-bit inputs to float32, and its float32 results back, so nothing inside it is rounded:

    x.half().erf()   ->   x.half().float().erf().half()
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, Self

import numpy as np

from uopc.tensor.shape import Scalar, broadcast_shape, is_scalar, scalar_dtype
from uopc.uop import Ops, UOp
from uopc.uop.dtype import DType, dtypes, least_upper_float, promote, truncate


def broadcast_uop(u: UOp, shape: tuple[int, ...]) -> UOp:
    """`u` broadcast to `shape` (already checked compatible): leading size-1 dims, then EXPAND, each only where it
    changes the shape."""
    return u.reshape((1,) * (len(shape) - len(u.shape)) + u.shape).expand(shape)


def opmath(fn: Callable) -> Callable:
    """PyTorch's "opmath" rule for a composite op: its float16 or bfloat16 tensor arguments (also inside a list) are
    computed in float32 and the float32 results round back once, when every float argument had that one 16-bit dtype
    (with float32 beside them the result is float32 anyway). A composite called inside one sees float32 and runs as it
    is. An explicit `dtype` argument wins: then the op computes in what it was asked for."""
    params = list(inspect.signature(fn).parameters)
    at = params.index("dtype") if "dtype" in params else None

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else None
        if isinstance(first, ElementwiseMixin) and first.dtype.is_float and first.dtype.itemsize >= 4:
            return fn(*args, **kwargs)  # the common case: a float32 self (ops promote to float32 or wider)
        flat = [a for x in (*args, *kwargs.values()) for a in (x if isinstance(x, (list, tuple)) else (x,))]
        floats = {t.dtype for t in flat if isinstance(t, ElementwiseMixin) and t.dtype.is_float}
        asked = args[at] if at is not None and len(args) > at else kwargs.get("dtype")
        if not any(dt.is_16bit_float for dt in floats) or asked is not None:
            return fn(*args, **kwargs)
        out = fn(*(_widen(a) for a in args), **{k: _widen(v) for k, v in kwargs.items()})
        return _round_back(out, floats.pop()) if len(floats) == 1 else out

    return run


def _widen(x: Any) -> Any:
    """A 16-bit float tensor as float32 (lists and tuples element by element); anything else as it is."""
    if isinstance(x, (list, tuple)):
        return type(x)(_widen(a) for a in x)
    return x.float() if isinstance(x, ElementwiseMixin) and x.dtype.is_16bit_float else x


def _round_back(out: Any, dt: DType) -> Any:
    """The float32 tensors of `out` (a tensor or nested tuples) cast to `dt`; other results as they are."""
    if isinstance(out, tuple):
        return tuple(_round_back(o, dt) for o in out)
    return out.cast(dt) if isinstance(out, ElementwiseMixin) and out.dtype is dtypes.float32 else out


class ElementwiseMixin:
    """The elementwise part of Tensor. Every Tensor is an ElementwiseMixin, so `isinstance(x, ElementwiseMixin)`
    tells a tensor operand from a scalar without importing Tensor; new tensors come from `type(self)(...)`."""

    # ---------------------------------------------------------------- broadcasting binary ops

    def _const(self, value: Scalar, dtype: DType | None = None) -> Self:
        """A shape-() constant; the ALU op broadcasts it, so it needs no EXPAND."""
        dt = dtype or self.dtype
        # an int constant wraps to its dtype (int8 + 1000 adds -24), as a C store would
        return type(self)(UOp.const(truncate(dt, value) if dt.is_int else value, dt))

    def _broadcast_to(self, shape: tuple[int, ...], keep_const: bool = True) -> Self:
        if self.shape == shape or (keep_const and self.uop.op is Ops.CONST):
            return self
        return self._new(broadcast_uop(self.uop, shape))

    def _operands(self, other: Any, reverse: bool = False) -> tuple[Self, Self]:
        """(self, other) with one dtype (PyTorch promotion) and one broadcast shape; swapped if reverse."""
        if isinstance(other, ElementwiseMixin):
            dt = promote(self.dtype, other.dtype)
        elif is_scalar(other):
            other = other.item() if isinstance(other, np.generic) else other
            dt = scalar_dtype(self.dtype, other)
            other = self._const(other, dt)
        else:
            other = type(self)(other)
            dt = promote(self.dtype, other.dtype)
        shape = broadcast_shape(self.shape, other.shape)
        a, b = self.cast(dt)._broadcast_to(shape), other.cast(dt)._broadcast_to(shape)
        return (b, a) if reverse else (a, b)

    def _alu(self, op: Ops, *others: Self) -> Self:
        return self._new(self.uop.alu(op, *(o.uop for o in others)), *others)

    def _binop(self, op: Ops, other: Any, reverse: bool = False) -> Self:
        a, b = self._operands(other, reverse)
        return a._alu(op, b)

    def add(self, other: Any, reverse: bool = False) -> Self:
        """a + b with broadcasting and PyTorch promotion (b + a if reverse)."""
        return self._binop(Ops.ADD, other, reverse)

    def mul(self, other: Any, reverse: bool = False) -> Self:
        """a * b with broadcasting and PyTorch promotion."""
        return self._binop(Ops.MUL, other, reverse)

    def neg(self) -> Self:
        """-x, spelled x * -1 (the IR's NEG is left to the backends)."""
        if self.dtype.is_bool:
            raise TypeError("negation (-) of a bool tensor is not supported; use logical_not() or ~")
        if self.uop.op is Ops.CONST:  # fold here so `x - 1` reads x + -1, not x + 1 * -1
            return self._const(-self.uop.arg)
        return self * -1

    def sub(self, other: Any, reverse: bool = False) -> Self:
        """a - b, spelled a + (-b)."""
        a, b = self._operands(other, reverse)
        return a + b.neg()

    def reciprocal(self) -> Self:
        """1 / x (ints become float32)."""
        x = self._to_float()
        if x.uop.op is Ops.CONST:  # a constant divisor folds to one multiply: x / 4 == x * 0.25
            v = x.uop.arg
            return x._const(1.0 / v if v != 0 else math.copysign(math.inf, v))
        return x._alu(Ops.RECIP)

    @opmath
    def div(self, other: Any, reverse: bool = False, rounding_mode: str | None = None) -> Self:
        """Division as PyTorch's: true division (ints give float32) when rounding_mode is None, else the quotient
        rounded toward zero ("trunc") or down ("floor") in the operands' dtype."""
        if rounding_mode not in (None, "trunc", "floor"):
            raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        if rounding_mode == "floor":
            return self.floordiv(other, reverse)
        a, b = self._operands(other, reverse)
        if rounding_mode == "trunc":
            if a.dtype.is_bool:
                raise TypeError("div(rounding_mode='trunc') of bool tensors is not supported")
            if a.dtype.is_float:
                return (a / b).trunc()
            r = a._alu(Ops.MOD, b)  # the floor quotient is one too low where the remainder is nonzero across signs
            return a._alu(Ops.IDIV, b) + ((r != 0) & ((a < 0) != (b < 0))).cast(a.dtype)
        dt = least_upper_float(a.dtype)
        return a.cast(dt) * b.cast(dt).reciprocal()

    @opmath
    def floordiv(self, other: Any, reverse: bool = False) -> Self:
        """Floor division (Python semantics; an integer x // 0 is 0)."""
        a, b = self._operands(other, reverse)
        if a.dtype.is_bool:
            raise TypeError("floor division (//) of bool tensors is not supported")
        return a._alu(Ops.IDIV, b) if a.dtype.is_int else (a / b).floor()

    def floor_divide(self, other: Any) -> Self:
        """PyTorch's name for `//` (floor division)."""
        return self.floordiv(other)

    @opmath
    def mod(self, other: Any, reverse: bool = False) -> Self:
        """Remainder with the sign of the divisor (Python semantics; an integer x % 0 is 0)."""
        a, b = self._operands(other, reverse)
        if a.dtype.is_bool:
            raise TypeError("remainder (%) of bool tensors is not supported")
        return a._alu(Ops.MOD, b) if a.dtype.is_int else a - (a / b).floor() * b

    def __add__(self, x: Any) -> Self:
        return self.add(x)

    def __radd__(self, x: Any) -> Self:
        return self.add(x, True)

    def __sub__(self, x: Any) -> Self:
        return self.sub(x)

    def __rsub__(self, x: Any) -> Self:
        return self.sub(x, True)

    def __mul__(self, x: Any) -> Self:
        return self.mul(x)

    def __rmul__(self, x: Any) -> Self:
        return self.mul(x, True)

    def __truediv__(self, x: Any) -> Self:
        return self.div(x)

    def __rtruediv__(self, x: Any) -> Self:
        return self.div(x, True)

    def __floordiv__(self, x: Any) -> Self:
        return self.floordiv(x)

    def __rfloordiv__(self, x: Any) -> Self:
        return self.floordiv(x, True)

    def __mod__(self, x: Any) -> Self:
        return self.mod(x)

    def __rmod__(self, x: Any) -> Self:
        return self.mod(x, True)

    def __pow__(self, x: Any) -> Self:
        return self.pow(x)

    def __rpow__(self, x: Any) -> Self:
        return self.pow(x, True)

    def __neg__(self) -> Self:
        return self.neg()

    # ---------------------------------------------------------------- comparisons and logic (results are bool)

    def __lt__(self, x: Any) -> Self:
        return self._binop(Ops.CMPLT, x)

    def __gt__(self, x: Any) -> Self:
        return self._binop(Ops.CMPLT, x, reverse=True)

    def __le__(self, x: Any) -> Self:
        a, b = self._operands(x)
        # NOT(b < a) would make NaN <= 1 True: floats need the longer, NaN-correct form
        return (a < b) | (a == b) if a.dtype.is_float else (b < a).logical_not()

    def __ge__(self, x: Any) -> Self:
        a, b = self._operands(x)
        return b <= a

    def __eq__(self, x: Any) -> Self:  # type: ignore[override]
        return (self != x).logical_not()

    def __ne__(self, x: Any) -> Self:  # type: ignore[override]
        return self._binop(Ops.CMPNE, x)

    def _bitwise(self, op: Ops, other: Any, reverse: bool = False) -> Self:
        a, b = self._operands(other, reverse)
        if a.dtype.is_float:
            raise TypeError(f"bitwise {op.name.lower()} needs bool or int tensors, got {a.dtype!r}")
        return a._alu(op, b)

    def __and__(self, x: Any) -> Self:
        return self._bitwise(Ops.AND, x)

    def __rand__(self, x: Any) -> Self:
        return self._bitwise(Ops.AND, x, True)

    def __or__(self, x: Any) -> Self:
        return self._bitwise(Ops.OR, x)

    def __ror__(self, x: Any) -> Self:
        return self._bitwise(Ops.OR, x, True)

    def __xor__(self, x: Any) -> Self:
        return self._bitwise(Ops.XOR, x)

    def __rxor__(self, x: Any) -> Self:
        return self._bitwise(Ops.XOR, x, True)

    def __invert__(self) -> Self:
        """Logical NOT of a bool tensor, bitwise NOT of an int tensor (both an XOR)."""
        if self.dtype.is_float:
            raise TypeError(f"~ needs a bool or int tensor, got {self.dtype!r}")
        # _const wraps -1 to the dtype's own width (255 for uint8): an unsigned -1u would be 32 bits wide
        return self._alu(Ops.XOR, self._const(True if self.dtype.is_bool else -1))

    def logical_not(self) -> Self:
        """True where x is zero (False)."""
        return ~self if self.dtype.is_bool else self == 0

    def where(self, x: Any, y: Any) -> Self:
        """Elementwise `x if self else y`, broadcasting all three (also callable as Tensor.where(cond, x, y))."""
        cond = self.cast(dtypes.bool)
        x = type(self)(x) if not isinstance(x, ElementwiseMixin) and not is_scalar(x) else x
        y = type(self)(y) if not isinstance(y, ElementwiseMixin) and not is_scalar(y) else y
        if isinstance(x, ElementwiseMixin) and isinstance(y, ElementwiseMixin):
            dt = promote(x.dtype, y.dtype)
        elif isinstance(x, ElementwiseMixin) or isinstance(y, ElementwiseMixin):
            t, s = (x, y) if isinstance(x, ElementwiseMixin) else (y, x)
            dt = scalar_dtype(t.dtype, s)
        else:
            dt = scalar_dtype(dtypes.from_py(x), y)
        x, y = (v.cast(dt) if isinstance(v, ElementwiseMixin) else self._const(v, dt) for v in (x, y))
        shape = broadcast_shape(cond.shape, x.shape, y.shape)
        cond, x, y = (v._broadcast_to(shape) for v in (cond, x, y))
        return cond._alu(Ops.WHERE, x, y)

    # ---------------------------------------------------------------- elementwise math

    def maximum(self, x: Any) -> Self:
        """Elementwise max (NaN-propagating)."""
        return self._binop(Ops.MAX, x)

    def minimum(self, x: Any) -> Self:
        """Elementwise min: -max(-a, -b) for floats (keeps NaN propagation), a select for ints and bools."""
        a, b = self._operands(x)
        return -((-a).maximum(-b)) if a.dtype.is_float else (a < b).where(a, b)

    def clip(self, min: Any = None, max: Any = None) -> Self:
        """Limit values to [min, max]; either bound may be None. Selects, as PyTorch: the gradient is 1 on the bounds
        (maximum would split it there), NaN stays NaN, and min > max gives max."""
        if min is None and max is None:
            raise ValueError("clip needs at least one of min and max")
        x = self if min is None else (self < min).where(min, self)
        return x if max is None else (x > max).where(max, x)

    clamp = clip

    def abs(self) -> Self:
        """|x| as a select, so NaN stays NaN and the gradient is sign(x) (0 at 0, as PyTorch)."""
        if self.dtype.is_bool or self.dtype.is_unsigned:
            return self
        if not self.dtype.is_float:
            return (self < 0).where(-self, self)
        # At 0 the value is z - x * z with z = 0 known only at run time (z is x itself for NaN, which never gets
        # there): +0 for -0 too, and the gradient there is -g * 0, as PyTorch's g * sgn(x): an infinite g gives NaN
        z = (self != self).where(self, 0.0).detach()
        return (self < 0).where(-self, (self == 0).where(z - self * z, self))

    def _abs_select(self) -> Self:
        """|x| of a float as selects only: its gradient at 0 is exactly 0 whatever comes in (pow's magnitude, whose
        own y-gradient NaN at negative bases must not meet another 0 * inf). NaN falls through to x."""
        # the 0 is a constant; not x * 0 for it: gcc's -fno-signed-zeros folds x*0.0f to 0
        return (self < 0).where(-self, (self == 0).where(0.0, self))

    def sign(self) -> Self:
        """-1, 0 or 1 (in self's dtype)."""
        return (self < 0).where(-1, (0 < self).where(1, 0)).cast(self.dtype)

    def square(self) -> Self:
        """x * x."""
        return self * self

    def sqrt(self) -> Self:
        """Square root (ints become float32)."""
        return self._to_float()._alu(Ops.SQRT)

    @opmath
    def rsqrt(self) -> Self:
        """1 / sqrt(x)."""
        return self.sqrt().reciprocal()

    def exp2(self) -> Self:
        """2 ** x."""
        return self._to_float()._alu(Ops.EXP2)

    def log2(self) -> Self:
        """Base-2 logarithm."""
        return self._to_float()._alu(Ops.LOG2)

    @opmath
    def exp(self) -> Self:
        """e^x, the IR's way: exp2(x * log2(e))."""
        return (self._to_float() * (1 / math.log(2))).exp2()

    @opmath
    def log(self) -> Self:
        """ln x = log2(x) * ln(2)."""
        return self.log2() * math.log(2)

    def sin(self) -> Self:
        """Sine (radians)."""
        return self._to_float()._alu(Ops.SIN)

    @opmath
    def cos(self) -> Self:
        """cos x = sin(pi/2 - x)."""
        return (math.pi / 2 - self._to_float()).sin()

    @opmath
    def tan(self) -> Self:
        """sin / cos."""
        return self.sin() / self.cos()

    def trunc(self) -> Self:
        """Round toward zero (identity for ints)."""
        return self if not self.dtype.is_float else self._alu(Ops.TRUNC)

    def floor(self) -> Self:
        """Round down: trunc, minus one where trunc rounded a negative value up."""
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (self < t).where(t - 1, t)

    def ceil(self) -> Self:
        """Round up: trunc, plus one where trunc rounded a positive value down."""
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (t < self).where(t + 1, t)

    @opmath
    def sigmoid(self) -> Self:
        """1 / (1 + z) for x >= 0 and z / (1 + z) below, z = e^-|x| in (0, 1]: nothing overflows, so the value and
        the gradient are finite everywhere (e^-x would be inf at x = -300, and its gradient 0 * inf = NaN)."""
        x = self._to_float()
        neg = x < 0
        z = neg.where(x, -x).exp()  # -|x| as a select that puts 0 on the -x side: the gradient at 0 is 1/4
        r = (1 + z).reciprocal()
        return neg.where(z * r, r)

    @opmath
    def tanh(self) -> Self:
        """sign(x) (1 - z) / (1 + z), z = e^-2|x| in (0, 1] (finite value and gradient everywhere); below |x| = 0.04,
        where 1 - z cancels, the odd Taylor polynomial x - x^3/3 + 2x^5/15 - 17x^7/315."""
        x = self._to_float()
        neg = x < 0
        z = (2 * neg.where(x, -x)).exp()
        t = (1 - z) * (1 + z).reciprocal()
        near0 = (-0.04 < x) & (x < 0.04)
        xs = near0.where(x, 0)  # the polynomial sees only small x: x^2 of 1e30 would make its gradient 0 * inf
        x2 = xs * xs
        small = xs * (1 + x2 * (-1 / 3 + x2 * (2 / 15 - x2 * (17 / 315))))
        return near0.where(small, neg.where(-t, t))

    @opmath
    def logsigmoid(self) -> Self:
        """log(sigmoid(x)) = -softplus(-x): finite for every x (log of a sigmoid that underflowed would be -inf)."""
        return -(-self._to_float())._softplus1()

    def relu(self) -> Self:
        # NOTE: not maximum(x, 0): its gradient at 0 would be split between the operands
        return (0 < self).where(self, 0)

    def leaky_relu(self, neg_slope: float = 0.01) -> Self:
        """x where x > 0, else neg_slope * x."""
        return (0 < self).where(self, self * neg_slope)

    @opmath
    def silu(self) -> Self:
        """x * sigmoid(x) (also called swish)."""
        return self * self.sigmoid()

    @opmath
    def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Self:
        """log(1 + e^(beta x)) / beta, and x itself where beta x > threshold (PyTorch's softplus)."""
        x = self._to_float()
        y = x if beta == 1 else x * beta
        sp = y._softplus1() if beta == 1 else y._softplus1() * (1 / beta)
        return (y > threshold).where(x, sp)

    def _softplus1(self) -> Self:
        """log(1 + e^x) = max(x, 0) + log1p(e^-|x|): e^-|x| never overflows; the tie at 0 goes to the x side so the
        gradient there is 1 - 1/2, as PyTorch's sigmoid(0)."""
        x = self
        neg = x < 0
        e = neg.where(x, -x).exp()  # e^-|x| in (0, 1]
        # log(1 + e) loses e below float precision: a cubic is exact to 2.5e-10 relative for e < 1e-3
        log1p = (e < 1e-3).where(e * (1 + e * (-0.5 + e * (1 / 3))), (1 + e).log())
        return neg.where(0, x) + log1p

    @opmath
    def pow(self, exponent: Any, reverse: bool = False) -> Self:
        """self ** exponent (or exponent ** self if reverse); small integer powers are exact multiplies."""
        if reverse:
            return self._rpow(exponent)
        if isinstance(exponent, ElementwiseMixin) or not is_scalar(exponent):
            base, e = self._operands(exponent)
            return base._pow_tensor(e)
        e = exponent.item() if isinstance(exponent, np.generic) else exponent
        x = self.cast(scalar_dtype(self.dtype, e))
        if float(e).is_integer() and (not x.dtype.is_float or abs(e) <= 8):
            return x._int_pow(int(e))
        if e == 0.5:
            return x.sqrt()
        if e == -0.5:
            return x.rsqrt()
        return x._pow_general(x._const(e))

    # ---------------------------------------------------------------- pow helpers

    def _int_pow(self, n: int) -> Self:
        """x ** n for an integer n by square-and-multiply: exact for ints, and correct for negative float bases."""
        if n < 0:
            if not self.dtype.is_float:
                raise ValueError(
                    f"integers to negative integer powers are not allowed (dtype {self.dtype!r}, power {n})"
                )
            # (1/x)^n, not 1/x^n: at x = 0 the gradient is n * inf * -inf = -inf, as PyTorch's, not -inf * 0 = NaN
            return self.reciprocal()._int_pow(-n)
        out, sq = None, self
        while n:
            if n & 1:
                out = sq if out is None else out * sq
            n >>= 1
            if n:
                sq = sq * sq
        return out if out is not None else self.ones_like()

    def _pow_general(self, y: Self) -> Self:
        """x ** y with PyTorch's (C pow's) special cases, values and gradients: exp2(y log2|x|), signed for a negative
        base and an integer y (NaN otherwise, but (-inf) ** y = inf ** y); 0 ** y, 1 ** y and the like as their own
        branches whose inputs are gated, so that no branch that is not taken can put an inf or NaN into a gradient."""
        x = self
        zero, neg = x == 0, x < 0
        ax = x._abs_select()
        # d/dy at a negative base is x^y log(x) = NaN in PyTorch, while the magnitude's own y-gradient is finite
        mag = (y._nan_grad_where(neg) * zero.where(1, ax).log2()).exp2()
        is_int = y.trunc() == y
        odd = (y * 0.5).trunc() != y * 0.5
        # a sign factor (NaN only at the negative bases it applies to), not a select between -mag, mag and mag * NaN:
        # an untaken branch gets a zero gradient, and 0 * NaN would poison mag's gradient at every element
        sign = neg.where(is_int.where(odd.where(-1.0, 1.0), (ax == math.inf).where(1.0, math.nan)), 1.0)
        out = zero.where(x._pow_zero(y, zero), mag * sign.cast(mag.dtype))
        nonfinite_y = (y != y) | (y.abs() == math.inf)
        one = (
            ((y == 0) & ((x != x) | (ax == math.inf))) | ((x == 1) & nonfinite_y) | ((x == -1) & (y.abs() == math.inf))
        )
        return one.where(1, out)  # NaN ** 0 == inf ** 0 == 1 ** NaN == (-1) ** inf == 1

    def _pow_zero(self, y: Self, zero: Self) -> Self:
        """0 ** y: 0 (y > 0), 1 (y = 0), inf (y < 0), NaN (NaN), with PyTorch's gradients there: d/dx is 0 for y > 1,
        1 for y = 1, inf for 0 < y < 1 (a sqrt of x) and -inf for y < 0 (a reciprocal); d/dy is -inf for y < 0."""
        x = self
        frac = zero & (0 < y) & (y < 1)
        negy = zero & (y < 0)
        # sqrt(y_d - y) is 0 with gradient -inf: added to the inf of 1/0 it gives d/dy = inf * log(0) = -inf
        dyok = negy & (y != -math.inf)  # -inf - -inf would be NaN
        dy = dyok.where(y.detach() - y, 1).sqrt() - dyok.where(0, 1)
        pos = (y == 1).where(x, (y < 1).where(frac.where(x, 1).sqrt(), 0))
        rest = (y == 0).where(1.0, math.nan).cast(x.dtype)
        return (0 < y).where(pos, (y < 0).where(negy.where(x, 1).reciprocal() + dy, rest))

    def _nan_grad_where(self, mask: Self) -> Self:
        """self's value, with a NaN gradient where `mask`: the branch a select does not take gets a zero gradient,
        and 0 * NaN is NaN, so (y * c) with c = NaN under the mask (0 elsewhere) poisons exactly those elements."""
        c = mask.where(math.nan, 0.0).cast(self.dtype)
        return self + (c != 1).where(0, self * c)

    def _pow_tensor(self, y: Self) -> Self:
        """Elementwise x ** y of two same-dtype tensors; ints go through float64 and round back."""
        if self.dtype.is_float:
            return self._pow_general(y)
        r = self.double()._pow_general(y.double())
        return (r < 0).where(r - 0.5, r + 0.5).trunc().cast(self.dtype)

    def _rpow(self, base: Any) -> Self:
        """base ** x for a scalar or tensor base."""
        if isinstance(base, ElementwiseMixin) or not is_scalar(base):
            b, e = self._operands(base, reverse=True)
            return b._pow_tensor(e)
        b = base.item() if isinstance(base, np.generic) else base
        dt = scalar_dtype(self.dtype, b)
        if dt.is_float and b > 0:  # the common case, e.g. 2 ** self = exp2(self)
            xf = self.cast(dt)
            return (xf if b == 2 else xf * math.log2(b)).exp2()
        return self._const(b, dt)._pow_tensor(self.cast(dt))

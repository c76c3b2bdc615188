"""The user-facing lazy Tensor: PyTorch/tinygrad-style names on top of the UOp shape graph.

Operations only build UOps; `numpy()`, `item()` or `realize()` hand the graph to the kernelizer, which
cuts it into kernels, compiles them and returns a buffer:

    >>> from uopc import Tensor
    >>> x = Tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> y = (x * 2 - 1).relu().sum(1)      # a graph of UOps: nothing has run yet
    >>> y.tolist()                         # one fused kernel, r_2
    [4.0, 12.0]

The IR has a handful of ALU ops; everything else is composed here from them, e.g.
`exp(x) = exp2(x * log2(e))`, `a - b = a + b * -1`, `relu(x) = (0 < x).where(x, 0)`.
Indexing, padding and concatenation live in `uopc.tensor_index`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from uopc import tensor_index
from uopc.buffer import base_buffer, buffer_data, is_contiguous_buffer, new_buffer
from uopc.dtype import DType, dtypes, least_upper_float, promote, to_dtype, truncate
from uopc.helpers import prod
from uopc.tensor_index import broadcast_shape, norm_dim
from uopc.uop import Ops, UOp, identity_element

Scalar = bool | int | float
Axis = int | Sequence[int] | None

# every random creation draws from this generator; Tensor.manual_seed replaces it
_rng = np.random.default_rng()


# ---------------------------------------------------------------- shape and dtype rules


def _is_scalar(x: Any) -> bool:
    return isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating))


def _scalar_dtype(dt: DType, x: Scalar) -> DType:
    """PyTorch's rule: a Python scalar never widens a tensor's dtype, it only lifts it to the scalar's category."""
    if isinstance(x, (bool, np.bool_)):
        return dt
    if isinstance(x, (int, np.integer)):
        return dtypes.default_int if dt.is_bool else dt
    return dt if dt.is_float else dtypes.default_float


def _varargs(args: tuple) -> tuple:
    """`f(2, 3)` and `f((2, 3))` both mean (2, 3)."""
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)


def _shape_arg(shape: tuple) -> tuple[int, ...]:
    """A creation shape from varargs: ints >= 0."""
    shape = _varargs(shape)
    for s in shape:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"a shape must be ints, got {type(s).__name__} {s!r} in {shape}")
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimensions are not allowed, got shape {shape}")
    return tuple(int(s) for s in shape)


def _full_uop(value: Scalar, dtype: DType, shape: tuple[int, ...]) -> UOp:
    """A lazy constant: one CONST reshaped and expanded, never a host buffer."""
    return UOp.const(value, dtype).reshape((1,) * len(shape)).expand(shape)


def _host_array(data: Any, dtype: DType | None) -> tuple[np.ndarray, DType]:
    """`data` as a fresh NumPy array of a supported dtype, inferred as PyTorch does (float -> float32, int -> int32)."""
    if isinstance(data, (np.ndarray, np.generic)):
        arr = np.asarray(data)
        src = dtypes.from_np(arr.dtype)  # TypeError for complex, object, strings...
    elif _is_scalar(data) or isinstance(data, (list, tuple, range)):
        try:
            arr = np.array(data)
        except ValueError as e:  # NumPy 2 rejects ragged nesting
            raise ValueError(f"cannot make a Tensor from ragged nested sequences: {e}") from None
        kinds = {"b": dtypes.bool, "i": dtypes.default_int, "u": dtypes.default_int, "f": dtypes.default_float}
        if arr.dtype.kind not in kinds:
            raise TypeError(
                f"cannot make a Tensor from {data!r}: elements must be numbers or bools "
                "(use Tensor.stack for a list of Tensors)"
            )
        src = kinds[arr.dtype.kind]
        if src is dtypes.default_int and arr.size and not (-(2**31) <= arr.min() and arr.max() < 2**31):
            raise ValueError("integer values do not fit int32 (Python ints become int32); pass dtype=dtypes.int64")
    else:
        raise TypeError(
            f"cannot make a Tensor from {type(data).__name__}: expected a NumPy array, "
            "a (nested) list or tuple of numbers, or a Python scalar"
        )
    dt = src if dtype is None else to_dtype(dtype)
    return arr.astype(dt.np), dt  # astype copies: the tensor never aliases the caller's array


# ---------------------------------------------------------------- the Tensor


class Tensor:
    """A lazy n-dimensional array: operations build a UOp graph, numpy()/item()/realize() compute it."""

    fuse_reduce: bool = False  # passed to uopc.realize.realize: let reductions fuse into their consumers
    __array_ufunc__ = None  # NumPy defers to our reflected operators: np_array + t calls t.__radd__
    device = "CPU"
    # tensors created with requires_grad=True, so that loss.backward() without a parameter list can find them
    # id -> tensor, weakly: a WeakSet would compare tensors with __eq__, which builds a Tensor
    _grad_tensors: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()

    def __init__(self, data: Any, dtype: Any = None, requires_grad: bool | None = None):
        self.requires_grad = requires_grad
        if requires_grad:
            Tensor._grad_tensors[id(self)] = self
        self.grad: Tensor | None = None
        # the graph a realized tensor came from, kept while it tracks gradients (loss.item(); loss.backward())
        self._graph: UOp | None = None
        self._leaf = True  # created from data (or assign): realize never keeps a leaf's graph
        if isinstance(data, Tensor):
            data = data.uop
        if isinstance(data, UOp):
            self.uop: UOp = data if dtype is None else data.cast(to_dtype(dtype))
            return
        arr, dt = _host_array(data, dtype)
        if arr.size == 0:
            self.uop = _full_uop(0, dt, arr.shape)
        else:
            self.uop = new_buffer(dt, arr.size, arr).reshape(arr.shape)

    def _new(self, uop: UOp, *others: Tensor) -> Tensor:
        """A tensor computed from self (and others): it tracks gradients if any input does."""
        out = Tensor(uop)  # set requires_grad afterwards: an op result is not a parameter to register
        out.requires_grad = True if self.requires_grad or any(o.requires_grad for o in others) else None
        out._leaf = False
        return out

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Mark this tensor as one whose gradient backward() computes (returns self)."""
        self.requires_grad = requires_grad
        if requires_grad:
            Tensor._grad_tensors[id(self)] = self
        return self

    # ---------------------------------------------------------------- creation

    @staticmethod
    def full(
        shape: int | Sequence[int], fill_value: Scalar, dtype: Any = None, requires_grad: bool | None = None
    ) -> Tensor:
        """A lazy constant tensor (a CONST broadcast to `shape`)."""
        shape = _shape_arg((shape,) if isinstance(shape, (int, np.integer)) else tuple(shape))
        dt = dtypes.from_py(fill_value) if dtype is None else to_dtype(dtype)
        return Tensor(_full_uop(fill_value, dt, shape), requires_grad=requires_grad)

    @staticmethod
    def zeros(*shape: Any, dtype: Any = None, requires_grad: bool | None = None) -> Tensor:
        """A lazy tensor of zeros (float32 unless `dtype`)."""
        return Tensor.full(_shape_arg(shape), 0.0, dtype or dtypes.default_float, requires_grad)

    @staticmethod
    def ones(*shape: Any, dtype: Any = None, requires_grad: bool | None = None) -> Tensor:
        """A lazy tensor of ones (float32 unless `dtype`)."""
        return Tensor.full(_shape_arg(shape), 1.0, dtype or dtypes.default_float, requires_grad)

    @staticmethod
    def empty(*shape: Any, dtype: Any = None, requires_grad: bool | None = None) -> Tensor:
        """Uninitialized memory is not a thing in a lazy library: this is zeros()."""
        return Tensor.zeros(*shape, dtype=dtype, requires_grad=requires_grad)

    def full_like(self, fill_value: Scalar, dtype: Any = None) -> Tensor:
        """A constant tensor with self's shape (and dtype, unless given)."""
        return Tensor.full(self.shape, fill_value, dtype or self.dtype)

    def zeros_like(self, dtype: Any = None) -> Tensor:
        """Zeros with self's shape and dtype."""
        return self.full_like(0, dtype)

    def ones_like(self, dtype: Any = None) -> Tensor:
        """Ones with self's shape and dtype."""
        return self.full_like(1, dtype)

    def empty_like(self, dtype: Any = None) -> Tensor:
        """Same as zeros_like (see empty)."""
        return self.full_like(0, dtype)

    @staticmethod
    def arange(start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype: Any = None) -> Tensor:
        """Evenly spaced values in [start, stop) (int32 if all arguments are ints, else float32)."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError("arange: step must be nonzero")
        all_int = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_int if all_int else dtypes.default_float
        n = max(0, math.ceil((stop - start) / step))
        return Tensor((start + np.arange(n) * step).astype(dt.np))

    @staticmethod
    def eye(n: int, m: int | None = None, dtype: Any = None) -> Tensor:
        """The identity matrix (n, m), built lazily: a 1 followed by k zeros, repeated, then cut to (k, k)."""
        m = n if m is None else m
        k = max(n, m)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if n == 0 or m == 0:
            return Tensor.zeros(n, m, dtype=dt)
        ones = Tensor.ones(k, 1, dtype=dt).pad(((0, 0), (0, k)))
        return ones.flatten().shrink(((0, k * k),)).reshape(k, k).shrink(((0, n), (0, m)))

    @staticmethod
    def manual_seed(seed: int) -> None:
        """Make every later rand/randn/uniform/randint reproducible."""
        global _rng
        _rng = np.random.default_rng(seed)

    @staticmethod
    def _random(arr: np.ndarray, dtype: Any, requires_grad: bool | None) -> Tensor:
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        return Tensor(arr, dtype=dt, requires_grad=requires_grad)

    @staticmethod
    def rand(*shape: Any, dtype: Any = None, requires_grad: bool | None = None) -> Tensor:
        """Uniform samples in [0, 1), drawn on the host."""
        return Tensor._random(_rng.random(_shape_arg(shape)), dtype, requires_grad)

    @staticmethod
    def randn(*shape: Any, dtype: Any = None, requires_grad: bool | None = None) -> Tensor:
        """Standard normal samples, drawn on the host."""
        return Tensor._random(_rng.standard_normal(_shape_arg(shape)), dtype, requires_grad)

    @staticmethod
    def uniform(
        *shape: Any, low: float = 0.0, high: float = 1.0, dtype: Any = None, requires_grad: bool | None = None
    ) -> Tensor:
        """Uniform samples in [low, high), drawn on the host."""
        return Tensor._random(_rng.uniform(low, high, _shape_arg(shape)), dtype, requires_grad)

    @staticmethod
    def randint(*shape: Any, low: int = 0, high: int = 10, dtype: Any = None) -> Tensor:
        """Random integers in [low, high) (int32 unless `dtype`)."""
        return Tensor(_rng.integers(low, high, _shape_arg(shape)), dtype=dtype or dtypes.default_int)

    def rand_like(self) -> Tensor:
        """Uniform [0, 1) samples with self's shape and (float) dtype."""
        return Tensor.rand(self.shape, dtype=least_upper_float(self.dtype))

    def randn_like(self) -> Tensor:
        """Standard normal samples with self's shape and (float) dtype."""
        return Tensor.randn(self.shape, dtype=least_upper_float(self.dtype))

    # ---------------------------------------------------------------- properties

    @property
    def shape(self) -> tuple[int, ...]:
        return self.uop.shape

    @property
    def dtype(self) -> DType:
        return self.uop.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        """The number of elements."""
        return prod(self.shape)

    def size(self, dim: int | None = None) -> tuple[int, ...] | int:
        """The shape, or the size of one dim."""
        if dim is None:
            return self.shape
        d = norm_dim(dim, self.ndim)
        return self.shape[d] if self.ndim else 1

    @property
    def T(self) -> Tensor:
        """All dims reversed (the transpose of a matrix)."""
        return self.permute(*reversed(range(self.ndim)))

    def __repr__(self) -> str:
        grad = "" if self.requires_grad is None else f", requires_grad={self.requires_grad}"
        return f"<Tensor shape={self.shape} dtype={self.dtype!r}{grad}>"

    def __hash__(self) -> int:  # __eq__ builds a Tensor, so hashing must be by identity
        return id(self)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"Boolean value of Tensor with {self.numel()} values (shape {self.shape}) is ambiguous")
        return bool(self.item())

    # ---------------------------------------------------------------- realization

    def realize(self) -> Tensor:
        """Compute this tensor now; afterwards it is a buffer (returns self)."""
        Tensor.realize_all(self)
        return self

    @staticmethod
    def realize_all(*tensors: Tensor) -> None:
        """Realize several tensors in one kernelize.realize call, so they share one plan and its common work."""
        from uopc import realize  # the one lazy import: the compiler loads on the first realize, not on import

        todo = []
        for t in dict.fromkeys(tensors):
            if t.numel() == 0:  # never realize an empty root: its value is fully known
                t.uop = _full_uop(0, t.dtype, t.shape)
            elif not is_contiguous_buffer(t.uop):
                todo.append(t)
        if not todo:
            return
        roots = [t.uop for t in todo]
        bufs = realize.realize(roots, fuse_reduce=Tensor.fuse_reduce, opt=realize.default_opt())
        for t, buf in zip(todo, bufs, strict=True):
            t._graph = t.uop if t.requires_grad and not t._leaf else None
            t.uop = buf.reshape(t.shape)  # drop the graph: its intermediates can be freed

    # ---------------------------------------------------------------- autodiff (uopc/autodiff.py)

    def backward(self, params: list[Tensor] | None = None) -> None:
        """Accumulate d(self)/d(p) into p.grad for `params`, or for every requires-grad tensor self depends on."""
        from uopc import autodiff

        autodiff.backward(self, params)

    def gradient(self, *targets: Tensor) -> list[Tensor]:
        """The gradients of scalar self with respect to `targets` (tinygrad's form; .grad is not touched)."""
        from uopc import autodiff

        return autodiff.gradient(self, list(targets))

    def numpy(self) -> np.ndarray:
        """A fresh NumPy copy of the data (realizes)."""
        if self.numel() == 0:
            return np.zeros(self.shape, self.dtype.np)
        self.realize()
        return buffer_data(base_buffer(self.uop)).reshape(self.shape).copy()

    def item(self) -> Scalar:
        """The value of a one-element tensor as a Python scalar."""
        if self.numel() != 1:
            raise ValueError(f"only a one-element tensor can be converted to a Python scalar, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        """The data as (nested) Python lists."""
        return self.numpy().tolist()

    def contiguous(self) -> Tensor:
        """Ask for a materialization point: the kernelizer will write this into a temp buffer."""
        return self._new(UOp(Ops.STAGE, (self.uop,)))

    def detach(self) -> Tensor:
        """The same values with gradients stopped (a STAGE("detach") that execution ignores)."""
        return Tensor(UOp(Ops.STAGE, (self.uop,), "detach"))

    def assign(self, x: Any) -> Tensor:
        """Rebind this tensor to x's graph (lazily): x must broadcast to self's shape and have self's dtype."""
        if not isinstance(x, Tensor):
            x = Tensor(x, dtype=self.dtype) if not _is_scalar(x) else self.full_like(x)
        if x.dtype is not self.dtype:
            raise TypeError(f"assign: dtype {x.dtype!r} does not match the tensor's {self.dtype!r}")
        if broadcast_shape(self.shape, x.shape) != self.shape:
            raise ValueError(f"assign: shape {x.shape} cannot be broadcast to the tensor's shape {self.shape}")
        self.uop = x._broadcast_to(self.shape, keep_const=False).uop
        self._graph, self._leaf = None, True
        return self

    # ---------------------------------------------------------------- dtypes

    def cast(self, dtype: Any) -> Tensor:
        """Convert elements to `dtype` (float -> int truncates, as C)."""
        dt = to_dtype(dtype)
        return self if dt is self.dtype else self._new(self.uop.cast(dt))

    def float(self) -> Tensor:
        """Cast to float32."""
        return self.cast(dtypes.float32)

    def half(self) -> Tensor:
        """Cast to float16."""
        return self.cast(dtypes.float16)

    def double(self) -> Tensor:
        """Cast to float64."""
        return self.cast(dtypes.float64)

    def int(self) -> Tensor:
        """Cast to int32."""
        return self.cast(dtypes.int32)

    def long(self) -> Tensor:
        """Cast to int64."""
        return self.cast(dtypes.int64)

    def bool(self) -> Tensor:
        """Cast to bool (nonzero is True)."""
        return self.cast(dtypes.bool)

    def _to_float(self) -> Tensor:
        """Float-only ops cast ints and bools to the default float first, as PyTorch does."""
        return self.cast(least_upper_float(self.dtype))

    # ---------------------------------------------------------------- broadcasting binary ops

    def _const(self, value: Scalar, dtype: DType | None = None) -> Tensor:
        """A shape-() constant; the ALU op broadcasts it, so it needs no EXPAND."""
        dt = dtype or self.dtype
        # an int constant wraps to its dtype (int8 + 1000 adds -24), as a C store would
        return Tensor(UOp.const(truncate(dt, value) if dt.is_int else value, dt))

    def _broadcast_to(self, shape: tuple[int, ...], keep_const: bool = True) -> Tensor:
        if self.shape == shape or (keep_const and self.uop.op is Ops.CONST):
            return self
        return self.reshape((1,) * (len(shape) - self.ndim) + self.shape).expand(shape)

    def _operands(self, other: Any, reverse: bool = False) -> tuple[Tensor, Tensor]:
        """(self, other) with one dtype (PyTorch promotion) and one broadcast shape; swapped if reverse."""
        if isinstance(other, Tensor):
            dt = promote(self.dtype, other.dtype)
        elif _is_scalar(other):
            other = other.item() if isinstance(other, np.generic) else other
            dt = _scalar_dtype(self.dtype, other)
            other = self._const(other, dt)
        else:
            other = Tensor(other)
            dt = promote(self.dtype, other.dtype)
        shape = broadcast_shape(self.shape, other.shape)
        a, b = self.cast(dt)._broadcast_to(shape), other.cast(dt)._broadcast_to(shape)
        return (b, a) if reverse else (a, b)

    def _alu(self, op: Ops, *others: Tensor) -> Tensor:
        return self._new(self.uop.alu(op, *(o.uop for o in others)), *others)

    def _binop(self, op: Ops, other: Any, reverse: bool = False) -> Tensor:
        a, b = self._operands(other, reverse)
        return a._alu(op, b)

    def add(self, other: Any, reverse: bool = False) -> Tensor:
        """a + b with broadcasting and PyTorch promotion (b + a if reverse)."""
        return self._binop(Ops.ADD, other, reverse)

    def mul(self, other: Any, reverse: bool = False) -> Tensor:
        """a * b with broadcasting and PyTorch promotion."""
        return self._binop(Ops.MUL, other, reverse)

    def neg(self) -> Tensor:
        """-x, spelled x * -1 (the IR's NEG is left to the backends)."""
        if self.dtype.is_bool:
            raise TypeError("negation (-) of a bool tensor is not supported; use logical_not() or ~")
        if self.uop.op is Ops.CONST:  # fold here so `x - 1` reads x + -1, not x + 1 * -1
            return self._const(-self.uop.arg)
        return self * -1

    def sub(self, other: Any, reverse: bool = False) -> Tensor:
        """a - b, spelled a + (-b)."""
        a, b = self._operands(other, reverse)
        return a + b.neg()

    def reciprocal(self) -> Tensor:
        """1 / x (ints become float32)."""
        x = self._to_float()
        if x.uop.op is Ops.CONST:  # a constant divisor folds to one multiply: x / 4 == x * 0.25
            v = x.uop.arg
            return x._const(1.0 / v if v != 0 else math.copysign(math.inf, v))
        return x._alu(Ops.RECIP)

    def div(self, other: Any, reverse: bool = False) -> Tensor:
        """True division: ints give float32, as Python's `/`."""
        a, b = self._operands(other, reverse)
        dt = least_upper_float(a.dtype)
        return a.cast(dt) * b.cast(dt).reciprocal()

    def floordiv(self, other: Any, reverse: bool = False) -> Tensor:
        """Floor division (Python semantics; an integer x // 0 is 0)."""
        a, b = self._operands(other, reverse)
        if a.dtype.is_bool:
            raise TypeError("floor division (//) of bool tensors is not supported")
        return a._alu(Ops.IDIV, b) if a.dtype.is_int else (a / b).floor()

    def mod(self, other: Any, reverse: bool = False) -> Tensor:
        """Remainder with the sign of the divisor (Python semantics; an integer x % 0 is 0)."""
        a, b = self._operands(other, reverse)
        if a.dtype.is_bool:
            raise TypeError("remainder (%) of bool tensors is not supported")
        return a._alu(Ops.MOD, b) if a.dtype.is_int else a - (a / b).floor() * b

    def __add__(self, x: Any) -> Tensor:
        return self.add(x)

    def __radd__(self, x: Any) -> Tensor:
        return self.add(x, True)

    def __sub__(self, x: Any) -> Tensor:
        return self.sub(x)

    def __rsub__(self, x: Any) -> Tensor:
        return self.sub(x, True)

    def __mul__(self, x: Any) -> Tensor:
        return self.mul(x)

    def __rmul__(self, x: Any) -> Tensor:
        return self.mul(x, True)

    def __truediv__(self, x: Any) -> Tensor:
        return self.div(x)

    def __rtruediv__(self, x: Any) -> Tensor:
        return self.div(x, True)

    def __floordiv__(self, x: Any) -> Tensor:
        return self.floordiv(x)

    def __rfloordiv__(self, x: Any) -> Tensor:
        return self.floordiv(x, True)

    def __mod__(self, x: Any) -> Tensor:
        return self.mod(x)

    def __rmod__(self, x: Any) -> Tensor:
        return self.mod(x, True)

    def __pow__(self, x: Any) -> Tensor:
        return self.pow(x)

    def __rpow__(self, x: Any) -> Tensor:
        return self.pow(x, True)

    def __neg__(self) -> Tensor:
        return self.neg()

    def __matmul__(self, x: Any) -> Tensor:
        return self.matmul(x)

    def __rmatmul__(self, x: Any) -> Tensor:
        return Tensor(x).matmul(self) if not isinstance(x, Tensor) else x.matmul(self)

    # ---------------------------------------------------------------- comparisons and logic (results are bool)

    def __lt__(self, x: Any) -> Tensor:
        return self._binop(Ops.CMPLT, x)

    def __gt__(self, x: Any) -> Tensor:
        return self._binop(Ops.CMPLT, x, reverse=True)

    def __le__(self, x: Any) -> Tensor:
        a, b = self._operands(x)
        # NOT(b < a) would make NaN <= 1 True: floats need the longer, NaN-correct form
        return (a < b) | (a == b) if a.dtype.is_float else (b < a).logical_not()

    def __ge__(self, x: Any) -> Tensor:
        a, b = self._operands(x)
        return b <= a

    def __eq__(self, x: Any) -> Tensor:  # type: ignore[override]
        return (self != x).logical_not()

    def __ne__(self, x: Any) -> Tensor:  # type: ignore[override]
        return self._binop(Ops.CMPNE, x)

    def _bitwise(self, op: Ops, other: Any, reverse: bool = False) -> Tensor:
        a, b = self._operands(other, reverse)
        if a.dtype.is_float:
            raise TypeError(f"bitwise {op.name.lower()} needs bool or int tensors, got {a.dtype!r}")
        return a._alu(op, b)

    def __and__(self, x: Any) -> Tensor:
        return self._bitwise(Ops.AND, x)

    def __rand__(self, x: Any) -> Tensor:
        return self._bitwise(Ops.AND, x, True)

    def __or__(self, x: Any) -> Tensor:
        return self._bitwise(Ops.OR, x)

    def __ror__(self, x: Any) -> Tensor:
        return self._bitwise(Ops.OR, x, True)

    def __xor__(self, x: Any) -> Tensor:
        return self._bitwise(Ops.XOR, x)

    def __rxor__(self, x: Any) -> Tensor:
        return self._bitwise(Ops.XOR, x, True)

    def __invert__(self) -> Tensor:
        """Logical NOT of a bool tensor, bitwise NOT of an int tensor (both an XOR)."""
        if self.dtype.is_float:
            raise TypeError(f"~ needs a bool or int tensor, got {self.dtype!r}")
        # _const wraps -1 to the dtype's own width (255 for uint8): an unsigned -1u would be 32 bits wide
        return self._alu(Ops.XOR, self._const(True if self.dtype.is_bool else -1))

    def logical_not(self) -> Tensor:
        """True where x is zero (False)."""
        return ~self if self.dtype.is_bool else self == 0

    def where(self, x: Any, y: Any) -> Tensor:
        """Elementwise `x if self else y`, broadcasting all three (also callable as Tensor.where(cond, x, y))."""
        cond = self.cast(dtypes.bool)
        x = Tensor(x) if not isinstance(x, Tensor) and not _is_scalar(x) else x
        y = Tensor(y) if not isinstance(y, Tensor) and not _is_scalar(y) else y
        if isinstance(x, Tensor) and isinstance(y, Tensor):
            dt = promote(x.dtype, y.dtype)
        elif isinstance(x, Tensor) or isinstance(y, Tensor):
            t, s = (x, y) if isinstance(x, Tensor) else (y, x)
            dt = _scalar_dtype(t.dtype, s)
        else:
            dt = _scalar_dtype(dtypes.from_py(x), y)
        x, y = (v.cast(dt) if isinstance(v, Tensor) else self._const(v, dt) for v in (x, y))
        shape = broadcast_shape(cond.shape, x.shape, y.shape)
        cond, x, y = (v._broadcast_to(shape) for v in (cond, x, y))
        return cond._alu(Ops.WHERE, x, y)

    # ---------------------------------------------------------------- elementwise math

    def maximum(self, x: Any) -> Tensor:
        """Elementwise max (NaN-propagating)."""
        return self._binop(Ops.MAX, x)

    def minimum(self, x: Any) -> Tensor:
        """Elementwise min: -max(-a, -b) for floats (keeps NaN propagation), a select for ints and bools."""
        a, b = self._operands(x)
        return -((-a).maximum(-b)) if a.dtype.is_float else (a < b).where(a, b)

    def clip(self, min: Any = None, max: Any = None) -> Tensor:
        """Limit values to [min, max]; either bound may be None."""
        if min is None and max is None:
            raise ValueError("clip needs at least one of min and max")
        x = self if min is None else self.maximum(min)
        return x if max is None else x.minimum(max)

    clamp = clip

    def abs(self) -> Tensor:
        """|x| as a select, so NaN stays NaN and the gradient is a clean sign."""
        if self.dtype.is_bool or self.dtype.is_unsigned:
            return self
        return (self < 0).where(-self, self)

    def sign(self) -> Tensor:
        """-1, 0 or 1 (in self's dtype)."""
        return (self < 0).where(-1, (0 < self).where(1, 0)).cast(self.dtype)

    def square(self) -> Tensor:
        """x * x."""
        return self * self

    def sqrt(self) -> Tensor:
        """Square root (ints become float32)."""
        return self._to_float()._alu(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        """1 / sqrt(x)."""
        return self.sqrt().reciprocal()

    def exp2(self) -> Tensor:
        """2 ** x."""
        return self._to_float()._alu(Ops.EXP2)

    def log2(self) -> Tensor:
        """Base-2 logarithm."""
        return self._to_float()._alu(Ops.LOG2)

    def exp(self) -> Tensor:
        """e^x, the IR's way: exp2(x * log2(e))."""
        return (self._to_float() * (1 / math.log(2))).exp2()

    def log(self) -> Tensor:
        """ln x = log2(x) * ln(2)."""
        return self.log2() * math.log(2)

    def sin(self) -> Tensor:
        """Sine (radians)."""
        return self._to_float()._alu(Ops.SIN)

    def cos(self) -> Tensor:
        """cos x = sin(pi/2 - x)."""
        return (math.pi / 2 - self._to_float()).sin()

    def tan(self) -> Tensor:
        """sin / cos."""
        return self.sin() / self.cos()

    def trunc(self) -> Tensor:
        """Round toward zero (identity for ints)."""
        return self if not self.dtype.is_float else self._alu(Ops.TRUNC)

    def floor(self) -> Tensor:
        """Round down: trunc, minus one where trunc rounded a negative value up."""
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (self < t).where(t - 1, t)

    def ceil(self) -> Tensor:
        """Round up: trunc, plus one where trunc rounded a positive value down."""
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (t < self).where(t + 1, t)

    def sigmoid(self) -> Tensor:
        """1 / (1 + e^-x): saturates cleanly to 0 and 1 (exp overflow gives 1/inf = 0)."""
        return (1 + (-self._to_float()).exp()).reciprocal()

    def tanh(self) -> Tensor:
        """tanh x = 2 sigmoid(2x) - 1."""
        return 2 * (2 * self._to_float()).sigmoid() - 1

    def relu(self) -> Tensor:
        # NOTE: not maximum(x, 0): its gradient at 0 would be split between the operands
        return (0 < self).where(self, 0)

    def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
        """x where x > 0, else neg_slope * x."""
        return (0 < self).where(self, self * neg_slope)

    def gelu(self) -> Tensor:
        """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
        x = self._to_float()
        return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())

    def silu(self) -> Tensor:
        """x * sigmoid(x) (also called swish)."""
        return self * self.sigmoid()

    def softplus(self) -> Tensor:
        """log(1 + e^x), computed as relu(x) + log(1 + e^-|x|) so large x does not overflow."""
        return self.relu() + (1 + (-self.abs()).exp()).log()

    def pow(self, exponent: Any, reverse: bool = False) -> Tensor:
        """self ** exponent (or exponent ** self if reverse); small integer powers are exact multiplies."""
        if reverse:
            return _rpow(self, exponent)
        if isinstance(exponent, Tensor) or not _is_scalar(exponent):
            base, e = self._operands(exponent)
            return _pow_tensor(base, e)
        e = exponent.item() if isinstance(exponent, np.generic) else exponent
        x = self.cast(_scalar_dtype(self.dtype, e))
        if float(e).is_integer() and (not x.dtype.is_float or abs(e) <= 8):
            return _int_pow(x, int(e))
        if e == 0.5:
            return x.sqrt()
        if e == -0.5:
            return x.rsqrt()
        return _pow_general(x, x._const(e))

    # ---------------------------------------------------------------- reductions

    def _axes(self, axis: Axis) -> tuple[int, ...]:
        """Reduced axes as sorted non-negative ints (a 0-d tensor has none)."""
        if axis is None:
            return tuple(range(self.ndim))
        axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
        norm = [norm_dim(a, self.ndim) for a in axes]
        if len(set(norm)) != len(norm):
            raise ValueError(f"axis {axis} names a dim more than once (shape {self.shape})")
        return tuple(sorted(norm)) if self.ndim else ()

    def _reduced_shape(self, axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
        if keepdim:
            return tuple(1 if i in axes else s for i, s in enumerate(self.shape))
        return tuple(s for i, s in enumerate(self.shape) if i not in axes)

    def _reduce(self, op: Ops, axis: Axis, keepdim: bool) -> Tensor:
        """Reduce `axis` with ADD or MAX: permute the reduced axes last, then REDUCE the last n."""
        axes = self._axes(axis)
        kept = tuple(i for i in range(self.ndim) if i not in axes)
        out_shape = self._reduced_shape(axes, keepdim)
        if not axes:
            return self
        if prod(self.shape[i] for i in axes) == 0 or prod(out_shape) == 0:
            if op is Ops.MAX and prod(out_shape) > 0:
                raise RuntimeError(
                    f"max/min/argmax over axis {axis} of shape {self.shape}: "
                    "the reduced dims have size 0 and max has no identity"
                )
            return self._new(_full_uop(identity_element(op, self.dtype), self.dtype, out_shape))
        if axis is None:  # everything: flatten to one axis first
            return self._new(self.reshape(-1).uop.reduce(op, 1)).reshape(out_shape)
        x = self.permute(*kept, *axes)
        return x._new(x.uop.reduce(op, len(axes))).reshape(out_shape)

    def sum(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """Sum over `axis` (all if None); bool and small ints give int32 (PyTorch: int64), half accumulates in float."""
        if self.dtype.is_bool or (self.dtype.is_int and self.dtype.itemsize < 4):
            return self.cast(dtypes.default_int)._reduce(Ops.ADD, axis, keepdim)
        if self.dtype is dtypes.float16:
            return self.float()._reduce(Ops.ADD, axis, keepdim).half()
        return self._reduce(Ops.ADD, axis, keepdim)

    def max(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The largest values over `axis` (values only; NaN-propagating)."""
        return self._reduce(Ops.MAX, axis, keepdim)

    def _order_flip(self) -> Tensor:
        """An order-reversing involution: -x for floats, ~x for ints and bools (which cannot overflow at INT_MIN)."""
        return -self if self.dtype.is_float else ~self

    def min(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The smallest values over `axis`: -max(-x) for floats."""
        return self._order_flip().max(axis, keepdim)._order_flip()

    def _count(self, axis: Axis) -> int:
        return prod(self.shape[i] for i in self._axes(axis))

    def mean(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """sum * (1/n); ints give float32, an empty reduction NaN."""
        n = self._count(axis)
        return self._to_float().sum(axis, keepdim) * (1 / n if n else math.nan)

    def var(self, axis: Axis = None, keepdim: bool = False, correction: int = 1) -> Tensor:
        """Variance with PyTorch's `correction` (1: unbiased): sum((x - mean)^2) / (n - correction)."""
        x = self._to_float()
        d = max(0, self._count(axis) - correction)
        return (x - x.mean(axis, keepdim=True)).square().sum(axis, keepdim) * (1 / d if d else math.inf)

    def std(self, axis: Axis = None, keepdim: bool = False, correction: int = 1) -> Tensor:
        """sqrt(var)."""
        return self.var(axis, keepdim, correction).sqrt()

    def prod(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """Product over `axis`, as exp(sum(log|x|)) with the sign and zeros fixed up (floats only, approximate)."""
        x = self._to_float()
        mag = x.abs().log().sum(axis, keepdim).exp()
        negs = (x < 0).sum(axis, keepdim)
        return ((negs % 2) == 1).where(-mag, mag)

    def argmax(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """Index (int32) of the first largest value over `axis` (flattened if None); a NaN counts as the largest."""
        if axis is None:
            out = self.reshape(-1).argmax(0) if self.ndim else self.full_like(0, dtypes.int32)
            return out.reshape((1,) * self.ndim) if keepdim else out
        ax = norm_dim(axis, self.ndim)
        if not self.ndim:
            return self.full_like(0, dtypes.int32)
        n = self.shape[ax]
        hit = self == self.max(ax, keepdim=True)
        if self.dtype.is_float:  # max propagates NaN, and NaN == NaN is False: match the NaNs themselves
            hit = hit | (self != self)
        # weight n for index 0 down to 1 for the last: the largest weight among hits is the first hit
        rev = Tensor.arange(n, 0, -1).reshape((n,) + (1,) * (self.ndim - ax - 1))
        return n - hit.where(rev, 0).max(ax, keepdim)

    def argmin(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """Index of the first smallest value over `axis`."""
        return self._order_flip().argmax(axis, keepdim)

    def softmax(self, axis: int = -1) -> Tensor:
        """exp(x - max) / sum(exp(x - max)): three kernels (max, sum, elementwise)."""
        x = self._to_float()
        e = (x - x.max(axis, keepdim=True)).exp()
        return e / e.sum(axis, keepdim=True)

    def log_softmax(self, axis: int = -1) -> Tensor:
        """x - max - log(sum(exp(x - max))): no overflow for large x."""
        x = self._to_float()
        s = x - x.max(axis, keepdim=True)
        return s - s.exp().sum(axis, keepdim=True).log()

    def logsumexp(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """log(sum(exp(x))) over `axis`, shifted by the max so it does not overflow."""
        x = self._to_float()
        m = x.max(axis, keepdim=True)
        m = (m.abs() == math.inf).where(0, m)  # an all -inf (or +inf) row: inf - inf would be NaN, shift by 0 instead
        out = (x - m).exp().sum(axis, keepdim=True).log() + m
        return out if keepdim else out.reshape(x._reduced_shape(x._axes(axis), False))

    # ---------------------------------------------------------------- matmul

    def matmul(self, other: Any) -> Tensor:
        """Matrix product with NumPy's rules (1-D operands, broadcast batch dims); the reduce axis is last."""
        other = other if isinstance(other, Tensor) else Tensor(other)
        a, b = self, other
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError(f"both arguments to matmul need to be at least 1-D, got shapes {a.shape} and {b.shape}")
        k_a, k_b = a.shape[-1], b.shape[-2] if b.ndim > 1 else b.shape[0]
        if k_a != k_b:
            raise ValueError(
                f"mat1 and mat2 shapes cannot be multiplied "
                f"({'x'.join(map(str, a.shape))} and {'x'.join(map(str, b.shape))})"
            )
        dt = promote(a.dtype, b.dtype)
        a2 = a.cast(dt).reshape(1, k_a) if a.ndim == 1 else a.cast(dt)
        b2 = b.cast(dt).reshape(k_b, 1) if b.ndim == 1 else b.cast(dt)
        try:
            batch = broadcast_shape(a2.shape[:-2], b2.shape[:-2])
        except ValueError:
            raise ValueError(f"matmul: the batch dims of shapes {a.shape} and {b.shape} cannot be broadcast") from None
        (n, k), m = a2.shape[-2:], b2.shape[-1]
        ae = a2.reshape(*a2.shape[:-2], n, 1, k)._broadcast_to((*batch, n, m, k))
        bt = b2.transpose(-1, -2)
        be = bt.reshape(*bt.shape[:-2], 1, m, k)._broadcast_to((*batch, n, m, k))
        out = (ae * be)._reduce(Ops.ADD, -1, keepdim=False)  # raw ADD: int8 @ int8 stays int8, as PyTorch
        if a.ndim == 1:
            out = out.squeeze(-2)
        return out.squeeze(-1) if b.ndim == 1 else out

    dot = matmul

    # ---------------------------------------------------------------- movement

    def reshape(self, *shape: Any) -> Tensor:
        """Same data, new shape; one dim may be -1 (inferred)."""
        shape = tensor_index.reshape_shape(self.shape, _varargs(shape))
        return self if shape == self.shape else self._new(self.uop.reshape(shape))

    view = reshape

    def permute(self, *order: Any) -> Tensor:
        """Reorder dims: out.shape[i] = self.shape[order[i]]."""
        order = tensor_index.permute_order(self.shape, _varargs(order))
        return self._new(self.uop.permute(order)) if order != tuple(range(self.ndim)) else self

    def transpose(self, dim0: int = -2, dim1: int = -1) -> Tensor:
        """Swap two dims; by default the last two (for a matrix that is (1, 0); batched `a @ b.transpose()` works)."""
        a, b = norm_dim(dim0, self.ndim), norm_dim(dim1, self.ndim)
        order = list(range(self.ndim))
        if self.ndim:
            order[a], order[b] = order[b], order[a]
        return self.permute(*order)

    def expand(self, *shape: Any) -> Tensor:
        """Broadcast size-1 dims (and new leading dims) to `shape`; -1 keeps a dim."""
        shape = tensor_index.expand_shape(self.shape, _varargs(shape))
        x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape)
        return x if shape == x.shape else x._new(x.uop.expand(shape))

    def pad(self, padding: Sequence, value: float = 0.0) -> Tensor:
        """Pad with `value` (±inf too): ((before, after) or None) per dim, or PyTorch's flat form; negative pads cut."""
        return tensor_index.pad(self, padding, value)

    def shrink(self, bounds: Sequence) -> Tensor:
        """Keep [lo, hi) of each dim; None keeps a dim whole."""
        b = tensor_index.shrink_bounds(self.shape, bounds)
        return self._new(self.uop.shrink(b)) if b != tuple((0, s) for s in self.shape) else self

    def flip(self, *axis: Any) -> Tensor:
        """Reverse the order along `axis` (an int or a tuple of ints)."""
        axes = tuple(norm_dim(a, self.ndim) for a in _varargs(axis))
        return self._new(self.uop.flip(axes)) if self.ndim else self

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Tensor:
        """Drop size-1 dims (all, or those in `dim`; a named dim that is not 1 is kept, as PyTorch)."""
        dims = range(self.ndim) if dim is None else self._axes(dim)
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if not (i in dims and s == 1)))

    def unsqueeze(self, dim: int) -> Tensor:
        """Insert a size-1 dim at `dim` (in range [-ndim-1, ndim])."""
        d = norm_dim(dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Merge dims start_dim..end_dim (inclusive) into one."""
        if not self.ndim:
            return self.reshape(1)
        s, e = norm_dim(start_dim, self.ndim), norm_dim(end_dim, self.ndim)
        if s > e:
            raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} (shape {self.shape})")
        return self.reshape(self.shape[:s] + (prod(self.shape[s : e + 1]),) + self.shape[e + 1 :])

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
        """Split dim `dim` into `sizes`."""
        d = norm_dim(dim, self.ndim)
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1 :])

    def repeat(self, *repeats: Any) -> Tensor:
        """Tile the tensor `repeats[i]` times along dim i (new leading dims allowed), as PyTorch."""
        return tensor_index.repeat(self, _shape_arg(repeats))

    def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        """Pieces along `dim`: of `sizes` each (the last may be smaller), or of the listed sizes."""
        return tensor_index.split(self, sizes, dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        """`chunks` nearly equal pieces along `dim`."""
        if chunks <= 0:
            raise ValueError(f"chunk expects a positive number of chunks, got {chunks}")
        size = self.shape[norm_dim(dim, self.ndim)]
        return self.split(max(1, -(-size // chunks)), dim)

    def __getitem__(self, index: Any) -> Tensor:
        """Basic indexing (ints, slices with any step, None, ...) and one int-Tensor gather; views only."""
        return tensor_index.getitem(self, index)

    def cat(*tensors: Any, dim: int = 0) -> Tensor:
        """Concatenate along `dim`: Tensor.cat(a, b), Tensor.cat([a, b], 1), a.cat(b, dim=1). One fused kernel."""
        return tensor_index.cat(*tensor_index.tensor_args(tensors, dim))

    def stack(*tensors: Any, dim: int = 0) -> Tensor:
        """Stack equal-shaped tensors along a new dim: Tensor.stack([a, b], 1), Tensor.stack(a, b, dim=1)."""
        return tensor_index.stack(*tensor_index.tensor_args(tensors, dim))

    # ---------------------------------------------------------------- losses

    def one_hot(self, num_classes: int) -> Tensor:
        """int32 one-hot vectors (a new last dim of num_classes), via arange(C) == self."""
        return (Tensor.arange(num_classes) == self.unsqueeze(-1)).cast(dtypes.int32)

    def cross_entropy(
        self, target: Tensor, reduction: str = "mean", label_smoothing: float = 0.0, ignore_index: int = -100
    ) -> Tensor:
        """PyTorch's cross_entropy on logits with the class dim 1 (or 0 for a 1-D input).

        `target` is class indices (int, the input's shape without the class dim) or probabilities (float, same shape).
        """
        if self.ndim == 0:
            raise ValueError("cross_entropy needs logits with a class dim, got a 0-d tensor")
        cdim = 1 if self.ndim > 1 else 0
        target = target if isinstance(target, Tensor) else Tensor(target)
        return _cross_entropy(self, target, cdim, reduction, label_smoothing, ignore_index)

    def sparse_categorical_crossentropy(
        self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0, reduction: str = "mean"
    ) -> Tensor:
        """tinygrad's loss: class dim last, Y int class indices; entries equal to ignore_index count for nothing."""
        if self.ndim == 0:
            raise ValueError("sparse_categorical_crossentropy needs logits with a class dim, got a 0-d tensor")
        Y = Y if isinstance(Y, Tensor) else Tensor(Y)
        return _cross_entropy(self, Y, self.ndim - 1, reduction, label_smoothing, ignore_index)


# ---------------------------------------------------------------- pow and cross-entropy helpers


def _int_pow(x: Tensor, n: int) -> Tensor:
    """x ** n for an integer n by square-and-multiply: exact for ints, and correct for negative float bases."""
    if n < 0:
        if not x.dtype.is_float:
            raise ValueError(f"integers to negative integer powers are not allowed (dtype {x.dtype!r}, power {n})")
        return _int_pow(x, -n).reciprocal()
    out, sq = None, x
    while n:
        if n & 1:
            out = sq if out is None else out * sq
        n >>= 1
        if n:
            sq = sq * sq
    return out if out is not None else x.ones_like()


def _pow_general(x: Tensor, y: Tensor) -> Tensor:
    """x ** y = exp2(y * log2|x|), with the sign of a negative base fixed up for integer y (NaN otherwise)."""
    mag = (y * x.abs().log2()).exp2()
    if y.uop.op is Ops.CONST:  # a scalar exponent: decide integer/odd in Python
        e = y.uop.arg
        if not float(e).is_integer():
            return (x < 0).where(math.nan, mag)
        return (x < 0).where(-mag, mag) if int(e) % 2 else mag
    is_int = y.trunc() == y
    odd = (y * 0.5).trunc() != y * 0.5
    neg = is_int.where(odd.where(-mag, mag), math.nan)
    return (y == 0).where(1, (x < 0).where(neg, mag))  # 0 ** 0 == nan ** 0 == 1


def _pow_tensor(x: Tensor, y: Tensor) -> Tensor:
    """Elementwise x ** y of two same-dtype tensors; ints go through float64 and round back."""
    if x.dtype.is_float:
        return _pow_general(x, y)
    r = _pow_general(x.double(), y.double())
    return (r < 0).where(r - 0.5, r + 0.5).trunc().cast(x.dtype)


def _rpow(x: Tensor, base: Any) -> Tensor:
    """base ** x for a scalar or tensor base."""
    if isinstance(base, Tensor) or not _is_scalar(base):
        b, e = x._operands(base, reverse=True)
        return _pow_tensor(b, e)
    b = base.item() if isinstance(base, np.generic) else base
    dt = _scalar_dtype(x.dtype, b)
    if dt.is_float and b > 0:  # the common case, e.g. 2 ** x = exp2(x)
        xf = x.cast(dt)
        return (xf if b == 2 else xf * math.log2(b)).exp2()
    return _pow_tensor(x._const(b, dt), x.cast(dt))


def _cross_entropy(x: Tensor, target: Tensor, cdim: int, reduction: str, smoothing: float, ignore: int) -> Tensor:
    """Mean/sum/none of -sum_c q_c log_softmax(x)_c, where q is the (smoothed) target distribution."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {smoothing}")
    n_cls = x.shape[cdim]
    logp = x.log_softmax(cdim)
    if target.dtype.is_float:  # class probabilities
        if target.shape != x.shape:
            raise ValueError(f"probability targets must have the input's shape: input {x.shape}, target {target.shape}")
        q = target * (1 - smoothing) + smoothing / n_cls if smoothing else target
        loss = -(logp * q).sum(cdim)
        return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss
    if target.dtype.is_bool:
        raise TypeError(f"class-index targets must be an int tensor, got {target.dtype!r}")
    expected = x.shape[:cdim] + x.shape[cdim + 1 :]
    if target.shape != expected:
        raise ValueError(
            f"class-index targets must have the input's shape without the class dim {cdim}: "
            f"input {x.shape}, target {target.shape}, expected {expected}"
        )
    cls = Tensor.arange(n_cls).reshape((n_cls,) + (1,) * (x.ndim - cdim - 1))
    hit = cls == target.unsqueeze(cdim)  # the one-hot mask, broadcast against logp
    loss = -hit.where(logp, 0).sum(cdim)  # a select, not a multiply: -inf * 0 would be NaN
    if smoothing:
        loss = loss * (1 - smoothing) - logp.mean(cdim) * smoothing
    keep = target != ignore
    loss = keep.where(loss, 0)
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / keep.sum()

"""Making tensors: from host data, lazy constants (a CONST broadcast, no buffer), ranges, and random samples.

    >>> Tensor.full((2, 3), 7.0).uop          # CONST 7.0 -> RESHAPE (1, 1) -> EXPAND (2, 3): nothing allocated
    >>> Tensor.arange(4).tolist()
    [0, 1, 2, 3]

Random samples are generated in the graph (random.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Self

import numpy as np

from uopc.tensor.shape import Scalar, is_scalar, shape_arg
from uopc.uop import UOp
from uopc.uop.dtype import DType, dtypes, float_to_bf16_bits, to_dtype


def full_uop(value: Scalar, dtype: DType, shape: tuple[int, ...]) -> UOp:
    """A lazy constant: one CONST reshaped and expanded, never a host buffer."""
    return UOp.const(value, dtype).reshape((1,) * len(shape)).expand(shape)


def host_array(data: Any, dtype: DType | None) -> tuple[np.ndarray, DType]:
    """`data` as a fresh NumPy array of a supported dtype, inferred as PyTorch does (float -> float32, int -> int32)."""
    if isinstance(data, (np.ndarray, np.generic)):
        arr = np.asarray(data)
        src = dtypes.from_np(arr.dtype)  # TypeError for complex, object, strings...
    elif is_scalar(data) or isinstance(data, (list, tuple, range)):
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
    if dt is dtypes.bfloat16:  # stored as bit patterns, rounded to nearest even
        return float_to_bf16_bits(arr.astype(np.float32)), dt
    return arr.astype(dt.np), dt  # astype copies: the tensor never aliases the caller's array


class CreationMixin:
    """Tensor constructors (class methods) and the *_like family; results are built with `cls(...)`."""

    @classmethod
    def full(
        cls, shape: int | Sequence[int], fill_value: Scalar, dtype: Any = None, requires_grad: bool | None = None
    ) -> Self:
        """A lazy constant tensor (a CONST broadcast to `shape`)."""
        shape = shape_arg((shape,) if isinstance(shape, (int, np.integer)) else tuple(shape))
        dt = dtypes.from_py(fill_value) if dtype is None else to_dtype(dtype)
        return cls(full_uop(fill_value, dt, shape), requires_grad=requires_grad)

    @classmethod
    def zeros(cls, *shape: Any, dtype: Any = None, requires_grad: bool | None = None) -> Self:
        """A lazy tensor of zeros (float32 unless `dtype`)."""
        return cls.full(shape_arg(shape), 0.0, dtype or dtypes.default_float, requires_grad)

    @classmethod
    def ones(cls, *shape: Any, dtype: Any = None, requires_grad: bool | None = None) -> Self:
        """A lazy tensor of ones (float32 unless `dtype`)."""
        return cls.full(shape_arg(shape), 1.0, dtype or dtypes.default_float, requires_grad)

    @classmethod
    def empty(cls, *shape: Any, dtype: Any = None, requires_grad: bool | None = None) -> Self:
        """Uninitialized memory is not a thing in a lazy library: this is zeros()."""
        return cls.zeros(*shape, dtype=dtype, requires_grad=requires_grad)

    def full_like(self, fill_value: Scalar, dtype: Any = None) -> Self:
        """A constant tensor with self's shape (and dtype, unless given)."""
        return self.full(self.shape, fill_value, dtype or self.dtype)

    def zeros_like(self, dtype: Any = None) -> Self:
        """Zeros with self's shape and dtype."""
        return self.full_like(0, dtype)

    def ones_like(self, dtype: Any = None) -> Self:
        """Ones with self's shape and dtype."""
        return self.full_like(1, dtype)

    def empty_like(self, dtype: Any = None) -> Self:
        """Same as zeros_like (see empty)."""
        return self.full_like(0, dtype)

    @classmethod
    def arange(cls, start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype: Any = None) -> Self:
        """Evenly spaced values in [start, stop) (int32 if all arguments are ints, else float32)."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError("arange: step must be nonzero")
        all_int = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_int if all_int else dtypes.default_float
        n = max(0, math.ceil((stop - start) / step))
        return cls(start + np.arange(n) * step, dtype=dt)

    @classmethod
    def eye(cls, n: int, m: int | None = None, dtype: Any = None) -> Self:
        """The identity matrix (n, m), built lazily: a 1 followed by k zeros, repeated, then cut to (k, k)."""
        m = n if m is None else m
        k = max(n, m)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if n == 0 or m == 0:
            return cls.zeros(n, m, dtype=dt)
        ones = cls.ones(k, 1, dtype=dt).pad(((0, 0), (0, k)))
        return ones.flatten().shrink(((0, k * k),)).reshape(k, k).shrink(((0, n), (0, m)))

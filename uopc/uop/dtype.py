"""Scalar types: their C names, NumPy dtypes, sizes, and PyTorch-style promotion.

>>> dtypes.f32.cname, dtypes.i32.np, promote(dtypes.i32, dtypes.f16)
('float', dtype('int32'), dtypes.f16)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class DType:
    """A scalar type, or with `count` > 1 a SIMD vector of it (made by `vec`)."""

    name: str
    itemsize: int
    kind: str  # 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float
    cname: str
    count: int = 1

    @property
    def np(self) -> np.dtype:
        return np.dtype(_NP_NAMES[self.name])

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def is_unsigned(self) -> bool:
        return self.kind == "u"

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def is_16bit_float(self) -> bool:
        """float16 or bfloat16 (or a vector of them): storage types, whose values compute in float32
        (uopc.renderer.half)."""
        return self.kind == "f" and self.itemsize == 2 * self.count

    @property
    def min(self) -> float | int | bool:
        if self.is_float:
            return -math.inf
        return False if self.is_bool else int(np.iinfo(self.np).min)

    @property
    def max(self) -> float | int | bool:
        if self.is_float:
            return math.inf
        return True if self.is_bool else int(np.iinfo(self.np).max)

    def __repr__(self) -> str:
        if self.count > 1:
            return f"{self.scalar()!r}.vec({self.count})"
        return f"dtypes.{_SHORT.get(self.name, self.name)}"

    def __reduce__(self):  # pickling/copying keeps the singleton
        if self.count > 1:
            return (DType.vec, (self.scalar(), self.count))
        return (getattr, (dtypes, self.name))

    def vec(self, n: int) -> DType:
        """The SIMD vector of `n` elements of this scalar type (one object per (type, n), so `is` compares them):
        `dtypes.f32.vec(16)` renders as a gcc vector type `f32x16` of 64 bytes."""
        if self.count != 1:
            raise ValueError(f"vec: {self!r} is already a vector; vectors of vectors do not exist")
        if n < 1 or n & (n - 1):
            raise ValueError(f"vec: width {n} must be a power of two >= 1 (gcc vector sizes are)")
        if n == 1:
            return self
        key = (self.name, n)
        if key not in _VECS:
            _VECS[key] = DType(f"{self.name}x{n}", self.itemsize * n, self.kind, f"{_VEC_CNAME[self.name]}x{n}", n)
            _SCALAR[_VECS[key]] = self
        return _VECS[key]

    def scalar(self) -> DType:
        """The element type of a vector (a scalar is its own)."""
        return _SCALAR.get(self, self)


class dtypes:
    """The dtype namespace: dtypes.float32 (alias dtypes.f32), dtypes.int32 (dtypes.i32), ..."""

    bool = DType("bool", 1, "b", "_Bool")
    int8 = DType("int8", 1, "i", "signed char")
    int16 = DType("int16", 2, "i", "short")
    int32 = DType("int32", 4, "i", "int")
    int64 = DType("int64", 8, "i", "long long")
    uint8 = DType("uint8", 1, "u", "unsigned char")
    uint16 = DType("uint16", 2, "u", "unsigned short")
    uint32 = DType("uint32", 4, "u", "unsigned int")
    uint64 = DType("uint64", 8, "u", "unsigned long long")
    # the 16-bit floats are storage only: in C their bits in an unsigned short, converted to and from float32 (the
    # renderer's uopc_f16_ld/st, uopc_bf16_ld/st); uopc.renderer.half computes every op on them in float32
    float16 = DType("float16", 2, "f", "unsigned short")
    float32 = DType("float32", 4, "f", "float")
    float64 = DType("float64", 8, "f", "double")
    bfloat16 = DType("bfloat16", 2, "f", "unsigned short")  # float32's top 16 bits
    bf16 = bfloat16
    # short aliases, as the chapters write them
    i8, i16, i32, i64 = int8, int16, int32, int64
    u8, u16, u32, u64 = uint8, uint16, uint32, uint64
    f16, f32, f64 = float16, float32, float64
    half, float, double, int, long, uchar = float16, float32, float64, int32, int64, uint8
    default_float = float32
    default_int = int32

    @staticmethod
    def all() -> list[DType]:
        return list(_BY_NAME.values())

    @staticmethod
    def from_np(dt) -> DType:
        """The DType of a NumPy dtype (raises TypeError for one uopc does not support)."""
        name = np.dtype(dt).name
        if name not in _BY_NAME:
            raise TypeError(f"unsupported dtype {name!r}; uopc supports {', '.join(_BY_NAME)}")
        return _BY_NAME[name]

    @staticmethod
    def from_py(x) -> DType:
        """The dtype PyTorch gives a Python scalar: bool -> bool, int -> int32, float -> float32."""
        if isinstance(x, (bool, np.bool_)):
            return dtypes.bool
        if isinstance(x, (int, np.integer)):
            return dtypes.int32
        if isinstance(x, (float, np.floating)):
            return dtypes.float32
        raise TypeError(f"cannot make a tensor element from {type(x).__name__} {x!r}")


_NP_NAMES = {n: n for n in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")}
_NP_NAMES.update(float16="float16", float32="float32", float64="float64")
_BY_NAME = {n: getattr(dtypes, n) for n in _NP_NAMES}  # the NumPy-backed dtypes (not bfloat16)
_NP_NAMES["bfloat16"] = "uint16"  # NumPy has no bfloat16: its buffers hold the bit patterns
_VECS: dict[tuple[str, int], DType] = {}
_SCALAR: dict[DType, DType] = {}
# C names of vector types (typedefs the renderer emits): element type and width, f32x16 is 16 floats, f16x16 16 halves
# (OpenCL's float16 for 16 floats would read as the half dtype)
_VEC_CNAME = {"bool": "bool", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64"}
_VEC_CNAME.update(uint8="u8", uint16="u16", uint32="u32", uint64="u64")
_VEC_CNAME.update(float16="f16", bfloat16="bf16", float32="f32", float64="f64")
_SHORT = {"float32": "f32", "float64": "f64", "float16": "f16", "int32": "i32", "int64": "i64", "bfloat16": "bf16"}


def to_dtype(x) -> DType:
    """Accept a DType, a NumPy dtype or type, or a name like 'float32'."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and hasattr(dtypes, x) and isinstance(getattr(dtypes, x), DType):
        return getattr(dtypes, x)
    try:
        return dtypes.from_np(x)
    except TypeError:
        raise
    except Exception:
        raise TypeError(f"not a dtype: {x!r}") from None


def np_dtype(dt: DType) -> np.dtype:
    return dt.np


def promote(a: DType, b: DType) -> DType:
    """The result dtype of a binary op on two tensors, as PyTorch computes it.

    bool < ints < floats; within ints NumPy's lattice (uint8 + int8 -> int16); a float and an int
    give the float; two floats give the wider one.
    """
    if a is b:
        return a
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_float != b.is_float:
        return a if a.is_float else b
    if dtypes.bfloat16 in (a, b):  # as PyTorch: bf16 with f16 gives f32, with a wider float the wider one
        other = b if a is dtypes.bfloat16 else a
        return dtypes.float32 if other is dtypes.float16 else other
    return dtypes.from_np(np.promote_types(a.np, b.np))


def least_upper_float(dt: DType) -> DType:
    """The float dtype an op like sqrt or division produces from `dt` (ints -> default float)."""
    return dt if dt.is_float else dtypes.default_float


def truncate(dt: DType, x):
    """A Python value converted the way a C store of type `dt` would (wraps ints, rounds floats)."""
    if dt.is_bool:
        return bool(x)
    if dt.is_int:
        bits = 8 * dt.itemsize
        v = int(x) & ((1 << bits) - 1)
        return v - (1 << bits) if dt.kind == "i" and v >= 1 << (bits - 1) else v
    if dt is dtypes.bfloat16:
        return float(bf16_bits_to_float(float_to_bf16_bits(np.array([x], np.float32)))[0])
    return float(np.array(x, dtype=dt.np))


def float_scalar_type(dt: DType) -> type:
    """The NumPy scalar type a float dtype's constants fold in (bfloat16: float32, as NumPy has none; uopc.renderer.half
    rounds
    a bfloat16 constant where it is used)."""
    return np.float32 if dt is dtypes.bfloat16 else dt.np.type


def float_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float values as bfloat16 bit patterns (uint16), rounded to nearest even; NaN stays a quiet NaN."""
    f = np.ascontiguousarray(a, np.float32).reshape(np.shape(a))  # (ascontiguousarray makes a 0-d array 1-d)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)
    return np.where(np.isnan(f), (u >> 16).astype(np.uint32) | 0x40, rounded).astype(np.uint16)


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as float32 values (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)

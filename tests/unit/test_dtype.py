"""Tests for uopc.uop.dtype: each dtype's C name, NumPy dtype and size, the short aliases, PyTorch-style promotion and
`truncate`, which converts a Python value the way a C store of the dtype would."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from uopc.uop.dtype import DType, dtypes, least_upper_float, promote, to_dtype, truncate

# name -> (C type, NumPy dtype, itemsize)
TABLE = {
    "bool": ("_Bool", np.bool_, 1),
    "int8": ("signed char", np.int8, 1),
    "int16": ("short", np.int16, 2),
    "int32": ("int", np.int32, 4),
    "int64": ("long long", np.int64, 8),
    "uint8": ("unsigned char", np.uint8, 1),
    "uint16": ("unsigned short", np.uint16, 2),
    "uint32": ("unsigned int", np.uint32, 4),
    "uint64": ("unsigned long long", np.uint64, 8),
    "float16": ("unsigned short", np.float16, 2),  # its bits (uopc/half.py: storage only)
    "float32": ("float", np.float32, 4),
    "float64": ("double", np.float64, 8),
}


def test_all_lists_every_dtype_once():
    assert [d.name for d in dtypes.all()] == list(TABLE)
    assert all(isinstance(d, DType) for d in dtypes.all())


@pytest.mark.parametrize("name", list(TABLE))
def test_cname_numpy_itemsize(name: str):
    cname, npdt, size = TABLE[name]
    dt = getattr(dtypes, name)
    assert dt.name == name
    assert dt.cname == cname
    assert dt.np == np.dtype(npdt)
    assert dt.itemsize == size == np.dtype(npdt).itemsize
    assert dt.count == 1
    assert dtypes.from_np(npdt) is dt
    assert dtypes.from_np(np.dtype(npdt)) is dt
    assert to_dtype(name) is dt and to_dtype(npdt) is dt and to_dtype(dt) is dt


@pytest.mark.parametrize("name", list(TABLE))
def test_kind_flags_and_limits(name: str):
    dt = getattr(dtypes, name)
    npdt = np.dtype(TABLE[name][1])
    assert dt.is_float == (npdt.kind == "f")
    assert dt.is_int == (npdt.kind in "iu")
    assert dt.is_unsigned == (npdt.kind == "u")
    assert dt.is_bool == (npdt.kind == "b")
    assert sum((dt.is_float, dt.is_int, dt.is_bool)) == 1
    if dt.is_float:
        assert dt.min == -math.inf and dt.max == math.inf
    elif dt.is_bool:
        assert dt.min is False and dt.max is True
    else:
        assert (dt.min, dt.max) == (int(np.iinfo(npdt).min), int(np.iinfo(npdt).max))


def test_aliases_are_the_same_objects():
    assert dtypes.f16 is dtypes.float16 and dtypes.half is dtypes.float16
    assert dtypes.f32 is dtypes.float32 and dtypes.float is dtypes.float32
    assert dtypes.f64 is dtypes.float64 and dtypes.double is dtypes.float64
    assert dtypes.i8 is dtypes.int8 and dtypes.i16 is dtypes.int16
    assert dtypes.i32 is dtypes.int32 and dtypes.int is dtypes.int32
    assert dtypes.i64 is dtypes.int64 and dtypes.long is dtypes.int64
    assert dtypes.u8 is dtypes.uint8 and dtypes.uchar is dtypes.uint8
    assert dtypes.u16 is dtypes.uint16 and dtypes.u32 is dtypes.uint32 and dtypes.u64 is dtypes.uint64
    assert dtypes.default_float is dtypes.float32 and dtypes.default_int is dtypes.int32


def test_dtypes_are_singletons_under_copy_and_pickle():
    import copy
    import pickle

    for dt in dtypes.all():
        assert copy.deepcopy(dt) is dt
        assert pickle.loads(pickle.dumps(dt)) is dt


def test_from_py():
    assert dtypes.from_py(True) is dtypes.bool
    assert dtypes.from_py(np.bool_(False)) is dtypes.bool
    assert dtypes.from_py(3) is dtypes.int32
    assert dtypes.from_py(np.int64(3)) is dtypes.int32
    assert dtypes.from_py(1.5) is dtypes.float32
    with pytest.raises(TypeError):
        dtypes.from_py("x")


def test_unsupported_dtypes_raise_type_error():
    with pytest.raises(TypeError, match="complex64"):
        dtypes.from_np(np.complex64)
    with pytest.raises(TypeError):
        to_dtype("not_a_dtype")


@pytest.mark.parametrize(
    "a, b, want",
    [
        (dtypes.int32, dtypes.float16, dtypes.float16),
        (dtypes.uint8, dtypes.int8, dtypes.int16),
        (dtypes.bool, dtypes.int32, dtypes.int32),
        (dtypes.float32, dtypes.float64, dtypes.float64),
        (dtypes.int32, dtypes.int64, dtypes.int64),
        (dtypes.int64, dtypes.float16, dtypes.float16),  # any float beats any int, whatever the widths
        (dtypes.bool, dtypes.bool, dtypes.bool),
        (dtypes.bool, dtypes.float32, dtypes.float32),
        (dtypes.uint8, dtypes.uint16, dtypes.uint16),
        (dtypes.float16, dtypes.float32, dtypes.float32),
        (dtypes.int8, dtypes.int8, dtypes.int8),
    ],
)
def test_promote_pytorch_rules(a: DType, b: DType, want: DType):
    assert promote(a, b) is want
    assert promote(b, a) is want


def test_promote_is_symmetric_and_idempotent():
    for a, b in itertools.product(dtypes.all(), repeat=2):
        assert promote(a, b) is promote(b, a), (a, b)
    for a in dtypes.all():
        assert promote(a, a) is a
        assert promote(dtypes.bool, a) is a


def test_least_upper_float():
    assert least_upper_float(dtypes.int32) is dtypes.float32
    assert least_upper_float(dtypes.bool) is dtypes.float32
    assert least_upper_float(dtypes.float64) is dtypes.float64
    assert least_upper_float(dtypes.float16) is dtypes.float16


@pytest.mark.parametrize(
    "dt, x, want",
    [
        (dtypes.int32, 2**31, -(2**31)),
        (dtypes.int32, 2**31 - 1, 2**31 - 1),
        (dtypes.int32, -(2**31) - 1, 2**31 - 1),
        (dtypes.int32, 2**32 + 5, 5),
        (dtypes.int8, 200, -56),
        (dtypes.int8, -129, 127),
        (dtypes.int16, 40000, 40000 - 65536),
        (dtypes.int64, 2**63, -(2**63)),
        (dtypes.uint8, 256, 0),
        (dtypes.uint8, -1, 255),
        (dtypes.uint8, 300, 44),
        (dtypes.uint16, -1, 65535),
        (dtypes.uint32, -1, 2**32 - 1),
        (dtypes.uint64, -1, 2**64 - 1),
        (dtypes.bool, 2, True),
        (dtypes.bool, 0, False),
        (dtypes.bool, 0.5, True),
    ],
)
def test_truncate_wraps_ints(dt: DType, x, want):
    # reference: two's complement wrap-around (NumPy's astype of the same value); exact
    got = truncate(dt, x)
    assert got == want and type(got) is type(want)
    if not dt.is_bool:
        assert got == int(np.array(x & ((1 << 64) - 1), np.uint64).astype(dt.np))


def test_truncate_rounds_floats():
    # reference: NumPy's scalar types; exact
    assert truncate(dtypes.float32, 0.1) == float(np.float32(0.1)) != 0.1
    assert truncate(dtypes.float32, 16777217) == 16777216.0
    assert truncate(dtypes.float64, 16777217) == 16777217.0
    assert truncate(dtypes.float16, 2049) == 2048.0
    assert type(truncate(dtypes.float32, 3)) is float
    assert math.isnan(truncate(dtypes.float32, math.nan))
    with np.errstate(over="ignore"):
        assert truncate(dtypes.float16, 65520.0) == math.inf
        assert truncate(dtypes.float32, 1e39) == math.inf

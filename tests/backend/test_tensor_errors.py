"""Every invalid Tensor call raises before anything compiles, with PyTorch's exception type and a message that names
the shapes (or the dim and its valid range) involved."""

from __future__ import annotations

import numpy as np
import pytest

from uopc import Tensor, dtypes


def t(*shape: int, dtype=np.float32) -> Tensor:
    return Tensor(np.zeros(shape, dtype))


CASES = [
    # (id, call, exception, fragments that must all appear in the message)
    ("broadcast", lambda: t(2, 3) + t(4, 3), ValueError, ["(2, 3)", "(4, 3)", "broadcast"]),
    ("broadcast_where", lambda: t(2, 3).where(t(3), t(2, 1, 4)), ValueError, ["(2, 3)", "(2, 1, 4)"]),
    ("matmul_inner", lambda: t(2, 3) @ t(4, 5), ValueError, ["2x3 and 4x5"]),
    ("matmul_vec", lambda: t(3) @ t(4), ValueError, ["3 and 4"]),
    ("matmul_0d", lambda: t() @ t(3), ValueError, ["()", "(3,)", "1-D"]),
    ("matmul_batch", lambda: t(2, 2, 3) @ t(3, 3, 4), ValueError, ["(2, 2, 3)", "(3, 3, 4)", "broadcast"]),
    ("reshape_size", lambda: t(2, 3).reshape(4, 2), ValueError, ["(4, 2)", "(2, 3)"]),
    ("reshape_two_infer", lambda: t(2, 3).reshape(-1, -1), ValueError, ["(-1, -1)", "(2, 3)"]),
    ("reshape_ambiguous", lambda: t(0, 3).reshape(-1, 0), ValueError, ["(0, 3)", "ambiguous"]),
    ("sum_axis", lambda: t(2, 3).sum(2), IndexError, ["[-2, 1]", "got 2"]),
    ("max_axis_neg", lambda: t(2, 3).max(-3), IndexError, ["[-2, 1]", "got -3"]),
    ("sum_axis_repeat", lambda: t(2, 3).sum((1, -1)), ValueError, ["(1, -1)", "(2, 3)"]),
    ("softmax_axis", lambda: t(2, 3).softmax(5), IndexError, ["[-2, 1]", "got 5"]),
    ("argmax_axis", lambda: t(4).argmax(1), IndexError, ["[-1, 0]", "got 1"]),
    ("permute_len", lambda: t(2, 3).permute(0), ValueError, ["(0,)", "(2, 3)"]),
    ("permute_repeat", lambda: t(2, 3).permute(1, 1), ValueError, ["(1, 1)", "repeats"]),
    ("permute_range", lambda: t(2, 3).permute(0, 2), IndexError, ["[-2, 1]", "got 2"]),
    ("transpose_range", lambda: t(2, 3, 4).transpose(0, 3), IndexError, ["[-3, 2]", "got 3"]),
    ("expand_size", lambda: t(2, 3).expand(2, 4), ValueError, ["(2, 3)", "(2, 4)"]),
    ("expand_fewer_dims", lambda: t(2, 3).expand(3), ValueError, ["(2, 3)", "(3,)"]),
    ("expand_new_minus_one", lambda: t(3).expand(-1, 3), ValueError, ["(3,)", "(-1, 3)"]),
    ("pad_pairs", lambda: t(2, 3).pad(((1, 1),)), ValueError, ["((1, 1),)", "(2, 3)"]),
    ("pad_flat_odd", lambda: t(2, 3).pad((1, 2, 3)), ValueError, ["(1, 2, 3)", "(2, 3)"]),
    ("pad_flat_long", lambda: t(3).pad((1, 1, 1, 1)), ValueError, ["(1, 1, 1, 1)", "(3,)"]),
    ("pad_cut_too_much", lambda: t(2, 3).pad(((0, 0), (-2, -2))), ValueError, ["dim 1", "(2, 3)"]),
    ("pad_value_int", lambda: t(2, dtype=np.int32).pad((1, 1), value=float("-inf")), ValueError, ["-inf", "i32"]),
    ("shrink_bounds", lambda: t(2, 3).shrink(((0, 2), (1, 4))), ValueError, ["(1, 4)", "(2, 3)"]),
    ("shrink_len", lambda: t(2, 3).shrink(((0, 1),)), ValueError, ["(2, 3)", "1 entries"]),
    ("flip_axis", lambda: t(2, 3).flip(2), IndexError, ["[-2, 1]", "got 2"]),
    ("squeeze_dim", lambda: t(2, 1).squeeze(3), IndexError, ["[-2, 1]", "got 3"]),
    ("unsqueeze_dim", lambda: t(2, 3).unsqueeze(4), IndexError, ["[-3, 2]", "got 4"]),
    ("flatten_order", lambda: t(2, 3, 4).flatten(2, 1), ValueError, ["start_dim 2", "end_dim 1", "(2, 3, 4)"]),
    ("getitem_int", lambda: t(3, 4)[3], IndexError, ["index 3", "dimension 0", "size 3"]),
    ("getitem_int_dim1", lambda: t(3, 4)[0, -5], IndexError, ["index -5", "dimension 1", "size 4"]),
    ("getitem_too_many", lambda: t(3, 4)[0, 0, 0], IndexError, ["too many indices", "dimension 2"]),
    ("getitem_ellipsis", lambda: t(3, 4)[..., 0, ...], IndexError, ["single ellipsis"]),
    ("getitem_float", lambda: t(3, 4)[1.5], TypeError, ["1.5", "float"]),
    ("getitem_bool_mask", lambda: t(3)[Tensor([True, False, True])], IndexError, ["int tensors", "bool"]),
    (
        "getitem_tensors_unbroadcastable",
        lambda: t(3, 4)[Tensor([0, 1]), Tensor([1, 2, 0])],
        IndexError,
        ["shape mismatch", "(2,)", "(3,)"],
    ),
    ("getitem_tensors_float", lambda: t(3, 4)[Tensor([0.5]), Tensor([1])], IndexError, ["int tensors", "f32"]),
    ("cat_shapes", lambda: Tensor.cat(t(2, 3), t(2, 4)), ValueError, ["(2, 3)", "(2, 4)", "dimension 0"]),
    ("cat_ndim", lambda: Tensor.cat(t(2, 3), t(3)), ValueError, ["(2, 3)", "(3,)"]),
    ("cat_0d", lambda: Tensor.cat(t(), t()), ValueError, ["zero-dimensional", "position 0"]),
    ("cat_dim", lambda: Tensor.cat(t(2, 3), t(2, 3), dim=2), IndexError, ["[-2, 1]", "got 2"]),
    ("cat_empty", lambda: Tensor.cat([]), ValueError, ["non-empty"]),
    ("cat_not_tensor", lambda: Tensor.cat(t(2), [1, 2]), TypeError, ["int"]),
    ("stack_shapes", lambda: Tensor.stack([t(2, 3), t(2, 4)]), ValueError, ["(2, 3)", "(2, 4)", "entry 1"]),
    ("stack_dim", lambda: Tensor.stack([t(2), t(2)], dim=3), IndexError, ["[-2, 1]", "got 3"]),
    ("chunk_zero", lambda: t(5).chunk(0), ValueError, ["chunks", "0"]),
    ("split_sizes", lambda: t(5).split([2, 2]), ValueError, ["[2, 2]", "(5,)"]),
    ("repeat_short", lambda: t(2, 3).repeat(2), ValueError, ["(2,)", "(2, 3)"]),
    ("create_str", lambda: Tensor("abc"), TypeError, ["str"]),
    ("create_object", lambda: Tensor(object()), TypeError, ["object"]),
    ("create_list_of_tensors", lambda: Tensor([t(2), t(2)]), TypeError, ["Tensor.stack"]),
    ("create_ragged", lambda: Tensor([[1, 2], [3]]), ValueError, ["ragged"]),
    ("create_complex", lambda: Tensor(np.zeros(2, np.complex64)), TypeError, ["complex64"]),
    ("create_int_overflow", lambda: Tensor([2**40]), ValueError, ["int32"]),
    ("bad_dtype", lambda: t(2).cast("notadtype"), TypeError, ["notadtype"]),
    ("zeros_negative", lambda: Tensor.zeros(2, -1), ValueError, ["(2, -1)"]),
    ("zeros_float_shape", lambda: Tensor.ones(2.5), TypeError, ["2.5"]),
    ("arange_step", lambda: Tensor.arange(0, 5, 0), ValueError, ["step"]),
    ("item_many", lambda: t(2, 3).item(), ValueError, ["(2, 3)"]),
    ("bool_many", lambda: bool(t(2)), RuntimeError, ["ambiguous", "(2,)"]),
    ("len_0d", lambda: len(t()), TypeError, ["0-d"]),
    ("bitwise_float", lambda: t(2) & t(2), TypeError, ["bool or int", "f32"]),
    ("invert_float", lambda: ~t(2), TypeError, ["bool or int"]),
    ("neg_bool", lambda: -t(2, dtype=np.bool_), TypeError, ["bool"]),
    ("sub_bool", lambda: t(2, dtype=np.bool_) - t(2, dtype=np.bool_), TypeError, ["bool"]),
    ("floordiv_bool", lambda: t(2, dtype=np.bool_) // t(2, dtype=np.bool_), TypeError, ["bool"]),
    ("int_negative_pow", lambda: t(2, dtype=np.int32) ** -1, ValueError, ["negative", "i32"]),
    ("assign_shape", lambda: t(2, 3).assign(t(3, 2)), ValueError, ["(3, 2)", "(2, 3)"]),
    ("assign_dtype", lambda: t(2).assign(t(2, dtype=np.int32)), TypeError, ["i32", "f32"]),
    ("max_empty_dim", lambda: t(2, 0).max(1), RuntimeError, ["(2, 0)", "size 0"]),
    ("argmax_empty", lambda: t(0).argmax(), RuntimeError, ["(0,)", "size 0"]),
    ("ce_target_shape", lambda: t(4, 5).cross_entropy(Tensor([0, 1, 2])), ValueError, ["(4, 5)", "(3,)", "(4,)"]),
    ("ce_prob_shape", lambda: t(4, 5).cross_entropy(t(4, 4)), ValueError, ["(4, 5)", "(4, 4)"]),
    ("ce_reduction", lambda: t(4, 5).cross_entropy(Tensor([0, 1, 2, 3]), reduction="avg"), ValueError, ["'avg'"]),
    ("ce_bool_target", lambda: t(2, 3).cross_entropy(Tensor([True, False])), TypeError, ["int tensor", "bool"]),
    ("ce_0d", lambda: t().cross_entropy(Tensor(0)), ValueError, ["0-d"]),
    ("clip_nothing", lambda: t(2).clip(), ValueError, ["min", "max"]),
    ("dim_not_int", lambda: t(2, 3).sum(1.0), TypeError, ["float"]),
]


@pytest.mark.parametrize("call,exc,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_call_raises(call, exc, fragments):
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"


def test_errors_raise_before_compiling(monkeypatch):
    # nothing above may reach the compiler: make any compile fail loudly, then rerun a few bad calls
    from uopc.runtime import compiler as runtime

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled a kernel for an invalid call")

    monkeypatch.setattr(runtime, "Program", no_compile)
    for _, call, exc, _ in CASES:
        with pytest.raises(exc):
            call()


def test_dtype_of_bad_tensor_survives_error():
    x = t(2, 3)
    with pytest.raises(ValueError):
        x + t(4)
    assert x.shape == (2, 3) and x.dtype is dtypes.float32  # a failed op leaves its operands untouched

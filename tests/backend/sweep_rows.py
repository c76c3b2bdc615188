"""The rows of the differential sweep against PyTorch (tests/backend/test_torch_sweep.py runs them).

A row is one public Tensor op: our call, PyTorch's call on the same inputs, and its cases. A case lists its inputs as
`Inp(dtype, shape, layout, domain)`: layout "c" is a fresh contiguous tensor, "nc" a view of a larger one that is
sliced, flipped and permuted (the gradient then flows back through those views); the domain says which values to draw
(domains.py-style names below, each with large magnitudes unless it says otherwise). `covers` names the public Tensor
attributes a row exercises; the sweep fails when a public attribute is in no row and not in EXCLUDED.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from uopc import Tensor, dtypes


@dataclass(frozen=True)
class Inp:
    dtype: str  # "f32", "f16", "i32", "bool"
    shape: tuple[int, ...]
    layout: str = "c"  # "c" contiguous, "nc" sliced + flipped + permuted view of a larger base
    domain: str | None = None  # None: the row's domain


@dataclass
class Row:
    name: str
    ours: Callable  # (*uopc tensors) -> Tensor or a tuple of Tensors
    ref: Callable  # (*torch tensors) -> torch.Tensor or a tuple
    cases: list[tuple[Inp, ...]]
    domain: str = "any"
    grad: bool = True  # compare gradients (of float inputs) too
    covers: tuple[str, ...] = ()
    tol: dict | None = None  # forward tolerance for float32, when not the default
    gtol: dict | None = None  # gradient tolerance for float32, when not the default
    random: bool = False  # compare only shape, dtype and the range of the values (random creation)
    variant: bool = False  # ours/ref also take the case's index (to vary an axis argument across cases)
    cover_name: bool = field(default=True)  # the row's name is itself a public attribute


F32, F16, I32, B = "f32", "f16", "i32", "bool"
M = (4, 5)  # the shape most cases share, so equal structures compile once


def ew1(dts=(F32, F16), dom=None) -> list[tuple[Inp, ...]]:
    """Cases of a unary elementwise op: 0-d, size-0, contiguous and non-contiguous float32, one case per other dtype."""
    cases = [(Inp(F32, (), "c", dom),), (Inp(F32, (0, 5), "c", dom),), (Inp(F32, M, "c", dom),)]
    cases.append((Inp(F32, M, "nc", dom),))
    return (
        cases + [(Inp(d, M, "nc", dom),) for d in dts if d != F32]
        if F32 in dts
        else [(Inp(d, M, "nc", dom),) for d in dts]
    )


def ew2(dts=(F32, F16), dom=None, dom_b=None) -> list[tuple[Inp, ...]]:
    """Cases of a binary elementwise op: same shape (one side non-contiguous), broadcast, 0-d, size-0, each dtype."""
    cases = []
    for d in dts:
        cases.append((Inp(d, M, "nc", dom), Inp(d, M, "c", dom_b)))
        if d == F32:
            cases += [
                (Inp(d, M, "c", dom), Inp(d, (5,), "nc", dom_b)),
                (Inp(d, (4, 1), "c", dom), Inp(d, (), "c", dom_b)),
                (Inp(d, (0, 5), "c", dom), Inp(d, (5,), "c", dom_b)),
            ]
    return cases


def red(dts=(F32, F16), dom=None, big="big") -> list[tuple[Inp, ...]]:
    """Cases of a reduction: non-contiguous, 3-D, large values, 0-d, size-0, one per other dtype (the row varies the
    axis argument with the case index, so each case reduces once)."""
    cases = [(Inp(F32, M, "nc", dom),), (Inp(F32, (2, 3, 4), "c", dom),), (Inp(F32, M, "c", big),)]
    cases += [(Inp(F32, (), "c", dom),), (Inp(F32, (0, 5), "c", dom),)]
    return cases + [(Inp(d, M, "nc", dom),) for d in dts if d != F32]


def axis_of(i: int, ndim: int):
    """(axis, keepdim) for case i: all axes, one axis kept, or the first and last."""
    return [(None, False), (min(1, ndim - 1) if ndim else None, True), ((0, ndim - 1) if ndim > 1 else None, False)][
        i % 3
    ]


def _t(x, like):
    return torch.tensor(x, dtype=like.dtype) if not isinstance(x, torch.Tensor) else x


def unary(name, ours, ref, dts=(F32, F16), dom="any", **kw) -> Row:
    return Row(name, ours, ref, ew1(dts), dom, **kw)


def binary(name, ours, ref, dts=(F32, F16), dom="any", dom_b=None, **kw) -> Row:
    return Row(name, ours, ref, ew2(dts, None, dom_b), dom, **kw)


def reduction(name, ours, ref, dts=(F32, F16), dom="mid", big="big", **kw) -> Row:
    """ours/ref take (x, axis, keepdim); the cases take turns at axis None, 1 (keepdim) and (0, -1)."""
    return Row(
        name,
        lambda x, i: ours(x, *axis_of(i, x.ndim)),
        lambda x, i: ref(x, *axis_of(i, x.dim())),
        red(dts, None, big),
        dom,
        variant=True,
        **kw,
    )


def tdim(axis, x):
    return tuple(range(x.dim())) if axis is None else axis


ALL = (F32, F16, I32, B)
NUM = (F32, F16, I32)
FL = (F32, F16)
SM = dict(rtol=1e-3, atol=1e-7)  # softmax: the 1e-7

SOFT = ew1(FL)[:1] + ew1(FL)[2:] + [(Inp(F32, M, "c", "big"),), (Inp(F32, (3,), "c", "huge"),)]
CE = [("mean", 0.0), ("sum", 0.1), ("none", 0.0)]


def _argax(i: int, ndim: int):
    return [(None, False), (1 if ndim > 1 else None, False), (0 if ndim else None, True)][i % 3]


ROWS: list[Row] = [
    # ---------------------------------------------------------------- elementwise unary (float)
    unary("exp", lambda a: a.exp(), torch.exp),
    unary("exp2", lambda a: a.exp2(), torch.exp2),
    unary("log", lambda a: a.log(), torch.log, dom="pos"),
    unary("log2", lambda a: a.log2(), torch.log2, dom="pos"),
    unary("sqrt", lambda a: a.sqrt(), torch.sqrt, dom="pos"),
    unary("rsqrt", lambda a: a.rsqrt(), torch.rsqrt, dom="pos"),
    unary("reciprocal", lambda a: a.reciprocal(), torch.reciprocal, dom="any"),
    unary("sin", lambda a: a.sin(), torch.sin, dom="trig"),
    unary("cos", lambda a: a.cos(), torch.cos, dom="trig"),
    unary("tan", lambda a: a.tan(), torch.tan, dom="tan"),
    unary("sigmoid", lambda a: a.sigmoid(), torch.sigmoid),
    unary("tanh", lambda a: a.tanh(), torch.tanh),
    unary("softplus", lambda a: a.softplus(), F.softplus),
    unary("logsigmoid", lambda a: a.logsigmoid(), F.logsigmoid),
    unary("relu", lambda a: a.relu(), torch.relu, dts=NUM),
    unary("leaky_relu", lambda a: a.leaky_relu(0.1), lambda a: F.leaky_relu(a, 0.1)),
    unary("gelu", lambda a: a.gelu(), lambda a: F.gelu(a, approximate="tanh")),
    unary("silu", lambda a: a.silu(), F.silu),
    unary("square", lambda a: a.square(), torch.square, dts=NUM),
    unary("abs", lambda a: a.abs(), torch.abs, dts=NUM, dom="wide"),
    unary("neg", lambda a: a.neg(), torch.neg, dts=NUM, dom="wide", covers=("__neg__",)),
    unary("sign", lambda a: a.sign(), torch.sign, dts=NUM),
    unary("trunc", lambda a: a.trunc(), torch.trunc, dts=NUM, dom="frac"),
    unary("floor", lambda a: a.floor(), torch.floor, dts=NUM, dom="frac"),
    unary("ceil", lambda a: a.ceil(), torch.ceil, dts=NUM, dom="frac"),
    unary("logical_not", lambda a: a.logical_not(), torch.logical_not, dts=ALL),
    unary("__invert__", lambda a: ~a, lambda a: ~a, dts=(I32, B), dom="wide"),
    # ---------------------------------------------------------------- casts
    unary("cast", lambda a: a.cast(dtypes.int32), lambda a: a.to(torch.int32), dts=ALL, dom="mid"),
    unary("float", lambda a: a.float(), lambda a: a.float(), dts=ALL, dom="mid"),
    unary("half", lambda a: a.half(), lambda a: a.half(), dts=ALL, dom="mid"),
    unary("double", lambda a: a.double(), lambda a: a.double(), dts=ALL, dom="mid"),
    unary("int", lambda a: a.int(), lambda a: a.int(), dts=ALL, dom="mid"),
    unary("long", lambda a: a.long(), lambda a: a.long(), dts=ALL, dom="mid"),
    unary("bool", lambda a: a.bool(), lambda a: a.bool(), dts=ALL, dom="mid"),
    # ---------------------------------------------------------------- elementwise binary
    binary("add", lambda a, b: a.add(b), torch.add, dts=NUM, covers=("__add__",)),
    binary("sub", lambda a, b: a.sub(b), torch.sub, dts=NUM, covers=("__sub__",)),
    binary("mul", lambda a, b: a.mul(b), torch.mul, dts=ALL, dom="mid", covers=("__mul__",)),
    binary("div", lambda a, b: a.div(b), torch.div, dts=NUM, dom_b="nonzero", covers=("__truediv__",)),
    binary(
        "floordiv",
        lambda a, b: a // b,
        torch.floor_divide,
        dts=NUM,
        dom="mid",
        dom_b="nonzero",
        grad=False,
        covers=("__floordiv__",),
    ),
    binary("mod", lambda a, b: a % b, torch.remainder, dts=NUM, dom="mid", dom_b="nonzero", covers=("__mod__",)),
    binary("maximum", lambda a, b: a.maximum(b), torch.maximum, dts=ALL, dom="ties"),
    binary("minimum", lambda a, b: a.minimum(b), torch.minimum, dts=ALL, dom="ties"),
    binary("__and__", lambda a, b: a & b, lambda a, b: a & b, dts=(I32, B), dom="wide"),
    binary("__or__", lambda a, b: a | b, lambda a, b: a | b, dts=(I32, B), dom="wide"),
    binary("__xor__", lambda a, b: a ^ b, lambda a, b: a ^ b, dts=(I32, B), dom="wide"),
    binary("__lt__", lambda a, b: a < b, lambda a, b: a < b, dts=ALL, dom="ties"),
    binary("__gt__", lambda a, b: a > b, lambda a, b: a > b, dts=ALL, dom="ties"),
    binary("__le__", lambda a, b: a <= b, lambda a, b: a <= b, dts=ALL, dom="ties"),
    binary("__ge__", lambda a, b: a >= b, lambda a, b: a >= b, dts=ALL, dom="ties"),
    binary("__eq__", lambda a, b: a == b, lambda a, b: a == b, dts=ALL, dom="ties"),
    binary("__ne__", lambda a, b: a != b, lambda a, b: a != b, dts=ALL, dom="ties"),
    # comparisons have zero gradients, also when their result scales a differentiable value
    binary(
        "cmp_mask",
        lambda a, b: a * (a < b) + b * (a >= b),
        lambda a, b: a * (a < b) + b * (a >= b),
        dom="ties",
        cover_name=False,
    ),
    binary("pow", lambda a, b: a.pow(b), torch.pow, dom="powbase", dom_b="powexp", covers=("__pow__",)),
    Row(
        "pow_table",
        lambda a, b: a**b,
        torch.pow,
        [(Inp(F32, (10, 1)), Inp(F32, (1, 10), "c", "powexp"))],
        "powbase",
        cover_name=False,
    ),
    # ±inf and NaN bases and exponents: values only
    Row(
        "pow_nonfinite",
        lambda a, b: (a**b, a**0.5, a**-2, a**1.7, a**11, a**0, 2**b, (-2.0) ** b),
        lambda a, b: (a**b, a**0.5, a**-2, a**1.7, a**11, a**0, 2**b, (-2.0) ** b),
        [(Inp(F32, (13, 1), "c", "powbase_nf"), Inp(F32, (1, 13), "c", "powexp_nf"))],
        grad=False,
        cover_name=False,
    ),
    # ---------------------------------------------------------------- scalar operands, reflected operators
    unary("add_scalar", lambda a: a + 2.5, lambda a: a + 2.5, dts=NUM, cover_name=False),
    unary("__radd__", lambda a: 3 + a, lambda a: 3 + a, dts=NUM),
    unary("__rsub__", lambda a: 3 - a, lambda a: 3 - a, dts=NUM),
    unary("__rmul__", lambda a: 2 * a, lambda a: 2 * a, dts=ALL),
    unary("__rtruediv__", lambda a: 3 / a, lambda a: 3 / a, dts=NUM, dom="nonzero"),
    unary("__rfloordiv__", lambda a: 7 // a, lambda a: 7 // a, dts=NUM, dom="nonzero", grad=False),
    unary("__rmod__", lambda a: 7 % a, lambda a: 7 % a, dts=NUM, dom="nonzero", grad=False),  # torch: no derivative
    unary("__rpow__", lambda a: 2**a, lambda a: 2**a, dts=FL),
    unary("rpow_neg_base", lambda a: (-2.0) ** a, lambda a: (-2.0) ** a, dts=FL, dom="powexp", cover_name=False),
    unary("pow_scalar", lambda a: a**3, lambda a: a**3, dts=NUM, dom="mid", cover_name=False),
    unary("pow_half", lambda a: a**0.5, lambda a: a**0.5, dom="powbase", cover_name=False),
    unary("pow_neg_int", lambda a: a**-2, lambda a: a**-2, dom="powbase", cover_name=False),
    unary("pow_frac", lambda a: a**1.7, lambda a: a**1.7, dom="powbase", cover_name=False),
    unary("pow_big_int", lambda a: a**11, lambda a: a**11, dom="powbase", cover_name=False),
    unary("pow_zero", lambda a: a**0, lambda a: a**0, dom="powbase", cover_name=False),
    unary("__rand__", lambda a: 6 & a, lambda a: 6 & a, dts=(I32,), dom="wide"),
    unary("__ror__", lambda a: 6 | a, lambda a: 6 | a, dts=(I32,), dom="wide"),
    unary("__rxor__", lambda a: 6 ^ a, lambda a: 6 ^ a, dts=(I32,), dom="wide"),
    unary("clip", lambda a: a.clip(-1.0, 1.0), lambda a: a.clamp(-1.0, 1.0), dts=NUM, dom="ties", covers=("clamp",)),
    unary("clip_min", lambda a: a.clamp(min=0.0), lambda a: a.clamp(min=0.0), dom="ties", cover_name=False),
    Row(
        "where",
        lambda c, a, b: c.where(a, b),
        torch.where,
        [
            (Inp(B, M, "nc"), Inp(F32, M, "c"), Inp(F32, (5,), "c")),
            (Inp(B, (4, 1)), Inp(F16, M, "nc"), Inp(F16, ())),
            (Inp(B, M), Inp(I32, M), Inp(I32, M, "nc")),
            (Inp(B, ()), Inp(F32, ()), Inp(F32, ())),
        ],
    ),
    # ---------------------------------------------------------------- reductions
    reduction("sum", lambda x, ax, k: x.sum(ax, k), lambda x, ax, k: x.sum(tdim(ax, x), k), dts=ALL),
    reduction(
        "mean",
        lambda x, ax, k: x.mean(ax, k),
        lambda x, ax, k: x.float().mean(tdim(ax, x), k).to(x.dtype if x.is_floating_point() else torch.float32),
        dts=NUM,
    ),
    reduction("max", lambda x, ax, k: x.max(ax, k), lambda x, ax, k: x.amax(tdim(ax, x), k), dts=ALL, dom="ties"),
    reduction("min", lambda x, ax, k: x.min(ax, k), lambda x, ax, k: x.amin(tdim(ax, x), k), dts=ALL, dom="ties"),
    reduction(
        "var", lambda x, ax, k: x.var(ax, k), lambda x, ax, k: x.var(tdim(ax, x), keepdim=k), dts=(F32,), big="large"
    ),  # squares of 1e30 overflow float32 (PyTorch too, for var)
    reduction(
        "std",
        lambda x, ax, k: x.std(ax, k, correction=0),
        lambda x, ax, k: x.std(tdim(ax, x), keepdim=k, correction=0),
        dts=(F32,),
        big="large",
    ),
    reduction(
        "prod",
        lambda x, ax, k: x.prod(ax, k),
        lambda x, ax, k: _prod(x, tdim(ax, x), k),
        dts=(F32,),
        big="mid",
        dom="nonzero",
        covers=(),
    ),
    reduction(
        "logsumexp",
        lambda x, ax, k: x.logsumexp(ax, k),
        lambda x, ax, k: torch.logsumexp(x, tdim(ax, x), k),
        dts=FL,
        dom="any",
    ),
    Row(
        "argmax",
        lambda x, i: x.argmax(*_argax(i, x.ndim)),
        lambda x, i: x.argmax(*_argax(i, x.dim())),
        red(NUM, "ties")[:4] + red(NUM, "ties")[5:],
        grad=False,
        variant=True,
    ),
    Row(
        "argmin",
        lambda x, i: x.argmin(*_argax(i, x.ndim)),
        lambda x, i: x.argmin(*_argax(i, x.dim())),
        red(NUM, "ties")[:4] + red(NUM, "ties")[5:],
        grad=False,
        variant=True,
    ),
    Row(
        "softmax",
        lambda x, i: x.softmax(-(i % 2)),
        lambda x, i: x.softmax(-(i % 2)),
        SOFT,
        tol=SM,
        gtol=SM,
        variant=True,
    ),
    Row("log_softmax", lambda x, i: x.log_softmax(-(i % 2)), lambda x, i: x.log_softmax(-(i % 2)), SOFT, variant=True),
    # ---------------------------------------------------------------- matmul
    Row(
        "matmul",
        lambda a, b: a.matmul(b),
        torch.matmul,
        [
            (Inp(F32, M, "nc", "mid"), Inp(F32, (5, 3))),
            (Inp(F32, (2, 4, 5), "c", "mid"), Inp(F32, (5,), "nc")),
            (Inp(F16, (5,), "c", "mid"), Inp(F16, (2, 5, 3), "nc")),
            (Inp(I32, M, "c", "mid"), Inp(I32, (5, 3))),
            (Inp(F32, (0, 5)), Inp(F32, (5, 3))),
        ],
        covers=("dot", "__matmul__"),
    ),
    Row(
        "__rmatmul__", lambda a, b: b.__rmatmul__(a), lambda a, b: a @ b, [(Inp(F32, (3, 4), "nc", "mid"), Inp(F32, M))]
    ),
    # ---------------------------------------------------------------- movement
    Row(
        "reshape",
        lambda x: (x.reshape(5, 4), x.reshape(-1), x.view(2, 10)),
        lambda x: (x.reshape(5, 4), x.reshape(-1), x.reshape(2, 10)),
        ew1(ALL)[2:],
        covers=("view",),
    ),
    Row(
        "permute",
        lambda x: (x.permute(1, 0), x.transpose(), x.T),
        lambda x: (x.permute(1, 0), x.transpose(-2, -1), x.T),
        ew1(ALL)[1:],
        covers=("transpose", "T"),
    ),
    Row(
        "expand",
        lambda x: x.reshape(4, 1, 5).expand(4, 3, 5),
        lambda x: x.reshape(4, 1, 5).expand(4, 3, 5),
        ew1(ALL)[2:],
    ),
    Row(
        "pad",
        lambda x: (x.pad((1, 2, 0, 1)), x.pad((0, 1, 1, 0), value=-math.inf), x.pad((-1, 1))),
        lambda x: (F.pad(x, (1, 2, 0, 1)), F.pad(x, (0, 1, 1, 0), value=-math.inf), F.pad(x, (-1, 1))),
        ew1(FL)[2:],
    ),
    Row("shrink", lambda x: x.shrink(((1, 3), None)), lambda x: x[1:3], ew1(ALL)[2:]),
    Row("flip", lambda x: (x.flip(0), x.flip((0, 1))), lambda x: (x.flip(0), x.flip((0, 1))), ew1(ALL)[2:]),
    Row(
        "squeeze",
        lambda x: (x.reshape(4, 1, 5).squeeze(), x.reshape(1, 4, 5).squeeze(0)),
        lambda x: (x.reshape(4, 1, 5).squeeze(), x.reshape(1, 4, 5).squeeze(0)),
        ew1(FL)[2:],
    ),
    Row("unsqueeze", lambda x: x.unsqueeze(1), lambda x: x.unsqueeze(1), ew1(FL)),
    Row("flatten", lambda x: x.reshape(2, 2, 5).flatten(1), lambda x: x.reshape(2, 2, 5).flatten(1), ew1(FL)[2:]),
    Row("unflatten", lambda x: x.unflatten(1, (5, 1)), lambda x: x.unflatten(1, (5, 1)), ew1(FL)[2:]),
    Row("repeat", lambda x: x.repeat(2, 1, 3), lambda x: x.repeat(2, 1, 3), ew1(ALL)[2:]),
    Row("split", lambda x: x.split(3, 1), lambda x: x.split(3, 1), ew1(FL)[2:]),
    Row("chunk", lambda x: x.chunk(3, 0), lambda x: x.chunk(3, 0), ew1(FL)[2:]),
    Row(
        "__getitem__",
        lambda x: (x[1], x[:, ::2], x[None, ..., 1:3], x[-1, -2], x[Tensor([2, 0])]),
        lambda x: (x[1], x[:, ::2], x[None, ..., 1:3], x[-1, -2], x[torch.tensor([2, 0])]),
        ew1(ALL)[2:],
    ),
    Row(
        "cat",
        lambda a, b: (a.cat(b), Tensor.cat(a, b, dim=1)),
        lambda a, b: (torch.cat([a, b]), torch.cat([a, b], 1)),
        [(Inp(F32, M, "nc"), Inp(F32, M)), (Inp(F16, M), Inp(F16, M, "nc"))],
    ),
    Row(
        "stack",
        lambda a, b: (a.stack(b), Tensor.stack([a, b], dim=2)),
        lambda a, b: (torch.stack([a, b]), torch.stack([a, b], 2)),
        [(Inp(F32, M, "nc"), Inp(F32, M))],
    ),
    Row("contiguous", lambda x: x.contiguous() * 2, lambda x: x.contiguous() * 2, ew1(FL)[2:]),
    Row("detach", lambda x: x.detach() * x, lambda x: x.detach() * x, ew1(FL)[2:]),
    Row("assign", lambda x: Tensor.zeros(4, 5).assign(x.detach() + 1), lambda x: x.detach() + 1, ew1((F32,))[2:]),
    # data-dependent indexing: the index is an int tensor (dim 1 for cases 0 and 1, dim 0 for case 2)
    Row(
        "gather",
        lambda x, i, k: x.gather(1 - k // 2, i),
        lambda x, i, k: x.gather(1 - k // 2, i.long()),
        [
            (Inp(F32, M, "nc"), Inp(I32, (4, 3), "c", "cls")),
            (Inp(F16, M), Inp(I32, (4, 7), "nc", "cls")),
            (Inp(I32, M, "nc"), Inp(I32, (3, 5), "c", "cls4")),
        ],
        variant=True,
    ),
    Row(
        "scatter_add",
        lambda x, i, s, k: x.scatter_add(1 - k // 2, i, s),
        lambda x, i, s, k: x.scatter_add(1 - k // 2, i.long(), s),
        [
            (Inp(F32, M, "nc"), Inp(I32, (4, 3), "c", "cls"), Inp(F32, (4, 3))),
            (Inp(F16, M), Inp(I32, (4, 7), "c", "cls"), Inp(F16, (4, 7), "nc")),
            (Inp(F32, M), Inp(I32, (3, 5), "c", "cls4"), Inp(F32, (3, 5), "nc")),
        ],
        variant=True,
    ),
    # ---------------------------------------------------------------- losses
    Row("one_hot", lambda y: y.one_hot(5), lambda y: F.one_hot(y.long(), 5), [(Inp(I32, M, "c", "cls"),)], grad=False),
    Row(
        "cross_entropy",
        lambda x, y, i: x.cross_entropy(y, *CE[i]),
        lambda x, y, i: F.cross_entropy(x, y.long(), reduction=CE[i][0], label_smoothing=CE[i][1]),
        [
            (Inp(F32, (4, 5), "nc", "mid"), Inp(I32, (4,), "c", "cls")),
            (Inp(F32, (4, 5), "c", "big"), Inp(I32, (4,), "c", "cls")),
            (Inp(F16, (4, 5), "c", "mid"), Inp(I32, (4,), "nc", "cls")),
        ],
        variant=True,
    ),
    Row(
        "sparse_categorical_crossentropy",
        lambda x, y: x.sparse_categorical_crossentropy(y),
        lambda x, y: F.cross_entropy(x, y.long(), ignore_index=-1),
        [(Inp(F32, (4, 5), "nc", "mid"), Inp(I32, (4,), "c", "cls_ign"))],
    ),
    # ---------------------------------------------------------------- creation
    Row(
        "arange",
        lambda: (Tensor.arange(5), Tensor.arange(2, 11, 3), Tensor.arange(1.0, 0.0, -0.25)),
        lambda: (
            torch.arange(5, dtype=torch.int32),
            torch.arange(2, 11, 3, dtype=torch.int32),
            torch.arange(1.0, 0.0, -0.25),
        ),
        [()],
        grad=False,
    ),
    Row("eye", lambda: (Tensor.eye(3), Tensor.eye(2, 4)), lambda: (torch.eye(3), torch.eye(2, 4)), [()], grad=False),
    Row(
        "full",
        lambda: (
            Tensor.full((2, 3), 1.5),
            Tensor.full(4, 7),
            Tensor.zeros(2, 3),
            Tensor.ones(3, dtype="int32"),
            Tensor.empty(0, 2),
        ),
        lambda: (
            torch.full((2, 3), 1.5),
            torch.full((4,), 7, dtype=torch.int32),
            torch.zeros(2, 3),
            torch.ones(3, dtype=torch.int32),
            torch.zeros(0, 2),
        ),
        [()],
        grad=False,
        covers=("zeros", "ones", "empty"),
    ),
    Row(
        "full_like",
        lambda x: (x.full_like(2), x.zeros_like(), x.ones_like(), x.empty_like()),
        lambda x: (torch.full_like(x, 2), torch.zeros_like(x), torch.ones_like(x), torch.zeros_like(x)),
        [(Inp(d, M),) for d in ALL],
        grad=False,
        covers=("zeros_like", "ones_like", "empty_like"),
    ),
    Row(
        "rand",
        lambda: (
            Tensor.rand(3, 4),
            Tensor.randn(3, 4),
            Tensor.uniform(3, 4, low=-2, high=-1),
            Tensor.randint(3, 4, low=5, high=8),
            Tensor.ones(2, 3).rand_like(),
            Tensor.ones(2, 3).randn_like(),
        ),
        lambda: ((0, 1), (-10, 10), (-2, -1), (5, 8), (0, 1), (-10, 10)),
        [()],
        grad=False,
        random=True,
        covers=("randn", "uniform", "randint", "rand_like", "randn_like", "manual_seed"),
    ),
]


def _prod(x, dims, keepdim):
    for d in sorted((dims,) if isinstance(dims, int) else dims, reverse=True):
        x = x.prod(d, keepdim)
    return x


ROWS_BY_NAME = {r.name: r for r in ROWS}
assert len(ROWS_BY_NAME) == len(ROWS), "row names must be unique"

# Public Tensor attributes that are not ops of their own, each with the reason it has no row:
EXCLUDED = {
    # the machinery every row uses: building and reading the gradient, computing and reading back results
    "backward",
    "gradient",
    "realize",
    "realize_all",
    "numpy",
    "item",
    "tolist",
    "requires_grad_",  # the requires_grad rule has its own tests in test_torch_sweep.py
    "fuse_reduce",
    "device",  # a setting and a constant, not ops
    "shape",
    "dtype",
    "ndim",
    "numel",
    "size",  # metadata: test_torch_sweep.py compares them with PyTorch
    # Python protocols, tested in test_tensor_ops.py
    "__init__",
    "__repr__",
    "__hash__",
    "__bool__",
    "__len__",
    "__iter__",
    "__array_ufunc__",
}

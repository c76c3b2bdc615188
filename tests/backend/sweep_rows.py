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
from uopc.helpers import Context


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
    htol: dict | None = None  # forward tolerance for float16 (ulps, atol), when not the default: say why
    hgtol: dict | None = None  # gradient tolerance for float16, when not the default: say why
    random: bool = False  # compare only shape, dtype and the range of the values (random creation)
    variant: bool = False  # ours/ref also take the case's index (to vary an axis argument across cases)
    cover_name: bool = field(default=True)  # the row's name is itself a public attribute


SR = [("sum", True), ("mean", False), ("amax", True), ("amin", False)]  # scatter_reduce cases
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
# float16 rows whose PyTorch kernel rounds inside the op, so that its half result is not its float32 one rounded
# once: log_softmax keeps max + log(sum) in half before subtracting it (cross_entropy builds on it), and
# binary_cross_entropy_with_logits is a chain of half ops. These compare with PyTorch's float32 result rounded to
# half too, within one ulp (as every float16 gradient does, see GRAD in test_torch_sweep.py)
HALF_MID = dict(ulps=1, atol=0.0, f32ref=True)

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
    unary(
        "softplus",
        lambda a: (a.softplus(), a.softplus(2.0, 3.0), a.softplus(0.5)),
        lambda a: (F.softplus(a), F.softplus(a, 2.0, 3.0), F.softplus(a, 0.5)),
    ),
    unary("logsigmoid", lambda a: a.logsigmoid(), F.logsigmoid),
    unary("relu", lambda a: a.relu(), torch.relu, dts=NUM),
    unary("leaky_relu", lambda a: a.leaky_relu(0.1), lambda a: F.leaky_relu(a, 0.1)),
    unary("gelu", lambda a: a.gelu(), lambda a: F.gelu(a)),
    unary(
        "gelu_tanh",
        lambda a: a.gelu("tanh"),
        lambda a: F.gelu(a, approximate="tanh"),
        cover_name=False,
        # near x = -5, 1 + tanh(z) cancels in float32 itself (tanh(z) within 2^-23 of -1): PyTorch's and uopc's float32
        # tanh differ there by a float32 ulp, which is |x| 2^-24 absolute, a few half subnormal steps (2^-24 each) of a
        # result near -3e-7
        htol=dict(ulps=1, atol=2**-22),
    ),
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
    Row(
        "log_softmax",
        lambda x, i: x.log_softmax(-(i % 2)),
        lambda x, i: x.log_softmax(-(i % 2)),
        SOFT,
        variant=True,
        htol=HALF_MID,
    ),
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
    # several Tensor indices broadcast together (repeats and negatives: the gradient accumulates), adjacent or not
    Row(
        "fancy_index",
        lambda x: (
            x[Tensor([0, -1, 0]), Tensor([4, 1, 4])],
            x[Tensor([[1], [3]]), Tensor([[0, -2, 2]])],
            x.reshape(2, 2, 5)[Tensor([1, 0]), :, Tensor([3, 3])],
            x.reshape(2, 2, 5)[1, Tensor([1, -2]), Tensor([0, 4])],
        ),
        lambda x: (
            x[torch.tensor([0, -1, 0]), torch.tensor([4, 1, 4])],
            x[torch.tensor([[1], [3]]), torch.tensor([[0, -2, 2]])],
            x.reshape(2, 2, 5)[torch.tensor([1, 0]), :, torch.tensor([3, 3])],
            x.reshape(2, 2, 5)[1, torch.tensor([1, -2]), torch.tensor([0, 4])],
        ),
        ew1(ALL)[2:],
        cover_name=False,
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
    # scatter_reduce: repeated targets (random index), a reduce and include_self per case; prod has no gradient
    Row(
        "scatter_reduce",
        lambda x, i, s, k: x.scatter_reduce(1, i, s, *SR[k]),
        lambda x, i, s, k: x.scatter_reduce(1, i.long(), s, SR[k][0], include_self=SR[k][1]),
        [(Inp(F32, M, "nc"), Inp(I32, (4, 3), "c", "cls"), Inp(F32, (4, 3))) for _ in SR],
        variant=True,
    ),
    Row(
        "scatter_reduce_prod",
        lambda x, i, s, k: x.scatter_reduce(1, i, s, "prod", include_self=k == 0),
        lambda x, i, s, k: x.scatter_reduce(1, i.long(), s, "prod", include_self=k == 0),
        [
            (Inp(F32, M), Inp(I32, (4, 3), "c", "cls"), Inp(F32, (4, 3))),
            (Inp(F16, M), Inp(I32, (3, 5), "c", "cls4"), Inp(F16, (3, 5))),
        ],
        variant=True,
        grad=False,
        cover_name=False,
    ),
    # scatter: one target per row, so no element is written twice (PyTorch leaves repeated targets undefined)
    Row(
        "scatter",
        lambda x, i, s: x.scatter(1, i, s),
        lambda x, i, s: x.scatter(1, i.long(), s),
        [
            (Inp(F32, M, "nc"), Inp(I32, (4, 1), "c", "cls"), Inp(F32, (4, 1))),
            (Inp(F16, M), Inp(I32, (4, 1), "c", "cls"), Inp(F16, (4, 1))),
        ],
    ),
    # ---------------------------------------------------------------- losses
    Row(
        "one_hot",
        lambda y: (y.one_hot(5), y.one_hot(7), y.one_hot()),
        lambda y: (F.one_hot(y.long(), 5), F.one_hot(y.long(), 7), F.one_hot(y.long())),
        [(Inp(I32, M, "c", "cls"),), (Inp(I32, (), "c", "cls"),), (Inp(I32, (3,), "nc", "cls"),)],
        grad=False,
    ),
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
        htol=HALF_MID,
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


# ---------------------------------------------------------------- the ops added with math.py, scan.py, extras.py,
# conv.py, attention.py, norm.py and random.py

W5 = [0.5, 2.0, 1.0, 0.0, 3.0]  # per-class weights of nll_loss (a weight of 0 included)


def _setitem(x, v):
    y = x * 1
    y[1:3, ::2] = v
    y[-1] = 7
    y[..., 0] = -x[..., 1]
    return y


def _setitem_ref(x, v):
    y = x.clone()
    y[1:3, ::2] = v
    y[-1] = 7
    y[..., 0] = -x[..., 1]
    return y


def _train(f):
    with Tensor.train():
        return f()


def _sizes(x):
    return [int(x.is_floating_point()), x.element_size(), x.nbytes() if callable(x.nbytes) else x.nbytes]


CONV1 = [(1, 1, 1, 1), (1, "same", 1, 1), (2, 0, 2, 3)]


def _winograd_conv(x, w, b, i):
    with Context(WINOGRAD=(2, 4)[i]):
        return x.conv2d(w, b, padding=1)


CONV2 = [(1, 1, 1, 1), (2, 0, 2, 1), (1, (1, 2), 1, 2)]  # (stride, padding, dilation, groups) per case
POOL = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1), ceil_mode=True),
    dict(kernel_size=3, stride=2, dilation=2, ceil_mode=True),
]
AVG = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False, ceil_mode=True),
    dict(kernel_size=(2, 3), stride=1, padding=(1, 0), divisor_override=5),
]
INTERP = [
    dict(size=(7, 3), mode="nearest"),
    dict(scale_factor=1.5, mode="nearest-exact"),
    dict(size=(3, 8), mode="bilinear", align_corners=False),
    dict(scale_factor=(2, 0.5), mode="bilinear", align_corners=True),
]
SDPA = [dict(), dict(is_causal=True), dict(scale=0.3), "bool", "float"]
NLL = [("mean", -100, None), ("sum", -1, W5), ("none", 2, W5), ("mean", -1, W5)]
BCE = ["mean", "sum", "none"]
C4 = (2, 3, 5, 5)  # the conv/pool input shape the rows share


def _sdpa(F_, q, k, v, m, i):
    a = SDPA[i % len(SDPA)]
    if a == "bool":  # every query keeps at least its largest key (PyTorch's CPU kernel gives 0 for a masked-out row)
        top = m.amax(-1, keepdim=True) if isinstance(m, torch.Tensor) else m.max(-1, keepdim=True)
        return F_(q, k, v, attn_mask=(m > 0) | (m >= top))
    if a == "float":
        return F_(q, k, v, attn_mask=m)
    return F_(q, k, v, **a)


def _nll_ours(x, y, i):
    red_, ign, w = NLL[i]
    return x.nll_loss(y, None if w is None else Tensor(w), ign, red_)


def _nll_ref(x, y, i):
    red_, ign, w = NLL[i]
    return F.nll_loss(x, y.long(), None if w is None else torch.tensor(w), ignore_index=ign, reduction=red_)


ROWS += [
    # ---------------------------------------------------------------- math.py: inverse trig and hyperbolic, logs
    unary("asin", lambda a: a.asin(), torch.asin, dom="unit"),
    unary("acos", lambda a: a.acos(), torch.acos, dom="unit"),
    unary("atan", lambda a: a.atan(), torch.atan),
    unary("atanh", lambda a: a.atanh(), torch.atanh, dom="unit"),
    unary("asinh", lambda a: a.asinh(), torch.asinh),
    unary("acosh", lambda a: a.acosh(), torch.acosh, dom="ge1"),
    unary("sinh", lambda a: a.sinh(), torch.sinh, dom="trig"),
    unary("cosh", lambda a: a.cosh(), torch.cosh, dom="trig"),
    unary("erf", lambda a: a.erf(), torch.erf),
    unary("expm1", lambda a: a.expm1(), torch.expm1, dom="trig"),
    unary("log1p", lambda a: a.log1p(), torch.log1p, dom="pos"),
    unary("log10", lambda a: a.log10(), torch.log10, dom="pos"),
    unary("round", lambda a: a.round(), torch.round, dts=NUM, dom="frac"),
    # ---------------------------------------------------------------- math.py: activations
    unary("elu", lambda a: (a.elu(), a.elu(0.5)), lambda a: (F.elu(a), F.elu(a, 0.5))),
    unary("selu", lambda a: a.selu(), F.selu),
    unary("celu", lambda a: (a.celu(), a.celu(2.0)), lambda a: (F.celu(a), F.celu(a, 2.0))),
    unary("mish", lambda a: a.mish(), F.mish),
    unary("swish", lambda a: a.swish(), F.silu),
    unary("quick_gelu", lambda a: a.quick_gelu(), lambda a: a * torch.sigmoid(a * 1.702)),
    unary("relu6", lambda a: a.relu6(), F.relu6, dom="round"),
    unary(
        "hardtanh",
        lambda a: (a.hardtanh(), a.hardtanh(-2.0, 3.0)),
        lambda a: (F.hardtanh(a), F.hardtanh(a, -2.0, 3.0)),
        dom="round",
    ),
    unary("hardsigmoid", lambda a: a.hardsigmoid(), F.hardsigmoid, dom="round"),
    unary("hardswish", lambda a: a.hardswish(), F.hardswish, dom="round"),
    unary("softsign", lambda a: a.softsign(), F.softsign),
    Row("softmin", lambda x, i: x.softmin(-(i % 2)), lambda x, i: F.softmin(x, -(i % 2)), SOFT, tol=SM, variant=True),
    # ---------------------------------------------------------------- math.py: special values, names, logic
    unary("isnan", lambda a: a.isnan(), torch.isnan, dts=ALL, dom="nf"),
    unary("isinf", lambda a: (a.isinf(), a.isinf(False, True)), lambda a: (a.isinf(), a.isneginf()), dts=ALL, dom="nf"),
    unary("isfinite", lambda a: a.isfinite(), torch.isfinite, dts=ALL, dom="nf"),
    unary("short", lambda a: a.short(), lambda a: a.short(), dts=ALL, dom="mid"),
    unary("bfloat16", lambda a: a.bfloat16().float(), lambda a: a.bfloat16().float(), dts=NUM, dom="mid"),
    Row(
        "sizes",
        lambda a: Tensor(_sizes(a), dtype=dtypes.int32),
        lambda a: torch.tensor(_sizes(a), dtype=torch.int32),
        [(Inp(d, M),) for d in ALL] + [(Inp(F32, (0, 5)),)],
        grad=False,
        covers=("is_floating_point", "element_size", "nbytes"),
        cover_name=False,
    ),
    reduction("any", lambda x, ax, k: x.any(ax, k), lambda x, ax, k: x.any(tdim(ax, x), k), dts=ALL, dom="ties"),
    reduction("all", lambda x, ax, k: x.all(ax, k), lambda x, ax, k: x.all(tdim(ax, x), k), dts=ALL, dom="ties"),
    binary("eq", lambda a, b: a.eq(b), torch.eq, dts=ALL, dom="ties"),
    binary("ne", lambda a, b: a.ne(b), torch.ne, dts=ALL, dom="ties"),
    binary(
        "isclose",
        lambda a, b: (a.isclose(b), a.isclose(a + b * 1e-6), a.isclose(b, equal_nan=True), a.isclose(a, 0, 0.5)),
        lambda a, b: (a.isclose(b), a.isclose(a + b * 1e-6), a.isclose(b, equal_nan=True), a.isclose(a, 0, 0.5)),
        dom="nf",
        grad=False,
    ),
    Row(
        "allclose",
        lambda a, b: Tensor([a.allclose(b), a.allclose(a + 1e-9), a.allclose(a * (1 + 1e-3)), (a * 0).allclose(b * 0)]),
        lambda a, b: torch.tensor(
            [a.allclose(b), a.allclose(a + 1e-9), a.allclose(a * (1 + 1e-3)), (a * 0).allclose(b * 0)]
        ),
        [(Inp(F32, M, "nc"), Inp(F32, M)), (Inp(F32, (4, 1)), Inp(F32, (5,), "nc"))],
        grad=False,
    ),
    Row(
        "lerp",
        lambda a, b, w: (a.lerp(b, w), a.lerp(b, 0.25)),
        lambda a, b, w: (torch.lerp(a, b, w), torch.lerp(a, b, 0.25)),
        [
            (Inp(F32, M, "nc"), Inp(F32, M), Inp(F32, M, "c", "prob")),
            (Inp(F32, M), Inp(F32, (5,)), Inp(F32, (), "c", "prob")),
            (Inp(F16, M), Inp(F16, M, "nc"), Inp(F16, M, "c", "prob")),
        ],
        "mid",
    ),
    binary("fmod", lambda a, b: a.fmod(b), torch.fmod, dts=NUM, dom="mid", dom_b="nonzero"),
    binary("copysign", lambda a, b: a.copysign(b), torch.copysign, dts=NUM, dom="nonzero"),
    binary("logaddexp", lambda a, b: a.logaddexp(b), torch.logaddexp),
    # ---------------------------------------------------------------- bitwise names and shifts
    binary("bitwise_and", lambda a, b: a.bitwise_and(b), torch.bitwise_and, dts=(I32, B), dom="wide"),
    binary("bitwise_or", lambda a, b: a.bitwise_or(b), torch.bitwise_or, dts=(I32, B), dom="wide"),
    binary("bitwise_xor", lambda a, b: a.bitwise_xor(b), torch.bitwise_xor, dts=(I32, B), dom="wide"),
    unary("bitwise_not", lambda a: a.bitwise_not(), torch.bitwise_not, dts=(I32, B), dom="wide"),
    unary(
        "lshift",
        lambda a: (a.lshift(0), a.lshift(3), a << 31, a << 32),
        lambda a: (a << 0, a << 3, a << 31, a << 32),
        dts=(I32,),
        dom="wide",
        covers=("__lshift__",),
    ),
    unary(
        "rshift",
        lambda a: (a.rshift(0), a.rshift(3), a >> 31, a >> 40),
        lambda a: (a >> 0, a >> 3, a >> 31, a >> 40),
        dts=(I32,),
        dom="wide",
        covers=("__rshift__",),
    ),
    # ---------------------------------------------------------------- scans and sorting (ties: stable order)
    Row(
        "cumsum",
        lambda x, i: x.cumsum(i % 2 if x.ndim else 0),
        lambda x, i: x.cumsum(i % 2 if x.dim() else 0),
        ew1(ALL) + [(Inp(F32, (3, 150)),)],
        variant=True,
    ),
    Row(
        "cumprod",
        lambda x, i: x.cumprod(i % 2 if x.ndim else 0),
        lambda x, i: x.cumprod(i % 2 if x.dim() else 0),
        ew1(NUM, "round"),
        "mid",
        variant=True,
    ),
    Row(
        "cummax",
        lambda x, i: x.cummax(i % 2 if x.ndim else 0),
        lambda x, i: x.cummax(i % 2 if x.dim() else 0).values,
        ew1(ALL)[:1] + ew1(ALL)[2:],
        "perm",
        variant=True,
    ),
    Row(
        "cummin",
        lambda x, i: x.cummin(i % 2 if x.ndim else 0),
        lambda x, i: x.cummin(i % 2 if x.dim() else 0).values,
        ew1(ALL)[:1] + ew1(ALL)[2:],
        "perm",
        variant=True,
    ),
    # running max/min over ties and large values: values only (PyTorch sends a tie's gradient to one element)
    Row(
        "cummax_ties",
        lambda x: (x.cummax(1), x.cummin(0)),
        lambda x: (x.cummax(1).values, x.cummin(0).values),
        ew1(NUM, "ties")[2:],
        grad=False,
        cover_name=False,
    ),
    Row(
        "logcumsumexp",
        lambda x, i: x.logcumsumexp(i % 2 if x.ndim else 0),
        lambda x, i: x.logcumsumexp(i % 2 if x.dim() else 0),
        ew1(FL, "mid") + [(Inp(F32, (3, 150), "c", "mid"),)],
        variant=True,
    ),
    # ±300 and ±1e30: values only. PyTorch's gradient there is wrong (it gives x = -1e30 after 1e30 a gradient of
    # 1 where the exact one, float64 by hand, is e^(-2e30) = 0; ours matches the float64 one)
    Row(
        "logcumsumexp_big",
        lambda x, i: x.logcumsumexp(i % 2),
        lambda x, i: x.logcumsumexp(i % 2),
        ew1(FL)[2:],
        grad=False,
        variant=True,
        cover_name=False,
    ),
    Row(
        "sort",
        lambda x, i: (x.sort(-(i % 2)), x.sort(0, descending=True)),
        lambda x, i: (torch.sort(x, dim=-(i % 2), stable=True), torch.sort(x, dim=0, descending=True, stable=True)),
        ew1(ALL, "ties")[:1] + ew1(ALL, "ties")[2:],
        variant=True,
    ),
    Row(
        "argsort",
        lambda x: (x.argsort(), x.argsort(0, descending=True)),
        lambda x: (torch.argsort(x, stable=True), torch.argsort(x, dim=0, descending=True, stable=True)),
        ew1(NUM, "ties")[2:],
        grad=False,
    ),
    # topk on distinct values (which of equal values PyTorch's topk picks is not specified)
    Row(
        "topk",
        lambda x: (x.topk(3), x.topk(2, 0, largest=False)),
        lambda x: (torch.topk(x, 3), torch.topk(x, 2, 0, largest=False)),
        ew1(FL, "perm")[2:],
    ),
    Row(
        "topk_ties_values",
        lambda x: (x.topk(3)[0], x.topk(2, 0, largest=False)[0]),
        lambda x: (torch.topk(x, 3)[0], torch.topk(x, 2, 0, largest=False)[0]),
        ew1(NUM, "ties")[2:],
        grad=False,
        cover_name=False,
    ),
    # ---------------------------------------------------------------- extras.py
    unary("clone", lambda a: a.clone(), torch.clone, dts=ALL),
    Row(
        "pad_to",
        lambda x: (x.pad_to(6, 7), x.pad_to((None, 8)), x.shrink_to(2, 3), x.shrink_to((None, 1))),
        lambda x: (F.pad(x, (0, 2, 0, 2)), F.pad(x, (0, 3)), x[:2, :3], x[:, :1]),
        ew1(ALL)[2:],
        covers=("shrink_to",),
    ),
    Row(
        "roll",
        lambda x: (x.roll(2, 1), x.roll((1, -7), (0, 1)), x.roll(3), x.roll(0, 0)),
        lambda x: (x.roll(2, 1), x.roll((1, -7), (0, 1)), x.roll(3), x.roll(0, 0)),
        ew1(ALL)[2:],
    ),
    Row(
        "diag",
        lambda x: (x[:, :4].diag(), x[0].diag(), x[:, :4].diagonal(), x.diag(1), x[0].diag(-2), x[1].diag(3)),
        lambda x: (x[:, :4].diag(), x[0].diag(), x[:, :4].diagonal(), x.diag(1), x[0].diag(-2), x[1].diag(3)),
        ew1(ALL)[2:],
        covers=("diagonal",),
    ),
    Row(
        "diagonal_dims",
        lambda x: (
            x.diagonal(1),
            x.diagonal(-2),
            x.diagonal(7),
            x.reshape(2, 2, 5).diagonal(0, 0, 2),
            x.reshape(2, 2, 5).diagonal(1, -1, 1),
            x.reshape(2, 5, 2).diagonal(-1, 2, 0),
        ),  # fmt: skip
        lambda x: (
            x.diagonal(1),
            x.diagonal(-2),
            x.diagonal(7),
            x.reshape(2, 2, 5).diagonal(0, 0, 2),
            x.reshape(2, 2, 5).diagonal(1, -1, 1),
            x.reshape(2, 5, 2).diagonal(-1, 2, 0),
        ),  # fmt: skip
        ew1(ALL)[2:],
        cover_name=False,
    ),
    Row(
        "unfold",
        lambda x: (x.unfold(1, 2, 2), x.unfold(0, 3, 1), x.unfold(1, 5, 3), x.unfold(-1, 1, 4)),
        lambda x: (x.unfold(1, 2, 2), x.unfold(0, 3, 1), x.unfold(1, 5, 3), x.unfold(-1, 1, 4)),
        ew1(ALL)[2:],
    ),
    Row(
        "repeat_interleave",
        lambda x: (x.repeat_interleave(2, 1), x.repeat_interleave(3), x.repeat_interleave(0, 0)),
        lambda x: (x.repeat_interleave(2, 1), x.repeat_interleave(3), x.repeat_interleave(0, 0)),
        ew1(ALL)[2:],
    ),
    Row(
        "meshgrid",
        lambda a, b: (*Tensor.meshgrid(a, b), *Tensor.meshgrid([a, b, a], indexing="xy")),
        lambda a, b: (*torch.meshgrid(a, b, indexing="ij"), *torch.meshgrid([a, b, a], indexing="xy")),
        [(Inp(F32, (4,), "nc"), Inp(F32, (5,))), (Inp(I32, (4,)), Inp(I32, (5,), "nc"))],
    ),
    Row(
        "linspace",
        lambda: (
            Tensor.linspace(0, 1, 5),
            Tensor.linspace(-3, 7, 11),
            Tensor.linspace(2.5, -1.5, 7),
            Tensor.linspace(1, 1, 1),
            Tensor.linspace(0, 1, 0),
            Tensor.linspace(0, 10, 6, dtype="int32"),
        ),
        lambda: (
            torch.linspace(0, 1, 5),
            torch.linspace(-3, 7, 11),
            torch.linspace(2.5, -1.5, 7),
            torch.linspace(1, 1, 1),
            torch.linspace(0, 1, 0),
            torch.linspace(0, 10, 6, dtype=torch.int32),
        ),
        [()],
        grad=False,
    ),
    # correction 0 for the 0-d case: with correction 1 its var is NaN (0 / 0) and gcc's -fassociative-math folds
    # (-v + mean') + v to mean' in the summed gradient, dropping the NaN (the var row checks that case alone)
    reduction(
        "var_mean",
        lambda x, ax, k: x.var_mean(ax, k, correction=int(x.ndim > 0)),
        lambda x, ax, k: torch.var_mean(x, tdim(ax, x), keepdim=k, correction=int(x.dim() > 0)),
        dts=(F32,),
        big="large",
    ),
    reduction(
        "std_mean",
        lambda x, ax, k: x.std_mean(ax, k, correction=0),
        lambda x, ax, k: torch.std_mean(x, tdim(ax, x), keepdim=k, correction=0),
        dts=(F32,),
        big="large",
    ),
    Row(
        "masked_select",
        lambda x, m: x.masked_select(m),
        lambda x, m: torch.masked_select(x, m),
        [
            (Inp(F32, M, "nc"), Inp(B, M)),
            (Inp(F32, M), Inp(B, (5,), "nc")),
            (Inp(I32, M), Inp(B, (4, 1))),
            (Inp(F16, M), Inp(B, ())),
        ],
    ),
    Row(
        "nonzero",
        lambda x: (x.nonzero(), *x.nonzero(as_tuple=True)),
        lambda x: (x.nonzero(), *x.nonzero(as_tuple=True)),
        ew1(ALL, "ties")[:2] + ew1(ALL, "ties")[2:],
        grad=False,
    ),
    Row(
        "einsum",
        lambda a, b: (
            Tensor.einsum("ij,jk->ik", a, b),
            Tensor.einsum("ij->ji", a),
            Tensor.einsum("ij,ij->", a, b.T),
            Tensor.einsum("i,k->ik", a[0], b[0]),
            Tensor.einsum("ij,kj", a, a),
        ),
        lambda a, b: (
            torch.einsum("ij,jk->ik", a, b),
            torch.einsum("ij->ji", a),
            torch.einsum("ij,ij->", a, b.T),
            torch.einsum("i,k->ik", a[0], b[0]),
            torch.einsum("ij,kj", a, a),
        ),
        [(Inp(F32, M, "nc"), Inp(F32, (5, 4))), (Inp(F16, M), Inp(F16, (5, 4), "nc"))],
        "mid",
    ),
    Row(
        "__setitem__",
        _setitem,
        _setitem_ref,
        [(Inp(F32, M, "nc"), Inp(F32, (2, 3))), (Inp(I32, M), Inp(I32, (3,))), (Inp(F16, M), Inp(F16, ()))],
    ),
    # ---------------------------------------------------------------- losses on log-probabilities and probabilities
    Row(
        "nll_loss",
        _nll_ours,
        _nll_ref,
        [
            (Inp(F32, M, "nc", "mid"), Inp(I32, (4,), "c", "cls")),
            (Inp(F32, M), Inp(I32, (4,), "c", "cls_ign")),
            (Inp(F32, (4, 5, 3)), Inp(I32, (4, 3), "nc", "cls")),
            (Inp(F32, (5,)), Inp(I32, (), "c", "cls")),
        ],
        "mid",
        variant=True,
    ),
    Row(
        "binary_crossentropy",
        lambda x, y, i: x.sigmoid().binary_crossentropy(y, BCE[i % 3]),
        lambda x, y, i: F.binary_cross_entropy(torch.sigmoid(x), y, reduction=BCE[i % 3]),
        [
            (Inp(F32, M, "nc"), Inp(F32, M, "c", "prob")),
            (Inp(F32, M), Inp(F32, M, "nc", "prob")),
            (Inp(F32, (3,)), Inp(F32, (3,), "c", "prob")),
        ],
        "mid",
        variant=True,
    ),
    # probabilities of exactly 0 and 1 (sigmoid of ±300): the logs are clamped at -100; the targets are constants
    # here, as PyTorch's gradient for them is the unclamped log(1 - p) - log(p)
    Row(
        "binary_crossentropy_saturated",
        lambda x, y: x.sigmoid().binary_crossentropy(y.detach(), "none"),
        lambda x, y: F.binary_cross_entropy(torch.sigmoid(x), y.detach(), reduction="none"),
        [(Inp(F32, M, "nc"), Inp(F32, M, "c", "prob")), (Inp(F32, (3,)), Inp(F32, (3,), "c", "prob"))],
        cover_name=False,
    ),
    Row(
        "binary_crossentropy_logits",
        lambda x, y, w, i: (
            x.binary_crossentropy_logits(y, BCE[i % 3]),
            x.binary_cross_entropy_with_logits(y, BCE[(i + 1) % 3], w.detach()),
        ),
        lambda x, y, w, i: (
            F.binary_cross_entropy_with_logits(x, y, reduction=BCE[i % 3]),
            F.binary_cross_entropy_with_logits(x, y, reduction=BCE[(i + 1) % 3], pos_weight=w.detach()),
        ),
        [
            (Inp(F32, M, "nc"), Inp(F32, M, "c", "prob"), Inp(F32, (5,), "c", "pos")),
            (Inp(F32, M), Inp(F32, M, "nc", "prob"), Inp(F32, (), "c", "pos")),
            # moderate logits and pos_weight in half: ±6e4 overflows half inside PyTorch's formula
            (Inp(F16, M, "c", "mid"), Inp(F16, M, "nc", "prob"), Inp(F16, (5,), "c", "prob")),
        ],
        variant=True,
        covers=("binary_cross_entropy_with_logits",),
        htol=HALF_MID,
    ),
    # ---------------------------------------------------------------- convolutions (cases vary stride, padding,
    # dilation and groups)
    Row(
        "conv2d",
        lambda x, w, b, i: x.conv2d(w, b, *CONV2[i]),
        lambda x, w, b, i: F.conv2d(x, w, b, *CONV2[i]),
        [
            (Inp(F32, C4, "nc"), Inp(F32, (4, 3, 3, 3)), Inp(F32, (4,))),
            (Inp(F32, C4), Inp(F32, (4, 3, 2, 2), "nc"), Inp(F32, (4,))),
            (Inp(F32, (2, 4, 5, 5)), Inp(F32, (2, 2, 3, 2)), Inp(F32, (2,))),
        ],
        "mid",
        variant=True,
    ),
    Row(  # Winograd's F(2,3) and F(4,3) (forced: the cost rule takes larger convolutions), gradients by the rule
        "conv2d winograd",
        lambda x, w, b, i: _winograd_conv(x, w, b, i),
        lambda x, w, b, i: F.conv2d(x, w, b, padding=1),
        [
            (Inp(F32, C4, "nc"), Inp(F32, (4, 3, 3, 3)), Inp(F32, (4,))),
            (Inp(F32, (2, 4, 6, 7)), Inp(F32, (3, 4, 3, 3), "nc"), Inp(F32, (3,))),
        ],
        "mid",
        variant=True,
        cover_name=False,
        tol=dict(rtol=1e-3, atol=1e-4),  # F(4,3)'s rounding: ~1e-5 of the output's scale
    ),
    Row(
        "conv1d",
        lambda x, w, b, i: x.conv1d(w, b, *CONV1[i]),
        lambda x, w, b, i: F.conv1d(x, w, b, *CONV1[i]),
        [
            (Inp(F32, (2, 3, 7), "nc"), Inp(F32, (4, 3, 3)), Inp(F32, (4,))),
            (Inp(F32, (3, 7)), Inp(F32, (2, 3, 2)), Inp(F32, (2,))),
            (Inp(F32, (2, 3, 7)), Inp(F32, (6, 1, 3), "nc"), Inp(F32, (6,))),
        ],
        "mid",
        variant=True,
    ),
    Row(
        "conv3d",
        lambda x, w, b: (x.conv3d(w, b, padding=1), x.conv3d(w, None, stride=2, padding="valid")),
        lambda x, w, b: (F.conv3d(x, w, b, padding=1), F.conv3d(x, w, None, stride=2, padding="valid")),
        [(Inp(F32, (1, 2, 4, 5, 3), "nc"), Inp(F32, (3, 2, 2, 3, 2)), Inp(F32, (3,)))],
        "mid",
    ),
    Row(
        "conv_transpose2d",
        lambda x, w, b, i: x.conv_transpose2d(w, b, *[(1, 0, 0, 1, 1), (2, 1, 1, 1, 1), (2, 0, 0, 2, 2)][i]),
        lambda x, w, b, i: F.conv_transpose2d(x, w, b, *[(1, 0, 0, 1, 1), (2, 1, 1, 1, 1), (2, 0, 0, 2, 2)][i]),
        [
            (Inp(F32, (2, 3, 4, 5), "nc"), Inp(F32, (3, 2, 3, 3)), Inp(F32, (2,))),
            (Inp(F32, (2, 3, 4, 5)), Inp(F32, (3, 2, 3, 2), "nc"), Inp(F32, (2,))),
            (Inp(F32, (2, 4, 4, 5)), Inp(F32, (4, 1, 2, 3)), Inp(F32, (2,))),
        ],
        "mid",
        variant=True,
    ),
    Row(
        "conv_transpose1d",
        lambda x, w, b: (x.conv_transpose1d(w, b), x.conv_transpose1d(w, None, 3, 1, 2, 1, 2)),
        lambda x, w, b: (F.conv_transpose1d(x, w, b), F.conv_transpose1d(x, w, None, 3, 1, 2, 1, 2)),
        [(Inp(F32, (2, 3, 5), "nc"), Inp(F32, (3, 2, 3)), Inp(F32, (2,)))],
        "mid",
    ),
    # ---------------------------------------------------------------- pooling and resizing (max pooling pads with
    # -inf: the negative inputs show it; distinct values, as PyTorch sends a tie's gradient to one element)
    Row(
        "max_pool2d",
        lambda x, i: x.max_pool2d(**POOL[i]),
        lambda x, i: F.max_pool2d(x, **POOL[i]),
        [(Inp(F32, C4, "nc"),), (Inp(F32, C4),), (Inp(F16, C4),), (Inp(F32, (3, 5, 5)),)],
        "perm",
        variant=True,
    ),
    Row(
        "max_pool1d",
        lambda x: (x.max_pool1d(2), x.max_pool1d(3, 2, 1, ceil_mode=True), x.max_pool1d(2, 1, 1, 2)),
        lambda x: (F.max_pool1d(x, 2), F.max_pool1d(x, 3, 2, 1, ceil_mode=True), F.max_pool1d(x, 2, 1, 1, 2)),
        [(Inp(F32, (2, 3, 7), "nc"),), (Inp(F16, (3, 7)),)],
        "perm",
    ),
    Row(
        "avg_pool2d",
        lambda x, i: x.avg_pool2d(**AVG[i]),
        lambda x, i: F.avg_pool2d(x, **AVG[i]),
        [(Inp(F32, C4, "nc"),), (Inp(F32, C4),), (Inp(F32, C4),), (Inp(F16, (3, 5, 5)),)],
        "mid",
        variant=True,
    ),
    Row(
        "avg_pool1d",
        lambda x: (x.avg_pool1d(2), x.avg_pool1d(3, 2, 1, ceil_mode=True, count_include_pad=False)),
        lambda x: (F.avg_pool1d(x, 2), F.avg_pool1d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)),
        [(Inp(F32, (2, 3, 7), "nc"),)],
        "mid",
    ),
    Row(
        "adaptive_avg_pool2d",
        lambda x: (x.adaptive_avg_pool2d(2), x.adaptive_avg_pool2d((5, 1)), x.adaptive_avg_pool2d((3, None))),
        lambda x: (F.adaptive_avg_pool2d(x, 2), F.adaptive_avg_pool2d(x, (5, 1)), F.adaptive_avg_pool2d(x, (3, None))),
        [(Inp(F32, C4, "nc"),), (Inp(F16, (3, 5, 5)),)],
        "mid",
    ),
    Row(
        "interpolate",
        lambda x, i: x.interpolate(**INTERP[i]),
        lambda x, i: F.interpolate(x, **INTERP[i]),
        [(Inp(F32, C4, "nc"),), (Inp(F32, C4),), (Inp(F32, C4),), (Inp(F32, C4, "nc"),)],
        "mid",
        variant=True,
    ),
    Row(
        "interpolate_linear",
        lambda x: (
            x.interpolate(size=9, mode="linear"),
            x.interpolate(scale_factor=0.5, mode="linear", align_corners=True),
        ),
        lambda x: (
            F.interpolate(x, size=9, mode="linear"),
            F.interpolate(x, scale_factor=0.5, mode="linear", align_corners=True),
        ),
        [(Inp(F32, (2, 3, 7), "nc"),)],
        "mid",
        cover_name=False,
    ),
    # ---------------------------------------------------------------- attention, masks, norms, layers
    Row(
        "scaled_dot_product_attention",
        lambda q, k, v, m, i: _sdpa(Tensor.scaled_dot_product_attention, q, k, v, m, i),
        lambda q, k, v, m, i: _sdpa(F.scaled_dot_product_attention, q, k, v, m, i),
        [
            (Inp(F32, (2, 4, 3), "nc"), Inp(F32, (2, 5, 3)), Inp(F32, (2, 5, 4)), Inp(F32, (4, 5))),
            (Inp(F32, (2, 4, 3)), Inp(F32, (2, 4, 3), "nc"), Inp(F32, (2, 4, 4)), Inp(F32, (4, 4))),
            (Inp(F32, (2, 4, 3)), Inp(F32, (2, 5, 3)), Inp(F32, (2, 5, 4), "nc"), Inp(F32, (4, 5))),
            (Inp(F32, (2, 4, 3)), Inp(F32, (2, 5, 3)), Inp(F32, (2, 5, 4)), Inp(F32, (4, 5), "nc")),
            (Inp(F32, (2, 4, 3)), Inp(F32, (2, 5, 3)), Inp(F32, (2, 5, 4)), Inp(F32, (2, 4, 5))),
        ],
        "mid",
        variant=True,
    ),
    Row(
        "tril",
        lambda x: (x.tril(), x.tril(1), x.tril(-2), x.reshape(2, 2, 5).tril(3)),
        lambda x: (x.tril(), x.tril(1), x.tril(-2), x.reshape(2, 2, 5).tril(3)),
        ew1(ALL)[2:],
    ),
    Row(
        "triu",
        lambda x: (x.triu(), x.triu(1), x.triu(-2), x.reshape(2, 2, 5).triu(-1)),
        lambda x: (x.triu(), x.triu(1), x.triu(-2), x.reshape(2, 2, 5).triu(-1)),
        ew1(ALL)[2:],
    ),
    Row(
        "masked_fill",
        lambda x, m: (x.masked_fill(m, -math.inf), x.masked_fill(m, 2)),
        lambda x, m: (x.masked_fill(m, -math.inf), x.masked_fill(m, 2)),
        [(Inp(F32, M, "nc"), Inp(B, M)), (Inp(F16, M), Inp(B, (5,), "nc")), (Inp(F32, M), Inp(B, (4, 1)))],
    ),
    Row(
        "masked_fill_int",
        lambda x, m: x.masked_fill(m, 3),
        lambda x, m: x.masked_fill(m, 3),
        [(Inp(I32, M, "nc"), Inp(B, M)), (Inp(B, M), Inp(B, ()))],
        cover_name=False,
    ),
    Row(
        "layernorm",
        lambda x: (x.layernorm(), x.layernorm((-2, -1), eps=1e-3)),
        lambda x: (F.layer_norm(x, x.shape[-1:]), F.layer_norm(x, x.shape[-2:], eps=1e-3)),
        [(Inp(F32, M, "nc"),), (Inp(F32, (2, 3, 4)),), (Inp(F32, M, "c", "large"),)],
        "mid",
    ),
    Row(
        "batchnorm",
        lambda x, w, b, m, s: (x.batchnorm(w, b, m, s), x.batchnorm(None, None, m, s)),
        lambda x, w, b, m, s: (
            (x - m[:, None]) * w[:, None] * s[:, None] + b[:, None],
            (x - m[:, None]) * s[:, None],
        ),
        [(Inp(F32, (2, 3, 4), "nc"), Inp(F32, (3,)), Inp(F32, (3,)), Inp(F32, (3,)), Inp(F32, (3,), "c", "pos"))],
        "mid",
    ),
    Row(
        "batchnorm_eval",
        lambda x, w, b, m, v: x.batchnorm(w, b, m.detach(), (v.detach() + 1e-5).rsqrt()),
        lambda x, w, b, m, v: F.batch_norm(x, m.detach(), v.detach(), w, b, training=False, eps=1e-5),
        [(Inp(F32, (2, 3, 4)), Inp(F32, (3,)), Inp(F32, (3,)), Inp(F32, (3,)), Inp(F32, (3,), "c", "pos"))],
        "mid",
        cover_name=False,
    ),
    Row(
        "linear",
        lambda x, w, b: (x.linear(w, b), x.linear(w), x.linear(w[:, 0])),
        lambda x, w, b: (F.linear(x, w.T, b), F.linear(x, w.T), x * w[:, 0]),
        [
            (Inp(F32, M, "nc"), Inp(F32, (5, 3)), Inp(F32, (3,))),
            (Inp(F32, (2, 3, 5)), Inp(F32, (5, 5), "nc"), Inp(F32, (5,))),
        ],
        "mid",
    ),
    Row(
        "sequential",
        lambda x: x.sequential([Tensor.relu, lambda t: t * 2, Tensor.exp]),
        lambda x: torch.exp(torch.relu(x) * 2),
        ew1(FL, "mid")[2:],
    ),
    # ---------------------------------------------------------------- dropout and random creation
    Row("dropout", lambda x: (x.dropout(), x.dropout(0.9)), lambda x: (F.dropout(x, training=False),) * 2, ew1(FL)),
    Row(
        "dropout_train",
        lambda: (
            _train(lambda: Tensor.ones(3, 4).dropout(0.5)),
            _train(lambda: Tensor.ones(2, 3).dropout(0.25)),
            _train(lambda: Tensor.ones(3, 4).dropout(0.0)) + Tensor.rand(3, 4),
        ),
        lambda: ((0, 2.0 + 1e-6), (0, 4 / 3 + 1e-6), (1, 2)),
        [()],
        grad=False,
        random=True,
        cover_name=False,
        covers=("train", "training"),
    ),
    Row(
        "dropout_train_sum",  # p = 1 zeroes everything; p = 0 keeps x; kept elements are scaled by 1/(1-p)
        lambda x: (
            _train(lambda: x.dropout(1.0)),
            _train(lambda: x.dropout(0.0)),
            _train(lambda: (x.dropout(0.75) / x).max()),
        ),
        lambda x: (x * 0, x, torch.tensor(4.0)),
        [(Inp(F32, M, "c", "nonzero"),)],
        grad=False,
        cover_name=False,
    ),
    Row(
        "random_init",
        lambda: (
            Tensor.normal(3, 4, mean=5.0, std=0.1),
            Tensor.kaiming_normal(3, 4),
            Tensor.kaiming_uniform(3, 4, a=0.01),
            Tensor.glorot_uniform(3, 4),
            Tensor.scaled_uniform(2, 3),
            Tensor.random_bits(3, 4),
            Tensor([W5, W5]).multinomial(3, replacement=True),
        ),
        lambda: (
            (4.0, 6.0),
            (-10.0, 10.0),
            (-math.sqrt(3 / 4) * math.sqrt(2 / (1 + 1e-4)), math.sqrt(3 / 4) * math.sqrt(2 / (1 + 1e-4))),
            (-math.sqrt(6 / 7), math.sqrt(6 / 7)),
            (-(6**-0.5), 6**-0.5),
            (0, 2**32, "uint32"),
            (0, 5, "int32"),
        ),
        [()],
        grad=False,
        random=True,
        covers=("normal", "kaiming_normal", "kaiming_uniform", "glorot_uniform", "scaled_uniform", "random_bits"),
        cover_name=False,
    ),
    # the random permutations and draws whose sorted values are fixed: a permutation of 0..n-1, distinct draws
    # without replacement, and never a category of weight 0
    Row(
        "randperm",
        lambda: (
            Tensor.randperm(12).sort()[0],
            Tensor.randperm(1),
            Tensor([W5, [1.0, 1, 1, 1, 0]]).multinomial(4).sort(1)[0],
            Tensor([0.0, 0, 2, 0, 0]).multinomial(6, replacement=True),
            Tensor([0.0, 1, 0, 1, 1]).multinomial(3).sort()[0],
        ),
        lambda: (
            torch.arange(12, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32),
            torch.tensor([[0, 1, 2, 4], [0, 1, 2, 3]], dtype=torch.int32),
            torch.full((6,), 2, dtype=torch.int32),
            torch.tensor([1, 3, 4], dtype=torch.int32),
        ),
        [()],
        grad=False,
        covers=("multinomial",),
    ),
]


# ---------------------------------------------------------------- the ops ONNX's importer needs (issue 23, item 7)

PAD_MODES = ("reflect", "replicate", "circular")
PADS = [(1, 2, 2, 1), (-1, 2, 2, -1), (2, 2), (0, -2, 3, 0)]  # flat, innermost dim first; negative amounts crop
INTERP2 = [
    dict(size=(7, 3), mode="bicubic"),
    dict(scale_factor=(1.5, 0.7), mode="bicubic", align_corners=True),
    dict(size=(2, 3), mode="area"),
    dict(size=(7, 8), mode="area"),
    dict(scale_factor=2, mode="nearest"),
    dict(size=(3, 8), mode="nearest-exact"),
    dict(scale_factor=1.7, mode="bilinear", recompute_scale_factor=True),
]
INTERP3 = [
    dict(size=(2, 5, 7), mode="trilinear"),
    dict(scale_factor=(2, 0.5, 1.5), mode="trilinear", align_corners=True),
    dict(size=(5, 3, 2), mode="nearest"),
    dict(size=(2, 2, 3), mode="area"),
]
POOL3 = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0), ceil_mode=True),
]
AVG3 = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=(2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0), divisor_override=5),
]
C5 = (1, 2, 4, 5, 6)  # the 3-D pooling and resizing input shape


def _unpool(x, n, k, torch_=False):
    """max_pool{n}d with indices, then max_unpool{n}d back to x's size (non-overlapping windows: no index twice)."""
    if torch_:
        v, i = getattr(F, f"max_pool{n}d")(x, k, return_indices=True)
        return getattr(F, f"max_unpool{n}d")(v, i, k, output_size=x.shape[-n:]), i
    v, i = getattr(x, f"max_pool{n}d")(k, return_indices=True)
    return getattr(v, f"max_unpool{n}d")(i, k, output_size=x.shape[-n:]), i


ROWS += [
    binary(
        "div_rounding",
        lambda a, b: (a.div(b, rounding_mode="trunc"), a.div(b, rounding_mode="floor"), a.floor_divide(b)),
        lambda a, b: (torch.div(a, b, rounding_mode="trunc"), torch.div(a, b, rounding_mode="floor"), a // b),
        dts=NUM,
        dom="mid",
        dom_b="nonzero",
        grad=False,
        covers=("floor_divide",),
        cover_name=False,
    ),
    # traces, repeated letters and ellipses; float32 only: in float16 the gradient of an input used by many outputs
    # sums their pieces in half (PyTorch in float), which the one-ulp float16 tolerance does not allow
    Row(
        "einsum_diagonals",
        lambda a, b: (
            Tensor.einsum("ii->i", a[:, :4]),
            Tensor.einsum("ii", a[:, :4]),
            Tensor.einsum("iij->j", a.reshape(2, 2, 5)),
            Tensor.einsum("...ij->...ji", a.reshape(2, 2, 5)),
            Tensor.einsum("bij,bjk->bik", a.reshape(2, 2, 5), b.reshape(2, 5, 2)),
            Tensor.einsum("i...,i...->...", a, a),
            Tensor.einsum("...j,j", a, b[:, 0]),
            Tensor.einsum("iji->j", a.reshape(2, 5, 2)),
        ),
        lambda a, b: (
            torch.einsum("ii->i", a[:, :4]),
            torch.einsum("ii", a[:, :4]),
            torch.einsum("iij->j", a.reshape(2, 2, 5)),
            torch.einsum("...ij->...ji", a.reshape(2, 2, 5)),
            torch.einsum("bij,bjk->bik", a.reshape(2, 2, 5), b.reshape(2, 5, 2)),
            torch.einsum("i...,i...->...", a, a),
            torch.einsum("...j,j", a, b[:, 0]),
            torch.einsum("iji->j", a.reshape(2, 5, 2)),
        ),
        [(Inp(F32, M, "nc"), Inp(F32, (5, 4))), (Inp(F32, M), Inp(F32, (5, 4), "nc"))],
        "mid",
        cover_name=False,
    ),
    Row(
        "pad_modes",
        lambda x: tuple(x.pad(p, mode=m) for m in PAD_MODES for p in PADS),
        lambda x: tuple(F.pad(x, p, mode=m) for m in PAD_MODES for p in PADS),
        [(Inp(F32, (2, 4, 5), "nc"),), (Inp(F32, (2, 4, 5)),)],
        cover_name=False,
    ),
    # float16 values only (see einsum_diagonals: a gradient summed from many outputs rounds in half)
    Row(
        "pad_modes_half",
        lambda x: tuple(x.pad(p, mode=m) for m in PAD_MODES for p in PADS),
        lambda x: tuple(F.pad(x, p, mode=m) for m in PAD_MODES for p in PADS),
        [(Inp(F16, (2, 4, 5), "nc"),)],
        grad=False,
        cover_name=False,
    ),
    Row(
        "pad_modes_3d",
        lambda x: tuple(x.pad((1, 1, 2, 0, 0, -1), mode=m) for m in PAD_MODES),
        lambda x: tuple(F.pad(x, (1, 1, 2, 0, 0, -1), mode=m) for m in PAD_MODES),
        [(Inp(F32, (1, 2, 3, 4, 5), "nc"),)],
        cover_name=False,
    ),
    # scans over a zero-size axis: empty results of the scan's dtype (bool and ints sum in int32)
    Row(
        "cum_empty",
        lambda x: (x.cumsum(0), x.cumprod(0), x.cummax(0), x.cummin(0), x.cumsum(-1)),
        lambda x: (x.cumsum(0), x.cumprod(0), x.cummax(0).values, x.cummin(0).values, x.cumsum(-1)),
        [(Inp(F32, (0, 5)),), (Inp(F32, (3, 0)),), (Inp(I32, (0, 5)),), (Inp(B, (0, 4)),), (Inp(F32, (0,)),)],
        grad=False,
        cover_name=False,
    ),
    Row(
        "interpolate_modes",
        lambda x, i: x.interpolate(**INTERP2[i]),
        lambda x, i: F.interpolate(x, **INTERP2[i]),
        [
            (Inp(F32, C4, "nc"),),
            (Inp(F32, C4),),
            (Inp(F32, C4),),
            (Inp(F32, C4, "nc"),),
            (Inp(F32, C4),),
            (Inp(F32, C4),),
            (Inp(F32, C4, "nc"),),
        ],
        "mid",
        variant=True,
        cover_name=False,
    ),
    Row(
        "interpolate_half",
        lambda x: tuple(x.interpolate(**kw) for kw in INTERP2),
        lambda x: tuple(F.interpolate(x, **kw) for kw in INTERP2),
        [(Inp(F16, C4, "nc"),)],
        "mid",
        grad=False,
        cover_name=False,
        htol=HALF_MID,  # PyTorch's half bicubic and area round between the two separable passes
    ),
    Row(
        "interpolate_3d",
        lambda x, i: x.interpolate(**INTERP3[i]),
        lambda x, i: F.interpolate(x, **INTERP3[i]),
        [(Inp(F32, C5, "nc"),), (Inp(F32, C5),), (Inp(F32, C5, "nc"),), (Inp(F32, C5),)],
        "mid",
        variant=True,
        cover_name=False,
    ),
    Row(
        "avg_pool3d",
        lambda x, i: x.avg_pool3d(**AVG3[i]),
        lambda x, i: F.avg_pool3d(x, **AVG3[i]),
        [(Inp(F32, C5, "nc"),), (Inp(F32, C5),), (Inp(F32, C5),)],
        "mid",
        variant=True,
    ),
    Row(
        "max_pool3d",
        lambda x, i: x.max_pool3d(**POOL3[i], return_indices=i > 0),
        lambda x, i: F.max_pool3d(x, **POOL3[i], return_indices=i > 0),
        [(Inp(F32, C5, "nc"),), (Inp(F32, C5),), (Inp(F16, C5),)],
        "perm",
        variant=True,
    ),
    # the flat index of each window's maximum in its plane (int32 here, int64 in PyTorch)
    Row(
        "max_pool_indices",
        lambda x, i: (x.max_pool2d(**POOL[i], return_indices=True), x[..., 0, :].max_pool1d(2, return_indices=True)),
        lambda x, i: (
            F.max_pool2d(x, **POOL[i], return_indices=True),
            F.max_pool1d(x[..., 0, :], 2, return_indices=True),
        ),
        [(Inp(F32, C4, "nc"),), (Inp(F32, C4),), (Inp(F16, C4),), (Inp(F32, (3, 5, 5)),)],
        "perm",
        variant=True,
        cover_name=False,
    ),
    Row(
        "max_unpool2d",
        lambda x: (_unpool(x, 2, 2), _unpool(x, 2, (1, 2))),
        lambda x: (_unpool(x, 2, 2, True), _unpool(x, 2, (1, 2), True)),
        [(Inp(F32, C4, "nc"),), (Inp(F32, (3, 5, 5)),)],
        "perm",
    ),
    Row(
        "max_unpool1d",
        lambda x: _unpool(x, 1, 2),
        lambda x: _unpool(x, 1, 2, True),
        [(Inp(F32, (2, 3, 7), "nc"),)],
        "perm",
    ),
    Row("max_unpool3d", lambda x: _unpool(x, 3, 2), lambda x: _unpool(x, 3, 2, True), [(Inp(F32, C5, "nc"),)], "perm"),
    # shifts by tensors: negative and too-large amounts give 0 (or the sign, for >> of a negative), as PyTorch
    binary(
        "bitwise_left_shift",
        lambda a, b: (a.bitwise_left_shift(b), a << b, 3 << b, a << (b + 28)),
        lambda a, b: (a.bitwise_left_shift(b), a << b, 3 << b, a << (b + 28)),
        dts=(I32,),
        dom="wide",
        covers=("__rlshift__",),
    ),
    binary(
        "bitwise_right_shift",
        lambda a, b: (a.bitwise_right_shift(b), a >> b, -77 >> b, a >> (b + 28)),
        lambda a, b: (a.bitwise_right_shift(b), a >> b, -77 >> b, a >> (b + 28)),
        dts=(I32,),
        dom="wide",
        covers=("__rrshift__",),
    ),
    # the same bytes as another dtype; a narrower one multiplies the last dim (PyTorch needs it contiguous)
    Row(
        "bitcast",
        lambda x: (x.bitcast(x.dtype), x.bitcast(dtypes.uint8), x.bitcast(dtypes.int16)),
        lambda x: (x, x.contiguous().view(torch.uint8), x.contiguous().view(torch.int16)),
        [(Inp(F32, M, "nc"),), (Inp(F16, M),), (Inp(I32, M, "c", "wide"),), (Inp(B, (4, 6)),)],
        grad=False,
    ),
    Row(
        "bitcast_same_size",
        lambda x: x.bitcast(dtypes.int32 if x.dtype.is_float else dtypes.float32),
        lambda x: x.view(torch.int32 if x.is_floating_point() else torch.float32),
        [(Inp(F32, M, "c", "nf"),), (Inp(I32, M, "c", "wide"),), (Inp(F32, (0, 5)),)],
        grad=False,
        cover_name=False,
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
    "seeded",  # a context manager around the generator, no op of its own: test_random.py
    "hold",  # rebinds the graph a tensor holds (its `uop` attribute), keeping the reader record: test_assign.py
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
    # mode switches (class flags and their context managers), not ops: test_modes in test_torch_sweep.py
    "no_grad",
    "test",
}

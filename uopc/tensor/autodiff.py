"""Reverse-mode autodiff on the shape graph: a gradient is a UOp graph built from the forward UOps.

Walk the loss graph from the root to the leaves (reverse topological order); each node hands its gradient to its
sources through one rule per op (`GRAD_RULES`, data). Because UOps are hash-consed, a rule that mentions a forward
node (MUL's other operand, the output of EXP2) refers to the very same node, so the forward value is computed once
and shared by the loss and the gradient kernels.

    >>> w = new_buffer(dtypes.float32, 2, np.array([1.0, 2.0]))
    >>> loss = (w * w).reduce(Ops.ADD, 1)
    >>> compute_gradient(loss, UOp.const(1.0, dtypes.float32), [w])[w]     # w*1 + w*1, reading w's own buffer

STAGE is the identity for gradients; STAGE("detach") stops them. BUFFER and CONST are leaves.

A composite op can bring its own gradient: `with_gradient(value, inputs, rule, params)` marks its value with a
CUSTOM_GRAD node, and autodiff then calls the rule registered under that name (`CUSTOM_RULES`) instead of
differentiating the value's own graph. The rule may return any graph (a convolution's input gradient is a
transposed convolution, its weight gradient a GEMM over batch and positions), not only elementwise algebra.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

from uopc.helpers import argsort
from uopc.uop import ALU, MOVEMENT, STORED, GradFn, Ops, Span, UOp
from uopc.uop.dtype import DType, dtypes

# ---------------------------------------------------------------------------------------------------
# small builders (every constant in the dtype of the value it meets, so float64 graphs stay float64)


def _c(v: float, dt: DType) -> UOp:
    return UOp.const(v, dt)


def _where(cond: UOp, a: UOp, b: UOp) -> UOp:
    return cond.alu(Ops.WHERE, a, b)


def _keep_dims(x: UOp, shape: tuple[int, ...]) -> UOp:
    """A reduced value x (shape[:len(x.shape)]) broadcast back to `shape`: reshape in size-1 dims, then expand."""
    n = len(shape) - len(x.shape)
    return x.reshape(x.shape + (1,) * n).expand(shape)


def _max_grad(g: UOp, a: UOp, b: UOp) -> UOp:
    """The part of g that max(a, b) sends to a: g where a wins, 0 where b wins, g / 2 at a tie. Selects, not a
    weight times g: the loser gets 0 even where g is inf or NaN (as PyTorch's masked gradient)."""
    zero = _c(0.0, g.dtype)
    return _where(b.alu(Ops.CMPLT, a), g, _where(a.alu(Ops.CMPNE, b), zero, g * _c(0.5, g.dtype)))


def _reduce_grad(g: UOp, x: UOp) -> tuple[UOp | None, ...]:
    """REDUCE over the last n axes: ADD sends g back to every input; MAX to the maxima, shared among ties."""
    a = x.src[0]
    rop, _n = x.arg
    if rop is Ops.ADD:
        return (_keep_dims(g, a.shape),)
    dt, n = a.dtype, len(a.shape) - len(x.shape)
    if not is_stored(a):
        # a computed value is recomputed in every kernel that reads it, and gcc may round it differently in each
        # (FMA contraction, reassociation): compared with the max kernel's result, no element might match (ties = 0,
        # gradient NaN). Materialize it once and take the max of those stored values, which one of them equals.
        a = UOp(Ops.STAGE, (a,))
        x = a.reduce(Ops.MAX, n)
    is_max = _where(a.alu(Ops.CMPNE, _keep_dims(x, a.shape)), _c(0.0, dt), _c(1.0, dt))
    ties = is_max.reduce(Ops.ADD, n)
    return (is_max * _keep_dims(g * ties.alu(Ops.RECIP), a.shape),)


def is_stored(u: UOp) -> bool:
    """A value read straight from a buffer (through views; a constant, a contiguous()): every kernel reads the same
    numbers."""
    while u.op in MOVEMENT:
        u = u.src[0]
    return u.op in (Ops.BUFFER, Ops.CONST) or (u.op is Ops.STAGE and u.arg != "detach")


def _expand_grad(g: UOp, x: UOp) -> tuple[UOp]:
    """EXPAND copies a value along its size-1 axes: the gradient sums over them (moved to the end, then reduced)."""
    src = x.src[0].shape
    grown = [i for i, (s, e) in enumerate(zip(src, x.shape, strict=True)) if s != e]
    kept = [i for i in range(len(src)) if i not in grown]
    return (g.permute(tuple(kept + grown)).reduce(Ops.ADD, len(grown)).reshape(src),)


def _unpad(pads: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The SHRINK bounds that cut a PAD's input window back out of its output."""
    return tuple((lo, lo + s) for (lo, _), s in zip(pads, shape, strict=True))


def _unshrink(bounds: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The PAD that puts a SHRINK's window back at its place in the input shape."""
    return tuple((lo, s - hi) for (lo, hi), s in zip(bounds, shape, strict=True))


def _stage(g: UOp) -> UOp:
    """A value materialized in the forward pass (contiguous()) gets its gradient materialized too: the backward
    consumers read it once instead of each recomputing the chain behind it (a pooling gradient under BatchNorm's)."""
    base = g
    while base.op in MOVEMENT:  # a view of a value that is already materialized recomputes nothing
        base = base.src[0]
    return g if base.op in STORED or base.op is Ops.CONST else UOp(Ops.STAGE, (g,))


def _no_grad(g: UOp, x: UOp) -> tuple[None, ...]:
    return (None,) * len(x.src)


def _scatter_back(g: UOp, x: UOp) -> UOp:
    """d GATHER(a, index) / da: each gradient element added back where it was read from (repeats accumulate)."""
    dim, label, wrap = x.arg
    return zeros_like(x.src[0]).scatter_add(x.src[1], g, dim, label + " backward", wrap)


def _scatter_grad(g: UOp, x: UOp) -> tuple[UOp | None, ...]:
    """SCATTER(base, index, values): an add sends g to the base and gathers it back for the values; a max sends g
    to every element equal to the result, shared among ties (as a MAX reduce)."""
    base, index, values = x.src
    dim, label, wrap, rop = x.arg
    back = label + " backward"
    if rop is Ops.ADD:
        return (g, None, g.gather(index, dim, back, wrap))
    if rop is not Ops.MAX:
        raise NotImplementedError(f"{label}: no gradient for a {rop.name} scatter")
    if not (is_stored(base) and is_stored(values)):  # compare stored numbers with stored numbers (see _reduce_grad)
        base = base if is_stored(base) else UOp(Ops.STAGE, (base,))
        values = values if is_stored(values) else UOp(Ops.STAGE, (values,))
        x = base.scatter_reduce(index, values, dim, rop, label, wrap)
    dt = x.dtype
    one, zero = _c(1.0, dt), _c(0.0, dt)
    hit_base = _where(base.alu(Ops.CMPNE, x), zero, one)
    hit_vals = _where(values.alu(Ops.CMPNE, x.gather(index, dim, back, wrap)), zero, one)
    ties = zeros_like(base).scatter_add(index, hit_vals, dim, back, wrap) + hit_base
    share = g * ties.alu(Ops.RECIP)
    return (hit_base * share, None, hit_vals * share.gather(index, dim, back, wrap))


def _region_view(g: UOp, region: tuple[Span, ...]) -> UOp:
    """The elements of a SETITEM region as a view of g (shape: the counts): per dim shrink to the span's first..last
    element, flip a negative step, keep every step-th element."""
    lo_hi, flips, steps = [], [], []
    for d, sp in enumerate(region):
        last = sp.start + (sp.count - 1) * sp.step
        lo_hi.append((min(sp.start, last), max(sp.start, last) + 1))
        if sp.step < 0:
            flips.append(d)
        steps.append(abs(sp.step))
    x = g.shrink(tuple(lo_hi)).flip(tuple(flips))
    for d, st in enumerate(steps):
        if st > 1:  # every st-th element: pad to count * st, split (count, st), keep column 0
            n, c = x.shape[d], region[d].count
            x = x.pad(tuple((0, c * st - n) if i == d else (0, 0) for i in range(x.ndim)))
            x = x.reshape(x.shape[:d] + (c, st) + x.shape[d + 1 :])
            x = x.shrink(tuple((0, 1) if i == d + 1 else (0, s) for i, s in enumerate(x.shape)))
            x = x.reshape(x.shape[: d + 1] + x.shape[d + 2 :])
    return x


LN2 = math.log(2.0)

# Gradient rules of composite ops, by name: (gradient of the value, the CUSTOM_GRAD node) -> one gradient (or None)
# per input, in order. The node's src is (value, *inputs) and its arg the GradFn with the rule's static params.
CUSTOM_RULES: dict[str, Callable[[UOp, UOp], tuple[UOp | None, ...]]] = {}


def with_gradient(value: UOp, inputs: tuple[UOp, ...], rule: str, params: tuple = ()) -> UOp:
    """`value`, marked so that autodiff differentiates it with CUSTOM_RULES[rule] (with `params`) for `inputs`."""
    if rule not in CUSTOM_RULES:
        raise KeyError(f"autodiff: no custom gradient rule named {rule!r}")
    return UOp(Ops.CUSTOM_GRAD, (value, *inputs), GradFn(rule, params))


def _custom_grad(g: UOp, x: UOp) -> tuple[UOp | None, ...]:
    """The value's own graph gets nothing (it is not differentiated); the inputs get what the named rule says."""
    grads = CUSTOM_RULES[x.arg.rule](g, x)
    if len(grads) != len(x.src) - 1:
        raise RuntimeError(f"autodiff: rule {x.arg.rule!r} gave {len(grads)} gradients for {len(x.src) - 1} inputs")
    return (None, *grads)


# One rule per op: (gradient of the node, the node) -> one gradient (or None) per source, in source order.
GradRule = Callable[[UOp, UOp], tuple[UOp | None, ...]]
GRAD_RULES: dict[Ops, GradRule] = {
    # ---- ALU
    Ops.ADD: lambda g, x: (g, g),  # d(a+b) = da + db
    Ops.MUL: lambda g, x: (_times(g, x.src[1]), _times(g, x.src[0])),  # d(ab) = b da + a db
    Ops.NEG: lambda g, x: (-g,),
    Ops.RECIP: lambda g, x: (-(g * x * x),),  # d(1/a) = -1/a^2 da = -x^2 da
    Ops.SQRT: lambda g, x: (g * (x * _c(2.0, x.dtype)).alu(Ops.RECIP),),  # d sqrt(a) = da / (2 sqrt(a))
    Ops.EXP2: lambda g, x: (g * x * _c(LN2, x.dtype),),  # d 2^a = 2^a ln2 da
    Ops.LOG2: lambda g, x: (g * (x.src[0] * _c(LN2, x.dtype)).alu(Ops.RECIP),),  # d log2(a) = da / (a ln2)
    # cos(a) = sin(pi/2 - a): the IR has no COS
    Ops.SIN: lambda g, x: (g * (_c(math.pi / 2, x.dtype) - x.src[0]).alu(Ops.SIN),),
    Ops.MAX: lambda g, x: (_max_grad(g, x.src[0], x.src[1]), _max_grad(g, x.src[1], x.src[0])),
    # the condition gets nothing; each branch gets g where it was chosen
    Ops.WHERE: lambda g, x: (None, _where(x.src[0], g, _c(0.0, g.dtype)), _where(x.src[0], _c(0.0, g.dtype), g)),
    Ops.CAST: lambda g, x: (g.cast(x.src[0].dtype),),  # the gradient goes back in the source's dtype
    # piecewise constant or integer-valued: no gradient
    Ops.CMPLT: _no_grad,
    Ops.CMPNE: _no_grad,
    Ops.IDIV: _no_grad,
    Ops.MOD: _no_grad,
    Ops.AND: _no_grad,
    Ops.OR: _no_grad,
    Ops.XOR: _no_grad,
    Ops.TRUNC: _no_grad,
    # ---- reductions
    Ops.REDUCE: _reduce_grad,
    # ---- movement ops: each maps the gradient back through the inverse index map
    Ops.RESHAPE: lambda g, x: (g.reshape(x.src[0].shape),),
    Ops.EXPAND: _expand_grad,
    Ops.PERMUTE: lambda g, x: (g.permute(tuple(argsort(list(x.arg)))),),
    Ops.PAD: lambda g, x: (g.shrink(_unpad(x.arg, x.src[0].shape)),),  # keep the original window
    Ops.SHRINK: lambda g, x: (g.pad(_unshrink(x.arg, x.src[0].shape)),),  # zeros where nothing was read
    Ops.FLIP: lambda g, x: (g.flip(tuple(i for i, f in enumerate(x.arg) if f)),),
    # ---- data-dependent reads and writes: each is the other's gradient; the index gets none
    Ops.GATHER: lambda g, x: (_scatter_back(g, x), None),
    Ops.SCATTER: lambda g, x: _scatter_grad(g, x),
    # the base gets g where it was kept (the region zeroed), the value g's region
    Ops.SETITEM: lambda g, x: (g.setitem(zeros_like(x.src[1]), x.arg), _region_view(g, x.arg)),
    # ---- materialization: contiguous() is the identity, detach() stops the gradient
    Ops.STAGE: lambda g, x: (None,) if x.arg == "detach" else (_stage(g),),
    # ---- a composite with its own rule (with_gradient)
    Ops.CUSTOM_GRAD: _custom_grad,
}


# constant arithmetic on the gradient path (the seed 1.0 times a mean's 1/n) folds to one CONST here, so the
# gradient graph never holds an ALU of constants under a RESHAPE/EXPAND
_FOLD = {Ops.ADD: operator.add, Ops.MUL: operator.mul, Ops.NEG: operator.neg}


def _times(g: UOp, y: UOp) -> UOp:
    """g * y, or y itself where g is a broadcast 1.0 of y's shape: the seed of (out * y).sum(), the way a caller
    injects an upstream gradient y, which would otherwise be a product (a copy kernel) in front of whatever reads y
    from storage (a convolution's input-gradient transform)."""
    one = g
    while one.op in (Ops.RESHAPE, Ops.EXPAND):
        one = one.src[0]
    if one.op is Ops.CONST and one.arg == 1 and g.shape == y.shape and g.dtype is y.dtype:
        return y
    return g * y


def _fold(u: UOp) -> UOp:
    if u.op in _FOLD and all(s.op is Ops.CONST for s in u.src):
        return UOp.const(_FOLD[u.op](*(s.arg for s in u.src)), u.dtype)
    return u


def _grads_of(rule: GradRule, g: UOp, x: UOp) -> tuple[UOp | None, ...]:
    """The gradients a rule sends x's sources. An ALU op on float16 or bfloat16 gets its formula evaluated in float32
    and each gradient rounded once to its source's dtype, as its forward value is (sin's cos(x) = sin(pi/2 - x) would
    otherwise round pi/2 - x to half first)."""
    if x.op not in ALU or x.op is Ops.CAST or not any(u.dtype.is_16bit_float for u in (x, *x.src)):
        return rule(g, x)
    src = tuple(s.cast(dtypes.float32) if s.dtype.is_16bit_float else s for s in x.src)
    gs = rule(g.cast(dtypes.float32), UOp(x.op, src, x.arg))
    return tuple(None if d is None else d.cast(s.dtype) for d, s in zip(gs, x.src, strict=True))


def _differentiable(u: UOp) -> bool:
    """Only float values carry gradients (an index, a mask or a token id has none)."""
    return u.dtype is not None and u.dtype.is_float


def _fit(g: UOp, shape: tuple[int, ...]) -> UOp:
    """A gradient for a source of `shape`; a shape-() operand that an ALU op broadcast gets the sum."""
    if g.shape == shape:
        return g
    if shape == ():
        return g.reduce(Ops.ADD, len(g.shape))
    raise RuntimeError(f"autodiff: gradient of shape {g.shape} for a value of shape {shape}")


def zeros_like(u: UOp) -> UOp:
    """A lazy zero of u's shape and dtype (a broadcast CONST: no buffer until realized)."""
    z = _c(0.0, u.dtype) if u.dtype.is_float else UOp.const(0, u.dtype)
    return z.reshape((1,) * len(u.shape)).expand(u.shape) if u.shape else z


def _needs_grad(topo: list[UOp], targets: set[UOp]) -> set[UOp]:
    """The nodes some target is reachable from (not through a detach): the only ones worth differentiating."""
    on_path: set[UOp] = set()
    for u in topo:  # sources come before their users
        if u in targets:
            on_path.add(u)
        elif not (u.op is Ops.STAGE and u.arg == "detach") and any(s in on_path for s in u.src):
            on_path.add(u)
    return on_path


def compute_gradient(root: UOp, root_grad: UOp, targets: list[UOp]) -> dict[UOp, UOp]:
    """Gradients of `root` (seeded with root_grad) for every node on a path to a target, keyed by forward node.

    In: a shape graph and the nodes to differentiate for. Out: gradient graphs that share the forward's nodes.
    A target the root does not depend on is absent from the result.
    """
    topo = root.toposort()
    on_path = _needs_grad(topo, set(targets))
    grads: dict[UOp, UOp] = {root: root_grad}
    for x in reversed(topo):
        g = grads.get(x)
        # a size-0 value carries no gradient (its reductions over nothing would be kernels that write nothing)
        if g is None or x not in on_path or not x.src or x.size == 0:
            continue
        rule = GRAD_RULES.get(x.op)
        if rule is None:
            raise NotImplementedError(f"autodiff: no gradient rule for {x.op} (node {x!r})")
        for s, gs in zip(x.src, _grads_of(rule, g, x), strict=True):
            if gs is None or s not in on_path or not _differentiable(s):
                continue
            gs = _fit(_fold(gs), s.shape)
            grads[s] = _fold(grads[s] + gs) if s in grads else gs
    return {t: grads[t] for t in targets if t in grads}

"""The user-facing lazy Tensor: PyTorch/tinygrad-style names on top of the UOp shape graph.

Operations only build UOps; `numpy()`, `item()` or `realize()` hand the graph to the realize stage, which cuts it
into kernels, compiles them and returns a buffer:

    >>> from uopc import Tensor
    >>> x = Tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> y = (x * 2 - 1).relu().sum(1)      # a graph of UOps: nothing has run yet
    >>> y.tolist()                         # one fused kernel, r_2
    [4.0, 12.0]

This file holds what makes a Tensor a Tensor: construction, realize/numpy, assign/detach, casts and the gradient
bookkeeping (which tensors want gradients, accumulating .grad). The operations come from one mixin per concern
(`uopc/tensor/__init__.py` says what each holds): creation.py, elementwise.py, math.py, reduce.py, scan.py,
movement.py, extras.py, loss.py, conv.py, pool.py, attention.py, norm.py and random.py.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from uopc import helpers
from uopc.helpers import prod
from uopc.runtime.buffer import is_contiguous_buffer, new_buffer, storage_view
from uopc.tensor.attention import AttentionMixin
from uopc.tensor.autodiff import CUSTOM_RULES, compute_gradient, zeros_like
from uopc.tensor.conv import ConvMixin
from uopc.tensor.creation import CreationMixin, full_uop, host_array
from uopc.tensor.elementwise import ElementwiseMixin
from uopc.tensor.extras import ExtrasMixin
from uopc.tensor.loss import LossMixin
from uopc.tensor.math import MathMixin
from uopc.tensor.movement import MovementMixin, View
from uopc.tensor.norm import NormMixin
from uopc.tensor.pool import PoolMixin
from uopc.tensor.random import RandomMixin
from uopc.tensor.reduce import ReduceMixin
from uopc.tensor.scan import ScanMixin
from uopc.tensor.shape import Scalar, broadcast_shape, is_scalar, norm_dim
from uopc.uop import Ops, Span, UOp, add_reader, base_buffer, forget_reader
from uopc.uop.dtype import DType, bf16_bits_to_float, dtypes, least_upper_float, to_dtype
from uopc.uop.variable import Bound, Variable, merge_vars, symbolic

# repr shows the values of a realized tensor with at most this many elements
REPR_MAX_VALUES = 64


# the graph each realized value that tracks gradients was computed from, keyed by the node the tensor holds after
# realize (its buffer): a loss built on that value differentiates through the graph, as PyTorch's autograd keeps a
# printed tensor's grad_fn. Weak: an entry lives as long as some graph or tensor still holds the buffer's node.
_kept_graphs: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()


def _is_kept(u: UOp) -> bool:
    return (u.op is Ops.BUFFER or (u.op is Ops.RESHAPE and u.src[0].op is Ops.BUFFER)) and u in _kept_graphs


class _Pending(NamedTuple):
    """An assign not realized yet: the BUFFER it replaces (None if the tensor was lazy before its first assign)."""

    replaces: UOp | None


class Tensor(
    RandomMixin,
    CreationMixin,
    ScanMixin,
    MathMixin,
    ExtrasMixin,
    ElementwiseMixin,
    ReduceMixin,
    MovementMixin,
    LossMixin,
    ConvMixin,
    PoolMixin,
    AttentionMixin,
    NormMixin,
):
    """A lazy n-dimensional array: operations build a UOp graph, numpy()/item()/realize() compute it."""

    fuse_reduce: bool = False  # passed to uopc.engine.realize.realize: let reductions fuse into their consumers
    __array_ufunc__ = None  # NumPy defers to our reflected operators: np_array + t calls t.__radd__
    device = "CPU"
    # tensors that loss.backward() without a parameter list may fill: those made requires_grad=True, and float ones
    # created from data with requires_grad None ("not decided", as tinygrad: they get a gradient when backward
    # reaches them); id -> tensor, weakly: a WeakSet would compare tensors with __eq__, which builds a Tensor
    _grad_tensors: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
    # tensors with an assign not realized yet, id -> tensor (TinyJit's capture realizes those its step made)
    _pending_assigns: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
    # the values of the Variables in this tensor's graph (uopc.uop.variable): set by ops that take a Bound, merged by
    # every op into its result; shared empty until then (never changed in place: a new dict replaces it)
    _vars: dict[Variable, int] = {}

    def __init__(self, data: Any, dtype: Any = None, requires_grad: bool | None = None):
        self.requires_grad = requires_grad
        if requires_grad:
            Tensor._grad_tensors[id(self)] = self
        self.grad: Tensor | None = None
        # the graph a realized tensor came from, kept while it tracks gradients (loss.item(); loss.backward())
        self._graph: UOp | None = None
        self._leaf = True  # created from data (or assign): realize never keeps a leaf's graph
        self._assigned: _Pending | None = None  # an assign is pending, until it is realized
        self._view_of: View | None = None  # made by basic indexing: an assign to it writes the tensor it views
        if isinstance(data, Tensor):
            data = data.uop
        if isinstance(data, Bound):  # a bound Variable as a value: a 0-d int32 whose value is the call's binding
            self._vars = {data.var: data.value}
            data = UOp(Ops.DEFINE_VAR, (), data.var, dtypes.int32)
        if isinstance(data, UOp):
            u = data if dtype is None else data.cast(to_dtype(dtype))
            # the graph of this tensor's value (a BUFFER, or RESHAPEs of one, once realized); read it freely, change
            # it only through hold()
            self.uop = u
            if u.tracked:
                add_reader(u, self)
            return
        arr, dt = host_array(data, dtype)
        self.uop = full_uop(0, dt, arr.shape) if arr.size == 0 else new_buffer(dt, arr.size, arr).reshape(arr.shape)
        if requires_grad is None and dt.is_float:
            Tensor._grad_tensors[id(self)] = self

    def hold(self, u: UOp) -> None:
        """Make this tensor hold the graph `u` (its value from now on): the one way to change `.uop` after
        construction. It keeps the record of who reads tracked storage (uopc.uop.add_reader) that TinyJit's in-place
        writes consult, so no write ever changes a value a tensor holds. (`uop` is a plain attribute, not a property:
        it is read on every operation, and a descriptor made each read measurably slower.)"""
        old = self.uop
        if old.tracked:
            forget_reader(old, self)
        self.uop = u
        if u.tracked:
            add_reader(u, self)

    def _new(self, uop: UOp, *others: Tensor) -> Tensor:
        """A tensor computed from self (and others): it tracks gradients if any input does."""
        out = Tensor(uop)  # set requires_grad afterwards: an op result is not a parameter to register
        grad = not Tensor.no_grad and (self.requires_grad or any(o.requires_grad for o in others))
        out.requires_grad = True if grad else None
        out._leaf = False
        if self._vars or (others and any(o._vars for o in others)):  # (no generator for a unary op: a hot path)
            out._vars = merge_vars(self._vars, *(o._vars for o in others))
        return out

    def _bound(self, binds: dict[Variable, int]) -> Tensor:
        """Record the values of Variables an op of this tensor took bound (Variable.bind); returns self."""
        if binds:
            self._vars = merge_vars(self._vars, binds)
        return self

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Mark this tensor as one whose gradient backward() computes (False: never; returns self)."""
        self.requires_grad = requires_grad
        if requires_grad is not False:
            Tensor._grad_tensors[id(self)] = self
        return self

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
        """Values only for a small tensor that is already computed (a buffer); a lazy one is never realized by
        repr, so printing a tensor never runs work: it shows its shape and dtype and says (lazy)."""
        grad = "" if self.requires_grad is None else f", requires_grad={self.requires_grad}"
        if is_contiguous_buffer(self.uop) and 0 < self.numel() <= REPR_MAX_VALUES:
            vals = np.array2string(self.numpy(), separator=", ", threshold=REPR_MAX_VALUES, prefix="Tensor(")
            return f"Tensor({vals}, dtype={self.dtype!r}{grad})"
        state = "" if is_contiguous_buffer(self.uop) or self.numel() == 0 else " (lazy)"
        return f"<Tensor shape={self.shape} dtype={self.dtype!r}{grad}{state}>"

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

    def realize(self, *others: Tensor) -> Tensor:
        """Compute this tensor (and `others`, in the same plan: tinygrad's x.realize(a, b)) now; returns self."""
        Tensor.realize_all(self, *others)
        return self

    @staticmethod
    def realize_all(*tensors: Tensor) -> None:
        """Realize several tensors in one realize call, so they share one plan and its common work."""
        # imported here, not at the top, so that `import uopc` does not load the compiler: it loads on the first realize
        from uopc.engine import realize

        todo = []
        counter = RandomMixin._rng_counter
        if counter is not None and not is_contiguous_buffer(counter.uop):  # a random draw advanced it: same plan
            tensors = (*tensors, counter)
        for t in dict.fromkeys(tensors):
            if t.numel() == 0:  # never realize an empty root: its value is fully known
                t.hold(full_uop(0, t.dtype, t.shape))
            elif not is_contiguous_buffer(t.uop):
                todo.append(t)
        if not todo:
            return
        roots = [t.uop for t in todo]
        assigns = None  # which roots are assigns: their storage is tracked; TinyJit follows them, may write in place
        for t in todo:  # a loop, not any(generator): this runs on every realize (the 16-element add: ~0.4 us)
            if t._assigned is not None:
                assigns = [realize.Assign(t, t._assigned.replaces) if t._assigned is not None else None for t in todo]
                break
        var_vals = merge_vars(*(t._vars for t in todo if t._vars)) if any(t._vars for t in todo) else None
        bufs = realize.realize(
            roots, fuse_reduce=Tensor.fuse_reduce, opt=realize.default_opt(), assigns=assigns, var_vals=var_vals
        )
        for t, buf in zip(todo, bufs, strict=True):
            if t._assigned is not None:
                t._assigned = None
                Tensor._pending_assigns.pop(id(t), None)
            t._graph = t.uop if t.requires_grad and not t._leaf else None
            t.hold(buf.reshape(t.shape))  # drop the graph: its intermediates can be freed
            if t._graph is not None:
                _kept_graphs[t.uop] = t._graph
            if t._vars and not symbolic(t.shape):  # a plain buffer now: no Variable left to bind
                del t._vars

    def numpy(self) -> np.ndarray:
        """A fresh NumPy copy of the data (realizes)."""
        if self.dtype is dtypes.bfloat16:  # NumPy has no bfloat16: the values come back as float32 (exact)
            bits = self._bits()
            return bf16_bits_to_float(bits).reshape(bits.shape)
        return self._bits()

    def _bits(self) -> np.ndarray:
        """A copy of the stored elements (for bfloat16, the 16-bit patterns)."""
        if self.numel() == 0:
            return np.zeros(self.shape, self.dtype.np)
        self.realize()
        arr = storage_view(base_buffer(self.uop), write=False).reshape(self.shape)
        if symbolic(self.shape):  # stored at the Variables' maxima: the first `value` along each symbolic dim
            arr = arr[tuple(slice(0, self._value_of(s)) if type(s) is Variable else slice(None) for s in self.shape)]
        return arr.copy()

    def _value_of(self, v: Variable) -> int:
        if v not in self._vars:
            raise ValueError(f"{v!r} is in the tensor's shape {self.shape} but bound to no value: use {v.name}.bind(n)")
        return self._vars[v]

    def item(self) -> Scalar:
        """The value of a one-element tensor as a Python scalar."""
        if self.numel() != 1:
            raise ValueError(f"only a one-element tensor can be converted to a Python scalar, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        """The data as (nested) Python lists."""
        return self.numpy().tolist()

    def contiguous(self) -> Tensor:
        """Ask for a materialization point: the scheduler will write this into a temp buffer (once: a staged value's
        contiguous() is itself)."""
        if self.uop.op is Ops.STAGE and self.uop.arg is None:
            return self
        return self._new(UOp(Ops.STAGE, (self.uop,)))

    def detach(self) -> Tensor:
        """The same values with gradients stopped (a STAGE("detach") that execution ignores); requires_grad False."""
        return Tensor(UOp(Ops.STAGE, (self.uop,), "detach"), requires_grad=False)._bound(self._vars)

    def assign(self, x: Any) -> Tensor:
        """Give this tensor x's value (lazily): x must broadcast to self's shape and have self's dtype. On a view made
        by basic indexing the elements of the tensor it views are written, as PyTorch's copy_: x[1:3].assign(v) is
        x[1:3] = v (other views, as reshape() or .T, are only rebound)."""
        if not isinstance(x, Tensor):
            x = Tensor(x, dtype=self.dtype) if not is_scalar(x) else self.full_like(x)
        if x.dtype is not self.dtype:
            raise TypeError(f"assign: dtype {x.dtype!r} does not match the tensor's {self.dtype!r}")
        if broadcast_shape(self.shape, x.shape) != self.shape:
            raise ValueError(f"assign: shape {x.shape} cannot be broadcast to the tensor's shape {self.shape}")
        if self._viewed() is not None:
            every = tuple(Span(0, 1, n) for n in self.shape)
            self._write_region(every, x._broadcast_to(self.shape, keep_const=False))
            return self
        return self._rebind(x)

    def _rebind(self, x: Tensor) -> Tensor:
        """Rebind this tensor to x's graph (checked by assign): the pending assign remembers the buffer it replaces."""
        if is_contiguous_buffer(x.uop):  # a copy, never a shared buffer: a later in-place write would change both
            x = x.contiguous()
        if self._assigned is None:  # the storage this assign replaces (TinyJit writes it in place where it can)
            self._assigned = _Pending(base_buffer(self.uop) if is_contiguous_buffer(self.uop) else None)
            Tensor._pending_assigns[id(self)] = self
        self.hold(x._broadcast_to(self.shape, keep_const=False).uop)
        self._vars = x._vars  # the values its new graph's Variables take (x's graph includes self's, if it reads it)
        self._graph, self._leaf = None, True
        return self

    # ---------------------------------------------------------------- gradients (the rules are in uopc/autodiff.py)

    def backward(self, params: list[Tensor] | None = None) -> None:
        """Accumulate d(self)/d(p) into p.grad for `params`, or for every tensor self depends on that may receive
        one: requires_grad True, or None for a float tensor created from data; never False (RuntimeError if none)."""
        root, realized = self._loss_graph()
        if params is None:
            params = self._registered_in(root)
            if not params:
                raise RuntimeError(
                    "backward: nothing in this graph can receive a gradient (no float tensor with requires_grad True "
                    "or None reaches the loss; a realized loss keeps its graph only if something upstream requires it)"
                )
        else:
            params = list(params)
        with helpers.phase("autodiff"):
            grads = self._gradient(root, realized, params)
        for p, g in zip(params, grads, strict=True):
            # accumulate until cleared (p.grad = None), as PyTorch does
            p.grad = g if p.grad is None else Tensor(p.grad.uop + g.uop)

    def gradient(self, *targets: Tensor) -> list[Tensor]:
        """The gradients of scalar self with respect to `targets` as lazy Tensors (tinygrad's form; .grad is not
        touched); zeros for a target self does not depend on."""
        return self._gradient(*self._loss_graph(), targets)

    @staticmethod
    def _gradient(root: UOp, realized: dict[UOp, UOp], targets: Any) -> list[Tensor]:
        """The gradients of `root` (a loss graph from _loss_graph) with respect to `targets`; `realized` maps the
        graphs of values realized on the way back to their buffers, which the gradients read instead."""
        seed = UOp.const(1.0, root.dtype)
        seed = seed.reshape(root.shape) if root.shape else seed
        nodes = [t._target_nodes() for t in targets]
        grads = compute_gradient(root, seed, [u for ns in nodes for u in ns])
        out = []
        for t, ns in zip(targets, nodes, strict=True):
            found = [grads[u] for u in ns if u in grads]
            g = functools.reduce(lambda a, b: a + b, found).substitute(realized) if found else zeros_like(t.uop)
            out.append(Tensor(g))
        return out

    def _loss_graph(self) -> tuple[UOp, dict[UOp, UOp]]:
        """The graph to differentiate, and what it replaced: each value realized since it was built (the loss
        itself after loss.item(), an intermediate after print(h)) is replaced by the graph it was computed from,
        through any chain of realizes. The second result maps those graphs back to their buffers."""
        if self.uop.size != 1:
            raise RuntimeError(f"grad can be implicitly created only for scalar outputs, got shape {self.uop.shape}")
        root, realized = self.uop, {}
        # (the keys are realized values: a BUFFER or a RESHAPE of one; only those nodes pay the weak lookup)
        while _kept_graphs and (found := {u: _kept_graphs[u] for u in root.toposort() if _is_kept(u)}):
            realized.update({g: u for u, g in found.items()})
            root = root.substitute(found)
        return root, realized

    def _target_nodes(self) -> list[UOp]:
        """The nodes that stand for self in a graph: its current uop, and the graph it had before a realize."""
        nodes = [self.uop]
        if self._graph is not None and self._graph is not self.uop and self._graph.shape == self.uop.shape:
            nodes.append(self._graph)
        return nodes

    @staticmethod
    def _registered_in(root: UOp) -> list[Tensor]:
        """Every tensor that may receive a gradient (requires_grad not False, float) whose current graph (or graph
        before a realize) appears in the loss graph."""
        nodes = set(root.toposort())
        tensors = list(Tensor._grad_tensors.values())
        return [
            t
            for t in tensors
            if t.requires_grad is not False and t.dtype.is_float and any(u in nodes for u in t._target_nodes())
        ]

    # ---------------------------------------------------------------- dtypes

    def cast(self, dtype: Any) -> Tensor:
        """Convert elements to `dtype` (float -> int truncates, as C)."""
        dt = to_dtype(dtype)
        return self if dt is self.dtype else self._new(self.uop.cast(dt))

    def bitcast(self, dtype: Any) -> Tensor:
        """The same bytes read as `dtype` (PyTorch's view(dtype)); a dtype of another size rescales the last dim.
        The IR has no bitcast op, so this realizes self and reinterprets its storage on the host (no gradient)."""
        dt = to_dtype(dtype)
        a, b = self.dtype.itemsize, dt.itemsize
        if dt.is_bool and not self.dtype.is_bool:
            raise TypeError(f"bitcast to bool is not supported (from {self.dtype!r}): a byte other than 0/1 is no bool")
        if a != b and (self.ndim == 0 or (self.shape[-1] * a) % b):
            raise ValueError(
                f"bitcast from {self.dtype!r} ({a} bytes) to {dt!r} ({b} bytes) needs a last dim whose bytes divide "
                f"into {b}-byte elements, got shape {self.shape}"
            )
        shape = self.shape if a == b else self.shape[:-1] + (self.shape[-1] * a // b,)
        if dt is self.dtype:
            return self.detach()
        if self.numel() == 0:
            return Tensor(full_uop(0, dt, shape))
        bits = np.ascontiguousarray(self._bits()).view(dt.np)
        return Tensor(new_buffer(dt, bits.size, bits).reshape(shape))

    def float(self) -> Tensor:
        """Cast to float32."""
        return self.cast(dtypes.float32)

    def bfloat16(self) -> Tensor:
        """Cast to bfloat16 (stored as 16 bits; each op computes in float32 and rounds, as PyTorch)."""
        return self.cast(dtypes.bfloat16)

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


# the composites that mark their outputs with a gradient rule of their own (autodiff.with_gradient)
CUSTOM_RULES["conv"] = Tensor._conv_grad_rule  # conv2d (uopc.tensor.conv)
CUSTOM_RULES["max_pool"] = Tensor._max_pool_grad_rule  # max_pool1d/2d/3d (uopc.tensor.pool)
CUSTOM_RULES["attention"] = Tensor._attention_grad_rule  # scaled_dot_product_attention (uopc.tensor.attention)
CUSTOM_RULES["erf"] = Tensor._erf_grad_rule  # erf, so GELU (uopc.tensor.math)
CUSTOM_RULES["hardtanh"] = Tensor._hardtanh_grad_rule  # hardtanh, so ReLU6, hardswish, hardsigmoid (uopc.tensor.math)


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """`with no_grad():` (PyTorch's spelling of tinygrad's `with Tensor.test():`): results built inside do not
    track gradients (Tensor.no_grad is True for the block)."""
    prev = Tensor.no_grad
    Tensor.no_grad = True
    try:
        yield
    finally:
        Tensor.no_grad = prev

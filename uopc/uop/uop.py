"""The IR: immutable, hash-consed UOps.

One node type serves both levels of the compiler:

* the *shape graph* the Tensor builds: BUFFER, CONST, movement ops (index maps, never kernels by
  themselves), ALU ops, REDUCE and STAGE. Every node has a `shape`;
* the *lowered* program rangeify produces: RANGE loops, INDEX/LOAD/STORE, accumulators (ALLOC and
  AFTER for ordering), END closing loops, SINK grouping side effects.

Building the same (op, dtype, src, arg) twice returns the same object, so structural equality is `is`:

    >>> a = UOp(Ops.BUFFER, (), ParamArg(0, dtypes.f32, (16,)))
    >>> (a.reshape((4, 4)) * 2.0) is (a.reshape((4, 4)) * 2.0)
    True
"""

from __future__ import annotations

import threading
import weakref
from _weakref import _remove_dead_weakref  # type: ignore[attr-defined]  (CPython's, what WeakValueDictionary uses)
from collections.abc import Callable, Container
from functools import cached_property
from typing import Any

from uopc.helpers import in_forked_child, prod
from uopc.uop.bounds import bounds
from uopc.uop.dtype import DType, dtypes, truncate
from uopc.uop.ops import ALU, COMPARE, REDUCE_OPS, Attention, Ops, ParamArg, Span, Winograd
from uopc.uop.readers import add_reader
from uopc.uop.variable import Variable, as_dim, symbolic_reshape_ok

_PLAIN = (type(None), int, str)


def _argkey(arg: Any) -> Any:
    """A hashable key for an arg that tells apart everything that renders differently (0.0 vs -0.0, 1 vs 1.0)."""
    t = type(arg)
    if t in _PLAIN or t is ParamArg or (t is tuple and all(type(a) is int for a in arg)):  # common cases, as they are
        return arg
    if isinstance(arg, float):
        return (float, arg.hex())
    if isinstance(arg, bool):
        return (bool, arg)
    if isinstance(arg, (tuple, list)):
        return tuple(_argkey(a) for a in arg)
    if isinstance(arg, dict):
        return (dict, tuple(sorted((k, _argkey(v)) for k, v in arg.items())))
    return arg


# the ops whose dtype is not their first source's (_infer_dtype tells); every other op with sources has src[0]'s
_OWN_DTYPE = frozenset({Ops.BUFFER, Ops.CMPLT, Ops.CMPNE, Ops.CAST, Ops.WHERE, Ops.SINK, Ops.END, Ops.STORE, Ops.RANGE})
_OWN_DTYPE |= {Ops.VECTORIZE, Ops.GEP}
# the ops whose arg is a shape or a tuple of int pairs (ints and Variables, built by the methods below): their arg is
# its own cache key (_argkey would walk it to tell 1 from 1.0 and True, which a shape never holds)
_SHAPE_ARG = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.PAD, Ops.SHRINK})


def _infer_dtype(op: Ops, src: tuple[UOp, ...], arg: Any) -> DType | None:
    if op is Ops.BUFFER:
        return arg.dtype
    if op in COMPARE:
        return dtypes.bool
    if op is Ops.CAST:
        return arg
    if op is Ops.WHERE:
        return src[1].dtype
    if op in (Ops.SINK, Ops.END, Ops.STORE):
        return None
    if op is Ops.RANGE:
        return dtypes.int32
    if op is Ops.VECTORIZE:
        return src[0].dtype.vec(len(src))
    if op is Ops.GEP:
        return src[0].dtype.scalar()
    return src[0].dtype if src else None


class _KeyRef(weakref.ref):
    """A weak reference to a cached node that remembers its cache key (set after construction: a subclass without
    its own __init__ is made in C, where WeakValueDictionary's KeyedRef runs Python for every node)."""

    __slots__ = ("key",)


def _forget(ref: _KeyRef) -> None:
    """A cached node died: drop its entry, unless the key already names a newer node (the C helper checks that the
    entry is this dead reference, atomically, as WeakValueDictionary does)."""
    _remove_dead_weakref(_cache, ref.key)


# the hash-consing table: structure key -> weak reference to the one node with that structure
_cache: dict[tuple, _KeyRef] = {}
_cache_lock = threading.Lock()
in_forked_child(lambda: globals().__setitem__("_cache_lock", threading.Lock()))


class UOp:
    """An immutable IR node. Construct with UOp(op, src, arg[, dtype]); equal constructions are one object."""

    op: Ops
    dtype: DType | None
    src: tuple[UOp, ...]
    arg: Any
    tracked: bool  # a tracked BUFFER (see track) or a RESHAPE of one: the nodes and Tensors reading it are recorded

    def __new__(cls, op: Ops, src: tuple[UOp, ...] = (), arg: Any = None, dtype: DType | None = None) -> UOp:
        if type(src) is not tuple:
            src = tuple(src)
        if dtype is None:
            dtype = src[0].dtype if src and op not in _OWN_DTYPE else _infer_dtype(op, src, arg)
        key = (op, dtype, src, arg if op in _SHAPE_ARG and type(arg) is tuple else _argkey(arg))
        if (ref := _cache.get(key)) is not None and (hit := ref()) is not None:
            return hit
        u = object.__new__(cls)
        d = u.__dict__
        d["op"], d["dtype"], d["src"], d["arg"] = op, dtype, src, arg
        d["shape"] = _shape(u)  # eagerly, from the sources' shapes: no recursion on deep graphs
        d["tracked"] = op is Ops.RESHAPE and src[0].tracked  # a BUFFER is tracked later, by track()
        # look again under the lock before inserting: two threads building the same node must get one object
        with _cache_lock:
            if (ref := _cache.get(key)) is not None and (hit := ref()) is not None:
                return hit
            ref = _KeyRef(u, _forget)
            ref.key = key
            _cache[key] = ref
        for s in src:
            if s.tracked:
                add_reader(s, u)
        return u

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"UOp is immutable (tried to set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"UOp is immutable (tried to delete {name!r})")

    def __reduce__(self):
        return (UOp, (self.op, self.src, self.arg, self.dtype))

    def __repr__(self) -> str:
        src = f", src=({', '.join(s.op.name for s in self.src)},)" if self.src else ""
        return f"UOp({self.op!r}{src}, arg={self.arg!r})"

    def pretty(self, depth: int = 8) -> str:
        """A multi-line tree view of the graph (shared nodes are printed once per use)."""
        lines: list[str] = []

        def walk(u: UOp, d: int) -> None:
            lines.append(f"{'  ' * d}{u.op.name} {u.dtype!r} {u.arg!r}")
            if d < depth:
                for s in u.src:
                    walk(s, d + 1)

        walk(self, 0)
        return "\n".join(lines)

    # ---------------------------------------------------------------- graph utilities

    def toposort(self, stop: Container[UOp] = ()) -> list[UOp]:
        """Every node of the graph, each after its sources (iterative DFS); a node in `stop` is not walked into.

        A node never changes, so neither does its whole graph's order: it is kept on the node asked (a kernel's AST
        is walked by a dozen passes, 9,842 walks in the char-GPT step's first call) and each caller gets a copy."""
        if not stop and (hit := self.__dict__.get("_topo")) is not None:
            return [*hit, self]
        out: list[UOp] = []
        seen: set[int] = set()
        stack: list[tuple[UOp, bool]] = [(self, False)]
        while stack:
            u, done = stack.pop()
            if done:
                out.append(u)
                continue
            if id(u) in seen:
                continue
            seen.add(id(u))
            stack.append((u, True))
            stack.extend((s, False) for s in reversed(u.src) if id(s) not in seen and u not in stop)
        if not stop:  # without self, last in the order: a node holding itself would wait for the cycle collector
            self.__dict__["_topo"] = tuple(out[:-1])
        return out

    def replace(self, **kw: Any) -> UOp:
        """This node with some of op/src/arg/dtype changed."""
        return UOp(kw.get("op", self.op), kw.get("src", self.src), kw.get("arg", self.arg), kw.get("dtype", self.dtype))

    def substitute(self, mapping: dict[UOp, UOp]) -> UOp:
        """Rebuild the graph with every node in `mapping` replaced (what lies only under one is not even walked)."""
        if not mapping:
            return self
        new: dict[UOp, UOp] = {}
        for u in self.toposort(mapping):
            if u in mapping:
                new[u] = mapping[u]
                continue
            src = tuple(new[s] for s in u.src)
            new[u] = u if src == u.src else u.replace(src=src)
        return new[self]

    @staticmethod
    def wrap(roots: list[UOp], targets: set[UOp], fn: Callable[[UOp], UOp]) -> list[UOp]:
        """Rebuild bottom-up, replacing each target t by fn(t') where t' is t with its sources already rebuilt.

        Unlike substitute(), nested targets compose: an outer target wraps the rewritten inner one. A STAGE whose
        source becomes a STAGE is that one: a value is stored once (the scheduler's staging of x under a user's
        x.contiguous() was a kernel copying x's buffer, 0.4 ms of the CNN step).
        """
        new: dict[UOp, UOp] = {}
        for u in UOp(Ops.SINK, tuple(roots)).toposort()[:-1]:
            src = tuple(new[s] for s in u.src)
            n = u if src == u.src else u.replace(src=src)
            if n is not u and n.op is Ops.STAGE and n.arg is None and src[0].op is Ops.STAGE and src[0].arg is None:
                n = src[0]
            new[u] = fn(n) if u in targets else n
        return [new[r] for r in roots]

    # ---------------------------------------------------------------- shapes (computed at construction)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return prod(self.shape)

    # ---------------------------------------------------------------- shape-graph builders

    @staticmethod
    def const(value: Any, dtype: DType | None = None) -> UOp:
        """A scalar constant (shape ()). The value is stored as the dtype's Python type."""
        dtype = dtype or dtypes.from_py(value)
        if dtype.is_float:
            value = float(value)
        elif dtype.is_bool:
            value = bool(value)
        else:
            value = truncate(dtype, int(value))  # -1 as uint8 is 255: the value C would store
        return UOp(Ops.CONST, (), value, dtype)

    def _check_ndim(self, what: str, n: int, arg: Any) -> None:
        if n != len(self.shape):
            raise ValueError(
                f"{what} {arg} has {n} entries but the input shape {self.shape} has {len(self.shape)} dims"
            )

    def reshape(self, shape: tuple[int, ...]) -> UOp:
        shape = tuple(as_dim(s) for s in shape)
        if any(s < 0 for s in shape) or prod(shape) != prod(self.shape):
            raise ValueError(f"cannot reshape {self.shape} ({prod(self.shape)} elements) to {shape}")
        # storage (a BUFFER, laid out for the variables' maxima) takes any symbolic shape; a value keeps its
        # symbolic dims as they are
        if self.op is not Ops.BUFFER and not symbolic_reshape_ok(self.shape, shape):
            raise ValueError(
                f"cannot reshape {self.shape} to {shape}: a symbolic dim must stay a dim of its own, with the same "
                "number of elements before it"
            )
        return self if shape == self.shape else UOp(Ops.RESHAPE, (self,), shape)

    def expand(self, shape: tuple[int, ...]) -> UOp:
        shape = tuple(as_dim(s) for s in shape)
        if len(shape) != len(self.shape) or any(a != b and a != 1 for a, b in zip(self.shape, shape)):
            raise ValueError(f"cannot expand {self.shape} to {shape}: only size-1 dims can grow")
        return self if shape == self.shape else UOp(Ops.EXPAND, (self,), shape)

    def permute(self, order: tuple[int, ...]) -> UOp:
        order = tuple(int(i) for i in order)
        if sorted(order) != list(range(len(self.shape))):
            raise ValueError(
                f"permute order {order} is not a permutation of the {len(self.shape)} dims of {self.shape}"
            )
        if self.op is Ops.PERMUTE:  # one permute of the source: two that cancel leave none
            return self.src[0].permute(tuple(self.arg[i] for i in order))
        return self if order == tuple(range(len(order))) else UOp(Ops.PERMUTE, (self,), order)

    def pad(self, pads: tuple[tuple[int, int], ...]) -> UOp:
        if any(type(p) is Variable for pair in pads for p in pair):
            raise ValueError(f"pad {pads}: a pad amount must be an int, not a Variable")
        pads = tuple((int(lo), int(hi)) for lo, hi in pads)
        self._check_ndim("pad", len(pads), pads)
        if any(lo < 0 or hi < 0 for lo, hi in pads):
            raise ValueError(f"pad {pads} of shape {self.shape}: pads must be >= 0 (shrink to cut)")
        if any(type(s) is Variable and p != (0, 0) for s, p in zip(self.shape, pads)):
            raise ValueError(f"pad {pads} of shape {self.shape}: a symbolic dim cannot be padded")
        return self if all(p == (0, 0) for p in pads) else UOp(Ops.PAD, (self,), pads)

    def shrink(self, bounds: tuple[tuple[int, int], ...]) -> UOp:
        bounds = tuple((int(lo), as_dim(hi)) for lo, hi in bounds)
        self._check_ndim("shrink", len(bounds), bounds)
        for (lo, hi), s in zip(bounds, self.shape):
            if not 0 <= lo <= hi <= s:
                raise ValueError(f"shrink {bounds} does not fit shape {self.shape}: need 0 <= lo <= hi <= size")
            if type(hi) is Variable and lo != 0:
                raise ValueError(f"shrink {bounds}: a symbolic end needs the start 0")
            if type(s) is Variable and hi != s and hi > s.vmin:
                raise ValueError(f"shrink {bounds} of shape {self.shape}: {s!r} may be as small as {s.vmin}")
        if all(b == (0, s) for b, s in zip(bounds, self.shape)):
            return self
        return UOp(Ops.SHRINK, (self,), bounds)

    def gather(self, index: UOp, dim: int, label: str = "gather", wrap: bool = False) -> UOp:
        """out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim` (PyTorch's gather): the result has the
        index's shape; the index must be an int tensor of the same rank, no larger than self off `dim`.

        Index values are data, checked when the kernel runs: one outside 0..size-1 (-size..size-1 with `wrap`, where
        negative indices count from the end) makes the realize raise an IndexError naming `label`, the value and
        the valid range."""
        if index.dtype is None or not index.dtype.is_int:
            raise TypeError(f"{label}: the index must be an integer tensor, got {index.dtype}")
        if len(index.shape) != len(self.shape) or not 0 <= dim < len(self.shape):
            raise ValueError(f"{label}: index shape {index.shape} and dim {dim} do not fit shape {self.shape}")
        if any(i > s for d, (i, s) in enumerate(zip(index.shape, self.shape)) if d != dim):
            raise ValueError(f"{label}: index shape {index.shape} is larger than {self.shape} off dim {dim}")
        return UOp(Ops.GATHER, (self, index), (dim, label, wrap))

    def scatter_add(self, index: UOp, values: UOp, dim: int, label: str = "scatter_add", wrap: bool = False) -> UOp:
        """self with values[..., i, ...] added at [..., index[..., i, ...], ...] along `dim` (PyTorch's scatter_add;
        repeats accumulate): gather's gradient. Indices are checked when it runs (with `wrap`, negative ones too)."""
        return self.scatter_reduce(index, values, dim, Ops.ADD, label, wrap)

    def scatter_reduce(
        self, index: UOp, values: UOp, dim: int, rop: Ops, label: str = "scatter_reduce", wrap: bool = False
    ) -> UOp:
        """scatter_add with a combining op: ADD, MUL or MAX (out[target] = rop(out[target], value), in order)."""
        if rop not in (Ops.ADD, Ops.MUL, Ops.MAX):
            raise ValueError(f"{label}: a scatter combines with ADD, MUL or MAX, got {rop}")
        if index.dtype is None or not index.dtype.is_int:
            raise TypeError(f"{label}: the index must be an integer tensor, got {index.dtype}")
        if index.shape != values.shape:
            raise ValueError(f"{label}: index shape {index.shape} differs from the values' shape {values.shape}")
        if values.dtype is not self.dtype:
            raise TypeError(f"{label}: values of dtype {values.dtype} into a tensor of dtype {self.dtype}")
        if len(index.shape) != len(self.shape) or not 0 <= dim < len(self.shape):
            raise ValueError(f"{label}: index shape {index.shape} and dim {dim} do not fit shape {self.shape}")
        if any(i > s for d, (i, s) in enumerate(zip(index.shape, self.shape)) if d != dim):
            raise ValueError(f"{label}: index shape {index.shape} is larger than {self.shape} off dim {dim}")
        return UOp(Ops.SCATTER, (self, index, values), (dim, label, wrap, rop))

    def setitem(self, value: UOp, region: tuple[tuple[int, int, int], ...]) -> UOp:
        """self with the elements of `region` (per dim (start, step, count): start, start + step, ...) replaced by
        `value`, of the region's counts as its shape and of self's dtype: the slice write x[a:b] = v. An empty region
        is self; one that covers every element is value (flipped where a step is -1)."""
        spans = tuple(Span(*(int(v) for v in r)) for r in region)
        self._check_ndim("setitem region", len(spans), region)
        if value.dtype is not self.dtype:
            raise TypeError(f"setitem: a value of dtype {value.dtype} into a tensor of dtype {self.dtype}")
        counts = tuple(sp.count for sp in spans)
        if value.shape != counts:
            raise ValueError(f"setitem: value shape {value.shape} differs from the region's counts {counts}")
        for d, (sp, n) in enumerate(zip(spans, self.shape)):
            if not _span_fits(sp, n):
                raise ValueError(f"setitem region {region} does not fit shape {self.shape}: dim {d} of size {n}, {sp}")
        if 0 in counts:
            return self
        if counts == self.shape and all(abs(sp.step) == 1 or sp.count == 1 for sp in spans):
            return value.flip(tuple(d for d, sp in enumerate(spans) if sp.step < 0 and sp.count > 1))
        # one form per region: a single element's step is 1
        spans = tuple(sp if sp.count > 1 else Span(sp.start, 1, 1) for sp in spans)
        return UOp(Ops.SETITEM, (self, value), spans)

    def flip(self, axes: tuple[int, ...]) -> UOp:
        """Reverse the given axes (arg: one bool per dim)."""
        for a in axes:
            if not 0 <= a < len(self.shape):
                raise ValueError(f"flip axis {a} is out of range for shape {self.shape}")
            if type(self.shape[a]) is Variable:  # its last element moves with the value bound
                raise ValueError(f"flip of axis {a} of shape {self.shape}: a symbolic dim cannot be flipped")
        mask = tuple(i in axes and s > 1 for i, s in enumerate(self.shape))
        return UOp(Ops.FLIP, (self,), mask) if any(mask) else self

    def reduce(self, op: Ops, n: int = 1) -> UOp:
        """Reduce the last `n` axes with ADD or MAX."""
        if op not in REDUCE_OPS:
            raise ValueError(f"reduce op must be one of {sorted(o.name for o in REDUCE_OPS)}, got {op}")
        if not 0 <= n <= len(self.shape):
            raise ValueError(f"cannot reduce the last {n} axes of shape {self.shape}")
        if op is Ops.ADD and n and self.dtype.is_16bit_float:  # a sum of halves accumulates in float32, rounds once
            return UOp(Ops.REDUCE, (self.cast(dtypes.float32),), (op, n)).cast(self.dtype)
        return self if n == 0 else UOp(Ops.REDUCE, (self,), (op, n))

    def alu(self, op: Ops, *others: UOp) -> UOp:
        """An ALU op. Shapes must match, except that shape-() operands (constants, index math) broadcast."""
        srcs = (self, *others)
        shapes = {s.shape for s in srcs if s.shape}
        if len(shapes) > 1:
            raise ValueError(f"{op.name}: operand shapes {' and '.join(str(s.shape) for s in srcs)} do not match")
        return UOp(op, srcs)

    def cast(self, dtype: DType) -> UOp:
        return self if dtype is self.dtype else UOp(Ops.CAST, (self,), dtype)

    def _cv(self, x: Any) -> UOp:
        return x if isinstance(x, UOp) else UOp.const(x, self.dtype)

    def __add__(self, x: Any) -> UOp:
        return self.alu(Ops.ADD, self._cv(x))

    def __radd__(self, x: Any) -> UOp:
        return self._cv(x).alu(Ops.ADD, self)

    def __mul__(self, x: Any) -> UOp:
        return self.alu(Ops.MUL, self._cv(x))

    def __rmul__(self, x: Any) -> UOp:
        return self._cv(x).alu(Ops.MUL, self)

    def __neg__(self) -> UOp:
        return self.alu(Ops.NEG)

    def __sub__(self, x: Any) -> UOp:
        return self + (-self._cv(x))

    def __rsub__(self, x: Any) -> UOp:
        return self._cv(x) + (-self)

    def __floordiv__(self, x: Any) -> UOp:
        return self.alu(Ops.IDIV, self._cv(x))

    def __mod__(self, x: Any) -> UOp:
        return self.alu(Ops.MOD, self._cv(x))

    def __lt__(self, x: Any) -> UOp:
        return self.alu(Ops.CMPLT, self._cv(x))

    def __and__(self, x: Any) -> UOp:
        return self.alu(Ops.AND, self._cv(x))

    def __or__(self, x: Any) -> UOp:
        return self.alu(Ops.OR, self._cv(x))

    def ne(self, x: Any) -> UOp:
        return self.alu(Ops.CMPNE, self._cv(x))

    def maximum(self, x: Any) -> UOp:
        return self.alu(Ops.MAX, self._cv(x))

    def where(self, a: Any, b: Any) -> UOp:
        a = a if isinstance(a, UOp) else UOp.const(a, b.dtype if isinstance(b, UOp) else None)
        return self.alu(Ops.WHERE, a, a._cv(b))

    # ---------------------------------------------------------------- lowered-program builders

    def index(self, idx: UOp | int, valid: UOp | None = None) -> UOp:
        """Address element `idx` of a BUFFER (or accumulator); `valid` gates the access (PAD)."""
        idx = idx if isinstance(idx, UOp) else UOp.const(idx, dtypes.int32)
        return UOp(Ops.INDEX, (self, idx) if valid is None else (self, idx, valid), dtype=self.dtype)

    def load(self) -> UOp:
        return UOp(Ops.LOAD, (self,), dtype=self.dtype)

    def store(self, val: UOp) -> UOp:
        return UOp(Ops.STORE, (self, val))

    def end(self, *ranges: UOp) -> UOp:
        """Close loops: the END of `self` over `ranges` (a no-op when there are none)."""
        return UOp(Ops.END, (self, *ranges)) if ranges else self

    def after(self, *deps: UOp) -> UOp:
        """This value, ordered after `deps` (loops it lives in, stores it must see)."""
        return UOp(Ops.AFTER, (self, *deps), dtype=self.dtype) if deps else self

    # ---------------------------------------------------------------- bounds of integer expressions

    @cached_property
    def vmin(self) -> int | float:
        return bounds(self)[0]

    @cached_property
    def vmax(self) -> int | float:
        return bounds(self)[1]


def _shape(self: UOp) -> tuple[int, ...]:
    """The shape of a node, from its op, arg and its sources' (already computed) shapes."""
    op, arg = self.op, self.arg
    if op in _SHAPELESS:
        return ()
    if op in ALU:  # the first source with a shape (a CONST or an index has none)
        for s in self.src:
            if s.shape:
                return s.shape
        return ()
    if op is Ops.BUFFER:
        return tuple(arg.shape)
    if op in (Ops.RESHAPE, Ops.EXPAND):
        return arg if type(arg) is tuple else tuple(arg)
    if op is Ops.PERMUTE:
        return tuple(self.src[0].shape[i] for i in arg)
    if op is Ops.PAD:  # (a symbolic dim is never padded: it keeps its Variable)
        return tuple(s + lo + hi if lo or hi else s for s, (lo, hi) in zip(self.src[0].shape, arg))
    if op is Ops.SHRINK:
        return tuple(hi - lo if lo else hi for lo, hi in arg)
    if op in (Ops.FLIP, Ops.STAGE, Ops.CUSTOM_GRAD):
        return self.src[0].shape
    if op is Ops.GATHER:
        return self.src[1].shape
    if op in (Ops.SCATTER, Ops.SETITEM):
        return self.src[0].shape
    if op is Ops.REDUCE:
        s = self.src[0].shape
        return s[: len(s) - arg[1]]
    if op is Ops.WINOGRAD and isinstance(arg, Winograd):  # (a lowered transform's arg is another record)
        return arg.shape
    if op is Ops.ATTENTION and isinstance(arg, Attention):  # (a lowered attention kernel's arg is another record)
        q, k = self.src[0].shape, self.src[1].shape  # rows stored before heads: (*batch, L, heads, E)
        if arg.kind in ("lse", "ds"):
            return q[:-1] + (k[-2],) * (arg.kind == "ds")
        if arg.kind == "dkv":
            return k[:-3] + (k[-2], k[-3], k[-1] + self.src[2].shape[-1])
        return q[:-3] + (q[-2], q[-3], self.src[2].shape[-1] if arg.kind == "out" else q[-1])
    return ()


# the ops of a lowered program and constants: no shape
_SHAPELESS = frozenset({Ops.CONST, Ops.RANGE, Ops.INDEX, Ops.LOAD, Ops.STORE, Ops.ALLOC, Ops.AFTER, Ops.END, Ops.SINK})
_SHAPELESS |= {Ops.CHECK, Ops.VECTORIZE, Ops.GEP, Ops.SHUFFLE, Ops.DEFINE_VAR}


def _span_fits(sp: Span, n: int) -> bool:
    """Whether a region's span addresses distinct elements of a dim of size n: count >= 0, a nonzero step for two or
    more, first and last element in 0..n-1."""
    if sp.count < 0 or (sp.count > 1 and sp.step == 0):
        return False
    last = sp.start + (sp.count - 1) * sp.step
    return sp.count == 0 or (0 <= min(sp.start, last) and max(sp.start, last) < n)


def identity_element(rop: Ops, dtype: DType) -> Any:
    """The starting value of a reduction: 0 for ADD, the dtype's minimum (-inf for floats) for MAX."""
    return 0 if rop is Ops.ADD else dtype.min


def sink(*xs: UOp) -> UOp:
    return UOp(Ops.SINK, xs)


def base_buffer(u: UOp) -> UOp:
    """`u` without the RESHAPEs on top of it: the BUFFER (or other node) whose data a reshape of it shares."""
    while u.op is Ops.RESHAPE:
        u = u.src[0]
    return u


def epilogue_reduce(root: UOp) -> UOp | None:
    """The REDUCE a kernel computes with elementwise ops after it at the same index (its epilogue: a matmul's bias,
    activation, residual add), or None: `root` itself if it is a REDUCE, else the one REDUCE that `root` reaches
    through ALU ops of its own shape only, where no other REDUCE is reachable."""
    if root.op is Ops.REDUCE:
        return root
    found, seen, stack = [], set(), [root]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.op is Ops.REDUCE and u.shape == root.shape:
            found.append(u)
        elif u.op in ALU and u.shape == root.shape:
            stack.extend(u.src)
        elif any(x.op is Ops.REDUCE for x in u.toposort()):  # a reduce read at another index or shape
            return None
    return found[0] if len(found) == 1 else None


def structure_key(roots: list[UOp]) -> tuple[tuple, list[UOp]]:
    """The structure key of a graph and its input BUFFERs, from one walk.

    The key is the graph in topological order as (op, dtype, arg, source positions); a BUFFER is only its dtype
    and size, so graphs that differ only in which buffers they read share a key (inputs bind by position).
    Constants are kept: a different Python float is a different structure.
    """
    # the walk of UOp(SINK, roots).toposort(), without building the SINK (hash-consing it costs more than the
    # whole walk of a small graph: this runs on every realize, cached plan or not)
    ids: dict[int, int] = {}
    seen: set[int] = set()
    key = []
    inputs = []
    stack: list[tuple[UOp, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        u, done = stack.pop()
        if done:
            ids[id(u)] = len(ids)
            if u.op is Ops.BUFFER:
                inputs.append(u)
                arg = ("buf", u.dtype.name, u.arg.shape)
            else:
                arg = _argkey(u.arg)
            key.append((u.op, u.dtype, arg, tuple([ids[id(s)] for s in u.src])))
            continue
        if id(u) in seen:
            continue
        seen.add(id(u))
        stack.append((u, True))
        stack.extend([(s, False) for s in reversed(u.src) if id(s) not in seen])
    key.append((Ops.SINK, None, None, tuple([ids[id(r)] for r in roots])))
    return tuple(key), inputs

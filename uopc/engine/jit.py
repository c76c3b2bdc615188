"""TinyJit: capture the plans a function runs, then replay them with no graph building and no structure key.

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        loss = model(x).cross_entropy(y)
        opt.zero_grad(); loss.backward(); opt.step(loss)
        return loss

    step(x0, y0)   # 1st call: runs normally (compiles)
    step(x1, y1)   # 2nd call: runs normally and records every realize (plan, buffers read, buffers written)
    step(x2, y2)   # later calls: bind x2, y2 to the recorded plans' inputs and run them, nothing else

Inputs are the Tensors among the arguments, bound by position (keyword arguments by name). The capture realizes
what the function returns and every assign it made and left lazy, in the function's last realize. Everything else a plan
read (parameters, optimizer state, constants) is bound by identity: a tensor that was assigned during the step is
followed to its current buffer, and written in place when the plan allows it (every read of the old value comes
earlier, or at the element it writes: decided once, at capture) and nothing else reads the storage (no other graph
or tensor holds it, no NumPy view of it was handed out: uopc.uop.read_only_by, checked on every replay); else it is
written into fresh pool storage and the tensor is rebound. Returned Tensors are buffers of that call, valid after
later calls: a replay writes an output into the last replay's storage only when nothing holds that any more (the
result was dropped: no tensor, graph or NumPy view refers to it): a kernel of a few microseconds then pays for no
allocation and writes warm pages. A call whose Tensor shapes or dtypes, or whose other arguments,
differ from the captured call raises ValueError naming the argument, as does a change of `Tensor.training` or
`Tensor.no_grad` (the modes the step's graph depends on); `reset()` captures anew.
Per-step Python values are frozen by replay: optimizers keep theirs (lr, step count) in state tensors. A size that
changes from call to call is a Variable (uopc.uop.variable) passed bound, `step(x, pos.bind(n))`: the replay runs the
same plans with the new value (a Tensor argument's own bindings count too).
One TinyJit object runs one call at a time: calls from several threads at once would race on the state it updates
in place (as the same step would without the JIT); captures are per thread.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from uopc.engine import realize
from uopc.runtime.buffer import buffer_ptr, is_shared
from uopc.tensor import Tensor
from uopc.uop import Ops, UOp, base_buffer, read_only_by, readers_epoch
from uopc.uop.variable import Bound, Variable, merge_vars, symbolic

__all__ = ["TinyJit"]


# Where a captured plan's input comes from on replay: each kind knows how to find its BUFFER.
class _Arg(NamedTuple):
    """The k-th Tensor argument of the call."""

    k: int

    def get(self, args: list[UOp], results: list[list[UOp]]) -> UOp:
        return args[self.k]


class _Out(NamedTuple):
    """Root `root` of an earlier captured call of the same step."""

    call: int
    root: int

    def get(self, args: list[UOp], results: list[list[UOp]]) -> UOp:
        return results[self.call][self.root]


class _State(NamedTuple):
    """A tensor assigned during the step (a parameter, an optimizer moment): its buffer at the time of the call."""

    tensor: Tensor

    def get(self, args: list[UOp], results: list[list[UOp]]) -> UOp:
        return base_buffer(self.tensor.uop)


class _Const(NamedTuple):
    """A buffer read as captured: a constant, or host data made inside the function."""

    buf: UOp

    def get(self, args: list[UOp], results: list[list[UOp]]) -> UOp:
        return self.buf


_Binding = _Arg | _Out | _State | _Const


class _Update(NamedTuple):
    """A root of a captured call that a tensor was assigned to: the tensor follows it on every replay, and the
    root is written into the tensor's storage when the plan allows it (`in_place`, decided once at capture) and
    nothing else reads that storage (checked on each replay)."""

    root: int
    tensor: Tensor
    in_place: bool


@dataclass
class _Call:
    """One captured realize, with its buffers turned into bindings. A replay binds the constants as they are (`fixed`,
    None where another binding goes; their addresses, which stay while their BUFFERs live, and the other bindings'
    positions are run_plan's `prefilled`) and looks up only the rest (`moving`): after a model's kernels ran through
    tens of MB, every Python object a call touches comes from memory (ResNet-18 at batch 1 binds ~100 weights,
    MobileNetV2 ~260)."""

    cp: realize.CompiledPlan
    inputs: list[_Binding]
    updates: list[_Update]

    def __post_init__(self) -> None:
        self.fixed: list[UOp | None] = [b.buf if type(b) is _Const else None for b in self.inputs]
        self.moving = tuple((k, b) for k, b in enumerate(self.inputs) if type(b) is not _Const)
        ptrs = (ctypes.c_void_p * self.cp.n_in)(*[0 if u is None else buffer_ptr(u) for u in self.fixed])
        self.prefilled = (ptrs, tuple(k for k, _ in self.moving))


def _signature(args: tuple, kwargs: dict) -> tuple[list[tuple[str, Any]], list[Tensor], dict[str, Any]]:
    """The named arguments in order, the Tensors among them, and each argument's signature."""
    # keyword arguments by name, whatever order the call site wrote them in
    named = [(f"argument {i}", a) for i, a in enumerate(args)]
    named += [(f"argument {k!r}", kwargs[k]) for k in sorted(kwargs)]
    tensors = [a for _, a in named if isinstance(a, Tensor)]
    sig = {n: _arg_signature(a) for n, a in named}
    # the modes the function reads from the Tensor class: dropout and BatchNorm change their graphs with training,
    # and no_grad what is tracked, so a capture holds for the modes it was made under only
    sig["Tensor.training"], sig["Tensor.no_grad"] = ("value", Tensor.training), ("value", Tensor.no_grad)
    return named, tensors, sig


def _arg_signature(a: Any) -> tuple:
    """What must not change between the captured call and a replay: a Tensor's shape and dtype, a Bound's Variable
    (its value may change: it is the replay's), any other value itself."""
    if isinstance(a, Tensor):
        return ("Tensor", a.shape, a.dtype.name)
    if isinstance(a, Bound):
        return ("Variable", a.var)
    return ("value", a)


def _var_vals(args: tuple, kwargs: dict) -> dict[Variable, int] | None:
    """The values a call binds: its Bound arguments, and those its Tensor arguments carry (None: none)."""
    found = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, Bound):
            found.append({a.var: a.value})
        elif isinstance(a, Tensor) and a._vars:
            found.append(a._vars)
    return merge_vars(*found) if found else None


_SIMPLE = (int, float, str, bool, type(None))


def _fast_key(args: tuple) -> tuple | None:
    """Positional arguments as (shape, dtype) per Tensor and (type, value) per simple value; None if any other."""
    key: list[tuple] = [(Tensor.training, Tensor.no_grad)]
    for a in args:
        if isinstance(a, Tensor):
            key.append((a.shape, a.dtype))
        elif type(a) in _SIMPLE:
            key.append((type(a), a))
        elif type(a) is Bound:
            key.append((Bound, a.var))
        else:
            return None
    return tuple(key)


def _fast_bufs(args: tuple, key: tuple) -> list[UOp] | None:
    """The Tensor arguments' buffers (realized if lazy) when the positional arguments match `key`, the captured
    call's _fast_key, in one pass; None when they do not."""
    if len(args) + 1 != len(key) or key[0] != (Tensor.training, Tensor.no_grad):
        return None
    bufs = []
    for a, k in zip(args, key[1:], strict=True):
        if isinstance(a, Tensor):
            u = a.uop
            if (u.shape, u.dtype) != k:
                return None
            b = base_buffer(u)
            bufs.append(b if b.op is Ops.BUFFER else base_buffer(a.realize().uop))
        elif type(a) is Bound:
            if k != (Bound, a.var):
                return None
        elif type(a) not in _SIMPLE or (type(a), a) != k:
            return None
    return bufs


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except (TypeError, ValueError):  # e.g. a NumPy array: == is elementwise
        return False


def _describe(s: Any) -> str:
    if s is None:
        return "absent"
    if s[0] == "Tensor":
        return f"Tensor(shape={s[1]}, dtype={s[2]})"
    if s[0] == "Variable":
        return f"a bound {s[1]!r}"
    return f"{type(s[1]).__name__} {s[1]!r}"


def _sole_reader(t: Tensor) -> bool:
    """Nothing but `t` reads its storage: no lazy graph, view or other tensor can still see the old value, and no
    NumPy view of it was handed out."""
    u = t.uop
    return read_only_by(u, t) and not is_shared(base_buffer(u))


class TinyJit:
    """Capture and replay a function that runs uopc plans (see the module docstring for the rules)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        functools.update_wrapper(self, fn)
        self.reset()

    def reset(self) -> None:
        """Forget the capture: the next call runs normally, the one after captures again."""
        self.cnt = 0
        self._sig: dict[str, Any] | None = None
        self._calls: list[_Call] = []
        self._ret: Any = None  # the return value with its Tensors as _Returned/_Value bindings
        self._key: tuple | None = None  # the captured call's signature in a form compared with one ==
        self._sole: dict[int, tuple[int, bool]] = {}  # id(_Update) -> (readers epoch, _sole_reader then)
        # per captured call, the fresh outputs of the last replay (root -> BUFFER): the next replay writes into one
        # again when nothing holds it any more (the result was dropped), instead of taking new pool storage
        self._spare: list[dict[int, UOp]] = []

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self.__call__, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.cnt >= 2 and not kwargs and self._key is not None:
            bufs = _fast_bufs(args, self._key)
            if bufs is not None:  # replay fast path: the same simple signature as the captured call
                return self._replay(bufs, _var_vals(args, kwargs))
        named, tensors, sig = _signature(args, kwargs)
        if self._sig is not None:
            self._check(sig)
        Tensor.realize_all(*tensors)  # inputs are plain buffers before anything is captured or bound
        if self.cnt == 0:
            self._sig, self.cnt = sig, 1
            return self.fn(*args, **kwargs)
        if self.cnt == 1:
            # assigns left lazy before this call (by the first one, say) are not the step's: done before the capture
            Tensor.realize_all(*Tensor._pending_assigns.values())
            in_bufs = [base_buffer(t.uop) for t in tensors]
            before = set(Tensor._pending_assigns.keys())
            with realize.capture() as calls:
                ret = self.fn(*args, **kwargs)
                # with what it returns, every assign the step made and left lazy (a cache written in place): a
                # replay runs only what the capture realized
                made = [t for i, t in list(Tensor._pending_assigns.items()) if i not in before]
                Tensor.realize_all(*[t for t in _flat(ret) if isinstance(t, Tensor)], *made)
            self._build(calls, in_bufs, ret)
            self._key = None if kwargs else _fast_key(args)
            self.cnt = 2
            return ret
        return self._replay([base_buffer(t.uop) for t in tensors], _var_vals(args, kwargs))

    def _check(self, sig: dict[str, Any]) -> None:
        for name in dict.fromkeys([*self._sig, *sig]):
            old, new = self._sig.get(name), sig.get(name)
            if old is None or new is None or old[0] != new[0] or not all(_same(a, b) for a, b in zip(old, new)):
                raise ValueError(
                    f"TinyJit({getattr(self.fn, '__name__', 'fn')}): {name} is {_describe(new)}, but the captured "
                    f"call had {_describe(old)}; a jitted function replays the plans of one signature "
                    f"(call .reset() to capture again, or use another TinyJit)"
                )

    def _build(self, calls: list[realize.Captured], in_bufs: list[UOp], ret: Any) -> None:
        """Turn the captured buffers into bindings: arguments by position, outputs of earlier calls, state tensors
        by identity, everything else as a constant."""
        arg_of = {b: k for k, b in enumerate(in_bufs)}
        out_of: dict[UOp, _Out] = {}
        state_of: dict[UOp, Tensor] = {}
        for c in calls:
            for a in c.assigns:
                if a is not None and a.replaces is not None:
                    state_of.setdefault(a.replaces, a.owner)
        self._calls = []
        for j, c in enumerate(calls):
            binds: list[_Binding] = []
            for b in c.inputs:
                if b in arg_of:
                    binds.append(_Arg(arg_of[b]))
                elif b in out_of:
                    binds.append(out_of[b])
                elif b in state_of:
                    binds.append(_State(state_of[b]))
                else:
                    binds.append(_Const(b))
            updates = []
            for r, a in enumerate(c.assigns):
                if a is None:
                    continue
                i = next((n for n, b in enumerate(c.inputs) if b is a.replaces), None)
                updates.append(_Update(r, a.owner, a.replaces is not None and c.cp.can_write_in_place(r, i)))
            for r, o in enumerate(c.outs):
                out_of.setdefault(o, _Out(j, r))
            self._calls.append(_Call(c.cp, binds, updates))
        self._ret = _map(ret, lambda t: _ret_binding(t, out_of, arg_of))

    def _sole_reader(self, up: _Update) -> bool:
        """_sole_reader(up.tensor), kept while uopc.uop.readers_epoch() stays the same: in a steady loop nothing
        gains a reader, and a False answer never lasts (its tensor is rebound to fresh storage, which adds one)."""
        epoch = readers_epoch()
        hit = self._sole.get(id(up))
        if hit is not None and hit[0] == epoch:
            return hit[1]
        ok = _sole_reader(up.tensor)
        self._sole[id(up)] = (epoch, ok)
        return ok

    def _replay(self, args: list[UOp], var_vals: dict[Variable, int] | None = None) -> Any:
        results: list[list[UOp]] = []
        if len(self._spare) != len(self._calls):
            self._spare = [{} for _ in self._calls]
        for call, spare in zip(self._calls, self._spare, strict=True):
            outs: list[UOp | None] = [None] * len(call.cp.plan.outs)
            for up in call.updates:
                if up.in_place and self._sole_reader(up):
                    outs[up.root] = base_buffer(up.tensor.uop)
            fresh = tuple(up.root for up in call.updates if outs[up.root] is None) if call.updates else ()
            while spare:
                r, u = spare.popitem()
                # held by nothing but `u` and this call's argument: no tensor, graph or view can see it change
                if outs[r] is None and sys.getrefcount(u) == _UNHELD and not is_shared(u):
                    outs[r] = u
                del u
            binds = call.fixed.copy()
            for k, b in call.moving:
                binds[k] = b.get(args, results)
            res = realize.run_plan(call.cp, binds, outs, tracked=fresh, var_vals=var_vals, prefilled=call.prefilled)
            if call.cp.fresh:
                updated = {up.root for up in call.updates}
                spare.update((r, res[r]) for r in call.cp.fresh if r not in updated)
            for up in call.updates:
                if outs[up.root] is None:  # written into fresh storage: the tensor follows it
                    t, u = up.tensor, res[up.root]
                    t.hold(u if u.shape == t.shape else u.reshape(t.shape))
            results.append(res)
        return _map(self._ret, lambda b: b.value(results, args, var_vals))


def _unheld_count() -> int:
    """sys.getrefcount of an object that only a local name refers to, taken out of a dict as _replay takes a spare
    output (2 on CPython 3.11: the name and the call's argument). Measured, not assumed: an interpreter that counts
    stack references differently must never make a held output look free."""
    spare = {0: object()}
    _, u = spare.popitem()
    return sys.getrefcount(u)


_UNHELD = _unheld_count()


def _flat(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _flat(v)]
    if isinstance(x, dict):
        return [y for v in x.values() for y in _flat(v)]
    return [x]


def _map(x: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply fn to every leaf of nested lists, tuples and dicts (the function's return value)."""
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    return fn(x)


@dataclass(frozen=True)
class _Returned:  # not a tuple: _map walks into tuples
    """A returned Tensor: a root of a captured call or an argument, in the shape the function returned."""

    src: _Arg | _Out
    shape: tuple[int, ...]

    def value(self, results: list[list[UOp]], args: list[UOp], var_vals: dict[Variable, int] | None) -> Tensor:
        u = self.src.get(args, results)
        t = Tensor(u if u.shape == self.shape else u.reshape(self.shape))
        return t._bound(var_vals) if var_vals and symbolic(self.shape) else t


@dataclass(frozen=True)
class _Value:
    """Anything else the function returned: replayed as captured."""

    captured: Any

    def value(self, results: list[list[UOp]], args: list[UOp], var_vals: dict[Variable, int] | None) -> Any:
        return self.captured


def _ret_binding(t: Any, out_of: dict[UOp, _Out], arg_of: dict[UOp, int]) -> _Returned | _Value:
    if not isinstance(t, Tensor):
        return _Value(t)
    b = base_buffer(t.uop)
    if b in out_of:
        return _Returned(out_of[b], t.shape)
    if b in arg_of:
        return _Returned(_Arg(arg_of[b]), t.shape)
    return _Value(t)

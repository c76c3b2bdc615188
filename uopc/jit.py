"""TinyJit: capture the plans a function runs, then replay them with no graph building and no structure key.

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        loss = model(x).cross_entropy(y)
        opt.zero_grad(); loss.backward(); opt.step(loss)
        return loss

    step(x0, y0)   # 1st call: runs normally (compiles)
    step(x1, y1)   # 2nd call: runs normally and records every realize (plan, buffers read, buffers written)
    step(x2, y2)   # later calls: bind x2, y2 to the recorded plans' inputs and run them, nothing else

Inputs are the Tensors among the arguments, bound by position (keyword arguments by name). Everything else a plan
read (parameters, optimizer state, constants) is bound by identity: a tensor that was assigned during the step is
followed to its current buffer, and written in place when every read of its old value comes earlier in the plan
and nothing outside holds it (else into fresh pool storage, and the tensor is rebound). Returned Tensors are fresh
buffers of that call, valid after later calls. A call whose Tensor shapes or dtypes, or whose other arguments,
differ from the captured call raises ValueError naming the argument, as does a change of `Tensor.training` or
`Tensor.no_grad` (the modes the step's graph depends on); `reset()` captures anew.
Per-step Python values are frozen by replay: optimizers keep theirs (lr, step count) in state tensors.
One TinyJit object runs one call at a time: calls from several threads at once would race on the state it updates
in place (as the same step would without the JIT); captures are per thread.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uopc import realize
from uopc.buffer import is_contiguous_buffer
from uopc.tensor import Tensor
from uopc.uop import UOp, base_buffer

__all__ = ["TinyJit"]

# references to a state tensor's uop when only the tensor holds it: the tensor's attribute, the local name and
# getrefcount's argument; to the BUFFER under its RESHAPE: the RESHAPE's sources and getrefcount's argument
_SOLE_UOP, _SOLE_BASE = 3, 2


@dataclass
class _Call:
    """One captured realize, with its buffers turned into bindings."""

    cp: realize.CompiledPlan
    inputs: list[tuple]  # per input: ("arg", k) | ("out", call, root) | ("state", tensor) | ("const", BUFFER)
    owners: list[tuple[int, Tensor, bool]]  # (root, tensor realized into it, written in place when it can be)


def _signature(args: tuple, kwargs: dict) -> tuple[list[tuple[str, Any]], list[Tensor], dict[str, Any]]:
    """The named arguments in order, the Tensors among them, and each argument's signature."""
    # keyword arguments by name, whatever order the call site wrote them in
    named = [(f"argument {i}", a) for i, a in enumerate(args)]
    named += [(f"argument {k!r}", kwargs[k]) for k in sorted(kwargs)]
    tensors = [a for _, a in named if isinstance(a, Tensor)]
    sig = {n: (("Tensor", a.shape, a.dtype.name) if isinstance(a, Tensor) else ("value", a)) for n, a in named}
    # the modes the function reads from the Tensor class: dropout and BatchNorm change their graphs with training,
    # and no_grad what is tracked, so a capture holds for the modes it was made under only
    sig["Tensor.training"], sig["Tensor.no_grad"] = ("value", Tensor.training), ("value", Tensor.no_grad)
    return named, tensors, sig


_SIMPLE = (int, float, str, bool, type(None))


def _fast_key(args: tuple) -> tuple | None:
    """Positional arguments as (shape, dtype) per Tensor and (type, value) per simple value; None if any other."""
    key: list[tuple] = [(Tensor.training, Tensor.no_grad)]
    for a in args:
        if isinstance(a, Tensor):
            key.append((a.shape, a.dtype))
        elif type(a) in _SIMPLE:
            key.append((type(a), a))
        else:
            return None
    return tuple(key)


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
    return f"{type(s[1]).__name__} {s[1]!r}"


def _sole_owner(t: Tensor) -> bool:
    """Nothing but `t` holds its buffer: no lazy graph, view or other tensor can still read the old value."""
    u = t.uop
    if sys.getrefcount(u) > _SOLE_UOP:
        return False
    return u is base_buffer(u) or (
        len(u.src) == 1 and u.src[0] is base_buffer(u) and sys.getrefcount(u.src[0]) <= _SOLE_BASE
    )


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
        self._ret: Any = None
        self._key: tuple | None = None  # the captured call's signature in a form compared with one ==

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self.__call__, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.cnt >= 2 and not kwargs and self._key is not None and _fast_key(args) == self._key:
            # replay fast path: the same simple signature as the captured call
            bufs = []
            for a in args:
                if isinstance(a, Tensor):
                    u = a.uop if is_contiguous_buffer(a.uop) else a.realize().uop
                    bufs.append(base_buffer(u))
            return self._replay(bufs)
        named, tensors, sig = _signature(args, kwargs)
        if self._sig is not None:
            self._check(sig)
        Tensor.realize_all(*tensors)  # inputs are plain buffers before anything is captured or bound
        if self.cnt == 0:
            self._sig, self.cnt = sig, 1
            return self.fn(*args, **kwargs)
        if self.cnt == 1:
            in_bufs = [base_buffer(t.uop) for t in tensors]
            with realize.capture() as calls:
                ret = self.fn(*args, **kwargs)
                Tensor.realize_all(*[t for t in _flat(ret) if isinstance(t, Tensor)])
            self._build(calls, in_bufs, ret)
            self._key = None if kwargs else _fast_key(args)
            self.cnt = 2
            return ret
        return self._replay([base_buffer(t.uop) for t in tensors])

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
        out_of: dict[UOp, tuple[int, int]] = {}
        state_of: dict[UOp, Tensor] = {}
        for c in calls:
            for ow in c.owners or []:
                if ow is not None and ow[1] is not None:
                    state_of.setdefault(ow[1], ow[0])
        self._calls = []
        for j, c in enumerate(calls):
            binds = []
            for b in c.inputs:
                if b in arg_of:
                    binds.append(("arg", arg_of[b]))
                elif b in out_of:
                    binds.append(("out", *out_of[b]))
                elif b in state_of:
                    binds.append(("state", state_of[b]))
                else:  # a constant, or host data made inside the function: replayed as captured
                    binds.append(("const", b))
            owners = []
            for r, ow in enumerate(c.owners or []):
                if ow is None:
                    continue
                t, prev = ow
                i = next((n for n, b in enumerate(c.inputs) if b is prev), None) if prev is not None else None
                owners.append((r, t, prev is not None and realize.inplace_ok(c.cp, r, i)))
                # (an assigned tensor follows its root on every replay, in place or into fresh storage)
            for r, o in enumerate(c.outs):
                out_of.setdefault(o, (j, r))
            self._calls.append(_Call(c.cp, binds, owners))
        self._ret = _map(ret, lambda t: _ret_binding(t, out_of, arg_of))

    def _replay(self, args: list[UOp]) -> Any:
        results: list[list[UOp]] = []
        for call in self._calls:
            outs: list[UOp | None] = [None] * len(call.cp.plan.outs)
            for r, t, inplace in call.owners:
                if inplace and _sole_owner(t):
                    outs[r] = base_buffer(t.uop)
            inputs = []
            for b in call.inputs:
                kind = b[0]
                if kind == "arg":
                    inputs.append(args[b[1]])
                elif kind == "out":
                    inputs.append(results[b[1]][b[2]])
                elif kind == "state":
                    inputs.append(base_buffer(b[1].uop))
                else:
                    inputs.append(b[1])
            res = realize.run_plan(call.cp, inputs, outs)
            for r, t, _ in call.owners:
                if outs[r] is None:  # written into fresh storage: the tensor follows it
                    t.uop = res[r] if res[r].shape == t.shape else res[r].reshape(t.shape)
            results.append(res)
        return _map(self._ret, lambda b: _ret_value(b, results, args))


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
class _Ret:
    """Where a returned value comes from: a root of a captured call, an argument, or the captured value itself."""

    kind: str  # "out" | "arg" | "value"
    where: tuple = ()
    shape: tuple = ()
    value: Any = None


def _ret_binding(t: Any, out_of: dict, arg_of: dict) -> _Ret:
    if not isinstance(t, Tensor):
        return _Ret("value", value=t)
    b = base_buffer(t.uop)
    if b in out_of:
        return _Ret("out", out_of[b], t.shape)
    if b in arg_of:
        return _Ret("arg", (arg_of[b],), t.shape)
    return _Ret("value", value=t)


def _ret_value(b: _Ret, results: list[list[UOp]], args: list[UOp]) -> Any:
    if b.kind == "value":
        return b.value
    u = results[b.where[0]][b.where[1]] if b.kind == "out" else args[b.where[0]]
    return Tensor(u if u.shape == b.shape else u.reshape(b.shape))

"""Optimizers: SGD, Adam, AdamW. A step realizes every update in one `Tensor.realize_all`.

    >>> opt = AdamW(parameters([l1, l2]), lr=1e-3)
    >>> opt.zero_grad(); loss.backward(opt.params); opt.step(loss)   # one plan: grads, updates and the loss

So the whole training step (forward, backward, update) is a single cached plan. Anything that changes between
steps (the learning rate, Adam's bias corrections) enters the graph as a one-element tensor: data, not structure,
so the plan is reused rather than rebuilt and recompiled every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

from uopc.runtime.buffer import storage_view
from uopc.tensor import Tensor
from uopc.uop import base_buffer


def _state(value: float) -> Tensor:
    """A one-element float64 state tensor (a (1,) tensor broadcasts against any shape): data, not structure."""
    return Tensor(np.array([value], np.float64))


def _per_dtype(scalars: dict[str, Tensor]) -> Callable[[str, Tensor], Tensor]:
    """`sc(name, p)`: the one-element scalar `name` cast to p's dtype, one cast per (name, dtype) shared by all
    parameters (a (1,) tensor broadcasts against any shape)."""
    made: dict[tuple, Tensor] = {}

    def sc(name: str, p: Tensor) -> Tensor:
        if (name, p.dtype) not in made:
            made[(name, p.dtype)] = scalars[name].cast(p.dtype)
        return made[(name, p.dtype)]

    return sc


_STATE_LISTS = ("buf", "m", "v")  # per-parameter optimizer state, by attribute name
_STATE_SCALARS = ("t", "lr")


class Optimizer:
    """Holds the parameters and their state; `step(*extra)` realizes all updates and `extra` as one plan.

    Values that change between steps (the learning rate, Adam's step count) live in one-element state tensors
    that the plan reads and updates, never in Python floats: the plan is reused every step, and a TinyJit replay,
    which runs no Python of the step, still sees a changed `lr` and advances the step count.
    """

    def __init__(self, params: Iterable[Tensor], lr: float):
        # a shared weight is stepped once; a tensor marked requires_grad=False (BatchNorm's running statistics) is
        # state, not a parameter, so parameters(model) can be passed whole (tinygrad's rule)
        self.params: list[Tensor] = list({id(p): p for p in params if p.requires_grad is not False}.values())
        for p in self.params:
            if not p.requires_grad:  # registered, so loss.backward() without a list finds it too
                p.requires_grad_()
        self._lr = _state(lr)
        self._lr_value = float(lr)

    @property
    def lr(self) -> float | Tensor:
        """The learning rate; setting a number writes the state tensor the plan reads (a schedule may set it each
        step). A one-element Tensor set here is read by the plan itself (and returned here): assign into it."""
        return self._lr if self._lr_value is None else self._lr_value

    @lr.setter
    def lr(self, value: float | Tensor) -> None:
        if isinstance(value, Tensor):
            if value.numel() != 1:
                raise ValueError(f"optimizer lr: a Tensor lr must have one element, got shape {value.shape}")
            self._lr, self._lr_value = value, None
            return
        if self._lr_value is None:  # the user's tensor was in use: never write into it
            self._lr = _state(value)
        self._lr_value = float(value)
        storage_view(base_buffer(self._lr.uop))[0] = value

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def _zeros_like(self, p: Tensor) -> Tensor:
        """Optimizer state starts as a realized zero buffer, so step 1 has the same structure as step 2."""
        return Tensor(np.zeros(p.shape, p.dtype.np))

    def _updates(self) -> list[Tensor]:
        raise NotImplementedError

    def step(self, *extra: Tensor) -> None:
        """Apply one update to every parameter that has a gradient; compute `extra` (e.g. the loss) alongside."""
        # extra first: the loss kernel then runs before the updates, so no parameter is read after it is
        # written and every update can go in place under TinyJit
        Tensor.realize_all(*extra, *self._updates())

    def state_dict(self) -> dict[str, object]:
        """The optimizer's state as {name: Tensor or number}: "m.3" is the first moment of parameter 3, "t" the step."""
        out: dict[str, object] = {}
        for name in _STATE_LISTS:
            for i, t in enumerate(getattr(self, name, None) or []):
                out[f"{name}.{i}"] = t
        for name in _STATE_SCALARS:
            if hasattr(self, name):
                v = getattr(self, name)
                out[name] = v if isinstance(v, Tensor) else float(v) if name == "lr" else int(v)
        return out

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore what state_dict saved (Tensors, arrays or numbers), checking names and shapes."""
        own = self.state_dict()
        if own.keys() != state.keys():
            raise KeyError(
                f"optimizer state: missing {sorted(own.keys() - state.keys())}, "
                f"unexpected {sorted(state.keys() - own.keys())}"
            )
        news = []
        for k, cur in own.items():
            v = state[k]
            if isinstance(cur, Tensor):
                v = v if isinstance(v, Tensor) else Tensor(np.asarray(v))
                if v.shape != cur.shape:
                    raise ValueError(f"optimizer state {k}: shape {v.shape} in the state, {cur.shape} here")
                news.append(cur.assign(v.cast(cur.dtype).contiguous()))
            else:
                setattr(self, k, type(cur)(v.item() if isinstance(v, Tensor) else v))
        if news:
            Tensor.realize_all(*news)


class SGD(Optimizer):
    """p -= lr * g, with optional momentum (PyTorch's form: v = momentum * v + g), Nesterov and L2 weight decay."""

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, lr)
        self.momentum, self.nesterov, self.wd = momentum, nesterov, weight_decay
        self.buf = [self._zeros_like(p) for p in self.params] if momentum else []

    def _updates(self) -> list[Tensor]:
        out = []
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad + p.detach() * self.wd if self.wd else p.grad
            if self.momentum:
                b = self.buf[i].assign(self.buf[i] * self.momentum + g)
                out.append(b)
                g = g + b * self.momentum if self.nesterov else b
            out.append(p.assign(p.detach() - g * self._lr.cast(p.dtype)))
        return out


class AdamW(Optimizer):
    """Adam with decoupled weight decay: p = p * (1 - lr * wd) - lr * m_hat / (sqrt(v_hat) + eps)."""

    decoupled = True

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ):
        super().__init__(params, lr)
        self.b1, self.b2, self.eps, self.wd = b1, b2, eps, weight_decay
        self._t = _state(0)  # steps taken, updated inside the plan
        self.m = [self._zeros_like(p) for p in self.params]
        self.v = [self._zeros_like(p) for p in self.params]

    @property
    def t(self) -> int:
        """The number of steps taken (read from the state tensor; setting it writes there, as load_state_dict)."""
        return int(self._t.item())

    @t.setter
    def t(self, value: int) -> None:
        self._t.realize()
        storage_view(base_buffer(self._t.uop))[0] = value

    def _bias_corrections(self) -> tuple[Tensor, Tensor, Tensor]:
        """The step count t+1 (assigned) and 1 - b1**t, 1 - b2**t, computed in the plan in float64 (b**t =
        exp(t * ln b)): neither a new plan per step nor a value frozen under replay."""
        t = self._t.assign(self._t + 1)
        return t, 1 - (t * math.log(self.b1)).exp(), 1 - (t * math.log(self.b2)).exp()

    def _updates(self) -> list[Tensor]:
        t, c1, c2 = self._bias_corrections()
        sc = _per_dtype({"lr_c1": self._lr / c1, "c2": c2.reciprocal(), "keep": 1 - self._lr * self.wd})
        out = []
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            g = p.grad
            if self.wd and not self.decoupled:  # Adam's L2 penalty goes into the gradient
                g = g + p.detach() * self.wd
            m.assign(m * self.b1 + g * (1 - self.b1))
            v.assign(v * self.b2 + g.square() * (1 - self.b2))
            upd = m * sc("lr_c1", p) / ((v * sc("c2", p)).sqrt() + self.eps)
            keep = p.detach()
            if self.wd and self.decoupled:
                keep = keep * sc("keep", p)
            out += [p.assign(keep - upd), m, v]
        return out + [t]


class Adam(AdamW):
    """Adam (PyTorch's): weight decay, if any, is an L2 term added to the gradient."""

    decoupled = False

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, lr, b1, b2, eps, weight_decay)


class LAMB(AdamW):
    """LAMB (You et al.): Adam's step plus decoupled weight decay, scaled per tensor by the trust ratio
    ||p|| / ||step|| (1 where either norm is 0). `adam=True` drops the trust ratio (plain AdamW-style step)."""

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        adam: bool = False,
    ):
        super().__init__(params, lr, b1, b2, eps, weight_decay)
        self.adam = adam

    def _updates(self) -> list[Tensor]:
        t, c1, c2 = self._bias_corrections()
        sc = _per_dtype({"lr": self._lr, "c1": c1.reciprocal(), "c2": c2.reciprocal()})
        out = []
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            g = p.grad
            m.assign(m * self.b1 + g * (1 - self.b1))
            v.assign(v * self.b2 + g.square() * (1 - self.b2))
            up = (m * sc("c1", p)) / ((v * sc("c2", p)).sqrt() + self.eps) + p.detach() * self.wd
            if not self.adam:
                r1, r2 = p.detach().square().sum().sqrt(), up.square().sum().sqrt()
                up = up * ((r1 > 0) & (r2 > 0)).where(r1 / r2, 1.0)
            out += [p.assign(p.detach() - up * sc("lr", p)), m, v]
        return out + [t]


def clip_grad_norm_(params: Iterable[Tensor], max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Scale every gradient by min(1, max_norm / (total_norm + 1e-6)) in place (lazily), as PyTorch; returns the
    total norm over all gradients (a lazy scalar)."""
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return Tensor(0.0)
    if norm_type == float("inf"):
        total = Tensor.stack([p.grad.abs().max().float() for p in grads]).max()
    else:
        total = Tensor.stack([(p.grad.float().abs() ** norm_type).sum() for p in grads]).sum() ** (1 / norm_type)
    coef = (max_norm / (total + 1e-6)).minimum(1.0)
    for p in grads:
        p.grad = p.grad * coef.cast(p.grad.dtype)
    return total

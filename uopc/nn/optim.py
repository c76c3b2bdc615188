"""Optimizers: SGD, Adam, AdamW. A step realizes every update in one `Tensor.realize_all`.

    >>> opt = AdamW(parameters([l1, l2]), lr=1e-3)
    >>> opt.zero_grad(); loss.backward(opt.params); opt.step(loss)   # one plan: grads, updates and the loss

So the whole training step (forward, backward, update) is a single cached plan. Anything that changes between
steps (the learning rate, Adam's bias corrections) enters the graph as a one-element tensor: data, not structure,
so the plan is reused rather than rebuilt and recompiled every step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from uopc.buffer import base_buffer, buffer_data
from uopc.tensor import Tensor


def _state(value: float) -> Tensor:
    """A one-element float64 state tensor (a (1,) tensor broadcasts against any shape): data, not structure."""
    return Tensor(np.array([value], np.float64))


class Optimizer:
    """Holds the parameters and their state; `step(*extra)` realizes all updates and `extra` as one plan.

    Values that change between steps (the learning rate, Adam's step count) live in one-element state tensors
    that the plan reads and updates, never in Python floats: the plan is reused every step, and a TinyJit replay,
    which runs no Python of the step, still sees a changed `lr` and advances the step count.
    """

    def __init__(self, params: Iterable[Tensor], lr: float):
        self.params: list[Tensor] = list({id(p): p for p in params}.values())  # a shared weight is stepped once
        for p in self.params:
            if not p.requires_grad:  # registered, so loss.backward() without a list finds it too
                p.requires_grad_()
        self._lr = _state(lr)
        self._lr_value = float(lr)

    @property
    def lr(self) -> float:
        """The learning rate; setting it writes the state tensor the plan reads (a schedule may set it each step)."""
        return self._lr_value

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr_value = float(value)
        buffer_data(base_buffer(self._lr.uop))[0] = value

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
        """The number of steps taken (read from the state tensor)."""
        return int(self._t.item())

    def _updates(self) -> list[Tensor]:
        # the step count and the bias corrections are computed in the plan, in float64 (b**t = exp(t * ln b)), so
        # neither a new plan per step nor a frozen value under replay; lr too, from its state tensor
        t = self._t.assign(self._t + 1)
        c1 = 1 - (t * math.log(self.b1)).exp()
        c2 = 1 - (t * math.log(self.b2)).exp()
        scalars = {"lr_c1": self._lr / c1, "c2": c2.reciprocal(), "keep": 1 - self._lr * self.wd}
        made: dict[tuple, Tensor] = {}

        def sc(name: str, p: Tensor) -> Tensor:
            if (name, p.dtype) not in made:
                made[(name, p.dtype)] = scalars[name].cast(p.dtype)
            return made[(name, p.dtype)]

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

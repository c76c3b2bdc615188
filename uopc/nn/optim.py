"""Optimizers: SGD, Adam, AdamW. A step realizes every update in one `Tensor.realize_all`.

    >>> opt = AdamW(parameters([l1, l2]), lr=1e-3)
    >>> opt.zero_grad(); loss.backward(opt.params); opt.step(loss)   # one plan: grads, updates and the loss

So the whole training step (forward, backward, update) is a single cached plan. Anything that changes between
steps (the learning rate, Adam's bias corrections) enters the graph as a one-element tensor: data, not structure,
so the plan is reused rather than rebuilt and recompiled every step.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from uopc.tensor import Tensor


class _StepScalars:
    """The scalars of one step as one-element buffers (data, not structure), one per (value, dtype), shared by all
    parameters: a (1,) tensor broadcasts against any shape."""

    def __init__(self, **values: float):
        self.values, self.made = values, {}

    def get(self, name: str, like: Tensor) -> Tensor:
        key = (name, like.dtype)
        if key not in self.made:
            self.made[key] = Tensor(np.array([self.values[name]], like.dtype.np))
        return self.made[key]


class Optimizer:
    """Holds the parameters and their state; `step(*extra)` realizes all updates and `extra` as one plan."""

    def __init__(self, params: Iterable[Tensor], lr: float):
        # a shared weight is stepped once; a tensor marked requires_grad=False (BatchNorm's running statistics) is
        # state, not a parameter, so parameters(model) can be passed whole (tinygrad's rule)
        self.params: list[Tensor] = list({id(p): p for p in params if p.requires_grad is not False}.values())
        for p in self.params:
            if not p.requires_grad:  # registered, so loss.backward() without a list finds it too
                p.requires_grad_()
        self.lr = lr

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
        Tensor.realize_all(*self._updates(), *extra)


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
        out, sc = [], _StepScalars(lr=self.lr)
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad + p.detach() * self.wd if self.wd else p.grad
            if self.momentum:
                b = self.buf[i].assign(self.buf[i] * self.momentum + g)
                out.append(b)
                g = g + b * self.momentum if self.nesterov else b
            out.append(p.assign(p.detach() - g * sc.get("lr", p)))
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
        self.t = 0
        self.m = [self._zeros_like(p) for p in self.params]
        self.v = [self._zeros_like(p) for p in self.params]

    def _updates(self) -> list[Tensor]:
        self.t += 1
        # the bias corrections change every step: as Python floats they would be CONSTs in the graph and every
        # step would compile a new plan, so they (and lr, which a schedule may change) travel as buffers
        c1, c2 = 1 - self.b1**self.t, 1 - self.b2**self.t
        sc = _StepScalars(lr_c1=self.lr / c1, c2=1 / c2, keep=1 - self.lr * self.wd)
        out = []
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            g = p.grad
            if self.wd and not self.decoupled:  # Adam's L2 penalty goes into the gradient
                g = g + p.detach() * self.wd
            m.assign(m * self.b1 + g * (1 - self.b1))
            v.assign(v * self.b2 + g.square() * (1 - self.b2))
            upd = m * sc.get("lr_c1", p) / ((v * sc.get("c2", p)).sqrt() + self.eps)
            keep = p.detach()
            if self.wd and self.decoupled:
                keep = keep * sc.get("keep", p)
            out += [p.assign(keep - upd), m, v]
        return out


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

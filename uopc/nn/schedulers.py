"""Learning-rate schedulers: each `step()` sets `opt.lr` for the next optimizer step.

    >>> sched = CosineAnnealingLR(opt, T_max=100)
    >>> for x, y in batches: ...; opt.step(loss); sched.step()

The optimizers pass lr into the step's plan as a one-element buffer (data, not structure), so a schedule changes
numbers without recompiling; if `opt.lr` is itself a Tensor the scheduler assigns into it instead of replacing it.
"""

from __future__ import annotations

import math

from uopc.nn.optim import Optimizer
from uopc.tensor import Tensor


class LRScheduler:
    """Base: `get_lr()` gives the rate for the current epoch count; `step()` advances it and sets opt.lr."""

    def __init__(self, opt: Optimizer):
        self.opt = opt
        lr = opt.lr
        self.base_lr = float(lr.item()) if isinstance(lr, Tensor) else float(lr)
        self.epoch = 0
        self._set(self.get_lr())

    def get_lr(self) -> float:
        raise NotImplementedError

    def _set(self, lr: float) -> None:
        if isinstance(self.opt.lr, Tensor):
            self.opt.lr.assign(Tensor([lr], dtype=self.opt.lr.dtype).reshape(self.opt.lr.shape)).realize()
        else:
            self.opt.lr = lr

    def step(self) -> None:
        self.epoch += 1
        self._set(self.get_lr())

    def state_dict(self) -> dict[str, float]:
        return {"epoch": self.epoch, "base_lr": self.base_lr}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.epoch, self.base_lr = int(state["epoch"]), float(state["base_lr"])
        self._set(self.get_lr())


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size), as PyTorch's StepLR."""

    def __init__(self, opt: Optimizer, step_size: int, gamma: float = 0.1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(opt)

    def get_lr(self) -> float:
        return self.base_lr * self.gamma ** (self.epoch // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) (1 + cos(pi epoch / T_max)) / 2, as PyTorch's (closed form)."""

    def __init__(self, opt: Optimizer, T_max: int, eta_min: float = 0.0):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(opt)

    def get_lr(self) -> float:
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * self.epoch / self.T_max)) / 2


class LinearWarmupLR(LRScheduler):
    """Linear warm-up from start_factor * base_lr to base_lr over `warmup` steps, then constant (PyTorch's
    LinearLR with end_factor 1 and total_iters = warmup)."""

    def __init__(self, opt: Optimizer, warmup: int, start_factor: float = 1 / 3):
        self.warmup, self.start_factor = warmup, start_factor
        super().__init__(opt)

    def get_lr(self) -> float:
        f = self.start_factor + (1 - self.start_factor) * min(self.epoch, self.warmup) / self.warmup
        return self.base_lr * f

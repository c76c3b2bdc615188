"""Normalization layers: BatchNorm1d/2d (running statistics, train/eval as PyTorch), GroupNorm, InstanceNorm,
RMSNorm; and Sequential.

>>> bn = BatchNorm2d(32)
>>> with Tensor.train():
...     y = bn(x)          # normalizes with batch statistics, updates bn.running_mean/var lazily
>>> opt.step(loss, *bn.buffers())   # realize the running statistics in the same plan as the update
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from uopc.tensor import Tensor
from uopc.tensor.elementwise import opmath


def _param(n: int, value: float) -> Tensor:
    return Tensor(np.full(n, value, np.float32), requires_grad=True)


def _buffer(n: int, value: float, dtype: Any = np.float32) -> Tensor:
    """State that is not trained (requires_grad=False): optimizers skip it, state dicts keep it."""
    return Tensor(np.full(n, value, dtype), requires_grad=False)


class _BatchNorm:
    """Normalize each channel (dim 1) over the batch and spatial dims, as PyTorch's BatchNorm.

    In training (Tensor.training) the batch's mean and biased variance normalize, and the running statistics move
    by `momentum` toward the batch's mean and unbiased variance (momentum None: a cumulative average). In eval the
    running statistics normalize, unless track_running_stats is False."""

    ndims: tuple[int, ...] = (2, 3)

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ):
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.track_running_stats = track_running_stats
        self.weight = _param(num_features, 1.0) if affine else None
        self.bias = _param(num_features, 0.0) if affine else None
        if track_running_stats:
            self.running_mean = _buffer(num_features, 0.0)
            self.running_var = _buffer(num_features, 1.0)
            self.num_batches_tracked = _buffer(1, 0, np.int32)
        self._count = 0  # the host's copy of num_batches_tracked, for momentum=None

    def buffers(self) -> list[Tensor]:
        """The running statistics: realize them with the training step (opt.step(loss, *bn.buffers()))."""
        return [self.running_mean, self.running_var, self.num_batches_tracked] if self.track_running_stats else []

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim not in self.ndims or x.shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__}({self.num_features}) expects a {' or '.join(map(str, self.ndims))}-D input "
                f"with {self.num_features} channels in dim 1, got shape {x.shape}"
            )
        shape = (1, self.num_features) + (1,) * (x.ndim - 2)
        if Tensor.training or not self.track_running_stats:
            # statistics over (N, H*W): spatial dims merged, so each reduction's inner loop is long and contiguous
            x3 = x.reshape(x.shape[0], self.num_features, -1)
            mean = x3.mean((0, 2))
            var = (x3 - mean.reshape(1, -1, 1)).square().mean((0, 2))  # biased, as PyTorch normalizes
            if Tensor.training and self.track_running_stats:
                self._update(mean.detach(), var.detach(), x.numel() // self.num_features)
        else:
            mean, var = self.running_mean, self.running_var
        y = (x - mean.reshape(shape)) * (var + self.eps).rsqrt().reshape(shape)
        if self.weight is not None:
            y = y * self.weight.reshape(shape) + self.bias.reshape(shape)
        return y

    def _update(self, mean: Tensor, var: Tensor, n: int) -> None:
        self._count += 1
        # momentum None: a cumulative average; the factor changes each step, so it travels as data, not a constant
        m = Tensor(np.array([1 / self._count if self.momentum is None else self.momentum], np.float32))
        unbiased = var * (n / max(n - 1, 1))
        self.running_mean.assign(self.running_mean * (1 - m) + mean * m)
        self.running_var.assign(self.running_var * (1 - m) + unbiased * m)
        self.num_batches_tracked.assign(self.num_batches_tracked + 1)


class BatchNorm1d(_BatchNorm):
    """PyTorch's BatchNorm1d on (N, C) or (N, C, L)."""

    ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """PyTorch's BatchNorm2d on (N, C, H, W)."""

    ndims = (4,)


BatchNorm = BatchNorm2d  # tinygrad's name


class GroupNorm:
    """Normalize each sample over groups of channels (and all spatial positions); per-channel affine."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        if num_channels % num_groups:
            raise ValueError(f"num_channels {num_channels} must divide by num_groups {num_groups}")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = _param(num_channels, 1.0) if affine else None
        self.bias = _param(num_channels, 0.0) if affine else None

    @opmath
    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"GroupNorm expects (N, {self.num_channels}, ...), got shape {x.shape}")
        g = x.reshape(x.shape[0], self.num_groups, -1)
        gc = g - g.mean(-1, keepdim=True)
        y = (gc * (gc.square().mean(-1, keepdim=True) + self.eps).rsqrt()).reshape(x.shape)
        if self.weight is None:
            return y
        shape = (1, self.num_channels) + (1,) * (x.ndim - 2)
        return y * self.weight.reshape(shape) + self.bias.reshape(shape)


class InstanceNorm:
    """Normalize each sample and channel over its spatial positions (PyTorch's InstanceNorm1d/2d/3d defaults:
    affine=False, no running statistics)."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = False):
        self.num_features, self.eps = num_features, eps
        self.weight = _param(num_features, 1.0) if affine else None
        self.bias = _param(num_features, 0.0) if affine else None

    @opmath
    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 3 or x.shape[1] != self.num_features:
            raise ValueError(f"InstanceNorm expects (N, {self.num_features}, *spatial), got shape {x.shape}")
        axes = tuple(range(2, x.ndim))
        xc = x - x.mean(axes, keepdim=True)
        y = xc * (xc.square().mean(axes, keepdim=True) + self.eps).rsqrt()
        if self.weight is None:
            return y
        shape = (1, self.num_features) + (1,) * (x.ndim - 2)
        return y * self.weight.reshape(shape) + self.bias.reshape(shape)


InstanceNorm1d = InstanceNorm2d = InstanceNorm3d = InstanceNorm


class RMSNorm:
    """x / sqrt(mean(x^2 over the last dim) + eps) * weight (PyTorch's eps=None means the dtype's epsilon)."""

    def __init__(self, dim: int, eps: float | None = None, elementwise_affine: bool = True):
        self.eps = float(np.finfo(np.float32).eps) if eps is None else eps
        self.weight = _param(dim, 1.0) if elementwise_affine else None

    @opmath
    def __call__(self, x: Tensor) -> Tensor:
        y = x * (x.square().mean(-1, keepdim=True) + self.eps).rsqrt()
        return y * self.weight if self.weight is not None else y


class Sequential:
    """Call layers (any callables: layers, Tensor methods, functions) one after another."""

    def __init__(self, *layers: Callable[[Tensor], Tensor]):
        self.layers = list(layers)

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def __getitem__(self, i: int) -> Callable[[Tensor], Tensor]:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

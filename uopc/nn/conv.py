"""Convolution layers: Conv1d, Conv2d, ConvTranspose2d, each holding a requires-grad weight and bias.

>>> conv = Conv2d(1, 32, 3, padding=1)
>>> y = conv(x)            # x (N, 1, 28, 28) -> (N, 32, 28, 28): Tensor.conv2d with the layer's weights
"""

from __future__ import annotations

import math
from typing import Any

from uopc.helpers import prod
from uopc.tensor import Tensor


def _ntuple(v: Any, n: int) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


def _uniform(shape: tuple[int, ...], bound: float) -> Tensor:
    """U(-bound, bound), realized now so the first training step already sees plain buffers."""
    return Tensor.uniform(*shape, low=-bound, high=bound, requires_grad=True).realize()


class _ConvNd:
    """Weight (out, in/groups, *kernel) and bias (out,), initialized as PyTorch does (uniform, bound 1/sqrt(fan_in),
    fan_in = in/groups * prod(kernel))."""

    dims = 2

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
    ):
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"in_channels {in_channels} and out_channels {out_channels} must be multiples of groups={groups}"
            )
        self.kernel_size = _ntuple(kernel_size, self.dims)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        bound = 1 / math.sqrt(in_channels // groups * prod(self.kernel_size))
        self.weight = _uniform((out_channels, in_channels // groups, *self.kernel_size), bound)
        self.bias = _uniform((out_channels,), bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv2d(self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv1d(_ConvNd):
    """PyTorch's Conv1d: (N, in, L) -> (N, out, L')."""

    dims = 1


class Conv2d(_ConvNd):
    """PyTorch's Conv2d: (N, in, H, W) -> (N, out, H', W')."""

    dims = 2


class ConvTranspose2d:
    """PyTorch's ConvTranspose2d: weight (in, out/groups, kh, kw), bound 1/sqrt(out/groups * kh * kw) as PyTorch."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: Any = 1,
    ):
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"in_channels {in_channels} and out_channels {out_channels} must be multiples of groups={groups}"
            )
        self.kernel_size = _ntuple(kernel_size, 2)
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.groups, self.dilation = groups, dilation
        # PyTorch computes fan_in from weight.shape[1] * prod(kernel), which for a transposed conv is out/groups
        bound = 1 / math.sqrt(out_channels // groups * prod(self.kernel_size))
        self.weight = _uniform((in_channels, out_channels // groups, *self.kernel_size), bound)
        self.bias = _uniform((out_channels,), bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(
            self.weight, self.bias, self.stride, self.padding, self.output_padding, self.groups, self.dilation
        )

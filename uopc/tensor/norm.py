"""tinygrad's functional layers on Tensor: batchnorm, layernorm, linear, sequential.

x.layernorm()                              # (x - mean) / sqrt(var + eps) over the last axis
x.batchnorm(w, b, mean, invstd)            # per-channel (axis 1) affine normalization with given statistics
x.linear(w, b)                             # x @ w + b, w of shape (in, out) as tinygrad (1-D w: x * w + b)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Self

from uopc.tensor.elementwise import opmath
from uopc.tensor.shape import Axis, norm_axes


class NormMixin:
    """Normalizations and small layers as Tensor methods, tinygrad's names and argument order."""

    @opmath
    def layernorm(self, axis: Axis = -1, eps: float = 1e-5) -> Self:
        """(x - mean) * rsqrt(mean((x - mean)^2) + eps) over `axis`; no affine part."""
        y = self - self.mean(axis, keepdim=True)
        return y * (y.square().mean(axis, keepdim=True) + eps).rsqrt()

    @opmath
    def batchnorm(self, weight: Any, bias: Any, mean: Any, invstd: Any, axis: int | Sequence[int] = 1) -> Self:
        """(x - mean) * weight * invstd + bias, each statistic of the shape of the `axis` dims (weight/bias may be
        None)."""
        axes = norm_axes(axis, self.shape)
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        x = self - mean.reshape(shape)
        if weight is not None:
            x = x * weight.reshape(shape)
        x = x * (invstd.reshape(shape) if invstd.ndim == len(axes) else invstd)
        return x + bias.reshape(shape) if bias is not None else x

    @opmath
    def linear(self, weight: Any, bias: Any = None) -> Self:
        """x @ weight + bias with weight (in, out), as tinygrad; a 1-D weight scales elementwise."""
        x = self * weight if weight.ndim == 1 else self @ weight
        return x + bias if bias is not None else x

    def sequential(self, layers: Sequence[Callable[[Any], Any]]) -> Self:
        """Apply each callable in turn: x.sequential([f, g]) is g(f(x))."""
        return functools.reduce(lambda x, f: f(x), layers, self)

"""Layers: Linear, LayerNorm and Embedding, each a plain object holding requires-grad Tensors.

>>> l1, l2 = Linear(784, 128), Linear(128, 10)
>>> logits = l2(l1(x).relu())
"""

from __future__ import annotations

import math

import numpy as np

from uopc.tensor import Tensor
from uopc.tensor.elementwise import opmath


def _uniform(shape: tuple[int, ...], bound: float) -> Tensor:
    """U(-bound, bound), realized now so that the first training step already sees plain buffers."""
    return Tensor.uniform(*shape, low=-bound, high=bound, requires_grad=True).realize()


class Linear:
    """y = x @ W.T + b with W of shape (out, in), initialized as PyTorch does (uniform, bound 1/sqrt(in))."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        # kaiming_uniform(a=sqrt(5)) works out to a bound of 1/sqrt(fan_in); PyTorch uses the same for the bias
        bound = 1 / math.sqrt(in_features)
        self.weight = _uniform((out_features, in_features), bound)
        self.bias = _uniform((out_features,), bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        # (..., in) is flattened to one (rows, in) matrix: a plain GEMM, which the optimizer tiles best
        y = x.reshape(-1, x.shape[-1]) @ self.weight.T if x.ndim > 2 else x @ self.weight.T
        y = y + self.bias if self.bias is not None else y
        return y.reshape(*x.shape[:-1], y.shape[-1]) if x.ndim > 2 else y


class LayerNorm:
    """Normalize over the last axis to zero mean and unit variance, then scale by `weight` and add `bias`."""

    def __init__(self, dim: int, eps: float = 1e-5):
        self.eps = eps
        self.weight = Tensor(np.ones(dim, np.float32), requires_grad=True)
        self.bias = Tensor(np.zeros(dim, np.float32), requires_grad=True)

    @opmath
    def __call__(self, x: Tensor) -> Tensor:
        xc = x - x.mean(-1, keepdim=True)
        inv = (xc.square().mean(-1, keepdim=True) + self.eps).sqrt().reciprocal()
        return xc * inv * self.weight + self.bias


class Embedding:
    """Rows of a (vocab, dim) table picked by integer ids: a gather (O(tokens x dim), whatever the vocabulary), its
    gradient a scatter-add; an id outside 0..vocab-1 raises IndexError when the lookup is computed."""

    def __init__(self, vocab_size: int, dim: int):
        self.vocab_size, self.dim = vocab_size, dim
        self.weight = Tensor.randn(vocab_size, dim, requires_grad=True)  # N(0, 1), as PyTorch initializes it

    def __call__(self, idx: Tensor) -> Tensor:
        if not isinstance(idx, Tensor):
            idx = Tensor(idx)
        # ids are never negative here (PyTorch's rule): the range check is 0..vocab-1, so wrap is off
        ids = idx.reshape(-1, 1).expand(idx.numel(), self.dim)
        label = f"Embedding({self.vocab_size}, {self.dim})"
        return self.weight._new(self.weight.uop.gather(ids.uop, 0, label)).reshape(*idx.shape, self.dim)


class Dropout:
    """Zero each element with probability p while Tensor.training (scaling the rest by 1/(1-p)); the identity
    otherwise. The mask is drawn in the graph, so a TinyJit replay draws a fresh one every call."""

    def __init__(self, p: float = 0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def __call__(self, x: Tensor) -> Tensor:
        return x.dropout(self.p)

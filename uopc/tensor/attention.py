"""Masking and attention for Tensor: tril/triu, masked_fill, scaled_dot_product_attention.

A causal mask is a comparison of two aranges, so it is a small lazy graph, not a host array per size:

    x.tril()   ->  (col - row <= 0).where(x, 0)
    sdpa(q, k, v, is_causal=True)  ->  softmax((q @ k.T) * scale, masked to -inf above the diagonal) @ v
"""

from __future__ import annotations

import math
from typing import Any, Self

from uopc.tensor.elementwise import opmath
from uopc.tensor.shape import is_int
from uopc.uop.dtype import dtypes


class AttentionMixin:
    """Triangular masks, masked_fill and PyTorch's scaled_dot_product_attention."""

    def _tri_keep(self, diagonal: int, upper: bool) -> Self:
        """A bool (rows, cols) mask: col - row >= diagonal (upper) or <= diagonal (lower)."""
        if self.ndim < 2:
            raise ValueError(f"tril/triu need a tensor with at least 2 dims, got shape {self.shape}")
        if not is_int(diagonal):
            raise TypeError(f"diagonal must be an int, got {type(diagonal).__name__}")
        r, c = self.shape[-2:]
        diff = self.arange(c).reshape(1, c) - self.arange(r).reshape(r, 1)
        return diff >= diagonal if upper else diff <= diagonal

    def tril(self, diagonal: int = 0) -> Self:
        """The lower triangle of the last two dims (elements with col - row <= diagonal); the rest 0."""
        return self._tri_keep(diagonal, upper=False).where(self, self.zeros_like())

    def triu(self, diagonal: int = 0) -> Self:
        """The upper triangle of the last two dims (elements with col - row >= diagonal); the rest 0."""
        return self._tri_keep(diagonal, upper=True).where(self, self.zeros_like())

    def masked_fill(self, mask: Any, value: Any) -> Self:
        """`value` where the bool `mask` (broadcast to self) is True, else self; keeps self's dtype."""
        m = mask if isinstance(mask, AttentionMixin) else type(self)(mask)
        if not m.dtype.is_bool:
            raise TypeError(f"masked_fill only supports boolean masks, got {m.dtype!r}")
        v = value.cast(self.dtype) if isinstance(value, AttentionMixin) else value
        out = m.where(v, self)
        if out.shape != self.shape:
            raise ValueError(f"masked_fill: mask of shape {m.shape} does not broadcast to the tensor's {self.shape}")
        return out.cast(self.dtype)

    @opmath
    def scaled_dot_product_attention(
        self,
        key: Any,
        value: Any,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
    ) -> Self:
        """PyTorch's scaled_dot_product_attention with self as the query (..., L, E), key (..., S, E), value
        (..., S, Ev): softmax(q @ k^T * scale + mask) @ v. A bool mask keeps True entries; a float mask is added.

        Dropout on the attention weights (dropout_p > 0) draws its mask with Tensor.rand, as PyTorch does
        whether or not the model is in training mode."""
        q = self
        k = key if isinstance(key, AttentionMixin) else type(self)(key)
        v = value if isinstance(value, AttentionMixin) else type(self)(value)
        if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
            raise ValueError(f"attention needs (..., L, E) tensors, got {q.shape}, {k.shape}, {v.shape}")
        if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
            raise ValueError(f"attention: query {q.shape}, key {k.shape} and value {v.shape} do not fit")
        if not 0.0 <= dropout_p <= 1.0:
            raise ValueError(f"dropout_p must be in [0, 1], got {dropout_p}")
        if is_causal and attn_mask is not None:
            raise ValueError("attention: give attn_mask or is_causal, not both")
        s = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        scores = (q @ k.transpose(-1, -2)) * s
        if is_causal:
            scores = scores.masked_fill(~scores._tri_keep(0, upper=False), -math.inf)
        elif attn_mask is not None:
            m = attn_mask if isinstance(attn_mask, AttentionMixin) else type(self)(attn_mask)
            scores = scores.masked_fill(m.logical_not(), -math.inf) if m.dtype is dtypes.bool else scores + m
        w = scores.softmax(-1)
        if dropout_p > 0:
            keep = w.rand_like() >= dropout_p
            w = keep.where(w * (1 / (1 - dropout_p)), 0.0) if dropout_p < 1 else w.zeros_like()
        return w @ v

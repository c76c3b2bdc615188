"""Masking and attention for Tensor: tril/triu, masked_fill, scaled_dot_product_attention.

A causal mask is a comparison of two aranges, so it is a small lazy graph, not a host array per size:

    x.tril()   ->  (col - row <= 0).where(x, 0)
    sdpa(q, k, v, is_causal=True)  ->  softmax((q @ k.T) * scale, masked to -inf above the diagonal) @ v
"""

from __future__ import annotations

import math
from typing import Any, Self

from uopc.tensor.autodiff import with_gradient
from uopc.tensor.elementwise import opmath
from uopc.tensor.shape import is_int
from uopc.uop import Ops
from uopc.uop.attention import attention_uop, fused_attention, heads_first
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
        enable_gqa: bool = False,
    ) -> Self:
        """PyTorch's scaled_dot_product_attention with self as the query (..., L, E), key (..., S, E), value
        (..., S, Ev): softmax(q @ k^T * scale + mask) @ v. A bool mask keeps True entries; a float mask is added.
        `enable_gqa`: the key and value may have fewer heads (dim -3) than the query, each shared by a group.

        Without dropout, float32 attention is one fused kernel per direction (uopc.codegen.attention): the scores
        are computed block by block and never stored (a float mask's gradient, when asked for, is (..., L, S) as the
        mask is). Dropout (dropout_p > 0) takes the composite form, its mask drawn with Tensor.rand as PyTorch does
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
        m = None
        if attn_mask is not None:
            m = attn_mask if isinstance(attn_mask, AttentionMixin) else type(self)(attn_mask)
        groups = 1
        if enable_gqa and q.ndim >= 3 and k.ndim >= 3 and k.shape[-3] != q.shape[-3]:
            if k.shape[-3] != v.shape[-3] or q.shape[-3] % k.shape[-3]:
                raise ValueError(f"attention: {q.shape[-3]} query heads cannot be grouped over {k.shape[-3]} key heads")
            groups = q.shape[-3] // k.shape[-3]
        s = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        if dropout_p == 0 and (fused := q._fused_attention(k, v, m, is_causal, s, groups)) is not None:
            return fused
        if groups > 1:  # each key head repeated for its group of query heads
            k, v = (t.unsqueeze(-3).expand(*t.shape[:-2], groups, *t.shape[-2:]) for t in (k, v))
            k, v = (t.reshape(*t.shape[:-4], t.shape[-4] * groups, *t.shape[-2:]) for t in (k, v))
        scores = (q @ k.transpose(-1, -2)) * s
        if is_causal:
            scores = scores.masked_fill(~scores._tri_keep(0, upper=False), -math.inf)
        elif m is not None:
            scores = scores.masked_fill(m.logical_not(), -math.inf) if m.dtype is dtypes.bool else scores + m
        w = scores.softmax(-1)
        if dropout_p > 0:
            keep = w.rand_like() >= dropout_p
            w = keep.where(w * (1 / (1 - dropout_p)), 0.0) if dropout_p < 1 else w.zeros_like()
        return w @ v

    def _fused_attention(self, k: Self, v: Self, m: Self | None, causal: bool, scale: float, groups: int):
        """softmax(q k^T * scale + mask) v as one ATTENTION node (uopc.uop.attention), marked for its own backward,
        or None where the fused kernel does not apply."""
        out = fused_attention(self.uop, k.uop, v.uop, m.uop if m is not None else None, scale, causal, groups)
        if out is None:
            return None
        res = self._new(out, k, v)
        if not type(self).no_grad:  # (inputs whose requires_grad is None may still get gradients)
            inputs = out.src if out.arg.mask == "float" else out.src[:3]  # a float mask is differentiated too
            res = self._new(with_gradient(out, inputs, "attention"), k, v, *([m] if m is not None else []))
        res = res.transpose(-3, -2)  # stored (*batch, L, H, Ev): seen as (*batch, H, L, Ev)
        ndim = max(self.ndim, k.ndim, v.ndim, m.ndim if m is not None else 0)  # 2: the lead dim added is dropped
        return res.reshape(res.shape[res.ndim - ndim :]) if res.ndim > ndim else res

    @classmethod
    def _attention_grad_rule(cls, grad: Any, m: Any) -> tuple[Any, Any, Any]:
        """The gradients of a fused attention (m: CUSTOM_GRAD(out, q, k, v[, float mask])), as UOp graphs of three
        more fused kernels: each row's log-sum-exp of the scores (lse), then dq per query block and dk, dv per key
        block, which recompute the probabilities block by block from it; delta = rowsum(dout * out) is a plain
        reduce. A float mask's gradient, the scores' (*lead, L, S), is a fourth ("ds")."""
        out = m.src[0]  # (*batch, L, H, Ev), as the kernels store it: swap rows and heads back for the sources
        q, k, v = out.src[:3]
        rest = out.src[3:]  # the mask, if any
        n = out.ndim
        lse = attention_uop(q, k, None, out.arg._replace(kind="lse"), *rest)
        delta = (grad * out).reduce(Ops.ADD, 1).permute((*range(n - 3), n - 2, n - 3))  # (*batch, H, L)
        dout = heads_first(grad)  # (the swap is its own inverse)
        dq = heads_first(attention_uop(q, k, v, out.arg._replace(kind="dq"), dout, lse, delta, *rest))
        dkv = heads_first(attention_uop(q, k, v, out.arg._replace(kind="dkv"), dout, lse, delta, *rest))
        e = k.shape[-1]
        keep = tuple((0, d) for d in dkv.shape[:-1])
        grads = (dq, dkv.shrink((*keep, (0, e))), dkv.shrink((*keep, (e, dkv.shape[-1]))))
        if len(m.src) == 5:  # the float mask's gradient is the scores'
            grads += (attention_uop(q, k, v, out.arg._replace(kind="ds"), dout, lse, delta, *rest),)
        return grads

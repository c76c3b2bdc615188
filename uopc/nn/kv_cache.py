"""KVCache: the keys and values of every position a decoder has seen, preallocated and written in place.

    >>> cache = KVCache(batch=1, heads=12, length=256, head_dim=64)
    >>> y = cache.attend(q, k, v)                  # a prompt (T tokens from position 0): causal, fills 0..T-1
    >>> y = cache.attend(q1, k1, v1, pos=Tensor(np.array([T], np.int32)))   # one token at position T

A decode step takes its position as a (1,) int tensor, not as a shape: the step's graph is the same for every
position, so TinyJit replays one plan for the whole generation. Its key and value are written at `pos` by an
elementwise select over the cache (in place under TinyJit), and the query attends to the whole cache with the
positions after `pos` masked out: attention costs the cache's length, not the position, until symbolic shapes. A
position outside the cache raises IndexError when the step runs (a checked gather of it), never a silent no-write.
"""

from __future__ import annotations

import math
from typing import Any

from uopc.tensor import Tensor
from uopc.uop.dtype import dtypes

__all__ = ["KVCache"]


class KVCache:
    """Keys and values (batch, heads, length, head_dim) each, zeros until written."""

    def __init__(self, batch: int, heads: int, length: int, head_dim: int, dtype: Any = dtypes.float32):
        for name, v in (("batch", batch), ("heads", heads), ("length", length), ("head_dim", head_dim)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"KVCache: {name} must be a positive int, got {v!r}")
        self.k = Tensor.zeros(batch, heads, length, head_dim, dtype=dtype).contiguous().realize()
        self.v = Tensor.zeros(batch, heads, length, head_dim, dtype=dtype).contiguous().realize()

    @property
    def length(self) -> int:
        return self.k.shape[2]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, pos: Tensor | None = None, scale: float | None = None) -> Tensor:
        """Causal attention of q (batch, heads, T, head_dim) over the tokens seen so far, with k and v (the same
        shape) written into the cache. Without `pos`: a prompt of T tokens at positions 0..T-1 (T <= length), which
        attend to each other causally and fill the cache's first T positions (the rest become zeros). With `pos` (a
        (1,) int tensor): one token (T = 1) at that position, written there, attending to positions 0..pos."""
        B, H, T, D = q.shape
        if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
            raise ValueError(f"KVCache.attend: q {q.shape}, k {k.shape} and v {v.shape} do not fit together")
        if (B, H, D) != self.k.shape[:2] + self.k.shape[3:] or v.shape[3] != self.v.shape[3]:
            raise ValueError(f"KVCache.attend: q {q.shape} and v {v.shape} do not fit the cache {self.k.shape}")
        scale = 1 / math.sqrt(D) if scale is None else scale
        if pos is None:
            if T > self.length:
                raise ValueError(f"KVCache.attend: a prompt of {T} tokens does not fit a cache of {self.length}")
            rest = ((0, 0), (0, 0), (0, self.length - T), (0, 0))
            self.k.assign(k.cast(self.k.dtype).pad(rest))
            self.v.assign(v.cast(self.v.dtype).pad(rest))
            return q.scaled_dot_product_attention(k, v, is_causal=True, scale=scale)
        if T != 1:
            raise ValueError(f"KVCache.attend: a decode step (pos given) takes one token, got {T}")
        if not isinstance(pos, Tensor) or pos.shape != (1,) or not pos.dtype.is_int:
            raise ValueError(f"KVCache.attend: pos must be a (1,) int tensor, got {pos!r}")
        at = Tensor.arange(self.length)
        pos = at.gather(0, pos).reshape(1, 1, 1, 1)  # a position outside 0..length-1 raises IndexError after the run
        at = at.reshape(1, 1, -1, 1)
        here = at == pos
        self.k.assign(here.where(k.cast(self.k.dtype), self.k))  # elementwise: in place under TinyJit
        self.v.assign(here.where(v.cast(self.v.dtype), self.v))
        seen = (at <= pos).reshape(1, 1, 1, -1)
        return q.scaled_dot_product_attention(self.k.cast(q.dtype), self.v.cast(q.dtype), attn_mask=seen, scale=scale)

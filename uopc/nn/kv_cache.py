"""KVCache: the keys and values of every position a decoder has seen, preallocated and written in place.

    >>> cache = KVCache(batch=1, heads=12, length=256, head_dim=64)
    >>> y = cache.attend(q, k, v)                  # a prompt (T tokens from position 0): causal, fills 0..T-1
    >>> y = cache.attend(q1, k1, v1, pos=cache.at(T))      # one token at position T, over positions 0..T
    >>> y = cache.attend(q1, k1, v1, pos=Tensor(np.array([T], np.int32)))   # the same, over the whole cache, masked

A decode step's position is not a shape of its graph, so TinyJit replays one plan for the whole generation. It is
either a bound Variable (`cache.at(T)`: the number of positions seen, T + 1, bound to the cache's `seen` Variable,
uopc.uop.variable) or a (1,) int tensor. With the Variable the query attends to the first T + 1 positions of the
cache, a symbolic view: the work grows with the position. With the tensor it attends to the whole cache with the
positions after T masked out, and a position outside the cache raises IndexError when the step runs (a checked
gather of it). Either way the key and value are written at T by an elementwise select over the cache (in place under
TinyJit).
"""

from __future__ import annotations

import math
from typing import Any

from uopc.tensor import Tensor
from uopc.uop.dtype import dtypes
from uopc.uop.variable import Bound, Variable

__all__ = ["KVCache"]


class KVCache:
    """Keys and values (batch, heads, length, head_dim) each, zeros until written. `dtype` is what they are stored
    as: float32, or bfloat16 (or float16) to read half the bytes per step; then every query, the prompt's too,
    attends to the keys and values rounded to it, computing in float32 (the fused attention kernel widens them as it
    loads them)."""

    def __init__(self, batch: int, heads: int, length: int, head_dim: int, dtype: Any = dtypes.float32):
        for name, v in (("batch", batch), ("heads", heads), ("length", length), ("head_dim", head_dim)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"KVCache: {name} must be a positive int, got {v!r}")
        self.k = Tensor.zeros(batch, heads, length, head_dim, dtype=dtype).contiguous().realize()
        self.v = Tensor.zeros(batch, heads, length, head_dim, dtype=dtype).contiguous().realize()
        # the positions a decode step attends to, itself included (one Variable for every cache of this length)
        self.seen = Variable("kv_seen", 1, length)

    @property
    def length(self) -> int:
        return self.k.shape[2]

    def at(self, pos: int) -> Bound:
        """The decode step at position `pos` (0..length-1), as attend's `pos`: `seen` bound to pos + 1."""
        if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos < self.length:
            raise ValueError(f"KVCache.at: position {pos!r} is outside the cache's 0..{self.length - 1}")
        return self.seen.bind(pos + 1)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, pos: Tensor | Bound | None = None, scale: float | None = None
    ) -> Tensor:
        """Causal attention of q (batch, heads, T, head_dim) over the tokens seen so far, with k and v (the same
        shape) written into the cache. Without `pos`: a prompt of T tokens at positions 0..T-1 (T <= length), which
        attend to each other causally and fill the cache's first T positions (the rest become zeros). With `pos`
        (`at(p)`, or p as a (1,) int tensor): one token (T = 1) at position p, written there, attending to 0..p."""
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
            k, v = k.cast(self.k.dtype), v.cast(self.v.dtype)
            self.k.assign(k.pad(rest))
            self.v.assign(v.pad(rest))
            # the prompt attends to its keys and values as stored, as every later token will
            return q.scaled_dot_product_attention(k.cast(q.dtype), v.cast(q.dtype), is_causal=True, scale=scale)
        if T != 1:
            raise ValueError(f"KVCache.attend: a decode step (pos given) takes one token, got {T}")
        if isinstance(pos, Bound):
            if pos.var != self.seen:
                raise ValueError(f"KVCache.attend: pos must come from this cache's at(), got {pos!r}")
            if any(c._vars.get(self.seen, pos.value) != pos.value for c in (self.k, self.v)):
                Tensor.realize_all(self.k, self.v)  # the last step's write, still lazy, is bound to its own value
            seen = Tensor(pos)  # its value, for the write
            here = Tensor.arange(self.length).reshape(1, 1, -1, 1) == seen - 1
            self.k.assign(here.where(k.cast(self.k.dtype), self.k))
            self.v.assign(here.where(v.cast(self.v.dtype), self.v))
            keys, values = self.k[:, :, :pos], self.v[:, :, :pos]  # (B, H, seen, D): a symbolic view
            return q.scaled_dot_product_attention(keys.cast(q.dtype), values.cast(q.dtype), scale=scale)
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

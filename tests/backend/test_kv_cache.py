"""uopc.nn.KVCache against PyTorch's scaled_dot_product_attention over the whole prefix (float32, atol 1e-5): a prompt
fills the cache, then one TinyJit-replayed plan per token writes it in place at a position given as a tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from uopc import Tensor, TinyJit, dtypes
from uopc.nn import KVCache
from uopc.runtime.buffer import buffer_ptr
from uopc.uop import base_buffer

B, H, L, D = 2, 3, 16, 8


def _qkv(T: int, seed: int) -> list[np.ndarray]:
    g = np.random.default_rng(seed)
    return [g.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(3)]


def _torch_causal(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """The last rows of causal attention of the queries q over keys k (q's rows are the last of k's)."""
    tq, tk = q.shape[2], k.shape[2]
    keep = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
    out = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), attn_mask=keep, scale=scale)
    return out.numpy()


@pytest.mark.parametrize("prompt", [1, 5])
def test_prompt_then_decode_steps_match_attention_over_the_prefix(prompt):
    cache = KVCache(B, H, L, D)
    scale = 0.3
    qs, ks, vs = _qkv(L, seed=prompt)
    got = cache.attend(*(Tensor(a[:, :, :prompt]) for a in (qs, ks, vs)), scale=scale).numpy()
    want = _torch_causal(qs[:, :, :prompt], ks[:, :, :prompt], vs[:, :, :prompt], scale)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)

    def step(q: Tensor, k: Tensor, v: Tensor, pos: Tensor) -> Tensor:
        y = cache.attend(q, k, v, pos, scale=scale)
        Tensor.realize_all(y, cache.k, cache.v)  # the writes with the output, in one plan
        return y

    jit = TinyJit(step)
    ptrs = set()
    for p in range(prompt, L):
        one = [Tensor(a[:, :, p : p + 1]) for a in (qs, ks, vs)]
        got = jit(*one, Tensor(np.array([p], np.int32))).numpy()
        want = _torch_causal(qs[:, :, p : p + 1], ks[:, :, : p + 1], vs[:, :, : p + 1], scale)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
        ptrs.add(buffer_ptr(base_buffer(cache.k.uop)))
    np.testing.assert_array_equal(cache.k.numpy(), ks)  # every position written once, in order
    assert len(ptrs) <= 3  # the replays (from the third step) write the cache in place


def test_a_position_outside_the_cache_raises_after_the_step():
    cache = KVCache(B, H, L, D)
    one = [Tensor(a) for a in _qkv(1, seed=0)]
    with pytest.raises(IndexError):
        cache.attend(*one, Tensor(np.array([L], np.int32))).realize()


def test_bad_arguments_raise_before_anything_runs():
    with pytest.raises(ValueError, match="length must be a positive int"):
        KVCache(1, 2, 0, 4)
    cache = KVCache(B, H, L, D)
    q, k, v = (Tensor(a) for a in _qkv(2, seed=0))
    with pytest.raises(ValueError, match="do not fit the cache"):
        cache.attend(q[:1], k[:1], v[:1])
    with pytest.raises(ValueError, match="takes one token"):
        cache.attend(q, k, v, Tensor(np.array([3], np.int32)))
    with pytest.raises(ValueError, match=r"pos must be a \(1,\) int tensor"):
        cache.attend(q[:, :, :1], k[:, :, :1], v[:, :, :1], 3)
    with pytest.raises(ValueError, match="does not fit a cache of 16"):
        big = [Tensor(a) for a in _qkv(L + 1, seed=0)]
        cache.attend(*big)


def _decode_plan_kernels(dtype, D: int, qkv: list[np.ndarray], prompt: int) -> tuple[list[np.ndarray], list[str]]:
    """Decode steps through a KVCache of `dtype` at symbolic positions (cache.at): the outputs, and the kernels of
    the replayed plan."""
    cache = KVCache(B, H, L, D, dtype)
    qs, ks, vs = qkv
    cache.attend(*(Tensor(a[:, :, :prompt]) for a in (qs, ks, vs)), scale=0.3).realize()
    jit = TinyJit(lambda q, k, v, pos: cache.attend(q, k, v, pos, scale=0.3).realize())
    outs = []
    for p in range(prompt, L):
        outs.append(jit(*(Tensor(a[:, :, p : p + 1]) for a in (qs, ks, vs)), cache.at(p)).numpy())
    return outs, [k.name for c in jit._calls for k in c.cp.plan.kernels]


@pytest.mark.parametrize("wide", [False, True])
def test_a_bfloat16_cache_is_read_by_the_fused_kernel_as_stored(wide):
    """A bfloat16 cache: every step attends to the keys and values rounded to bfloat16 (torch on the rounded values,
    atol 1e-5), and the fused attention kernel loads them and widens them itself: the decode plan has the float32
    cache's kernels, no conversion of the cache. Head sizes: 8 (keys packed into blocks) and two vectors of the
    target's width (the decode step's direct loads)."""
    from uopc.runtime import compiler

    D = 2 * compiler.machine().vector_bytes // 4 if wide else 8
    g = np.random.default_rng(4)
    qkv = [g.standard_normal((B, H, L, D)).astype(np.float32) for _ in range(3)]
    qs, ks, vs = qkv
    rounded = [torch.from_numpy(a).to(torch.bfloat16).float().numpy() for a in (ks, vs)]
    got, names = _decode_plan_kernels(dtypes.bfloat16, D, qkv, prompt=3)
    for p, y in zip(range(3, L), got, strict=True):
        want = _torch_causal(qs[:, :, p : p + 1], rounded[0][:, :, : p + 1], rounded[1][:, :, : p + 1], 0.3)
        np.testing.assert_allclose(y, want, atol=1e-5, rtol=1e-5)
    _, names32 = _decode_plan_kernels(dtypes.float32, D, qkv, prompt=3)
    assert names == names32 and sum(n.startswith("fa_") for n in names) == 1

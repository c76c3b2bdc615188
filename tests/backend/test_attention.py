"""Fused attention (uopc.codegen.attention, uopc.renderer.attention) against PyTorch's scaled_dot_product_attention:
outputs and the gradients of q, k and v, causal or not, with bool and float masks, grouped-query heads, head sizes
16-128 and lengths that are not multiples of the kernel's blocks (up to ROWS_MAX query rows, BN keys). float32;
tolerance atol 2e-5 * max|reference| + rtol 1e-4. The suite's second pass runs this file at OPT=0 under
UOPC_CHECK_OOB=1, the x86-64-v3 pass with 8-float vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from uopc import Tensor, TinyJit
from uopc.codegen.attention import ROWS_MAX
from uopc.engine.lower import make_plan
from uopc.engine.realize import default_opt
from uopc.nn import KVCache
from uopc.renderer.attention import BN


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(got, want, atol=2e-5 * max(1.0, float(np.abs(want).max())), rtol=1e-4, err_msg=what)


def _kernels(*ts: Tensor) -> list[str]:
    plan, _ = make_plan([t.uop for t in ts], opt=default_opt())
    return [k.name for k in plan.kernels]


CASES = [
    # (batch, heads, L, S, E, Ev, causal, mask, groups)
    (1, 2, 16, 16, 16, 16, False, None, 1),
    (2, 3, ROWS_MAX + 5, BN + 3, 32, 16, False, None, 1),  # neither length a multiple of a block
    (1, 2, 2 * BN + 1, 2 * BN + 1, 64, 64, True, None, 1),  # causal, a partial last key block
    (1, 2, 20, 2 * BN + 7, 128, 128, True, None, 1),  # L < S, causal aligned to the start (PyTorch's is_causal)
    (2, 2, 37, 70, 24, 40, False, "bool", 1),  # heads not a multiple of a vector
    (2, 4, 33, 65, 16, 16, False, "float", 2),  # grouped-query: 2 query heads per key head
    (1, 6, 9, 9, 32, 32, True, None, 3),
    (1, 2, 1, 50, 64, 64, False, None, 1),  # one query (a decode step) over 50 keys: keys and values read in place
    (2, 2, 2, 2 * BN + 5, 32, 32, True, None, 1),  # two queries, causal: row 1 sees one key more than row 0
    (1, 3, 1, 70, 16, 32, False, "bool", 1),
    (1, 4, 2, 40, 32, 16, False, "float", 2),
]


@pytest.mark.parametrize("B,H,L,S,E,Ev,causal,mask,groups", CASES)
def test_fused_attention_matches_torch_forward_and_backward(B, H, L, S, E, Ev, causal, mask, groups):
    g = torch.Generator().manual_seed(L * 131 + S)
    q = torch.randn(B, H, L, E, generator=g, requires_grad=True)
    k = torch.randn(B, H // groups, S, E, generator=g, requires_grad=True)
    v = torch.randn(B, H // groups, S, Ev, generator=g, requires_grad=True)
    tm = None
    if mask == "bool":
        tm = torch.rand(B, 1, L, S, generator=g) > 0.3
        tm[..., 0] = True  # every row keeps a key (a row with none is NaN on both sides)
    elif mask == "float":  # a float mask gets its gradient too (the scores', summed over the broadcast batch)
        tm = torch.randn(1, H, L, S, generator=g, requires_grad=True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=tm, is_causal=causal, enable_gqa=groups > 1)
    dout = torch.randn(ref.shape, generator=g)
    ref.backward(dout)
    Q, K, V = (Tensor(t.detach().numpy(), requires_grad=True) for t in (q, k, v))
    M = Tensor(tm.detach().numpy(), requires_grad=mask == "float") if tm is not None else None
    out = Q.scaled_dot_product_attention(K, V, attn_mask=M, is_causal=causal, enable_gqa=groups > 1)
    assert any(n.startswith("fa_") for n in _kernels(out))
    (out * Tensor(dout.numpy())).sum().backward()
    _close(out.numpy(), ref.detach().numpy(), "out")
    for name, ours, theirs in (("dq", Q, q), ("dk", K, k), ("dv", V, v), ("dmask", M, tm))[: 3 + (mask == "float")]:
        _close(ours.grad.numpy(), theirs.grad.numpy(), name)


def test_the_backward_is_fused_kernels_too():
    """The gradient of q, k and v: the row statistic, dq and dk|dv kernels (plus delta's row sum), no (L, S) temp."""
    T, Hd = 96, 16
    Q, K, V = (Tensor(np.random.default_rng(i).standard_normal((1, 2, T, Hd)).astype(np.float32), requires_grad=True)
               for i in range(3))  # fmt: skip
    Q.scaled_dot_product_attention(K, V, is_causal=True).sum().backward()
    names = _kernels(Q.grad, K.grad, V.grad)
    assert sum(n.startswith("fa_") for n in names) == 4, names  # forward (for delta), lse, dq, dkv
    plan, _ = make_plan([t.uop for t in (Q.grad, K.grad, V.grad)], opt=default_opt())
    assert max(t.size for t in plan.temps) < T * T, [t.size for t in plan.temps]


@pytest.mark.parametrize("T", [256, 512])
def test_long_sequences_keep_temporaries_linear_in_length(T):
    """For T >= 256 the plan's temps are O(T * head size) (the output in its stored layout), never the (heads, T, T)
    scores."""
    heads, hd = 4, 32
    q, k, v = (Tensor(np.random.default_rng(i).standard_normal((1, heads, T, hd)).astype(np.float32))
               for i in range(3))  # fmt: skip
    out = q.scaled_dot_product_attention(k, v, is_causal=True)
    plan, _ = make_plan([out.uop], opt=default_opt())
    assert plan.arena_bytes <= heads * T * hd * 4 < heads * T * T * 4, plan.arena_bytes
    want = F.scaled_dot_product_attention(*(torch.from_numpy(t.numpy()) for t in (q, k, v)), is_causal=True)
    _close(out.numpy(), want.numpy(), "out")


def test_a_decode_step_over_a_symbolic_prefix_is_one_fused_plan():
    """KVCache.at(p): one query against the first p + 1 keys (a bound Variable), one plan for every position."""
    cache = KVCache(1, 2, 64, 16)
    rng = np.random.default_rng(0)
    ks, vs = rng.standard_normal((2, 1, 2, 64, 16)).astype(np.float32)
    cache.k.assign(Tensor(ks)).realize()
    cache.v.assign(Tensor(vs)).realize()

    def step(q: Tensor, k: Tensor, v: Tensor, pos) -> Tensor:
        y = cache.attend(q, k, v, pos=pos)
        Tensor.realize_all(y, cache.k, cache.v)
        return y

    jit = TinyJit(step)
    for p in (3, 10, 40, 63):
        q = rng.standard_normal((1, 2, 1, 16)).astype(np.float32)
        got = jit(Tensor(q), Tensor(ks[:, :, p : p + 1]), Tensor(vs[:, :, p : p + 1]), cache.at(p)).numpy()
        tq, tk, tv = (torch.from_numpy(a) for a in (q, ks[:, :, : p + 1], vs[:, :, : p + 1]))
        _close(got, F.scaled_dot_product_attention(tq, tk, tv).numpy(), f"position {p}")
    names = [k.name for c in jit._calls for k in c.cp.kernels]
    assert any(n.startswith("fa_") for n in names), names


def test_outputs_keep_rows_before_heads_so_merging_heads_is_a_view():
    """The kernel stores (B, L, H, Ev): out.transpose(1, 2).reshape(B, L, H * Ev), a model's head merge, copies
    nothing."""
    q, k, v = (Tensor(np.random.default_rng(i).standard_normal((2, 3, 10, 8)).astype(np.float32)) for i in range(3))
    merged = q.scaled_dot_product_attention(k, v).transpose(1, 2).reshape(2, 10, 24)
    assert _kernels(merged) == ["fa_2_10_3_8"]
    want = F.scaled_dot_product_attention(*(torch.from_numpy(t.numpy()) for t in (q, k, v)))
    _close(merged.numpy(), want.transpose(1, 2).reshape(2, 10, 24).numpy(), "merged")


def test_sources_that_are_not_views_of_buffers_are_staged_first():
    """q computed elementwise, k a padded view, v broadcast over the batch: each read correctly."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 2, 12, 8)).astype(np.float32)
    kb = rng.standard_normal((2, 2, 10, 8)).astype(np.float32)
    vb = rng.standard_normal((1, 2, 12, 8)).astype(np.float32)
    q = Tensor(a) * 2 + 1
    k = Tensor(kb).pad(((0, 0), (0, 0), (1, 1), (0, 0)))
    v = Tensor(vb).expand(2, 2, 12, 8)
    got = q.scaled_dot_product_attention(k, v).numpy()
    tk = F.pad(torch.from_numpy(kb), (0, 0, 1, 1))
    want = F.scaled_dot_product_attention(torch.from_numpy(a) * 2 + 1, tk, torch.from_numpy(vb).expand(2, 2, 12, 8))
    _close(got, want.numpy(), "out")


def test_grouped_query_heads_must_divide():
    q = Tensor(np.zeros((1, 6, 4, 8), np.float32))
    k = Tensor(np.zeros((1, 4, 4, 8), np.float32))
    with pytest.raises(ValueError, match="grouped"):
        q.scaled_dot_product_attention(k, k, enable_gqa=True)


def _hand_written(q: Tensor, k: Tensor, v: Tensor, form: str, mask: np.ndarray | None) -> Tensor:
    s = q @ k.transpose(-1, -2)
    s = s / np.sqrt(q.shape[-1]) if form != "scaled_q" else s
    if form == "masked_fill":
        s = s.masked_fill(Tensor(mask).logical_not(), -np.inf)
    elif form == "where":
        s = Tensor(mask).where(s, -np.inf)
    elif form == "float":
        s = s + Tensor(mask)
    return s.softmax(-1) @ v


@pytest.mark.parametrize("form", ["plain", "masked_fill", "where", "float", "scaled_q"])
def test_attention_written_out_is_fused_by_the_scheduler(form):
    """softmax(q @ k^T / sqrt(d) [masked]) @ v as a user or an exporter writes it: one fa_ kernel, with an optimizer."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 19, 16)).astype(np.float32) for _ in range(3))
    mask = np.tril(np.ones((19, 19), bool)) if form in ("masked_fill", "where") else None
    if form == "float":
        mask = rng.standard_normal((2, 1, 19, 19)).astype(np.float32)
    tq = torch.from_numpy(q)
    Q = Tensor(q) * (1 / np.sqrt(16)) if form == "scaled_q" else Tensor(q)
    got = _hand_written(Q, Tensor(k), Tensor(v), form, mask)
    names = _kernels(got)
    assert (sum(n.startswith("fa_") for n in names) == 1) == (default_opt() is not None), names
    assert not any(n.startswith("r_") for n in names) or default_opt() is None, names  # no softmax, no matmul left
    tm = torch.from_numpy(mask) if mask is not None else None
    want = F.scaled_dot_product_attention(tq, torch.from_numpy(k), torch.from_numpy(v), attn_mask=tm)
    _close(got.numpy(), want.numpy(), form)


def test_probabilities_read_elsewhere_keep_the_written_form():
    """When the softmax is also an output (or a backward reads it), nothing is fused: the graph runs as written."""
    rng = np.random.default_rng(2)
    q, k, v = (Tensor(rng.standard_normal((1, 2, 8, 8)).astype(np.float32)) for _ in range(3))
    w = (q @ k.transpose(-1, -2)).softmax(-1)
    plan, _ = make_plan([(w @ v).uop, w.uop], opt=default_opt())
    assert not any(kk.name.startswith("fa_") for kk in plan.kernels)

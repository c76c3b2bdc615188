"""GPT-2 from Hugging Face checkpoints (uopc.models.gpt2) against transformers on the same weights.

A small random GPT-2 (2 layers, 64 wide, 4 heads, vocabulary 1000, context 64) is built with transformers, saved with
save_pretrained and loaded by uopc. Tolerances: float32 logits within atol 1e-4 + rtol 1e-4 of transformers' (the
weights are initialized with std 0.4 rather than GPT-2's 0.02, so logits reach ~10 and greedy decoding does not just
repeat one token; the smallest top-2 gap along the compared sequences is ~1e-2, far above the error). The error tests
use a checkpoint written by uopc's own safe_save and need no transformers.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from uopc import Tensor, dtypes
from uopc.engine import realize
from uopc.models import GPT2, GPT2Config, load_tokenizer
from uopc.models.gpt2 import weight_shapes
from uopc.models.sampling import pick, probabilities
from uopc.nn import get_state_dict, safe_save
from uopc.runtime import compiler

try:  # the tests that use it need transformers too, and skip through pytest.importorskip("transformers")
    import torch
except ImportError:
    torch = None

HF_CONFIG = dict(n_layer=2, n_head=4, n_embd=64, vocab_size=1000, n_positions=64)
ATOL = RTOL = 1e-4


def _ids(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, HF_CONFIG["vocab_size"], shape)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """(transformers model in eval mode, the directory save_pretrained wrote it to)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(**HF_CONFIG, initializer_range=0.4, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    d = str(tmp_path_factory.mktemp("gpt2"))
    model.save_pretrained(d, safe_serialization=True)
    return model, d


def _hf_logits(model, ids: np.ndarray, **kw) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids), **kw).logits.numpy()


def _hf_greedy(model, ids: np.ndarray, n: int) -> np.ndarray:
    x = torch.from_numpy(ids)
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out.numpy()


# --------------------------------------------------------------------------------------------------- transformers


def test_prefill_logits_match_transformers(hf):
    model, d = hf
    m = GPT2.from_pretrained(d)
    assert set(get_state_dict(m)) == {k.removeprefix("transformer.") for k in model.state_dict()} - {"lm_head.weight"}
    ids = _ids((2, 16))
    got = m(ids)
    assert isinstance(got, Tensor) and got.shape == (2, 16, HF_CONFIG["vocab_size"])
    np.testing.assert_allclose(got.numpy(), _hf_logits(model, ids), atol=ATOL, rtol=RTOL)
    # a Tensor of ids, and positions starting at an offset (what a KV cache will feed): transformers' position_ids
    pos = torch.arange(5, 21).expand(2, 16)
    got = m(Tensor(ids.astype(np.int32)), start_pos=5).numpy()
    np.testing.assert_allclose(got, _hf_logits(model, ids, position_ids=pos), atol=ATOL, rtol=RTOL)


def test_greedy_matches_transformers_generate(hf):
    model, d = hf
    m = GPT2.from_pretrained(d)
    ids = _ids((2, 8), seed=1)
    want = _hf_greedy(model, ids, 20)
    got = m.generate(ids, 20)
    assert got.shape == (2, 28) and got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    assert all(len(set(row[8:])) > 5 for row in got)  # the weights' scale makes real decoding, not one repeated token
    # the logits behind every decode step: the whole generated sequence at once
    np.testing.assert_allclose(m(got).numpy(), _hf_logits(model, got), atol=ATOL, rtol=RTOL)
    # one plan serves every step: a second run of the same shapes compiles nothing and adds no plan
    plans, compiles = len(realize._plans), compiler.stats["compiles"]
    np.testing.assert_array_equal(m.generate(Tensor(ids.astype(np.int32)), 20), want)
    assert (len(realize._plans), compiler.stats["compiles"]) == (plans, compiles)


def test_no_plan_and_no_compile_after_the_second_token_over_200_tokens(tmp_path, monkeypatch):
    """The prompt is one plan, the first decode step runs eagerly and the second is captured: from the third token
    on every step replays, whatever the position (the KV cache's position is a tensor, not a shape)."""
    import uopc.models.gpt2 as gpt2

    m = GPT2.from_pretrained(_write_checkpoint(tmp_path / "m", {"n_positions": 256}))
    seen = []
    real_pick = gpt2.pick

    def pick_and_count(*a, **kw):
        seen.append((frozenset(realize._plans), compiler.stats["compiles"]))
        return real_pick(*a, **kw)

    monkeypatch.setattr(gpt2, "pick", pick_and_count)
    out = m.generate(_ids((1, 4)), 200)
    assert out.shape == (1, 204) and len(seen) == 200
    assert len({s[1] for s in seen[2:]}) == 1, "a compile after the second generated token"
    assert len({s[0] for s in seen[2:]}) == 1, "a new plan after the second generated token"
    # each token is the argmax of the forward over the whole sequence (within the float32 error: near-ties may go
    # either way on another ISA's sums): the cache holds what the forward computes
    logits = m(out[:, :-1]).numpy()[0, 3:]
    chosen = np.take_along_axis(logits, out[0, 4:, None], 1)[:, 0]
    np.testing.assert_allclose(chosen, logits.max(-1), atol=1e-5, rtol=0)


def _bf16_rounded(model, kv: bool = False):
    """A copy of the transformers model whose 2-D weights are rounded to bfloat16 (computing in float32); with `kv`,
    every layer's keys and values are rounded too (c_attn's output past the queries), as a bfloat16 KV cache
    stores them."""
    import copy

    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    if kv:
        E = m.config.n_embd

        def round_kv(module, args, out):
            return torch.cat([out[..., :E], out[..., E:].to(torch.bfloat16).to(torch.float32)], -1)

        for block in m.transformer.h:
            block.attn.c_attn.register_forward_hook(round_kv)
    return m


def test_bfloat16_weights_match_the_rounded_model(hf):
    """bfloat16 weights, float32 activations: the logits are transformers' float32 model's on the same weights
    rounded to bfloat16 (within 1e-4, as in float32), and off the unrounded model's by what that rounding gives
    (2^-9 relative per weight; with this test's large weights, std 0.4, 6.6% of the logits' range, asserted below
    10%: the difference between the two transformers models, not anything uopc adds)."""
    model, d = hf
    m = GPT2.from_pretrained(d, dtype=dtypes.bfloat16)
    assert m.h[0].attn.c_attn.weight.dtype is dtypes.bfloat16 and m.wte.weight.dtype is dtypes.bfloat16
    assert m.h[0].attn.c_attn.bias.dtype is dtypes.float32 and m.ln_f.weight.dtype is dtypes.float32
    ids = _ids((2, 12), seed=3)
    got = m(ids).numpy()
    np.testing.assert_allclose(got, _hf_logits(_bf16_rounded(model), ids), atol=ATOL, rtol=RTOL)
    full = _hf_logits(model, ids)
    assert np.abs(got - full).max() < 0.1 * np.abs(full).max()
    # decoding through a bfloat16 KV cache (the default with bf16 weights): the greedy tokens of the rounded model
    # whose keys and values are rounded too; with a float32 cache, those of the model with rounded weights only
    assert m.kv_dtype is dtypes.bfloat16
    np.testing.assert_array_equal(m.generate(ids[:, :8], 12), _hf_greedy(_bf16_rounded(model, kv=True), ids[:, :8], 12))
    m32 = GPT2.from_pretrained(d, dtype=dtypes.bfloat16, kv_dtype=dtypes.float32)
    np.testing.assert_array_equal(m32.generate(ids[:, :8], 12), _hf_greedy(_bf16_rounded(model), ids[:, :8], 12))


def test_bfloat16_kv_cache_logits_match_the_rounded_model(hf):
    """A bfloat16 KV cache: the prompt and every decode step attend to keys and values rounded to bfloat16, so the
    logits of each step are transformers' on rounded weights with c_attn's keys and values rounded (within the float32
    tolerance but for roundings that fall the other way), and differ from the float32 cache's by the rounding."""
    model, d = hf
    m = GPT2.from_pretrained(d, dtype=dtypes.bfloat16)
    ref = _bf16_rounded(model, kv=True)
    ids = _ids((2, 10), seed=5)
    from uopc.nn.kv_cache import KVCache

    caches = [KVCache(2, 4, 16, 16, dtypes.bfloat16) for _ in m.h]
    got = [m.trunk(Tensor(ids[:, :6].astype(np.int32)), caches=caches).realize()]
    for t in range(6, 10):
        got.append(m.trunk(Tensor(ids[:, t : t + 1].astype(np.int32)), caches=caches, pos=caches[0].at(t)).realize())
    got = np.concatenate([m.head(x).numpy() for x in got], 1)
    want = _hf_logits(ref, ids)
    # a key or value within float32 error of a bfloat16 rounding boundary may round the other way here than in
    # torch (one bfloat16 step, 2^-8 relative), which moves the logits after it by ~1e-4 of their range: most
    # logits are within the float32 tolerance, all within 1e-3 of the range, and the float32 cache's are ~100x
    # further off (the rounding of k and v itself)
    diff, scale = np.abs(got - want), np.abs(want).max()
    assert (diff <= ATOL + RTOL * np.abs(want)).mean() > 0.9
    assert diff.max() < 1e-3 * scale
    assert np.abs(got - _hf_logits(_bf16_rounded(model), ids)).max() > 20 * diff.max()


def test_untied_head_and_sharded_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(**HF_CONFIG, initializer_range=0.4, tie_word_embeddings=False)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    assert not torch.equal(model.lm_head.weight, model.transformer.wte.weight)
    d = str(tmp_path)
    model.save_pretrained(d, safe_serialization=True, max_shard_size="100KB")
    assert os.path.exists(os.path.join(d, "model.safetensors.index.json"))
    ids = _ids((2, 16), seed=2)
    np.testing.assert_allclose(GPT2.from_pretrained(d)(ids).numpy(), _hf_logits(model, ids), atol=ATOL, rtol=RTOL)


def test_sampling_filters_match_transformers():
    transformers = pytest.importorskip("transformers")
    logits = np.random.default_rng(3).standard_normal((4, 50)).astype(np.float32) * 3
    logits[0, :5] = logits[0, 5]  # ties at the k-th largest stay
    for t, k, p in [(0.7, None, None), (1.0, 5, None), (1.3, None, 0.6), (0.8, 10, 0.9), (1.0, 50, 1.0)]:
        z = transformers.TemperatureLogitsWarper(t)(None, torch.from_numpy(logits.astype(np.float64)))
        z = transformers.TopKLogitsWarper(k)(None, z) if k is not None else z
        z = transformers.TopPLogitsWarper(p)(None, z) if p is not None else z
        want = torch.softmax(z, -1).numpy()
        got = probabilities(logits, t, k, p)
        np.testing.assert_allclose(got / got.sum(-1, keepdims=True), want, atol=1e-12, err_msg=f"{t=} {k=} {p=}")


def test_pick_draws_in_proportion():
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4]]))
    u = np.array([0.0, 0.09, 0.11, 0.29, 0.31, 0.59, 0.61, 0.999])
    got = [int(pick(logits, u[i : i + 1], 1.0)[0]) for i in range(len(u))]
    assert got == [0, 0, 1, 1, 2, 2, 3, 3]
    assert pick(logits, np.array([0.99]), 1.0, top_k=2)[0] == 3 and pick(logits, np.array([0.0]), 1.0, top_k=2)[0] == 2
    assert pick(np.array([[1.0, 3.0, 3.0]]))[0] == 1  # greedy: the first of tied maxima, as torch.argmax


def test_sampling_reproduces_with_a_seed(hf):
    _, d = hf
    m = GPT2.from_pretrained(d)
    ids = _ids((2, 8), seed=1)
    kw = dict(temperature=1.0, top_k=50, top_p=0.9)
    a, b = m.generate(ids, 20, seed=7, **kw), m.generate(ids, 20, seed=7, **kw)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, m.generate(ids, 20, seed=8, **kw))
    assert not np.array_equal(a[0, 8:], a[1, 8:])  # rows draw their own numbers
    # top_k=1 leaves one token: sampling is greedy then
    np.testing.assert_array_equal(m.generate(ids, 20, temperature=1.0, top_k=1, seed=0), m.generate(ids, 20))


def test_stop_tokens_fill_the_stopped_row(hf):
    _, d = hf
    m = GPT2.from_pretrained(d)
    ids = _ids((2, 8), seed=1)
    greedy = m.generate(ids, 20)
    # a token row 0 produces at its 4th new position and row 1 never produces
    stop = next(int(t) for t in greedy[0, 11:] if t not in greedy[1, 8:] and t not in greedy[0, 8:11])
    at = 8 + list(greedy[0, 8:]).index(stop)
    got = m.generate(ids, 20, stop_tokens=[stop])
    np.testing.assert_array_equal(got[0, : at + 1], greedy[0, : at + 1])
    assert (got[0, at:] == stop).all()
    np.testing.assert_array_equal(got[1], greedy[1])
    # every row stopped: generation ends early, the rows filled with their own stop token
    both = (int(greedy[0, 9]), int(greedy[1, 9]))
    got = m.generate(ids, 20, stop_tokens=both)
    assert got.shape == (2, 28) and (got[:, 9:] == np.array(both)[:, None]).all()


class _Recorder:
    """A streamer (transformers' BaseStreamer protocol) that keeps what it is given."""

    def __init__(self):
        self.got, self.ended = [], 0

    def put(self, ids):
        assert self.ended == 0, "put after end"
        self.got.append(np.array(ids))

    def end(self):
        self.ended += 1


def test_streamer_gets_the_prompt_then_each_token(hf):
    _, d = hf
    m = GPT2.from_pretrained(d)
    ids = _ids((2, 8), seed=3)
    rec = _Recorder()
    out = m.generate(ids, 6, streamer=rec)
    assert rec.ended == 1 and len(rec.got) == 7
    np.testing.assert_array_equal(rec.got[0], ids)
    np.testing.assert_array_equal(np.stack(rec.got[1:], axis=1), out[:, 8:])
    # a stop: the tokens chosen until every row stopped, not the fill after it
    rec = _Recorder()
    both = m.generate(ids, 6, stop_tokens=(int(out[0, 9]), int(out[1, 9])), streamer=rec)
    assert rec.ended == 1 and len(rec.got) == 3
    np.testing.assert_array_equal(np.stack(rec.got[1:], axis=1), both[:, 8:10])
    # transformers' own TextStreamer takes uopc's arrays (batch 1), decoding with any tokenizer-like object
    transformers = pytest.importorskip("transformers")
    text = []

    class Tok:
        def decode(self, tokens, **kw):
            return "".join(f"<{t}>" for t in tokens)

    class Printer(transformers.TextStreamer):
        def on_finalized_text(self, s, stream_end=False):
            text.append(s)

    one = m.generate(ids[:1], 4, streamer=Printer(Tok(), skip_prompt=True))
    assert "".join(text) == "".join(f"<{t}>" for t in one[0, 8:])


def test_tokenizer_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    # a toy byte-level BPE in GPT-2's file format: the 256 byte symbols, a few merges, <|endoftext|>
    sym = _byte_symbols()
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("\u0120", "w"), ("\u0120w", "o"), ("r", "l")]
    vocab = {s: i for i, s in enumerate(sym)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    tok = load_tokenizer(tmp_path)
    ref = transformers.GPT2Tokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    for text in ["hello world", "hello<|endoftext|> héllo\n  wo", ""]:
        assert tok.encode(text) == ref.encode(text), text
        assert tok.decode(tok.encode(text)) == text
    assert tok.eos_id == vocab["<|endoftext|>"] and tok.vocab_size == len(vocab)
    # a tokenizer's own save_pretrained (transformers 5) writes tokenizer.json alone
    fast = transformers.GPT2TokenizerFast(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    fast.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved" / "vocab.json").exists()
    tok = load_tokenizer(tmp_path / "saved")
    assert tok.encode("hello<|endoftext|> world") == fast.encode("hello<|endoftext|> world")


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes: printable Latin-1 bytes stand for themselves, the others for
    the code points from 256 on, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


# --------------------------------------------------------------------------------------------------- errors


def _write_checkpoint(d, cfg: dict | None = None, drop: str | None = None, reshape: str | None = None) -> str:
    """A random GPT-2 checkpoint written by uopc (config.json + model.safetensors, `transformer.` prefixed names)."""
    cfg = {"model_type": "gpt2", **HF_CONFIG, "n_positions": 16, **(cfg or {})}
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    rng = np.random.default_rng(0)
    shapes = weight_shapes(GPT2Config(**{k: v for k, v in cfg.items() if k != "model_type"}))
    state = {}
    for name, shape in shapes.items():
        if name != drop:
            shape = (shape[0] + 1, *shape[1:]) if name == reshape else shape
            state["transformer." + name] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    safe_save(state, os.path.join(d, "model.safetensors"))
    return str(d)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such checkpoint directory"):
        GPT2.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.json"):
        GPT2.from_pretrained(tmp_path)
    d = _write_checkpoint(tmp_path / "m")
    os.remove(os.path.join(d, "model.safetensors"))
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="model.safetensors.*safe_serialization=True"):
        GPT2.from_pretrained(d)
    with pytest.raises(FileNotFoundError, match="vocab.json and merges.txt"):
        load_tokenizer(d)


def test_missing_tensor_and_bad_shapes(tmp_path):
    with pytest.raises(KeyError, match=r"missing tensors \['h.1.mlp.c_fc.bias'\]"):
        GPT2.from_pretrained(_write_checkpoint(tmp_path / "a", drop="h.1.mlp.c_fc.bias"))
    with pytest.raises(ValueError, match=r"h.0.attn.c_attn.weight has shape \(65, 192\).*implies \(64, 192\)"):
        GPT2.from_pretrained(_write_checkpoint(tmp_path / "b", reshape="h.0.attn.c_attn.weight"))
    # the config says 64 wide, the tensors are 32 wide
    d = _write_checkpoint(tmp_path / "c", cfg={"n_embd": 32})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({**HF_CONFIG, "n_positions": 16}, f)
    with pytest.raises(ValueError, match="wte.weight has shape"):
        GPT2.from_pretrained(d)


def test_unsupported_config_and_dtype(tmp_path):
    with pytest.raises(ValueError, match="activation_function 'relu' is not supported.*gelu_new"):
        GPT2.from_pretrained(_write_checkpoint(tmp_path / "a", cfg={"activation_function": "relu"}))
    with pytest.raises(ValueError, match="model_type is 'llama'"):
        GPT2Config.from_dict({"model_type": "llama"})
    with pytest.raises(ValueError, match="multiple of n_head"):
        GPT2Config(n_embd=10, n_head=4)
    d = _write_checkpoint(tmp_path / "b", cfg={"activation_function": "gelu"})
    assert GPT2.from_pretrained(d).h[0].mlp.approximate == "none"  # erf GELU
    with pytest.raises(ValueError, match="dtype must be float32 or bfloat16, got float16"):
        GPT2.from_pretrained(d, dtype=dtypes.float16)


@pytest.mark.parametrize(
    "ids,kw,match",
    [
        (np.zeros((1, 4), np.float32), {}, "int array"),
        (np.zeros(4, np.int64), {}, "shape \\(batch, T\\)"),
        (np.full((1, 4), 1000), {}, "ids must be in 0..999"),
        (np.zeros((1, 4), np.int64), {"max_new_tokens": -1}, "max_new_tokens"),
        (np.zeros((1, 4), np.int64), {"max_new_tokens": 13}, "exceed the model's context \\(n_positions=16\\)"),
        (np.zeros((1, 4), np.int64), {"temperature": -0.5}, "temperature"),
        (np.zeros((1, 4), np.int64), {"temperature": float("nan")}, "temperature"),
        (np.zeros((1, 4), np.int64), {"top_k": 0}, "top_k"),
        (np.zeros((1, 4), np.int64), {"top_p": 0.0}, "top_p"),
        (np.zeros((1, 4), np.int64), {"top_p": 1.5}, "top_p"),
        (np.zeros((1, 4), np.int64), {"stop_tokens": [1000]}, "stop_tokens"),
        (np.zeros((1, 4), np.int64), {"stop_tokens": 2.5}, "stop_tokens"),
        (np.zeros((1, 4), np.int64), {"seed": 1.5}, "seed"),
        (np.zeros((1, 4), np.int64), {"streamer": print}, "streamer"),
    ],
)
def test_bad_generate_arguments(tmp_path, ids, kw, match):
    m = GPT2.from_pretrained(_write_checkpoint(tmp_path))
    compiles = compiler.stats["compiles"]
    with pytest.raises(ValueError, match=match):
        m.generate(ids, **{"max_new_tokens": 2, **kw})
    assert compiler.stats["compiles"] == compiles  # refused before anything compiled

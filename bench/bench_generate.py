"""Text generation with GPT-2 small, batch 1: uopc against transformers and the weight-bandwidth floor, in one run.

    python bench/bench_generate.py [--rounds 5] [--threads 2]
    python bench/bench_generate.py --quick        # 2 layers, 64 wide, vocabulary 512, contexts 32/64: a smoke test

The model: bench/models.py's GPT2Config (GPT-2 small: 12 layers, 768 wide, vocabulary 50257, context 1024) built by
transformers (GPT2LMHeadModel, seeded, eval mode) with random weights, written with save_pretrained to a temporary
directory and loaded by uopc.models.GPT2.from_pretrained: the checkpoint path a user takes. transformers runs the
model it built (PyTorch eager, its KV cache). --quick only changes the sizes; the code path is the same.

Rows, each timed in the same interleaved rounds (harness.interleave: every runner once per round), medians:
- decode at context 128, 512, 1024: a random prompt of ctx - 16 tokens, then 16 new tokens, greedy:
  model.generate(ids, 16, streamer=...) on both sides (uopc's generate takes transformers' streamer protocol);
  transformers with max_new_tokens=16, min_new_tokens=16 (an end-of-text token cannot cut a run short),
  do_sample=False, use_cache=True. The streamer stamps the time each new token arrives: a token's time is the median
  of the 15 gaps between consecutive tokens of a call (the prompt's prefill and each call's fixed cost are not in
  them), and "first token" is the time from the call to the first new token (the prefill of ctx - 16 tokens). An
  earlier version took (t(16 new) - t(1 new)) / 15 from two calls: the noise of the 1008-token prefill, divided by
  15, moved the per-token time by up to +-50% on this VM.
- prefill of a 512-token prompt: uopc's model(ids) with its (1, 512, vocab) logits realized, under TinyJit;
  transformers' GPT2LMHeadModel forward on the same ids (use_cache=False), under inference_mode. ratio >= 1 meets
  the issue's "prefill <= 1.0x transformers' forward time".
- the weight-bandwidth floor: decoding a token reads every weight once, so tokens/s <= bandwidth / weight bytes. The
  bytes are every parameter of the loaded model at its dtype, the LM head tied to the token embedding counted once
  (the position table is counted whole though a token reads one row of it: 0.6% of GPT-2 small's bytes); the KV
  cache a step also reads is not in the floor (its size per context is printed). The bandwidth is
  harness.probe_bandwidth: a C triad a = b + 3c over three 64 MiB float arrays (L3 here: 32 MiB) on uopc's threads,
  3 arrays counted, each thread timed in its own CPU time, the best of 5 runs; it runs once per round with the rest,
  and the floor uses its median over the rounds.

ratio is transformers' time over uopc's (uopc's tokens/s over transformers'): above 1, uopc is faster. Threads: 2 on
each side by default (uopc's OpenMP threads, torch.set_num_threads). uopc's first generate at each context compiles:
every call is made once (its time printed) before the rounds. Runners: harness.timed (one untimed call per round,
then enough calls to fill 50 ms) for calls under a second; a call that takes longer is timed once per round, as the
untimed call would double the round to guard against a pause that costs microseconds. Before timing, uopc's prefill
logits are compared with transformers' (max |diff| / max |logit|), and the greedy tokens of the first context.

bf16: uopc loads the same directory with from_pretrained(dir, dtype=dtypes.bfloat16) (2-D weights in bf16, widened
in registers; activations float32; the KV cache in bf16, its default for such a model, as transformers' bf16 model
keeps its cache), and the same rows run with the floor over the bf16 bytes. The transformers
column of the bf16 rows is its float32 model: PyTorch's bfloat16 GPT-2 on a CPU without bf16 arithmetic is no
reference (measured here: 20 s for a 112-token prompt, against 0.18 s in float32); --hf-bf16 runs it anyway.

How each side allocates: first-touch page faults are very expensive on this project's VMs, so the script re-executes
itself with glibc told to keep freed memory (MALLOC_MMAP_MAX_=0, a large MALLOC_TRIM_THRESHOLD_), as
bench_membound.py does; PyTorch's CPU allocator (no cache of its own) then reuses glibc's pages, also for the KV cache
transformers grows by concatenation each step. uopc's generate replays one TinyJit-captured plan per step, outputs
and temporaries from its buffer pool; the prefill replay writes its logits into fresh pool storage each call.
"""

from __future__ import annotations

import os
import sys

MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
if any(os.environ.get(k) != v for k, v in MALLOC.items()):  # glibc reads these at start-up: re-exec with them set
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC})

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any, NamedTuple  # noqa: E402

import models  # noqa: E402  (bench/models.py: run as a script, bench/ is on sys.path)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from uopc import Tensor, TinyJit, dtypes, no_grad, set_num_threads  # noqa: E402
from uopc.models import GPT2  # noqa: E402
from uopc.nn import get_state_dict  # noqa: E402
from uopc.tools.harness import interleave, medians, probe_bandwidth, ratio, time_n, timed  # noqa: E402

DECODE_VS_TRANSFORMERS = 1.5  # targets of issue 26: uopc decode tokens/s over transformers', in f32
FLOOR_FRACTION = 0.7  # uopc decode tokens/s over the weight-bandwidth floor, in f32 and bf16
PREFILL_VS_TRANSFORMERS = 1.0  # transformers' forward time over uopc's prefill time
LONG_CALL_S = 1.0  # calls at least this long are timed once per round, without harness.timed's untimed call


@dataclass(frozen=True)
class Sizes:
    """What a run measures: the model, the decode contexts, new tokens per decode run, the prefill prompt."""

    cfg: models.GPT2Config
    contexts: tuple[int, ...]
    new: int
    prefill: int


# new < ctx / 2: generate without a KV cache pads the context to a power of two >= the tokens it sees, so 1 and `new`
# new tokens after ctx - new then run the same padded plan (ctx), and their difference is the decode steps alone
FULL = Sizes(models.GPT2Config(), contexts=(128, 512, 1024), new=16, prefill=512)
QUICK = Sizes(models.GPT2Config(layers=2, dim=64, heads=4, vocab=512, ctx=256), contexts=(32, 64), new=8, prefill=64)


class Stamps:
    """A streamer (transformers' BaseStreamer protocol, which uopc's generate takes too) that stamps each put."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, ids: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


@dataclass(frozen=True)
class Side:
    """One implementation: generate(prompt (1, T) NumPy, new) -> ids, and the prefill forward on the fixed prompt
    (`forward` for timing, `logits` as NumPy for the check)."""

    generate: Callable[..., Any]  # (prompt, new, streamer=None) -> ids
    forward: Callable[[], Any]
    logits: Callable[[], np.ndarray]


class Row(NamedTuple):
    """One line of the table: the cells as printed, the ratio (None: no ratio) and the target's verdict."""

    case: str
    uopc: str
    transformers: str
    ratio: float | None
    target: str


def save_checkpoint(cfg: models.GPT2Config, path: str, seed: int = 0) -> Any:
    """transformers' GPT-2 of `cfg` with random weights (seeded, eval mode), saved to `path` with save_pretrained."""
    torch.manual_seed(seed)
    eos = cfg.vocab - 1  # GPT-2's end of text is its last id (50256); the quick model's small vocabulary needs its own
    hf_cfg = transformers.GPT2Config(
        n_layer=cfg.layers,
        n_embd=cfg.dim,
        n_head=cfg.heads,
        vocab_size=cfg.vocab,
        n_positions=cfg.ctx,
        layer_norm_epsilon=cfg.eps,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    model = transformers.GPT2LMHeadModel(hf_cfg).eval()
    model.save_pretrained(path, safe_serialization=True)
    return model


def uopc_side(model: GPT2, prompt: np.ndarray) -> Side:
    ids = Tensor(prompt.astype(np.int32))
    fwd = TinyJit(lambda x: model(x).realize())

    def forward() -> Tensor:
        with no_grad():
            return fwd(ids)

    def generate(p: np.ndarray, n: int, streamer: Any = None) -> np.ndarray:
        with no_grad():
            return model.generate(p, n, streamer=streamer)

    return Side(generate, forward, lambda: forward().numpy())


def transformers_side(model: Any, prompt: np.ndarray) -> Side:
    ids = torch.from_numpy(prompt.astype(np.int64))
    pad = model.config.eos_token_id

    def forward() -> torch.Tensor:
        with torch.inference_mode():
            return model(ids, use_cache=False).logits

    def generate(p: np.ndarray, n: int, streamer: Any = None) -> np.ndarray:
        x = torch.from_numpy(p.astype(np.int64))
        kw = dict(
            max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=pad, streamer=streamer
        )
        with torch.inference_mode():
            return model.generate(x, attention_mask=torch.ones_like(x), **kw).numpy()

    return Side(generate, forward, lambda: forward().float().numpy())


def weight_bytes(model: GPT2) -> tuple[int, int]:
    """(parameters, bytes) of a loaded uopc GPT-2: its state dict holds the tied LM head once (as wte.weight)."""
    params = list(get_state_dict(model).values())
    return sum(t.numel() for t in params), sum(t.numel() * t.dtype.itemsize for t in params)


def runner(fn: Callable[[], Any], label: str) -> Callable[[], float]:
    """A round runner for `fn`, after one untimed warm-up call whose time is printed (uopc's first compiles)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    fn()
    again = time.perf_counter() - t0
    print(f"  warm-up {label:34s} first call {first:8.3f} s, again {again:8.3f} s", flush=True)
    return timed(fn) if again < LONG_CALL_S else lambda: time_n(fn, 1)


def decode_runner(gen: Callable[..., Any], prompt: np.ndarray, new: int, label: str, first: list[float]):
    """A round runner for decoding: one untimed generate (the first after another side's turn runs slower on this
    VM), then one stamped by Stamps; returns the median gap between new tokens and appends the first token's time
    to `first`. The warm-up call's time is printed (uopc's first compiles)."""
    t0 = time.perf_counter()
    gen(prompt, new)
    print(f"  warm-up {label:34s} first call {time.perf_counter() - t0:8.3f} s", flush=True)

    def run() -> float:
        gen(prompt, new)
        stamps = Stamps()
        t0 = time.perf_counter()
        gen(prompt, new, streamer=stamps)
        t = stamps.times  # the prompt's put, then one per new token
        first.append(t[1] - t0)
        return float(np.median(np.diff(t[1:])))

    return run


def check(name: str, sides: dict[str, Side], prompt: np.ndarray, new: int) -> None:
    """uopc's prefill logits and greedy tokens against transformers', printed."""
    got, ref = sides["uopc"].logits(), sides["transformers"].logits()
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    a, b = (sides[k].generate(prompt, new)[0, prompt.shape[1] :] for k in ("uopc", "transformers"))
    print(f"  check {name}: prefill logits max |diff| / max |logit| = {err:.1e}; "
          f"greedy tokens after {prompt.shape[1]}: {int((a == b).sum())} of {new} equal")  # fmt: skip


def fmt_rate(tps: float | None) -> str:
    return "-" if tps is None else f"{tps:9.1f} tok/s"


def fmt_target(value: float | None, goal: float) -> str:
    if value is None:
        return f">= {goal:.2f}: not measured"
    return f">= {goal:.2f}: {'met' if value >= goal else 'MISSED'}"


def measure(name: str, sides: dict[str, Side], sizes: Sizes, bytes_per_token: int, rounds: int) -> list[Row]:
    """Warm up every call, check uopc against transformers, run the interleaved rounds; the table rows of one dtype."""
    rng = np.random.default_rng(0)
    prompts = {ctx: rng.integers(0, sizes.cfg.vocab, (1, ctx - sizes.new)) for ctx in sizes.contexts}
    runners: dict[str, Callable[[], float]] = {"stream": lambda: probe_bandwidth(reps=5) * 1e9}  # bytes/s
    first: dict[str, list[float]] = {}
    for ctx, prompt in prompts.items():
        for side, s in sides.items():
            key = f"{side} ctx {ctx}"
            first[key] = []
            runners[key] = decode_runner(s.generate, prompt, sizes.new, f"{name} {key}", first[key])
    for side, s in sides.items():
        runners[f"{side} prefill"] = runner(s.forward, f"{name} {side} prefill {sizes.prefill}")
    check(name, sides, prompts[sizes.contexts[0]], sizes.new)  # after the warm-up: its first calls compile
    med = medians(interleave(runners, rounds))

    bw = med["stream"]
    floor = bw / bytes_per_token
    mb, gbs = bytes_per_token / 1e6, bw / 1e9
    print(f"  floor {name}: {mb:.1f} MB of weights per token / {gbs:.1f} GB/s (triad, median of {rounds} rounds) "
          f"= {floor:.1f} tokens/s")  # fmt: skip
    rows = []
    for ctx in sizes.contexts:
        tps = {}
        for side in sides:
            per_token = med[f"{side} ctx {ctx}"]
            tps[side] = 1 / per_token if per_token > 0 else None
        r = tps["uopc"] / tps["transformers"] if None not in tps.values() else None
        goal = fmt_target(r, DECODE_VS_TRANSFORMERS) if name == "f32" else "-"
        rows.append(Row(f"decode {name}, context {ctx}", fmt_rate(tps["uopc"]), fmt_rate(tps["transformers"]), r, goal))
        frac = {k: v / floor if v is not None else None for k, v in tps.items()}
        cells = [f"{frac[k]:9.2f} floor" if frac[k] is not None else "-" for k in sides]
        rows.append(Row(f"  of the floor ({floor:.0f} tok/s)", *cells, None, fmt_target(frac["uopc"], FLOOR_FRACTION)))
    for ctx in sizes.contexts:
        t = {side: float(np.median(first[f"{side} ctx {ctx}"])) for side in sides}
        ms = [f"{v * 1e3:9.2f} ms" for v in t.values()]
        rows.append(Row(f"first token {name}, prompt {ctx - sizes.new}", *ms, ratio(t, "transformers", "uopc"), "-"))
    t = {side: med[f"{side} prefill"] for side in sides}
    r = ratio(t, "transformers", "uopc")
    ms = [f"{v * 1e3:9.2f} ms" for v in t.values()]
    rows.append(Row(f"prefill {name}, {sizes.prefill} tokens", *ms, r, fmt_target(r, PREFILL_VS_TRANSFORMERS)))
    return rows


def print_table(rows: list[Row]) -> None:
    print(f"\n{'case':<44}{'uopc':>16}{'transformers':>16}{'ratio':>8}   target (ratio, or uopc's fraction)")
    for row in rows:
        r = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        print(f"{row.case:<44}{row.uopc:>16}{row.transformers:>16}{r:>8}   {row.target}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a tiny GPT-2 and contexts 32/64: a smoke test")
    ap.add_argument("--rounds", type=int, default=0, help="interleaved rounds (default 5, --quick 3)")
    ap.add_argument("--threads", type=int, default=2, help="threads for each side (default 2)")
    ap.add_argument("--hf-bf16", action="store_true", help="bf16 rows against transformers in bfloat16 (slow on CPUs)")
    args = ap.parse_args()
    sizes = QUICK if args.quick else FULL
    rounds = args.rounds or (3 if args.quick else 5)
    set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()  # save_pretrained's shard bar
    c = sizes.cfg
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"threads: uopc {args.threads}, torch {torch.__version__} {torch.get_num_threads()}; "
          f"transformers {transformers.__version__}")  # fmt: skip
    print(f"malloc (every side, this process): {' '.join(f'{k}={os.environ[k]}' for k in MALLOC)}")
    print(f"GPT-2 {c.layers} layers, {c.dim} wide, {c.heads} heads, vocabulary {c.vocab}, context {c.ctx}; batch 1; "
          f"decode: {sizes.new} new tokens after ctx - {sizes.new}; {rounds} interleaved rounds, medians")  # fmt: skip

    rows = []
    with tempfile.TemporaryDirectory(prefix="uopc-bench-gpt2-") as path:
        hf = save_checkpoint(c, path)
        model = GPT2.from_pretrained(path)
        n_params, nbytes = weight_bytes(model)
        hf_params = sum(p.numel() for p in hf.parameters())  # parameters(): the tied head once
        print(f"{n_params:,} parameters (transformers counts {hf_params:,}), {nbytes / 1e6:.1f} MB in float32")
        kv = ", ".join(f"{2 * c.layers * ctx * c.dim * 4 / 1e6:.1f} MB at {ctx}" for ctx in sizes.contexts)
        kv16 = ", ".join(f"{2 * c.layers * ctx * c.dim * 2 / 1e6:.1f}" for ctx in sizes.contexts)
        print(f"KV cache a decode step reads (not in the floor): {kv} in float32; {kv16} MB in the bf16 rows")
        prompt = np.random.default_rng(1).integers(0, c.vocab, (1, sizes.prefill))
        sides = {"uopc": uopc_side(model, prompt), "transformers": transformers_side(hf, prompt)}
        rows += measure("f32", sides, sizes, nbytes, rounds)
        del model, sides

        model16 = GPT2.from_pretrained(path, dtype=dtypes.bfloat16)
        if args.hf_bf16:
            hf = transformers.GPT2LMHeadModel.from_pretrained(path, dtype=torch.bfloat16).eval()
        print(
            f"bf16 rows: uopc's bf16 weights and KV cache (from_pretrained's default for bf16) against transformers in "
            f"{'bfloat16' if args.hf_bf16 else 'float32'}"
        )
        sides = {"uopc": uopc_side(model16, prompt), "transformers": transformers_side(hf, prompt)}
        rows += measure("bf16", sides, sizes, weight_bytes(model16)[1], rounds)
    print_table(rows)
    print("\nratio: transformers' time / uopc's (above 1: uopc is faster).")
    print(f"targets (issue 26): decode >= {DECODE_VS_TRANSFORMERS}x transformers' tokens/s in f32; decode >= "
          f"{FLOOR_FRACTION} of the weight-bandwidth floor in f32 and bf16; prefill <= "
          f"{1 / PREFILL_VS_TRANSFORMERS:.1f}x transformers' forward time")  # fmt: skip
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

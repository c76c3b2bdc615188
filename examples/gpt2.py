"""Generate with a GPT-2 checkpoint that transformers' save_pretrained wrote (config.json + model.safetensors).

    python examples/gpt2.py DIR --prompt-ids 464,2068,7586 --max-new-tokens 20
    python examples/gpt2.py DIR --prompt "Hello" --temperature 0.8 --top-k 40    # needs vocab.json + merges.txt in DIR
    python examples/gpt2.py --random                   # a small random GPT-2 built with transformers, in a temp dir
    python examples/gpt2.py DIR --bf16                 # weights kept in bfloat16, widened in registers

uopc works in token ids; with the tokenizer files in DIR (and the `tokenizers` package) it also encodes --prompt and
prints the text. Save a checkpoint with transformers (on a machine with the network):
    GPT2LMHeadModel.from_pretrained("gpt2").save_pretrained(DIR)
    AutoTokenizer.from_pretrained("gpt2").save_pretrained(DIR)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np

from uopc import dtypes
from uopc.models import GPT2, load_tokenizer


def random_checkpoint(path: str) -> None:
    """A 4-layer, 128-wide random GPT-2 (vocabulary 1000, context 128) saved by transformers."""
    try:
        import torch
        import transformers
    except ImportError:
        sys.exit("--random needs transformers (pip install 'uopc[test]' installs it)")
    torch.manual_seed(0)
    # initializer_range 0.2, not GPT-2's 0.02: random weights that small make greedy decoding repeat one token
    kw = dict(initializer_range=0.2, bos_token_id=None, eos_token_id=None)
    cfg = transformers.GPT2Config(n_layer=4, n_head=4, n_embd=128, vocab_size=1000, n_positions=128, **kw)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(path, safe_serialization=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", help="checkpoint directory (config.json + model.safetensors)")
    ap.add_argument("--random", action="store_true", help="build a small random GPT-2 with transformers instead")
    ap.add_argument("--prompt-ids", default="0", help="comma-separated token ids (default: 0)")
    ap.add_argument("--prompt", help="text, encoded with the directory's tokenizer files")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--bf16", action="store_true", help="keep the weights in bfloat16 (half the bytes per token)")
    args = ap.parse_args()
    if (args.dir is None) == (not args.random):
        ap.error("give a checkpoint DIR or --random")
    path = args.dir or tempfile.mkdtemp(prefix="uopc-gpt2-")
    if args.random:
        random_checkpoint(path)

    t0 = time.perf_counter()
    model = GPT2.from_pretrained(path, dtype=dtypes.bfloat16 if args.bf16 else dtypes.float32)
    c = model.config
    print(
        f"{path}: {c.n_layer} layers, {c.n_embd} wide, {c.n_head} heads, vocabulary {c.vocab_size}, "
        f"context {c.n_positions}; loaded in {time.perf_counter() - t0:.2f} s"
    )
    try:
        tok = load_tokenizer(path)
    except (FileNotFoundError, ImportError) as e:
        tok = None
        if args.prompt:
            sys.exit(f"--prompt needs a tokenizer: {e}")
    ids = tok.encode(args.prompt) if args.prompt else [int(i) for i in args.prompt_ids.split(",")]

    kw = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    stops = [tok.eos_id] if tok is not None and tok.eos_id is not None else []
    for run in ("first run, compiling included", "again, the plans cached"):
        t0 = time.perf_counter()
        out = model.generate(np.array([ids]), args.max_new_tokens, stop_tokens=stops, **kw)[0]
        took = time.perf_counter() - t0
        print(f"{args.max_new_tokens} tokens in {took:.2f} s ({args.max_new_tokens / took:.1f} tokens/s, {run})")
    print(out[len(ids) :].tolist())
    if tok is not None:
        print(tok.decode(out))


if __name__ == "__main__":
    main()

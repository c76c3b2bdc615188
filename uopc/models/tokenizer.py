"""GPT-2's tokenizer, when a checkpoint directory holds its files: uopc itself works in token ids.

    >>> tok = load_tokenizer("gpt2-dir")          # vocab.json + merges.txt (or tokenizer.json), `tokenizers` installed
    >>> ids = tok.encode("Hello world")           # [15496, 995] with GPT-2's own files
    >>> tok.decode(ids)
    'Hello world'

GPT-2's byte-level BPE needs its vocabulary and merge list; transformers' `save_pretrained` of a model does not write
them (its tokenizer's `save_pretrained` does). The BPE runs in Hugging Face's `tokenizers` package (a dependency of
transformers, or `pip install tokenizers`).
"""

from __future__ import annotations

import os
from typing import Any

try:  # optional: only a tokenizer needs it (a dependency of transformers, or pip install tokenizers)
    import tokenizers
except ImportError:
    tokenizers = None

END_OF_TEXT = "<|endoftext|>"  # GPT-2's one special token: ends a document, and a natural stop token


class Tokenizer:
    """encode(text) -> token ids and decode(ids) -> text, over a `tokenizers` tokenizer (`backend`)."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.eos_id: int | None = backend.token_to_id(END_OF_TEXT)  # None when the vocabulary lacks it

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text).ids

    def decode(self, ids: Any) -> str:
        # <|endoftext|> is text too, as transformers' GPT-2 tokenizers decode it
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """The tokenizer in directory `path`: tokenizer.json, else vocab.json with merges.txt (GPT-2's byte-level BPE,
    <|endoftext|> kept whole). FileNotFoundError when the files are absent, ImportError without `tokenizers`."""
    d = os.fspath(path)
    full, vocab, merges = (os.path.join(d, f) for f in ("tokenizer.json", "vocab.json", "merges.txt"))
    have_bpe = os.path.isfile(vocab) and os.path.isfile(merges)
    if not os.path.isfile(full) and not have_bpe:
        raise FileNotFoundError(
            f"{d}: no tokenizer files (vocab.json and merges.txt, or tokenizer.json); uopc works in token ids "
            "without them. transformers writes them with AutoTokenizer.from_pretrained(...).save_pretrained(dir)"
        )
    if tokenizers is None:
        raise ImportError("load_tokenizer needs the `tokenizers` package: pip install tokenizers")
    if os.path.isfile(full):
        return Tokenizer(tokenizers.Tokenizer.from_file(full))
    bpe = tokenizers.ByteLevelBPETokenizer(vocab, merges)  # GPT-2's: no prefix space, no lowercasing
    if bpe.token_to_id(END_OF_TEXT) is not None:
        bpe.add_special_tokens([END_OF_TEXT])
    return Tokenizer(bpe)

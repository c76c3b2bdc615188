"""Architectures loaded from checkpoints written elsewhere: a front end (it builds Tensor graphs; weights come
through uopc.nn.state's safetensors reader, never over the network).

    >>> from uopc.models import GPT2
    >>> model = GPT2.from_pretrained("gpt2-dir")          # transformers' save_pretrained output
    >>> model.generate(np.array([[464, 2068]]), 20)       # token ids in, token ids out

checkpoint.py (a Hugging Face checkpoint directory: config.json, model.safetensors or its shards), gpt2.py
(GPT2Config, GPT2: forward and generate), sampling.py (greedy, temperature, top-k, top-p), tokenizer.py (GPT-2's
byte-level BPE from vocab.json and merges.txt, through the optional `tokenizers` package).
"""

from uopc.models.gpt2 import GPT2, GPT2Config
from uopc.models.tokenizer import load_tokenizer

__all__ = ["GPT2", "GPT2Config", "load_tokenizer"]

"""Choosing the next token from a model's last logits: greedy, or temperature, top-k and top-p (nucleus) filtering
followed by an inverse-CDF draw of a uniform number the caller drew with uopc's generator (in the graph).

    >>> check_sampling(0.8, 40, 0.95)                     # ValueError naming a bad argument, before any work
    >>> pick(logits, u, temperature=0.8, top_k=40, top_p=0.95)    # (batch, vocab) floats, (batch,) in [0, 1)
    >>> probabilities(logits, 0.8, 40, 0.95)                       # what pick draws from

The filters run in NumPy on the logits the model already copied back: top-p needs the vocabulary in order of
probability, and uopc's sort is a bitonic network (for GPT-2's 50257 entries, 136 dependent stages over 65536
slots), where NumPy filters a 50257-entry row in 3.5 ms with top-k and top-p, 8.5 ms with top-p alone (measured on 2
busy cores; a GPT-2 small step over a padded context of 64 takes ~200 ms there).
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import numpy as np


def _is_int(x: Any) -> bool:
    return isinstance(x, Integral) and not isinstance(x, bool)


def check_sampling(temperature: Any, top_k: Any, top_p: Any) -> None:
    """ValueError naming the argument unless temperature >= 0 (0: greedy), top_k is None or >= 1, and top_p is None
    or in (0, 1]."""
    if isinstance(temperature, bool) or not isinstance(temperature, Real) or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got {temperature!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, Real) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")


def probabilities(
    logits: np.ndarray, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> np.ndarray:
    """softmax(logits / temperature) per row of `logits` (batch, vocab), in float64, restricted to the top_k
    largest logits (ties with the k-th stay, as in transformers) and then to the smallest most-likely set whose
    probability reaches top_p; the rest are 0 and the kept ones are not renormalized (pick draws in proportion)."""
    z = logits.astype(np.float64) / temperature
    vocab = z.shape[-1]
    if top_k is not None and top_k < vocab:
        kth = np.partition(z, vocab - top_k, axis=-1)[:, vocab - top_k, None]  # the k-th largest per row
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if top_p is not None and top_p < 1:
        order = np.argsort(-p, axis=-1, kind="stable")
        ranked = np.take_along_axis(p, order, -1)
        before = np.cumsum(ranked, -1) - ranked  # the mass of the more likely tokens: the first is always kept
        drop = np.empty(p.shape, bool)
        np.put_along_axis(drop, order, before >= top_p, -1)
        p = np.where(drop, 0.0, p)
    return p


def pick(
    logits: np.ndarray,
    u: np.ndarray | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> np.ndarray:
    """One token id per row of `logits` (batch, vocab): the argmax (first of ties) when temperature is 0, else a draw
    from probabilities(logits, temperature, top_k, top_p): `u` (batch,) in [0, 1) picks the token where the
    cumulative probability first exceeds u times the total."""
    if temperature == 0:
        return logits.argmax(-1)
    cdf = np.cumsum(probabilities(logits, temperature, top_k, top_p), -1)
    # the first index whose cdf exceeds u * total: u < 1 keeps it inside the row, and it never lands on a p == 0
    return (cdf <= np.asarray(u, np.float64)[:, None] * cdf[:, -1:]).sum(-1)

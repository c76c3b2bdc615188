"""bench/models.py: each uopc model, given the PyTorch model's weights, computes PyTorch's output (small configs),
and the CNN and char-GPT training steps give PyTorch's losses. Every uopc call runs under TinyJit (call 1 runs,
call 2 captures, call 3 replays), so the replayed plan is checked too."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

from uopc import TinyJit
from uopc.tensor import Tensor

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("bench_models", os.path.join(ROOT, "bench", "models.py"))
models = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = models  # dataclasses look their module up there
_spec.loader.exec_module(models)

RTOL = ATOL = 1e-4  # atol is relative to the output's scale (its largest magnitude)

FORWARD = {
    "gpt2": dict(batch=2, seq=16, layers=2, dim=64, heads=4, vocab=97, ctx=32),
    "bert": dict(batch=2, seq=16, layers=2, dim=64, heads=4, ffn=128, vocab=97, max_pos=32),
    "resnet18": dict(batch=2, seq=32),  # seq: the image size
    "resnet50": dict(batch=1, seq=32),
    "mobilenetv2": dict(batch=2, seq=32),
}
TRAIN = {
    "cnn": dict(batch=16, p_drop=0.0),  # no dropout: the two libraries would draw different masks
    "chargpt": dict(batch=4, ctx=16, layers=1),
}


def pair(name: str, cfg: dict) -> tuple:
    """The PyTorch workload, and the uopc one with its weights and a TinyJit of its call."""
    tw, uw = models.build(name, "torch", **cfg), models.build(name, "uopc", **cfg)
    models.copy_weights(tw.model, uw.model)
    return tw, uw, TinyJit(uw.call)


def inputs(name: str, cfg: dict, seed: int) -> tuple[np.ndarray, ...]:
    fields = {k: v for k, v in cfg.items() if k not in ("batch", "seq")}
    conf = models.CONFIGS[name](**fields) if models.CONFIGS[name] else None
    return models.make_inputs(name, conf, cfg.get("batch"), cfg.get("seq"), seed)


@pytest.mark.parametrize("name", list(FORWARD))
def test_forward_matches_torch(name):
    cfg = FORWARD[name]
    tw, _, jit = pair(name, cfg)
    for seed in range(3):  # new inputs each call; the third is a replay
        xs = inputs(name, cfg, seed)
        ref = tw.call(*map(torch.from_numpy, xs)).numpy()
        out = jit(*map(Tensor, xs)).numpy()
        assert out.shape == ref.shape
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL * np.abs(ref).max())


@pytest.mark.parametrize("name", list(TRAIN))
def test_train_step_matches_torch(name):
    tw, uw, jit = pair(name, TRAIN[name])
    xs = uw.inputs
    # one batch three times: step 1's loss checks the forward, steps 2 and 3 the backward and AdamW's update
    for _ in range(3):
        ref = tw.call(*map(torch.from_numpy, xs)).item()
        loss = jit(*map(Tensor, xs)).item()
        assert loss == pytest.approx(ref, rel=RTOL)

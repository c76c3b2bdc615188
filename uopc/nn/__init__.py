"""Layers, optimizers and state files on top of the lazy Tensor.

    >>> l1, l2 = Linear(784, 128), Linear(128, 10)
    >>> opt = AdamW(parameters([l1, l2]), lr=1e-3)
    >>> loss = l2(l1(x).relu()).cross_entropy(y)
    >>> opt.zero_grad(); loss.backward(opt.params); opt.step(loss)   # one plan: grads, updates and the loss
    >>> safe_save(get_state_dict([l1, l2]), "mlp.safetensors")

layers.py (Linear, LayerNorm, Embedding, Dropout), conv.py (Conv1d/2d, ConvTranspose2d), norm.py (BatchNorm,
GroupNorm, InstanceNorm, RMSNorm, Sequential), optim.py (SGD, Adam, AdamW, LAMB, clip_grad_norm_), schedulers.py
(StepLR, CosineAnnealingLR, LinearWarmupLR), state.py (state dicts, safetensors), kv_cache.py (KVCache: a decoder's
keys and values, written in place at a position given as a tensor).
"""

from uopc.nn.conv import Conv1d, Conv2d, ConvTranspose2d
from uopc.nn.kv_cache import KVCache
from uopc.nn.layers import Dropout, Embedding, LayerNorm, Linear
from uopc.nn.norm import (
    BatchNorm,
    BatchNorm1d,
    BatchNorm2d,
    GroupNorm,
    InstanceNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
    RMSNorm,
    Sequential,
)
from uopc.nn.optim import LAMB, SGD, Adam, AdamW, Optimizer, clip_grad_norm_
from uopc.nn.schedulers import CosineAnnealingLR, LinearWarmupLR, LRScheduler, StepLR
from uopc.nn.state import MAX_HEADER as MAX_HEADER  # the safetensors limits stay reachable as uopc.nn.X
from uopc.nn.state import SAFETENSORS_DTYPES as SAFETENSORS_DTYPES
from uopc.nn.state import get_state_dict, load_state_dict, parameters, safe_load, safe_save

__all__ = [
    "Linear",
    "LayerNorm",
    "Embedding",
    "KVCache",
    "Dropout",
    "Conv1d",
    "Conv2d",
    "ConvTranspose2d",
    "BatchNorm",
    "BatchNorm1d",
    "BatchNorm2d",
    "GroupNorm",
    "InstanceNorm",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "RMSNorm",
    "Sequential",
    "Optimizer",
    "SGD",
    "Adam",
    "AdamW",
    "LAMB",
    "clip_grad_norm_",
    "LRScheduler",
    "StepLR",
    "CosineAnnealingLR",
    "LinearWarmupLR",
    "parameters",
    "get_state_dict",
    "load_state_dict",
    "safe_save",
    "safe_load",
]

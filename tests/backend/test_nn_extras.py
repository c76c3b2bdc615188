"""nn additions: LAMB, learning-rate schedulers, clip_grad_norm_, optimizer state save/resume, loading a PyTorch
state_dict with a key-renaming hook, and safetensors files of BF16/F16/F32/I64 checked byte for byte against the
format's specification (8-byte little-endian header length, JSON header, little-endian data).

References: PyTorch (schedulers, clip_grad_norm_, nn.Linear) and LAMB's rule written out in NumPy float64.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
import torch

from uopc import Tensor, dtypes
from uopc.nn import (
    LAMB,
    SGD,
    AdamW,
    CosineAnnealingLR,
    Linear,
    LinearWarmupLR,
    StepLR,
    clip_grad_norm_,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_save,
)

rng = np.random.default_rng(0)


def _lamb_numpy(p, grads, lr, b1, b2, eps, wd):
    p, m, v = p.astype(np.float64), np.zeros_like(p, np.float64), np.zeros_like(p, np.float64)
    for t, g in enumerate(grads, 1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        up = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps) + wd * p
        r1, r2 = np.linalg.norm(p), np.linalg.norm(up)
        p = p - lr * (r1 / r2 if r1 > 0 and r2 > 0 else 1.0) * up
    return p


def test_lamb_matches_numpy():
    p0 = rng.normal(size=(4, 5)).astype(np.float32)
    grads = [rng.normal(size=(4, 5)).astype(np.float32) for _ in range(4)]
    w = Tensor(p0, requires_grad=True)
    opt = LAMB([w], lr=0.01, weight_decay=0.1)
    for g in grads:
        opt.zero_grad()
        (w * Tensor(g)).sum().backward([w])
        opt.step()
    np.testing.assert_allclose(w.numpy(), _lamb_numpy(p0, grads, 0.01, 0.9, 0.999, 1e-6, 0.1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "make,tmake",
    [
        (lambda o: StepLR(o, 3, 0.5), lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5)),
        (lambda o: CosineAnnealingLR(o, 10, 0.01), lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 10, 0.01)),
        (
            lambda o: LinearWarmupLR(o, 5, 0.1),
            lambda o: torch.optim.lr_scheduler.LinearLR(o, 0.1, 1.0, total_iters=5),
        ),
    ],
    ids=["step", "cosine", "warmup"],
)
def test_schedulers_match_torch(make, tmake):
    opt = SGD([Tensor([1.0], requires_grad=True)], lr=0.2)
    topt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.2)
    sched, tsched = make(opt), tmake(topt)
    for _ in range(12):
        assert math.isclose(opt.lr, topt.param_groups[0]["lr"], rel_tol=1e-9, abs_tol=1e-12)
        topt.step()
        sched.step()
        tsched.step()


def test_scheduler_sets_a_tensor_lr_in_place():
    opt = SGD([Tensor([1.0], requires_grad=True)], lr=0.0)
    opt.lr = Tensor([0.4])
    lr_tensor = opt.lr
    sched = StepLR(opt, 1, 0.5)
    sched.step()
    assert opt.lr is lr_tensor and math.isclose(lr_tensor.item(), 0.2, rel_tol=1e-6)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_matches_torch(norm_type):
    gs = [rng.normal(size=s).astype(np.float32) * 3 for s in [(3, 4), (5,)]]
    ps = [Tensor(np.zeros(g.shape, np.float32), requires_grad=True) for g in gs]
    for p, g in zip(ps, gs, strict=True):
        p.grad = Tensor(g)
    total = clip_grad_norm_(ps, 1.5, norm_type)
    tps = [torch.zeros(g.shape, requires_grad=True) for g in gs]
    for p, g in zip(tps, gs, strict=True):
        p.grad = torch.tensor(g)
    ttotal = torch.nn.utils.clip_grad_norm_(tps, 1.5, norm_type)
    np.testing.assert_allclose(total.numpy(), ttotal.numpy(), rtol=1e-5)
    for p, tp in zip(ps, tps, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-5, atol=1e-7)


def _train(model, opt, sched, data, steps):
    for x, y in data[:steps]:
        opt.zero_grad()
        loss = ((model(Tensor(x)) - Tensor(y)) ** 2).mean()
        loss.backward(opt.params)
        opt.step(loss)
        sched.step()


@pytest.mark.parametrize("make_opt", [lambda p: AdamW(p, lr=0.01), lambda p: SGD(p, lr=0.05, momentum=0.9)])
def test_resume_from_saved_state_matches_uninterrupted(make_opt, tmp_path):
    data = [(rng.normal(size=(8, 3)).astype(np.float32), rng.normal(size=(8, 2)).astype(np.float32)) for _ in range(6)]
    Tensor.manual_seed(0)
    ref = Linear(3, 2)
    init = {k: v.numpy() for k, v in get_state_dict(ref).items()}
    opt = make_opt([ref.weight, ref.bias])
    _train(ref, opt, CosineAnnealingLR(opt, 6), data, 6)

    model = Linear(3, 2)
    load_state_dict(model, init)
    opt = make_opt([model.weight, model.bias])
    sched = CosineAnnealingLR(opt, 6)
    _train(model, opt, sched, data, 3)
    ostate = {k: (v.numpy() if isinstance(v, Tensor) else v) for k, v in opt.state_dict().items()}
    safe_save(get_state_dict(model), tmp_path / "model.safetensors")
    saved_sched = sched.state_dict()

    model2 = Linear(3, 2)  # a fresh process would start here
    load_state_dict(model2, safe_load(tmp_path / "model.safetensors"))
    opt2 = make_opt([model2.weight, model2.bias])
    opt2.load_state_dict(ostate)
    sched2 = CosineAnnealingLR(opt2, 6)
    sched2.load_state_dict(saved_sched)
    _train(model2, opt2, sched2, data[3:], 3)
    for k, v in get_state_dict(ref).items():
        np.testing.assert_array_equal(get_state_dict(model2)[k].numpy(), v.numpy(), err_msg=k)


def test_optimizer_state_dict_checks():
    opt = AdamW([Tensor(np.zeros((2, 2), np.float32), requires_grad=True)])
    st = opt.state_dict()
    assert set(st) == {"m.0", "v.0", "t", "lr"}
    with pytest.raises(KeyError):
        opt.load_state_dict({"m.0": np.zeros((2, 2))})
    bad = dict(st, **{"m.0": np.zeros((3, 2), np.float32)})
    with pytest.raises(ValueError):
        opt.load_state_dict(bad)


def test_pytorch_state_dict_loads_with_renaming():
    torch.manual_seed(0)
    tnet = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    sd = {k: v.detach().numpy() for k, v in tnet.state_dict().items()}
    sd["extra.num_batches_tracked"] = np.array(0)

    class Net:
        def __init__(self):
            self.fc1, self.fc2 = Linear(4, 8), Linear(8, 3)

        def __call__(self, x):
            return self.fc2(self.fc1(x).relu())

    net = Net()
    names = {"0": "fc1", "2": "fc2"}
    with pytest.raises(KeyError):
        load_state_dict(net, sd)  # strict: the torch names do not match
    load_state_dict(net, sd, strict=False, rename=lambda k: names.get(k.split(".")[0], "x") + "." + k.split(".")[1])
    x = rng.normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(net(Tensor(x)).numpy(), tnet(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def _spec_file(entries: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    """A safetensors file written from the specification, independently of uopc's writer."""
    header, off, blobs = {}, 0, []
    for name, (dt, shape, raw) in entries.items():
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    hb = json.dumps(header).encode()
    return struct.pack("<Q", len(hb)) + hb + b"".join(blobs)


def test_safetensors_dtypes_against_the_spec(tmp_path):
    f32 = rng.normal(size=(3, 4)).astype(np.float32)
    f16 = rng.normal(size=(5,)).astype(np.float16)
    i64 = np.array([[-(2**62), 3], [2**40, -1]], np.int64)
    bf = np.array([1.0, -2.5, 3.140625, 65280.0, -0.0078125], np.float32)  # exactly representable in bf16
    bf_bits = (bf.view(np.uint32) >> 16).astype("<u2")
    raw = _spec_file(
        {
            "a": ("F32", [3, 4], f32.astype("<f4").tobytes()),
            "b": ("F16", [5], f16.astype("<f2").tobytes()),
            "c": ("I64", [2, 2], i64.astype("<i8").tobytes()),
            "d": ("BF16", [5], bf_bits.tobytes()),
        }
    )
    (tmp_path / "spec.safetensors").write_bytes(raw)
    got = safe_load(tmp_path / "spec.safetensors")
    assert got["a"].dtype is dtypes.float32 and got["b"].dtype is dtypes.float16 and got["c"].dtype is dtypes.int64
    np.testing.assert_array_equal(got["a"].numpy(), f32)
    np.testing.assert_array_equal(got["b"].numpy(), f16)
    np.testing.assert_array_equal(got["c"].numpy(), i64)
    np.testing.assert_array_equal(got["d"].numpy(), bf)
    assert got["d"].dtype is dtypes.bfloat16

    safe_save({"a": f32, "b": f16, "c": i64, "d": bf}, tmp_path / "ours.safetensors", bf16={"d"})
    safe_save(got, tmp_path / "again.safetensors")  # a bfloat16 tensor is written as BF16 as it is
    assert (tmp_path / "again.safetensors").read_bytes()[8:].replace(b" ", b"") == raw[8:].replace(b" ", b"")
    ours = (tmp_path / "ours.safetensors").read_bytes()
    n = struct.unpack("<Q", ours[:8])[0]
    header = json.loads(ours[8 : 8 + n])
    assert {k: header[k]["dtype"] for k in "abcd"} == {"a": "F32", "b": "F16", "c": "I64", "d": "BF16"}
    data = ours[8 + n :]
    for k, blob in (("a", f32.tobytes()), ("b", f16.tobytes()), ("c", i64.tobytes()), ("d", bf_bits.tobytes())):
        b, e = header[k]["data_offsets"]
        assert data[b:e] == blob, k


def test_bfloat16_storage_dtype():
    x = rng.normal(size=(6, 7)).astype(np.float32)
    t, ref = Tensor(x, dtype=dtypes.bfloat16), torch.tensor(x).bfloat16()
    assert t.dtype is dtypes.bfloat16 and t.element_size() == 2
    np.testing.assert_array_equal(t.numpy(), ref.float().numpy())  # rounded to nearest even on the way in
    np.testing.assert_array_equal(Tensor(x).bfloat16().numpy(), ref.float().numpy())  # a cast rounds the same
    # each op computed in float32 and rounded to bfloat16, as PyTorch's (tests/backend/test_half.py has more)
    y = (t * 3 + 1).exp()
    assert y.dtype is dtypes.bfloat16
    np.testing.assert_array_equal(y.numpy(), (ref * 3 + 1).exp().float().numpy())
    np.testing.assert_array_equal(t.sum(1).numpy(), ref.float().sum(1).bfloat16().float().numpy())
    assert (t + Tensor(x)).dtype is dtypes.float32 and (t + Tensor(x).half()).dtype is dtypes.float32
    assert (t + 1).dtype is dtypes.bfloat16 and (t.float() * 2).dtype is dtypes.float32
    w = Tensor(x, dtype=dtypes.bfloat16, requires_grad=True)
    (g,) = (w.float() * 2).sum().gradient(w)
    assert g.dtype is dtypes.bfloat16 and np.all(g.numpy() == 2)
    assert Tensor.arange(4, dtype=dtypes.bfloat16).tolist() == [0.0, 1.0, 2.0, 3.0]
    p = Tensor(np.ones(3, np.float32), dtype=dtypes.bfloat16, requires_grad=True)
    opt = SGD([p], lr=0.25)
    (p.float() * 2).sum().backward([p])
    opt.step()  # the step's lr buffer is bfloat16 too (converted, not reinterpreted)
    assert p.tolist() == [0.5, 0.5, 0.5]


def test_bf16_rounding_on_save(tmp_path):
    x = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-9, np.inf, -np.inf, np.nan], np.float32)
    safe_save({"x": x}, tmp_path / "r.safetensors", bf16={"x"})
    back = safe_load(tmp_path / "r.safetensors")["x"].numpy()
    ref = torch.tensor(x).to(torch.bfloat16).float().numpy()  # round to nearest even, as PyTorch
    np.testing.assert_array_equal(back[:5], ref[:5])
    assert np.isnan(back[5])
    with pytest.raises(ValueError):
        safe_save({"i": np.arange(3)}, tmp_path / "bad.safetensors", bf16={"i"})

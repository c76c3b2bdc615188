"""Models written in torch.nn, exported with torch.onnx.export, run by uopc.onnx: outputs against PyTorch's and
onnxruntime's (CPUExecutionProvider). Random weights; every BatchNorm statistic, norm scale and bias randomized.

    torch model -> torch.onnx.export(dynamo=False) -> uopc.onnx.load(path)(x) == model(x) == ort.run(x)

The TorchScript exporter (dynamo=False) exports every model, at two opsets where they differ in what they write;
one test uses the dynamo exporter (torch.export + onnxscript, offline). Tolerance: rtol 1e-4 and atol 1e-5 x the
largest output magnitude (RTOL, ATOL). Also: a symbolic batch dim bound at two sizes, a replay under
.jit(), weights in an external data file, and load(bytes) of such a model failing with a clear error.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import uopc.onnx  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5  # ATOL is relative to the output's scale (its largest magnitude)


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random biases, norm scales and BatchNorm statistics (a fresh model's zeros and ones would hide a dropped or
    swapped one); returns the model in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) * 0.5 + 0.75)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) * 0.5 + 0.75)
            for name, p in m.named_parameters(recurse=False):
                if name.endswith("bias"):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def export(model: nn.Module, args: tuple, path, names: list[str], dynamic: dict | None = None, opset: int = 17):
    """torch.onnx.export with the TorchScript exporter; the output is named "y"."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            model, args, str(path), dynamo=False, input_names=names, output_names=["y"], dynamic_axes=dynamic,
            opset_version=opset,
        )  # fmt: skip
    return path


def check(path, model: nn.Module, args: tuple, names: list[str], uopc_model=None) -> np.ndarray:
    """uopc's output against PyTorch's and onnxruntime's; returns uopc's."""
    m = uopc_model or uopc.onnx.load(path)
    feeds = {n: a.numpy() for n, a in zip(names, args)}
    out = m(**feeds)["y"].numpy()
    with torch.no_grad():
        ref = model(*args).numpy()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (ref_ort,) = sess.run(None, feeds)
    assert out.shape == ref.shape == ref_ort.shape
    scale = float(np.abs(ref).max())
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL * scale)
    np.testing.assert_allclose(out, ref_ort, rtol=RTOL, atol=ATOL * scale)
    return out


# ---------------------------------------------------------------------------------------------------------------
# the models


class Block(nn.Module):
    """ResNet's basic block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.short = nn.Identity()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + self.short(x))


class SmallResNet(nn.Module):
    """Stem conv-BN-ReLU-maxpool, two stages of basic blocks (one with a strided 1x1 shortcut), global pool, fc."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2))
        self.layers = nn.Sequential(Block(8, 8, 1), Block(8, 16, 2))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


class SqueezeExcite(nn.Module):
    """x * gate(conv(relu(conv(avgpool(x))))): channel weights from the pooled features."""

    def __init__(self, c: int, gate: nn.Module):
        super().__init__()
        self.reduce, self.expand, self.gate = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1), gate

    def forward(self, x):
        return x * self.gate(self.expand(F.relu(self.reduce(F.adaptive_avg_pool2d(x, 1)))))


class DepthwiseSeparable(nn.Module):
    """MobileNetV3-style: 1x1 expand, 3x3 depthwise (groups = channels), hardswish, squeeze-excite, 1x1 project;
    the first block gates with hardsigmoid, the second with sigmoid, and adds its input back."""

    def __init__(self, c: int = 8, wide: int = 16):
        super().__init__()

        def block(stride: int, gate: nn.Module) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(c, wide, 1, bias=False), nn.BatchNorm2d(wide), nn.Hardswish(),
                nn.Conv2d(wide, wide, 3, stride, 1, groups=wide, bias=False), nn.BatchNorm2d(wide), nn.Hardswish(),
                SqueezeExcite(wide, gate), nn.Conv2d(wide, c, 1, bias=False), nn.BatchNorm2d(c),
            )  # fmt: skip

        self.first, self.second = block(2, nn.Hardsigmoid()), block(1, nn.Sigmoid())

    def forward(self, x):
        x = self.first(x)
        return x + self.second(x)


class Encoder(nn.Module):
    """Two nn.TransformerEncoderLayers (batch_first, GELU, pre- and post-LayerNorm) with a key padding mask."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        kw = dict(dim_feedforward=64, dropout=0.0, activation="gelu", batch_first=True)
        self.post = nn.TransformerEncoderLayer(dim, heads, **kw)
        self.pre = nn.TransformerEncoderLayer(dim, heads, norm_first=True, **kw)

    def forward(self, x, pad):
        return self.pre(self.post(x, src_key_padding_mask=pad), src_key_padding_mask=pad)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (C // self.heads) ** -0.5
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class GPT(nn.Module):
    """Token + position embeddings, pre-LayerNorm blocks (causal attention, tanh GELU MLP), LM head tied to the
    token embedding."""

    def __init__(self, vocab: int = 50, ctx: int = 16, dim: int = 32, heads: int = 4, layers: int = 2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                dict(ln1=nn.LayerNorm(dim), attn=CausalSelfAttention(dim, heads), ln2=nn.LayerNorm(dim),
                     fc=nn.Linear(dim, 4 * dim), out=nn.Linear(4 * dim, dim))
            )
            for _ in range(layers)
        )  # fmt: skip
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for b in self.blocks:
            x = x + b["attn"](b["ln1"](x))
            x = x + b["out"](F.gelu(b["fc"](b["ln2"](x)), approximate="tanh"))
        return self.ln_f(x) @ self.tok.weight.T


def _padding(batch: int, seq: int) -> torch.Tensor:
    """A key padding mask (True: padded): row i keeps its first seq - i positions."""
    return torch.arange(seq)[None, :] >= (seq - torch.arange(batch))[:, None]


# ---------------------------------------------------------------------------------------------------------------
# the tests


@pytest.mark.parametrize("opset", [9, 17])  # 9: Unsqueeze/Squeeze axes as attributes, BatchNormalization-9
def test_resnet_style_cnn(tmp_path, opset):
    torch.manual_seed(0)
    model, x = randomize(SmallResNet()), torch.randn(2, 3, 16, 16)
    check(export(model, (x,), tmp_path / "m.onnx", ["x"], opset=opset), model, (x,), ["x"])


def test_dynamo_exporter(tmp_path):
    pytest.importorskip("onnxscript")
    torch.manual_seed(6)
    model, x = randomize(SmallResNet(), 6), torch.randn(2, 3, 16, 16)
    path = str(tmp_path / "m.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), path, dynamo=True, input_names=["x"], output_names=["y"], verbose=False)
    check(path, model, (x,), ["x"])


@pytest.mark.parametrize("opset", [13, 18])  # 13: Hardswish written as x * HardSigmoid(x); 18: the Hardswish op
def test_depthwise_separable_squeeze_excite(tmp_path, opset):
    torch.manual_seed(1)
    model, x = randomize(DepthwiseSeparable(), 1), torch.randn(2, 8, 12, 12)
    path = export(model, (x,), tmp_path / "m.onnx", ["x"], opset=opset)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"Conv", "GlobalAveragePool", "HardSigmoid", "Sigmoid"} <= ops
    assert ("HardSwish" in ops) == (opset >= 14)
    check(path, model, (x,), ["x"])


@pytest.mark.parametrize("opset", [14, 17])  # 14: LayerNorm as ReduceMean, Sub, Pow, Sqrt; 17: LayerNormalization
def test_transformer_encoder_with_padding_mask(tmp_path, opset):
    torch.manual_seed(2)
    model = randomize(Encoder(), 2)
    x, pad = torch.randn(3, 10, 32), _padding(3, 10)
    path = export(model, (x, pad), tmp_path / "m.onnx", ["x", "pad"], opset=opset)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert ("LayerNormalization" in ops) == (opset >= 17)
    out = check(path, model, (x, pad), ["x", "pad"])
    assert np.isfinite(out).all()


def test_gpt_decoder_causal(tmp_path):
    torch.manual_seed(3)
    model, ids = randomize(GPT(), 3), torch.randint(0, 50, (2, 12))
    dyn = {"ids": {0: "batch", 1: "seq"}}
    path = export(model, (ids,), tmp_path / "m.onnx", ["ids"], dyn)
    m = uopc.onnx.load(path)
    out = check(path, model, (ids,), ["ids"], m)
    # causality: changing the last token leaves every earlier position's logits as they were
    ids2 = ids.clone()
    ids2[:, -1] = (ids[:, -1] + 1) % 50
    out2 = m(ids2.numpy())["y"].numpy()
    np.testing.assert_allclose(out2[:, :-1], out[:, :-1], rtol=RTOL, atol=ATOL * float(np.abs(out).max()))
    check(path, model, (ids[:, :5],), ["ids"], m)  # a shorter sequence: the symbolic seq dim binds to 5


def test_symbolic_batch_two_sizes_and_jit(tmp_path):
    torch.manual_seed(4)
    model = randomize(SmallResNet(), 4)
    path = export(model, (torch.randn(2, 3, 16, 16),), tmp_path / "m.onnx", ["x"], {"x": {0: "batch"}})
    dim = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param == "batch"
    m = uopc.onnx.load(path)
    for batch in (1, 3):
        assert check(path, model, (torch.randn(batch, 3, 16, 16),), ["x"], m).shape == (batch, 10)
    step = m.jit()  # call 1 runs, call 2 captures, call 3 replays: each with new data
    for seed in range(3):
        x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            ref = model(x).numpy()
        out = step(x.numpy())["y"].numpy()
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL * float(np.abs(ref).max()))


def test_external_data(tmp_path):
    torch.manual_seed(5)
    model, x = randomize(SmallResNet(), 5), torch.randn(1, 3, 16, 16)
    proto = onnx.load(str(export(model, (x,), tmp_path / "inline.onnx", ["x"])))
    path = tmp_path / "ext.onnx"
    onnx.save_model(
        proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin", size_threshold=0
    )
    stored = onnx.load(str(path), load_external_data=False).graph.initializer
    assert stored and all(t.data_location == onnx.TensorProto.EXTERNAL for t in stored)
    check(path, model, (x,), ["x"])
    # the bytes of the .onnx file alone hold no weights: a clear error that says how to load it
    with pytest.raises(ValueError, match="external"):
        uopc.onnx.load(path.read_bytes())
    (tmp_path / "w.bin").unlink()
    with pytest.raises(ValueError, match="w.bin"):  # the data file gone: the error names it
        uopc.onnx.load(path)


def test_exported_attention_runs_as_fused_kernels(tmp_path):
    """An export's MatMul, Mul by a folded scale, Where with -inf, Softmax, MatMul (the GPT above) and
    nn.TransformerEncoderLayer's attention with a key padding mask: the scheduler fuses each into one attention
    kernel (with an optimizer), and the outputs still match."""
    from uopc.engine.lower import make_plan
    from uopc.engine.realize import default_opt

    torch.manual_seed(5)
    model, ids = randomize(GPT(layers=1), 5), torch.randint(0, 50, (2, 12))
    gpt = uopc.onnx.load(export(model, (ids,), tmp_path / "g.onnx", ["ids"]))
    enc_model = randomize(Encoder(), 6)
    x, pad = torch.randn(3, 10, 32), _padding(3, 10)
    enc_path = export(enc_model, (x, pad), tmp_path / "e.onnx", ["x", "pad"])
    enc = uopc.onnx.load(enc_path)
    for m, feeds, layers in ((gpt, {"ids": ids.numpy()}, 1), (enc, {"x": x.numpy(), "pad": pad.numpy()}, 2)):
        plan, _ = make_plan([m.lazy(**feeds)["y"].uop], opt=default_opt())
        fused = [k.name for k in plan.kernels if k.name.startswith("fa_")]
        assert len(fused) == (layers if default_opt() is not None else 0), [k.name for k in plan.kernels]
    check(enc_path, enc_model, (x, pad), ["x", "pad"], enc)

"""Models shared by the benchmarks, each twice: in uopc (uopc.nn, Tensor ops) and in PyTorch (torch.nn), with the
same architecture and the same parameter names, so `copy_weights` moves a PyTorch model's weights into uopc's.

    w = build("resnet18", "torch", seq=32, batch=2)      # randomly initialised, BatchNorm statistics randomized
    u = build("resnet18", "uopc", seq=32, batch=2)       # seq: the image size here
    copy_weights(w.model, u.model)
    w.call(*map(torch.from_numpy, w.inputs))             # == u.call(*map(Tensor, u.inputs)) up to rounding

Models (`build` names):
  gpt2      GPT-2 small: 12 layers, 768 wide, 12 heads, vocab 50257, context 1024, pre-LayerNorm blocks, tanh GELU,
            causal attention, LM head tied to the token embedding; forward(ids (B, T)) -> logits (B, T, vocab)
  resnet18  torchvision's ResNet-18 in inference mode (BatchNorm uses its running statistics); (N, 3, 224, 224)
  resnet50  torchvision's ResNet-50 (Bottleneck blocks, the stride on the 3x3 conv: v1.5), the same way; both
            ResNets (uopc and PyTorch) live in bench/resnets.py
  mobilenetv2  torchvision's MobileNetV2 (inverted residual blocks, depthwise 3x3 convolutions, ReLU6) in inference
            mode, the same way; both live in bench/mobilenets.py
  cnn       examples/train_cnn.py's CNN and its training step (AdamW, batch 128, MNIST-shaped random data)
  chargpt   examples/gpt.py's character GPT and its training step (3 layers, 64 wide, context 64, batch 32, AdamW)
  bert      a BERT-base encoder: 12 post-LayerNorm layers, 768 wide, 12 heads, FFN 3072, erf GELU, a padding mask;
            forward(ids (B, T) or embeddings (B, T, 768), mask (B, T) bool) -> hidden states (B, T, 768)

The uopc CNN and char GPT are the examples' own classes (imported from examples/); the PyTorch ones reproduce them.
The examples' training steps are closures inside their main(), so `uopc_train_step` reproduces them (forward,
cross_entropy, zero_grad, backward, opt.step(loss, *BatchNorm buffers)) at a fixed lr: the peak of their schedules.
Every uopc `Workload.call` takes Tensors only, so it can be wrapped in uopc.TinyJit.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import uopc
from uopc.nn import AdamW, Embedding, LayerNorm, Linear, get_state_dict, load_state_dict
from uopc.nn import parameters as uopc_parameters
from uopc.tensor import Tensor

try:  # optional: the uopc models work without torch (bench_coldstart's uopc processes never load it)
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    torch = F = nn = None

Module = nn.Module if nn is not None else object  # the PyTorch classes are defined either way, usable with torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _example(name: str) -> Any:
    """Load examples/<name>.py as a module (examples/ is a folder of scripts, not a package)."""
    return _load(os.path.join(ROOT, "examples", f"{name}.py"), f"examples_{name}")


def _load(path: str, name: str) -> Any:
    """A Python file as module `name`, wherever it sits (bench/ is not a package either)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: dataclasses and pickling look modules up there
    spec.loader.exec_module(module)
    return module


_resnets = _load(os.path.join(ROOT, "bench", "resnets.py"), "bench_resnets")
ResNet18, ResNet50 = _resnets.ResNet18, _resnets.ResNet50
TorchResNet18, TorchResNet50 = _resnets.TorchResNet18, _resnets.TorchResNet50
_mobilenets = _load(os.path.join(ROOT, "bench", "mobilenets.py"), "bench_mobilenets")
MobileNetV2, TorchMobileNetV2 = _mobilenets.MobileNetV2, _mobilenets.TorchMobileNetV2
CNN = _example("train_cnn").CNN  # conv-BN-ReLU-pool x2, fc, dropout, fc: the uopc model of examples/train_cnn.py
CharGPT = _example("gpt").GPT  # the uopc model of examples/gpt.py


# ---------------------------------------------------------------------------------------------------------------
# configs


@dataclass(frozen=True)
class GPT2Config:
    """GPT-2 small by default; fewer layers, a narrower width or a small vocabulary make a test-sized model."""

    layers: int = 12
    dim: int = 768
    heads: int = 12
    vocab: int = 50257
    ctx: int = 1024
    eps: float = 1e-5


@dataclass(frozen=True)
class BertConfig:
    """BERT-base by default."""

    layers: int = 12
    dim: int = 768
    heads: int = 12
    ffn: int = 3072
    vocab: int = 30522
    max_pos: int = 512
    type_vocab: int = 2
    eps: float = 1e-12


@dataclass(frozen=True)
class CNNConfig:
    """examples/train_cnn.py's model and defaults (its lr 3e-3 is the peak of its one-cycle schedule)."""

    c1: int = 16
    c2: int = 32
    hidden: int = 128
    p_drop: float = 0.25
    lr: float = 3e-3


@dataclass(frozen=True)
class CharGPTConfig:
    """examples/gpt.py's model and defaults; vocab 65 is the Shakespeare text's character set."""

    vocab: int = 65
    ctx: int = 64
    dim: int = 64
    layers: int = 3
    heads: int = 4
    lr: float = 3e-3


# ---------------------------------------------------------------------------------------------------------------
# uopc models


def _heads(x: Tensor, heads: int) -> Tensor:
    """(B, T, C) -> (B, heads, T, C / heads)."""
    B, T, C = x.shape
    return x.reshape(B, T, heads, C // heads).permute(0, 2, 1, 3)


def _merge_heads(x: Tensor) -> Tensor:
    """(B, heads, T, hd) -> (B, T, heads * hd)."""
    B, H, T, hd = x.shape
    return x.permute(0, 2, 1, 3).reshape(B, T, H * hd)


class GPT2Block:
    """x + attn(ln_1(x)), then x + mlp(ln_2(x)); causal attention, tanh GELU (GPT-2's). Weights are (out, in) as
    nn.Linear's (Hugging Face's GPT-2 stores Conv1D's (in, out)); the MLP's output layer is `mlp_proj`."""

    def __init__(self, cfg: GPT2Config):
        self.heads = cfg.heads
        self.ln_1, self.ln_2 = LayerNorm(cfg.dim, cfg.eps), LayerNorm(cfg.dim, cfg.eps)
        self.c_attn, self.c_proj = Linear(cfg.dim, 3 * cfg.dim), Linear(cfg.dim, cfg.dim)
        self.c_fc, self.mlp_proj = Linear(cfg.dim, 4 * cfg.dim), Linear(4 * cfg.dim, cfg.dim)

    def __call__(self, x: Tensor) -> Tensor:
        q, k, v = (_heads(t, self.heads) for t in self.c_attn(self.ln_1(x)).split(x.shape[-1], dim=2))
        x = x + self.c_proj(_merge_heads(q.scaled_dot_product_attention(k, v, is_causal=True)))
        return x + self.mlp_proj(self.c_fc(self.ln_2(x)).gelu(approximate="tanh"))


class GPT2:
    """Token and position embeddings, the blocks, a final LayerNorm, and logits through the token embedding."""

    def __init__(self, cfg: GPT2Config):
        self.wte, self.wpe = Embedding(cfg.vocab, cfg.dim), Embedding(cfg.ctx, cfg.dim)
        self.h = [GPT2Block(cfg) for _ in range(cfg.layers)]
        self.ln_f = LayerNorm(cfg.dim, cfg.eps)

    def __call__(self, ids: Tensor) -> Tensor:
        B, T = ids.shape
        x = self.wte(ids) + self.wpe.weight[:T]
        for block in self.h:
            x = block(x)
        x = self.ln_f(x).reshape(B * T, -1)  # one (B*T, dim) @ (dim, vocab) GEMM, as Linear does
        return (x @ self.wte.weight.T).reshape(B, T, -1)  # the head is the token embedding (tied)


class BertLayer:
    """Post-LayerNorm: x = ln1(x + attn(x)), then x = ln2(x + ffn(x)); erf GELU; keys where `keep` is False are
    masked out."""

    def __init__(self, cfg: BertConfig):
        self.heads = cfg.heads
        self.query, self.key, self.value = (Linear(cfg.dim, cfg.dim) for _ in range(3))
        self.attn_out, self.ln1 = Linear(cfg.dim, cfg.dim), LayerNorm(cfg.dim, cfg.eps)
        self.inter, self.out = Linear(cfg.dim, cfg.ffn), Linear(cfg.ffn, cfg.dim)
        self.ln2 = LayerNorm(cfg.dim, cfg.eps)

    def __call__(self, x: Tensor, keep: Tensor) -> Tensor:
        q, k, v = (_heads(lin(x), self.heads) for lin in (self.query, self.key, self.value))
        x = self.ln1(x + self.attn_out(_merge_heads(q.scaled_dot_product_attention(k, v, attn_mask=keep))))
        return self.ln2(x + self.out(self.inter(x).gelu()))


class Bert:
    """Word + position + token-type (0) embeddings, LayerNorm, the layers; returns the last hidden states."""

    def __init__(self, cfg: BertConfig):
        self.word, self.position = Embedding(cfg.vocab, cfg.dim), Embedding(cfg.max_pos, cfg.dim)
        self.token_type, self.ln = Embedding(cfg.type_vocab, cfg.dim), LayerNorm(cfg.dim, cfg.eps)
        self.layers = [BertLayer(cfg) for _ in range(cfg.layers)]

    def __call__(self, ids: Tensor, mask: Tensor) -> Tensor:
        x = ids if ids.is_floating_point() else self.word(ids)  # ids, or embeddings made elsewhere
        B, T = mask.shape
        x = self.ln(x + self.position.weight[:T] + self.token_type.weight[0])
        keep = mask.reshape(B, 1, 1, T)  # (B, heads, query, key): padding keys get no weight
        for layer in self.layers:
            x = layer(x, keep)
        return x


# ---------------------------------------------------------------------------------------------------------------
# PyTorch models: the same architectures, the same parameter names


class TorchGPT2Block(Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.heads = cfg.heads
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.dim, cfg.eps), nn.LayerNorm(cfg.dim, cfg.eps)
        self.c_attn, self.c_proj = nn.Linear(cfg.dim, 3 * cfg.dim), nn.Linear(cfg.dim, cfg.dim)
        self.c_fc, self.mlp_proj = nn.Linear(cfg.dim, 4 * cfg.dim), nn.Linear(4 * cfg.dim, cfg.dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.c_attn(self.ln_1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class TorchGPT2(Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(cfg.vocab, cfg.dim), nn.Embedding(cfg.ctx, cfg.dim)
        self.h = nn.ModuleList(TorchGPT2Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.dim, cfg.eps)
        for m in self.modules():  # GPT-2's init: N(0, 0.02) weights
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T


class TorchCNN(Module):
    """examples/train_cnn.py's CNN, reproduced layer by layer (same names: conv1, bn1, conv2, bn2, fc, head)."""

    def __init__(self, cfg: CNNConfig):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, cfg.c1, 3, padding=1, bias=False), nn.BatchNorm2d(cfg.c1)
        self.conv2, self.bn2 = nn.Conv2d(cfg.c1, cfg.c2, 3, padding=1, bias=False), nn.BatchNorm2d(cfg.c2)
        self.fc, self.drop = nn.Linear(cfg.c2 * 7 * 7, cfg.hidden), nn.Dropout(cfg.p_drop)
        self.head = nn.Linear(cfg.hidden, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2).flatten(1)
        return self.head(self.drop(F.relu(self.fc(x))))


class TorchCharGPTAttention(Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class TorchCharGPTBlock(Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim), TorchCharGPTAttention(dim, heads)
        self.ln2, self.fc, self.out = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))  # erf GELU: uopc's Tensor.gelu() default


class TorchCharGPT(Module):
    """examples/gpt.py's GPT, reproduced (same names: tok, pos, blocks, ln_f, head)."""

    def __init__(self, cfg: CharGPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Parameter(torch.randn(cfg.ctx, cfg.dim) * 0.02)
        nn.init.normal_(self.tok.weight, std=0.02)
        self.blocks = nn.ModuleList(TorchCharGPTBlock(cfg.dim, cfg.heads) for _ in range(cfg.layers))
        self.ln_f, self.head = nn.LayerNorm(cfg.dim), nn.Linear(cfg.dim, cfg.vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class TorchBertLayer(Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.heads = cfg.heads
        self.query, self.key, self.value = (nn.Linear(cfg.dim, cfg.dim) for _ in range(3))
        self.attn_out, self.ln1 = nn.Linear(cfg.dim, cfg.dim), nn.LayerNorm(cfg.dim, cfg.eps)
        self.inter, self.out = nn.Linear(cfg.dim, cfg.ffn), nn.Linear(cfg.ffn, cfg.dim)
        self.ln2 = nn.LayerNorm(cfg.dim, cfg.eps)

    def forward(self, x, keep):
        B, T, C = x.shape
        q, k, v = (lin(x).view(B, T, self.heads, -1).transpose(1, 2) for lin in (self.query, self.key, self.value))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        x = self.ln1(x + self.attn_out(y.transpose(1, 2).reshape(B, T, C)))
        return self.ln2(x + self.out(F.gelu(self.inter(x))))


class TorchBert(Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word, self.position = nn.Embedding(cfg.vocab, cfg.dim), nn.Embedding(cfg.max_pos, cfg.dim)
        self.token_type, self.ln = nn.Embedding(cfg.type_vocab, cfg.dim), nn.LayerNorm(cfg.dim, cfg.eps)
        self.layers = nn.ModuleList(TorchBertLayer(cfg) for _ in range(cfg.layers))
        for m in self.modules():  # BERT's init: N(0, 0.02) weights
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids, mask):
        x = ids if ids.is_floating_point() else self.word(ids)
        B, T = mask.shape
        x = self.ln(x + self.position.weight[:T] + self.token_type.weight[0])
        keep = mask.view(B, 1, 1, T)
        for layer in self.layers:
            x = layer(x, keep)
        return x


def randomize_norms(model: Any, seed: int = 0) -> None:
    """Give every bias, norm scale and BatchNorm running statistic of a PyTorch model random values (a fresh
    model's zeros and ones would hide a bias or a statistic that is dropped or swapped)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            leaf, parent = name.rsplit(".", 1)[-1], model.get_submodule(name.rpartition(".")[0])
            norm = isinstance(parent, (nn.LayerNorm, nn.BatchNorm2d))
            if leaf == "running_var" or (norm and leaf == "weight"):
                t.copy_(torch.rand(t.shape, generator=g) * 0.5 + 0.75)  # U(0.75, 1.25): positive
            elif leaf in ("bias", "running_mean"):
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)


# ---------------------------------------------------------------------------------------------------------------
# weights, training steps, inputs, the factory


def copy_weights(torch_model: Any, uopc_model: Any) -> None:
    """Copy a PyTorch model's parameters and buffers into the uopc model of the same architecture, by name."""
    own = get_state_dict(uopc_model)
    state = {}
    for name, t in torch_model.state_dict().items():
        a = t.detach().cpu().numpy()
        state[name] = a.reshape(own[name].shape) if name in own else a  # num_batches_tracked: () here, (1,) there
    load_state_dict(uopc_model, state)


def uopc_train_step(model: Any, opt: AdamW) -> Callable[[Tensor, Tensor], Tensor]:
    """Forward (training mode), cross-entropy over the last dim, backward, the update and BatchNorm's running
    statistics: one plan. Returns the loss."""
    buffers = model.buffers() if hasattr(model, "buffers") else []

    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            logits = model(x)
            loss = logits.reshape(-1, logits.shape[-1]).cross_entropy(y)
            opt.zero_grad()
            loss.backward(opt.params)
            opt.step(loss, *buffers)
        return loss

    return step


def torch_train_step(forward: Callable, opt: Any) -> Callable:
    """The same step in PyTorch: `forward` is the model (in training mode) or its torch.compile'd form."""

    def step(x, y):
        logits = forward(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.long())
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


@dataclass
class Workload:
    """A model, the inputs of one call as NumPy arrays, and the call: a forward pass or a training step that takes
    the inputs as the framework's tensors."""

    model: Any
    call: Callable[..., Any]
    inputs: tuple[np.ndarray, ...]


def make_inputs(name: str, cfg: Any, batch: int, seq: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Random inputs: token ids (and a padding mask), images, or an MNIST-shaped batch with labels."""
    g = np.random.default_rng(seed)
    if name == "gpt2":
        return (g.integers(0, cfg.vocab, (batch, seq)).astype(np.int32),)
    if name == "bert":
        lengths = g.integers(seq // 2, seq + 1, batch)  # each row padded after a random length
        mask = np.arange(seq)[None, :] < lengths[:, None]
        return g.integers(0, cfg.vocab, (batch, seq)).astype(np.int32), mask
    if name in ("resnet18", "resnet50", "mobilenetv2"):
        return (g.standard_normal((batch, 3, seq, seq)).astype(np.float32),)
    if name == "cnn":
        return g.standard_normal((batch, 1, 28, 28)).astype(np.float32), g.integers(0, 10, batch).astype(np.int32)
    if name == "chargpt":
        x = g.integers(0, cfg.vocab, (batch, cfg.ctx + 1)).astype(np.int32)
        return x[:, :-1].copy(), x[:, 1:].reshape(-1).copy()  # next-character targets, flattened as gpt.py does
    raise ValueError(f"unknown model {name!r}")


CONFIGS = {
    "gpt2": GPT2Config, "bert": BertConfig, "resnet18": None, "resnet50": None, "mobilenetv2": None,
    "cnn": CNNConfig, "chargpt": CharGPTConfig,
}  # fmt: skip
DEFAULTS = {
    "gpt2": (1, 128), "bert": (1, 128), "resnet18": (1, 224), "resnet50": (1, 224), "mobilenetv2": (1, 224),
    "cnn": (128, 28), "chargpt": (32, 64),
}  # fmt: skip
TRAINED = ("cnn", "chargpt")


def _uopc_model(name: str, cfg: Any) -> Any:
    if name == "cnn":
        return CNN(cfg.c1, cfg.c2, cfg.hidden, cfg.p_drop)
    if name == "chargpt":
        return CharGPT(cfg.vocab, cfg.ctx, cfg.dim, cfg.layers, cfg.heads)
    images = {"resnet18": ResNet18, "resnet50": ResNet50, "mobilenetv2": MobileNetV2}
    if name in images:
        return images[name]()
    return {"gpt2": GPT2, "bert": Bert}[name](cfg)


def _torch_model(name: str, cfg: Any) -> Any:
    images = {"resnet18": TorchResNet18, "resnet50": TorchResNet50, "mobilenetv2": TorchMobileNetV2}
    if name in images:
        return images[name]()
    return {"gpt2": TorchGPT2, "bert": TorchBert, "cnn": TorchCNN, "chargpt": TorchCharGPT}[name](cfg)


def build(
    name: str,
    framework: str,
    batch: int | None = None,
    seq: int | None = None,
    seed: int = 0,
    compile: bool = False,
    **cfg: Any,
) -> Workload:
    """Model `name` in `framework` ("uopc" or "torch"), randomly initialised, with inputs of `batch` x `seq` (the
    image size for the image models; chargpt's is its context) and the call to time. `cfg` overrides config fields
    (layers=2, dim=64, ...). `compile`: the PyTorch model runs through torch.compile."""
    if framework not in ("uopc", "torch"):
        raise ValueError(f"framework must be 'uopc' or 'torch', got {framework!r}")
    conf = CONFIGS[name](**cfg) if CONFIGS[name] else None
    batch, seq = batch or DEFAULTS[name][0], seq or DEFAULTS[name][1]
    inputs = make_inputs(name, conf, batch, seq, seed)
    train = name in TRAINED
    if framework == "uopc":
        Tensor.manual_seed(seed)
        model = _uopc_model(name, conf)
        params = uopc_parameters(model)
        Tensor.realize_all(*params)  # the weights are buffers before the first call, as if loaded from a file
        if train:
            return Workload(model, uopc_train_step(model, AdamW(params, lr=conf.lr)), inputs)

        def forward(*xs: Tensor) -> Tensor:
            with uopc.no_grad():
                return model(*xs)

        return Workload(model, forward, inputs)
    torch.manual_seed(seed)
    model = _torch_model(name, conf)
    randomize_norms(model, seed)
    model.train(train)
    fwd = torch.compile(model) if compile else model
    if train:
        return Workload(model, torch_train_step(fwd, torch.optim.AdamW(model.parameters(), lr=conf.lr)), inputs)
    return Workload(model, torch.no_grad()(fwd), inputs)


__all__ = [
    "GPT2Config",
    "BertConfig",
    "CNNConfig",
    "CharGPTConfig",
    "GPT2",
    "ResNet18",
    "ResNet50",
    "Bert",
    "CNN",
    "CharGPT",
    "TorchGPT2",
    "TorchResNet18",
    "TorchResNet50",
    "TorchBert",
    "TorchCNN",
    "TorchCharGPT",
    "copy_weights",
    "randomize_norms",
    "uopc_train_step",
    "torch_train_step",
    "make_inputs",
    "build",
    "Workload",
]

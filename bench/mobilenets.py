"""MobileNetV2 (torchvision's architecture and parameter names) in uopc and in PyTorch; bench/models.py builds it
(`build("mobilenetv2", "uopc")`) and copies weights between the two by name.

    u, w = MobileNetV2(), TorchMobileNetV2()    # features.0.0.weight, ..., classifier.1.bias: the same names
    u(Tensor(x)).shape == w(torch.from_numpy(x)).shape == (N, 1000)

A 3x3 stride-2 conv to 32 channels, 17 inverted residual blocks (1x1 expand by t, depthwise 3x3, 1x1 project,
BatchNorm after each, ReLU6 after the first two; a residual add where the shape stays), a 1x1 conv to 1280,
average pool, linear. The classifier's dropout is left out: the benchmark is inference.
"""

from __future__ import annotations

from typing import Any

from uopc.nn import BatchNorm2d, Conv2d, Linear
from uopc.tensor import Tensor

try:  # optional: the uopc model works without torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    F = nn = None

Module = nn.Module if nn is not None else object

__all__ = ["MobileNetV2", "TorchMobileNetV2"]

# (expansion t, output channels c, blocks n, stride s of the first block)
SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def _blocks() -> list[tuple[int, int, int, int]]:
    """Each inverted residual block's (input channels, output channels, stride, expansion)."""
    out, cin = [], 32
    for t, c, n, s in SETTINGS:
        for i in range(n):
            out.append((cin, c, s if i == 0 else 1, t))
            cin = c
    return out


def _cbr(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> list:
    """torchvision's Conv2dNormActivation without its activation's slot: [conv, BatchNorm] (ReLU6 is applied)."""
    return [Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), BatchNorm2d(cout)]


class InvertedResidual:
    """1x1 expand (t > 1), depthwise 3x3 (stride s), 1x1 project: `conv` holds them as torchvision names them."""

    def __init__(self, cin: int, cout: int, stride: int, t: int):
        e = cin * t
        self.conv = ([_cbr(cin, e, 1)] if t != 1 else []) + [_cbr(e, e, 3, stride, e)]
        self.conv += [Conv2d(e, cout, 1, bias=False), BatchNorm2d(cout)]
        self.residual = stride == 1 and cin == cout

    def __call__(self, x: Tensor) -> Tensor:
        h = x
        for conv, bn in self.conv[:-2]:
            h = bn(conv(h)).relu6()
        h = self.conv[-1](self.conv[-2](h))
        return h + x if self.residual else h


class MobileNetV2:
    def __init__(self, classes: int = 1000):
        self.features = [_cbr(3, 32, 3, 2), *(InvertedResidual(*b) for b in _blocks()), _cbr(320, 1280, 1)]
        self.classifier = [None, Linear(1280, classes)]  # torchvision's [Dropout, Linear]

    def __call__(self, x: Tensor) -> Tensor:
        conv, bn = self.features[0]
        x = bn(conv(x)).relu6()
        for block in self.features[1:-1]:
            x = block(x)
        conv, bn = self.features[-1]
        return self.classifier[1](bn(conv(x)).relu6().mean((2, 3)))


def _torch_cbr(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> Any:
    conv = nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.ReLU6())


class TorchInvertedResidual(Module):
    def __init__(self, cin: int, cout: int, stride: int, t: int):
        super().__init__()
        e = cin * t
        layers = ([_torch_cbr(cin, e, 1)] if t != 1 else []) + [_torch_cbr(e, e, 3, stride, e)]
        self.conv = nn.Sequential(*layers, nn.Conv2d(e, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


class TorchMobileNetV2(Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        blocks = [TorchInvertedResidual(*b) for b in _blocks()]
        self.features = nn.Sequential(_torch_cbr(3, 32, 3, 2), *blocks, _torch_cbr(320, 1280, 1))
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))
        for m in self.modules():  # torchvision's init for the convolutions
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))

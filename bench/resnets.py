"""ResNet-18 and ResNet-50 (torchvision's architectures and parameter names) in uopc and in PyTorch; bench/models.py
builds them (`build("resnet50", "uopc")`) and copies weights between the two by name.

    u, w = ResNet50(), TorchResNet50()          # layer1.0.conv1.weight, ..., fc.bias: the same names in both
    u(Tensor(x)).shape == w(torch.from_numpy(x)).shape == (N, 1000)

ResNet-50's Bottleneck strides its 3x3 conv (torchvision's "v1.5"), not the first 1x1.
"""

from __future__ import annotations

from typing import Any

from uopc.nn import BatchNorm2d, Conv2d, Linear
from uopc.tensor import Tensor

try:  # optional: the uopc models work without torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    F = nn = None

Module = nn.Module if nn is not None else object

__all__ = ["ResNet18", "ResNet50", "TorchResNet18", "TorchResNet50"]


def _shortcut(cin: int, cout: int, stride: int) -> list | None:
    """ResNet's shortcut: identity, or a 1x1 conv + BN where the block changes the shape."""
    return [Conv2d(cin, cout, 1, stride, bias=False), BatchNorm2d(cout)] if stride != 1 or cin != cout else None


class BasicBlock:
    """ResNet's block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); a 1x1 conv + BN shortcut on a change."""

    expansion = 1

    def __init__(self, cin: int, cout: int, stride: int):
        self.conv1, self.bn1 = Conv2d(cin, cout, 3, stride, 1, bias=False), BatchNorm2d(cout)
        self.conv2, self.bn2 = Conv2d(cout, cout, 3, 1, 1, bias=False), BatchNorm2d(cout)
        self.downsample = _shortcut(cin, cout, stride)

    def __call__(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
        short = x if self.downsample is None else self.downsample[1](self.downsample[0](x))
        return (out + short).relu()


class Bottleneck:
    """ResNet-50's block: 1x1 down to `width`, 3x3 (strided), 1x1 up to 4 x width, BN after each, + shortcut."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        self.conv1, self.bn1 = Conv2d(cin, width, 1, bias=False), BatchNorm2d(width)
        self.conv2, self.bn2 = Conv2d(width, width, 3, stride, 1, bias=False), BatchNorm2d(width)
        self.conv3, self.bn3 = Conv2d(width, 4 * width, 1, bias=False), BatchNorm2d(4 * width)
        self.downsample = _shortcut(cin, 4 * width, stride)

    def __call__(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu())).relu()
        out = self.bn3(self.conv3(out))
        short = x if self.downsample is None else self.downsample[1](self.downsample[0](x))
        return (out + short).relu()


class ResNet:
    """torchvision's ResNet: 7x7/2 conv, BN, ReLU, 3x3/2 max-pool, 4 stages of blocks (widths 64..512, stride 2 from
    stage 2 on), average pool, linear. ResNet18: BasicBlock x (2, 2, 2, 2); ResNet50: Bottleneck x (3, 4, 6, 3)."""

    def __init__(self, block: type, depths: tuple[int, ...], classes: int = 1000):
        self.conv1, self.bn1 = Conv2d(3, 64, 7, 2, 3, bias=False), BatchNorm2d(64)
        cin = 64
        for i, (w, n) in enumerate(zip((64, 128, 256, 512), depths)):
            stage = [block(cin, w, 1 if i == 0 else 2)] + [block(w * block.expansion, w, 1) for _ in range(n - 1)]
            setattr(self, f"layer{i + 1}", stage)
            cin = w * block.expansion
        self.fc = Linear(cin, classes)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.bn1(self.conv1(x)).relu().max_pool2d(kernel_size=3, stride=2, padding=1)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in stage:
                x = block(x)
        return self.fc(x.mean((2, 3)))


class ResNet18(ResNet):
    def __init__(self, classes: int = 1000):
        super().__init__(BasicBlock, (2, 2, 2, 2), classes)


class ResNet50(ResNet):
    def __init__(self, classes: int = 1000):
        super().__init__(Bottleneck, (3, 4, 6, 3), classes)


def _torch_shortcut(cin: int, cout: int, stride: int) -> Any:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class TorchBasicBlock(Module):
    expansion = 1

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.downsample = _torch_shortcut(cin, cout, stride)

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class TorchBottleneck(Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, 4 * width, 1, bias=False), nn.BatchNorm2d(4 * width)
        self.downsample = _torch_shortcut(cin, 4 * width, stride)

    def forward(self, x):
        out = self.bn3(self.conv3(F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class TorchResNet(Module):
    def __init__(self, block: type, depths: tuple[int, ...], classes: int = 1000):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
        cin = 64
        for i, (w, n) in enumerate(zip((64, 128, 256, 512), depths)):
            rest = [block(w * block.expansion, w, 1) for _ in range(n - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(block(cin, w, 1 if i == 0 else 2), *rest))
            cin = w * block.expansion
        self.fc = nn.Linear(cin, classes)
        for m in self.modules():  # torchvision's init for the convolutions
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(x.mean((2, 3)))


class TorchResNet18(TorchResNet):
    def __init__(self, classes: int = 1000):
        super().__init__(TorchBasicBlock, (2, 2, 2, 2), classes)


class TorchResNet50(TorchResNet):
    def __init__(self, classes: int = 1000):
        super().__init__(TorchBottleneck, (3, 4, 6, 3), classes)

"""nn convolution and normalization layers against PyTorch's (same weights), training and eval behaviour; Tensor's
functional batchnorm/layernorm/linear/sequential. Tolerance 1e-4 (float32); running statistics 1e-5."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from uopc.nn import (
    SGD,
    BatchNorm1d,
    BatchNorm2d,
    Conv1d,
    Conv2d,
    ConvTranspose2d,
    GroupNorm,
    InstanceNorm2d,
    RMSNorm,
    Sequential,
    parameters,
)
from uopc.tensor import Tensor

TOL = 1e-4
rng = np.random.default_rng(1)


def r(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def close(a, b, tol: float = TOL) -> None:
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else b
    np.testing.assert_allclose(a.numpy() if isinstance(a, Tensor) else a, b, rtol=tol, atol=tol)


def copy_weights(ours, theirs) -> None:
    with torch.no_grad():
        for name in ("weight", "bias"):
            if getattr(ours, name, None) is not None:
                getattr(theirs, name).copy_(torch.tensor(getattr(ours, name).numpy()))


nn = torch.nn
LAYERS = [
    (lambda: Conv2d(3, 4, 3, stride=2, padding=1), lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1), (2, 3, 9, 7)),
    (lambda: Conv2d(4, 6, (3, 2), groups=2, bias=False), lambda: nn.Conv2d(4, 6, (3, 2), groups=2, bias=False),
     (1, 4, 7, 5)),
    (lambda: Conv1d(3, 5, 3, dilation=2), lambda: nn.Conv1d(3, 5, 3, dilation=2), (2, 3, 11)),
    (lambda: ConvTranspose2d(3, 4, 3, 2, output_padding=1), lambda: nn.ConvTranspose2d(3, 4, 3, 2, output_padding=1),
     (2, 3, 5, 4)),
]  # fmt: skip


@pytest.mark.parametrize("ours,theirs,shape", LAYERS)
def test_conv_layers(ours, theirs, shape):
    a, b = ours(), theirs()
    assert a.weight.shape == tuple(b.weight.shape)
    copy_weights(a, b)
    x = r(*shape)
    close(a(Tensor(x)), b(torch.tensor(x)))


def test_conv_layer_init_bound():
    c = Conv2d(8, 4, 3)
    assert np.abs(c.weight.numpy()).max() <= 1 / np.sqrt(8 * 9)


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("affine", [True, False])
def test_batchnorm2d_train_eval(momentum, affine):
    ours, theirs = (
        BatchNorm2d(3, momentum=momentum, affine=affine),
        torch.nn.BatchNorm2d(3, momentum=momentum, affine=affine),
    )
    if affine:
        ours.weight.assign(Tensor(r(3))).realize()
        ours.bias.assign(Tensor(r(3))).realize()
        copy_weights(ours, theirs)
    theirs.train()
    with Tensor.train():
        for _ in range(3):  # running statistics move toward each batch's
            x = r(4, 3, 5, 7) * 2 + 1
            close(ours(Tensor(x)), theirs(torch.tensor(x)))
            Tensor.realize_all(*ours.buffers())
    close(ours.running_mean, theirs.running_mean, 1e-5)
    close(ours.running_var, theirs.running_var, 1e-5)
    assert ours.num_batches_tracked.numpy()[0] == theirs.num_batches_tracked.item() == 3
    theirs.eval()
    x = r(2, 3, 5, 7)
    assert not Tensor.training
    close(ours(Tensor(x)), theirs(torch.tensor(x)))


def test_batchnorm_gradient():
    ours, theirs = BatchNorm1d(4), torch.nn.BatchNorm1d(4)
    x = r(6, 4, 5)
    xt, xu = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    probe = r(6, 4, 5)
    with Tensor.train():
        gx, gw = (ours(xt) * Tensor(probe)).sum().gradient(xt, ours.weight)
    (theirs(xu) * torch.tensor(probe)).sum().backward()
    close(gx, xu.grad)
    close(gw, theirs.weight.grad)


def test_batchnorm_no_running_stats_and_errors():
    ours, theirs = BatchNorm2d(2, track_running_stats=False), torch.nn.BatchNorm2d(2, track_running_stats=False)
    theirs.eval()
    x = r(3, 2, 4, 4)
    close(ours(Tensor(x)), theirs(torch.tensor(x)))  # eval without running statistics: batch statistics
    assert ours.buffers() == []
    with pytest.raises(ValueError, match="channels"):
        ours(Tensor(r(3, 5, 4, 4)))


def test_optimizer_skips_running_stats():
    bn, conv = BatchNorm2d(2), Conv2d(1, 2, 3)
    opt = SGD(parameters([conv, bn]), lr=0.1)
    assert len(opt.params) == 4  # conv weight/bias, bn weight/bias; not running_mean/var/num_batches_tracked
    with Tensor.train():
        loss = bn(conv(Tensor(r(2, 1, 6, 6)))).square().mean()
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss, *bn.buffers())
    assert bn.num_batches_tracked.numpy()[0] == 1


@pytest.mark.parametrize("affine", [True, False])
def test_groupnorm_instancenorm(affine):
    x = r(2, 6, 5, 3)
    g, gt = GroupNorm(3, 6, affine=affine), torch.nn.GroupNorm(3, 6, affine=affine)
    if affine:
        g.weight.assign(Tensor(r(6))).realize()
        copy_weights(g, gt)
    close(g(Tensor(x)), gt(torch.tensor(x)))
    i, it = InstanceNorm2d(6, affine=affine), torch.nn.InstanceNorm2d(6, affine=affine)
    close(i(Tensor(x)), it(torch.tensor(x)))


def test_rmsnorm():
    x = r(3, 4, 8)
    ours, theirs = RMSNorm(8, eps=1e-6), torch.nn.RMSNorm(8, eps=1e-6)
    ours.weight.assign(Tensor(r(8))).realize()
    copy_weights(ours, theirs)
    close(ours(Tensor(x)), theirs(torch.tensor(x)))
    close(RMSNorm(8)(Tensor(x)), torch.nn.RMSNorm(8)(torch.tensor(x)))


def test_sequential():
    seq = Sequential(Conv2d(1, 2, 3, padding=1), Tensor.relu, lambda t: t.max_pool2d(2))
    assert len(seq) == 3 and seq[1] is Tensor.relu
    assert seq(Tensor(r(1, 1, 6, 6))).shape == (1, 2, 3, 3)


def test_train_context():
    assert Tensor.training is False
    with Tensor.train():
        assert Tensor.training is True
        with Tensor.train(False):
            assert Tensor.training is False
        assert Tensor.training is True
    assert Tensor.training is False


def test_functional_norms():
    x = r(2, 3, 4)
    close(Tensor(x).layernorm(), torch.nn.functional.layer_norm(torch.tensor(x), (4,)))
    m, v, w, b = r(3), np.abs(r(3)) + 0.5, r(3), r(3)
    ref = torch.nn.functional.batch_norm(torch.tensor(x), torch.tensor(m), torch.tensor(v), torch.tensor(w),
                                         torch.tensor(b), eps=0.0)  # fmt: skip
    close(Tensor(x).batchnorm(Tensor(w), Tensor(b), Tensor(m), Tensor(1 / np.sqrt(v))), ref)
    w2 = r(4, 5)
    close(Tensor(x).linear(Tensor(w2), Tensor(r(5)) * 0), x @ w2)
    assert Tensor(x).sequential([Tensor.relu, lambda t: t * 2]).numpy().min() >= 0

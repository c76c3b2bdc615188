"""BatchNorm in eval mode (any per-channel scale) folded into a convolution's weight by the scheduler
(uopc.schedule.fold, UOPC_FOLD_BN=1 here), against PyTorch's Conv + BatchNorm in eval mode.

With the optimizer on, the BatchNorm's statistics (its 1/sqrt(var + eps)) are computed only by kernels the plan
keeps from call to call (uopc.engine.kept: they read the model's weights and statistics, never the activations),
and the output's reader adds one per-channel term. Tolerance 1e-4 relative + absolute (1e-3 where Winograd runs).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from uopc import helpers
from uopc.engine.realize import capture
from uopc.nn import BatchNorm1d, BatchNorm2d, Conv1d, Conv2d
from uopc.tensor import Tensor

rng = np.random.default_rng(3)


@pytest.fixture(autouse=True)
def fold(context):
    context(FOLD_BN=1)


def r(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _pair(cin: int, cout: int, k, bias: bool, dims: int = 2, **kw):
    """A uopc Conv + BatchNorm and PyTorch's, with the same random weights and statistics, PyTorch's in eval."""
    conv, bn = (Conv2d, BatchNorm2d) if dims == 2 else (Conv1d, BatchNorm1d)
    tconv, tbn = (torch.nn.Conv2d, torch.nn.BatchNorm2d) if dims == 2 else (torch.nn.Conv1d, torch.nn.BatchNorm1d)
    ours, theirs = (conv(cin, cout, k, bias=bias, **kw), bn(cout)), (tconv(cin, cout, k, bias=bias, **kw), tbn(cout))
    values = {
        "weight": ours[0].weight.numpy(),
        "bias": r(cout) if bias else None,
        "bn.weight": r(cout),
        "bn.bias": r(cout),
        "bn.running_mean": r(cout),
        "bn.running_var": rng.uniform(0.2, 3.0, cout).astype(np.float32),
    }
    with torch.no_grad():
        for name, v in values.items():
            if v is not None:  # (index 1 of each pair: the BatchNorm)
                side, attr = name.startswith("bn."), name.removeprefix("bn.")
                getattr(ours[side], attr).assign(Tensor(v)).realize()
                getattr(theirs[side], attr).copy_(torch.tensor(v))
    theirs[1].eval()
    return ours, theirs


def _folded(calls) -> None:
    """With the optimizer on: every kernel that takes a square root (the BatchNorm's) is one the plan keeps."""
    if helpers.settings().OPT < 1:
        return
    for c in calls:
        kept = set(c.cp.kept.kernels)
        sqrt = [i for i, k in enumerate(c.cp.plan.kernels) if "sqrt" in k.op]
        assert sqrt and set(sqrt) <= kept, [(k.name, k.op, i in kept) for i, k in enumerate(c.cp.plan.kernels)]


# (input shape, cin, cout, kernel, keywords): one of each way uopc computes a convolution (uopc.tensor.conv)
CASES = [
    ((2, 8, 9, 11), 8, 16, 3, {"padding": 1}),  # the in-place GEMM
    ((2, 64, 12, 12), 64, 64, 3, {"padding": 1}),  # Winograd
    ((2, 16, 7, 9), 16, 24, 1, {}),  # 1x1: a GEMM
    ((2, 16, 15, 13), 16, 32, 3, {"stride": 2, "padding": 1}),  # positions as rows, channels as lanes
    ((2, 16, 10, 10), 16, 16, 3, {"groups": 16, "padding": 1}),  # depthwise: a direct loop
    ((2, 8, 11, 10), 8, 12, 3, {"groups": 2, "stride": 2}),  # grouped, strided
    ((2, 3, 16, 17), 3, 8, 3, {"stride": 2, "padding": 1}),  # an RGB stem: im2col
    ((1, 3, 23, 18), 3, 8, 7, {"stride": 2, "padding": 3}),  # over the phases
    ((2, 5, 20), 5, 6, 3, {"padding": 2, "dilation": 2}),  # Conv1d + BatchNorm1d
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape,cin,cout,k,kw", CASES)
def test_eval_batchnorm_is_folded_into_the_convolutions_weight(shape, cin, cout, k, kw, bias):
    ours, theirs = _pair(cin, cout, k, bias, len(shape) - 2, **kw)
    x = r(*shape)
    tol = 1e-3 if cin == 64 else 1e-4
    with capture() as calls:
        y = ours[1](ours[0](Tensor(x))).relu().realize()
    ref = torch.relu(theirs[1](theirs[0](torch.tensor(x)))).detach().numpy()
    np.testing.assert_allclose(y.numpy(), ref, rtol=tol, atol=tol)
    _folded(calls)


def test_a_changed_running_variance_is_seen_by_the_next_call():
    """The folded weight is a kept temp: assigning new statistics must recompute it, not reuse the last call's."""
    ours, theirs = _pair(8, 16, 3, True, padding=1)
    x = r(2, 8, 9, 11)
    for _ in range(3):
        y = ours[1](ours[0](Tensor(x))).numpy()
        ref = theirs[1](theirs[0](torch.tensor(x))).detach().numpy()
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
        var = rng.uniform(0.2, 3.0, 16).astype(np.float32)
        ours[1].running_var.assign(Tensor(var)).realize()
        with torch.no_grad():
            theirs[1].running_var.copy_(torch.tensor(var))


def test_a_convolution_read_by_another_op_too_is_computed_once():
    """conv(x) read by its BatchNorm and by a residual add: folding the scale would compute the convolution twice
    (once per weight), so the scheduler leaves it: one product kernel, values equal to PyTorch's."""
    ours, theirs = _pair(16, 16, 1, False)
    x = r(2, 16, 9, 9)
    with capture() as calls:
        c = ours[0](Tensor(x))
        y = (ours[1](c) + c).realize()
    tc = theirs[0](torch.tensor(x))
    np.testing.assert_allclose(y.numpy(), (theirs[1](tc) + tc).detach().numpy(), rtol=1e-4, atol=1e-4)
    products = [k.name for c in calls for k in c.cp.plan.kernels if "matmul" in k.op]
    assert len(products) == 1, products


def test_training_batchnorm_is_not_folded():
    """In training mode the statistics are the convolution's own: nothing to fold, values as PyTorch's."""
    ours, theirs = _pair(8, 16, 3, True, padding=1)
    theirs[1].train()
    x = r(2, 8, 9, 11)
    with Tensor.train():
        y = ours[1](ours[0](Tensor(x))).numpy()
    ref = theirs[1](theirs[0](torch.tensor(x))).detach().numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_a_scale_and_shift_written_out_fold_too():
    """Not only nn.BatchNorm: any factor per output channel (here a Tensor of shape (1, C, 1, 1)) times a
    convolution, the convolution read by nothing else."""
    x, w, s, t = r(2, 8, 9, 11), r(16, 8, 3, 3), r(1, 16, 1, 1), r(1, 16, 1, 1)
    with capture() as calls:
        y = ((Tensor(x).conv2d(Tensor(w), padding=1) + Tensor(t)) * Tensor(s).abs().sqrt()).realize()
    ref = (torch.conv2d(torch.tensor(x), torch.tensor(w), padding=1) + torch.tensor(t)) * torch.tensor(s).abs().sqrt()
    np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)
    if helpers.settings().OPT >= 1:  # per call: the product, then one add per element (or the add as its epilogue)
        (c,) = calls
        ops = [k.op for i, k in enumerate(c.cp.plan.kernels) if i not in c.cp.kept.kernels]
        assert ops in (["matmul", "elementwise add"], ["matmul (add)"]), ops


def test_a_folded_shift_read_by_two_kernels_is_the_products_epilogue():
    """A 1x1 convolution's folded output conv' + shift, read by the next convolution and by a residual add: the next
    convolution stores it as its input and the add reads that store (uopc.schedule.fusion.read_staged), so the add
    costs no kernel: the plan runs as many kernels as for the two convolutions alone (on this machine: the products,
    each storing its BatchNorm's shift as its epilogue). Recomputed by the add, the first product is stored bare and
    the shifted value by a kernel of its own."""
    first, theirs1 = _pair(64, 32, 1, False)
    second, theirs2 = _pair(32, 32, 1, False)
    x = r(1, 64, 32, 32)  # (sizes the microkernel takes, positions a whole number of its 64-wide tiles)
    with capture() as calls:
        y = first[1](first[0](Tensor(x)))
        z = (second[1](second[0](y)) + y).realize()
    ty = theirs1[1](theirs1[0](torch.tensor(x)))
    ref = (theirs2[1](theirs2[0](ty)) + ty).detach().numpy()
    np.testing.assert_allclose(z.numpy(), ref, rtol=1e-4, atol=1e-4)
    if helpers.settings().OPT < 1:
        return
    # what this machine's optimizer makes of the pair without the residual add: the add must add no kernel to it
    with capture() as probe:
        second[1](second[0](first[1](first[0](Tensor(x))))).realize()
    (c,), (p,) = calls, probe
    run = [k.name for i, k in enumerate(c.cp.plan.kernels) if i not in c.cp.kept.kernels]
    alone = [k.name for i, k in enumerate(p.cp.plan.kernels) if i not in p.cp.kept.kernels]
    assert len(run) == len(alone), (run, alone)


def test_without_the_setting_nothing_is_folded(context):
    """UOPC_FOLD_BN=0 (the default): the BatchNorm is applied to the convolution's output (its square root in a
    kernel over the activations, or the product's epilogue), the weight is read as it is; the same values."""
    context(FOLD_BN=0)
    ours, theirs = _pair(8, 16, 3, True, padding=1)
    x = r(2, 8, 9, 11)
    with capture() as calls:
        y = ours[1](ours[0](Tensor(x))).relu().realize()
    ref = torch.relu(theirs[1](theirs[0](torch.tensor(x)))).detach().numpy()
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)
    (c,) = calls
    assert any("sqrt" in k.op and i not in c.cp.kept.kernels for i, k in enumerate(c.cp.plan.kernels))

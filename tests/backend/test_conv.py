"""Convolution, pooling, resizing, masking and attention against PyTorch (float32 CPU), forward and gradient.

Tolerance: 1e-4 relative + 1e-4 absolute on values and gradients (float32 sums of up to a few hundred products).
Shapes are odd on purpose (7, 9, 11): nothing divides into the optimizer's 4-wide tiles.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from uopc.engine.realize import capture
from uopc.helpers import Context
from uopc.tensor import Tensor
from uopc.tensor.conv import ROWS_MIN_CHANNELS

RTOL = ATOL = 1e-4
rng = np.random.default_rng(0)


def r(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def check(uopc_fn, torch_fn, *arrays: np.ndarray, grad: bool = True) -> None:
    """Compare uopc_fn(*Tensors) with torch_fn(*tensors), and the gradients of sum(out * probe) to every input."""
    ts = [Tensor(a, requires_grad=grad) for a in arrays]
    tt = [torch.tensor(a, requires_grad=grad) for a in arrays]
    out, ref = uopc_fn(*ts), torch_fn(*tt)
    assert out.shape == tuple(ref.shape), (out.shape, tuple(ref.shape))
    grads = []
    if grad:  # the gradient graphs are built before out is realized (a realized tensor is a leaf)
        probe = r(*ref.shape)
        grads = (out * Tensor(probe)).sum().gradient(*ts)
        (ref * torch.tensor(probe)).sum().backward()
    Tensor.realize_all(out, *grads)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=RTOL, atol=ATOL)
    for g, u in zip(grads, tt, strict=True):
        np.testing.assert_allclose(g.numpy(), u.grad.numpy(), rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------------------------------------------
# convolution

CONV2D = [
    ((2, 3, 9, 11), (4, 3, 3, 3), {}),
    ((1, 3, 9, 11), (5, 3, 3, 2), {"padding": 1}),  # batch 1, non-square kernel
    ((2, 4, 9, 11), (6, 2, 3, 3), {"groups": 2, "padding": (1, 0)}),
    ((2, 4, 10, 11), (4, 1, 3, 3), {"groups": 4, "stride": 2}),  # depthwise, stride 2
    ((2, 3, 11, 9), (4, 3, 3, 3), {"dilation": 2, "padding": 2}),
    ((2, 3, 11, 9), (4, 3, 2, 3), {"stride": (2, 3), "dilation": (3, 1), "padding": (1, 2)}),
    ((2, 3, 9, 11), (4, 3, 4, 3), {"padding": "same"}),  # even kernel: the odd pad goes after
    ((2, 3, 9, 11), (4, 3, 3, 3), {"padding": "valid", "stride": 3}),
    ((1, 2, 7, 7), (3, 2, 1, 1), {}),  # 1x1: a GEMM over the input where it lies
    ((2, 6, 9, 11), (6, 2, 1, 1), {"groups": 3}),  # grouped 1x1 (a ShuffleNet's)
    ((2, 2, 7, 7), (3, 2, 1, 1), {"padding": 1}),  # padded 1x1: the padded copy
    ((2, 2, 8, 8), (3, 2, 2, 2), {"stride": 2}),  # non-overlapping windows
    # the input's phases (a stride-1 convolution over each phase's taps): a ResNet stem's 7x7 stride 2, odd sizes
    ((2, 3, 23, 18), (4, 3, 7, 7), {"stride": 2, "padding": 3}),
    ((1, 4, 15, 16), (6, 2, 7, 7), {"stride": 2, "groups": 2}),
    ((2, 2, 13, 14), (3, 2, 8, 7), {"stride": (2, 2), "padding": (0, 2)}),
    # 16 or more output channels per group and a reduction of 64 or more: the positions as the GEMM's rows, the
    # windows read in place (no im2col)
    ((2, 8, 9, 11), (17, 8, 3, 3), {"stride": 2, "padding": 1}),
    ((1, 16, 10, 9), (32, 8, 3, 3), {"stride": 2, "groups": 2, "dilation": 2, "padding": 2}),
    ((1, 12, 12, 13), (20, 12, 3, 2), {"stride": (2, 3), "padding": (1, 0)}),
    ((2, 3, 9, 9), (16, 3, 1, 1), {"stride": 2}),  # a ResNet's 1x1 downsampling
    ((2, 3, 15, 14), (32, 3, 3, 3), {"stride": 2, "padding": 1}),  # an RGB stem: a short reduction, im2col
    # one input channel per group (depthwise, a channel multiplier of 2, dilation, windows that do not overlap) at
    # stride 2: a direct loop over the windows
    ((2, 6, 13, 12), (6, 1, 3, 3), {"groups": 6, "stride": 2, "padding": 1}),
    ((1, 4, 11, 15), (8, 1, 5, 5), {"groups": 4, "stride": 2, "padding": 2}),
    ((1, 4, 11, 11), (4, 1, 3, 3), {"groups": 4, "stride": 2, "padding": 2, "dilation": 2}),
    ((2, 3, 8, 9), (3, 1, 2, 2), {"groups": 3, "stride": 2}),
    # ... and at stride 1: rows in one partial vector (12, 3 wide), a vector and a partial one (30), in gcc's vectors
    # (40 wide: 2 or more vectors of 16 lanes, 5 of 8)
    ((2, 6, 13, 12), (6, 1, 3, 3), {"groups": 6, "padding": 1}),
    ((1, 4, 9, 30), (8, 1, 5, 5), {"groups": 4, "padding": 2}),
    ((1, 4, 11, 11), (4, 1, 3, 3), {"groups": 4, "padding": 2, "dilation": 2}),
    ((2, 3, 7, 40), (3, 1, 3, 3), {"groups": 3, "padding": "same"}),
    ((1, 2, 5, 5), (2, 1, 3, 3), {"groups": 2}),
    ((1, 3, 6, 10), (3, 1, 4, 4), {"groups": 3, "padding": "same"}),  # even kernel: the odd pad after
    ((2, 1, 9, 17), (4, 1, 3, 3), {"padding": 1}),  # one input channel, 4 filters: the same loop (8: the GEMM)
]


@pytest.mark.parametrize("xs,ws,kw", CONV2D)
def test_conv2d(xs, ws, kw):
    b = r(ws[0])
    check(lambda x, w, b: x.conv2d(w, b, **kw), lambda x, w, b: F.conv2d(x, w, b, **kw), r(*xs), r(*ws), b)


@pytest.mark.parametrize("case", [0, 2, 4, 5, 13, 17, 18])
def test_conv2d_under_the_autotuner(case):
    # OPT=2 times candidate Opts for every kernel, the in-place GEMMs of the forward and both gradients included
    # (make test's second pass runs the whole module at OPT=0 with every index checked)
    xs, ws, kw = CONV2D[case]
    with Context(OPT=2):
        check(lambda x, w: x.conv2d(w, **kw), lambda x, w: F.conv2d(x, w, **kw), r(*xs), r(*ws))


@pytest.mark.parametrize(
    "xs,ws,kw",
    [
        ((2, 3, 13), (4, 3, 3), {"padding": 1}),
        ((1, 4, 11), (4, 2, 2), {"groups": 2, "stride": 2, "dilation": 2}),
        ((2, 3, 50), (5, 3, 7), {"stride": 2, "padding": 3}),  # over the phases
        ((2, 24, 21), (16, 24, 3), {"stride": 2, "padding": 1}),  # the positions as the GEMM's rows
        ((2, 4, 21), (8, 1, 5), {"groups": 4, "stride": 2, "padding": 2}),  # depthwise: a direct loop
        ((2, 4, 21), (4, 1, 5), {"groups": 4, "padding": 2}),  # ... at stride 1: the row in vectors
    ],
)
def test_conv1d(xs, ws, kw):
    check(lambda x, w: x.conv1d(w, **kw), lambda x, w: F.conv1d(x, w, **kw), r(*xs), r(*ws))


def test_a_7x7_stride_2_convolution_reads_its_input_in_place():
    # the input's 2 x 2 phases copied apart (a copy of the input, not of its windows), each tap reading its phase at
    # its shift: no kernel copies the 112 x 112 x 147 im2col matrix or its panels (ResNet-18's stem: ~6 ms of a 34
    # ms inference, then ~28 ms), and the GEMM multiplies the 3 x 7 x 7 taps of the kernel, not the 12 x 4 x 4 of
    # the phases taken as channels against the kernel padded to 8 x 8 (space to depth: 31% more multiply-adds)
    x, w = Tensor(r(1, 3, 32, 30)), Tensor(r(8, 3, 7, 7))
    with capture() as calls:
        out = x.conv2d(w, stride=2, padding=3).realize()
    kernels = [k for c in calls for k in c.cp.plan.kernels]
    names = [k.name for k in kernels]
    assert not any(n.endswith("_7_7") for n in names), names  # no kernel over the windows (im2col's are _3_7_7)
    (gemm,) = [k for k in kernels if k.op == "matmul"]
    outputs = int(np.prod([int(d) for d in gemm.name.split("_")[1:]]))  # 8 channels x the positions it computes
    assert gemm.flops == 2 * outputs * 3 * 7 * 7, (gemm.name, gemm.flops)
    ref = F.conv2d(torch.tensor(x.numpy()), torch.tensor(w.numpy()), stride=2, padding=3).numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mult", [1, 2])
def test_a_strided_depthwise_convolution_is_a_direct_loop(mult):
    # one input channel per group (a depthwise convolution, and a channel multiplier of 2): the stride and the
    # padding are the index arithmetic of one kernel's window loops, which read the input where it lies: no kernel
    # copies the windows (im2col's loops end in the 3 x 3 taps: _3_3_14_14) or the padded input (_30_30). No
    # register tile would reuse a load (the weight is the same over a tile, the input moves along both of its
    # axes): the window is unrolled whole, for gcc to vectorize the output's rows
    x, w = Tensor(r(2, 8, 28, 28)), Tensor(r(8 * mult, 1, 3, 3))
    with Context(OPT=1), capture() as calls:
        out = x.conv2d(w, stride=2, padding=1, groups=8).realize()
    kernels = [k for c in calls for k in c.cp.plan.kernels]
    assert len(kernels) == 1 and kernels[0].name.startswith("r_"), [k.name for k in kernels]
    assert kernels[0].opts.unroll == 9 and not kernels[0].opts.upcast, kernels[0].opts
    ref = F.conv2d(torch.tensor(x.numpy()), torch.tensor(w.numpy()), stride=2, padding=1, groups=8).numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("check_oob", [0, 1])
@pytest.mark.parametrize("width", [7, 14, 28, 56])
def test_a_depthwise_convolution_is_a_direct_loop_at_stride_1(width, check_oob):
    # MobileNetV2's depthwise 3x3, padding 1: one kernel reads the input where it lies, the padding a condition
    # (no padded copy _16_16 for the in-place GEMM). A row shorter than two vectors runs as vectors of the machine's
    # width, its last one partial, each tap's padding a mask on its lanes (gcc vectorizes only a row at least a
    # vector long, the rest in narrower vectors); a longer one is left to gcc. Under UOPC_CHECK_OOB each lane the
    # mask holds is read (and checked) alone; else the lanes are one vector read, which may stray into the guard
    # bytes around the buffer (its first and last rows' taps)
    from uopc.renderer.plan import kernel_unit
    from uopc.runtime.compiler import machine

    lanes = machine().vector_bytes // 4
    x, w = Tensor(r(2, 24, width, width)), Tensor(r(24, 1, 3, 3))
    with Context(OPT=1, CHECK_OOB=check_oob), capture() as calls:
        out = x.conv2d(w, padding=1, groups=24).realize()
        kernels = [k for c in calls for k in c.cp.plan.kernels]
        assert len(kernels) == 1 and kernels[0].name.startswith("r_"), [k.name for k in kernels]
        k = kernels[0]
        src = kernel_unit(k.ast, k.name).fn.body
    vectors = width < 2 * lanes
    assert k.opts.unroll == 9 and k.opts.upcast == ({4: lanes} if vectors else {}), k.opts
    assert ("i32x" in src) == vectors, src  # the taps' masks (a row of 7: in vectors of 8)
    assert ("for (int lane" in src) == (vectors and bool(check_oob)), src
    ref = F.conv2d(torch.tensor(x.numpy()), torch.tensor(w.numpy()), padding=1, groups=24).numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("check_oob", [0, 1])
@pytest.mark.parametrize("width,stride", [(7, 1), (28, 1), (28, 2), (15, 2)])
def test_a_window_reduce_takes_its_batchnorm_and_activation_as_an_epilogue(width, stride, check_oob):
    # MobileNetV2's depthwise 3x3 with BatchNorm (eval) and ReLU6: the kernel that sums each window applies the
    # per-channel scale and shift and the clamp to the sum before its one store (no elementwise kernel after it
    # writing the output again); so does a max pool with a per-channel affine and a ReLU after it
    from uopc.renderer.plan import kernel_unit

    x, w = Tensor(r(2, 24, width, width)), Tensor(r(24, 1, 3, 3))
    mean, var, gamma, beta = r(24), np.abs(r(24)) + 0.5, r(24), r(24)
    bn = [Tensor(a).reshape(1, 24, 1, 1) for a in (mean, var, gamma, beta)]
    with Context(OPT=1, CHECK_OOB=check_oob):
        with capture() as calls:
            y = x.conv2d(w, padding=1, stride=stride, groups=24)
            out = (((y - bn[0]) / (bn[1] + 1e-5).sqrt()) * bn[2] + bn[3]).relu6().realize()
        conv = [k for c in calls for k in c.cp.plan.kernels]
        with capture() as calls:  # (at stride 1 the pool reads a padded copy of its input, a kernel before it)
            pooled = (x.max_pool2d(3, stride, 1) * bn[2] + bn[3]).relu().realize()
        pool = [k for c in calls for k in c.cp.plan.kernels]
        srcs = [kernel_unit(k.ast, k.name).fn.body for k in (conv[-1], pool[-1])]
    assert len(conv) == 1 and conv[0].name.startswith("r_"), [k.name for k in conv]
    assert pool[-1].name.startswith("r_"), [k.name for k in pool]
    assert "6.0f" in srcs[0] and "0.0f" in srcs[1]  # the clamps, in the kernels that reduce
    ref = F.conv2d(torch.tensor(x.numpy()), torch.tensor(w.numpy()), padding=1, stride=stride, groups=24)
    ref = F.relu6(F.batch_norm(ref, *(torch.tensor(a) for a in (mean, var, gamma, beta)), eps=1e-5)).numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=RTOL, atol=ATOL)
    ref = F.max_pool2d(torch.tensor(x.numpy()), 3, stride, 1) * torch.tensor(gamma).reshape(1, 24, 1, 1)
    ref = F.relu(ref + torch.tensor(beta).reshape(1, 24, 1, 1)).numpy()
    np.testing.assert_allclose(pooled.numpy(), ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("check_oob", [False, True])
def test_a_stem_takes_its_batchnorm_and_the_max_pool_reads_the_product(check_oob):
    # ResNet's stem: a 7x7 stride-2 convolution, BatchNorm (eval), ReLU, a 3x3 stride-2 max pool padded with -inf.
    # The pool's windows read each activation 2.25 times, so it is stored once: unpadded, as the product's epilogue
    # (its positions cut and the padding are the pool's index arithmetic), not as a padded copy of its own (an
    # elementwise kernel that read the product and wrote 4 MB again): three kernels, the input's phases, the product
    # with its BatchNorm and ReLU, the pool
    x, w = Tensor(r(2, 3, 40, 38)), Tensor(r(16, 3, 7, 7))
    mean, var, gamma, beta = r(16), np.abs(r(16)) + 0.5, r(16), r(16)
    bn = [Tensor(a).reshape(1, 16, 1, 1) for a in (mean, var, gamma, beta)]
    with Context(OPT=1, CHECK_OOB=check_oob), capture() as calls:
        y = x.conv2d(w, padding=3, stride=2)
        out = (((y - bn[0]) / (bn[1] + 1e-5).sqrt()) * bn[2] + bn[3]).relu().max_pool2d(3, 2, 1).realize()
    kernels = [k for c in calls for k in c.cp.plan.kernels]
    ops = [k.op for k in kernels]
    assert len(kernels) == 3 and ops[1].startswith("matmul") and "sqrt" in ops[1] and ops[2].startswith("max"), ops
    ref = F.conv2d(torch.tensor(x.numpy()), torch.tensor(w.numpy()), padding=3, stride=2)
    ref = F.relu(F.batch_norm(ref, *(torch.tensor(a) for a in (mean, var, gamma, beta)), eps=1e-5))
    np.testing.assert_allclose(out.numpy(), F.max_pool2d(ref, 3, 2, 1).numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("width", [28, 14, 9])
def test_a_1x1_convolution_is_a_gemm_over_its_input_in_place(width):
    # a 1x1 kernel at stride 1 without padding: the GEMM reads the stored input where it lies and computes exactly
    # its positions (at 28x28, 784 of them, rounding up to whole tiles made the input a copy of its own, 832 per
    # channel, and left the BatchNorm and ReLU6 to a kernel after the product): one kernel, its epilogue included
    x, w = Tensor(r(2, 32, width, width)).realize(), Tensor(r(48, 32, 1, 1)).realize()
    mean, var, gamma, beta = r(48), np.abs(r(48)) + 0.5, r(48), r(48)
    bn = [Tensor(a).reshape(1, 48, 1, 1).realize() for a in (mean, var, gamma, beta)]
    with Context(OPT=1), capture() as calls:
        y = x.conv2d(w)
        out = (((y - bn[0]) / (bn[1] + 1e-5).sqrt()) * bn[2] + bn[3]).relu6().realize()
    kernels = [k for c in calls for k in c.cp.plan.kernels]
    assert [k.name for k in kernels] == [f"r_2_1_48_{width * width}"], [k.name for k in kernels]
    ref = F.conv2d(torch.tensor(x.numpy()), torch.tensor(w.numpy()))
    ref = F.relu6(F.batch_norm(ref, *(torch.tensor(a) for a in (mean, var, gamma, beta)), eps=1e-5)).numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("l2_share", [0.75, 1.5])
def test_a_strided_convolutions_im2col_is_read_in_place_where_it_fits_in_l2(l2_share):
    # with few output channels the windows are copied (im2col), and the GEMM's B is that copy (K = C*3*3 rows of
    # positions): packing it into panels would copy it again every call, so where it fits in L2 the microkernel reads
    # it where it is (one copy kernel); past L2 it is packed (two)
    from uopc.runtime.compiler import machine

    cin, cout = 32, ROWS_MIN_CHANNELS // 2
    side = int((l2_share * machine().l2_bytes / (cin * 9 * 4)) ** 0.5)  # output positions per side
    x, w = Tensor(r(1, cin, 2 * side, 2 * side)), Tensor(r(cout, cin, 3, 3))
    with Context(OPT=1), capture() as calls:
        out = x.conv2d(w, stride=2, padding=1).realize()
    names = [k.name for c in calls for k in c.cp.plan.kernels]
    assert len([n for n in names if n.startswith("e_")]) == (1 if l2_share < 1 else 2), names
    ref = F.conv2d(torch.tensor(x.numpy()), torch.tensor(w.numpy()), stride=2, padding=1).numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=RTOL, atol=ATOL)


def test_a_strided_convolution_with_a_short_reduction_copies_its_windows():
    # an RGB stem (3 -> 32 channels, 3x3 stride 2): 27 multiply-adds an output, so the GEMM is cheap and a
    # channels-last product read transposed by its BatchNorm and ReLU6 would be the cost; im2col's product is NCHW,
    # and the tail is its epilogue (the windows' copy e_1_3_3_3_15_15, then the GEMM)
    x, w = Tensor(r(1, 3, 30, 30)), Tensor(r(32, 3, 3, 3))
    with Context(OPT=1), capture() as calls:
        out = x.conv2d(w, stride=2, padding=1).relu6().realize()
    names = [k.name for c in calls for k in c.cp.plan.kernels]
    assert any("_3_3_3_15_15" in n for n in names) and len(names) == 2, names
    ref = F.relu6(F.conv2d(torch.tensor(x.numpy()), torch.tensor(w.numpy()), stride=2, padding=1)).numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=RTOL, atol=ATOL)


def test_a_strided_convolution_with_many_channels_reads_its_windows_in_place():
    # the output positions are the GEMM's rows and the channels its vector lanes: the input is copied once, padded
    # (e_1_8_31_31), and no kernel copies its windows (im2col's loops end in the 3 x 3 taps: _3_3_15_15); the product
    # is channels-last, (groups, batch * positions, channels) (r_1_225_32), and the consumer (here the relu) reads
    # it as NCHW (e_1_32_15_15)
    x, w = Tensor(r(1, 8, 29, 29)), Tensor(r(2 * ROWS_MIN_CHANNELS, 8, 3, 3))
    with Context(OPT=1), capture() as calls:
        out = x.conv2d(w, stride=2, padding=1).relu().realize()
    names = [k.name for c in calls for k in c.cp.plan.kernels]
    assert "e_1_8_31_31" in names and "r_1_225_32" in names, names
    assert not any("_3_3_" in n for n in names), names
    ref = F.conv2d(torch.tensor(x.numpy()), torch.tensor(w.numpy()), stride=2, padding=1).relu().numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=RTOL, atol=ATOL)


def test_conv3d():
    check(
        lambda x, w: x.conv3d(w, padding=1), lambda x, w: F.conv3d(x, w, padding=1), r(1, 2, 5, 6, 7), r(3, 2, 3, 3, 3)
    )
    kw = {"padding": 1, "groups": 2}  # depthwise: the direct loop, its rows in vectors
    check(lambda x, w: x.conv3d(w, **kw), lambda x, w: F.conv3d(x, w, **kw), r(1, 2, 5, 6, 7), r(2, 1, 3, 3, 3))


def test_conv2d_unbatched():
    check(lambda x, w: x.conv2d(w), lambda x, w: F.conv2d(x, w), r(3, 7, 9), r(2, 3, 3, 3))


@pytest.mark.parametrize(
    "xs,ws,kw",
    [
        ((2, 3, 5, 6), (3, 4, 3, 3), {}),
        ((1, 3, 5, 6), (3, 2, 3, 2), {"stride": 2, "padding": 1, "output_padding": 1}),
        ((2, 4, 5, 5), (4, 3, 3, 3), {"groups": 2, "stride": (2, 3), "dilation": 2}),
    ],
)
def test_conv_transpose2d(xs, ws, kw):
    check(
        lambda x, w, b: x.conv_transpose2d(w, b, **kw),
        lambda x, w, b: F.conv_transpose2d(x, w, b, **kw),
        r(*xs),
        r(*ws),
        r(ws[1] * kw.get("groups", 1)),
    )


def test_conv_errors():
    x = Tensor(r(1, 3, 8, 8))
    with pytest.raises(ValueError, match="input channels"):
        x.conv2d(Tensor(r(4, 2, 3, 3)))
    with pytest.raises(ValueError, match="groups"):
        x.conv2d(Tensor(r(4, 1, 3, 3)), groups=2)
    with pytest.raises(ValueError, match="larger than the padded input"):
        x.conv2d(Tensor(r(4, 3, 9, 9)))
    with pytest.raises(ValueError, match="same"):
        x.conv2d(Tensor(r(4, 3, 3, 3)), stride=2, padding="same")
    with pytest.raises(ValueError, match="stride"):
        x.conv2d(Tensor(r(4, 3, 3, 3)), stride=(1, 2, 3))


# ---------------------------------------------------------------------------------------------------
# pooling

POOL = [
    (3, None, 0, 1, False),
    (3, 2, 1, 1, False),
    (3, 2, 1, 1, True),
    ((2, 3), (1, 2), (1, 1), 1, True),
    (2, 1, 0, 2, False),  # dilation
    (2, 2, 0, 1, False),
]


@pytest.mark.parametrize("k,s,p,d,ceil", POOL)
def test_max_pool2d(k, s, p, d, ceil):
    check(
        lambda x: x.max_pool2d(k, s, p, d, ceil),
        lambda x: F.max_pool2d(x, k, s, p, d, ceil),
        r(2, 3, 9, 11),
    )


@pytest.mark.parametrize("k,s,p,d,ceil", POOL)
def test_max_pool2d_gradient_goes_to_the_first_maximum_of_each_window(k, s, p, d, ceil):
    # small integers: many ties within windows. PyTorch sends each window's gradient to its first maximum (not
    # shared among the ties); uopc's max_pool rule selects the argmax tap and adds the taps' parts up
    x = np.random.default_rng(2).integers(0, 3, (2, 3, 9, 11)).astype(np.float32)
    check(lambda x: x.max_pool2d(k, s, p, d, ceil), lambda x: F.max_pool2d(x, k, s, p, d, ceil), x)


def test_max_pool_gradient_of_a_computed_input():
    # the input is computed (fused into the pooling kernel): the rule compares stored values with their max,
    # so every window still finds its maximum (a recomputed value may round differently)
    check(lambda x: (x * 1.1 + 0.3).relu().max_pool2d(3, 2, 1), lambda x: F.max_pool2d(F.relu(x * 1.1 + 0.3), 3, 2, 1),
          r(2, 3, 9, 11))  # fmt: skip
    check(lambda x: x.max_pool3d(2), lambda x: F.max_pool3d(x, 2), r(1, 2, 5, 6, 7))


def test_a_pooled_activation_is_stored_once():
    # max pool's gradient rule stages its input (x.contiguous()), which the scheduler also stages for the forward
    # pool and the gradient's two readers: STAGE(STAGE(x)) was a second kernel copying the first one's buffer (the CNN
    # step's two pooled activations, 0.4 and 0.2 ms a step). reference: torch, forward and gradient
    xs = r(4, 8, 16, 16)
    x = Tensor(xs, requires_grad=True)
    with Context(OPT=1), capture() as calls:
        y = (x * 1.1 + 0.3).relu().exp().relu()  # read by enough kernels that the scheduler stages it
        out = y.max_pool2d(2) * 2.0
        (dx,) = out.sum().gradient(x)
        Tensor.realize_all(out, dx)
    ops = [k.op for c in calls for k in c.cp.plan.kernels]
    assert "copy" not in ops, ops
    xt = torch.tensor(xs, requires_grad=True)
    ot = F.max_pool2d(F.relu(F.relu(xt * 1.1 + 0.3).exp()), 2) * 2.0
    ot.sum().backward()
    np.testing.assert_allclose(out.numpy(), ot.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(dx.numpy(), xt.grad.numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("k,s,p,d,ceil", [c for c in POOL if c[3] == 1])
@pytest.mark.parametrize("include", [True, False])
def test_avg_pool2d(k, s, p, d, ceil, include):
    check(
        lambda x: x.avg_pool2d(k, s, p, ceil, include),
        lambda x: F.avg_pool2d(x, k, s, p, ceil, include),
        r(1, 2, 9, 11),
    )


# past the end of the input a ceil_mode window may run past the padding too: that part never counts
@pytest.mark.parametrize(
    "k,s,p,ceil,include",
    [(3, 2, 1, False, True), (2, 2, 0, True, True), (3, 2, 1, True, False), ((2, 3), (2, 2), (1, 1), True, True)],
)
def test_avg_pool2d_builds_its_graph_without_running_a_plan(k, s, p, ceil, include):
    # regression: avg_pool2d realized its divisors (.numpy()) while the graph was built: a plan compiled and ran
    # in the middle of graph construction, and a TinyJit capture recorded it
    x = r(2, 3, 9, 11)
    with capture() as calls:
        out = Tensor(x).avg_pool2d(k, s, p, ceil, include)
    assert calls == []
    ref = F.avg_pool2d(torch.tensor(x), k, s, p, ceil, include)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=RTOL, atol=ATOL)


def test_pool1d():
    check(lambda x: x.max_pool1d(3, 2, 1), lambda x: F.max_pool1d(x, 3, 2, 1), r(2, 3, 11))
    check(lambda x: x.avg_pool1d(3, 2, 1), lambda x: F.avg_pool1d(x, 3, 2, 1), r(2, 3, 11))


@pytest.mark.parametrize("size", [(1, 1), (3, 5), (4, 7), (2, None)])
def test_adaptive_avg_pool2d(size):
    check(lambda x: x.adaptive_avg_pool2d(size), lambda x: F.adaptive_avg_pool2d(x, size), r(2, 3, 8, 7))


# ---------------------------------------------------------------------------------------------------
# interpolate

INTERP = [
    ({"size": (5, 7)}, "nearest", None),
    ({"scale_factor": 2}, "nearest", None),
    ({"size": (13, 4)}, "nearest-exact", None),
    ({"size": (13, 4)}, "bilinear", False),
    ({"size": (13, 4)}, "bilinear", True),
    ({"scale_factor": (1.5, 0.5)}, "bilinear", False),
]


@pytest.mark.parametrize("arg,mode,ac", INTERP)
def test_interpolate(arg, mode, ac):
    check(
        lambda x: x.interpolate(**arg, mode=mode, align_corners=ac),
        lambda x: F.interpolate(x, **arg, mode=mode, align_corners=ac),
        r(2, 3, 6, 5),
    )


def test_interpolate_linear_1d():
    for ac in (False, True):
        check(
            lambda x: x.interpolate(size=9, mode="linear", align_corners=ac),
            lambda x: F.interpolate(x, size=9, mode="linear", align_corners=ac),
            r(2, 3, 5),
        )


def test_interpolate_errors():
    x = Tensor(r(1, 1, 4, 4))
    with pytest.raises(ValueError, match="exactly one"):
        x.interpolate()
    with pytest.raises(ValueError, match="not supported"):
        x.interpolate(size=3, mode="cubic")
    with pytest.raises(ValueError, match="does not fit"):
        x.interpolate(size=3, mode="linear")


# ---------------------------------------------------------------------------------------------------
# masking and attention


@pytest.mark.parametrize("diag", [0, 1, -2])
def test_tril_triu(diag):
    check(lambda x: x.tril(diag), lambda x: x.tril(diag), r(2, 5, 7))
    check(lambda x: x.triu(diag), lambda x: x.triu(diag), r(7, 5))


def test_masked_fill():
    m = rng.random((5, 1)) < 0.5
    check(lambda x: x.masked_fill(Tensor(m), -3.0), lambda x: x.masked_fill(torch.tensor(m), -3.0), r(5, 7))


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa(causal):
    check(
        lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=causal),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        r(2, 3, 5, 4),
        r(2, 3, 5, 4),
        r(2, 3, 5, 6),
    )


def test_sdpa_masks():
    bm = rng.random((5, 7)) < 0.7
    bm[:, 0] = True  # no all-masked row (NaN in both)
    fm = r(5, 7)
    for um, tm in ((Tensor(bm), torch.tensor(bm)), (Tensor(fm), torch.tensor(fm))):
        check(
            lambda q, k, v, um=um: q.scaled_dot_product_attention(k, v, attn_mask=um, scale=0.3),
            lambda q, k, v, tm=tm: F.scaled_dot_product_attention(q, k, v, attn_mask=tm, scale=0.3),
            r(3, 5, 4),
            r(3, 7, 4),
            r(3, 7, 2),
        )


def test_sdpa_dropout_keeps_expectation():
    q, k, v = Tensor(r(1, 64, 8)), Tensor(r(1, 64, 8)), Tensor(np.ones((1, 64, 8), np.float32))
    out = q.scaled_dot_product_attention(k, v, dropout_p=0.5).numpy()
    assert 0.8 < out.mean() < 1.2  # each row of weights sums to 1 in expectation; dropped ones are 0, kept ones 2x
    assert set(np.unique(q.scaled_dot_product_attention(k, v, dropout_p=1.0).numpy())) == {0.0}

"""Winograd convolutions F(2,3) and F(4,3) (uopc.uop.winograd, uopc.renderer.winograd) against PyTorch.

Tolerance: rtol 1e-3 of the output's scale (the issue's bound for Winograd); F(4,3)'s constants (up to 8 and 1/24)
round to ~1e-5 of it in float32, F(2,3) to ~1e-6 as the direct sum does. The cost rule is checked on the shapes it
was measured on, and every path (edge tiles, odd sizes, batches, views, gradients, kept weight transforms, index
checks, optimizer levels) runs with F(m,3) forced by the WINOGRAD setting.
"""

import numpy as np
import pytest

from uopc import Tensor, no_grad
from uopc.engine import realize
from uopc.helpers import Context
from uopc.opt.gemm import microkernel
from uopc.runtime.compiler import machine
from uopc.tensor.conv import _winograd_tile
from uopc.uop import UOp
from uopc.uop.winograd import MATRICES, winograd_in, winograd_out, winograd_weight

torch = pytest.importorskip("torch")
F = torch.nn.functional
rng = np.random.default_rng(0)


def _close(ours: np.ndarray, ref: np.ndarray, rtol: float = 1e-3) -> None:
    assert ours.shape == ref.shape
    err = np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert err <= rtol, f"max |diff| / max |ref| = {err:.2e} > {rtol}"


def _names() -> list[str]:
    names: list[str] = []
    realize.set_kernel_hook(lambda k, dt: names.append(k.name))
    return names


@pytest.fixture(autouse=True)
def _no_hook():
    yield
    realize.set_kernel_hook(None)


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize(
    "shape,cout,pad",
    [
        ((1, 8, 12, 12), 16, 1),  # whole tiles
        ((2, 5, 13, 11), 7, 1),  # odd sizes: the last tiles cut, batch 2
        ((3, 4, 9, 10), 6, 0),  # no padding
        ((1, 3, 7, 8), 5, 2),  # wider padding than the kernel's reach
        ((1, 6, 3, 3), 4, 1),  # one tile
        ((1, 2, 78, 77), 3, 1),  # more tiles than one output chunk (OUT_CHUNK): several, the last one shorter
        # fewer tiles than WINOGRAD_WIDE_T: the products as (alpha^2, T, K), transformed back by blocks of 16
        # channels over chunks of 16 tiles (two blocks; several chunks, the last one shorter; the last tiles cut)
        ((1, 4, 13, 11), 32, 1),
        ((1, 4, 26, 27), 32, 1),
    ],
)
def test_forward_matches_torch(m, shape, cout, pad):
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((cout, shape[1], 3, 3)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    names = _names()
    with Context(WINOGRAD=m):
        out = Tensor(x).conv2d(Tensor(w), Tensor(b), padding=pad).numpy()
    assert any(n.startswith("wi_") for n in names) and any(n.startswith("wo_") for n in names), names
    _close(out, F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), padding=pad).numpy())


@pytest.mark.parametrize("opt", [0, 1, 2])
def test_every_opt_level_and_index_checks(opt):
    x = rng.standard_normal((2, 6, 10, 9)).astype(np.float32)
    w = rng.standard_normal((5, 6, 3, 3)).astype(np.float32)
    ref = F.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy()
    for m in MATRICES:
        with Context(WINOGRAD=m, OPT=opt, CHECK_OOB=1):
            _close(Tensor(x).conv2d(Tensor(w), padding=1).numpy(), ref)


def test_input_that_is_a_view_or_computed():
    """A permuted slice (an affine view of a buffer, read in place), a transposed one (its rows read at a stride) and a
    computed input (staged first)."""
    big = rng.standard_normal((10, 2, 7, 12)).astype(np.float32)  # (H, N, C, W) around a slice
    w = rng.standard_normal((4, 7, 3, 3)).astype(np.float32)
    xt = torch.tensor(big).permute(1, 2, 0, 3)[:, :, 1:9, 2:11]
    for m in MATRICES:
        with Context(WINOGRAD=m):
            xu = Tensor(big).permute(1, 2, 0, 3)[:, :, 1:9, 2:11]
            _close(xu.conv2d(Tensor(w), padding=1).numpy(), F.conv2d(xt, torch.tensor(w), padding=1).numpy())
            _close((xu * 2).relu().conv2d(Tensor(w), padding=1).numpy(),
                   F.conv2d((xt * 2).relu(), torch.tensor(w), padding=1).numpy())  # fmt: skip
            # the image transposed: its rows' elements a whole (N, C, H) block apart, read at that stride
            xs = Tensor(big).permute(1, 2, 3, 0)[:, :, 1:10]
            ref = F.conv2d(torch.tensor(big).permute(1, 2, 3, 0)[:, :, 1:10], torch.tensor(w), padding=1)
            _close(xs.conv2d(Tensor(w), padding=1).numpy(), ref.numpy())


@pytest.mark.parametrize("m", [2, 4])
def test_gradients_match_torch(m):
    """The forward runs by Winograd; the gradients come from the convolution's own rule."""
    x = rng.standard_normal((2, 4, 9, 7)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    g = rng.standard_normal((2, 6, 9, 7)).astype(np.float32)
    with Context(WINOGRAD=m):
        xu, wu = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
        out = xu.conv2d(wu, padding=1)
        (out * Tensor(g)).sum().backward()
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ot = F.conv2d(xt, wt, padding=1)
    (ot * torch.tensor(g)).sum().backward()
    _close(out.numpy(), ot.detach().numpy())
    _close(xu.grad.numpy(), xt.grad.numpy(), 1e-4)
    _close(wu.grad.numpy(), wt.grad.numpy(), 1e-4)


def _bn_relu(conv, mean, var, gamma, beta, residual, relu, ones):
    """A BatchNorm in eval mode, a residual add and an activation: ResNet's block tail, in uopc or in torch."""
    sh = (1, -1, 1, 1)
    y = (conv - mean.reshape(sh)) * (var.reshape(sh) + 1e-5).rsqrt() * gamma.reshape(sh) + beta.reshape(sh)
    return relu(y + residual) if residual is not None else relu(y)


EPILOGUE_ACTS = {
    "relu": (lambda t: t.relu(), lambda t: t.relu()),
    "relu6": (lambda t: t.relu6(), lambda t: F.relu6(t)),
    "hardswish": (lambda t: t.hardswish(), lambda t: F.hardswish(t)),
    "silu": (lambda t: t.silu(), lambda t: F.silu(t)),  # (reads the transform's value twice)
}


@pytest.mark.parametrize("act", sorted(EPILOGUE_ACTS))
@pytest.mark.parametrize(
    "m,shape,cout",
    [
        (2, (2, 8, 18, 17), 6),  # many tiles: the row-by-row output transform, the last tiles cut
        (4, (1, 4, 13, 11), 32),  # few tiles: the products channel-minor, two blocks of 16 channels
        (4, (1, 3, 6, 9), 5),  # few tiles, channels no multiple of the block: row by row
    ],
)
@pytest.mark.parametrize("residual", [False, True])
def test_output_transform_computes_its_readers_elementwise_ops(m, shape, cout, act, residual):
    """The one kernel reading a Winograd output transform only at its own index (a BatchNorm in eval mode, a
    residual add, an activation) is its epilogue (uopc.schedule.epilogues.winograd_epilogues): no elementwise
    kernel runs after the transform, and the values are PyTorch's."""
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((cout, shape[1], 3, 3)).astype(np.float32)
    stats = [rng.standard_normal(cout).astype(np.float32) for _ in range(4)]
    stats[1] = np.abs(stats[1]) + 0.5  # the variance
    res = rng.standard_normal((shape[0], cout, *shape[2:])).astype(np.float32) if residual else None
    ours, theirs = EPILOGUE_ACTS[act]
    with Context(WINOGRAD=m, OPT=1), no_grad():  # (make test's second pass runs OPT=0: nothing is fused there)
        alone = _names()
        Tensor(x).conv2d(Tensor(w), padding=1).realize()
        names = _names()
        conv = Tensor(x).conv2d(Tensor(w), padding=1)
        out = _bn_relu(conv, *map(Tensor, stats), None if res is None else Tensor(res), ours, None).numpy()
    realize.set_kernel_hook(None)
    assert names == alone and names[-1].startswith("wo_"), (names, alone)  # the same kernels as the conv alone
    ct = F.conv2d(torch.tensor(x), torch.tensor(w), padding=1)
    ref = _bn_relu(ct, *map(torch.tensor, stats), None if res is None else torch.tensor(res), theirs, None)
    _close(out, ref.numpy())


@pytest.mark.parametrize("opt", [0, 1, 2])
def test_epilogue_at_every_opt_level_and_under_index_checks(opt):
    """Without an optimizer (OPT=0) nothing is fused: the transform and the elementwise kernel run apart; with one
    the transform takes the ops. Under UOPC_CHECK_OOB the epilogue's reads are checked as any kernel's."""
    x = rng.standard_normal((2, 6, 10, 9)).astype(np.float32)
    w = rng.standard_normal((16, 6, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    r = rng.standard_normal((2, 16, 10, 9)).astype(np.float32)
    ref = (F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), padding=1) + torch.tensor(r)).relu().numpy()
    for m in MATRICES:
        names = _names()
        with Context(WINOGRAD=m, OPT=opt, CHECK_OOB=1), no_grad():
            out = (Tensor(x).conv2d(Tensor(w), Tensor(b), padding=1) + Tensor(r)).relu().numpy()
        realize.set_kernel_hook(None)
        _close(out, ref)
        assert any(n.startswith("e_2_16_10_9") for n in names) == (opt == 0), names


def test_epilogue_reads_views_and_padded_values():
    """The epilogue's other reads go through views read along the output's rows: a slice of a larger buffer (its
    rows further apart), a padded one (its border reads are gated, never outside the buffer) and a per-row scale
    broadcast along the columns."""
    x = rng.standard_normal((1, 5, 12, 10)).astype(np.float32)
    w = rng.standard_normal((7, 5, 3, 3)).astype(np.float32)
    rs = rng.standard_normal((2, 9, 14, 13)).astype(np.float32)  # sliced
    rp = rng.standard_normal((1, 7, 10, 8)).astype(np.float32)  # padded by one on every side
    s = rng.standard_normal((12, 1)).astype(np.float32)
    names = _names()
    with Context(WINOGRAD=2, OPT=1), no_grad():
        conv = Tensor(x).conv2d(Tensor(w), padding=1)
        out = (conv * Tensor(s) + Tensor(rs)[1:, 2:, 1:13, 3:] - Tensor(rp).pad((1, 1, 1, 1))).numpy()
    realize.set_kernel_hook(None)
    assert names[-1].startswith("wo_") and not any(n.startswith("e_1_7") for n in names), names
    ct = F.conv2d(torch.tensor(x), torch.tensor(w), padding=1)
    ref = ct * torch.tensor(s) + torch.tensor(rs)[1:, 2:, 1:13, 3:] - F.pad(torch.tensor(rp), (1, 1, 1, 1))
    _close(out, ref.numpy())


def test_transform_read_otherwise_keeps_its_own_kernel():
    """What the epilogue rule leaves alone: the transform also an output of the plan, read by two kernels, read at
    another index than its own (transposed), or read beside a value read across the output's rows (a transposed
    residual). Each runs the transform and an elementwise kernel after it."""
    x = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    r = rng.standard_normal((1, 6, 9, 9)).astype(np.float32)
    ct = F.conv2d(torch.tensor(x), torch.tensor(w), padding=1)
    rt = torch.tensor(r).permute(0, 1, 3, 2)
    cases = {
        "an output too": (lambda c: [c, c.relu()], lambda c: [c, c.relu()]),
        "two readers": (lambda c: [c.relu(), c.sum((2, 3))], lambda c: [c.relu(), c.sum((2, 3))]),
        "transposed": (lambda c: [c.permute(0, 1, 3, 2) + c], lambda c: [c.permute(0, 1, 3, 2) + c]),
        "a transposed residual": (lambda c: [c + Tensor(r).permute(0, 1, 3, 2)], lambda c: [c + rt]),
    }
    for what, (ours, theirs) in cases.items():
        names = _names()
        with Context(WINOGRAD=2, OPT=1), no_grad():
            outs = ours(Tensor(x).conv2d(Tensor(w), padding=1))
            Tensor.realize_all(*outs)
        realize.set_kernel_hook(None)
        assert any(n.startswith("e_1_6_9_9") for n in names), (what, names)
        for o, ref in zip(outs, theirs(ct), strict=True):
            _close(o.numpy(), ref.numpy())


@pytest.mark.parametrize("size,tiles,gemm", [(26, 49, "r_36_49_32"), (38, 100, "r_36_32_100")])
def test_few_tiles_are_the_products_rows(size, tiles, gemm):
    """Fewer tiles than WINOGRAD_WIDE_T: the batched products have the tiles as rows, (36, T, K), where the
    output channels give the microkernel its wide columns; more tiles keep (36, K, T)."""
    x = rng.standard_normal((1, 4, size, size)).astype(np.float32)
    w = rng.standard_normal((32, 4, 3, 3)).astype(np.float32)
    names = _names()
    with Context(WINOGRAD=4), no_grad():
        out = Tensor(x).conv2d(Tensor(w), padding=1).numpy()
    realize.set_kernel_hook(None)
    _close(out, F.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy())
    assert (-(-size // 4)) ** 2 == tiles and gemm in names, names


def test_input_gradient_takes_the_cost_rule():
    """The input gradient of a 3x3 stride-1 convolution is one itself (the output gradient against the flipped,
    transposed weight): it runs by Winograd where the cost rule picks it for its shapes, as a forward convolution
    would, and matches PyTorch."""
    x = rng.standard_normal((2, 64, 16, 16)).astype(np.float32)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.05
    g = rng.standard_normal((2, 64, 16, 16)).astype(np.float32)
    m = _winograd_tile(Tensor(g), Tensor(w), (1, 1), (1, 1), [(1, 1), (1, 1)], 1, (16, 16))
    assert m is not None  # the rule takes these shapes (the test's premise)
    xu, wu = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    out = xu.conv2d(wu, padding=1).realize()
    names = _names()
    (dx,) = (out * Tensor(g)).sum().gradient(xu)
    dxn = dx.numpy()
    realize.set_kernel_hook(None)
    assert sum(k.startswith("wo_") for k in names) == 1 and sum(k.startswith("wi_") for k in names) == 1, names
    xt = torch.tensor(x, requires_grad=True)
    (F.conv2d(xt, torch.tensor(w), padding=1) * torch.tensor(g)).sum().backward()
    _close(dxn, xt.grad.numpy(), 1e-4)


def test_input_transform_writes_the_packed_panels_of_large_products():
    """Where the products' B (C x T per transformed point) outgrows half of L2 it is packed into NR-tile panels
    (uopc.opt.gemm): the input transform writes those panels itself, with no packing copy after it. Sized from
    this machine's L2; T not a multiple of the panel, so the last panel's tail is zeros."""
    from uopc.runtime.compiler import machine

    n = machine().l2_bytes // (16 * 9 * 4) + 3  # images of 3 x 3 tiles, 16 channels: C*T floats past L2/2
    x = rng.standard_normal((n, 16, 12, 12)).astype(np.float32)
    w = rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
    names = _names()
    with Context(WINOGRAD=4, OPT=1), no_grad():  # (the layout pass packs: an optimizer runs)
        out = Tensor(x).conv2d(Tensor(w), padding=1).numpy()
    realize.set_kernel_hook(None)
    _close(out, F.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy())
    wi = [k for k in names if k.startswith("wi_")]
    assert len(wi) == 1 and len(wi[0].split("_")) == 5, names  # wi_36_<panels>_16_<NR>: the panel layout
    assert not any(k.startswith("e_") for k in names), names


def test_input_transform_panels_space_their_points_apart_in_the_cache():
    """A tile is written to all alpha^2 points of the panels, one point's panels apart: where that stride is a
    multiple of more than SPREAD_BYTES modulo 4 KiB (ResNet-18's 14x14 layer at batch 1: 3 panels x 256 channels x
    6 tiles, 2 KiB), a channel slot more per panel block moves the points onto other L1 sets; the products never
    read it. The stride as winograd_panels lays it out, then the values of such a convolution (few tiles: its
    products take the tiles as rows, the panels as their A) against PyTorch."""
    from math import gcd

    from uopc.uop.winograd import ALIAS_BYTES, SPREAD_BYTES, _spread_slots, winograd_in, winograd_panels

    def spread(blocks: int, slots: int, panel: int) -> bool:
        return gcd(blocks * slots * panel * 4 % ALIAS_BYTES, ALIAS_BYTES) <= SPREAD_BYTES

    assert _spread_slots(3, 256, 6) > 256 and spread(3, _spread_slots(3, 256, 6), 6)
    assert _spread_slots(3, 512, 6) > 512 and spread(3, _spread_slots(3, 512, 6), 6)
    assert _spread_slots(3, 250, 6) == 250  # 18000 bytes: 1616 modulo 4 KiB, a multiple of 16 only
    v = winograd_in(Tensor.empty(1, 256, 14, 14).uop, 4, (1, 1), (14, 14))
    p = winograd_panels(v, 6)
    assert p.shape[:2] == (36, 3) and p.shape[2] > 256 and spread(3, p.shape[2], 6)
    x = rng.standard_normal((1, 256, 14, 14)).astype(np.float32)
    w = (rng.standard_normal((64, 256, 3, 3)) * 0.05).astype(np.float32)
    names = _names()
    with Context(WINOGRAD=4, OPT=1), no_grad():
        out = Tensor(x).conv2d(Tensor(w), padding=1).numpy()
    realize.set_kernel_hook(None)
    _close(out, F.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy())
    assert sum(k.startswith("wi_") for k in names) == 1, names


def test_panel_layouts_spread_the_points_for_every_stride():
    """Where no channel slot count can move the points apart (one slot's stride, blocks x panel floats, a multiple
    of 512 bytes: ResNet-18 at batch 32, whose 64-tile panels came in 98 blocks), a block more does; the fewest slots
    from the channels on that spread them, the fewest blocks from the tiles' on. (The slot search looped forever on
    the first kind, and ResNet-18's first call at batch 32 never returned; then its transforms took 3.5x their time
    with every point on a few L1 sets.)"""
    from math import gcd

    from uopc.uop.winograd import ALIAS_BYTES, SPREAD_BLOCKS, SPREAD_BYTES, _spread_panels, _spread_slots

    def spread(blocks: int, slots: int, panel: int) -> bool:
        return gcd(blocks * slots * panel * 4 % ALIAS_BYTES, ALIAS_BYTES) <= SPREAD_BYTES

    for blocks in range(1, 40):
        for panel in (6, 16, 48, 64):
            for c in (3, 64, 250, 256):
                slots = _spread_slots(blocks, c, panel)
                if any(spread(blocks, s, panel) for s in range(c, c + ALIAS_BYTES)):
                    assert slots >= c and spread(blocks, slots, panel), (blocks, c, panel, slots)
                    assert not any(spread(blocks, s, panel) for s in range(c, slots)), (blocks, c, panel, slots)
                else:
                    assert slots is None, (blocks, c, panel, slots)
                b, s = _spread_panels(blocks, c, panel)
                fits = [e for e in range(SPREAD_BLOCKS + 1) if _spread_slots(blocks + e, c, panel) is not None]
                assert (b, s) == (
                    (blocks + fits[0], _spread_slots(blocks + fits[0], c, panel)) if fits else (blocks, c)
                )
    assert _spread_panels(98, 64, 64) == (99, 65)  # ResNet-18's 56x56 layers at batch 32 (AVX-512's 64 columns)


def test_input_transform_panels_with_a_block_past_the_tiles():
    """An input transform whose panels take a block more than its tiles fill (_spread_panels: an even number of
    64-tile blocks of 16 channels) writes the tiles' panels and zeros the last one's tail, not the block past them;
    against PyTorch, with the sizes found from this machine's panel width and L2."""
    from math import gcd

    from uopc.runtime.compiler import machine
    from uopc.uop.winograd import ALIAS_BYTES, SPREAD_BYTES

    w = rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
    n = machine().l2_bytes // (16 * 9 * 4) + 3  # images of 3 x 3 tiles, 16 channels: C*T floats past L2/2
    for _ in range(2):  # the first run finds the panel width; the second takes a count of images that needs a block
        x = rng.standard_normal((n, 16, 12, 12)).astype(np.float32)
        names = _names()
        with Context(WINOGRAD=4, OPT=1), no_grad():
            out = Tensor(x).conv2d(Tensor(w), padding=1).numpy()
        realize.set_kernel_hook(None)
        _close(out, F.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy())
        (wi,) = [k for k in names if k.startswith("wi_")]
        blocks, slots, nr = map(int, wi.split("_")[2:])
        assert blocks >= -(-9 * n // nr) and gcd(blocks * slots * nr * 4 % ALIAS_BYTES, ALIAS_BYTES) <= SPREAD_BYTES
        # blocks of a width whose slots alone cannot spread them (its blocks x nr x 4 bytes a multiple of 512), and
        # whose tiles leave the last panel partly filled
        n = next(i for i in range(n, n + 4096) if -(-9 * i // nr) * nr * 4 % 512 == 0 and 9 * i % nr)
    assert blocks == -(-9 * n // nr) + 1, (wi, n)


def test_input_transform_streams_panels_larger_than_the_last_level_cache(monkeypatch):
    """Panels larger than STREAM_FRACTION of the last-level cache are written with non-temporal stores (they would
    not stay in it for the products). This machine with 64 KiB of L2 (so 60 images of 16 channels at 12x12 write
    panels: 34 KiB of B per product) and 1 MiB of L3 (their 1.2 MiB stream), then 64 MiB (they do not): the same
    values either way."""
    import dataclasses

    from uopc.opt.gemm import STREAM_FRACTION
    from uopc.renderer.plan import kernel_unit
    from uopc.runtime.compiler import machine

    n, w = 60, rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
    x = rng.standard_normal((n, 16, 12, 12)).astype(np.float32)
    panels = 36 * 16 * n * 9 * 4
    for l3 in (1 << 20, 64 << 20):
        small = dataclasses.replace(machine(), l2_bytes=1 << 16, l3_bytes=l3)
        monkeypatch.setattr(realize, "machine", lambda small=small: small)
        kernels: list = []
        realize.set_kernel_hook(lambda k, dt: kernels.append(k))
        with Context(WINOGRAD=4, OPT=1), no_grad():
            out = Tensor(x).conv2d(Tensor(w), padding=1).numpy()
        realize.set_kernel_hook(None)
        _close(out, F.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy())
        wi = [k for k in kernels if k.name.startswith("wi_")]
        assert len(wi) == 1 and wi[0].ast.src[0].arg.op.panel, [k.name for k in kernels]
        streams = panels > l3 * STREAM_FRACTION
        assert wi[0].ast.src[0].arg.op.stream is streams and streams is (l3 == 1 << 20)
        c = kernel_unit(wi[0].ast, wi[0].name).fn.body
        assert ("uopc_stream_floats(" in c) is streams and ("uopc_stream_fence()" in c) is streams


def test_the_7x7_layers_products_take_their_16_tiles_in_one_register_tile():
    """ResNet-18's 7x7 layers at batch 1: F(2,3) makes 16 tiles, the rows of products (16, 16, 512) over 512
    channels whose B, the transformed weight, is 1 MiB a point. The microkernel takes the 16 rows in one register
    tile (uopc.opt.gemm.microkernel: B streams once), and the input transform writes A as one 16-row panel
    (wi_16_1_...). Values against torch."""
    c = 512
    mr, _, _ = microkernel(16, c, 4, machine(), c, c * c * 4)
    x = rng.standard_normal((1, c, 7, 7)).astype(np.float32)
    w = rng.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.03
    names = _names()
    with Context(OPT=1, WINOGRAD=2), no_grad():  # (F(2,3), as the cost rule takes: test_cost_rule_on_resnet18_shapes)
        out = Tensor(x).conv2d(Tensor(w), padding=1).numpy()
    realize.set_kernel_hook(None)
    _close(out, F.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy())
    wi = [k for k in names if k.startswith("wi_16_")]
    assert len(wi) == 1 and wi[0].endswith(f"_{mr}") and wi[0].startswith(f"wi_16_{-(-16 // mr)}_"), names
    assert "r_16_16_512" in names, names


def test_weight_transform_writes_the_packed_panels_of_few_tile_products():
    """With few tiles the products are (36, T, K) and their B is the weight's transform U, packed into NR-column
    panels (uopc.opt.gemm): the weight transform writes those panels itself (ww_36_<panels>_<C>_<NR>), with no
    packing copy after it, forward and in the input gradient (whose weight is a flipped, transposed view). K = 72
    is no multiple of a panel: the last one's tail is zeros. One weight transform function serves every weight
    shape (its sizes are arguments)."""
    x = rng.standard_normal((1, 16, 14, 14)).astype(np.float32)
    w = rng.standard_normal((72, 16, 3, 3)).astype(np.float32) * 0.1
    g = rng.standard_normal((1, 72, 14, 14)).astype(np.float32)
    names = _names()
    with Context(WINOGRAD=4, OPT=1):  # (the layout pass packs: an optimizer runs)
        xu, wu = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
        out = xu.conv2d(wu, padding=1)
        (out * Tensor(g)).sum().backward()
        outn, dx = out.numpy(), xu.grad.numpy()
    realize.set_kernel_hook(None)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ot = F.conv2d(xt, wt, padding=1)
    (ot * torch.tensor(g)).sum().backward()
    _close(outn, ot.detach().numpy())
    _close(dx, xt.grad.numpy(), 1e-4)
    ww = sorted({k for k in names if k.startswith("ww_")})
    assert len(ww) == 2 and all(len(k.split("_")) == 5 for k in ww), names  # forward's and the input gradient's
    assert not any(k.startswith("e_36_") for k in names), names  # no packing copy of a transformed weight


def test_weight_transform_is_kept_until_the_weight_changes():
    """G w G^T (here after a scale folded into the weight: two kept kernels in a chain) runs once per weight: a later
    call of the same plan skips it, an assign of a new weight (or a new scale, which reaches the transform only
    through the fold) makes the next call transform again."""
    wn, sn = rng.standard_normal((8, 8, 3, 3)).astype(np.float32), np.float32([0.5] * 8)
    w, s = Tensor(wn).realize(), Tensor(sn).realize()

    def run() -> tuple[np.ndarray, set[str]]:
        names.clear()
        x = Tensor(rng.standard_normal((1, 8, 12, 12)).astype(np.float32))  # a new input: its transform runs
        with Context(WINOGRAD=4), no_grad():
            out = x.conv2d(w * s.reshape(8, 1, 1, 1), padding=1).numpy()
        ref = F.conv2d(torch.tensor(x.numpy()), torch.tensor(wn * sn.reshape(8, 1, 1, 1)), padding=1).numpy()
        _close(out, ref)
        return set(names)

    names = _names()
    assert any(n.startswith("ww_") for n in run())
    ran = run()
    assert any(n.startswith("wi_") for n in ran) and not any(n.startswith("ww_") for n in ran), ran
    wn = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    w.assign(Tensor(wn)).realize()
    assert any(n.startswith("ww_") for n in run())
    sn = np.float32([2.0] * 8)
    s.assign(Tensor(sn)).realize()
    assert any(n.startswith("ww_") for n in run())
    assert not any(n.startswith("ww_") for n in run())


def test_weight_transform_with_a_partial_last_panel_is_kept():
    """40 output channels make the few-tile products' B, the transformed weight, NR-column panels with a partial
    last one (NR = 32 on AVX-512, 16 on AVX2): the transform is still kept, not run again every call."""
    w = Tensor(rng.standard_normal((40, 16, 3, 3)).astype(np.float32) * 0.1).realize()
    names = _names()
    for call in range(3):
        names.clear()
        x = rng.standard_normal((1, 16, 28, 28)).astype(np.float32)
        with Context(WINOGRAD=4, OPT=1), no_grad():
            out = Tensor(x).conv2d(w, padding=1).numpy()
        _close(out, F.conv2d(torch.tensor(x), torch.tensor(w.numpy()), padding=1).numpy())
        assert any(n.startswith("wi_") for n in names), names
        assert any(n.startswith("ww_") for n in names) == (call == 0), (call, names)


def test_cost_rule_on_resnet18_shapes():
    """F(4,3) at 56 and 28 pixels; F(2,3) at 14 and 7 at batch 1 (at 7, F(4,3) would have 4 tiles: too few
    columns for the GEMM; at 14, its transformed weight, 36 x 256 x 256 floats read every call, outweighs the
    multiply-adds it saves over F(2,3)'s 16 x 256 x 256), F(4,3) at 14 and 7 at batch 8; the direct GEMM for a
    1-channel input, a tiny image, strides, dilation, groups, other kernels and half floats."""

    def pick(n, c, k, size, **kw):
        x, w = (
            Tensor.empty(n, c, size, size),
            Tensor.empty(k, c // kw.get("groups", 1), kw.get("ks", 3), kw.get("ks", 3)),
        )
        st, dl = (kw.get("stride", 1),) * 2, (kw.get("dilation", 1),) * 2
        outs = [(size + 2 - 2 * dl[0] - 1) // st[0] + 1] * 2
        return _winograd_tile(x, w, st, dl, [(1, 1), (1, 1)], kw.get("groups", 1), outs)

    with Context(WINOGRAD=1):
        assert [pick(1, c, c, s) for c, s in ((64, 56), (128, 28), (256, 14), (512, 7))] == [4, 4, 2, 2]
        assert pick(8, 512, 512, 7) == 4  # at batch 8 the 7x7 layers have 32 tiles
        assert pick(8, 256, 256, 14) == 4  # ...and the transformed weight is read once for 8 images
        # the direct GEMM computes every column of the padded width (896 positions for 28x28's 784 outputs): the
        # conv benchmark's forward takes F(4,3) though its 32 input channels make short products
        assert pick(64, 32, 64, 28) == 4
        assert pick(1, 1, 32, 28) is None and pick(1, 16, 16, 4) is None
        assert pick(1, 64, 64, 56, stride=2) is None and pick(1, 64, 64, 56, dilation=2) is None
        assert pick(1, 64, 64, 56, groups=2) is None and pick(1, 64, 64, 56, ks=5) is None
    with Context(WINOGRAD=0):
        assert pick(1, 64, 64, 56) is None
    with Context(WINOGRAD=3), pytest.raises(ValueError, match="WINOGRAD"):
        pick(1, 64, 64, 56)


def test_trained_weight_counts_its_transform():
    """A weight that requires grad changes every step, so its transform's traffic joins the cost: a 16-channel
    convolution on a tiny batch takes the direct GEMM when trained and Winograd for inference."""
    x = Tensor.empty(1, 256, 7, 7)
    outs = [7, 7]
    with Context(WINOGRAD=1):
        assert _winograd_tile(x, Tensor.empty(256, 256, 3, 3), (1, 1), (1, 1), [(1, 1)] * 2, 1, outs) == 2
        wt = Tensor.empty(256, 256, 3, 3, requires_grad=True)
        assert _winograd_tile(x, wt, (1, 1), (1, 1), [(1, 1)] * 2, 1, outs) is None


def test_bad_transform_arguments_raise():
    x = UOp.empty((1, 2, 5, 5)) if hasattr(UOp, "empty") else Tensor.empty(1, 2, 5, 5).uop
    with pytest.raises(ValueError, match="F\\(3, 3\\)"):
        winograd_in(x, 3, (1, 1), (5, 5))
    with pytest.raises(ValueError, match="pads"):
        winograd_in(x, 2, (-1, 1), (5, 5))
    with pytest.raises(ValueError, match="weight must be"):
        winograd_weight(x, 4)
    with pytest.raises(ValueError, match="do not make"):
        winograd_out(winograd_in(x, 2, (1, 1), (5, 5)), 2, (3, 3), (1, 2, 5, 5))  # (C, 16, T): not (16, K, T)

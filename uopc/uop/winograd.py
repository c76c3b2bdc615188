"""Winograd's minimal filtering F(m x m, 3 x 3): the transform matrices and the WINOGRAD nodes (ops.Winograd).

A 3x3 convolution of stride 1 computes each m x m tile of outputs from an alpha x alpha tile of inputs
(alpha = m + 2) as

    Y = A^T [ (G w G^T) . (B^T d B) ] A        (. elementwise, summed over input channels)

so the (alpha^2, K, C) x (alpha^2, C, tiles) products replace 9 multiply-adds per output by alpha^2 / m^2 of them
(F(2,3): 16/4 = 4, 2.25x fewer; F(4,3): 36/16 = 2.25, 4x fewer), at the cost of the two transforms and of a larger
rounding error (F(4,3)'s constants reach 8 and 1/24: about 1e-5 of the output's scale in float32, where the direct
sum gives 1e-6). uopc.tensor.conv chooses it; the matrices are Lavin and Gray's ("Fast Algorithms for
Convolutional Neural Networks", 2015), points 0, +-1, +-2 and infinity for F(4,3).
"""

from __future__ import annotations

import math
from fractions import Fraction as Fr

from uopc.uop.ops import ALU, Ops, Winograd
from uopc.uop.uop import UOp

__all__ = ["MATRICES", "winograd_in", "winograd_of", "winograd_panels", "winograd_out", "winograd_weight"]

# m -> (B^T: alpha x alpha, G: alpha x 3, A^T: m x alpha), exact
MATRICES: dict[int, tuple[tuple[tuple[Fr, ...], ...], ...]] = {
    2: (
        ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
        ((1, 0, 0), (Fr(1, 2), Fr(1, 2), Fr(1, 2)), (Fr(1, 2), Fr(-1, 2), Fr(1, 2)), (0, 0, 1)),
        ((1, 1, 1, 0), (0, 1, -1, -1)),
    ),
    4: (
        (
            (4, 0, -5, 0, 1, 0),
            (0, -4, -4, 1, 1, 0),
            (0, 4, -4, -1, 1, 0),
            (0, -2, -1, 2, 1, 0),
            (0, 2, -1, -2, 1, 0),
            (0, 4, 0, -5, 0, 1),
        ),
        (
            (Fr(1, 4), 0, 0),
            (Fr(-1, 6), Fr(-1, 6), Fr(-1, 6)),
            (Fr(-1, 6), Fr(1, 6), Fr(-1, 6)),
            (Fr(1, 24), Fr(1, 12), Fr(1, 6)),
            (Fr(1, 24), Fr(-1, 12), Fr(1, 6)),
            (0, 0, 1),
        ),
        ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1)),
    ),
}


def _check(m: int, tiles: tuple[int, int]) -> int:
    if m not in MATRICES:
        raise ValueError(f"winograd: F({m}, 3) is not known (m is one of {sorted(MATRICES)})")
    if len(tiles) != 2 or min(tiles) < 1:
        raise ValueError(f"winograd: tiles must be two positive counts, got {tiles}")
    return m + 2


def winograd_weight(w: UOp, m: int) -> UOp:
    """G g G^T of every 3x3 filter g of the weight w (K, C, 3, 3): (alpha^2, K, C), the GEMMs' left operands."""
    if len(w.shape) != 4 or tuple(w.shape[2:]) != (3, 3) or not all(isinstance(d, int) for d in w.shape):
        raise ValueError(f"winograd: the weight must be (K, C, 3, 3), got {w.shape}")
    a = _check(m, (1, 1))
    return UOp(Ops.WINOGRAD, (w,), Winograd("w", m, (1, 1), (a * a, *w.shape[:2])), w.dtype)


def winograd_in(x: UOp, m: int, pads: tuple[int, int], out: tuple[int, int]) -> UOp:
    """B^T d B of every alpha x alpha input tile d of x (N, C, H, W), zero-padded by `pads` = (top, left) and as far
    past its end as the tiles reach: (C, alpha^2, N * th * tw), the th x tw tiles of m x m outputs that cover `out`
    = (OH, OW), the output of the 3x3 convolution."""
    if len(x.shape) != 4 or not all(isinstance(d, int) for d in x.shape) or len(pads) != 2 or min(pads) < 0:
        raise ValueError(f"winograd: input must be (N, C, H, W) with two pads >= 0, got {x.shape} and {pads}")
    N, C, H, W = x.shape
    if len(out) != 2 or min(out) < 1:
        raise ValueError(f"winograd: the output size must be two positive counts, got {out}")
    tiles = (-(-out[0] // m), -(-out[1] // m))
    a = _check(m, tiles)
    shape = (C, a * a, N * tiles[0] * tiles[1])
    return UOp(Ops.WINOGRAD, (x,), Winograd("in", m, tiles, shape, tuple(pads)), x.dtype)


def winograd_panels(v: UOp, panel: int, stream: bool = False) -> UOp:
    """A transform writing its result as a GEMM's packed operand, (alpha^2, ceil(R/panel), C, panel): panels of
    `panel` consecutive rows R for every channel C, the rows past R zeros (an input transform's: a few more blocks
    and channel slots, never read, where they space its points apart in the cache: _spread_panels). For the input
    transform `v` (winograd_in's node, (C, alpha^2, T)) the rows are its tiles: the packed B of products (alpha^2,
    K, T). For the weight transform (winograd_weight's, (alpha^2, K, C)) they are its filters: the packed B of products
    (alpha^2, T, K), the few-tile form (uopc.tensor.conv). `stream`: the input transform writes them with
    non-temporal stores (Winograd.stream)."""
    if v.op is not Ops.WINOGRAD or v.arg.kind not in ("in", "w") or v.arg.panel or panel < 1:
        raise ValueError(f"winograd: panels of {panel} rows need a weight or input transform in its own layout: {v.op}")
    if v.arg.kind == "in":
        C, a2, R = v.shape
    else:
        a2, R, C = v.shape
    if stream and v.arg.kind != "in":
        raise ValueError("winograd: only an input transform's panels are streamed")
    blocks, slots = -(-R // panel), C
    if v.arg.kind == "in":
        blocks, slots = _spread_panels(blocks, C, panel)
    arg = v.arg._replace(shape=(a2, blocks, slots, panel), panel=panel, stream=stream)
    return UOp(Ops.WINOGRAD, v.src, arg, v.dtype)


# addresses a multiple of ALIAS_BYTES apart share an L1 set (4 KiB: 64 sets of 64-byte lines, every current x86
# core); points whose stride is a multiple of at most SPREAD_BYTES modulo that fall on 16 or more sets
ALIAS_BYTES, SPREAD_BYTES = 4096, 256


def _spread_slots(blocks: int, C: int, panel: int) -> int | None:
    """The channel slots of an input transform's panels, C or a few more: a tile is written to all alpha^2 points,
    blocks * slots * panel floats apart, and where that stride is a multiple of more than SPREAD_BYTES modulo 4 KiB
    the points' stores share a few L1 sets and evict each other before their lines fill (ResNet-18's 14x14 layers at
    batch 1: 3 * 256 * 6 floats, 2 KiB modulo 4 KiB; its 7x7 ones 0). A slot more per panel block moves the points
    a little apart; the products never read it (uopc.opt.gemm shrinks it away). In a C harness, the 14x14
    transform (256 channels, 16 tiles) took 0.052 ms with the points 64 bytes off that stride, 0.125 on it. None
    where no count does (a slot's own stride, blocks * panel floats, a multiple of 2 * SPREAD_BYTES modulo 4 KiB:
    every count's is too); the strides modulo 4 KiB repeat every 4 KiB / gcd(that stride, 4 KiB) counts, so the
    search stops there."""
    step = blocks * panel * 4  # bytes between two counts' strides
    for slots in range(C, C + ALIAS_BYTES // math.gcd(step, ALIAS_BYTES)):
        if math.gcd(blocks * slots * panel * 4 % ALIAS_BYTES, ALIAS_BYTES) <= SPREAD_BYTES:
            return slots
    return None


# ...and at most this many panel blocks more than the tiles fill, where no slot count spreads the points
SPREAD_BLOCKS = 3


def _spread_panels(blocks: int, C: int, panel: int) -> tuple[int, int]:
    """(blocks, slots) of an input transform's panels: the tiles' blocks, or up to SPREAD_BLOCKS more where no slot
    count spreads the points with those (_spread_slots), and the fewest slots that do; (blocks, C) where none does.
    The blocks past the tiles are never written or read (the products read ceil(T/panel) of them). ResNet-18 at batch
    32: its 56x56 layers' 6272 tiles make 98 panels of 64, one slot 98 * 64 floats (512 bytes modulo 4 KiB) apart,
    so every count of slots put the 36 points within 8 L1 sets: 14-15 ms for each input transform, where the same
    layers took 0.8-1.2 ms at batch 8 (a quarter of the tiles, written as V, not as panels). With 99 blocks
    and 65 slots 9.9-12.9 ms (the four: 57.8 -> 43.9 ms, of the model's ~340)."""
    for extra in range(SPREAD_BLOCKS + 1):
        if (slots := _spread_slots(blocks + extra, C, panel)) is not None:
            return blocks + extra, slots
    return blocks, C


def winograd_out(y: UOp, m: int, tiles: tuple[int, int], shape: tuple[int, int, int, int]) -> UOp:
    """A^T y A of every tile y of the products y (alpha^2, K, N * th * tw): the convolution's output `shape`
    (N, K, OH, OW), OH <= th * m and OW <= tw * m (the last tiles' extra outputs are not stored)."""
    a = _check(m, tiles)
    N, K, OH, OW = shape
    if y.shape != (a * a, K, N * tiles[0] * tiles[1]) or OH > tiles[0] * m or OW > tiles[1] * m:
        raise ValueError(f"winograd: products {y.shape} with {tiles} tiles of F({m}, 3) do not make {shape}")
    return UOp(Ops.WINOGRAD, (y,), Winograd("out", m, tiles, tuple(shape)), y.dtype)


def winograd_of(body: UOp) -> UOp | None:
    """The WINOGRAD node a kernel body computes: the body itself, or the output transform whose epilogue the body's
    elementwise ops are (uopc.schedule.epilogues.winograd_epilogues); None for any other body."""
    if body.op is Ops.WINOGRAD:
        return body
    if body.op not in ALU:
        return None
    return next((u for u in body.toposort() if u.op is Ops.WINOGRAD), None)

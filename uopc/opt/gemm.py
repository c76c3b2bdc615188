"""Matmul-like reductions: operand packing in the layout pass, the register-blocked microkernel's Opts, split-K.

    C = A @ B  (sum over k of a*b, a constant along N, b constant along M)     becomes at most three kernels:
      STAGE  Bp[jb, k, jj] = B[k, jb*NR+jj]     NR columns of B interleaved by k: one contiguous panel per column
                                                block (when B is strided along N, or larger than half of L2)
      STAGE  Ap[ib, k, ii] = A[ib*MR+ii, k]     the same for A, only when A is computed (a plain view of memory
                                                is read where it is: one broadcast per row and k)
      r_M_N  Opts(upcast={M: MR, N: NR}, vec=W, thread=M, tile={M: MC, N: NC}, ktile=KC): an MR x NR tile of
             accumulators in vector registers; per k, NR/W vector loads of B, MR broadcasts of A, MR*NR/W FMAs

Transposed operands (a backward pass's X.T @ dY, dY @ W.T) and batched matmuls take the same path: the packing copy
reads whatever view the operand is. A remainder of M or N that is not a multiple of the tile runs as its own loop
nest (uopc.codegen.loops.regions; N's in whole vectors, the last masked); only the packed panels are padded.
"""

from __future__ import annotations

from uopc.helpers import prod
from uopc.machine import Machine
from uopc.opt.opts import Opts
from uopc.opt.strides import last_axis_stride, operand_views, push_views
from uopc.uop import ALU, COMPARE, LOGIC, MOVEMENT, STORED, VECTOR_MATH, Ops, UOp, epilogue_reduce
from uopc.uop.dtype import dtypes
from uopc.uop.indexing import affine_view
from uopc.uop.rewrite import graph_rewrite
from uopc.uop.variable import symbolic
from uopc.uop.winograd import winograd_panels

# below this many multiply-adds the two packing kernels cost more than the microkernel saves
GEMM_MIN_WORK = 1 << 16
# split-K: an output of at most this many elements over a reduction this long gets its reduction split
SPLITK_MAX_OUT = 4096
SPLITK_MIN_K = 8192
# the chunk of K one pass of the microkernel runs over (from the divisors of K in this range)
KC_MIN, KC_MAX = 96, 384
# a product with fewer rows than this is skinny (a decode step's): its tile is its rows (microkernel), and a
# computed B is not packed for it (uses_microkernel)
SKINNY_ROWS = 6
# the most vectors of accumulators per row of a skinny output
SKINNY_VECTORS = 8
# a product with at most this many rows over a long K and a large B takes them all in one register tile (microkernel)
FEW_ROWS = 16
# ... and one of at most this many row tiles over such a B takes rows that divide it rather than leave a remainder
FEW_TILES = 8
# where B outgrows the last-level cache, an output this many times wider than tall (or one whose A fits in L2)
# shares its columns among threads, not its rows (gemm_opts)
WIDE_N = 8
# ... when its NR-column tiles share out among the threads this evenly (the even share over the busiest one's)
COLUMN_BALANCE = 7 / 8
# A B larger than L2 that at most this many register tiles read per block (a Winograd product's 16 tiles as rows, a
# weight gradient's 36-row blocks, GPT-2's 128-token projections) comes from memory for little work per byte: its
# loads also prefetch FAR_PREFETCH_BYTES ahead into L2 (Opts.prefetch; the renderer's near prefetch,
# uopc.renderer.prefetch.PREFETCH_BYTES, runs for every kernel). On the Xeon VM, one process, interleaved, against the
# near prefetch alone: ResNet-18 batch 1 0.93x, batch 8 0.99x, the conv forward + backward 0.94x, GPT-2's forward
# 0.94x, the CNN and char-GPT steps, MobileNetV2 and 1024^3 0.99-1.01x; 12 pairs of (768 x 3072, 3072 x 768) weights
# (226 MB) after 4 and 32 rows 0.82x and 0.80x, after one row 1.04x (a GEMV, one FMA per load, already at the
# memory's bandwidth: not taken). For every microkernel, 1024^3 (171 tiles a block) ran 1.04-1.09x slower: a block
# read by many tiles from L2 pays the prefetches once per tile. 8 KiB ahead gained less than 16.
FAR_PREFETCH_BYTES = 16384
FAR_PREFETCH_TILES = 32


def matmul_operands(r: UOp) -> tuple[UOp, UOp] | None:
    """(a, b) when `r` reduces a*b over the last axis of (..., M, N, K) with a constant along N and b along M."""
    if r.op is not Ops.REDUCE or r.arg != (Ops.ADD, 1) or not r.dtype.is_float or r.dtype.itemsize < 4:
        return None
    x = r.src[0]
    if x.op is not Ops.MUL or len(x.shape) < 3 or symbolic(x.shape):  # panels split every axis
        return None
    for a, b in (x.src, x.src[::-1]):
        if _constant_along(a, -2) and _constant_along(b, -3):
            return a, b
    return None


def _constant_along(x: UOp, axis: int) -> bool:
    """Does every view feeding `x` read the same element all along `axis`?"""
    views = list(operand_views(x))
    return bool(views) and all(last_axis_stride(v, b, axis) == 0 for v, b in views)


def _plain(x: UOp, contiguous_axis: int | None) -> bool:
    """Is `x` a view of memory (no computation, no PAD gate), unit-stride along `contiguous_axis` if given?"""
    if x.op not in MOVEMENT and x.op not in STORED:
        return False
    views = list(operand_views(x))
    if not views or any(last_axis_stride(v, b) is None for v, b in views):
        return False
    return contiguous_axis is None or all(last_axis_stride(v, b, contiguous_axis) == 1 for v, b in views)


def _rereads(x: UOp) -> bool:
    """Does operand `x` read each stored element several times over its own (not broadcast) axes? A convolution's
    overlapping windows do (every tap reads the input again): packing such an operand would copy each element once
    per read, so it is read in place."""
    for v, b in operand_views(x):
        logical = prod(s for a, s in enumerate(v.shape) if last_axis_stride(v, b, a) != 0)
        if logical < 2 * prod(b.shape):
            return False
    return True


def _copied_per_call(b: UOp, machine: Machine) -> bool:
    """Is B an intermediate of this graph that fits in L2? Its pack would be a copy every call (a stored weight's is
    kept across calls), so it is read in place: a strided convolution's im2col (K x positions). On a Zen 4 (1 MiB of
    L2), 256x1152 @ 1152x196 ran 0.55-0.56 ms in place against 0.62-0.66 from panels (the pack kept, not counted);
    a B larger than L2 ran slower in place (64x2048 @ 2048x256, char-GPT's: 0.39-0.42 against 0.32 ms plus its pack):
    each KC x NR panel then reads its NR columns out of cache lines it shares with the other panels' columns."""
    if prod(b.shape[-2:]) * b.dtype.itemsize > machine.l2_bytes:
        return False
    return all(base.op in (Ops.STAGE, Ops.REDUCE) for _, base in operand_views(b))


def _stored_bytes(r: UOp) -> int:
    """The bytes matmul `r`'s B operand reads from memory: its buffers (a convolution's input read in place is its
    own size, not K x N)."""
    ops = matmul_operands(r)
    if ops is None:
        return 0
    return sum(prod(base.shape) * base.dtype.itemsize for _, base in operand_views(ops[1]))


def _b_bytes(r: UOp, stored: int) -> int:
    """The bytes of memory one product of matmul `r` (..., M, N, K) reads for B: its buffers' (`stored`,
    _stored_bytes) over the batch's products (0 for a symbolic batch)."""
    batch = r.src[0].shape[:-3]
    return stored // prod(batch) if all(type(v) is int for v in batch) else 0


def microkernel(m: int, n: int, itemsize: int, machine: Machine, k: int = 0, b_bytes: int = 0) -> tuple[int, int, int]:
    """(MR, NR, W): the register tile of an (m, n) output over a reduction of `k` (0: not known) whose B operand reads
    `b_bytes` of memory per product (0: not known; _b_bytes), and the vector width in elements, for `machine`'s
    vector registers (_tile).

    Few rows (at most FEW_ROWS) that _tile would split into row tiles, over a long K (KC_MIN or more) and a B of a
    quarter of L2 or more per product, take one tile of every row instead, as many vectors wide as the register file
    has accumulators for. B then streams once, at m FMAs a load; in MR-row tiles the first tile read each panel from
    memory at MR FMAs a load (its loads waiting on memory while the FMAs idle) and the others from L2 after it (the
    FMAs running while memory idles). ResNet-18's 7x7 Winograd products at batch 1 (16 tiles x 512 @ 512 x 512 at
    16 points, 1 MiB of transformed weights each), 6x64 tiles (rows 6 + 6 + 4) against 16x32 (32 accumulators, 3 of
    them kept on the stack), the three in separate processes: 2.13-2.21 against 1.71-2.08 ms, their input transforms
    (which write A in MR-row panels) 0.17-0.19 against 0.08; in ResNet-50 1.75-1.93 against 1.58-1.63 (in one
    process, interleaved: 16x16 2.71 ms, 16x48 2.80, both slower). GPT-2's forward over a 16-token prompt the same
    (28.2-29.5 ms against 28.5-28.9); built for AVX2 (16 registers: 16x8 tiles, against 6x16) 49.4-51.4 against
    36.8-37.4 ms. (In one process two variants' weights share the caches: there the 7x7 products looked 0.967x of
    ResNet-18's time, GPT-2 over 16 tokens 0.960x.) Not where K is short or B small, in L1, where the tile's stores are
    what it waits on: MobileNetV2's first projection at batch 8 (16 x 32 @ 32 x 12544, 1.6 MB of B an image) 0.76 ->
    1.09 ms, the CNN step's 16-filter convolution (16 x 288 @ 288 x 224 over 128 images, read in place from 37 KB an
    image) 0.82 -> 0.94 ms so."""
    mr, nr, w = _tile(m, n, itemsize, machine, k)
    if type(m) is int and mr < m <= FEW_ROWS and k >= KC_MIN and b_bytes >= machine.l2_bytes // 4:
        return m, max(1, min(machine.vector_registers // m, n // w)) * w, w
    if type(m) is int and m % mr and m // mr <= FEW_TILES and b_bytes > machine.l2_bytes:
        # the rows past the tiles' multiple run in a remainder region of their own (one tile of those rows), which
        # streams all of B again, from memory where B outgrows L2, for a few rows' FMAs a load: against a few tiles,
        # a large part of the time (49 rows: 8 tiles and a pass for one row). So a tile whose rows divide m instead,
        # as many accumulators as the budget holds, down to 2/3 of a full tile's rows (fewer columns, where a column
        # remainder reads only A again). ResNet-50's stride-2 product over 7x7
        # outputs at batch 1 (49 positions x 4608 @ 4608 x 512, 9.4 MB of weights) as 6x64 tiles and a one-row pass
        # against 7x48, in separate processes: 1.26-1.33 against 1.04-1.09 ms; ResNet-18's (x 2304, 4.7 MB) 0.50-0.53
        # against 0.49-0.55; GPT-2's forward over a 20- and a 50-token prompt 46.9-48.2 against 36.4-36.9 ms and
        # 73.5-75.6 against 64.9. (7x64, 4 of its 28 accumulators spilled, ran 0.99-1.11 ms in ResNet-50.) Against
        # more tiles it did not pay (in one process): 196 x 2304 @ 2304 x 256 as 7x48 0.93 -> 1.11 ms, 392 x 2304 @
        # 2304 x 512 as 8x48 3.53 -> 3.67
        budget = machine.vector_registers * 3 // 4
        even = [
            (r * v, v, r)
            for v in (4, 3, 2, 1)
            if budget // v >= 6 and n >= v * w
            for r in range(min(12, budget // v), budget // v * 2 // 3 - 1, -1)
            if m % r == 0
        ]
        if even:
            _, v, r = max(even)
            return r, v * w, w
    return mr, nr, w


def _tile(m: int, n: int, itemsize: int, machine: Machine, k: int) -> tuple[int, int, int]:
    """microkernel's tile for an (m, n) output over a reduction of `k`, not knowing its B.

    3/4 of the vector registers hold accumulators, the rest the NR/W operand vectors, the broadcast and gcc's
    temporaries: 24 of AVX-512's 32 zmm as 6x64 floats (4 vectors wide), 12 of AVX2's 16 ymm as 6x16. Wider
    tiles load fewer operands per FMA (6x64: 4 vector loads + 6 broadcasts per 24 FMAs; 12x32: 2 + 12). Measured
    on a Zen 4 at 1024^3, one thread, interleaved: 6x64 30.0 GFLOP/s, 12x32 25.2, 14x32 22.7 (NumPy 25.9). Spill
    check (gcc -S, tests/backend/test_gemm.py): 12x32, 14x32, 6x64 and 8x48 keep every accumulator in a register;
    16x32 (32 accumulators) and 7x64 spill. Narrow outputs use fewer vectors per row and more rows (at most 12).

    Skinny outputs (fewer rows than 6: a decode step's matrix-vector products) take all their rows and spend the
    accumulators on width instead, at most SKINNY_VECTORS per row: with one row and two vectors, each k waited on
    the two FMA chains' latency (a bf16 GEMV at 19 GB/s, f32 28, against a 29 GB/s triad); more chains keep the
    weight streaming at memory bandwidth.
    """
    w = machine.vector_bytes // itemsize
    budget = machine.vector_registers * 3 // 4
    if 0 < m < SKINNY_ROWS:  # the m x nv accumulators, the nv operand vectors and the broadcast in the registers
        nv = max(1, min(SKINNY_VECTORS, budget // m, (machine.vector_registers - 1) // (m + 1), n // w))
        return m, nv * w, w
    # an output narrower than 4 vectors whose whole tiles would leave columns to the remainder region (below), with
    # an A (m x k) past L2: that region's pass reads A from memory a second time, so one tile covers every column, its
    # last vector masked. ResNet-50's 1x1 convolutions at 7x7 (2048 x 512 @ 512 x 49 and the like, A 4-8 MB) at
    # batch 1: 4.70 -> 3.84 ms for the four kernels as 6x64 against 8x48 and a one-column pass, the model 0.976x (at
    # batch 8 1.003x; interleaved, one process); MobileNetV2's (A 0.6-1.6 MB, in L2) ran 1.03x slower so, and keep
    # the remainder
    if all(type(v) is int for v in (m, n, k)) and n % w and m * k * itemsize > machine.l2_bytes:
        nv = -(-n // w)
        if nv <= 4 and budget // nv >= 6:
            return min(12, budget // nv, m), nv * w, w
    # 4 vectors wide, or 3 where their whole tiles cover more of the columns by over n/16 (or 4 do not fit), else 2:
    # the columns past the whole tiles run in a remainder region (uopc.codegen.loops.regions) at a fraction of the
    # FMA rate. ResNet-18's 7x7 outputs (n = 49) in 12x32 tiles left 17 columns to it, in 8x48 tiles one: its last
    # stride-2 convolution (512 x 2304 @ 2304 x 49) took 0.608-0.616 ms against 0.669-0.673, alternating.
    cover = {v: n // (v * w) * v * w for v in (4, 3) if budget // v >= 6 and n >= v * w}
    wide = [v for v in cover if cover[v] >= max(cover.values()) - n / 16]
    nv = wide[0] if wide else 2 if budget // 2 >= 6 and n >= 2 * w else 1
    # of the widths whose whole tiles cover as many columns, one whose rows divide m: no rows left to a remainder
    # region (its own unrolled tile of C, at a fraction of the FMA rate). AVX-512, m = 64, 128, ... (not a multiple of
    # 6) and n a multiple of 48 and 64: 8x48 tiles, not 6x64. One process, alternating, 31 rounds: 128x768x768 154 ->
    # 200 GFLOP/s, 64x576x784 171 -> 181, 128x1152x196 156 -> 163, 128x768x3072 211 -> 214; the CNN and char-GPT
    # steps and ResNet-18 the same; the CNN's largest GEMM unit 4 regions of C -> 2
    if m % min(12, budget // nv, m) and wide:
        even = [v for v in (4, 3) if v in cover and cover[v] >= cover[nv] and m % min(12, budget // v) == 0]
        nv = even[0] if even else nv
    # no more rows than the output has: rows past a tile's multiple run one at a time (the remainder region), so a
    # 12-row tile over 9 rows (the CNN's first convolution's weight gradient, 3x3 taps x 16 filters) ran every row
    # as one FMA chain, waiting on its latency
    return min(12, budget // nv, m), nv * w, w


def uses_microkernel(r: UOp, machine: Machine) -> bool:
    """Is `r` a matmul the packed microkernel handles: float, at least one vector wide, and big enough?"""
    ops = matmul_operands(r)
    if ops is None:
        return False
    m, n, k = r.src[0].shape[-3:]
    if m < SKINNY_ROWS and not _stored(ops[1]):
        # a skinny product of a computed B (decode attention over a KV cache just written): each element of B is
        # used by m rows only, so a pack would write and read all of it again for one use, every call (a stored
        # weight's pack is kept across calls: uopc.engine.kept); the plain reduction reads it once
        return False
    return n >= machine.vector_bytes // r.dtype.itemsize and prod(r.src[0].shape) >= GEMM_MIN_WORK and k > 1


# the epilogue ops the microkernel applies to a whole vector of its tile (uopc.codegen.lanes), with float32's
# VECTOR_MATH on the product (below); another op whose value varies along the vectors' axis runs once per lane,
# scalar: GELU's exp2, before it had a vector form, in the epilogue of char-GPT's MLP GEMM (2048 x 256) took 1.6-2.1
# ms, against 0.38 ms for the GEMM with a separate elementwise kernel after it
LANE_OPS = frozenset({Ops.ADD, Ops.MUL, Ops.NEG, Ops.CMPLT, Ops.CMPNE, Ops.WHERE})


def vector_epilogue(r: UOp, reader: UOp) -> bool:
    """Does every op of `reader` (elementwise ops on matmul `r`, at r's shape) that varies along the output's last
    axis, the microkernel's vector lanes, have a vector form (LANE_OPS; a select on float compares of its dtype, or
    logic of them, or on a condition that does not vary; float32 exp2 or 1/x of r and of values constant along the
    tile's rows or its lanes)?
    What is constant along it (a convolution's per-channel BatchNorm, its rows being channels) is computed once per
    row of the tile.

    exp2 and 1/x take the product and broadcast values only (SiLU, sigmoid, tanh, GELU of a convolution's or a linear
    layer's output, after its bias or BatchNorm): there a 1x1 convolution with BatchNorm and SiLU, sigmoid, tanh or
    GELU ran 0.83-0.97x the time of the GEMM and a separate kernel at batch 8, 0.91-1.07x at batch 1, where tanh and
    GELU lost 2-7% (bench/bench_epilogues.py). Of a value read in full (char-GPT's GELU backward, exp(-h^2) of the
    stored pre-activation h, in the epilogue of its 2048 x 256 input-gradient GEMM) it ran 0.97x alone but made the
    training step 1.02-1.03x slower: the tile reads h in 6-row blocks, where a separate kernel streams it once the
    product sits in L2."""
    varies: dict[UOp, bool] = {}
    reads: dict[UOp, bool] = {}

    def vary(u: UOp) -> bool:
        if (hit := varies.get(u)) is not None:
            return hit
        if u is r:
            out = True
        elif u.op in ALU:
            out = any(vary(s) for s in u.src)
        else:  # a constant, a stored value or a view of one
            base = u
            while base.op in MOVEMENT:
                base = base.src[0]
            out = base.op is not Ops.CONST and bool(u.shape) and last_axis_stride(u, base) != 0
        varies[u] = out
        return out

    def full_read(u: UOp) -> bool:  # does u read a value that varies along the tile's rows and lanes, not r?
        if (hit := reads.get(u)) is not None:
            return hit
        if u is r or u.op is Ops.CONST:
            out = False
        elif u.op in ALU:
            out = any(full_read(s) for s in u.src)
        else:
            base = u
            while base.op in MOVEMENT:
                base = base.src[0]
            out = vary(u) and (len(u.shape) < 2 or last_axis_stride(u, base, -2) != 0)
        reads[u] = out
        return out

    stack, seen = [(reader, False)], set()
    while stack:
        u, viewed = stack.pop()
        if u in seen or u is r or u.op in STORED or u.op is Ops.CONST:
            continue
        seen.add(u)
        if u.op in MOVEMENT:  # ops under a view (computed in the kernel all the same): taken to vary
            stack.extend((s, True) for s in u.src)
            continue
        if (viewed or vary(u)) and u.op not in LANE_OPS:
            if u.op not in VECTOR_MATH or u.dtype is not dtypes.float32 or viewed or full_read(u):
                return False
        if u.op is Ops.WHERE and (viewed or vary(u)) and (viewed or vary(u.src[0])):
            if (compares := _mask_compares(u.src[0], u.dtype)) is None:
                return False
            stack.extend((s, viewed) for s in (*u.src[1:], *(x for c in compares for x in c.src)))
            continue
        stack.extend((s, viewed) for s in u.src)
    return True


def _mask_compares(c: UOp, dtype) -> list[UOp] | None:
    """The compares of `dtype` values that condition `c` of a select of `dtype` values combines with AND, OR, XOR
    and bool constants (what uopc.codegen.lanes makes one vector mask of), or None if it is anything else."""
    if c.op in COMPARE:
        return [c] if c.src[0].dtype is dtype else None
    if c.op is Ops.CONST:
        return [] if c.dtype is dtypes.bool else None
    if c.op not in LOGIC or c.dtype is not dtypes.bool:
        return None
    parts = [_mask_compares(s, dtype) for s in c.src]
    return None if None in parts else [x for p in parts for x in p]


def _stored(x: UOp) -> bool:
    """Is operand `x` a view of stored data (a buffer, through 16-bit floats widened), nothing computed?"""
    while x.op in MOVEMENT or (x.op is Ops.CAST and x.src[0].dtype.is_16bit_float):
        x = x.src[0]
    return x.op in STORED


def _pack(x: UOp, along: int, tile: int) -> UOp:
    """Operand `x` of shape (..., M, N, K), constant along axis `along` (-2 or -3): a STAGE of its (..., R, K)
    rows packed into panels (..., R/tile, K, tile), padded to whole tiles, and the view of it as `x` again."""
    shape = x.shape
    nb = len(shape) - 3
    bounds = tuple((0, 1) if i == len(shape) + along else (0, s) for i, s in enumerate(shape))
    other = -3 if along == -2 else -2
    rows, k = shape[other], shape[-1]
    xs = x.shrink(bounds).reshape((*shape[:nb], rows, k))
    padded = -(-rows // tile) * tile
    pad = tuple((0, padded - rows) if i == nb else (0, 0) for i in range(nb + 2))
    panels = xs.pad(pad).reshape((*shape[:nb], padded // tile, tile, k))
    perm = (*range(nb), nb, nb + 2, nb + 1)
    packed = UOp(Ops.STAGE, (panels.permute(perm),))
    back = packed.permute(perm).reshape((*shape[:nb], padded, k))
    back = back.shrink(tuple((0, rows) if i == nb else (0, s) for i, s in enumerate(back.shape)))
    one = (*shape[:nb], rows, 1, k) if along == -2 else (*shape[:nb], 1, rows, k)
    return back.reshape(one).expand(shape)


def _pack_narrow(b: UOp, nr: int) -> UOp:
    """B packed into NR-column panels; a bfloat16 operand widened to float32 (a bf16 weight) is packed as it is
    stored and widened as the microkernel loads it (half the bytes packed, kept and streamed)."""
    nb = graph_rewrite(b, push_views)
    if nb.op is Ops.CAST and nb.dtype is dtypes.float32 and nb.src[0].dtype is dtypes.bfloat16:
        return _pack(nb.src[0], -3, nr).cast(dtypes.float32)
    return _pack(b, -3, nr)


def pack_matmuls(roots: list[UOp], machine: Machine) -> list[UOp]:
    """Give every matmul the microkernel handles packed operands: A in MR-row panels, B in NR-column panels."""
    todo = {r for r in UOp(Ops.SINK, tuple(roots)).toposort() if uses_microkernel(r, machine)}

    def repack(r: UOp) -> UOp:
        ops = matmul_operands(r)
        if ops is None:  # its operands were rewritten into something else: leave it
            return r
        a, b = ops
        k, per = r.src[0].shape[-1], _b_bytes(r, _stored_bytes(r))
        mr, nr, _ = microkernel(r.shape[-2], r.shape[-1], r.dtype.itemsize, machine, k, per)
        # A is read one broadcast element at a time: a plain view of memory is read where it is (measured at
        # 256^3 and the MLP shapes: the packing copy cost 10-15% and gained nothing); a computed A is packed so
        # it is computed once, not once per column block. B is packed unless its rows are contiguous along N and
        # one product's B fits in half of L2 (packing 4 MiB at 1024^3 gained ~15%; at 256^3 it cost 4%; a batch
        # of small products, a Winograd convolution's alpha^2, each fits: packing ResNet-18's 36 x (64, 196) cost
        # 0.33 ms against a 0.4 ms GEMM), or it reads its memory many times over (a convolution's windows: measured
        # at (64,32,28,28) * (64,32,3,3), the GEMM read in place took 13-14 ms against 12 ms packed plus a 15 ms
        # packing copy), or it is an intermediate that fits in L2 (_copied_per_call). A Winograd convolution's
        # input transform, A of its few-tile products, writes A's MR-row panels itself (_winograd_panels)
        fits = b.shape[-2] * b.shape[-1] * b.dtype.itemsize <= machine.l2_bytes // 2
        pa = _winograd_panels(a, mr, 1, machine) or (a if _plain(a, None) else _pack(a, -2, mr))
        if (fits or _rereads(b) or _copied_per_call(b, machine)) and _plain(b, -2):
            pb = b
        else:
            pb = _winograd_panels(b, nr, 2, machine) or _pack_narrow(b, nr)
        return (pa * pb).reduce(Ops.ADD, 1)

    return UOp.wrap(roots, todo, repack) if todo else roots


# an input transform's panels larger than this fraction of the last-level cache skip it (_winograd_panels). Measured
# on Zen 4 (32 MiB L3), interleaved in one process: (64, 64, 28, 28) x (32, 64, 3, 3) forward, 28.9 MB of panels,
# 0.88-0.92x; the conv benchmark's forward and backward (whose input gradient writes them) 0.95-0.97x; ResNet-18 at
# batch 1 with every panel streamed (0.5-0.9 MB each) 1.03x: products that find their panels in the cache run faster
STREAM_FRACTION = 0.5


def _winograd_panels(x: UOp, panel: int, axis: int, machine: Machine) -> UOp | None:
    """An operand of a Winograd convolution's batched products, from the transform it views writing the packed
    panels itself (uopc.uop.winograd.winograd_panels); None for any other operand. `axis` is the products' axis
    the transform's rows run along: 2 for B (N), 1 for A (M). The input transform's V (C, alpha^2, T) is B of
    products (alpha^2, K, T), and A of (alpha^2, T, K), the few-tile form (uopc.tensor.conv); the weight
    transform's U (alpha^2, K, C) is B of products (alpha^2, T, K). (U as A of (alpha^2, K, T) is read in place:
    its rows are contiguous along C, the reduction.)
    Packing V as B took a copy as large as V (2.8 ms of the 12 ms input gradient of (64, 32, 28, 28) *
    (64, 32, 3, 3)); packing U, a copy per weight: 80 ms of ResNet-18's first call at batch 1 (its 14x14 and 7x7
    layers). V as A read in place is read a whole point's tiles apart from one channel to the next (alpha^2 T
    floats: 1-2.3 KiB at ResNet-18's 14x14 and 7x7 layers), in MR-row panels a panel apart: on a Xeon (Sapphire
    Rapids), ResNet-18 at batch 1, its three few-tile layers' products and input transforms took 7.9 against 8.6 ms
    a call (medians of 6 processes, interleaved; panels of all T rows: 9.2, and less steady).
    An input transform's panels larger than STREAM_FRACTION of the last-level cache are written with non-temporal
    stores (Winograd.stream): they cannot stay in the cache until the products read them, and a plain store first
    reads each line it writes part of."""
    v = x
    while v.op in MOVEMENT:
        v = v.src[0]
    if v.op is not Ops.WINOGRAD or v.arg.kind not in ("in", "w") or v.arg.panel or len(x.shape) != 4:
        return None
    if axis == 1 and v.arg.kind != "in":
        return None
    if v.arg.kind == "in":
        C, a2, rows = v.shape
        rowwise = v.permute((1, 2, 0))  # (alpha^2, T, C)
    else:
        a2, rows, C = v.shape
        rowwise = v
    shape = (a2, 1, rows, C) if axis == 2 else (a2, rows, 1, C)
    # x must read the transform's rows as that view does: the same elements at the same places (both are views of
    # v alone, so their offsets and strides say it; comparing the views rewritten into one form walked all of the
    # graph under them, 36 times in ResNet-18's first call)
    want = rowwise.reshape(shape).expand(x.shape)
    if (got := affine_view(x, v)) is None or got != affine_view(want, v):
        return None
    big = v.arg.kind == "in" and prod(v.shape) * v.dtype.itemsize > machine.l3_bytes * STREAM_FRACTION
    p = winograd_panels(v, panel, stream=big)
    # (its channel slots past C, a spacing of the points: winograd_panels, are not read)
    flat = p.permute((0, 1, 3, 2)).reshape((a2, p.shape[1] * panel, p.shape[2])).shrink(((0, a2), (0, rows), (0, C)))
    return flat.reshape(shape).expand(x.shape)


def split_k(roots: list[UOp], machine: Machine) -> list[UOp]:
    """A small output over a long reduction (e.g. (16, 16) from K = 65536) is computed as S partial sums by S
    threads, then summed: (S, ..., K/S) -> (S, ...) -> (...). Also keeps each partial sum short (accuracy)."""
    threads = machine.cores
    todo = set()
    for r in UOp(Ops.SINK, tuple(roots)).toposort():
        if r.op is Ops.REDUCE and r.arg[1] == 1 and threads > 1 and prod(r.shape) <= SPLITK_MAX_OUT:
            k = r.src[0].shape[-1]
            if k >= SPLITK_MIN_K and k % (2 * threads) == 0 and r.dtype.is_float and not symbolic(r.src[0].shape):
                todo.add(r)

    def split(r: UOp) -> UOp:
        x, k = r.src[0], r.src[0].shape[-1]
        s = 2 * threads if prod(r.shape) < 64 * threads else threads
        nd = len(x.shape)
        parts = x.reshape((*x.shape[:-1], s, k // s)).permute((nd - 1, *range(nd - 1), nd))
        partial = graph_rewrite(parts, push_views).reduce(r.arg[0], 1)  # (S, ...): one kernel, threads over S
        return partial.permute((*range(1, nd), 0)).reduce(r.arg[0], 1)

    return UOp.wrap(roots, todo, split) if todo else roots


def gemm_opts(body: UOp, machine: Machine) -> Opts | None:
    """The microkernel's Opts for a kernel whose body is a packed matmul, or elementwise ops on one at the same index
    (its epilogue, applied while the tile is in registers); None for any other kernel."""
    r = epilogue_reduce(body)
    if r is None or not uses_microkernel(r, machine):
        return None
    shape, k, b_bytes = body.shape, r.src[0].shape[-1], _stored_bytes(r)
    am, an = len(shape) - 2, len(shape) - 1
    mr, nr, w = microkernel(shape[am], shape[an], body.dtype.itemsize, machine, k, _b_bytes(r, b_bytes))
    upcast = {am: mr, an: nr}
    # k-blocking (BLIS's KC): per chunk of K, a thread's MR-row panel of A (MR x KC) stays in L1 while it runs
    # along a block of NC columns whose B panels (KC x NC) stay in L2; the accumulators start from the partial
    # sums kept in the output between chunks
    # (a whole number of the reduce axis's inner blocks per chunk: a convolution's K = C*kh*kw in chunks of whole
    # kh*kw blocks keeps its loops split by channel and tap, with no division in the microkernel)
    inner = _inner_block(r)
    chunks = [c for c in range(KC_MAX, KC_MIN - 1, -1) if k % c == 0]
    # (or, where no chunk holds whole blocks, chunks that divide a block: a weight gradient's K = N*H*W in chunks of
    # whole rows of one image, not across images, which took every position apart with a division)
    whole = [c for c in chunks if c % inner == 0] or [c for c in chunks if inner % c == 0] or chunks
    ktile = whole[0] if whole and k > KC_MAX * 3 // 2 else 0
    kc, size = ktile or k, body.dtype.itemsize
    thread, tile = None, {}
    cores = machine.cores
    if cores > 1:
        blocks = [-(-s // upcast.get(a, 1)) for a, s in enumerate(shape)]
        thread = next((a for a, nb in enumerate(blocks) if nb >= cores), None)
        few_rows = shape[am] * kc * size <= machine.l2_bytes // 2 or shape[an] >= WIDE_N * shape[am]
        # (not under a tile wider than the output, microkernel's one masked tile over an A past L2: that one tile
        # reads A once, from memory, and blocks would only share the row tiles out unevenly: ResNet-50's 2048 x 1024
        # @ 1024 x 49 in 11 blocks of 31 tiles took 1.24x the time of no blocks. Elsewhere blocks keep A's chunk in
        # L2 for the next column tile: a weight gradient's 288 x 50176 @ 50176 x 64 took 1.47x without them)
        mc = (
            _row_block(shape[am] - shape[am] % mr, mr, cores, machine.l2_bytes // 2 // (kc * size))
            if thread == am and shape[an] >= nr
            else 0
        )
        # the row blocks, each streaming all of B; rows too few for blocks of tiles (_row_block) are shared out a
        # register tile at a time, and then each tile streams all of B
        row_blocks = (shape[am] - shape[am] % mr) // (mc or mr)
        streamed = b_bytes > machine.l3_bytes // 2 or (row_blocks >= cores and b_bytes > machine.l2_bytes // 2)
        # (and only where the columns share out evenly: the busiest thread's NR-column tiles within 1/8 of an even
        # share. A stride-2 convolution's 196 output positions make 3 tiles and 4 columns, 2 tiles against 1 on 2
        # threads: its GEMM (256 x 1152 @ 1152 x 196) took 0.79-0.83 ms over columns against 0.61-0.67 over rows
        # on a Zen 4; 784 positions make 12 tiles and 16 columns, and there columns ran as fast or faster, 0.63
        # against 0.70 ms for the whole convolution)
        balanced = shape[an] / nr >= COLUMN_BALANCE * cores * -(-blocks[an] // cores)
        if thread == am and few_rows and streamed and blocks[an] >= cores and balanced:
            # B larger than the last-level cache, against few rows (A's chunk in L2) or a very wide output: threads
            # over blocks of columns, each running every row over its block of B while that stays in L2. Over rows,
            # every block of MR rows streamed all of B from memory again (GPT-2's LM head, 154 MB of B: 48 GFLOP/s
            # against 94, measured interleaved). Where B fits in L3, rows measured 0-14% faster (128 x 768..3072)
            # on a Zen 4; but where B outgrows L2, B comes from L3 once per row block (at least one a thread; for
            # load balance more: 128 rows make 21 blocks of one 6-row tile, 512 rows 17 of 30), and on
            # a Xeon whose L3 streams at ~28 GB/s (Sapphire Rapids class, a VM) GPT-2's 128-token projections
            # (128x768 @ 768x768..3072 and 128x3072 @ 3072x768) ran at 121-145 GFLOP/s over rows against 215-219
            # over columns, its 512-token ones at 266-298 against 313-357 (the tuner's timer). So do rows shared out a
            # tile at a time, or one block a thread: MobileNetV2's 1x1 projections at batch 1 (24 x 144 @ 144 x 3136,
            # 4 tiles of 6 rows each streaming all 1.8 MB of B) 0.213 -> 0.109 ms, its stem (32 x 27 @ 27 x 12544)
            # 0.170 -> 0.130, its first projection (16 x 32 @ 32 x 12544, one 6-row tile a thread) 0.176 -> 0.085
            thread = an
        if thread == am:  # threads over blocks of rows: one parallel region, each thread runs its own K and N loops
            tile = {am: mc} if mc else {}
    whole_n = shape[an] - shape[an] % nr
    nc_max = max(nr, machine.l2_bytes // 2 // (kc * size) // nr * nr)
    # (a skinny product's register tile holds all its rows: each B panel is read once, so no block of B is kept in
    # L2 for more rows, and blocks of columns would only be coarser work for the threads: 768 columns of a decode
    # step's GEMV in 3 blocks of 256 left one of 2 threads idle a third of the time, at 35 GB/s against 43)
    # (nor where threads take columns and K is not chunked: every row's tile then runs over each B panel while it is
    # in L1, and blocks of NC columns would only share out unevenly: MobileNetV2's 24 x 144 @ 144 x 3136 projection
    # at batch 1 in 7 blocks of 448 columns on 2 threads took 0.130-0.137 ms against 0.106-0.124 in 64-column tiles)
    if whole_n > nc_max and shape[am] >= SKINNY_ROWS and (thread != an or ktile):
        nc = next((c for c in range(nc_max, nr - 1, -nr) if whole_n % c == 0), 0)
        if nc > nr:
            tile[an] = nc
    # the register tiles that read each block of B while it stays in L2: a thread's row block (one tile where threads
    # take row tiles), else all the rows (threads over columns each run every row over their block)
    reuse = (tile.get(am, mr) // mr) if thread == am else -(-shape[am] // mr)
    # (not for a tile of one row: one FMA per load, its loads keep memory busy without it)
    far = FAR_PREFETCH_BYTES if b_bytes > machine.l2_bytes and reuse <= FAR_PREFETCH_TILES and mr > 1 else 0
    return Opts(upcast=upcast, thread=thread, ktile=ktile, tile=tile, vec=w, prefetch=far)


def _inner_block(r: UOp) -> int:
    """The size of the inner dims that a reshape merged into r's reduce axis with an outer one (a convolution's
    (C, kh, kw) -> C*kh*kw: kh*kw), or 1."""
    k = r.src[0].shape[-1]
    for u in r.src[0].toposort():
        if u.op is Ops.RESHAPE and u.shape and u.shape[-1] == k and u.src[0].shape and u.src[0].shape[-1] < k:
            dims, p = list(u.src[0].shape), 1
            while dims and p < k:
                p *= dims.pop()
                if p == k:
                    return k // u.src[0].shape[len(dims)]
    return 1


def _row_block(whole: int, mr: int, cores: int, max_rows: int) -> int:
    """The rows of each block that threads share out over `whole` rows in MR-row register tiles, in one parallel
    region (0: no blocks, a tile at a time). Each block streams all of B, so the fewest blocks that share out evenly
    (a multiple of the threads: OpenMP's static schedule gives each thread a run of whole blocks) whose chunk of A
    (rows x KC) stays in half of L2 (`max_rows`); where no such count divides the tiles, at least 4 blocks a thread
    (a thread given one block more then does at most a quarter more). Measured on the Xeon VM: the weight gradient
    of the conv benchmark (288 x 50176 @ 50176 x 64) in 2 blocks of 144 rows 5.5 ms against 6.2 in 8 of 36 (the
    forward + backward 0.95-0.99x, interleaved); 512^3 (85 tiles) in 5 blocks, unevenly shared, 1.13x slower than in 17.
    (Earlier, under load at 1024^3: 33 GFLOP/s with blocks of 60 rows against 18 with a region per K chunk.)"""
    n = whole // mr
    for b in range(cores, n, cores):
        if n % b == 0 and n // b * mr <= max_rows:
            return n // b * mr
    best = 0
    for d in range(1, n + 1):
        if n % d == 0 and n // d >= 4 * cores:
            best = d
    return best * mr if best and best < n else 0

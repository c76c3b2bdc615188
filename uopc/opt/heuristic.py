"""The hand heuristic (OPT=1): register tiles, reduce unrolling, cache blocks and threads chosen from the kernel's
shape and the Machine's L2 and core count (uopc.machine: the optimizer is built with one, `HandOpt(machine)`).

    GEMM 1024^3  ->  Opts(upcast={1: 4, 0: 4}, thread=0, tile={0: 128, 1: 128})
    sum (16,)    ->  Opts(unroll=4)
"""

from __future__ import annotations

from dataclasses import dataclass

from uopc.helpers import prod
from uopc.machine import Machine
from uopc.opt.gemm import gemm_opts, uses_microkernel, vector_epilogue
from uopc.opt.layout import layout_pass
from uopc.opt.opts import Opts
from uopc.opt.strides import access_strides, last_axis_stride, merged_shape, operand_views
from uopc.uop import MOVEMENT, STORED, Ops, UOp, epilogue_reduce
from uopc.uop.dtype import dtypes
from uopc.uop.variable import Variable, symbolic

# below this much work (output elements x reduce size) waking OpenMP threads costs more than it saves;
# measured on a 2-core Zen 4: an elementwise kernel of 2^15 floats runs in ~5 us, a parallel region ~3 us
THREAD_MIN_WORK = 1 << 16
# ...counting each element of a kernel that reads some buffer at a stride along its innermost axis (a transposing
# copy: a strided convolution's channels-last product read as NCHW) this many times: such a read costs ~1 ns an
# element where a contiguous one costs ~0.15. ResNet-18 at batch 1 on the Xeon VM: its BatchNorm + ReLU over the
# (196, 256) product read as (256, 14, 14) 0.062 -> 0.037 ms, over (49, 512) 0.037 -> 0.021, a 1x1 stride-2
# convolution's strided copy of (64, 28, 28) 0.038 -> 0.022 (per-kernel medians, alternating processes)
STRIDED_WORK = 8
# unroll only reductions shorter than this (and untiled): longer ones are vectorized by gcc, and unrolled
# copies in front of a register tile defeat its vectorizer (measured slower)
UNROLL_MAX_REDUCE = 64


def reduce_size(body: UOp) -> int:
    """Elements reduced per output element (the largest REDUCE in the kernel; 1 if none)."""
    return max(
        (prod(u.src[0].shape[len(u.src[0].shape) - u.arg[1] :]) for u in body.toposort() if u.op is Ops.REDUCE),
        default=1,
    )


def row_fits(r: UOp, machine: Machine) -> bool:
    """Is REDUCE `r` worth computing inside the kernel that reads it per row (uopc.schedule.fusion.row_fusions) on
    `machine`? When the row's inputs fit in half of L2, so the passes after the first read it from cache, and there
    are rows enough to share among the cores (or too little work to thread at all: then one kernel in place of
    several is all gain)."""
    src, n = r.src[0], r.arg[1]
    rows, row = prod(src.shape[: len(src.shape) - n]), prod(src.shape[len(src.shape) - n :])
    inputs, seen, stack = set(), set(), [src]
    while stack:  # the buffers and other kernels' results the reduce reads at its own size
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.op in STORED and u is not src:
            if prod(u.shape) >= row:  # read along the row (a scalar or a per-row value is not)
                inputs.add(u)
        else:
            stack.extend(u.src)
    row_bytes = row * sum(u.dtype.itemsize for u in inputs)
    return row_bytes <= machine.l2_bytes // 2 and (rows >= machine.cores or rows * row < THREAD_MIN_WORK)


def row_kernel(body: UOp) -> bool:
    """Does the kernel compute reduces per row inside it (fused by row_fusions): a REDUCE in its body other than
    the one it ends in?"""
    reds = [u for u in body.toposort() if u.op is Ops.REDUCE]
    return len(reds) > 1 or (len(reds) == 1 and epilogue_reduce(body) is None)


def _row_axes(body: UOp) -> int:
    """How many leading axes of a row kernel's output index its rows (the others run along a row)."""
    if body.op is Ops.REDUCE:
        return len(body.shape)
    along = [u.arg[1] for u in body.toposort() if u.op is Ops.REDUCE and u.src[0].shape == body.shape]
    return len(body.shape) - max(along, default=0)


def hand_opt_choice(body: UOp, machine: Machine) -> Opts:
    """Register tile on the last two output axes, unroll short untiled reductions, threads above a work threshold."""
    if (gemm := gemm_opts(body, machine)) is not None:  # a packed matmul: the register-blocked microkernel
        return gemm
    shape, rsize = body.shape, reduce_size(body)
    if row_kernel(body):  # whole rows, each in one thread, outermost: a reduce inside is computed once per row
        thread = None
        if prod(shape or (1,)) * rsize >= THREAD_MIN_WORK and machine.cores > 1:
            rows = [k for k in range(_row_axes(body)) if shape[k] >= 2]
            thread = next((k for k in rows if shape[k] >= machine.cores), rows[0] if rows else None)
        return Opts(thread=thread)
    if (vector := _symbolic_reduce_vectors(body, machine)) is not None:
        return vector
    upcast: dict[int, int] = {}
    unroll, thread, tile, vec, strided = 1, None, {}, 0, False
    max_only = _max_only(body)
    if 1 < rsize < UNROLL_MAX_REDUCE and (max_only or not _tile_reuse(body)):
        unroll = rsize  # a max pool's window, or a window no tile would reuse, whole (_max_only, _tile_reuse)
        if not max_only and (lanes := _window_lanes(body, machine)):
            upcast, vec = {len(shape) - 1: lanes}, lanes
    elif rsize > 1:
        # 4x4 tile: 16 accumulators + 8 operand vectors. That spills a few on AVX2's 16 registers, fits in
        # AVX-512's 32; measured, it beats 2x8, 4x8 and 8x8 on both kinds of machine
        budget = 16
        for axis in (len(shape) - 1, len(shape) - 2):
            if axis < 0:
                continue
            for f in (4, 2):
                if f <= budget and shape[axis] % f == 0 and shape[axis] >= f:
                    upcast[axis] = f
                    budget //= f
                    break
        if not upcast and rsize % 4 == 0 and rsize < UNROLL_MAX_REDUCE:
            unroll = 4
        # cache blocks when the operand rows one row-strip walks through do not fit in L2 (measured on a Zen 4,
        # N=1024: 4x4 tile 99 GFLOP/s, + 128x128 blocks 173)
        if len(shape) >= 2 and upcast and shape[-1] * rsize * body.dtype.itemsize > machine.l2_bytes:
            tile = _block(shape, rsize * body.dtype.itemsize, machine.l2_bytes)
    elif len(shape) >= 2 and _strided_read(body):
        strided = True
        if (axis := _transpose_axis(body, machine)) is not None:  # a W x W tile, transposed in registers
            w = machine.vector_bytes // body.dtype.itemsize
            upcast, vec = {axis: w, len(shape) - 1: w}, w
        if min(shape[-2:]) >= 64:
            # a transposing copy: 32x32 blocks keep the strided side's cache lines in L1 until all 16 floats of
            # each are used (measured: a 1024x1024 transpose 3.6 ms -> 0.57 ms)
            tile = {len(shape) - 2: 32, len(shape) - 1: 32}
    work = prod(shape or (1,)) * rsize * (STRIDED_WORK if strided else 1)
    if work >= THREAD_MIN_WORK and machine.cores > 1:
        for axis, s in enumerate(shape):
            if s // upcast.get(axis, 1) >= 2:
                thread = axis
                break
    return Opts(upcast=upcast, thread=thread, unroll=unroll, tile=tile, vec=vec)


# a transposing copy of at least this many elements is read in W x W tiles transposed in registers (_transpose_axis):
# lowering a tile's W copies costs 15-30 ms a kernel where the scalar copy costs 1-2, and gcc 0-40 ms more, while
# the tile saves 0.3-0.4 ns an element of each call. ResNet-18's BatchNorm + ReLU over its strided convolutions'
# channels-last products: (784, 128) at batch 1 0.073 -> 0.032 ms, 8 x (784, 128) at batch 8 0.43 -> 0.17 ms,
# 8 x (49, 512) 0.13 -> 0.05 (alternating processes, the Xeon VM); its empty-cache first call (three tiles more, two of
# them weight packs that run once) 1.89 -> 1.83 s, within the noise, and the CNN step's 1.94 -> 1.90 s. From 2M
# elements, as before, the smaller copies ran scalar at 4-13 GB/s.
TRANSPOSE_MIN_ELEMENTS = 1 << 16


def _transpose_axis(body: UOp, machine: Machine) -> int | None:
    """The output axis along which every strided read of an elementwise kernel (a transposing copy: a channels-last
    product read as NCHW, a permuted copy) reads consecutive elements, where a tile of W x W elements fits (W the
    machine's vector of the kernel's 4- or 8-byte elements); None if there is none. With that axis and the last one
    upcast by W, codegen.transpose reads the tile as W vector loads transposed in registers: a (12544, 64) float32
    tensor read as (64, 12544) with a ReLU, ResNet-18's stem as rows, took 0.27-0.29 ms in scalar loads, 0.08 so in
    hand-written C, 0.11-0.12 as uopc's tile (2 threads, the Xeon VM). Only from TRANSPOSE_MIN_ELEMENTS on."""
    shape, size = body.shape, body.dtype.itemsize
    w = machine.vector_bytes // size if size in (4, 8) else 0
    if w < 2 or prod(shape) < TRANSPOSE_MIN_ELEMENTS or len(shape) < 2 or shape[-1] < w:
        return None
    if (reads := access_strides(body)) is None:
        return None
    axes = {next((a for a, s in enumerate(st) if s == 1), None) for st in reads if st and st[-1] not in (0, 1)}
    if len(axes) != 1 or (axis := axes.pop()) is None or axis == len(shape) - 1 or shape[axis] < w:
        return None
    return axis


def _window_lanes(body: UOp, machine: Machine) -> int:
    """The vector width (in lanes) to compute a window sum's output rows in, or 0 to leave them to gcc: a reduce
    whose operands all read consecutive elements (or one element) along the output's last axis (a stride-1 depthwise
    convolution: its input along the row, its weight broadcast), in SIMD vectors of the machine's width, the row's
    last vector partial, the padding a mask on each tap's vector (codegen.lanes). gcc vectorizes only a row at
    least a vector long, and its remainder in narrower vectors: a 3x3 window over 384 x 14 x 14 ran 36 us so, 20
    in one partial vector of 16 lanes. Float32 only: codegen.lanes keeps 16-bit floats scalar, and a float64 mask
    would need 64-bit lanes (its gate's indices are 32-bit)."""
    lanes = machine.vector_bytes // 4
    reds = [u for u in body.toposort() if u.op is Ops.REDUCE]
    if body.dtype is not dtypes.float32 or lanes < 2 or len(reds) != 1 or reds[0].arg[0] is not Ops.ADD:
        return 0
    if not body.shape or not 1 < body.shape[-1] < 2 * lanes:  # (longer: gcc's vectors, 56 or 112 wide 0.64-0.83x)
        return 0
    axis = len(reds[0].src[0].shape) - reds[0].arg[1] - 1
    views = list(operand_views(reds[0].src[0]))
    if not views or any(b.dtype is not dtypes.float32 for _, b in views):
        return 0
    if any(last_axis_stride(v, b, axis, padded=True) not in (0, 1) for v, b in views):
        return 0
    return lanes


def _max_only(body: UOp) -> bool:
    """Are all of the kernel's reduces maxima (a max pool, its argmax)? Over a short window they get no register
    tile but the window unrolled whole: a tile's accumulators are scalar chains of NaN-propagating selects, which
    gcc does not pack into vectors, while with the window in straight lines the output's innermost loop vectorizes,
    even at stride 2. The autotuner's timer on a Zen 4, 4x4 tile against the window unrolled: 3x3 stride 2 over
    64x112x112 (ResNet's) 0.63 against 0.12 ms; 2x2 stride 2 over 8x64x56x56 0.53 against 0.09; 3x3, 5x5, 7x7
    stride 1: 4.5/12.4/24.3 against 0.34/0.82/1.56 ms (a max over 512 rows keeps its tile: 0.19 ms, 0.81 without)."""
    reds = [u for u in body.toposort() if u.op is Ops.REDUCE]
    return bool(reds) and all(u.arg[0] is Ops.MAX for u in reds)


def _tile_reuse(body: UOp) -> bool:
    """Would a register tile over the last two output axes reuse a value it loads: does some operand of the
    kernel's reduce stay the same along one of those axes and move along the other (a matmul's A along its columns,
    its B along its rows)? A depthwise convolution's window sum has none: its weight is the same over the whole
    tile, its input moves along both axes. Its tile was 16 scalar accumulators, where its window unrolled whole
    leaves the output's innermost loop to gcc's vectorizer, strided reads and padding included
    (uopc.renderer.c_select.gate_load): 3x3 stride 2 over 8 x 96 x 112 x 112, 4.7-5.0 ms against 1.3-1.4 ms."""
    reds = [u for u in body.toposort() if u.op is Ops.REDUCE]
    if len(reds) != 1 or (out := len(reds[0].src[0].shape) - reds[0].arg[1]) < 2:
        return True
    axes = (out - 2, out - 1)
    for view, base in operand_views(reds[0].src[0]):
        fixed = [last_axis_stride(view, base, a) == 0 for a in axes]
        if fixed[0] != fixed[1]:
            return True
    return False


def _symbolic_reduce_vectors(body: UOp, machine: Machine) -> Opts | None:
    """A reduce over a symbolic axis (decode attention's probabilities @ values over the positions seen) cannot be
    blocked or unrolled along it: when every operand it reads along the output's last axis is contiguous there, that
    axis runs in SIMD vectors instead, up to 8 of them (each row of the operand read once, whole), threads over the
    first axis with rows enough; None for any other kernel."""
    r = epilogue_reduce(body)
    if r is None or r is not body or r.arg[1] != 1 or type(r.src[0].shape[-1]) is not Variable or len(body.shape) < 1:
        return None
    lanes = machine.vector_bytes // body.dtype.itemsize
    n = body.shape[-1]
    if type(n) is Variable or lanes < 2 or n % lanes:
        return None
    views = list(operand_views(r.src[0]))
    if not views or any(last_axis_stride(v, b, -2) not in (0, 1) for v, b in views):
        return None
    up = next(f for f in range(min(n, 8 * lanes), 0, -lanes) if n % f == 0)
    thread = next((a for a, s in enumerate(body.shape[:-1]) if s >= machine.cores), None) if machine.cores > 1 else None
    return Opts(upcast={len(body.shape) - 1: up}, thread=thread, vec=lanes)


def symbolic_kernel(body: UOp) -> bool:
    """Does the kernel loop over a symbolic axis (uopc.uop.variable): in its output, or in a reduce?"""
    return symbolic(body.shape) or any(u.op is Ops.REDUCE and symbolic(u.src[0].shape) for u in body.toposort())


def fit_symbolic(o: Opts, body: UOp) -> Opts:
    """`o` without what would split a symbolic axis, whose size is known to divide nothing: no register tile or
    cache block on a symbolic output axis, no unroll or K chunks of a reduce over one. Threads may run over it."""
    if not symbolic_kernel(body):
        return o
    shape = body.shape
    keep = {k for k in range(len(shape)) if type(shape[k]) is not Variable}
    upcast = {k: f for k, f in o.upcast.items() if k in keep}
    sym_reduce = any(u.op is Ops.REDUCE and symbolic(u.src[0].shape) for u in body.toposort())
    return Opts(
        upcast=upcast,
        thread=o.thread,
        unroll=1 if sym_reduce else o.unroll,
        tile={k: t for k, t in o.tile.items() if k in keep},
        ktile=0 if sym_reduce else o.ktile,
        vec=o.vec if upcast == o.upcast else 0,
    )


def groupable(first: UOp, value: UOp) -> bool:
    """Do two elementwise values of one shape run as the same loops: the same merged_shape (the dims every read
    walks in order, merged)? Grouped in a max pool's backward loops, split at its windows, the BatchNorm values that
    one contiguous loop suits took the CNN step's three kernels from 835 to 1450 us a call (temps grouped, a trial)."""
    return merged_shape(first) == merged_shape(value)


def _block(shape: tuple[int, ...], row_bytes: int, l2_bytes: int) -> dict[int, int]:
    """The largest square output block whose operand rows (block rows + block cols, each `row_bytes` long)
    fill at most half of L2, leaving room for a second hardware thread and the output."""
    for t in (256, 128, 64, 32):
        if 2 * t * row_bytes <= l2_bytes // 2 and all(s % t == 0 and s > t for s in shape[-2:]):
            return {len(shape) - 2: t, len(shape) - 1: t}
    return {}


def _strided_read(body: UOp) -> bool:
    """Does the kernel read some buffer with a non-unit stride along its innermost output axis? (Asked of every
    read of an elementwise body, also one whose loops were merged: a view on top of its ALU ops. Otherwise asked
    of the views at its leaves.)"""
    if (reads := access_strides(body)) is not None:
        return any(st and st[-1] not in (0, 1) for st in reads)
    tops = [body] if body.op in MOVEMENT else [view for view, _ in operand_views(body)]
    for view in tops:
        base = view
        while base.op in MOVEMENT:
            base = base.src[0]
        if base.op is Ops.BUFFER and last_axis_stride(view, base) not in (0, 1, None):
            return True
    return False


def takes_epilogue(r: UOp, reader: UOp, machine: Machine) -> bool:
    """HandOpt.epilogue's answer (SearchOpt's too): a matmul the microkernel runs, or a reduce over several axes (a
    depthwise convolution's or a pool's window, a mean over H and W: each output's value is computed whole before
    its store), whose reader keeps the reduce's dtype and has a vector form for what varies along the output's last
    axis (vector_epilogue). A Winograd output transform takes any elementwise reader of its dtype: it applies the
    ops over the outputs it has just stored, in one loop that gcc vectorizes (uopc.renderer.winograd)."""
    if r.op is Ops.WINOGRAD:
        return reader.dtype is r.dtype
    if reader.dtype is not r.dtype or not (uses_microkernel(r, machine) or r.arg[1] > 1):
        return False
    return vector_epilogue(r, reader)


@dataclass(frozen=True)
class HandOpt:
    """The default optimizer for one machine: layout pass + hand-chosen Opts. Part of the plan key (with its
    Machine), so a plan made for one machine record is never reused for another."""

    machine: Machine

    def layout(self, roots: list[UOp]) -> list[UOp]:
        return layout_pass(roots, self.machine)

    def choose(self, body: UOp, out: UOp) -> Opts:
        """The Opts to lower one kernel body with (the engine lowers it)."""
        return fit_symbolic(hand_opt_choice(body, self.machine), body)

    def epilogue(self, r: UOp, reader: UOp) -> bool:
        """May REDUCE `r` (or a Winograd output transform) take the elementwise ops of `reader` (the kernel body that
        reads it) as an epilogue (uopc.schedule.epilogues)? Yes for a matmul the microkernel runs, its tile in
        registers when the epilogue applies, if the output has the reduce's dtype (it holds the partial sums of K
        chunks: a bfloat16 output of a float32 sum would round them), and if each op that varies along the tile's
        vectors has a vector form (vector_epilogue: a scalar op per lane made the GEMM slower than the GEMM and a
        kernel after it). Yes for a Winograd output transform read in its own dtype (takes_epilogue)."""
        return takes_epilogue(r, reader, self.machine)

    def row_fusion(self, r: UOp, reader: UOp) -> bool:
        """May REDUCE `r` be computed per row inside `reader`, the kernel that reads it (uopc.schedule.fusion.
        row_fusions decides that nothing is computed twice)? When a row fits in this machine's cache: row_fits."""
        return row_fits(r, self.machine)

    def group(self, first: UOp, value: UOp) -> bool:
        """May elementwise `value` be stored by the kernel whose loops `first` shapes (uopc.schedule.groups)? When
        their reads walk their elements alike: loops that suit one are the other's (groupable)."""
        return groupable(first, value)

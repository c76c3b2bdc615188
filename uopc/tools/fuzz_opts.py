"""Differential fuzzing of lowering: small programs lowered under random Opts, run, and compared with NumPy.

    python -m uopc.tools.fuzz_opts --n 500 --seed 0    # prints each mismatch with its program, shape and Opts

The optimizers choose few of the Opts that `lower` accepts, and the autotuner times candidates without checking
their values, so a lowering bug can wait for the day a search or a heuristic first picks its Opts. Here every seed
draws shapes (sizes that are not multiples of any tile: 1, 5, 17, 33, 100 ...) and, for each program of PROGRAMS
(rows, reductions, products, pads, selects, scans, argmax, a half-precision row, a pooling window, a group of
updates one kernel stores), the kernel it schedules into (under the layout pass, or else the plain cut), or for a
convolution (3x3, strided, dilated, depthwise) each kernel of the chain the layout pass cuts it into, lowered under
Opts of every kind: upcasts of any axis by 2-16 (whole vectors or not), SIMD vectors of 4-16 lanes over the last
axis's copies, threads over any axis, unrolled reduces, cache blocks and reduces in chunks of K (ktile). A lowering
that raises is a finding too. It found a softmax read in vectors from its row kept in a local array, which computed
lane 0's value in every lane (off by 0.13-0.97); a one-row max pool whose load index was the vector lane alone,
which crashed the lowering; and a row max in chunks of K whose one-tile region and remainder shared one chunk loop
(the remainder's rows off by up to 3.0).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import numpy as np

from uopc.codegen.rangeify import Ctx, lower
from uopc.opt.heuristic import HandOpt
from uopc.opt.opts import Opts
from uopc.renderer.c import render_c
from uopc.runtime.buffer import aligned_empty, buffer_data
from uopc.runtime.compiler import Program, machine
from uopc.schedule import schedule
from uopc.schedule.plan import RefKind, Schedule, ScheduleItem
from uopc.tensor import Tensor
from uopc.uop import Ops, UOp, epilogue_reduce
from uopc.uop.dtype import DType

__all__ = ["PROGRAMS", "Case", "check", "one_kernel", "random_opts", "run_kernel", "run_schedule"]

RTOL = 1e-4  # of the largest |value| of NumPy's result (float32 rows of up to 128 and sums of up to 64 products)


def _softmax(v: np.ndarray) -> np.ndarray:
    e = np.exp(v - v.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layernorm(v: np.ndarray) -> np.ndarray:
    m = v.mean(-1, keepdims=True)
    return (v - m) / np.sqrt(((v - m) ** 2).mean(-1, keepdims=True) + 1e-5)


class Case(NamedTuple):
    """A program: its inputs' shapes from the seed's sizes (R, C, K), uopc's form and NumPy's (each a value, or a
    tuple of them: roots realized together, run as the schedule cuts them)."""

    name: str
    shapes: Callable[[int, int, int], list[tuple[int, ...]]]
    uopc: Callable[..., Tensor]
    numpy: Callable[..., np.ndarray]
    rtol: float = RTOL
    # run as the chain of kernels the optimizer's schedule cuts it into, each under Opts of its own (else: one_kernel)
    chain: bool = False


def _rc(r: int, c: int, k: int) -> list[tuple[int, ...]]:
    return [(r, c)]


def _taller(r: int, c: int, k: int) -> list[tuple[int, ...]]:
    return [(r + 1, c)]  # (a 2x2 window over at least 2 rows)


def _row_and_columns(r: int, c: int, k: int) -> list[tuple[int, ...]]:
    return [(r, c), (1, c)]


def _product_bt(r: int, c: int, k: int) -> list[tuple[int, ...]]:
    return [(r, k), (c, k)]


def _product(r: int, c: int, k: int) -> list[tuple[int, ...]]:
    return [(r, k), (k, c)]


def _conv(x: np.ndarray, w: np.ndarray, stride: int = 1, pad: int = 1, dil: int = 1, groups: int = 1) -> np.ndarray:
    """PyTorch's conv2d (NCHW, OIHW weights), tap by tap."""
    (n, _, h, wd), (k, cg, kh, kw) = x.shape, w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1, (wd + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    out, kg = np.zeros((n, k, oh, ow)), k // groups
    for i in range(kh):
        for j in range(kw):
            tap = xp[:, :, i * dil :: stride, j * dil :: stride][:, :, :oh, :ow]
            for g in range(groups):
                xs, ws = tap[:, g * cg : (g + 1) * cg], w[g * kg : (g + 1) * kg, :, i, j]
                out[:, g * kg : (g + 1) * kg] += np.einsum("nchw,kc->nkhw", xs, ws)
    return out


def _image(r: int, c: int, k: int) -> list[tuple[int, ...]]:
    return [(2, 3, r, c), (k, 3, 3, 3)]


def _depthwise(r: int, c: int, k: int) -> list[tuple[int, ...]]:
    return [(1, 4, r, c), (4, 1, 3, 3)]


def _updates(m, g, x):  # (Tensors or NumPy arrays alike)
    a = m * 0.9 + g * 0.1
    b = g * g * 0.5 + x
    return a, b, x - a * 0.3 / (b * b + 1) ** 0.5


PROGRAMS = [
    Case("softmax", _rc, lambda t: t.softmax(-1), _softmax),
    Case("log_softmax", _rc, lambda t: t.log_softmax(-1), lambda v: np.log(_softmax(v))),
    Case("layernorm", _rc, lambda t: t.layernorm(-1), _layernorm),
    Case("softmax * x", _rc, lambda t: t.softmax(-1) * t, lambda v: _softmax(v) * v),
    Case("row sum", _rc, lambda t: t.sum(-1), lambda v: v.sum(-1)),
    Case("row max", _rc, lambda t: t.max(-1), lambda v: v.max(-1)),
    Case("column sum", _rc, lambda t: t.sum(0), lambda v: v.sum(0)),
    Case("broadcast", _row_and_columns, lambda t, u: (t * 2 + u).exp(), lambda v, w: np.exp(v * 2 + w)),
    Case("transpose", _rc, lambda t: t.T * 1.5, lambda v: v.T * 1.5),
    Case("matmul", _product, lambda t, u: t @ u, lambda v, w: v @ w),
    Case("matmul, B transposed", _product_bt, lambda t, u: t @ u.T, lambda v, w: v @ w.T),
    Case("padded", _rc, lambda t: t.pad(((1, 2), (3, 0))) * 2, lambda v: np.pad(v, ((1, 2), (3, 0))) * 2),
    Case("select", _rc, lambda t: (t > 0).where(t, t * 0.1), lambda v: np.where(v > 0, v, v * 0.1)),
    Case("cumsum", _rc, lambda t: t.cumsum(-1), lambda v: v.cumsum(-1)),
    Case("argmax", _rc, lambda t: t.argmax(-1), lambda v: v.argmax(-1)),
    Case("half softmax", _rc, lambda t: t.half().softmax(-1).float(), _softmax, 2e-3),
    Case(
        "pool",
        _taller,
        lambda t: t.reshape(1, 1, *t.shape).max_pool2d(2, 1).reshape(-1),
        lambda v: np.maximum(np.maximum(v[:-1, :-1], v[1:, :-1]), np.maximum(v[:-1, 1:], v[1:, 1:])).reshape(-1),
    ),
    # three roots one kernel stores (uopc.schedule.groups), the third from the first two's values, as AdamW's update
    Case("updates", lambda r, c, k: [(r, c)] * 3, _updates, _updates),
    # convolutions: a padded copy, the product over windows read in place (stride 2: with the positions as rows, or
    # with fewer than 16 output channels the windows copied, im2col), and a crop, each kernel under random Opts
    Case("conv 3x3", _image, lambda t, u: t.conv2d(u, padding=1), _conv, chain=True),
    Case(
        "conv 3x3 stride 2", _image, lambda t, u: t.conv2d(u, padding=1, stride=2), partial(_conv, stride=2), chain=True
    ),
    Case(
        "conv 3x3 dilation 2",
        _image,
        lambda t, u: t.conv2d(u, padding=2, dilation=2),
        partial(_conv, pad=2, dil=2),
        chain=True,
    ),
    Case(
        "depthwise conv",
        _depthwise,
        lambda t, u: t.conv2d(u, padding=1, groups=4),
        partial(_conv, groups=4),
        chain=True,
    ),
]


def random_opts(rng: np.random.Generator, shape: tuple[int, ...], reduces: bool, k: int = 0) -> Opts:
    """Opts of every kind for an output of `shape` (unroll only where the kernel reduces; K in chunks, ktile, only
    where its innermost reduce axis, of size `k`, has a divisor to chunk it by)."""
    nd = len(shape)
    upcast = {ax: int(rng.choice([2, 3, 4, 8, 16])) for ax in range(nd) if rng.random() < 0.6}
    vec = 0
    if nd and upcast.get(nd - 1, 1) in (4, 8, 16) and rng.random() < 0.7:
        vec = int(rng.choice([v for v in (4, 8, 16) if upcast[nd - 1] % v == 0]))
    thread = int(rng.integers(nd)) if nd and rng.random() < 0.4 else None
    unroll = int(rng.choice([1, 2, 4])) if reduces else 1
    tile = {ax: int(rng.choice([8, 16, 32])) for ax in range(nd) if shape[ax] > 8 and rng.random() < 0.2}
    ktile = 0
    if (chunks := [d for d in range(2, k) if k % d == 0]) and rng.random() < 0.35:
        # (lowering takes a chunk only without unrolling, and a float sum only under a register tile: _ktile)
        ktile, unroll = int(rng.choice(chunks)), 1
    return Opts(upcast=upcast, thread=thread, unroll=unroll, tile=tile, ktile=ktile, vec=vec)


def _reduce_size(body: UOp) -> int:
    """The innermost reduce axis's size of the reduce a kernel stores (or whose epilogue it stores): 0 if none."""
    r = epilogue_reduce(body)
    return int(r.src[0].shape[-1]) if r is not None and isinstance(r.src[0].shape[-1], int) else 0


def one_kernel(root: UOp) -> tuple[ScheduleItem, list[UOp]] | None:
    """The one kernel `root` schedules into under the layout pass (a row kept in its output), else under the plain
    cut (a matmul whose B the layout pass would pack), and the input BUFFERs its refs name; None if it takes more."""
    for opt in (HandOpt(machine()), None):
        sched, inputs = schedule([root], False, opt)
        if len(sched.items) == 1:
            return sched.items[0], inputs
    return None


def _fresh(size: int, dtype: DType) -> np.ndarray:
    """An aligned array prefilled with NaN (-1 for integers): an element never written shows."""
    a = aligned_empty(size, dtype)
    a[:] = np.nan if a.dtype.kind == "f" else -1
    return a


def _copy_in(b: UOp) -> np.ndarray:
    """An aligned copy of input BUFFER `b`'s values (uopc's storage is 64-byte aligned, NumPy's 16)."""
    data = buffer_data(b)
    a = aligned_empty(data.size, b.dtype)
    a[:] = data
    return a


def run_kernel(item: ScheduleItem, inputs: list[UOp], opts: Opts) -> np.ndarray:
    """Lower `item` under `opts`, compile and run it on its inputs' values; its output (flat). Its arrays are
    aligned, as uopc's own buffers are (a vector access proven aligned may be an aligned one), and the output is
    prefilled with NaN (-1 for integers), so an element never written shows."""
    out = _fresh(item.out.arg.shape[0], item.out.dtype)
    args = [out if ref.kind is RefKind.OUT else _copy_in(inputs[ref.i]) for ref in item.refs]
    Program(render_c(lower(item.body, item.out, Ctx(opts=opts)), "k", opts.register_tile), "k")(*args)
    return out


def run_schedule(sched: Schedule, inputs: list[UOp], opts: list[Opts]) -> np.ndarray:
    """Lower each kernel of `sched` under its Opts, compile it, and run them in order on the inputs' values; the
    roots' outputs, flat, one after another. Temps and outputs start as run_kernel's output does."""
    arrays: dict[RefKind, list[np.ndarray]] = {
        RefKind.IN: [_copy_in(b) for b in inputs],
        RefKind.TMP: [_fresh(t.size, t.dtype) for t in sched.temps],
        RefKind.OUT: [_fresh(o.size, o.dtype) for o in sched.outs],
    }
    for item, o in zip(sched.items, opts, strict=True):
        if item.copy is not None or item.checks:
            raise ValueError(f"run_schedule: {item.name} copies a buffer or checks indices (not run here)")
        args = [arrays[ref.kind][ref.i] for ref in item.refs]
        Program(render_c(lower(item.body, item.out, Ctx(opts=o), item.more), "k", o.register_tile), "k")(*args)
    return np.concatenate(arrays[RefKind.OUT])


def _draw(rng: np.random.Generator, item: ScheduleItem) -> Opts:
    reduces = any(u.op is Ops.REDUCE for u in item.body.toposort())
    return random_opts(rng, item.body.shape, reduces, _reduce_size(item.body))


def check(seed: int, programs: list[Case] | None = None) -> list[str]:
    """Seed `seed`'s shapes and Opts over `programs` (PROGRAMS, or some of them in its order: a seed's draws for a
    program depend on the programs before it): a report for each result NumPy disagrees with, or each lowering that
    raised (none: [])."""
    rng = np.random.default_rng(seed)
    r, c, k = (int(rng.choice(v)) for v in ([1, 3, 6, 12, 17, 33, 64], [5, 16, 33, 100, 128], [7, 32, 40]))
    bad = []
    for p in PROGRAMS if programs is None else programs:
        arrays = [rng.standard_normal(s).astype(np.float32) for s in p.shapes(r, c, k)]
        got = p.uopc(*[Tensor(a) for a in arrays])
        roots = [t.uop for t in (got if isinstance(got, tuple) else (got,))]
        if p.chain or len(roots) > 1:
            sched, inputs = schedule(roots, False, HandOpt(machine()))
            opts = [_draw(rng, item) for item in sched.items]
            what = f"seed {seed}: {p.name}, " + ", ".join(f"{i.name} under {o}" for i, o in zip(sched.items, opts))
            run: Callable[[], np.ndarray] = partial(run_schedule, sched, inputs, opts)
        elif (kernel := one_kernel(roots[0])) is not None:
            item, inputs = kernel
            opts1 = _draw(rng, item)
            what = f"seed {seed}: {p.name} {'x'.join(map(str, item.body.shape))} under {opts1}"
            run = partial(run_kernel, item, inputs, opts1)
        else:
            continue
        try:
            out = run()
        except Exception as e:  # noqa: BLE001  (a crash of lowering is a finding like a wrong value)
            bad.append(f"{what}: {type(e).__name__}: {e}")
            continue
        want = p.numpy(*[a.astype(np.float64) for a in arrays])
        want = np.concatenate([w.reshape(-1) for w in want]) if isinstance(want, tuple) else want.reshape(-1)
        err = np.abs(out - want).max() / max(np.abs(want).max(), 1e-6)
        if not err <= p.rtol:
            bad.append(f"{what}: error {err:.3g}")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="seeds to run")
    ap.add_argument("--seed", type=int, default=0, help="the first seed")
    args = ap.parse_args(argv)
    bad = [rep for s in range(args.seed, args.seed + args.n) for rep in check(s)]
    print("\n".join(bad) + ("\n" if bad else "") + f"{args.n} seeds, {len(bad)} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""GEMM epilogues with math in them (SiLU, sigmoid, tanh, GELU): the activation applied to the microkernel's tile
against the same GEMM with a kernel of its own after it; and a MobileNetV2-style stack against PyTorch eager. One
process, interleaved rounds, medians.

    python bench/bench_epilogues.py                   # both tables, batch 1 and 8
    python bench/bench_epilogues.py --rounds 21 --batch 8 --sections fused

fused: 1x1 convolutions (eval-mode BatchNorm, then the activation) under TinyJit, as uopc plans them: exp2 and 1/x on
the tile's vectors (renderer.c_math.EXP2F_VECTOR). apart: the same, built in the same process with float32 exp2 and
1/x taken out of what an epilogue may apply (opt.gemm.VECTOR_MATH and codegen.lanes.VECTOR_MATH empty), so the GEMM
stores its product and an elementwise kernel applies BatchNorm and the activation. Each shape is built in both orders
(the plan built first tends to run a few percent faster on this project's VMs); the ratio is fused / apart.

stack: six blocks of 1x1 expand + BatchNorm + act, depthwise 3x3 + BatchNorm + act, 1x1 project + BatchNorm, residual
(expansion 6; 24, 40 and 80 channels at 56, 28 and 14 pixels), eval mode, uopc under TinyJit against PyTorch eager
under no_grad, 2 threads each, outputs checked against each other first.

How each side allocates: first-touch page faults are very expensive here, so the script re-executes itself with glibc
told to keep freed memory (MALLOC_MMAP_MAX_=0, a large MALLOC_TRIM_THRESHOLD_), as bench_onnx.py does: PyTorch's
allocations each call then reuse glibc's pages. uopc's replay writes into its captured plan's buffers. OpenBLAS is on
neither side's path.
"""

from __future__ import annotations

import os
import sys

MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
if any(os.environ.get(k) != v for k, v in MALLOC.items()):  # glibc reads these at start-up: re-exec with them set
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC})

import argparse  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402

os.environ.setdefault("UOPC_CACHE", tempfile.mkdtemp(prefix="uopc-bench-"))  # noqa: E402 (an empty cache)

from uopc import Tensor, TinyJit  # noqa: E402
from uopc.codegen import lanes  # noqa: E402
from uopc.engine import plan_store, realize  # noqa: E402
from uopc.engine.lower import clear_lowered  # noqa: E402
from uopc.nn import BatchNorm2d, Conv2d  # noqa: E402
from uopc.opt import gemm  # noqa: E402
from uopc.renderer import plan as render_plan  # noqa: E402
from uopc.runtime import set_num_threads  # noqa: E402
from uopc.tools.harness import interleave, medians, new_inputs, timed  # noqa: E402

# (Cin, Cout, pixels, activation): MobileNet/EfficientNet-sized 1x1 convolutions
SHAPES = [(32, 96, 56, "silu"), (64, 128, 56, "silu"), (96, 24, 56, "silu"), (64, 256, 56, "gelu"),
          (64, 64, 56, "tanh"), (128, 512, 14, "sigmoid")]  # fmt: skip
STACK = [(24, 56), (24, 56), (40, 28), (40, 28), (80, 14), (80, 14)]  # (channels, pixels) per block


def _bn(c: int, g: np.random.Generator) -> BatchNorm2d:
    bn = BatchNorm2d(c)
    bn.running_mean = Tensor(g.standard_normal(c).astype(np.float32) * 0.1)
    bn.running_var = Tensor(g.random(c).astype(np.float32) + 0.5)
    return bn


def _fresh_plans() -> None:
    """Forget every plan, lowered kernel and rendered unit of this process (and never read the plan store: its key
    does not hold the switch this script flips)."""
    realize._plans.clear()
    clear_lowered()
    render_plan._units.clear()


def fused_vs_apart(batch: int, rounds: int) -> None:
    g = np.random.default_rng(0)
    fused_ops = gemm.VECTOR_MATH
    print(f"\n1x1 convolution + BatchNorm + act, batch {batch}: fused (act on the tile) / apart (a kernel after)")
    for order in ("fused first", "apart first"):
        runners, kernels = {}, {}
        for cin, cout, size, act in SHAPES:
            x = new_inputs(Tensor(g.standard_normal((batch, cin, size, size)).astype(np.float32)))[0]
            conv, bn = Conv2d(cin, cout, 1, bias=False), _bn(cout, g)
            variants = [("fused", fused_ops), ("apart", frozenset())]
            for name, ops in variants if order == "fused first" else variants[::-1]:
                gemm.VECTOR_MATH = lanes.VECTOR_MATH = ops
                _fresh_plans()
                jit = TinyJit(lambda x, conv=conv, bn=bn, act=act: getattr(bn(conv(x)), act)().realize())
                jit(x), jit(x)
                kernels[(cin, cout, size, act, name)] = len(list(realize._plans.values())[-1].plan.kernels)
                runners[(cin, cout, size, act, name)] = timed(lambda jit=jit, x=x: jit(x))
            gemm.VECTOR_MATH = lanes.VECTOR_MATH = fused_ops
        med = medians(interleave(runners, rounds))
        print(f"  ({order})")
        for cin, cout, size, act in SHAPES:
            f, a = med[(cin, cout, size, act, "fused")], med[(cin, cout, size, act, "apart")]
            nk = kernels[(cin, cout, size, act, "fused")], kernels[(cin, cout, size, act, "apart")]
            print(f"  {cin:3d}->{cout:3d} {size}x{size} {act:8s} fused {f * 1e3:7.3f} ms ({nk[0]} kernels)  "
                  f"apart {a * 1e3:7.3f} ms ({nk[1]} kernels)  fused/apart {f / a:.2f}")  # fmt: skip


def stack_vs_torch(batch: int, rounds: int, act: str) -> None:
    import torch

    torch.set_num_threads(2)
    g = np.random.default_rng(1)
    torch_act = {"silu": torch.nn.SiLU, "relu6": torch.nn.ReLU6}[act]
    blocks = []
    for c, _ in STACK:
        e = 6 * c
        convs = [Conv2d(c, e, 1, bias=False), Conv2d(e, e, 3, 1, 1, groups=e, bias=False), Conv2d(e, c, 1, bias=False)]
        blocks.append((convs, [_bn(n, g) for n in (e, e, c)]))

    def block_uopc(x: Tensor, convs, bns) -> Tensor:
        h = getattr(bns[0](convs[0](x)), act)()
        h = getattr(bns[1](convs[1](h)), act)()
        return bns[2](convs[2](h)) + x

    def step(*xs: Tensor) -> list[Tensor]:
        outs = [block_uopc(x, *b) for x, b in zip(xs, blocks, strict=True)]
        Tensor.realize_all(*outs)
        return outs

    tblocks = []
    for convs, bns in blocks:
        layers = []
        for i, (conv, bn) in enumerate(zip(convs, bns, strict=True)):
            tc = torch.nn.Conv2d(conv.weight.shape[1] * conv.groups, conv.weight.shape[0], conv.weight.shape[2],
                                 padding=conv.padding, groups=conv.groups, bias=False)  # fmt: skip
            tc.weight.data = torch.from_numpy(conv.weight.numpy().copy())
            tb = torch.nn.BatchNorm2d(bn.running_mean.shape[0]).eval()
            tb.running_mean.data = torch.from_numpy(bn.running_mean.numpy().copy())
            tb.running_var.data = torch.from_numpy(bn.running_var.numpy().copy())
            layers += [tc, tb] + ([torch_act()] if i < 2 else [])
        tblocks.append(torch.nn.Sequential(*layers).eval())
    xs = [g.standard_normal((batch, c, s, s)).astype(np.float32) for c, s in STACK]
    uxs, txs = new_inputs(*(Tensor(x) for x in xs)), [torch.from_numpy(x) for x in xs]
    jit = TinyJit(step)
    for _ in range(3):
        outs = jit(*uxs)

    def run_torch() -> None:
        with torch.no_grad():
            for b, x in zip(tblocks, txs, strict=True):
                b(x) + x

    with torch.no_grad():
        refs = [(b(x) + x).numpy() for b, x in zip(tblocks, txs, strict=True)]
    err = max(float(np.abs(o.numpy() - r).max() / np.abs(r).max()) for o, r in zip(outs, refs, strict=True))
    med = medians(interleave({"uopc": timed(lambda: jit(*uxs)), "torch": timed(run_torch)}, rounds))
    kernels = len(list(realize._plans.values())[-1].plan.kernels)
    u, t = med["uopc"], med["torch"]
    print(f"  {act:6s} batch {batch}: uopc {u * 1e3:7.2f} ms ({kernels} kernels)  torch eager {t * 1e3:7.2f} ms  "
          f"uopc/torch {u / t:.2f}  (max |diff| / max |out| {err:.1e})")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--sections", default="fused,stack", help="fused (fused vs apart), stack (against torch)")
    args = ap.parse_args()
    set_num_threads(2)
    plan_store.load = lambda name: None  # (see _fresh_plans)
    print(f"load average {os.getloadavg()[0]:.2f}; uopc 2 threads")
    batches = [int(b) for b in args.batch.split(",")]
    for batch in batches if "fused" in args.sections else []:
        fused_vs_apart(batch, args.rounds)
    if "stack" in args.sections:
        print("\nMobileNetV2-style stack (6 blocks), eval: uopc under TinyJit against PyTorch eager")
        for batch in batches:
            for act in ("relu6", "silu"):
                stack_vs_torch(batch, args.rounds, act)


if __name__ == "__main__":
    main()

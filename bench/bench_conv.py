"""Convolutions, the CNN training step and ResNet-18 inference: uopc against PyTorch eager, torch.compile and
onnxruntime in the same run, interleaved rounds, medians.

    python bench/bench_conv.py                        # every section (torch.compile's compiles take a minute or two)
    python bench/bench_conv.py --sections conv,step   # conv, step, jitstep, resnet, convs, mobilenet, dw
    python bench/bench_conv.py --no-compile --threads 1

conv: forward, then the gradients of x and w for a given output gradient (uopc: one plan for out, dx, dw), eager.
step: examples/train_cnn.py's model (conv-BN-ReLU-pool twice, fc 128, dropout, fc 10), batch 128, cross-entropy,
backward, AdamW, BatchNorm running statistics, the graph built every step (eager). jitstep: bench/models.py's CNN
step under TinyJit against PyTorch eager and torch.compile. resnet: ResNet-18 (torchvision's architecture, random
weights, randomized BatchNorm statistics) at 224x224, batch 1 and 8: uopc's own model (bench/models.py) under
TinyJit against PyTorch eager, torch.compile and onnxruntime running PyTorch's ONNX export. convs: each distinct
3x3 convolution of ResNet-18 at batch 1, forward under TinyJit, in GFLOP/s and as a fraction of the FMA peak
measured in the same run (bench_gemm.fma_peak), beside PyTorch eager's; a convolution that runs by Winograd (the
title says F(m,3)) is counted at the direct convolution's FLOPs, so its GFLOP/s are effective ones and may pass
the peak. mobilenet: MobileNetV2 (torchvision's, bench/mobilenets.py) as resnet runs ResNet-18. dw: its depthwise
3x3 convolutions (stride 1 and 2) at batch 1 and 8, forward under TinyJit, against PyTorch eager, with uopc's GB/s.

Each round times every side back to back; ratios are of the medians (below 1: uopc is faster). Allocation: uopc's
replays write into the buffers their plans hold (temporaries from its pool); its inputs count as new ones each call
(uopc.tools.harness.new_inputs: nothing computed from them is kept across calls, only a weight's prepacking);
PyTorch allocates through glibc each call; onnxruntime from its arena. OpenBLAS is on no side's path.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

import models  # bench/models.py (run as a script, bench/ is on sys.path)
import numpy as np
from bench_gemm import fma_peak

from uopc.engine import realize
from uopc.engine.jit import TinyJit
from uopc.nn import AdamW, BatchNorm2d, Conv2d, Linear, Sequential, parameters
from uopc.runtime import compiler as runtime
from uopc.tensor import Tensor
from uopc.tensor.conv import _winograd_tile
from uopc.tools.harness import interleave, medians, new_inputs, timed

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the benchmark still times uopc alone
    torch = None


def conv_uopc(x: np.ndarray, w: np.ndarray, g: np.ndarray):
    # (a training step's input, weight and output gradient all change from step to step: nothing of theirs is kept)
    xt, wt, gt = new_inputs(Tensor(x, requires_grad=True), Tensor(w, requires_grad=True), Tensor(g))

    def run() -> None:
        out = xt.conv2d(wt, padding=1)
        dx, dw = (out * gt).sum().gradient(xt, wt)
        Tensor.realize_all(out, dx, dw)

    return run


def conv_torch(x: np.ndarray, w: np.ndarray, g: np.ndarray):
    xt, wt, gt = (torch.tensor(a) for a in (x, w, g))
    xt.requires_grad_(), wt.requires_grad_()

    def run() -> None:
        out = F.conv2d(xt, wt, padding=1)
        torch.autograd.grad(out, (xt, wt), gt)

    return run


class CNN:
    """examples/train_cnn.py's model: conv-BN-ReLU-pool twice, fc 128, dropout 0.25 (a host Bernoulli mask), fc 10."""

    def __init__(self):
        self.features = Sequential(
            Conv2d(1, 16, 3, padding=1, bias=False), bn1 := BatchNorm2d(16), Tensor.relu, Tensor.max_pool2d,
            Conv2d(16, 32, 3, padding=1, bias=False), bn2 := BatchNorm2d(32), Tensor.relu, Tensor.max_pool2d,
        )  # fmt: skip
        self.bns, self.fc, self.head = [bn1, bn2], Linear(32 * 7 * 7, 128), Linear(128, 10)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.fc(self.features(x).flatten(1)).relu()
        keep = Tensor.rand(*x.shape) >= 0.25
        return self.head(keep.where(x * (1 / 0.75), 0.0))

    def buffers(self) -> list[Tensor]:
        return [t for bn in self.bns for t in bn.buffers()]


def step_uopc(data, lr: float):
    Tensor.manual_seed(0)
    model = CNN()
    opt = AdamW(parameters(model), lr=lr)
    i = [0]

    def run() -> None:
        x, y = data[i[0] % len(data)]
        i[0] += 1
        with Tensor.train():
            loss = model(Tensor(x)).cross_entropy(Tensor(y))
            opt.zero_grad()
            loss.backward(opt.params)
            opt.step(loss, *model.buffers())

    return run


def step_torch(data, lr: float):
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10),
    )  # fmt: skip
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    tdata = [(torch.from_numpy(x), torch.from_numpy(y).long()) for x, y in data]
    i = [0]

    def run() -> None:
        x, y = tdata[i[0] % len(tdata)]
        i[0] += 1
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return run


def ms_per_call(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


def compare(name: str, runners: dict, rounds: int, n: int) -> None:
    for fn in runners.values():  # warm up: uopc compiles its plan in the first calls
        ms_per_call(fn, 2)
    plans = len(realize._plans)
    times: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(rounds):
        for k, fn in runners.items():
            times[k].append(ms_per_call(fn, n))
        print(f"  {name} round {r + 1}: " + "  ".join(f"{k} {v[-1]:.1f} ms" for k, v in times.items()))
    med = {k: statistics.median(v) for k, v in times.items()}
    line = f"{name}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in med.items())
    if "torch" in med:
        line += f"  ratio uopc / torch {med['uopc'] / med['torch']:.2f}"
    print(line + f"  (uopc plans built while timing: {len(realize._plans) - plans})")


def table(title: str, runners: dict, rounds: int, flops: float | None = None, peak: float | None = None) -> dict:
    """Interleaved rounds of `runners` (name -> timed runner), then one line: each side's median and uopc's ratios
    (and GFLOP/s, % of the FMA peak, when `flops` is given)."""
    med = medians(interleave(runners, rounds))
    line = f"{title:44s}" + "".join(f" {k} {v * 1e3:8.2f} ms" for k, v in med.items())
    line += "".join(f"  /{k} {med['uopc'] / v:.2f}" for k, v in med.items() if k != "uopc")
    if flops:
        line += f"  uopc {flops / med['uopc'] / 1e9:.0f} GFLOP/s"
        if peak:
            line += f" ({100 * flops / med['uopc'] / 1e9 / peak:.0f}% of peak)"
        if "torch" in med:
            line += f", torch {flops / med['torch'] / 1e9:.0f}"
    print(line, flush=True)
    return med


def jit_step(args) -> None:
    """bench/models.py's CNN step: uopc under TinyJit, PyTorch eager and torch.compile."""
    w = models.build("cnn", "uopc")
    xs = new_inputs(*(Tensor(a) for a in w.inputs))
    step = TinyJit(lambda *a: w.call(*a).realize())
    runners = {"uopc": timed(lambda: step(*xs))}
    if torch is not None:
        for name, compiled in (("torch", False), ("torch.compile", True))[: 1 if args.no_compile else 2]:
            t = models.build("cnn", "torch", compile=compiled)
            tin = tuple(map(torch.from_numpy, t.inputs))
            runners[name] = timed(lambda t=t, tin=tin: t.call(*tin))
    table("CNN training step, batch 128, TinyJit", runners, args.rounds)


def image_model(args, name: str, title: str) -> None:
    """Image model `name` of bench/models.py (ResNet-18, MobileNetV2) at 224x224, batch 1 and 8: uopc's model under
    TinyJit, PyTorch eager, torch.compile, onnxruntime (PyTorch's ONNX export)."""
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    for batch in (1, 8):
        w = models.build(name, "uopc", batch=batch, seq=224)
        xs = new_inputs(*(Tensor(a) for a in w.inputs))
        fwd = TinyJit(lambda *a, w=w: w.call(*a).realize())
        runners = {"uopc": timed(lambda fwd=fwd, xs=xs: fwd(*xs))}
        if torch is not None:
            t = models.build(name, "torch", batch=batch, seq=224)
            models.copy_weights(t.model, w.model)
            tin = tuple(map(torch.from_numpy, t.inputs))
            ref, ours = t.call(*tin).numpy(), fwd(*xs).numpy()
            err = np.abs(ours - ref).max() / np.abs(ref).max()
            runners["torch"] = timed(lambda t=t, tin=tin: t.call(*tin))
            if not args.no_compile:
                c = models.build(name, "torch", batch=batch, seq=224, compile=True)
                c.model.load_state_dict(t.model.state_dict())
                runners["torch.compile"] = timed(lambda c=c, tin=tin: c.call(*tin))
            if ort is not None:
                path = os.path.join(tempfile.mkdtemp(), f"{name}.onnx")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    torch.onnx.export(t.model, tin, path, dynamo=False, input_names=["image"], output_names=["out"])
                opts = ort.SessionOptions()
                opts.intra_op_num_threads, opts.inter_op_num_threads = runtime.get_num_threads(), 1
                sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
                feeds = {"image": t.inputs[0]}
                runners["onnxruntime"] = timed(lambda sess=sess, feeds=feeds: sess.run(None, feeds))
            print(f"  ({name} b{batch}: uopc against torch, max |diff| / max |out| = {err:.1e})")
        table(f"{title} inference, 224x224, batch {batch}", runners, args.rounds)


# the distinct 3x3 convolutions of ResNet-18 at 224x224: (in channels, out channels, input size, stride)
RESNET18_3X3 = [(64, 64, 56, 1), (64, 128, 56, 2), (128, 128, 28, 1), (128, 256, 28, 2), (256, 256, 14, 1),
                (256, 512, 14, 2), (512, 512, 7, 1)]  # fmt: skip


def convs(args, peak: float) -> None:
    """Each distinct 3x3 convolution of ResNet-18, batch 1, forward: GFLOP/s and the fraction of the FMA peak."""
    g = np.random.default_rng(0)
    for cin, cout, size, stride in RESNET18_3X3:
        x = g.standard_normal((1, cin, size, size)).astype(np.float32)
        wt = (g.standard_normal((cout, cin, 3, 3)) * 0.05).astype(np.float32)
        (xu,), wu = new_inputs(Tensor(x)), Tensor(wt)
        fwd = TinyJit(lambda x, wu=wu, stride=stride: x.conv2d(wu, padding=1, stride=stride).realize())
        runners = {"uopc": timed(lambda fwd=fwd, xu=xu: fwd(xu))}
        if torch is not None:
            xt, wtt = torch.from_numpy(x), torch.from_numpy(wt)
            runners["torch"] = timed(lambda xt=xt, wtt=wtt, s=stride: F.conv2d(xt, wtt, padding=1, stride=s))
        out = size // stride
        flops = 2 * cin * cout * 9 * out * out  # the direct convolution's: Winograd's GFLOP/s are effective ones
        wino = _winograd_tile(xu, wu, (stride,) * 2, (1, 1), [(1, 1)] * 2, 1, [out, out])
        how = f" (F({wino},3))" if wino else ""
        table(f"conv3x3 {cin}->{cout} {size}x{size} stride {stride}{how}", runners, args.rounds, flops, peak)


# MobileNetV2's depthwise 3x3 convolutions at 224x224: (channels, input size, stride); its four of stride 2 and
# three of stride 1
MOBILENET_DW = [(96, 112, 2), (144, 56, 2), (192, 28, 2), (576, 14, 2), (32, 112, 1), (144, 56, 1), (384, 14, 1)]


def depthwise(args) -> None:
    """Each MobileNetV2 depthwise convolution (groups = channels, padding 1), forward under TinyJit, batch 1 and 8,
    against PyTorch eager, with uopc's GB/s for the input read and the output written once."""
    g = np.random.default_rng(0)
    for batch in (1, 8):
        for c, size, stride in MOBILENET_DW:
            x = g.standard_normal((batch, c, size, size)).astype(np.float32)
            wt = g.standard_normal((c, 1, 3, 3)).astype(np.float32)
            (xu,), wu = new_inputs(Tensor(x)), Tensor(wt)
            fwd = TinyJit(lambda x, wu=wu, s=stride, c=c: x.conv2d(wu, padding=1, stride=s, groups=c).realize())
            runners = {"uopc": timed(lambda fwd=fwd, xu=xu: fwd(xu))}
            if torch is not None:
                xt, wtt = torch.from_numpy(x), torch.from_numpy(wt)
                runners["torch"] = timed(lambda xt=xt, wtt=wtt, s=stride, c=c: F.conv2d(xt, wtt, None, s, 1, 1, c))
            med = table(f"depthwise 3x3 {c} {size}x{size} stride {stride} batch {batch}", runners, args.rounds)
            moved = 4 * batch * c * (size * size + (size // stride) ** 2)
            print(f"  (uopc {moved / med['uopc'] / 1e9:.1f} GB/s: its input read and its output written once)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--conv-calls", type=int, default=3, help="conv fwd+bwd calls per round")
    ap.add_argument("--steps", type=int, default=10, help="training steps per round")
    ap.add_argument("--threads", type=int, default=2, help="threads for every side (0: each one's default)")
    ap.add_argument("--sections", default="conv,step,jitstep,resnet,convs,mobilenet,dw", help="which sections to run")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out (its compiles take minutes)")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    unknown = sections - {"conv", "step", "jitstep", "resnet", "convs", "mobilenet", "dw"}
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}")
    if args.threads:
        runtime.set_num_threads(args.threads)
        if torch is not None:
            torch.set_num_threads(args.threads)
    print(
        f"uopc {runtime.get_num_threads()} threads"
        + (f", torch {torch.__version__} {torch.get_num_threads()} threads" if torch else ", torch not installed")
        + f"; load average {os.getloadavg()[0]:.2f}"
    )
    peak = fma_peak(runtime.get_num_threads())
    print(f"FMA peak (generated kernel of independent FMAs, {runtime.get_num_threads()} threads): {peak:.0f} GFLOP/s")
    g = np.random.default_rng(0)
    if "conv" in sections:
        x = g.standard_normal((64, 32, 28, 28)).astype(np.float32)
        w = (g.standard_normal((64, 32, 3, 3)) * 0.1).astype(np.float32)
        gout = g.standard_normal((64, 64, 28, 28)).astype(np.float32)
        conv = {"uopc": conv_uopc(x, w, gout)}
        if torch is not None:
            conv["torch"] = conv_torch(x, w, gout)
        compare("conv2d fwd+bwd (64,32,28,28)*(64,32,3,3) pad 1", conv, args.rounds, args.conv_calls)
        flops = 3 * 2 * 64 * 64 * 32 * 9 * 28 * 28  # forward, dx, dw: the same multiply-adds each
        print(f"  (fwd+bwd {flops / 1e9:.2f} GFLOP: the FMA peak would take {flops / peak / 1e6:.2f} ms)")
    if "step" in sections:
        data = [
            (g.standard_normal((128, 1, 28, 28)).astype(np.float32), g.integers(0, 10, 128).astype(np.int32))
            for _ in range(4)
        ]
        steps = {"uopc": step_uopc(data, 1e-3)}
        if torch is not None:
            steps["torch"] = step_torch(data, 1e-3)
        compare("CNN training step, batch 128, eager", steps, args.rounds, args.steps)
    if "jitstep" in sections:
        jit_step(args)
    if "resnet" in sections:
        image_model(args, "resnet18", "ResNet-18")
    if "convs" in sections:
        convs(args, peak)
    if "mobilenet" in sections:
        image_model(args, "mobilenetv2", "MobileNetV2")
    if "dw" in sections:
        depthwise(args)


if __name__ == "__main__":
    main()

"""Convolution and CNN training step: uopc against PyTorch eager in the same run, interleaved rounds, medians.

    python bench/bench_conv.py                  # conv2d fwd+bwd (64,32,28,28) * (64,32,3,3) pad 1, and the CNN step
    python bench/bench_conv.py --rounds 7
    python bench/bench_conv.py --threads 1      # both single-threaded (steadier on a busy machine)

conv: forward, then the gradients of x and w for a given output gradient (uopc: one plan for out, dx, dw).
step: examples/train_cnn.py's model (conv-BN-ReLU-pool twice, fc 128, dropout, fc 10), batch 128, cross-entropy,
backward, AdamW, BatchNorm running statistics. Each round times both libraries back to back; the ratio is
uopc / torch of the medians (below 1: uopc is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from uopc.engine import realize
from uopc.nn import AdamW, BatchNorm2d, Conv2d, Linear, Sequential, parameters
from uopc.runtime import compiler as runtime
from uopc.tensor import Tensor

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the benchmark still times uopc alone
    torch = None


def conv_uopc(x: np.ndarray, w: np.ndarray, g: np.ndarray):
    xt, wt, gt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True), Tensor(g)

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
            Conv2d(1, 16, 3, padding=1, bias=False), bn1 := BatchNorm2d(16), Tensor.relu, Tensor.contiguous,
            Tensor.max_pool2d,
            Conv2d(16, 32, 3, padding=1, bias=False), bn2 := BatchNorm2d(32), Tensor.relu, Tensor.contiguous,
            Tensor.max_pool2d,
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--conv-calls", type=int, default=3, help="conv fwd+bwd calls per round")
    ap.add_argument("--steps", type=int, default=10, help="training steps per round")
    ap.add_argument("--threads", type=int, default=0, help="threads for both libraries (0: each one's default)")
    args = ap.parse_args()
    if args.threads:
        runtime.set_num_threads(args.threads)
        if torch is not None:
            torch.set_num_threads(args.threads)
    print(
        f"uopc {runtime.get_num_threads()} threads"
        + (f", torch {torch.__version__} {torch.get_num_threads()} threads" if torch else ", torch not installed")
    )
    g = np.random.default_rng(0)
    x = g.standard_normal((64, 32, 28, 28)).astype(np.float32)
    w = (g.standard_normal((64, 32, 3, 3)) * 0.1).astype(np.float32)
    gout = g.standard_normal((64, 64, 28, 28)).astype(np.float32)
    conv = {"uopc": conv_uopc(x, w, gout)}
    if torch is not None:
        conv["torch"] = conv_torch(x, w, gout)
    compare("conv2d fwd+bwd (64,32,28,28)*(64,32,3,3) pad 1", conv, args.rounds, args.conv_calls)

    data = [
        (g.standard_normal((128, 1, 28, 28)).astype(np.float32), g.integers(0, 10, 128).astype(np.int32))
        for _ in range(4)
    ]
    steps = {"uopc": step_uopc(data, 1e-3)}
    if torch is not None:
        steps["torch"] = step_torch(data, 1e-3)
    compare("CNN training step, batch 128", steps, args.rounds, args.steps)


if __name__ == "__main__":
    main()

"""Train a small CNN on MNIST with uopc: conv-BN-ReLU-pool twice, a hidden layer with dropout; >= 99% test accuracy.

    python examples/train_cnn.py                 # 3 epochs, batch 128, AdamW: >= 99% test accuracy
    python examples/train_cnn.py --steps 50      # a quick smoke run
    python examples/train_cnn.py --no-jit        # build and realize the step's graph every step

Every step has the same shapes (the last partial batch of an epoch is dropped), and everything that changes between
steps (the batch, the learning rate, the dropout mask) is data, so the whole step (forward, backward, AdamW update
and BatchNorm's running statistics) is one compiled plan. The step runs under uopc.TinyJit: call 1 runs normally,
call 2 captures, later calls bind the new batch and run the plan. The dropout mask is drawn in the graph from a
seed the plan advances, so every replay draws a fresh one.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from uopc import TinyJit
from uopc.engine import realize
from uopc.nn import AdamW, BatchNorm2d, Conv2d, Dropout, Linear, parameters
from uopc.nn.datasets import mnist
from uopc.runtime import compiler as runtime
from uopc.tensor import Tensor
from uopc.tools.plot import progress

MEAN, STD = 0.1307, 0.3081  # MNIST pixel statistics


class CNN:
    """conv(1->c1, 3x3) BN ReLU maxpool2 -> conv(c1->c2, 3x3) BN ReLU maxpool2 -> linear(c2*7*7 -> hidden) ReLU
    -> dropout -> linear(hidden -> 10)."""

    def __init__(self, c1: int = 16, c2: int = 32, hidden: int = 128, p_drop: float = 0.25):
        self.conv1, self.bn1 = Conv2d(1, c1, 3, padding=1, bias=False), BatchNorm2d(c1)
        self.conv2, self.bn2 = Conv2d(c1, c2, 3, padding=1, bias=False), BatchNorm2d(c2)
        self.fc, self.drop, self.head = Linear(c2 * 7 * 7, hidden), Dropout(p_drop), Linear(hidden, 10)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.bn1(self.conv1(x)).relu().max_pool2d(2)
        x = self.bn2(self.conv2(x)).relu().max_pool2d(2).flatten(1)
        return self.head(self.drop(self.fc(x).relu()))  # dropout acts only while Tensor.training

    def buffers(self) -> list[Tensor]:
        return self.bn1.buffers() + self.bn2.buffers()


def preprocess(X: np.ndarray) -> np.ndarray:
    return ((X.astype(np.float32) / 255.0 - MEAN) / STD).reshape(-1, 1, 28, 28)


def accuracy(model: CNN, X: np.ndarray, Y: np.ndarray, batch: int = 500) -> float:
    """Test accuracy in eval mode (BatchNorm uses its running statistics), fixed-shape batches (10000 = 20 x 500)."""
    correct = 0
    for i in range(0, len(X), batch):
        xb, yb = X[i : i + batch], Y[i : i + batch]
        if len(xb) < batch:  # pad the tail to the plan's shape; the padding rows are not counted
            xb = np.concatenate([xb, np.zeros((batch - len(xb), *xb.shape[1:]), xb.dtype)])
        pred = model(Tensor(xb)).argmax(1).numpy()[: len(yb)]
        correct += int((pred == yb).sum())
    return correct / len(X)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: run all epochs)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-jit", action="store_true", help="no TinyJit: build the graph every step")
    args = ap.parse_args()

    X_train, Y_train, X_test, Y_test = mnist(download=True)
    X_train, X_test = preprocess(X_train), preprocess(X_test)
    Tensor.manual_seed(args.seed)
    model = CNN()
    opt = AdamW(parameters(model), lr=args.lr)  # BatchNorm's running statistics are requires_grad=False: skipped
    n_params = sum(p.numel() for p in opt.params)
    print(f"CNN conv16-conv32-fc128-fc10 ({n_params:,} params), AdamW lr {args.lr}, batch {args.batch}")

    def train_step(x: Tensor, y: Tensor) -> Tensor:
        loss = model(x).cross_entropy(y)
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss, *model.buffers())  # updates, running statistics and the loss: one plan
        return loss

    run_step = train_step if args.no_jit else TinyJit(train_step)
    rng = np.random.default_rng(args.seed)
    per_epoch = len(X_train) // args.batch  # drop the last partial batch: every step has the same shapes
    total = per_epoch * args.epochs if not args.steps else min(args.steps, per_epoch * args.epochs)
    step, t0, t_steady = 0, time.perf_counter(), None
    with Tensor.train():
        for epoch in range(args.epochs):
            order = rng.permutation(len(X_train))
            for b in range(per_epoch):
                if step >= total:
                    break
                # one-cycle: warm up over the first 5% of steps, then cosine decay to 2% (lr is data, not structure)
                f = step / total
                warm = min(1.0, f / 0.05)
                opt.lr = args.lr * warm * (0.02 + 0.98 * 0.5 * (1 + np.cos(np.pi * f)))
                idx = order[b * args.batch : (b + 1) * args.batch]
                loss = run_step(Tensor(X_train[idx]), Tensor(Y_train[idx]))
                step += 1
                if step == 2:
                    t_steady = time.perf_counter()  # steps 1-2 compile; the rate counts the steady state
                if step % 20 == 0 or step == total:
                    el = time.perf_counter() - (t_steady or t0)
                    sps = (step - 2) / el if t_steady and step > 2 else 0.0
                    extra = f"loss {loss.item():.4f}  {sps * args.batch:8.0f} samples/s"
                    print(f"\repoch {epoch + 1} {progress(step, total, sps, extra)}", end="", flush=True)
            if step >= total:
                break
    print()
    train_time = time.perf_counter() - t0
    acc = accuracy(model, X_test, Y_test)
    total_time = time.perf_counter() - t0
    print(f"test accuracy {acc * 100:.2f}%  ({step} steps in {train_time:.1f} s, {total_time:.1f} s in all)")
    print(
        f"plans cached: {len(realize._plans)}, kernels compiled: {runtime.stats['compiles']}, "
        f"loaded from disk cache: {runtime.stats['disk_hits']}"
    )


if __name__ == "__main__":
    main()

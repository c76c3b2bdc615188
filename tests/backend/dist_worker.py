"""Run under `mpiexec -n 2` by test_distributed.py; rank 0 saves what the test asserts on.

    mpiexec -n 2 python tests/backend/dist_worker.py check OUT.npz   # collectives, sampler, SGD/AdamW runs
    mpiexec -n 2 python tests/backend/dist_worker.py abort            # rank 1 raises while rank 0 waits

`check` saves every rank's all_reduce inputs and rank 0's results (the test computes the NumPy reference), and the
parameters after 20 data-parallel steps next to those of 20 steps in one process (rank 0 alone, no MPI involved)
with the same global batch.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from uopc import TinyJit
from uopc import distributed as dist
from uopc.nn import SGD, AdamW, Linear, parameters
from uopc.runtime.buffer import buffer_data
from uopc.tensor import Tensor
from uopc.uop import base_buffer
from uopc.uop.dtype import dtypes

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
DTYPES += ["float16", "float32", "float64"]
SIZES, N, GLOBAL_BATCH, STEPS = [12, 16, 3], 160, 16, 20
LR = {"sgd": 0.1, "adamw": 1e-2}


def reduce_input(rank: int, dtype: str) -> np.ndarray:
    """This rank's all_reduce input for `dtype`: values whose sums and maxima fit the dtype."""
    g = np.random.default_rng(100 + rank)
    if dtype == "bool":
        return g.random((3, 5)) < 0.3
    if dtype.startswith("float"):
        return g.standard_normal((3, 5)).astype(dtype)
    return g.integers(0, 60, (3, 5)).astype(dtype)


def check_collectives(world: dist.World, out: dict) -> None:
    for dt in DTYPES:
        x = Tensor(reduce_input(world.rank, dt), dtype=getattr(dtypes, dt))
        alias = Tensor(x.uop)  # shares x's storage: must keep its values
        for op in ("sum", "max", "mean") if dt.startswith("float") else ("sum", "max"):
            out[f"reduce_{dt}_{op}"] = dist.all_reduce(x, op).numpy()
        assert np.array_equal(alias.numpy(), reduce_input(world.rank, dt)), "all_reduce changed its input"
        for r, arr in enumerate(MPI.COMM_WORLD.allgather(reduce_input(world.rank, dt))):
            out[f"input_{dt}_{r}"] = arr
    # a lazy (unrealized) input is realized first
    out["reduce_lazy"] = dist.all_reduce((Tensor.arange(6) * (world.rank + 1)).reshape(2, 3)).numpy()
    # bad arguments raise before any communication (so a raising rank does not strand the others)
    for op, err in (("mean", TypeError), ("prod", ValueError)):
        try:
            dist.all_reduce(Tensor([1, 2]), op)
            raise AssertionError(f"all_reduce op={op!r} on int32 did not raise")
        except err:
            pass
    # ranks whose parameters differ in shape: every rank raises instead of hanging in a mismatched collective
    try:
        dist.broadcast_parameters([Tensor.zeros(2 + world.rank)])
        raise AssertionError("broadcast_parameters accepted different shapes on different ranks")
    except ValueError as e:
        assert "((2,), 'float32')" in str(e) and "((3,), 'float32')" in str(e), e
    out["broadcast"] = dist.broadcast(Tensor([1.0, 2.0, 3.0]) * (world.rank + 1), root=1).numpy()
    # TinyJit replays plans only: capturing a collective raises (on every rank alike) instead of skipping it later
    f = TinyJit(lambda t: dist.all_reduce(t * 2))
    out["jit_first_call"] = f(Tensor([1.0, 2.0])).numpy()  # call 1 runs normally
    try:
        f(Tensor([1.0, 2.0]))
        raise AssertionError("TinyJit captured an all_reduce")
    except RuntimeError as e:
        assert "TinyJit cannot capture an MPI collective" in str(e), e
    dist.barrier()


def check_sampler(world: dist.World, out: dict) -> None:
    mine = np.stack(list(dist.ShardedSampler(N, GLOBAL_BATCH, seed=3).epoch(1)))
    parts = MPI.COMM_WORLD.allgather(mine)
    one = np.stack(list(dist.ShardedSampler(N, GLOBAL_BATCH, seed=3, rank=0, size=1).epoch(1)))
    out["sampler_ranks"], out["sampler_single"] = np.stack(parts), one


class MLP:
    def __init__(self, sizes: list[int]):
        self.layers = [Linear(a, b) for a, b in zip(sizes, sizes[1:], strict=False)]

    def __call__(self, x: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            x = x.relu() if i < len(self.layers) - 1 else x
        return x


def train(kind: str, data: tuple[np.ndarray, np.ndarray], seed: int, data_parallel: bool) -> list[np.ndarray]:
    """STEPS steps of `kind` on the MLP; data-parallel over all ranks, or in this process alone with the whole
    global batch. Returns the parameters after the last step."""
    X, Y = data
    Tensor.manual_seed(seed)
    model = MLP(SIZES)
    params = parameters(model)
    opt = SGD(params, lr=LR[kind], momentum=0.9) if kind == "sgd" else AdamW(params, lr=LR[kind])
    dp = dist.DataParallel(opt, bucket_bytes=512) if data_parallel else None  # small buckets: several messages
    sampler = dist.ShardedSampler(N, GLOBAL_BATCH, seed=7, **({} if data_parallel else {"rank": 0, "size": 1}))
    step, epoch = 0, 0
    while step < STEPS:
        for idx in sampler.epoch(epoch):
            if step == STEPS:
                break
            loss = model(Tensor(X[idx])).cross_entropy(Tensor(Y[idx]))
            opt.zero_grad()
            loss.backward(opt.params)
            if dp is not None:
                dp.step(loss)
            else:
                opt.step(loss)
            step += 1
        epoch += 1
    return [p.numpy() for p in params]


def check_training(world: dist.World, out: dict) -> None:
    g = np.random.default_rng(11)
    data = g.standard_normal((N, SIZES[0])).astype(np.float32), g.integers(0, SIZES[-1], N).astype(np.int32)
    for kind in ("sgd", "adamw"):
        # each rank starts from different weights: DataParallel must broadcast rank 0's
        got = train(kind, data, seed=1 + world.rank, data_parallel=True)
        everyone = MPI.COMM_WORLD.gather(got)
        if world.rank == 0:
            for r, params in enumerate(everyone):
                for i, p in enumerate(params):
                    out[f"{kind}_dp{r}_{i}"] = p
            for i, p in enumerate(train(kind, data, seed=1, data_parallel=False)):
                out[f"{kind}_single_{i}"] = p
        dist.barrier()
    buckets = dist.plan_buckets(parameters(MLP(SIZES)), 512)
    out["bucket_sizes"] = np.array([len(b.slots) for b in buckets])


def check_gradient_views(world: dist.World, out: dict) -> None:
    """Gradients are views of the bucket; a gradient still held keeps its values while later steps run."""
    layer = Linear(8, 4)
    opt = SGD(parameters(layer), lr=0.1)
    dp = dist.DataParallel(opt, bucket_bytes=64)  # weight and bias in two buckets
    held = None
    for i in range(5):
        loss = layer(Tensor(np.full((2, 8), i + 1.0 + world.rank, np.float32))).sum()
        opt.zero_grad()
        loss.backward(opt.params)
        dp.step(loss)
        # the weight's bucket is 1 (the bias is planned first); holding the storage array here would block reuse
        out["grad_is_view"] = np.array(
            np.shares_memory(buffer_data(base_buffer(opt.params[0].grad.uop)), dp._last[1][0])
        )
        if i == 2:
            held = (opt.params[0].grad, opt.params[0].grad.numpy())
    out["held_grad_kept"] = np.array(np.array_equal(held[0].numpy(), held[1]))
    # the weight's gradient at step 2: ones(4, 1) * mean over ranks of the input row sum
    out["held_grad"] = held[1]
    out["reused"] = np.array(dp.reused)


def main() -> None:
    world = dist.init()
    if sys.argv[1] == "abort":
        if world.rank == 1:
            raise RuntimeError("rank 1 fails on purpose")
        dist.barrier()  # would wait forever for rank 1 without the abort
        return
    out: dict[str, np.ndarray] = {"world_size": np.array(world.size)}
    check_collectives(world, out)
    check_sampler(world, out)
    check_training(world, out)
    check_gradient_views(world, out)
    if world.rank == 0:
        np.savez(sys.argv[2], **out)


if __name__ == "__main__":
    main()

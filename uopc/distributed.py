"""Data-parallel training over MPI (mpi4py with the MPICH wheel: `pip install uopc[dist]`).

    mpiexec -n 2 python train.py                     # two processes; in train.py:

    dist.init()                                      # rank and world size from MPI; a raising rank aborts them all
    opt = AdamW(parameters(model), lr=1e-3)
    dp = dist.DataParallel(opt)                      # parameters broadcast from rank 0
    for idx in dist.ShardedSampler(len(X), 128).epoch(e):     # this rank's part of each global batch of 128
        loss = model(Tensor(X[idx])).cross_entropy(Tensor(Y[idx]))
        opt.zero_grad(); loss.backward(opt.params)
        dp.step(loss)                                # gradients averaged over ranks (bucketed), then opt.step()

Collectives move the realized arrays of `uopc.runtime.buffer` straight through MPI: `all_reduce` reduces from the
input's
array into the result's fresh aligned array, the only copy. The core of uopc does not need this module or MPI.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from uopc import helpers, set_num_threads
from uopc.engine import realize
from uopc.runtime.buffer import ALIGN, aligned_empty, buffer_from, storage_view
from uopc.tensor import Tensor
from uopc.uop import base_buffer
from uopc.uop.dtype import DType

try:
    from mpi4py import MPI
except ImportError as e:  # the core needs only NumPy; MPI is an optional extra
    raise ImportError(f"uopc.distributed needs mpi4py and an MPI library: pip install 'uopc[dist]' ({e})") from e

__all__ = [
    "DataParallel",
    "ShardedSampler",
    "World",
    "all_reduce",
    "barrier",
    "broadcast",
    "broadcast_parameters",
    "init",
    "mpiexec_path",
    "plan_buckets",
]

DEFAULT_BUCKET_BYTES = 25 << 20  # PyTorch DDP's default: few messages, yet each one small next to a large model
_REDUCE_OPS = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX}


class World(NamedTuple):
    """Where this process sits: its rank among `size` processes, and among the `local_size` on its machine."""

    rank: int
    size: int
    local_rank: int
    local_size: int


_world: World | None = None
_previous_hook = sys.excepthook  # what prints an uncaught exception before the abort


def init() -> World:
    """Join the MPI job (idempotent): rank and size of COMM_WORLD; an uncaught exception then aborts every rank.

    Without a thread count set (UOPC_NUM_THREADS / OMP_NUM_THREADS), the ranks on one machine share its cores
    evenly: two ranks each running all cores' worth of OpenMP threads would fight over them.
    """
    global _world, _previous_hook
    if _world is not None:
        return _world
    comm = MPI.COMM_WORLD
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    _world = World(comm.Get_rank(), comm.Get_size(), local.Get_rank(), local.Get_size())
    local.Free()
    _previous_hook = sys.excepthook  # the default hook, or one the user installed, still prints the traceback
    sys.excepthook = _abort_on_exception
    if not helpers.NUM_THREADS_ENV and _world.local_size > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        set_num_threads(max(1, cores // _world.local_size))
    return _world


def _abort_on_exception(exc_type: Any, exc: Any, tb: Any) -> None:
    """Print the traceback, then take the whole job down: the other ranks may be waiting in a collective for this
    one, and would otherwise hang forever."""
    _previous_hook(exc_type, exc, tb)
    sys.stdout.flush()
    sys.stderr.flush()
    if MPI.COMM_WORLD.Get_size() > 1:
        # mpiexec forwards a rank's output asynchronously and stops forwarding when the job is aborted: give it a
        # moment, or the traceback that says why is sometimes lost (seen under load in the test of this path)
        time.sleep(0.25)
        MPI.COMM_WORLD.Abort(1)


def mpiexec_path() -> str:
    """The `mpiexec` of the MPICH wheel (installed next to this Python), else the first one on PATH."""
    found = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if found:
        return found
    raise FileNotFoundError(f"no mpiexec next to {sys.executable} or on PATH: pip install 'uopc[dist]'")


# ---------------------------------------------------------------------------------------------------
# collectives on tensors


def _realized_array(t: Tensor) -> np.ndarray:
    """Realize `t` and return its flat storage (a contiguous buffer after realize, so no copy)."""
    t.realize()
    return storage_view(base_buffer(t.uop))[: t.numel()]


def _wrap(arr: np.ndarray, dtype: DType, shape: tuple[int, ...]) -> Tensor:
    """A Tensor whose storage is `arr` itself (aligned, flat, overlapping no other tensor's storage)."""
    return Tensor(buffer_from(arr, dtype).reshape(shape))


def _mpi_op(op: str, dtype: DType) -> MPI.Op:
    if op not in _REDUCE_OPS:
        raise ValueError(f"all_reduce: op must be one of {sorted(_REDUCE_OPS)}, got {op!r}")
    if op == "mean" and not dtype.is_float:
        raise TypeError(f"all_reduce: op='mean' needs a float tensor, got {dtype!r}; use op='sum'")
    # MPI defines only logical ops on booleans; on bools NumPy's sum and max are both a logical or
    return MPI.LOR if dtype.is_bool else _REDUCE_OPS[op]


def _check_tensor(fn: str, t: Any) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{fn}: expected a Tensor, got {type(t).__name__}")
    if realize.capturing() is not None:  # a replay runs the captured plans only: the communication would be skipped
        raise RuntimeError(
            f"{fn}: TinyJit cannot capture an MPI collective (its replay would skip the communication); "
            "run data-parallel steps without TinyJit"
        )


def all_reduce(t: Tensor, op: str = "sum") -> Tensor:
    """A new Tensor holding `op` ("sum", "mean" or "max") of `t` over all ranks; every rank passes the same shape.

    `t` is realized; its storage is only read (tensors sharing it keep their values). MPI reduces from that storage
    into the result's fresh aligned array, which becomes the result's storage: one copy in all.
    """
    _check_tensor("all_reduce", t)
    mpi_op = _mpi_op(op, t.dtype)
    world = init()
    if t.numel() == 0:
        return Tensor.zeros(t.shape, dtype=t.dtype)
    src = _realized_array(t)
    out = aligned_empty(src.size, t.dtype)
    MPI.COMM_WORLD.Allreduce(src, out, op=mpi_op)
    if op == "mean":
        np.divide(out, world.size, out=out)  # division, not a product with 1/size: exact where NumPy's mean is
    return _wrap(out, t.dtype, t.shape)


def broadcast(t: Tensor, root: int = 0) -> Tensor:
    """Rank `root`'s value of `t` on every rank (other ranks' `t` gives only the shape and dtype, not computed).

    On `root` the result shares `t`'s realized storage (uopc never writes a realized buffer in place); elsewhere
    MPI receives straight into the result's fresh aligned array.
    """
    _check_tensor("broadcast", t)
    world = init()
    if not 0 <= root < world.size:
        raise ValueError(f"broadcast: root {root} is not a rank of this {world.size}-process job")
    if t.numel() == 0:
        return Tensor.zeros(t.shape, dtype=t.dtype)
    if world.rank == root:
        MPI.COMM_WORLD.Bcast(_realized_array(t), root=root)
        return Tensor(t.uop)
    out = aligned_empty(t.numel(), t.dtype)
    MPI.COMM_WORLD.Bcast(out, root=root)
    return _wrap(out, t.dtype, t.shape)


def barrier() -> None:
    """Wait until every rank gets here."""
    init()
    MPI.COMM_WORLD.Barrier()


def _check_same_signature(params: Sequence[Tensor], what: str) -> None:
    """Raise on every rank if the ranks' parameter lists differ in length, shapes or dtypes (a mismatch would make
    the collectives below hang or mix unrelated values)."""
    sig = [(tuple(p.shape), p.dtype.name) for p in params]
    sigs = MPI.COMM_WORLD.allgather(sig)
    for r, other in enumerate(sigs):
        if other != sig:
            raise ValueError(f"{what}: parameters differ: rank {r} has {other}, rank {init().rank} has {sig}")


def broadcast_parameters(params: Sequence[Tensor], root: int = 0) -> None:
    """Make every parameter equal to rank `root`'s (each tensor is rebound with `assign`, so holders keep it)."""
    _check_same_signature(params, "broadcast_parameters")
    for p in params:
        p.assign(broadcast(p.detach(), root))


# ---------------------------------------------------------------------------------------------------
# data parallelism


class _Optimizer(Protocol):
    params: list[Tensor]

    def step(self, *extra: Tensor) -> None: ...


class _Slot(NamedTuple):
    """Where one parameter's gradient lives in its bucket: elements [offset, offset + size)."""

    index: int
    offset: int
    size: int


class _Bucket(NamedTuple):
    dtype: DType
    slots: list[_Slot]
    numel: int


def plan_buckets(params: Sequence[Tensor], bucket_bytes: int) -> list[_Bucket]:
    """Group the parameters, last first (backward makes the last layers' gradients first), into buckets of one
    dtype and at most `bucket_bytes` (a larger parameter gets a bucket of its own). Each slot starts on an ALIGN
    boundary, so a slot is a valid uopc storage array by itself."""
    buckets: list[_Bucket] = []
    slots: list[_Slot] = []
    dtype, used = None, 0
    for i in reversed(range(len(params))):
        p = params[i]
        step = ALIGN // p.dtype.itemsize
        offset = -(-used // step) * step
        if slots and (p.dtype is not dtype or (offset + p.numel()) * p.dtype.itemsize > bucket_bytes):
            buckets.append(_Bucket(dtype, slots, used))
            slots, offset = [], 0
        dtype = p.dtype
        slots.append(_Slot(i, offset, p.numel()))
        used = offset + p.numel()
    if slots:
        buckets.append(_Bucket(dtype, slots, used))
    return buckets


class DataParallel:
    """Wraps an optimizer so every rank steps with the gradient averaged over all ranks.

    At construction every parameter is broadcast from rank `root`. `step(*extra)` realizes the gradients (and
    `extra`, e.g. the loss) in one plan, copies each into its slot of a flat bucket, reduces each bucket with one
    MPI all-reduce, sets each `p.grad` to a view of its slot (no copy back) and runs the optimizer's step.
    """

    def __init__(self, opt: _Optimizer, bucket_bytes: int = DEFAULT_BUCKET_BYTES, root: int = 0):
        if bucket_bytes <= 0:
            raise ValueError(f"DataParallel: bucket_bytes must be positive, got {bucket_bytes}")
        self.opt, self.world = opt, init()
        self.params: list[Tensor] = list(opt.params)
        for i, p in enumerate(self.params):
            if not p.dtype.is_float:
                raise TypeError(f"DataParallel: parameter {i} has dtype {p.dtype!r}; only float tensors have gradients")
        broadcast_parameters(self.params, root)
        self.buckets = plan_buckets(self.params, bucket_bytes)
        # per bucket: last step's array and weak references to the slot views handed out as gradients
        self._last: list[tuple[np.ndarray, list[weakref.ref]] | None] = [None] * len(self.buckets)
        self.reused = 0  # how many steps found last step's bucket array free again

    def _bucket_array(self, i: int) -> np.ndarray:
        """Last step's array for bucket `i` once no gradient view of it is alive (after `zero_grad`), else a fresh
        one: held gradients keep their values. Reuse matters: filling and all-reducing a fresh array took 1.5-3x as
        long as the same on a reused one (measured: MPICH, 2 ranks over shared memory, 256 KiB to 25 MiB)."""
        last = self._last[i]
        if last is not None and all(r() is None for r in last[1]):
            self.reused += 1
            return last[0]
        return aligned_empty(self.buckets[i].numel, self.buckets[i].dtype)

    def sync_gradients(self, *extra: Tensor) -> None:
        """Average every parameter's gradient over the ranks (a missing gradient counts as zeros)."""
        grads = [p.grad for p in self.params if p.grad is not None]
        Tensor.realize_all(*grads, *extra)
        flats, requests = [], []
        for i, b in enumerate(self.buckets):
            flat = self._bucket_array(i)
            end = 0
            for s in b.slots:
                flat[end : s.offset] = 0  # the alignment gap: reduced too, so make it harmless zeros
                g = self.params[s.index].grad
                if g is None:
                    flat[s.offset : s.offset + s.size] = 0
                elif s.size:
                    flat[s.offset : s.offset + s.size] = _realized_array(g)
                end = s.offset + s.size
            flats.append(flat)
            # non-blocking: the next bucket is filled while this one is on the wire
            requests.append(MPI.COMM_WORLD.Iallreduce(MPI.IN_PLACE, flat, op=_mpi_op("sum", b.dtype)))
        MPI.Request.Waitall(requests)
        for i, (b, flat) in enumerate(zip(self.buckets, flats, strict=True)):
            if self.world.size > 1:
                np.divide(flat, self.world.size, out=flat)
            views = []
            for s in b.slots:
                p = self.params[s.index]
                if s.size == 0:
                    p.grad = Tensor.zeros(p.shape, dtype=p.dtype)
                    continue
                # a view, no copy: the slot starts on an ALIGN boundary and no other storage overlaps it
                views.append(flat[s.offset : s.offset + s.size])
                p.grad = _wrap(views[-1], b.dtype, p.shape)
            self._last[i] = (flat, [weakref.ref(v) for v in views])

    def step(self, *extra: Tensor) -> None:
        """sync_gradients(*extra), then the optimizer's step."""
        self.sync_gradients(*extra)
        self.opt.step()


class ShardedSampler:
    """Each rank's part of every global batch, the same on every run.

    Every rank shuffles the indices of epoch `e` with the same generator (seeded by `(seed, e)`), cuts them into
    global batches of `global_batch` (dropping the last partial one: every step has the same shapes), and takes
    part `rank` of `size` equal contiguous parts of each. Together the ranks see exactly the batches one process
    with the same seed and `global_batch` would, so training over N ranks matches training in one process.
    """

    def __init__(self, n: int, global_batch: int, seed: int = 0, rank: int | None = None, size: int | None = None):
        if rank is None or size is None:
            world = init()
            rank, size = world.rank if rank is None else rank, world.size if size is None else size
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"ShardedSampler: rank {rank} is not in a world of {size}")
        if global_batch < 1 or global_batch % size:
            raise ValueError(f"ShardedSampler: global batch {global_batch} does not split into {size} equal parts")
        if n < global_batch:
            raise ValueError(f"ShardedSampler: {n} samples do not fill one global batch of {global_batch}")
        self.n, self.global_batch, self.seed, self.rank, self.size = n, global_batch, seed, rank, size
        self.local_batch = global_batch // size

    def __len__(self) -> int:
        return self.n // self.global_batch

    def global_order(self, epoch: int) -> np.ndarray:
        """The shuffled indices of `epoch`, identical on every rank."""
        return np.random.default_rng((self.seed, epoch)).permutation(self.n)

    def epoch(self, epoch: int) -> Iterator[np.ndarray]:
        """This rank's indices for each step of `epoch`."""
        order = self.global_order(epoch)
        for b in range(len(self)):
            start = b * self.global_batch + self.rank * self.local_batch
            yield order[start : start + self.local_batch]

"""`uopc bench`: uopc side by side with NumPy and PyTorch (when installed) on the same data, in the same run.

Every case runs as interleaved rounds (uopc, numpy, torch, uopc, ...) through `uopc.tools.harness`, and prints the
median per side and the ratios (below 1: uopc is faster). NumPy runs in a child process whose environment has
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed, so its BLAS picks its kernel for this CPU by itself; the child
reports the kernel threadpoolctl sees. PyTorch runs in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from uopc import TinyJit
from uopc.engine import realize as realize_mod
from uopc.nn import AdamW, LayerNorm, Linear, parameters
from uopc.runtime.threads import get_num_threads, set_num_threads
from uopc.tensor import Tensor
from uopc.tools import harness

__all__ = ["CASES", "mnist_batches", "run_suite", "torch_stepper", "uopc_stepper"]

_BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
ALLOCATION = {
    "uopc": "inputs copied once into 64-byte aligned arrays; outputs and temps come from uopc's pool (freed "
    "storage reused by size class, uninitialized)",
    "numpy": "a fresh ndarray per call (NumPy's allocator), temporaries for every intermediate",
    "torch": "a fresh tensor per call (PyTorch's CPU allocator), no autograd recording (inference mode) "
    "except in the training step",
}


@dataclass(frozen=True)
class Case:
    name: str
    shapes: tuple[tuple[int, ...], ...]
    flops: int = 0  # for the GFLOP/s note (GEMMs)
    quick: bool = True  # part of --quick
    sides: tuple[str, ...] = ("uopc", "numpy", "torch")


def _gemm(n: int, quick: bool = True) -> Case:
    return Case(f"gemm {n}x{n}x{n}", ((n, n), (n, n)), 2 * n**3, quick)


CASES: list[Case] = [
    _gemm(128),
    _gemm(512),
    _gemm(1024, quick=False),
    Case("softmax 1024x1024", ((1024, 1024),)),
    Case("layernorm 1024x1024", ((1024, 1024),)),
    Case("elementwise a*b+c 1M", ((1 << 20,), (1 << 20,), (1 << 20,))),
    Case("row-sum 4096x1024", ((4096, 1024),)),
    Case("mlp train step 784-128-10 b128", ((128, 784),), sides=("uopc", "torch")),
    Case("realize warm (16 floats, a+b)", ((16,), (16,))),
    Case("realize cold (softmax 64x64, new plan)", ((64, 64),), sides=("uopc",)),
]


def _data(case: Case) -> list[np.ndarray]:
    g = np.random.default_rng(0)
    return [g.standard_normal(s).astype(np.float32) for s in case.shapes]


# ---------------------------------------------------------------------------------------------------------------
# the MLP training step (also used by bench/bench_mnist_step.py)


def mnist_batches(n: int, batch: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """A pool of synthetic MNIST-shaped batches (float32 pixels, int class labels)."""
    g = np.random.default_rng(seed)
    return [
        (g.standard_normal((batch, 784)).astype(np.float32), g.integers(0, 10, batch).astype(np.int32))
        for _ in range(n)
    ]


def uopc_stepper(data: list, sizes: list[int], lr: float, jit: bool = False) -> Callable[[], None]:
    """A closure running one uopc training step (forward, cross-entropy, backward, AdamW) on the next batch of an
    MLP with layer widths `sizes`; `jit` replays the step through TinyJit. Inputs are realized once up front."""
    Tensor.manual_seed(0)
    layers = [Linear(a, b) for a, b in zip(sizes, sizes[1:], strict=False)]
    opt = AdamW(parameters(layers), lr=lr)
    tdata = [(Tensor(x).realize(), Tensor(y).realize()) for x, y in data]

    def train(x: Tensor, y: Tensor) -> Tensor:
        h = x
        for i, layer in enumerate(layers):
            h = layer(h)
            h = h.relu() if i < len(layers) - 1 else h
        loss = h.cross_entropy(y)
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss)
        return loss

    f = TinyJit(train) if jit else train
    i = [0]

    def step() -> None:
        f(*tdata[i[0] % len(tdata)])
        i[0] += 1

    return step


def torch_stepper(data: list, sizes: list[int], lr: float, compiled: bool = False) -> Callable[[], None]:
    """The same step in PyTorch (its default AdamW: weight decay 0.01, like uopc's), eager or torch.compile'd."""
    import torch  # optional dependency: only imported when torch is compared
    import torch.nn.functional as F

    torch.manual_seed(0)
    mods: list = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False)):
        mods += [torch.nn.Linear(a, b)] + ([torch.nn.ReLU()] if i < len(sizes) - 2 else [])
    model = torch.nn.Sequential(*mods)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    fwd = torch.compile(model) if compiled else model
    tdata = [(torch.from_numpy(x), torch.from_numpy(y).long()) for x, y in data]
    i = [0]

    def step() -> None:
        x, y = tdata[i[0] % len(tdata)]
        i[0] += 1
        loss = F.cross_entropy(fwd(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


# ---------------------------------------------------------------------------------------------------------------
# one function per side and case


def make_uopc(case: Case) -> Callable[[], object]:
    arrs = _data(case)
    ts = [Tensor(a).realize() for a in arrs]
    name = case.name.split()[0]
    if name == "gemm":
        return lambda: (ts[0] @ ts[1]).realize()
    if name == "softmax":
        return lambda: ts[0].softmax(-1).realize()
    if name == "layernorm":
        ln = LayerNorm(case.shapes[0][-1])
        return lambda: ln(ts[0]).realize()
    if name == "elementwise":
        return lambda: (ts[0] * ts[1] + ts[2]).realize()
    if name == "row-sum":
        return lambda: ts[0].sum(1).realize()
    if name == "mlp":
        return uopc_stepper(mnist_batches(8, 128), [784, 128, 10], 1e-3)
    if case.name.startswith("realize warm"):
        return lambda: (ts[0] + ts[1]).realize()

    def cold() -> None:
        realize_mod._plans.clear()  # a new plan each call: schedule, render, compiled kernels from memory
        ts[0].softmax(-1).realize()

    return cold


def make_numpy(case: Case) -> Callable[[], object]:
    a = _data(case)
    name = case.name.split()[0]
    if name == "gemm":
        return lambda: a[0] @ a[1]
    if name == "softmax":

        def softmax() -> np.ndarray:
            e = np.exp(a[0] - a[0].max(1, keepdims=True))
            return e / e.sum(1, keepdims=True)

        return softmax
    if name == "layernorm":

        def layernorm() -> np.ndarray:
            xc = a[0] - a[0].mean(-1, keepdims=True)
            return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + 1e-5)

        return layernorm
    if name == "elementwise":
        return lambda: a[0] * a[1] + a[2]
    if name == "row-sum":
        return lambda: a[0].sum(1)
    return lambda: a[0] + a[1]  # realize warm: the cost of one small op


def make_torch(case: Case) -> Callable[[], object]:
    import torch  # optional dependency
    import torch.nn.functional as F

    t = [torch.from_numpy(a) for a in _data(case)]
    name = case.name.split()[0]
    if name == "mlp":
        return torch_stepper(mnist_batches(8, 128), [784, 128, 10], 1e-3)
    fns: dict[str, Callable[[], object]] = {
        "gemm": lambda: t[0] @ t[1],
        "softmax": lambda: torch.softmax(t[0], -1),
        "layernorm": lambda: F.layer_norm(t[0], t[0].shape[-1:]),
        "elementwise": lambda: t[0] * t[1] + t[2],
        "row-sum": lambda: t[0].sum(1),
        "realize": lambda: t[0] + t[1],
    }
    fn = fns[name]

    def run() -> object:
        with torch.inference_mode():
            return fn()

    return run


# ---------------------------------------------------------------------------------------------------------------
# NumPy in a child process


def _worker() -> None:
    """The NumPy side: answer one JSON request per line on stdin (info, or one timed round of a case)."""
    runners: dict[str, Callable[[], float]] = {}
    by_name = {c.name: c for c in CASES}
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "info":
            try:
                from threadpoolctl import threadpool_info  # optional: reports the BLAS kernel

                info = threadpool_info()
            except ImportError:
                info = []
            reply: dict = {"numpy": np.__version__, "pools": info}
        else:
            name = req["case"]
            if name not in runners:
                runners[name] = harness.timed(make_numpy(by_name[name]), req["min_time"])
            reply = {"t": runners[name]()}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class NumpyProcess:
    """The child process that times NumPy, with the BLAS override variables removed from its environment."""

    def __init__(self, threads: int = 0) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _BLAS_ENV}
        if threads:
            env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(threads)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uopc.tools.bench_suite", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def ask(self, **req: object) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("uopc bench: the NumPy worker process exited early")
        return json.loads(line)

    def time(self, case: str, min_time: float) -> float:
        """One timed round of `case` in the child; returns once OpenBLAS's threads there stop spinning."""
        t = self.ask(cmd="time", case=case, min_time=min_time)["t"]
        harness.wait_idle(self.proc.pid)
        return t

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


# ---------------------------------------------------------------------------------------------------------------
# the suite


def _torch_version(threads: int) -> str | None:
    try:
        import torch  # optional dependency

        if threads:
            torch.set_num_threads(threads)
        return f"torch {torch.__version__}, {_threads(torch.get_num_threads())}"
    except ImportError:
        return None


def _threads(n: int) -> str:
    return f"{n} thread{'s' if n != 1 else ''}"


def _fmt_t(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def run_suite(quick: bool = False, as_json: bool = False, threads: int = 0, out=sys.stdout) -> dict:
    """Run every case (the quick subset with `quick`), print the table (or JSON), and return the results.

    `threads` > 0 runs all three libraries with that many threads (steadier on a shared machine).
    """
    rounds, min_time = (3, 0.02) if quick else (7, 0.1)
    if threads:
        set_num_threads(threads)
    m = harness.machine()
    np_proc = NumpyProcess(threads)
    try:
        info = np_proc.ask(cmd="info")
        blas = [p for p in info["pools"] if p.get("user_api") == "blas"]
        blas_line = (
            ", ".join(
                f"{p.get('internal_api')} {p.get('version')} kernel {p.get('architecture')}, "
                f"{_threads(p.get('num_threads', 0))}"
                for p in blas
            )
            or "BLAS kernel unknown (threadpoolctl not installed)"
        )
        tv = _torch_version(threads)
        libs = {
            "uopc": f"uopc, {_threads(get_num_threads())}",
            "numpy": f"numpy {info['numpy']}: {blas_line} (child process, {' '.join(_BLAS_ENV)} unset)",
            "torch": tv or "torch not installed: not compared",
        }
        if not as_json:
            print(harness.format_machine(m), file=out)
            for k in ("uopc", "numpy", "torch"):
                print(f"{k + ':':7s}{libs[k]}", file=out)
                if k != "torch" or tv:
                    print(f"       allocates: {ALLOCATION[k]}", file=out)
            print(f"{rounds} interleaved rounds per case, medians; ratio < 1: uopc is faster\n", file=out)
            print(f"{'case':40s} {'uopc':>11s} {'numpy':>11s} {'torch':>11s} {'/numpy':>7s} {'/torch':>7s}", file=out)
        results = []
        for case in CASES:
            if quick and not case.quick:
                continue
            runners: dict[str, Callable[[], float]] = {"uopc": harness.timed(make_uopc(case), min_time)}
            if "numpy" in case.sides:
                runners["numpy"] = lambda c=case: np_proc.time(c.name, min_time)
            if "torch" in case.sides and tv:
                runners["torch"] = harness.timed(make_torch(case), min_time)
            times = harness.interleave(runners, rounds)
            med = harness.medians(times)
            rat = {k: harness.ratio(med, "uopc", k) for k in ("numpy", "torch")}
            note = f"  uopc {case.flops / med['uopc'] / 1e9:.1f} GFLOP/s" if case.flops else ""
            results.append({"case": case.name, "median_s": med, "ratios": rat, "rounds_s": times})
            if not as_json:
                r = [f"{v:.2f}" if v is not None else "-" for v in (rat["numpy"], rat["torch"])]
                cols = [_fmt_t(med.get(k)) for k in ("uopc", "numpy", "torch")]
                print(
                    f"{case.name:40s} {cols[0]:>11s} {cols[1]:>11s} {cols[2]:>11s} {r[0]:>7s} {r[1]:>7s}{note}",
                    file=out,
                    flush=True,
                )
    finally:
        np_proc.close()
    report = {"machine": m, "libraries": libs, "allocation": ALLOCATION, "rounds": rounds, "results": results}
    if as_json:
        print(json.dumps(report, indent=1), file=out)
    return report


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker()
    else:
        run_suite(quick="--quick" in sys.argv, as_json="--json" in sys.argv)

"""`uopc onnx run|bench MODEL.onnx`: run an ONNX model on random inputs shaped from its graph and time it.

    uopc onnx run resnet18.onnx --runs 20                 # output names, shapes, dtypes; first call; p50/p90/p99
    uopc onnx run bert.onnx --dim batch=2 --dim seq=128   # symbolic dims (default 1)
    uopc onnx run m.onnx --input x=x.npy                  # an input from a .npy file, the others random
    uopc onnx bench resnet18.onnx                         # the same side by side with onnxruntime (2 threads each)

Random inputs: floats N(0, 1), integers 0 or 1 (valid token ids for any vocabulary), booleans fair coin flips. The
first call (graph building, compiling, the run) is timed apart; then uopc replays the model under TinyJit
(`OnnxModel.jit()`, one untimed capture call first) and each of the N calls is timed. `bench` runs interleaved rounds
(uopc's N calls, then onnxruntime's, ...), each side's round starting with one untimed call, and prints the
percentiles over every timed call and the ratio of the p50s (below 1: uopc is faster).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from uopc.runtime.threads import get_num_threads, set_num_threads
from uopc.tensor import Tensor

__all__ = ["add_parser", "main"]

NEEDS_ONNX = "uopc onnx needs the onnx package: pip install uopc[onnx]"


class UsageError(Exception):
    """A bad command line: printed as `uopc onnx: ...`, exit status 2."""


def add_parser(sub: Any) -> None:
    """Register `uopc onnx {run,bench}` on the `uopc` command's subparsers."""
    o = sub.add_parser(
        "onnx",
        help="run or benchmark an ONNX model on random inputs (needs uopc[onnx])",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    osub = o.add_subparsers(dest="action", required=True, metavar="{run,bench}")
    run = osub.add_parser("run", help="run the model N times: output shapes and latency percentiles")
    bench = osub.add_parser("bench", help="the same side by side with onnxruntime, in interleaved rounds")
    for p, runs, threads in ((run, 20, 0), (bench, 10, 2)):
        p.add_argument("model", help="the .onnx file (external data files next to it load too)")
        p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input from a file")
        p.add_argument("--dim", action="append", default=[], metavar="NAME=N", help="a symbolic dim (default 1)")
        p.add_argument("--runs", type=int, default=runs, metavar="N", help=f"timed calls (per round) (default {runs})")
        p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
        p.add_argument(
            "--threads", type=int, default=threads, metavar="N", help=f"threads (0: uopc's default) (default {threads})"
        )
    bench.add_argument("--rounds", type=int, default=5, metavar="R", help="interleaved rounds (default 5)")


def main(ns: argparse.Namespace) -> int:
    """`uopc onnx run|bench`: 0 on success, 1 when the model fails to load or run, 2 on a bad command line."""
    try:
        import onnx  # noqa: F401  (the subcommand's one hard requirement)
    except ImportError:
        print(NEEDS_ONNX, file=sys.stderr)
        return 2
    try:
        if not os.path.isfile(ns.model):
            raise UsageError(f"no such file {ns.model!r}")
        files, dims = _pairs(ns.input, "--input", str), _pairs(ns.dim, "--dim", int)
        if ns.runs < 1:
            raise UsageError("--runs must be at least 1")
        if ns.threads:
            set_num_threads(ns.threads)
        return _run(ns, files, dims)
    except UsageError as e:
        print(f"uopc onnx: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, NotImplementedError, FileNotFoundError) as e:
        print(f"uopc onnx: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _pairs(items: list[str], flag: str, kind: type) -> dict[str, Any]:
    """`name=value` options as a dict."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name or not value:
            raise UsageError(f"{flag} wants NAME=VALUE, got {item!r}")
        try:
            out[name] = kind(value)
        except ValueError:
            raise UsageError(f"{flag} {item!r}: {value!r} is not an integer") from None
    return out


def make_inputs(model: Any, files: dict[str, str], dims: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """Every graph input: from its --input file, or random with its declared dtype and shape (symbolic dims from
    `dims`, default 1)."""
    import onnx

    unknown = sorted(set(files) - set(model.input_names))
    if unknown:
        raise UsageError(f"--input {unknown[0]!r}: the model has no such input (inputs: {model.input_names})")
    rng, feeds = np.random.default_rng(seed), {}
    for vi in model.inputs:
        tt = vi.type.tensor_type
        if vi.name in files:
            if not os.path.isfile(files[vi.name]):
                raise UsageError(f"--input {vi.name}: no such file {files[vi.name]!r}")
            try:
                feeds[vi.name] = np.load(files[vi.name], allow_pickle=False)
            except Exception as e:
                raise UsageError(f"--input {vi.name}: cannot read {files[vi.name]!r} as a .npy file: {e}") from None
            continue
        if not vi.type.HasField("tensor_type"):
            raise UsageError(f"input {vi.name!r} is not a tensor: give it with --input")
        shape = tuple(d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 1) for d in tt.shape.dim)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if dtype == np.bool_:
            feeds[vi.name] = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            feeds[vi.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


def _percentiles(ts: list[float]) -> list[float]:
    return [float(p) for p in np.percentile(ts, [50, 90, 99])]


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _calls(fn: Callable[[], Any], n: int) -> list[float]:
    """One untimed call (the first after another side's turn runs slower), then n timed calls."""
    fn()
    return [_timed(fn)[0] for _ in range(n)]


def _run(ns: argparse.Namespace, files: dict[str, str], dims: dict[str, int]) -> int:
    import uopc.onnx

    load_s, model = _timed(lambda: uopc.onnx.load(ns.model))
    feeds = make_inputs(model, files, dims, ns.seed)
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in model.opsets.items())
    print(f"model: {ns.model} (opset {opsets}), loaded in {_fmt(load_s)}; uopc {get_num_threads()} threads")
    for name, a in feeds.items():
        how = "from " + files[name] if name in files else "random"
        print(f"input  {name}: {a.dtype.name} {tuple(a.shape)} ({how})")
    first_s, _ = _timed(lambda: model(**feeds))  # eager: binds dims, checks dtypes and shapes, compiles
    step = model.jit()
    args = [Tensor(np.ascontiguousarray(feeds[n])) for n in model.input_names if n in feeds]  # made once
    ours = {k: v.numpy() for k, v in step(*args).items()}  # call 1 of the jit runs eagerly: the values to print
    step(*args)  # call 2 captures; later calls replay
    sess, theirs, ort_first = None, {}, 0.0
    if ns.action == "bench":
        ort_first, sess = _timed(lambda: _ort_session(ns.model, ns.threads))
    if sess is not None:  # onnxruntime's first call: building the session (it optimizes the graph there), one run
        run_s, values = _timed(lambda: sess.run(None, feeds))
        ort_first += run_s
        theirs = dict(zip([o.name for o in sess.get_outputs()], values))
    for name, a in ours.items():
        line = f"output {name}: {a.dtype.name} {tuple(a.shape)}"
        if name in theirs:
            scale = float(np.abs(theirs[name]).max()) if theirs[name].size else 0.0
            diff = float(np.abs(a.astype(np.float64) - theirs[name]).max()) if a.size else 0.0
            line += f"  max |uopc - onnxruntime| {diff:.3g} (max |out| {scale:.3g})"
        print(line)
    run_uopc = lambda: step(*args)  # noqa: E731
    if sess is None:
        ts = _calls(run_uopc, ns.runs)
        p50, p90, p99 = map(_fmt, _percentiles(ts))
        print(f"first call: {_fmt(first_s)} (graph building, compiling, the run)")
        print(f"{ns.runs} runs (TinyJit replay): p50 {p50}  p90 {p90}  p99 {p99}")
        return 0
    return _bench(ns, {"uopc": run_uopc, "onnxruntime": lambda: sess.run(None, feeds)}, (first_s, ort_first), sess)


def _ort_session(path: str, threads: int) -> Any:
    """An onnxruntime CPU session with `threads` intra-op threads and one inter-op thread, or None (not installed)."""
    if importlib.util.find_spec("onnxruntime") is None:
        print("onnxruntime is not installed (pip install onnxruntime): timing uopc alone")
        return None
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads or get_num_threads(), 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def _bench(ns: argparse.Namespace, sides: dict[str, Callable], firsts: tuple[float, float], sess: Any) -> int:
    """Interleaved rounds of `--runs` calls per side; the percentiles over every timed call and the p50s' ratio."""
    import onnxruntime as ort

    intra = sess.get_session_options().intra_op_num_threads
    print(f"threads: uopc {get_num_threads()}, onnxruntime {ort.__version__} {intra} intra-op / 1 inter-op")
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(ns.rounds):
        for name, fn in sides.items():
            times[name] += _calls(fn, ns.runs)
    print(
        f"{ns.rounds} interleaved rounds x {ns.runs} runs; uopc: TinyJit replay; first call apart (onnxruntime's: "
        "building the session and one run)"
    )
    print(f"{'':<12}{'first call':>12}{'p50':>12}{'p90':>12}{'p99':>12}")
    for name, first in zip(sides, firsts):
        print(f"{name:<12}{_fmt(first):>12}" + "".join(f"{_fmt(p):>12}" for p in _percentiles(times[name])))
    p50 = {k: _percentiles(v)[0] for k, v in times.items()}
    print(f"ratio uopc / onnxruntime (p50): {p50['uopc'] / p50['onnxruntime']:.2f}  (below 1: uopc is faster)")
    return 0

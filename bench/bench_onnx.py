"""Exported ONNX models: uopc's importer against onnxruntime and PyTorch eager, in one run: interleaved rounds,
medians, ratios.

    python bench/bench_onnx.py                            # ResNet-18 and ResNet-50 224x224 batch 1 and 8, BERT-base
    python bench/bench_onnx.py --quick                    # small configs, to try it out
    python bench/bench_onnx.py --models resnet18,bert --rounds 7

Each model is bench/models.py's PyTorch one (random weights, BatchNorm statistics and biases randomized), exported
with torch.onnx.export(dynamo=False) into a temp dir, with a symbolic batch dim. uopc: uopc.onnx.load(file).jit(),
replayed on input Tensors made once (the first call, timed apart, compiles). onnxruntime: an InferenceSession on the
same file, CPUExecutionProvider. PyTorch: the module itself, eager, under no_grad. Threads: 2 each by default
(uopc's OpenMP threads, onnxruntime's intra-op pool with one inter-op thread, torch.set_num_threads). Before timing,
uopc's output is checked against PyTorch's and onnxruntime's (the `err` column: max |difference| / max |output|).
Each round runs every side once (harness.timed: one untimed call, then enough calls to fill 50 ms); ratios are of
the medians (below 1: uopc is faster). The load average is printed: the machine is shared.

How each side allocates: first-touch page faults are very expensive on this project's VMs, so the script re-executes
itself with glibc told to keep freed memory (MALLOC_MMAP_MAX_=0, a large MALLOC_TRIM_THRESHOLD_), as
bench_membound.py does; PyTorch's CPU allocator (no cache of its own) then reuses glibc's pages. uopc's replay writes
into the buffers its captured plan holds, temporaries from its pool. onnxruntime allocates from its CPU arena (its
memory pattern planned on the first run) and returns fresh NumPy outputs. OpenBLAS is not on any side's path
(PyTorch: MKL and oneDNN; onnxruntime: MLAS), so OPENBLAS_* variables change nothing here.
"""

from __future__ import annotations

import os
import sys

MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
if any(os.environ.get(k) != v for k, v in MALLOC.items()):  # glibc reads these at start-up: re-exec with them set
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC})

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import models  # noqa: E402  (bench/models.py: run as a script, bench/ is on sys.path)
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

import uopc.onnx  # noqa: E402
from uopc.runtime.threads import set_num_threads  # noqa: E402
from uopc.tensor import Tensor  # noqa: E402
from uopc.tools.harness import interleave, medians, ratio, timed  # noqa: E402


@dataclass(frozen=True)
class Row:
    """One table row: a models.build name, the batch, seq (the image size for the ResNets) and config overrides."""

    model: str
    batch: int
    seq: int
    cfg: dict = field(default_factory=dict)

    def label(self) -> str:
        what = f"{self.seq}x{self.seq}" if self.model.startswith("resnet") else f"seq {self.seq}"
        return f"{self.model} b{self.batch} {what}" + (" (small)" if self.cfg else "")


FULL = [Row(m, b, 224) for m in ("resnet18", "resnet50") for b in (1, 8)] + [Row("bert", 1, 128)]
SMALL_BERT = dict(layers=2, dim=128, heads=4, ffn=512, vocab=1000, max_pos=64)
QUICK = [Row("resnet18", 1, 64), Row("resnet18", 2, 64), Row("resnet50", 1, 64), Row("bert", 1, 32, SMALL_BERT)]
INPUTS = {"resnet18": ["image"], "resnet50": ["image"], "bert": ["ids", "mask"]}


def export(w: models.Workload, name: str, path: str) -> None:
    """The PyTorch model as ONNX, batch symbolic, the output named "out"."""
    names = INPUTS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            w.model, tuple(map(torch.from_numpy, w.inputs)), path, dynamo=False, input_names=names,
            output_names=["out"], dynamic_axes={n: {0: "batch"} for n in names},
        )  # fmt: skip


def session(path: str, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / max(np.abs(ref).max(), 1e-30))


def bench_row(row: Row, path: str, threads: int, rounds: int) -> dict:
    """Check the three sides agree, then time them in interleaved rounds; returns medians, errors and first calls."""
    w = models.build(row.model, "torch", batch=row.batch, seq=row.seq, **row.cfg)
    if not os.path.exists(path):
        export(w, row.model, path)
    feeds = dict(zip(INPUTS[row.model], w.inputs))
    t = time.perf_counter()
    m = uopc.onnx.load(path)
    load_s = time.perf_counter() - t
    step, args = m.jit(), [Tensor(a) for a in w.inputs]
    t = time.perf_counter()
    ours = step(*args)["out"].numpy()  # the first call: graph building, compiling, the run
    first_s = time.perf_counter() - t
    t = time.perf_counter()
    sess = session(path, threads)
    (theirs,) = sess.run(None, feeds)
    ort_first = time.perf_counter() - t
    tin = tuple(map(torch.from_numpy, w.inputs))
    ref = w.call(*tin).numpy()
    runners = {
        "uopc": timed(lambda: step(*args)),
        "onnxruntime": timed(lambda: sess.run(None, feeds)),
        "torch": timed(lambda: w.call(*tin)),
    }
    med = medians(interleave(runners, rounds))
    return dict(med=med, err_torch=err(ours, ref), err_ort=err(ours, theirs), first=first_s, load=load_s, ort=ort_first)


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small configs (under a few minutes)")
    ap.add_argument("--models", default="", help="a comma-separated subset of resnet18,resnet50,bert")
    ap.add_argument("--rounds", type=int, default=0, help="interleaved rounds (default 5, --quick 3)")
    ap.add_argument("--threads", type=int, default=2, help="threads for every side (default 2)")
    args = ap.parse_args()
    rows = QUICK if args.quick else FULL
    if args.models:
        wanted = args.models.split(",")
        unknown = sorted(set(wanted) - set(INPUTS))
        if unknown:
            ap.error(f"unknown models {unknown} (choose from {sorted(INPUTS)})")
        rows = [r for r in rows if r.model in wanted]
    rounds = args.rounds or (3 if args.quick else 5)
    set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"threads: uopc {args.threads}, onnxruntime {ort.__version__} {args.threads} intra-op / 1 inter-op, "
          f"torch {torch.__version__} {torch.get_num_threads()}")  # fmt: skip
    print(f"malloc (every side, this process): {' '.join(f'{k}={os.environ[k]}' for k in MALLOC)}")
    print(f"{rounds} interleaved rounds, medians; ratio < 1: uopc is faster\n")
    head = f"{'model':<26}{'uopc':>12}{'onnxruntime':>13}{'torch':>12}{'/ort':>7}{'/torch':>8}"
    print(head + f"{'err ort':>10}{'err torch':>10}   uopc first call (load)   ort session + 1st run")
    with tempfile.TemporaryDirectory() as tmp:
        for row in rows:
            path = os.path.join(tmp, f"{row.model}_{row.seq}.onnx")  # one export per model and size: batch symbolic
            r = bench_row(row, path, args.threads, rounds)
            med = r["med"]
            ro, rt = ratio(med, "uopc", "onnxruntime"), ratio(med, "uopc", "torch")
            print(
                f"{row.label():<26}{_ms(med['uopc']):>12}{_ms(med['onnxruntime']):>13}{_ms(med['torch']):>12}"
                f"{ro:>7.2f}{rt:>8.2f}{r['err_ort']:>10.1e}{r['err_torch']:>10.1e}"
                f"   {r['first']:>8.2f} s ({r['load']:.2f} s){r['ort']:>17.2f} s",
                flush=True,
            )
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

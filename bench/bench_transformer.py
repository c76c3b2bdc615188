"""Transformers against PyTorch, in one run: the rows of issue 25's table.

    python bench/bench_transformer.py [--rounds 5] [--sections gpt2,gpt2_512,bert,chargpt,attention,rows]
        [--no-compile] [--threads N]

gpt2 / gpt2_512: GPT-2 small forward (bench/models.py: 12 layers, 768 wide, vocab 50257), batch 1, 128 / 512 tokens.
bert: a BERT-base-sized encoder (12 layers, 768 wide, 12 heads), batch 1, 128 tokens with a padding mask, also
against onnxruntime on the PyTorch model exported to ONNX (when onnxruntime is installed). chargpt: examples/gpt.py's
training step (3 layers, 64 wide, context 64, batch 32, AdamW). attention: scaled_dot_product_attention alone
(12 heads of 64, causal, 128 / 512 / 1024 tokens), forward and forward + backward. rows: softmax 4096x4096,
LayerNorm 8192x1024 (uopc's nn.LayerNorm), softmax 512x512 and their backward passes (the gradient of sum(out * g)).

Each line ends with the rates: GFLOP/s for the models and attention (FLOPs as torch.utils.flop_counter counts the
PyTorch model's call; attention's from its causal pairs) with uopc's share of the FMA peak measured in the same run,
and GB/s for the row kernels (the bytes a one-pass kernel moves) against the stream triad measured there too.

uopc runs under TinyJit (a replay with the same input buffers, outputs and temporaries from its plans and pool);
PyTorch eager and torch.compile (unless --no-compile) run the same model with copied weights, each call allocating
its outputs through glibc. First-touch page faults are very expensive on this project's VMs, so glibc is told to keep
freed memory (MALLOC_MMAP_MAX_=0, a large MALLOC_TRIM_THRESHOLD_; the script re-executes itself with those set):
PyTorch's allocations then reuse warm pages instead of faulting every call. Each round
times every side back to back (interleaved), the table gives medians and ratios (below 1: uopc is faster). OpenBLAS
is on no side's path. Each model's outputs are compared once before timing (max |diff| / max |out|).
"""

from __future__ import annotations

import argparse
import os
import sys

MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
if any(os.environ.get(k) != v for k, v in MALLOC.items()):  # glibc reads these at start-up: re-exec with them set
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC})

import models  # noqa: E402  (bench/models.py: run as a script, bench/ is on sys.path)
import numpy as np  # noqa: E402
from bench_gemm import fma_peak  # noqa: E402

from uopc import nn  # noqa: E402
from uopc.engine.jit import TinyJit  # noqa: E402
from uopc.runtime import compiler as runtime  # noqa: E402
from uopc.tensor import Tensor  # noqa: E402
from uopc.tools.harness import interleave, medians, new_inputs, probe_bandwidth, timed  # noqa: E402

try:
    import torch
except ImportError:  # the benchmark still times uopc alone
    torch = None


# the machine's roofs, measured once in main(): the FMA peak (GFLOP/s) and the streaming bandwidth (GB/s)
ROOF: dict[str, float] = {}


def table(title: str, runners: dict, rounds: int, flops: float | None = None, nbytes: float | None = None) -> None:
    """Interleaved rounds, then one line: each side's median, uopc's ratios, and with `flops` each side's GFLOP/s
    (uopc's as a fraction of the FMA peak), or with `nbytes` (a memory-bound case) GB/s against the stream triad."""
    med = medians(interleave(runners, rounds))
    line = f"{title:44s}" + "".join(f" {k} {v * 1e3:8.3f} ms" for k, v in med.items())
    line += "".join(f"  /{k} {med['uopc'] / v:.2f}" for k, v in med.items() if k != "uopc")
    rates_of = ((flops, "GFLOP/s", "peak", "of the FMA peak"), (nbytes, "GB/s", "bw", "of stream"))
    for amount, unit, roof, what in rates_of:
        if amount:
            rates = {k: amount / v / 1e9 for k, v in med.items()}
            line += f"  | {unit}: " + ", ".join(f"{k} {r:.0f}" for k, r in rates.items())
            if ROOF.get(roof):
                line += f" (uopc {100 * rates['uopc'] / ROOF[roof]:.0f}% {what})"
    print(line, flush=True)


def _torch_flops(fn) -> float | None:
    """The FLOPs of one call of a PyTorch function, as torch.utils.flop_counter counts them (matmuls, convolutions
    and attention: 2 per multiply-add, forward and backward), or None without torch."""
    if torch is None:
        return None
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops()) or None


def model(name: str, title: str, args, seq: int | None = None, ort_too: bool = False) -> None:
    w = models.build(name, "uopc", seq=seq)
    xs = new_inputs(*(Tensor(a) for a in w.inputs))
    run = TinyJit(lambda *a: w.call(*a).realize())
    runners = {"uopc": timed(lambda: run(*xs))}
    flops = None
    if torch is not None:
        for side, compiled in (("torch", False), ("torch.compile", True))[: 1 if args.no_compile else 2]:
            t = models.build(name, "torch", seq=seq, compile=compiled)
            models.copy_weights(t.model, w.model)
            tin = tuple(map(torch.from_numpy, t.inputs))
            if side == "torch" and name not in models.TRAINED:
                ref, ours = t.call(*tin).numpy(), run(*xs).numpy()
                print(f"  ({name}: uopc against torch, max |diff| / max |out| = "
                      f"{np.abs(ours - ref).max() / np.abs(ref).max():.1e})")  # fmt: skip
            if side == "torch":
                flops = _torch_flops(lambda t=t, tin=tin: t.call(*tin))
            runners[side] = timed(lambda t=t, tin=tin: t.call(*tin))
            if ort_too and side == "torch" and (sess := _ort_session(t, tin)) is not None:
                feeds = {f"x{i}": a for i, a in enumerate(t.inputs)}
                runners["onnxruntime"] = timed(lambda sess=sess, feeds=feeds: sess.run(None, feeds))
    table(title, runners, args.rounds, flops=flops)


def _ort_session(t, tin):
    """onnxruntime on the PyTorch model exported to ONNX (2 threads as the other sides), or None without it."""
    try:
        import tempfile
        import warnings

        import onnxruntime as ort
    except ImportError:
        return None
    path = os.path.join(tempfile.mkdtemp(), "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(t.model, tin, path, dynamo=False, input_names=[f"x{i}" for i in range(len(tin))],
                          opset_version=17)  # fmt: skip
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = runtime.get_num_threads(), 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def attention(args) -> None:
    """scaled_dot_product_attention alone, GPT-2's heads (12 x 64), causal, forward and forward + backward: uopc's
    fused kernels against PyTorch eager (its CPU flash attention)."""
    g = np.random.default_rng(0)
    for T in (128, 512, 1024):
        qkv = [g.standard_normal((1, 12, T, 64), dtype=np.float32) for _ in range(3)]
        dy = g.standard_normal((1, 12, T, 64), dtype=np.float32)
        # two sets of input buffers, alternated: with the same buffers at the same versions every call, the plan
        # would keep its result (engine.kept) and the kernel would not run at all
        sets = [[Tensor(a).realize() for a in qkv], [Tensor(a.copy()).realize() for a in qkv]]
        flip = iter(range(1 << 60))
        us = sets[0]
        jit = TinyJit(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True).realize())

        def fwd(*_, jit=jit, sets=sets, flip=flip):
            return jit(*sets[next(flip) % 2])

        def fb(q: Tensor, k: Tensor, v: Tensor, gy: Tensor) -> tuple[Tensor, ...]:
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            (q.scaled_dot_product_attention(k, v, is_causal=True) * gy).sum().backward()
            return Tensor.realize_all(q.grad, k.grad, v.grad)

        bwd, gu = TinyJit(fb), Tensor(dy).realize()
        runners = {"uopc": timed(lambda fwd=fwd, us=us: fwd(*us))}
        brunners = {"uopc": timed(lambda bwd=bwd, us=us, gu=gu: bwd(*us, gu))}
        if torch is not None:
            ts, gt = [torch.from_numpy(a) for a in qkv], torch.from_numpy(dy)
            sdpa = torch.nn.functional.scaled_dot_product_attention
            with torch.no_grad():
                ref = sdpa(*ts, is_causal=True).numpy()
            print(f"  (attention T={T}: max |uopc - torch| = {np.abs(fwd(*us).numpy() - ref).max():.1e})")
            runners["torch"] = timed(lambda ts=ts: torch.no_grad()(sdpa)(*ts, is_causal=True))

            def tfb(ts=ts, gt=gt):
                a = [t.clone().requires_grad_() for t in ts]
                (sdpa(*a, is_causal=True) * gt).sum().backward()
                return [t.grad for t in a]

            brunners["torch"] = timed(tfb)
        # the work causal attention needs: q k^T and p v over the T (T + 1) / 2 pairs a query sees, 2 FLOPs per
        # multiply-add; the backward recomputes q k^T and adds dv, dp, dq and dk: 5 products against the forward's 2
        fwd_flops = 2 * 2 * 12 * 64 * T * (T + 1) / 2
        table(f"attention 12x{T}x64 causal forward", runners, args.rounds, flops=fwd_flops)
        table(f"attention 12x{T}x64 causal fwd+bwd", brunners, args.rounds, flops=fwd_flops * 7 / 2)


def rows(args) -> None:
    g = np.random.default_rng(0)
    ln_u = nn.LayerNorm(1024)
    cases = [
        ("softmax 4096x4096", (4096, 4096), lambda t: t.softmax(-1), lambda t: torch.softmax(t, -1)),
        ("LayerNorm 8192x1024", (8192, 1024), ln_u, None),
        ("softmax 512x512", (512, 512), lambda t: t.softmax(-1), lambda t: torch.softmax(t, -1)),
    ]
    for title, shape, fu, ft in cases:
        x, dy = g.standard_normal(shape, dtype=np.float32), g.standard_normal(shape, dtype=np.float32)
        if ft is None:  # LayerNorm with the same weights on both sides
            ln_t = torch.nn.LayerNorm(shape[-1]) if torch is not None else None
            if ln_t is not None:
                with torch.no_grad():
                    ln_t.weight.copy_(torch.from_numpy(ln_u.weight.numpy()))
                    ln_t.bias.copy_(torch.from_numpy(ln_u.bias.numpy()))
            ft = ln_t
        xu, gu = Tensor(x).realize(), Tensor(dy).realize()
        compiled = torch.compile(ft) if torch is not None and not args.no_compile else None
        fwd = TinyJit(lambda a, fu=fu: fu(a).realize())

        def grad(a: Tensor, gy: Tensor, fu=fu) -> Tensor:
            a = a.detach().requires_grad_()  # a fresh leaf per call: the replay reads it as an input
            (fu(a) * gy).sum().backward()
            return a.grad.realize()

        bwd = TinyJit(grad)
        runners = {"uopc": timed(lambda fwd=fwd, xu=xu: fwd(xu))}
        brunners = {"uopc": timed(lambda bwd=bwd, xu=xu, gu=gu: bwd(xu, gu))}
        if torch is not None:
            xt, gt = torch.from_numpy(x), torch.from_numpy(dy)
            with torch.no_grad():
                ref = ft(xt).numpy()
            print(f"  ({title}: max |uopc - torch| = {np.abs(fwd(xu).numpy() - ref).max():.1e})")
            for side, f in (("torch", ft), ("torch.compile", compiled)):
                if f is None:
                    continue
                runners[side] = timed(lambda f=f, xt=xt: torch.no_grad()(f)(xt))

                def tgrad(f=f, xt=xt, gt=gt):
                    a = xt.clone().requires_grad_()
                    (f(a) * gt).sum().backward()
                    return a.grad

                brunners[side] = timed(tgrad)
        # the bytes a one-pass kernel moves: x in and y out; the backward reads x (or y) and dy, writes dx
        n = x.size * 4
        table(f"{title} forward", runners, args.rounds, nbytes=2 * n)
        table(f"{title} backward", brunners, args.rounds, nbytes=3 * n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="threads for both sides (default: uopc's default)")
    ap.add_argument("--sections", default="gpt2,gpt2_512,bert,chargpt,attention,rows", help="which sections to run")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out (its compiles take minutes)")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    if unknown := sections - {"gpt2", "gpt2_512", "bert", "chargpt", "attention", "rows"}:
        ap.error(f"unknown sections {sorted(unknown)}")
    if args.threads:
        runtime.set_num_threads(args.threads)
    if torch is not None:
        torch.set_num_threads(runtime.get_num_threads())
    print(f"uopc {runtime.get_num_threads()} threads" + (f", torch {torch.__version__}" if torch else "")
          + f"; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    ROOF["peak"] = fma_peak(runtime.get_num_threads())
    ROOF["bw"] = probe_bandwidth()
    print(f"FMA peak (generated kernel of independent FMAs) {ROOF['peak']:.0f} GFLOP/s; stream triad "
          f"{ROOF['bw']:.1f} GB/s")  # fmt: skip
    if "rows" in sections:
        rows(args)
    if "chargpt" in sections:
        model("chargpt", "char-GPT training step, batch 32", args)
    if "attention" in sections:
        attention(args)
    if "gpt2" in sections:
        model("gpt2", "GPT-2 small forward, 1 x 128 tokens", args)
    if "gpt2_512" in sections:
        model("gpt2", "GPT-2 small forward, 1 x 512 tokens", args, seq=512)
    if "bert" in sections:
        model("bert", "BERT-base encoder, 1 x 128, padding mask", args, ort_too=True)


if __name__ == "__main__":
    main()

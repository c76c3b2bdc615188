"""The `uopc` command (also `python -m uopc`): bench, profile, cache, machine, onnx.

uopc bench [--quick] [--json] [--threads N]   uopc vs NumPy and PyTorch on this machine
uopc profile [--png FILE] [--top N] SCRIPT [args ...]
                                              every kernel a script ran, against the roofline
uopc cache info|verify|clear [--all]          the compiled-kernel cache
uopc machine [--refresh]                      CPU, measured FMA peak and stream bandwidth
uopc onnx run|bench MODEL.onnx [--input NAME=FILE.npy] [--dim NAME=N] [--runs N]
                                              an ONNX model on random inputs: output shapes, latency percentiles,
                                              side by side with onnxruntime (bench); needs uopc[onnx]
"""

from __future__ import annotations

import argparse
import sys

from uopc.tools import bench_suite, cache, harness, onnx_cli, profile

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="uopc", description="uopc's tools: benchmark, profile, the kernel cache, and ONNX models."
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{bench,profile,cache,machine,onnx}")

    b = sub.add_parser(
        "bench",
        help="uopc side by side with NumPy and PyTorch (interleaved rounds, medians, ratios)",
        description=bench_suite.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("--quick", action="store_true", help="fewer cases and rounds (under a minute)")
    b.add_argument("--json", action="store_true", help="print the results as JSON")
    b.add_argument("--threads", type=int, default=0, metavar="N", help="N threads for every library (0: defaults)")

    p = sub.add_parser(
        "profile",
        help="run a Python script and print every uopc kernel it ran, against this machine's roofline",
        description=profile.__doc__ + "\nOptions of profile may also follow SCRIPT; arguments after `--` all go to "
        "the script.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--png", metavar="FILE", help="draw the roofline with one point per kernel (needs matplotlib)")
    p.add_argument("--top", type=int, default=0, metavar="N", help="print only the N kernels with most time")
    p.add_argument(
        "--compile",
        action="store_true",
        help="also print where the time outside kernels went: graph building, autodiff, scheduling, the optimizer's "
        "layout pass, lowering, rendering, gcc, loading",
    )
    p.add_argument("script", help="the Python script to run (as __main__)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")

    c = sub.add_parser(
        "cache",
        help="the compiled-kernel cache: info, verify, clear",
        description=cache.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("action", choices=["info", "verify", "clear"])
    c.add_argument("--all", action="store_true", help="clear: also remove downloaded datasets")

    m = sub.add_parser("machine", help="print the CPU and its measured FMA peak and stream bandwidth")
    m.add_argument("--refresh", action="store_true", help="measure again instead of using the cached probes")

    onnx_cli.add_parser(sub)  # imports uopc.onnx (and the onnx package) only when it runs
    return ap


def _own_options(rest: list[str]) -> tuple[list[str], str | None, int | None, bool]:
    """Take `--png FILE` / `--top N` / `--compile` that follow SCRIPT (before any `--`) for profile; the rest is the
    script's."""
    args, png, top, compile_split, i = [], None, None, False, 0
    while i < len(rest):
        a = rest[i]
        if a == "--":
            args += rest[i + 1 :]
            break
        if a == "--compile":
            compile_split = True
            i += 1
            continue
        if a in ("--png", "--top") and i + 1 < len(rest):
            if a == "--png":
                png = rest[i + 1]
            else:
                top = int(rest[i + 1])
            i += 2
            continue
        if a.startswith("--png="):
            png = a.split("=", 1)[1]
        else:
            args.append(a)
        i += 1
    return args, png, top, compile_split


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if ns.cmd == "bench":
        bench_suite.run_suite(quick=ns.quick, as_json=ns.json, threads=ns.threads)
        return 0
    if ns.cmd == "profile":
        args, png, top, compile_split = _own_options(ns.args)
        top = top if top is not None else ns.top
        return profile.run(ns.script, args, png or ns.png, top, compile_split=compile_split or ns.compile)
    if ns.cmd == "cache":
        if ns.action == "info":
            return cache.info()
        if ns.action == "verify":
            return cache.verify()
        return cache.clear(everything=ns.all)
    if ns.cmd == "onnx":
        return onnx_cli.main(ns)
    print(harness.format_machine(harness.machine(refresh=ns.refresh)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

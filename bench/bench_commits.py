"""Two checkouts of uopc, one benchmark, interleaved: is the new commit slower than the old one?

    git worktree add /tmp/old <commit>
    python bench/bench_commits.py /tmp/old . bench/bench_overhead.py --runs 5 -- --rounds 3

Each run starts a fresh process of the benchmark script *from that checkout* (its own copy of the script, with that
checkout first on PYTHONPATH), alternating old, new, old, new, ... so drifting machine load hits both alike. Every
output line that both sides print is matched by its text with the numbers taken out; the table gives, per line, the
median over runs of its first number on each side and new/old. Timings are the benchmark's own (it already
interleaves its variants and prints medians); this adds the between-commit comparison.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def run(tree: str, script: str, args: list[str]) -> list[str]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    out = subprocess.run(
        [sys.executable, os.path.join(tree, script), *args], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def figures(lines: list[str]) -> dict[str, list[float]]:
    """Each line with numbers -> its numbers, keyed by the line's text with every number replaced by #."""
    out = {}
    for line in lines:
        nums = NUMBER.findall(line)
        if nums:
            out.setdefault(" ".join(NUMBER.sub("#", line).split()), [float(n) for n in nums])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", help="checkout of the old commit")
    ap.add_argument("new", help="checkout of the new commit")
    ap.add_argument("script", help="benchmark script, relative to each checkout")
    ap.add_argument("--runs", type=int, default=5, help="processes per side")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    a.args = argv[cut + 1 :]  # the script's own arguments
    got: dict[str, dict[str, list[list[float]]]] = {"old": {}, "new": {}}
    for i in range(a.runs):
        for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
            for key, v in figures(run(getattr(a, side), a.script, a.args)).items():
                got[side].setdefault(key, []).append(v)
    print(f"{a.script}: {a.runs} runs per side, alternating; per line, the median of its first two numbers")
    print(f"{'old':>10s} {'new':>10s} {'new/old':>8s} | {'old #2':>8s} {'new #2':>8s}  line")
    for key in got["new"]:
        if key not in got["old"]:
            continue
        cols = []
        for j in range(2):
            o = [v[j] for v in got["old"][key] if len(v) > j]
            n = [v[j] for v in got["new"][key] if len(v) > j]
            cols.append((statistics.median(o), statistics.median(n)) if o and n else None)
        (o, n), second = cols[0], cols[1]
        ratio = f"{n / o:8.3f}" if o else "       -"
        two = f"{second[0]:8.4g} {second[1]:8.4g}" if second else " " * 17
        print(f"{o:10.4g} {n:10.4g} {ratio} | {two}  {key[:80]}")


if __name__ == "__main__":
    main()

"""Every Python code block of README.md runs, each on its own (a fresh namespace: a block that needs a name another
block defined fails here), so the README's examples never rot."""

from __future__ import annotations

import math
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the opening fence, code) of each ```python block."""
    blocks = []
    for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M):
        blocks.append((text.count("\n", 0, m.start()) + 1, m.group(1)))
    return blocks


with open(README) as f:
    BLOCKS = python_blocks(f.read())


def test_readme_has_its_examples():
    # the quick start, TinyJit, the chapters' API and the settings: a block lost by a bad edit fails here
    assert len(BLOCKS) >= 4
    assert any("TinyJit" in code for _, code in BLOCKS)


@pytest.mark.parametrize("line,code", BLOCKS, ids=[f"README.md:{n}" for n, _ in BLOCKS])
def test_readme_block_runs(line, code, capsys):
    exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    if "@TinyJit" in code:
        # the training step is called three times (run, capture, replay), each printing a finite loss
        losses = [line.split() for line in out.splitlines() if re.fullmatch(r"\d \S+", line)]
        assert [i for i, _ in losses] == ["0", "1", "2"], out
        assert all(math.isfinite(float(v)) for _, v in losses), out

"""The docs say what the code does: docs/layout.md's generated part is current and its walk names every module,
tensor.py's docstring names every mixin of Tensor, and docs/design.md names exactly the imports that run against the
pipeline's data flow."""

from __future__ import annotations

import os

import uopc.tensor
import uopc.tensor.tensor
from uopc.tensor import Tensor
from uopc.tools.layout import HOW, LAYOUT, ROOT, generated_block, layout_text, modules, stale

DESIGN = os.path.join(os.path.dirname(LAYOUT), "design.md")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def test_layout_page_is_current():
    why = stale(_read(LAYOUT))
    assert why is None, f"docs/layout.md is out of date; regenerate it with: {HOW}\n{why}"


def test_layout_check_tolerates_small_count_drift_only():
    text = layout_text()
    assert stale(text, text) is None
    row = next(line for line in text.splitlines() if line.startswith("| `uopc/uop/rewrite.py` |"))
    n = int(row.split(" | ")[1])
    assert stale(text.replace(row, row.replace(f" | {n} | ", f" | {n + 3} | ")), text) is None
    assert stale(text.replace(row, row.replace(f" | {n} | ", f" | {n + 500} | ")), text) is not None
    assert stale(text.replace(row, row.replace("Pattern rewriting", "Rewriting")), text) is not None
    edge = next(line for line in text.splitlines() if line.startswith("uop.rewrite ") and "<-" in line)
    assert stale(text.replace(edge, edge + ", helpers"), text) is not None


def test_layout_walk_names_every_module():
    # the hand-written walk above the generated part names each top-level module and package
    doc = _read(LAYOUT)
    walk = doc.replace(generated_block(doc), "")
    names = {m.split(".")[1] for m in modules() if m.count(".") >= 1}
    missing = []
    for name in sorted(names):
        shown = f"`{name}/`" if os.path.isdir(os.path.join(ROOT, name)) else f"`{name}.py`"
        if shown not in walk:
            missing.append(shown)
    assert not missing, f"docs/layout.md's walk (the numbered list) does not name {missing}: add a line for each"


def test_tensor_docstring_names_every_mixin():
    files = sorted({c.__module__.rpartition(".")[2] + ".py" for c in Tensor.__mro__[1:] if c is not object})
    assert len(files) >= 12
    docs = {"uopc/tensor/tensor.py": uopc.tensor.tensor.__doc__, "uopc/tensor/__init__.py": uopc.tensor.__doc__}
    for where, doc in docs.items():
        missing = [f for f in files if f not in doc]
        assert not missing, f"{where}'s docstring does not name the mixin files {missing}"

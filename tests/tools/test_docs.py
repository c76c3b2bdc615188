"""The docs say what the code does: docs/layout.md's generated part is current and its walk names every module,
tensor.py's docstring names every mixin of Tensor, and docs/design.md names exactly the imports that run against the
pipeline's data flow."""

from __future__ import annotations

import os

import uopc.tensor
import uopc.tensor.tensor
from uopc.tensor import Tensor
from uopc.tools.layout import HOW, LAYOUT, ROOT, generated_block, import_graph, layout_text, modules, stale

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
    row = next(line for line in text.splitlines() if line.startswith("| `uopc/rewrite.py` |"))
    n = int(row.split(" | ")[1])
    assert stale(text.replace(row, row.replace(f" | {n} | ", f" | {n + 3} | ")), text) is None
    assert stale(text.replace(row, row.replace(f" | {n} | ", f" | {n + 500} | ")), text) is not None
    assert stale(text.replace(row, row.replace("Pattern rewriting", "Rewriting")), text) is not None
    edge = next(line for line in text.splitlines() if line.startswith("rewrite ") and "<-" in line)
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


# the data-flow position of each stage in docs/design.md's diagram: schedule, optimize, lower, linearize, render,
# realize (the engine, which drives every stage), runtime
FLOW = {
    "uopc.schedule": 1,
    "uopc.opt": 2,
    "uopc.opts": 2,
    "uopc.rangeify": 3,
    "uopc.vectorize": 3,
    "uopc.linearize": 4,
    "uopc.half": 5,
    "uopc.render_c": 5,
    "uopc.render_math": 5,
    "uopc.realize": 6,
    "uopc.engine": 6,
    "uopc.runtime": 7,
}
ENGINE = 6
# the imports against the flow that docs/design.md names (its pipeline section): when one appears, change both
AGAINST_FLOW: set[tuple[str, str]] = set()


def _stage(m: str) -> int | None:
    return FLOW.get(m) or FLOW.get(m.rpartition(".")[0])


def test_design_page_names_the_imports_against_the_flow():
    against = set()
    for a, bs in import_graph(lazy=False).items():
        for b in bs:
            sa, sb = _stage(a), _stage(b)
            if sa is not None and sb is not None and sa < sb and sa != ENGINE:
                against.add((a, b))
    assert against == AGAINST_FLOW, (
        f"imports against the data flow are now {sorted(against)}; docs/design.md's pipeline section names "
        f"{sorted(AGAINST_FLOW)}: update the section, then AGAINST_FLOW here"
    )
    design = _read(DESIGN)
    section = design[design.index("## The pipeline") : design.index("## Modules and their contracts")]
    for a, b in AGAINST_FLOW:
        for m in (a, b):
            assert f"`{m.removeprefix('uopc.').replace('.', '/')}.py`" in section, f"design.md does not name {m}"

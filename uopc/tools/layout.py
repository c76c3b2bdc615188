"""docs/layout.md's generated part: every module with its line count and what its docstring says it is, and the
import graph, each module after everything it imports.

    python -m uopc.tools.layout            print the generated part
    python -m uopc.tools.layout --write    put it into docs/layout.md (between the generated markers)
    python -m uopc.tools.layout --check    exit 1 if docs/layout.md's generated part is out of date

    | `uopc/rewrite.py` | 130 | Pattern rewriting: rules are data. |
    rewrite                <- dtype, uop

It reads the sources only (ast, no imports), so it runs on any tree, and again after modules move.
`tests/unit/test_imports.py` checks the graph (no cycles, lazy imports allowed one by one) and that the page is current.
"""

from __future__ import annotations

import ast
import functools
import os
import sys

from uopc.helpers import atomic_write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the uopc package
LAYOUT = os.path.join(os.path.dirname(ROOT), "docs", "layout.md")
BEGIN, END = "<!-- generated: python -m uopc.tools.layout --write -->", "<!-- end generated -->"
HOW = "python -m uopc.tools.layout --write"
# the page's line counts may lag the files by this much (every edit need not touch the page)
COUNT_SLACK = 20


def module_name(path: str) -> str:
    """uopc/opt/layout.py -> uopc.opt.layout; a package's __init__.py is the package."""
    rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def modules() -> dict[str, str]:
    """Every module of uopc: dotted name -> path."""
    out = {}
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                out[module_name(os.path.join(d, f))] = os.path.join(d, f)
    return out


@functools.cache
def _parsed(path: str, mtime_ns: int) -> ast.Module:
    """A source file's syntax tree, parsed once per version of the file."""
    with open(path) as f:
        return ast.parse(f.read(), path)


def parse(path: str) -> ast.Module:
    """A module's syntax tree (the generator and the import test ask for each file several times)."""
    return _parsed(path, os.stat(path).st_mtime_ns)


def _resolve(name: str, mods: dict[str, str]) -> str | None:
    """The module an import names (a name imported from a package may itself be a submodule)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _imports(tree: ast.AST, lazy: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of a module: at module level (lazy=False) or inside functions (lazy=True)."""
    found = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)) and inner == lazy:
                found.append(child)
            walk(child, inner)

    walk(tree, False)
    return found


def _imported_names(node: ast.Import | ast.ImportFrom, pkg: str, mods: dict[str, str]) -> list[str]:
    """The dotted names an import statement reaches (`from pkg import sub` reaches the submodule)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative import
        parts = pkg.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def import_graph(lazy: bool | None = None, own: bool = False) -> dict[str, set[str]]:
    """module -> the uopc modules it imports (anywhere, or only at module level / only inside functions).

    A package's imports of its own submodules are how it re-exports them and are left out (the top package `uopc`
    excepted: what it imports is what `import uopc` loads); `own=True` keeps them."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        tree = parse(path)
        pkg = m if path.endswith("__init__.py") else m.rpartition(".")[0]
        nodes = _imports(tree, True) + _imports(tree, False) if lazy is None else _imports(tree, lazy)
        for node in nodes:
            for n in _imported_names(node, pkg, mods):
                t = _resolve(n, mods) if n.startswith("uopc") else None
                if t is None or t == m:
                    continue
                # a package importing its own submodules is how it re-exports them, not a dependency
                re_export = m != "uopc" and path.endswith("__init__.py") and t.startswith(m + ".")
                if own or not re_export:
                    graph[m].add(t)
    return graph


def lazy_only() -> set[tuple[str, str]]:
    """(importer, imported) edges made only by imports inside functions."""
    eager = import_graph(lazy=False, own=True)
    return {(a, b) for a, bs in import_graph(lazy=True).items() for b in bs if b not in eager[a]}


def topo_order(graph: dict[str, set[str]], skip: set[tuple[str, str]]) -> list[str]:
    """Modules by depth (1 + the deepest module they import, edges in `skip` left out), then by name: each module
    comes after everything it imports. Raises ValueError on a cycle."""
    depth: dict[str, int] = {}
    visiting: set[str] = set()

    def d(u: str) -> int:
        if u not in depth:
            if u in visiting:
                raise ValueError(f"import cycle through {u}")
            visiting.add(u)
            depth[u] = 1 + max((d(v) for v in graph[u] if (u, v) not in skip), default=-1)
        return depth[u]

    return sorted(graph, key=lambda u: (d(u), u))


def summary(path: str) -> str:
    """A module's docstring's first paragraph, on one line ("-" without a docstring)."""
    doc = ast.get_docstring(parse(path)) or "-"
    return " ".join(doc.split("\n\n")[0].split()).replace("|", "\\|")


def line_count(path: str) -> int:
    with open(path) as f:
        return sum(1 for _ in f)


def layout_text() -> str:
    """The generated part of docs/layout.md: a table of the modules by path with line counts and summaries, and the
    import graph one line per module, dependencies first ("(lazy)": imported inside a function only)."""
    mods = modules()
    rows = ["| module | lines | what it is |", "|---|---:|---|"]
    for m in sorted(mods, key=lambda m: mods[m]):
        rel = os.path.relpath(mods[m], os.path.dirname(ROOT))
        rows.append(f"| `{rel}` | {line_count(mods[m])} | {summary(mods[m])} |")
    graph, lazy = import_graph(), lazy_only()
    edges = []
    for m in topo_order(import_graph(own=True), lazy):
        eager = sorted(t.removeprefix("uopc.") for t in graph[m] if (m, t) not in lazy)
        late = sorted(t.removeprefix("uopc.") + " (lazy)" for t in graph[m] if (m, t) in lazy)
        what = ", ".join(eager + late) or ("(re-exports its modules)" if mods[m].endswith("__init__.py") else "-")
        edges.append(f"{m.removeprefix('uopc.'):22s} <- {what}")
    return "\n".join([BEGIN, *rows, "", "```", *edges, "```", END])


def generated_block(doc: str) -> str:
    """The part of a page between (and including) the generated markers."""
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"{LAYOUT} has no generated block ({BEGIN} ... {END})")
    return doc[doc.index(BEGIN) : doc.index(END) + len(END)]


def _counts(block: str) -> tuple[list[str], list[int]]:
    """The block with each table row's line count taken out, and the counts."""
    lines, counts = [], []
    for line in block.splitlines():
        cells = line.split(" | ")
        if line.startswith("| `uopc/") and len(cells) >= 3 and cells[1].isdigit():
            counts.append(int(cells[1]))
            line = " | ".join([cells[0], "#", *cells[2:]])
        lines.append(line)
    return lines, counts


def stale(doc: str, current: str | None = None) -> str | None:
    """Why the page's generated block differs from `current` (default: layout_text(); None: it is current). Line
    counts may lag by COUNT_SLACK lines or 10%; everything else must match exactly."""
    have, want = _counts(generated_block(doc)), _counts(current or layout_text())
    if have[0] != want[0]:
        diff = [f"  page: {a}\n  now:  {b}" for a, b in zip(have[0], want[0], strict=False) if a != b]
        return "\n".join(diff[:3] or [f"  {len(have[0])} lines on the page, {len(want[0])} generated"])
    for a, b in zip(have[1], want[1], strict=True):
        if abs(a - b) > max(COUNT_SLACK, b // 10):
            return f"  a line count is {a} on the page, {b} in the file"
    return None


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        with open(LAYOUT) as f:
            doc = f.read()
        new = doc.replace(generated_block(doc), layout_text())  # computed first: a failure leaves the page as it was
        atomic_write(LAYOUT, new.encode())
        return 0
    if argv == ["--check"]:
        with open(LAYOUT) as f:
            why = stale(f.read())
        if why:
            print(f"docs/layout.md is out of date; regenerate it with: {HOW}\n{why}", file=sys.stderr)
        return 1 if why else 0
    if not argv:
        print(layout_text())
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

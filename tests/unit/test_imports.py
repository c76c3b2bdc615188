"""The package's layering: the uopc import graph (imports inside functions included) has no cycles.

Every `import uopc.x` / `from uopc.x import ...` / `from uopc import x` in every module under uopc/ is an edge. The
only edges allowed to point back up the pipeline are the lazy ones listed in ALLOWED, each with its reason.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "uopc")

# (importer, imported) edges that may form a cycle, because they are imported lazily inside a function
ALLOWED = {
    # Tensor.realize reaches the realize stage: `import uopc` must not load the compiler
    ("uopc.tensor.tensor", "uopc.realize"),
    # uopc.TinyJit (uopc/jit.py sits above realize), for the same reason
    ("uopc", "uopc.jit"),
}


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _modules() -> dict[str, str]:
    out = {}
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                out[_module_name(os.path.join(d, f))] = os.path.join(d, f)
    return out


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


def import_graph(lazy: bool | None = None, own: bool = False) -> dict[str, set[str]]:
    """module -> the uopc modules it imports (anywhere, or only at module level / only inside functions).

    A package's imports of its own submodules are how it re-exports them and are left out (the top package `uopc`
    excepted: what it imports is what `import uopc` loads); `own=True` keeps them."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        pkg = m if path.endswith("__init__.py") else m.rpartition(".")[0]
        nodes = _imports(tree, True) + _imports(tree, False) if lazy is None else _imports(tree, lazy)
        for node in nodes:
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    parts = pkg.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                # `from pkg import sub` imports the submodule; `from mod import name` imports mod
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for n in names:
                if n.startswith("uopc"):
                    t = _resolve(n, mods)
                    # a package importing its own submodules is how it re-exports them, not a dependency
                    re_export = m != "uopc" and path.endswith("__init__.py") and t is not None and t.startswith(m + ".")
                    if t and t != m and (own or not re_export):
                        graph[m].add(t)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if (u, v) in ALLOWED:
                continue
            if state.get(v) == 1:
                return stack[stack.index(v) :] + [v]
            if v not in state and (c := visit(v)):
                return c
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state and (c := visit(u)):
            return c
    return None


def test_import_graph_is_acyclic():
    graph = import_graph()
    assert "uopc.realize" in graph and "uopc.schedule" in graph
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_allow_list_is_small_and_used():
    graph = import_graph()
    assert len(ALLOWED) <= 3
    for a, b in ALLOWED:
        assert b in graph.get(a, ()), f"allow-list entry {a} -> {b} is stale"


def test_every_lazy_import_is_allowed():
    lazy = {(a, b) for a, bs in import_graph(lazy=True).items() for b in bs}
    assert lazy <= ALLOWED, f"imports inside functions not in the allow-list: {sorted(lazy - ALLOWED)}"


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_import_uopc_loads_no_compiler_stage():
    code = "import sys, uopc; print(' '.join(sorted(m for m in sys.modules if m.startswith('uopc'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    for stage in ("uopc.schedule", "uopc.realize", "uopc.opt", "uopc.rangeify", "uopc.render_c", "uopc.runtime"):
        assert stage not in out, f"`import uopc` loaded {stage}: {out}"


# ---------------------------------------------------------------------------------------------------------------
# docs/layout.md: its tree and import graph are generated here (python tests/unit/test_imports.py prints them,
# --write puts them into the page)

LAYOUT = os.path.join(os.path.dirname(ROOT), "docs", "layout.md")
BEGIN, END = "<!-- generated: python tests/unit/test_imports.py -->", "<!-- end generated -->"


def _topo_order(graph: dict[str, set[str]]) -> list[str]:
    """Modules by depth (1 + the deepest module they import, a package's re-exported modules included; lazy allowed
    edges ignored), then by name: each module comes after everything it imports, in the pipeline's order."""
    depth: dict[str, int] = {}

    def d(u: str) -> int:
        if u not in depth:
            depth[u] = 1 + max((d(v) for v in graph[u] if (u, v) not in ALLOWED), default=-1)
        return depth[u]

    return sorted(graph, key=lambda u: (d(u), u))


def layout_text() -> str:
    """The tree of uopc/ with line counts, and the import graph one line per module (dependencies first)."""
    mods = _modules()
    graph = import_graph()
    tree = []
    for m in sorted(mods, key=lambda m: mods[m]):
        with open(mods[m]) as f:
            n = sum(1 for _ in f)
        tree.append(f"{os.path.relpath(mods[m], os.path.dirname(ROOT)):36s} {n:5d}")
    edges = []
    for m in _topo_order(import_graph(own=True)):
        eager = sorted(t.removeprefix("uopc.") for t in graph[m] if (m, t) not in ALLOWED)
        lazy = sorted(t.removeprefix("uopc.") + " (lazy)" for t in graph[m] if (m, t) in ALLOWED)
        what = ", ".join(eager + lazy) or ("(re-exports its modules)" if mods[m].endswith("__init__.py") else "-")
        edges.append(f"{m.removeprefix('uopc.') if m != 'uopc' else 'uopc':22s} <- {what}")
    return "\n".join([BEGIN, "```", *tree, "```", "", "```", *edges, "```", END])


def _generated_block(text: str) -> str:
    return text[text.index(BEGIN) : text.index(END) + len(END)]


def _strip_counts(block: str) -> list[str]:
    return [line.rsplit(None, 1)[0] if line.startswith("uopc/") else line for line in block.splitlines()]


def test_layout_doc_lists_every_module_and_import():
    """docs/layout.md's tree names every module and its import graph is the real one (line counts may drift)."""
    with open(LAYOUT) as f:
        doc = f.read()
    assert BEGIN in doc and END in doc, f"{LAYOUT} lost its generated block"
    assert _strip_counts(_generated_block(doc)) == _strip_counts(layout_text()), (
        "docs/layout.md is out of date: run python tests/unit/test_imports.py --write"
    )


if __name__ == "__main__":  # --write: replace the generated block of docs/layout.md in place
    if sys.argv[1:] == ["--write"]:
        with open(LAYOUT) as f:
            doc = f.read()
        with open(LAYOUT, "w") as f:
            f.write(doc.replace(_generated_block(doc), layout_text()))
    else:
        print(layout_text())


def test_no_module_exceeds_600_lines():
    long = {m: n for m, p in _modules().items() if (n := sum(1 for _ in open(p))) > 600}
    assert not long, f"modules over 600 lines (split them by job): {long}"

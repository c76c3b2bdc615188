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


def import_graph(lazy: bool | None = None) -> dict[str, set[str]]:
    """module -> the uopc modules it imports (anywhere, or only at module level / only inside functions).

    A package's imports of its own submodules are how it re-exports them and are left out (the top package `uopc`
    excepted: what it imports is what `import uopc` loads)."""
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
                    own = m != "uopc" and path.endswith("__init__.py") and t is not None and t.startswith(m + ".")
                    if t and t != m and not own:
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

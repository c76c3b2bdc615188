"""The package's layering: the uopc import graph (imports inside functions included) has no cycles.

Every `import uopc.x` / `from uopc.x import ...` / `from uopc import x` in every module under uopc/ is an edge. The
only edges allowed to point back up the pipeline are the lazy ones listed in ALLOWED, each with its reason. The graph
comes from uopc/tools/layout.py, which also writes it into docs/layout.md (tests/tools/test_docs.py checks the page).
"""

from __future__ import annotations

import subprocess
import sys

from uopc.tools.layout import import_graph, line_count, modules

# (importer, imported) edges that may form a cycle, because they are imported lazily inside a function
ALLOWED = {
    # Tensor.realize reaches the realize stage: `import uopc` must not load the compiler
    ("uopc.tensor.tensor", "uopc.engine.realize"),
    # uopc.TinyJit (uopc/engine/jit.py sits above realize), for the same reason
    ("uopc", "uopc.engine.jit"),
    # `uopc onnx` needs the optional onnx package: every other `uopc` subcommand works without it
    ("uopc.tools.onnx_cli", "uopc.onnx"),
}


# the pipeline's stages in the order data flows (docs/design.md): a module of one imports its own stage or stages to
# its left, never one to its right. The engine drives every stage, so it comes last.
STAGES = ("uopc.uop", "uopc.schedule", "uopc.opt", "uopc.codegen", "uopc.renderer", "uopc.runtime", "uopc.engine")
# the front ends build graphs: they reach the IR and the storage of buffers, and the engine only lazily (ALLOWED)
FRONTENDS = ("uopc.tensor", "uopc.nn", "uopc.onnx")
FRONTEND_REACH = ("uopc.uop", "uopc.runtime.buffer")


def _stage(m: str) -> int | None:
    return next((i for i, s in enumerate(STAGES) if m == s or m.startswith(s + ".")), None)


def test_no_stage_imports_a_stage_to_its_right():
    graph = import_graph()
    assert all(any(m == s or m.startswith(s + ".") for m in graph) for s in STAGES), "a stage package is missing"
    against = sorted(
        (a, b)
        for a, bs in graph.items()
        for b in bs
        if (sa := _stage(a)) is not None and (sb := _stage(b)) is not None and sb > sa and (a, b) not in ALLOWED
    )
    assert not against, f"imports of a stage to the importer's right: {against}"


def test_front_ends_reach_only_the_ir_and_storage():
    graph = import_graph()
    reach = sorted(
        (a, b)
        for a, bs in graph.items()
        if a.startswith(FRONTENDS)
        for b in bs
        if _stage(b) is not None and not b.startswith(FRONTEND_REACH) and (a, b) not in ALLOWED
    )
    assert not reach, f"front-end modules importing compiler stages: {reach}"


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
    assert "uopc.engine.realize" in graph and "uopc.schedule" in graph
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
    loaded = [m for m in out if _stage(m) is not None and m not in ("uopc.uop", "uopc.runtime")]
    assert all(m.startswith(("uopc.uop.", "uopc.runtime.buffer", "uopc.runtime.threads")) for m in loaded), (
        f"`import uopc` loaded a compiler stage: {loaded}"
    )


def test_no_module_exceeds_600_lines():
    long = {m: n for m, p in modules().items() if (n := line_count(p)) > 600}
    assert not long, f"modules over 600 lines (split them by job): {long}"

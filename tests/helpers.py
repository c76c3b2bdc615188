"""Shared test helpers: building buffers and the standard graphs (matmul, GEMM), running a shape graph as C.

    x = buf(0, 32).reshape((4, 8))
    run(x.reduce(Ops.MAX, 1), [np.arange(32, dtype=np.float32)])   # -> array of shape (4,)

`run` lowers the graph into an output BUFFER whose slot is the number of inputs, renders and compiles it (the runtime
caches compiled kernels, so equal graphs compile once per session) and passes exactly the buffers the lowered kernel
still reads, in slot order, as the rendered C function's parameters are.
"""

from __future__ import annotations

import functools
import re
import subprocess

import numpy as np

from uopc import helpers as uopc_helpers
from uopc.codegen.rangeify import Ctx, Opts, lower
from uopc.helpers import prod
from uopc.renderer.c import render_c
from uopc.runtime import compiler as runtime
from uopc.runtime.buffer import aligned_empty
from uopc.runtime.compiler import Program
from uopc.uop import Ops, ParamArg, UOp
from uopc.uop.dtype import DType, dtypes

__all__ = [
    "buf",
    "mm",
    "gemm_graph",
    "lower_graph",
    "render_graph",
    "run",
    "c_loops",
    "c_lines",
    "int_alu_rhs",
    "cc_major",
    "targets",
]


def buf(slot: int, size: int, dtype: DType = dtypes.float32) -> UOp:
    """A flat BUFFER of `size` elements in parameter slot `slot`."""
    return UOp(Ops.BUFFER, (), ParamArg(slot, dtype, (size,)))


def mm(a: UOp, b: UOp) -> UOp:
    """(n, k) @ (k, m) with movement ops only: reshape and expand both operands to (n, m, k), multiply, reduce k."""
    n, k = a.shape
    _, m = b.shape
    ae = a.reshape((n, 1, k)).expand((n, m, k))
    be = b.permute((1, 0)).reshape((1, m, k)).expand((n, m, k))
    return (ae * be).reduce(Ops.ADD, 1)


def gemm_graph(M: int, N: int | None = None, K: int | None = None, bt: bool = False) -> UOp:
    """C[i, j] = sum_k A[i, k] B[k, j]. A is BUFFER 0 (M*K), B is BUFFER 1: (K, N) row-major, or
    (N, K) when `bt` (B stored transposed). gemm_graph(N, bt=...) is the square case."""
    N = M if N is None else N
    K = M if K is None else K
    A, B = buf(0, M * K), buf(1, K * N)
    a = A.reshape((M, 1, K)).expand((M, N, K))
    b = B.reshape((N, K)) if bt else B.reshape((K, N)).permute((1, 0))
    return (a * b.reshape((1, N, K)).expand((M, N, K))).reduce(Ops.ADD, 1)


def lower_graph(graph: UOp, n_inputs: int, opts: Opts | None = None) -> UOp:
    """The lowered SINK storing `graph` into an output BUFFER of slot `n_inputs`."""
    return lower(graph, buf(n_inputs, max(graph.size, 1), graph.dtype), Ctx(opts=opts or Opts()))


def render_graph(graph: UOp, n_inputs: int, opts: Opts | None = None, name: str = "k") -> str:
    """The C source of `graph` lowered with `opts`."""
    return render_c(lower_graph(graph, n_inputs, opts), name)


_programs: dict[tuple, tuple[Program, list[int]]] = {}


def run(graph: UOp, inputs: list[np.ndarray], opts: Opts | None = None) -> np.ndarray:
    """Lower, render, compile and run `graph`; return its value as an array of graph.shape.

    inputs[i] is BUFFER slot i (flattened and converted to that buffer's dtype). The output is prefilled with a
    0xA5 byte pattern, so an element the kernel never writes shows up as garbage, not as a plausible zero."""
    opts = opts or Opts()
    key = (graph, len(inputs), opts.key())
    if (hit := _programs.get(key)) is None:
        ast = lower_graph(graph, len(inputs), opts)
        prg = Program(render_c(ast, "k"), "k")
        hit = _programs[key] = (prg, sorted({u.arg.slot for u in ast.toposort() if u.op is Ops.BUFFER}))
    prg, slots = hit
    bufs = {u.arg.slot: u for u in graph.toposort() if u.op is Ops.BUFFER}
    args = []
    for i, x in enumerate(inputs):
        b = bufs.get(i)
        dt = b.dtype.np if b is not None else np.asarray(x).dtype
        x = np.asarray(x).reshape(-1)
        if b is not None and x.size != prod(b.arg.shape):
            raise ValueError(f"input {i} has {x.size} elements, BUFFER slot {i} has {prod(b.arg.shape)}")
        # kernels assume uopc's 64-byte aligned storage (an aligned vector load of NumPy's 16-byte aligned array faults)
        a = aligned_empty(x.size, b.dtype) if b is not None else np.empty(x.size, dt)
        a[:] = x
        args.append(a)
    out = aligned_empty(max(graph.size, 1), graph.dtype)
    out.view(np.uint8)[:] = 0xA5
    args.append(out)
    prg(*(args[s] for s in slots))
    return out.reshape(graph.shape)


# ------------------------------------------------------------------ reading rendered C


def c_lines(src: str) -> list[str]:
    """The lines of the function body (after the opening line of the function)."""
    lines = src.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("void "))
    return lines[start + 1 : -1]


def c_loops(src: str) -> list[tuple[int, int, int]]:
    """Every `for (` loop as (depth, first line, closing line), depth 1 = outermost, found by indentation
    (the renderer indents each nesting level by two spaces, the function body starting at two)."""
    lines = c_lines(src)
    loops = []
    for i, line in enumerate(lines):
        if line.lstrip().startswith("for ("):
            ind = len(line) - len(line.lstrip())
            end = next(j for j in range(i + 1, len(lines)) if lines[j] == " " * ind + "}")
            loops.append((ind // 2, i, end))
    return loops


_INT_ALU = re.compile(r"^\s*int (alu\d+) = (.*);$")


def int_alu_rhs(src: str) -> dict[str, str]:
    """name -> right-hand side of every `int aluN = (...);` line."""
    return {m.group(1): m.group(2) for line in src.splitlines() if (m := _INT_ALU.match(line))}


# ------------------------------------------------------------------ the host toolchain (for compiler-specific xfails)


@functools.cache
def cc_major() -> int | None:
    """The major version of the C compiler uopc uses (CC), or None if it cannot be asked."""
    try:
        out = subprocess.run(
            [uopc_helpers.settings().CC, "-dumpversion"], capture_output=True, text=True, timeout=60
        ).stdout
        return int(out.strip().split(".")[0])
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def targets(isa: str) -> bool:
    """Whether the compiler targets `isa` ("avx512f", "avx2", ...) with the current CC and CFLAGS: what the code is
    compiled for, which -march in CFLAGS decides (not the CPU the tests run on)."""
    return isa in runtime.machine().isa

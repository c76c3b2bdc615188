"""uopc demo: a shape graph lowered to C and run, then the same softmax through the lazy Tensor.

make demo        (or: python examples/demo.py)
"""

import numpy as np

from uopc.engine.realize import realize
from uopc.helpers import Context
from uopc.kernelize import make_plan
from uopc.renderer.c import render_c
from uopc.runtime.buffer import buffer_data, new_buffer
from uopc.runtime.compiler import Program
from uopc.schedule import RefKind
from uopc.uop import Ops
from uopc.uop.dtype import dtypes

LOG2E = 1.4426950408889634


def softmax_graph(x):
    """softmax over the last axis from the IR's primitives: MAX/ADD reduces, EXP2, RECIP."""
    n, m = x.shape
    mx = x.reduce(Ops.MAX, 1).reshape((n, 1)).expand((n, m))
    e = ((x - mx) * LOG2E).alu(Ops.EXP2)
    s = e.reduce(Ops.ADD, 1).reshape((n, 1)).expand((n, m))
    return e * s.alu(Ops.RECIP)


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    root = softmax_graph(new_buffer(dtypes.f32, 32, x).reshape((4, 8)))

    print("== softmax of a (4, 8) matrix, cut at its two reductions (OPT=0: readable C) ==\n")
    plan, inputs = make_plan([root])
    srcs = [render_c(k.ast, k.name) for k in plan.kernels]
    for k, src in zip(plan.kernels, srcs):
        print(f"// {k.name}  refs={list(k.refs)}")
        print("void" + src.split("\nvoid", 1)[1])  # the function, without the shared prelude
    # run the three kernels by hand, exactly as realize() does
    temps = [np.empty(t.size, t.dtype.np) for t in plan.temps]
    out = np.empty(32, np.float32)
    arrays = {RefKind.IN: [buffer_data(b) for b in inputs], RefKind.TMP: temps, RefKind.OUT: [out]}
    for k, src in zip(plan.kernels, srcs):
        Program(src, k.name)(*(arrays[ref.kind][ref.i] for ref in k.refs))
    ref = np.exp(x - x.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    print(f"max |uopc - numpy| = {np.abs(out.reshape(4, 8) - ref).max():.2e}\n")

    print("== the same through realize() at DEBUG=2, a 512x512 softmax, twice (the second hits the plan cache) ==")
    big = rng.standard_normal((512, 512)).astype(np.float32)
    with Context(DEBUG=2):
        for _ in range(2):
            (buf,) = realize([softmax_graph(new_buffer(dtypes.f32, big.size, big).reshape((512, 512)))])
            print("row sums:", buffer_data(buf).reshape(512, 512).sum(1)[:3])
    try:
        from uopc.tensor import Tensor
    except ImportError:
        return
    print("\n== Tensor(x).softmax(-1) at DEBUG=2 ==")
    with Context(DEBUG=2):
        t = Tensor(big).softmax(-1)
        print("row sums:", t.numpy().sum(1)[:3])


if __name__ == "__main__":
    main()

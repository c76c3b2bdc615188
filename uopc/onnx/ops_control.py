"""ONNX control flow, sequences and optionals, evaluated while the graph is built (on the host).

    If(cond) -> the then/else branch's nodes, chosen by cond's value (known at load, or read at call time)
    Loop(M, cond, v) -> the body unrolled M times (or until cond is false); scan outputs stacked
    Scan(...)        -> the body unrolled along the scan axis

A sequence is a Python list of values and an optional is a value or None, so SequenceInsert, SequenceAt,
SplitToSequence, ConcatFromSequence, SequenceMap and the Optional ops are list operations around Tensor ops.
"""

from __future__ import annotations

import numpy as np
import onnx

from uopc import Tensor
from uopc.onnx.graph import Node, Value, host_op, op


def subgraph(n: Node, g: onnx.GraphProto, inputs: list[Value]) -> list[Value]:
    """Run a subgraph with the outer scope visible; its formal inputs bound to `inputs`."""
    env = dict(n.env)
    for vi, v in zip(g.input, inputs):
        env[vi.name] = v
    for t in g.initializer:
        env[t.name] = onnx.numpy_helper.to_array(t)
    n.runner.run_graph(g, env)
    return [env[o.name] for o in g.output]


def _flag(n: Node, v) -> bool:
    return bool(np.asarray(n.host(v)).reshape(-1)[0])


@op("If")
def _if(n: Node, cond):
    branch = n["then_branch"] if _flag(n, cond) else n["else_branch"]
    outs = subgraph(n, branch, [])
    return tuple(outs) if len(outs) != 1 else outs[0]


def _stack(vals: list[Value]) -> Value:
    if not vals:
        return np.zeros((0,), np.float32)
    ts = [v if isinstance(v, Tensor) else Tensor(np.asarray(v)) for v in vals]
    return Tensor.stack(*ts, dim=0)


@op("Loop")
def _loop(n: Node, m=None, cond=None, *state):
    body = n["body"]
    trips = None if m is None else int(np.asarray(n.host(m)).reshape(-1)[0])
    go = True if cond is None else _flag(n, cond)
    state = list(state)
    n_state = len(state)
    scans: list[list[Value]] = [[] for _ in range(len(body.output) - 1 - n_state)]
    i = 0
    while go and (trips is None or i < trips):
        outs = subgraph(n, body, [np.array(i, np.int64), np.array(go), *state])
        go = _flag(n, outs[0]) if outs[0] is not None else True
        state = outs[1 : 1 + n_state]
        for s, v in zip(scans, outs[1 + n_state :]):
            s.append(v)
        i += 1
        if trips is None and i > 1 << 16:
            raise n.fail("a Loop without a trip count ran 65536 iterations")
    return tuple(state + [_stack(s) for s in scans])


@op("Scan")
def _scan(n: Node, *ins):
    if n.opset < 9:
        return _scan8(n, *ins)
    body = n["body"]
    k = n["num_scan_inputs"]
    states, xs = list(ins[: len(ins) - k]), [n.t(x) for x in ins[len(ins) - k :]]
    in_axes = n.attr("scan_input_axes", [0] * k)
    in_dirs = n.attr("scan_input_directions", [0] * k)
    n_out = len(body.output) - len(states)
    out_axes = n.attr("scan_output_axes", [0] * n_out)
    out_dirs = n.attr("scan_output_directions", [0] * n_out)
    length = xs[0].shape[in_axes[0] % xs[0].ndim]
    scans: list[list[Value]] = [[] for _ in range(n_out)]
    for step in range(length):
        slices = []
        for x, a, d in zip(xs, in_axes, in_dirs):
            a %= x.ndim
            j = length - 1 - step if d else step
            slices.append(x[(slice(None),) * a + (j,)])
        outs = subgraph(n, body, [*states, *slices])
        states = outs[: len(states)]
        for s, v in zip(scans, outs[len(states) :]):
            s.append(n.t(v))
    results = []
    for s, a, d in zip(scans, out_axes, out_dirs):
        seq = s[::-1] if d else s
        results.append(Tensor.stack(*seq, dim=a % (seq[0].ndim + 1)))
    return tuple(states + results)


def _scan8(n: Node, lens, *ins):
    """Scan-8: a batch axis first, the scan axis second; each batch entry scans on its own."""
    k = n["num_scan_inputs"]
    ins = [n.t(v) for v in ins]
    batch, length = ins[-1].shape[0], ins[-1].shape[1]
    if lens is not None and (n.host(lens) != length).any():
        raise NotImplementedError(
            f"uopc.onnx: Scan-8 with sequence_lens shorter than the sequence (node {n.proto.name!r})"
        )
    per = [
        _scan_body(n, [v[b] for v in ins[: len(ins) - k]], [v[b] for v in ins[len(ins) - k :]]) for b in range(batch)
    ]
    return tuple(Tensor.stack(*[p[j] for p in per], dim=0) for j in range(len(per[0])))


def _scan_body(n: Node, states: list, xs: list) -> list:
    body = n["body"]
    dirs = n.attr("directions", [0] * len(xs))
    length = xs[0].shape[0]
    scans: list[list] = [[] for _ in range(len(body.output) - len(states))]
    for step in range(length):
        slices = [x[length - 1 - step if d else step] for x, d in zip(xs, dirs)]
        outs = subgraph(n, body, [*states, *slices])
        states = outs[: len(states)]
        for s, v in zip(scans, outs[len(states) :]):
            s.append(n.t(v))
    return [n.t(s) for s in states] + [Tensor.stack(*s, dim=0) for s in scans]


# ---------------------------------------------------------------- sequences (Python lists)


def _pos(n: Node, seq: list, pos, insert: bool = False) -> int:
    p = int(np.asarray(n.host(pos)).reshape(-1)[0])
    size = len(seq) + (1 if insert else 0)
    if not -size <= p < size:
        raise n.fail(f"position {p} is outside a sequence of {len(seq)}")
    return p + len(seq) if p < 0 else p  # insert: [-n, n]; -1 goes before the last


op("SequenceEmpty")(lambda n: [])
op("SequenceConstruct")(lambda n, *xs: list(xs))
op("SequenceLength")(lambda n, seq: np.array(len(seq), np.int64))
op("SequenceAt")(lambda n, seq, pos: seq[_pos(n, seq, pos)])


@op("SequenceInsert")
def _seq_insert(n: Node, seq, x, pos=None):
    out = list(seq)
    out.insert(len(out) if pos is None else _pos(n, seq, pos, insert=True), x)
    return out


@op("SequenceErase")
def _seq_erase(n: Node, seq, pos=None):
    out = list(seq)
    del out[-1 if pos is None else _pos(n, seq, pos)]
    return out


@op("SplitToSequence")
def _split_to_sequence(n: Node, x, split=None):
    x = n.t(x)
    axis = n.attr("axis", 0) % x.ndim
    dim = x.shape[axis]
    if split is None:
        parts = [x.shrink([(j, j + 1) if i == axis else None for i in range(x.ndim)]) for j in range(dim)]
        return [p.squeeze(axis) for p in parts] if n.attr("keepdims", 1) == 0 else parts
    s = n.host(split)
    sizes = [int(s)] * (dim // int(s)) + ([dim % int(s)] if dim % int(s) else []) if s.ndim == 0 else s.tolist()
    out, lo = [], 0
    for sz in sizes:
        out.append(x.shrink([(lo, lo + sz) if i == axis else None for i in range(x.ndim)]))
        lo += sz
    return out


@op("ConcatFromSequence")
def _concat_from_sequence(n: Node, seq):
    ts = [n.t(v) for v in seq]
    axis = n["axis"]
    if n.attr("new_axis", 0):
        return Tensor.stack(*ts, dim=axis % (ts[0].ndim + 1))
    return Tensor.cat(*ts, dim=axis % ts[0].ndim)


@op("SequenceMap")
def _sequence_map(n: Node, seq, *extra):
    body = n["body"]
    outs: list[list[Value]] = [[] for _ in body.output]
    for j in range(len(seq)):
        args = [seq[j]] + [e[j] if isinstance(e, list) else e for e in extra]
        for o, v in zip(outs, subgraph(n, body, args)):
            o.append(v)
    return tuple(outs) if len(outs) != 1 else outs[0]


# ---------------------------------------------------------------- optionals (a value or None)

op("Optional")(lambda n, x=None: x)
op("OptionalHasElement")(lambda n, x=None: np.array(x is not None))
host_op("OptionalHasElement")(lambda n, x=None: np.array(x is not None))


@op("OptionalGetElement")
def _optional_get(n: Node, x):
    if x is None:
        raise n.fail("the optional has no element")
    return x

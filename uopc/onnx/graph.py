"""Evaluating an ONNX graph on uopc: values, nodes, the op registry and the host constant folding.

A value in the environment is a lazy `Tensor` (device work), a NumPy array (known on the host: an initializer, a
Constant, a Shape, or an op over such values), a Python list (an ONNX sequence) or None (a missing optional):

    Shape(x) -> Gather(.., 0) -> Concat(.., [-1]) -> Reshape(x, ..)
    ^ host      ^ host           ^ host               ^ Tensor.reshape with the host-computed shape

An op runs on the host (its entry in HOST_OPS, NumPy) when every input is a small host array; otherwise its entry in
OPS runs, which builds Tensor ops. An op that needs an input's value to build the graph (a shape, axes, pads, k)
reads it with `Node.host`, which realizes a Tensor only if the value is not known on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from uopc import Tensor, dtypes
from uopc.uop.dtype import DType

Value = Any  # Tensor | np.ndarray | list | None
OpFn = Callable[..., Any]

# op type -> builder over Tensors; op type -> NumPy version for host-known inputs (the default domain)
OPS: dict[str, OpFn] = {}
HOST_OPS: dict[str, OpFn] = {}
# a host op runs only on inputs this small (shape arithmetic); larger host data is computed by uopc
HOST_FOLD_MAX = 1 << 12
DOMAINS = ("", "ai.onnx")

try:  # NumPy has no bfloat16; onnx hands bfloat16 data as ml_dtypes arrays
    import ml_dtypes

    BF16_NP: Any = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - onnx depends on ml_dtypes
    BF16_NP = None


def op(*names: str, host: OpFn | None = None) -> Callable[[OpFn], OpFn]:
    """Register a Tensor builder under ONNX op type names: `@op("Relu")`, optionally with a host (NumPy) version."""

    def deco(fn: OpFn) -> OpFn:
        for n in names:
            OPS[n] = fn
            if host is not None:
                HOST_OPS[n] = host
        return fn

    return deco


def host_op(*names: str) -> Callable[[OpFn], OpFn]:
    """Register the NumPy version of ops whose Tensor builder is registered with `op`."""

    def deco(fn: OpFn) -> OpFn:
        for n in names:
            HOST_OPS[n] = fn
        return fn

    return deco


# ---------------------------------------------------------------- dtypes


def onnx_dtype(elem_type: int) -> DType:
    """The uopc dtype of an ONNX TensorProto element type (TypeError for one uopc has not)."""
    if elem_type == onnx.TensorProto.BFLOAT16:
        return dtypes.bfloat16
    try:
        return dtypes.from_np(helper.tensor_dtype_to_np_dtype(elem_type))
    except (TypeError, KeyError):
        name = onnx.TensorProto.DataType.Name(elem_type)
        raise TypeError(f"ONNX element type {name} has no uopc dtype") from None


def np_dtype(dt: DType) -> np.dtype:
    """The NumPy dtype ONNX uses for a uopc dtype (ml_dtypes.bfloat16 for bfloat16)."""
    return BF16_NP if dt is dtypes.bfloat16 else dt.np


def to_tensor(x: Value, constant: bool = False) -> Tensor:
    """A Tensor for a value: host arrays become buffers (bfloat16 through float32, exact). `constant`: a value the
    model states (an initializer, a Constant node's, one folded from those alone), never one computed from a call's
    inputs: a float32 scalar is then a CONST, which the scheduler reads (an attention's scale or a mask's -inf,
    uopc.schedule.attention)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (list, tuple)) or x is None:
        raise TypeError(f"expected a tensor, got {type(x).__name__}")
    a = np.asarray(x)
    if BF16_NP is not None and a.dtype == BF16_NP:
        # reshape: Tensor(0-d float32, dtype=bfloat16) comes back with shape (1,) (a Tensor bug, reported)
        return Tensor(a.astype(np.float32), dtype=dtypes.bfloat16).reshape(a.shape)
    if constant and a.size == 1 and a.dtype == np.float32:
        return Tensor.full(a.shape, float(a.reshape(-1)[0]), dtype=dtypes.float32)
    return Tensor(a if a.flags.c_contiguous else a.copy())


def to_numpy(t: Tensor) -> np.ndarray:
    """A Tensor's values as NumPy, with ONNX's dtype for bfloat16."""
    out = t.numpy()
    return out.astype(BF16_NP) if t.dtype is dtypes.bfloat16 else out


def attribute(a: onnx.AttributeProto) -> Any:
    """An attribute as Python: numbers, strings, lists, NumPy arrays for tensors, GraphProto for subgraphs."""
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, onnx.SparseTensorProto):
        return sparse_to_array(v)
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode() for s in v]
    return v


def sparse_to_array(s: onnx.SparseTensorProto) -> np.ndarray:
    """A dense array from a sparse tensor (values at flat or coordinate indices)."""
    vals, idx = numpy_helper.to_array(s.values), numpy_helper.to_array(s.indices)
    out = np.zeros(tuple(s.dims), vals.dtype)
    if idx.ndim == 2:  # (nnz, rank) coordinates
        out[tuple(idx.T)] = vals
    else:
        out.reshape(-1)[idx] = vals
    return out


# ---------------------------------------------------------------- nodes


class Node:
    """One node being evaluated: its attributes (with defaults), the opset it runs under, and its runner."""

    def __init__(self, proto: onnx.NodeProto, opset: int, runner: Runner, attrs: dict[str, Any] | None = None):
        self.proto, self.opset, self.runner = proto, opset, runner
        self.op = proto.op_type
        self.attrs = {a.name: attribute(a) for a in proto.attribute} if attrs is None else attrs
        self.env: dict[str, Any] = {}  # the scope a subgraph (If, Loop, Scan) sees

    def __getitem__(self, name: str) -> Any:
        return self.attrs[name]

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def draw(self, make: Callable[[], Tensor]) -> Tensor:
        """Random numbers `make()` draws: with a `seed` attribute from a generator of their own (the same numbers on
        every run), else from uopc's running stream. Either way uopc's Philox numbers, not NumPy's."""
        seed = self.attr("seed")
        if seed is None:
            return make()
        with Tensor.seeded(int(seed)):  # onnx's seed is a float attribute
            return make()

    def fail(self, msg: str) -> ValueError:
        """A ValueError naming this node."""
        return ValueError(f"ONNX {self.op} node {self.proto.name!r} (opset {self.opset}): {msg}")

    def host(self, v: Value) -> np.ndarray | None:
        """An input's value on the host (realizes a Tensor unless its value is already known)."""
        if v is None or isinstance(v, np.ndarray):
            return v
        if isinstance(v, Tensor):
            known = self.runner.known.get(id(v))
            return known[1] if known is not None and known[0] is v else to_numpy(v)
        return np.asarray(v)

    def ints(self, v: Value) -> list[int] | None:
        """An input (shape, axes, pads) as a list of Python ints."""
        h = self.host(v)
        return None if h is None else [int(i) for i in np.asarray(h).reshape(-1)]

    def t(self, v: Value) -> Tensor:
        """An input as a Tensor (initializers reuse the buffer made at load time)."""
        if isinstance(v, np.ndarray):
            w = self.runner.weights.get(id(v))
            if w is not None and w[0] is v:
                return w[1]
        return to_tensor(v, constant=self.runner.is_constant(v))


class Runner:
    """Evaluates graphs for one call: `weights` maps initializer arrays to their load-time buffers, `known` maps
    call inputs given as NumPy to that array (so reading a shape input never realizes it)."""

    def __init__(self, opsets: dict[str, int], weights: dict[int, tuple[np.ndarray, Tensor]], functions: dict):
        self.opsets, self.weights, self.functions = opsets, weights, functions
        self.known: dict[int, tuple[Tensor, np.ndarray]] = {}
        # host values the model states (Constant nodes, and what is folded from them and initializers alone): a
        # float32 scalar among them becomes a CONST (to_tensor)
        self.constants: dict[int, np.ndarray] = {}

    def is_constant(self, v: Value) -> bool:
        w = self.weights.get(id(v))
        return self.constants.get(id(v)) is v or (w is not None and w[0] is v)

    def run_graph(self, graph: onnx.GraphProto, env: dict[str, Value]) -> dict[str, Value]:
        """Run every node of `graph` in order on `env` (name -> value), which it extends and returns."""
        for node in graph.node:
            self.run_node(node, env)
        return env

    def run_node(self, node: onnx.NodeProto, env: dict[str, Value], attrs: dict[str, Any] | None = None) -> None:
        ins = []
        for name in node.input:
            if name and name not in env:
                raise ValueError(f"ONNX node {node.name!r} ({node.op_type}) reads {name!r}, which nothing defines")
            ins.append(env[name] if name else None)
        try:
            outs = self.call(node, ins, attrs, env)
        except (ValueError, TypeError) as e:  # say which node: a shape error deep in a Tensor op names none
            where = f"ONNX {node.op_type} node {node.name!r}"
            if type(e) not in (ValueError, TypeError) or where in str(e):
                raise
            raise type(e)(f"{where}: {e}") from e
        outs = outs if isinstance(outs, tuple) else (outs,)
        for name, v in zip(node.output, outs):
            if name:
                env[name] = v

    def call(self, node: onnx.NodeProto, ins: list[Value], attrs: dict | None = None, env: dict | None = None) -> Any:
        """The outputs of one node on input values (a tuple for several); `env` is the scope subgraphs see."""
        domain = node.domain or ""
        if (domain, node.op_type) in self.functions:
            return self.functions[(domain, node.op_type)](self, node, ins, attrs)
        opset = self.opsets.get(domain if domain not in DOMAINS else "", 1)
        n = Node(node, opset, self, attrs)
        n.env = {} if env is None else env
        fn = OPS.get(node.op_type) if domain in DOMAINS else None
        if fn is None:
            return schema_function(n, ins)
        hfn = HOST_OPS.get(node.op_type)
        if hfn is not None and (not ins or (all(_small_host(v) for v in ins) and any(v is not None for v in ins))):
            out = hfn(n, *ins)
            out = tuple(_array(v) for v in out) if isinstance(out, tuple) else _array(out)
            if all(v is None or self.is_constant(v) for v in ins):  # folded from the model's own values alone
                for v in out if isinstance(out, tuple) else (out,):
                    self.constants[id(v)] = v
            return out
        out = fn(n, *ins)
        return tuple(_array(v) for v in out) if isinstance(out, tuple) else _array(out)


def _array(v: Value) -> Value:
    """NumPy scalars (np.take of a 0-d index, reductions) as 0-d arrays: host values are always arrays."""
    return np.asarray(v) if isinstance(v, np.generic) else v


def _small_host(v: Value) -> bool:
    return v is None or (isinstance(v, np.ndarray) and v.size <= HOST_FOLD_MAX and v.dtype != BF16_NP)


# ---------------------------------------------------------------- ops defined by a function in the ONNX schema


def get_schema(op_type: str, opset: int, domain: str) -> Any:
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def type_proto(v: Value) -> onnx.TypeProto:
    """The ONNX type of a value (for the schema's context-dependent function bodies)."""
    if isinstance(v, list):
        inner = type_proto(v[0]) if v else helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None)
        return helper.make_sequence_type_proto(inner)
    if v is None:
        return onnx.TypeProto()
    if isinstance(v, Tensor):
        dt, shape = np_dtype(v.dtype), v.shape
    else:
        dt, shape = np.asarray(v).dtype, np.asarray(v).shape
    return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(dt), shape)


def schema_function(n: Node, ins: list[Value]) -> Any:
    """Run an op that uopc has no builder for through the function body its ONNX schema defines (most of them
    decompose into primitive ops: Gelu, LayerNormalization, the loss functions...)."""
    domain = n.proto.domain or ""
    attrs = dict(n.attrs)
    schema = get_schema(n.op, n.opset, domain)
    for name, a in schema.attributes.items() if schema is not None else ():  # the body may read defaults
        if name not in attrs and a.default_value.name:
            attrs[name] = attribute(a.default_value)
    body = function_body(n.proto, n.opset, ins, attrs)
    if body is None:
        raise NotImplementedError(unsupported_message(n.proto, domain, n.opset))
    return run_function(n.runner, body, n.proto, ins, attrs)


def function_body(
    node: onnx.NodeProto, opset: int, ins: list[Value] | None, attrs: dict | None = None
) -> onnx.FunctionProto | None:
    """The schema's function body for a node (context-dependent ones need input values for their types)."""
    schema = get_schema(node.op_type, opset, node.domain or "")
    if schema is None:
        return None
    f = onnx.FunctionProto()
    if schema.has_function:
        vers = [v for v in schema.function_opset_versions if v <= opset]
        f.ParseFromString(schema.get_function_with_opset_version(max(vers)) if vers else b"")
        return f if vers else None
    if schema.has_context_dependent_function:
        if ins is None:  # at load time: it exists
            return f
        # the node with its attributes resolved (inside a function body they may be references)
        full = helper.make_node(node.op_type, list(node.input), list(node.output), domain=node.domain)
        for name, v in (attrs or {}).items():
            full.attribute.extend([helper.make_attribute(name, v)])
        types = [type_proto(v).SerializeToString() for v in ins]
        vers = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
        if not vers:
            return None
        f.ParseFromString(
            schema.get_context_dependent_function_with_opset_version(max(vers), full.SerializeToString(), types)
        )
        return f
    return None


def run_function(runner: Runner, f: onnx.FunctionProto, node: onnx.NodeProto, ins: list[Value], attrs: dict) -> Any:
    """Call a FunctionProto: bind inputs and attributes (ref_attr_name) by name, run its body, return its outputs."""
    env: dict[str, Value] = {}
    for name, v in zip(f.input, ins):
        env[name] = v
    for name in f.input[len(ins) :]:
        env[name] = None
    for a in f.attribute_proto:  # defaults declared by a local function
        attrs = {a.name: attribute(a), **attrs}
    inner = Runner({**runner.opsets, **{o.domain: o.version for o in f.opset_import}}, runner.weights, runner.functions)
    inner.known, inner.constants = runner.known, runner.constants
    for fnode in f.node:
        fattrs = {}
        for a in fnode.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name in attrs:
                    fattrs[a.name] = attrs[a.ref_attr_name]
            else:
                fattrs[a.name] = attribute(a)
        inner.run_node(fnode, env, fattrs)
    outs = tuple(env.get(o) for o in f.output)
    return outs if len(outs) != 1 else outs[0]


def unsupported_message(node: onnx.NodeProto, domain: str, opset: int) -> str:
    return (
        f"uopc.onnx: operator {node.op_type!r} (domain {domain or 'ai.onnx'!r}, opset {opset}) is not supported"
        f" (node {node.name!r})"
    )

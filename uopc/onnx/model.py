"""Loading an ONNX model: checks, initializers as uopc buffers, and calling it with NumPy arrays or Tensors.

    m = uopc.onnx.load("resnet.onnx")          # checks the model, makes one buffer per initializer
    out = m(np.zeros((1, 3, 224, 224), np.float32))   # {"logits": Tensor}: every output realized in one plan
    step = m.jit()                             # TinyJit: replays the captured plan, no graph building
    step(x)["logits"].numpy()

Each call builds the graph for the call's input shapes (symbolic dims bind there; shape arithmetic runs on the host),
so the same shapes give the same graph and uopc's structural plan cache reuses the compiled plan.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

import uopc
from uopc import Tensor
from uopc.onnx import (  # noqa: F401  (each module registers its ops)
    ops_control,
    ops_elementwise,
    ops_image,
    ops_misc,
    ops_nn,
    ops_reduce,
    ops_resize,
    ops_rnn,
    ops_shape,
)
from uopc.onnx.graph import (
    DOMAINS,
    OPS,
    Runner,
    function_body,
    onnx_dtype,
    sparse_to_array,
    to_tensor,
    unsupported_message,
)

__all__ = ["OnnxModel", "load"]


def load(model: str | os.PathLike | bytes | onnx.ModelProto) -> OnnxModel:
    """An ONNX model from a file path (external data files next to it load too), serialized bytes, or a ModelProto."""
    if isinstance(model, (str, os.PathLike)):
        if not os.path.exists(model):
            raise FileNotFoundError(f"uopc.onnx.load: no such file {os.fspath(model)!r}")
        try:
            onnx.checker.check_model(os.fspath(model))  # from the path: a model over 2 GiB is checked too
            proto = onnx.load(os.fspath(model), load_external_data=True)
        except onnx.checker.ValidationError as e:
            raise ValueError(f"uopc.onnx: malformed model {os.fspath(model)!r}: {e}") from e
        except Exception as e:
            raise ValueError(f"uopc.onnx.load: cannot read {os.fspath(model)!r} as an ONNX model: {e}") from e
        return OnnxModel(proto, checked=True)
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(bytes(model))
        except Exception as e:
            raise ValueError(f"uopc.onnx.load: the bytes are not a serialized ONNX model: {e}") from e
    elif isinstance(model, onnx.ModelProto):
        proto = model
    else:
        raise TypeError(f"uopc.onnx.load takes a path, bytes or an onnx.ModelProto, got {type(model).__name__}")
    return OnnxModel(proto)


def _external(t: onnx.TensorProto) -> bool:
    return t.data_location == onnx.TensorProto.EXTERNAL


class OnnxModel:
    """A loaded ONNX model. Call it with the graph inputs (positionally or by name); it returns {output: Tensor}."""

    def __init__(self, proto: onnx.ModelProto, checked: bool = False):
        missing = [t.name for t in proto.graph.initializer if _external(t)]
        if missing:
            raise ValueError(
                f"uopc.onnx: initializers {missing[:4]} keep their data in an external file that was not loaded; "
                "load the model from its path (uopc.onnx.load('model.onnx')) with the data file next to it"
            )
        try:
            if not checked:
                onnx.checker.check_model(proto)
        except onnx.checker.ValidationError as e:
            raise ValueError(f"uopc.onnx: malformed model: {e}") from e
        if proto.functions:
            proto = onnx.inliner.inline_local_functions(proto)
        self.proto = proto
        graph = proto.graph
        self.opsets = {(o.domain if o.domain not in DOMAINS else ""): o.version for o in proto.opset_import}
        check_supported(graph, self.opsets)
        self.initializers: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for s in graph.sparse_initializer:
            self.initializers[s.values.name] = sparse_to_array(s)
        # each initializer's buffer, made once: ops that need a Tensor use it, shape arithmetic uses the array
        self.weights = {id(a): (a, to_tensor(a, constant=True)) for a in self.initializers.values() if a.size > 0}
        self.inputs = [i for i in graph.input if i.name not in self.initializers]
        self.input_names = [i.name for i in self.inputs]
        self.output_names = [o.name for o in graph.output]

    def __repr__(self) -> str:
        return f"<OnnxModel inputs={self.input_names} outputs={self.output_names} opsets={self.opsets}>"

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Run the model: inputs as NumPy arrays or Tensors, in graph-input order or by name. Returns
        {output name: Tensor} (a list of Tensors for a sequence output), all realized in one plan."""
        outs = self.lazy(*args, **kwargs)
        tensors = [v for v in outs.values() if isinstance(v, Tensor)]
        tensors += [x for v in outs.values() if isinstance(v, list) for x in v]
        Tensor.realize_all(*tensors)
        return outs

    def lazy(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The outputs as lazy Tensors (nothing realized): what __call__ realizes, and what a TinyJit captures."""
        feeds = self._bind(args, kwargs)
        runner = Runner(self.opsets, self.weights, {})
        env: dict[str, Any] = dict(self.initializers)
        for name, v in feeds.items():
            if isinstance(v, np.ndarray):
                t = to_tensor(v)
                runner.known[id(t)] = (t, v)
                v = t
            env[name] = v
        runner.run_graph(self.proto.graph, env)
        return {name: _output(env[name]) for name in self.output_names}

    def _bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """Match the call's values to the graph inputs, checking ranks, fixed dims and symbolic dims."""
        if len(args) > len(self.inputs):
            raise TypeError(f"the model takes {len(self.inputs)} inputs {self.input_names}, got {len(args)}")
        feeds = dict(zip(self.input_names, args))
        for k, v in kwargs.items():
            if k not in self.input_names:
                raise TypeError(f"the model has no input {k!r} (inputs: {self.input_names})")
            if k in feeds:
                raise TypeError(f"input {k!r} given twice")
            feeds[k] = v
        dims: dict[str, int] = {}
        for vi in self.inputs:
            if vi.name not in feeds:
                if vi.type.HasField("optional_type"):
                    feeds[vi.name] = None
                    continue
                raise TypeError(f"missing model input {vi.name!r}")
            feeds[vi.name] = _check_input(vi, feeds[vi.name], dims)
        return feeds

    def jit(self) -> Any:
        """A TinyJit of this model: call it with Tensors (positionally, graph-input order); after two calls it
        replays the captured plan with no graph building. Returns {output name: Tensor} (a list of Tensors for a
        sequence output, None for a missing optional one), as calling the model does."""
        names = self.output_names
        counts: dict[str, int | None] = {}  # per output: -1 a Tensor, n a sequence of n, None a missing optional

        def step(*xs: Tensor) -> tuple[Tensor, ...]:
            outs = self.lazy(*xs)
            flat: list[Tensor] = []
            for n in names:  # TinyJit returns Tensors: a sequence's elements go into the flat tuple, in order
                v = outs[n]
                if isinstance(v, list):
                    counts[n] = len(v)
                    flat += [to_tensor(x) for x in v]
                else:
                    counts[n] = None if v is None else -1
                    flat += [] if v is None else [to_tensor(v)]
            Tensor.realize_all(*flat)
            return tuple(flat)

        jitted = uopc.TinyJit(step)

        def call(*xs: Any) -> dict[str, Any]:
            ts = [x if isinstance(x, Tensor) else to_tensor(np.asarray(x)) for x in xs]
            flat, out, at = list(jitted(*ts)), {}, 0
            for n in names:
                k = counts[n]
                if k is None:
                    out[n] = None
                elif k < 0:
                    out[n], at = flat[at], at + 1
                else:
                    out[n], at = flat[at : at + k], at + k
            return out

        return call


def _output(v: Any) -> Any:
    if isinstance(v, list):
        return [to_tensor(x) for x in v]
    return None if v is None else to_tensor(v)


def _check_input(vi: onnx.ValueInfoProto, v: Any, dims: dict[str, int]) -> Any:
    """A call value checked against its declared type: a Tensor stays, anything else becomes a NumPy array."""
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if tt is None:
        return v  # sequences and optionals: passed as given (a list, or None)
    if not isinstance(v, Tensor):
        v = np.asarray(v)
        if v.dtype == object and tt.elem_type != onnx.TensorProto.STRING:
            v = v.astype(onnx_dtype(tt.elem_type).np)
        want = onnx_dtype(tt.elem_type).np if tt.elem_type != onnx.TensorProto.BFLOAT16 else v.dtype
        if v.dtype != want and tt.elem_type:
            raise TypeError(f"model input {vi.name!r} wants dtype {np.dtype(want).name}, got {v.dtype.name}")
    elif tt.elem_type and v.dtype is not onnx_dtype(tt.elem_type):
        raise TypeError(f"model input {vi.name!r} wants dtype {onnx_dtype(tt.elem_type)!r}, got {v.dtype!r}")
    if tt.HasField("shape"):
        shape = tuple(v.shape)
        want_dims = tt.shape.dim
        if len(want_dims) != len(shape):
            raise ValueError(f"model input {vi.name!r} wants rank {len(want_dims)}, got shape {shape}")
        for d, s in zip(want_dims, shape):
            if d.HasField("dim_value") and d.dim_value != s:
                raise ValueError(f"model input {vi.name!r}: dim {d.dim_value} expected, got shape {shape}")
            if d.HasField("dim_param") and d.dim_param:
                if dims.setdefault(d.dim_param, s) != s:
                    raise ValueError(
                        f"model input {vi.name!r}: symbolic dim {d.dim_param!r} is {dims[d.dim_param]} elsewhere, "
                        f"got {s} (shape {shape})"
                    )
    return v


def check_supported(graph: onnx.GraphProto, opsets: dict[str, int]) -> None:
    """Raise NotImplementedError for the first node (subgraphs included) uopc cannot run, naming op and node."""
    for node in graph.node:
        domain = node.domain if node.domain not in DOMAINS else ""
        opset = opsets.get(domain, 1)
        if domain != "" or node.op_type not in OPS:
            if domain not in ("", "ai.onnx.preview") or function_body(node, opset, None) is None:
                raise NotImplementedError(unsupported_message(node, domain, opset))
        for a in node.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                check_supported(g, opsets)

"""uopc as an ONNX backend (`onnx.backend.base.Backend`), so onnx's own `BackendTest` runs against it unchanged.

from uopc.onnx import backend
rep = backend.prepare(model_proto, "CPU")     # load-time checks; NotImplementedError for an unsupported op
outputs = rep.run([x])                        # NumPy arrays, in graph-output order

import onnx.backend.test
tests = onnx.backend.test.BackendTest(backend, __name__)   # ONNX's runner, pointed at uopc
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from uopc import Tensor
from uopc.onnx.graph import to_numpy
from uopc.onnx.model import OnnxModel, load

__all__ = ["UopcBackend", "UopcRep", "prepare", "run_model", "run_node", "supports_device"]


class UopcRep(BackendRep):
    """A prepared model: `run(inputs)` takes a list (graph-input order) or a dict (by name) of NumPy arrays."""

    def __init__(self, model: OnnxModel):
        self.model = model

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        if isinstance(inputs, dict):
            outs = self.model(**inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            outs = self.model(*list(inputs))
        return tuple(_numpy(outs[name]) for name in self.model.output_names)


def _numpy(v: Any) -> Any:
    if isinstance(v, list):
        return [_numpy(x) for x in v]
    return None if v is None else to_numpy(v) if isinstance(v, Tensor) else np.asarray(v)


class UopcBackend(Backend):
    """onnx.backend.base.Backend over uopc.onnx: CPU only."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> UopcRep:
        if not cls.supports_device(device):
            raise ValueError(f"uopc.onnx.backend runs on CPU, not {device!r}")
        return UopcRep(load(model))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU", outputs_info=None, **kwargs) -> tuple:
        """Run one node on inputs: a one-node model around it (default opset of this onnx)."""
        ins = []
        for name, x in zip(node.input, inputs):
            a = np.asarray(x)
            dt = onnx.helper.np_dtype_to_tensor_dtype(a.dtype)
            ins.append(onnx.helper.make_tensor_value_info(name, dt, a.shape))
        # the outputs' types from onnx's shape inference (the checker wants every graph output typed)
        probe = onnx.helper.make_model(onnx.helper.make_graph([node], "run_node", ins, []))
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(probe).graph.value_info}
        outs = [inferred[o] if o in inferred else onnx.helper.make_tensor_value_info(o, 0, None) for o in node.output]
        graph = onnx.helper.make_graph([node], "run_node", ins, outs)
        return cls.run_model(onnx.helper.make_model(graph), list(inputs), device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().startswith("CPU")


prepare = UopcBackend.prepare
run_model = UopcBackend.run_model
run_node = UopcBackend.run_node
supports_device = UopcBackend.supports_device

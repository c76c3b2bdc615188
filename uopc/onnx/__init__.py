"""uopc.onnx: ONNX models as uopc graphs (a front end: it builds Tensor ops, the engine compiles them).

    import numpy as np, uopc.onnx
    m = uopc.onnx.load("model.onnx")                # path, bytes or onnx.ModelProto; checked, weights as buffers
    out = m(np.ones((1, 3, 224, 224), np.float32))  # {output name: realized Tensor}, one plan for all outputs
    out = m(input=x)                                # by name; symbolic dims bind per call

Modules: graph.py (values, nodes, the op registry, host folding), model.py (load, OnnxModel), one op table per
concern (ops_elementwise, ops_reduce, ops_shape, ops_nn, ops_resize, ops_rnn, ops_control, ops_misc), and
backend.py (onnx.backend.base.Backend, for ONNX's own test runner). Needs the `onnx` package (`uopc[onnx]`).
"""

from uopc.onnx.model import OnnxModel, load

__all__ = ["OnnxModel", "load"]

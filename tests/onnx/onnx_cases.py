"""The ONNX conformance cases: node cases built in memory by onnx, and the model tests shipped in its wheel.

`excluded(case)` says why a case is out of scope (string types, 8-bit float and sub-byte formats, the ML and
training domains), `run_case` runs one through uopc.onnx.backend and compares like ONNX's runner.
"""

from __future__ import annotations

import functools
import glob
import os
import re
from typing import NamedTuple

import numpy as np
import onnx
from onnx import numpy_helper

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
# out of scope up front: strings, 8-bit floats and sub-byte ints, the ML and training domains
EXCLUDED_TYPES = {
    onnx.TensorProto.STRING: "string type",
    **{
        getattr(onnx.TensorProto, t): "8-bit float / sub-byte format"
        for t in (
            "FLOAT8E4M3FN",
            "FLOAT8E4M3FNUZ",
            "FLOAT8E5M2",
            "FLOAT8E5M2FNUZ",
            "FLOAT8E8M0",
            "FLOAT4E2M1",
            "INT4",
            "UINT4",
            "INT2",
            "UINT2",
        )
        if hasattr(onnx.TensorProto, t)
    },
}
EXCLUDED_DOMAINS = {"ai.onnx.ml": "ML domain", "ai.onnx.preview.training": "training domain"}
# the same by name, for cases whose types hide in attributes (Cast's `to`, string ops)
EXCLUDED_NAMES = re.compile(r"string|float8|e4m3|e5m2|e8m0|float4|_u?int4|_u?int2(?!\d)|strnorm|regex|tfidf")


class Case(NamedTuple):
    """One conformance case: a model, its (inputs, outputs) data sets, tolerances."""

    name: str
    group: str  # node, node-expanded, pytorch-converted, pytorch-operator, simple, light
    model: onnx.ModelProto | str  # a proto, or a path loaded when the case runs
    data: list | str  # [(inputs, outputs)] or a directory of test_data_set_*
    rtol: float = 1e-3
    atol: float = 1e-7


def _types_in(model: onnx.ModelProto) -> set[int]:
    found: set[int] = set()

    def vt(t: onnx.TypeProto) -> None:
        for f in ("tensor_type", "sparse_tensor_type"):
            if t.HasField(f):
                found.add(getattr(t, f).elem_type)
        if t.HasField("sequence_type"):
            vt(t.sequence_type.elem_type)
        if t.HasField("optional_type"):
            vt(t.optional_type.elem_type)

    def graph(g: onnx.GraphProto) -> None:
        for v in list(g.input) + list(g.output) + list(g.value_info):
            vt(v.type)
        found.update(t.data_type for t in g.initializer)
        for node in g.node:
            for a in node.attribute:
                if a.name in ("to", "output_dtype", "dtype") and a.type == onnx.AttributeProto.INT:
                    found.add(a.i)
                if a.type == onnx.AttributeProto.TENSOR:
                    found.add(a.t.data_type)
                if a.type == onnx.AttributeProto.GRAPH:
                    graph(a.g)

    graph(model.graph)
    return found


def excluded(name: str, model: onnx.ModelProto | None) -> str | None:
    """Why a case is out of scope, or None."""
    if EXCLUDED_NAMES.search(name):
        return "excluded by name (string / 8-bit float / sub-byte)"
    if model is None:
        return None
    for o in model.opset_import:
        if o.domain in EXCLUDED_DOMAINS:
            return EXCLUDED_DOMAINS[o.domain]
    for node in model.graph.node:
        if node.domain in EXCLUDED_DOMAINS:
            return EXCLUDED_DOMAINS[node.domain]
    hit = _types_in(model) & set(EXCLUDED_TYPES)
    return EXCLUDED_TYPES[min(hit)] if hit else None


@functools.cache
def node_cases() -> dict[str, Case]:
    """Every node case onnx builds in memory (the `_expanded` ones decompose an op into primitives)."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cs = collect_testcases()
    out = {}
    for c in cs:
        group = "node-expanded" if "_expanded" in c.name else "node"
        out[c.name] = Case(c.name, group, c.model, c.data_sets, c.rtol, c.atol)
    return out


@functools.cache
def model_cases() -> dict[str, Case]:
    """The model tests in the wheel's backend/test/data (pytorch-converted, pytorch-operator, simple, light)."""
    out = {}
    for group in ("pytorch-converted", "pytorch-operator", "simple"):
        for d in sorted(glob.glob(os.path.join(DATA, group, "test_*"))):
            name = os.path.basename(d)
            out[name] = Case(name, group, os.path.join(d, "model.onnx"), d)
    for path in sorted(glob.glob(os.path.join(DATA, "light", "light_*.onnx"))):
        name = "test_" + os.path.basename(path)[:-5]
        out[name] = Case(name, "light", path, "light")
    return out


def _load_tensor(path: str, t: onnx.TypeProto):
    """One .pb file: a tensor, a sequence or an optional, as NumPy (a list for a sequence)."""
    with open(path, "rb") as f:
        data = f.read()
    if t.HasField("sequence_type"):
        s = onnx.SequenceProto()
        s.ParseFromString(data)
        return [numpy_helper.to_array(x) for x in s.tensor_values]
    if t.HasField("optional_type"):
        o = onnx.OptionalProto()
        o.ParseFromString(data)
        return numpy_helper.to_array(o.tensor_value) if o.HasField("tensor_value") else None
    p = onnx.TensorProto()
    p.ParseFromString(data)
    return numpy_helper.to_array(p)


def data_sets(case: Case, model: onnx.ModelProto) -> list:
    """[(inputs, expected outputs)] of a case."""
    if isinstance(case.data, list):  # onnx's cases may hold TensorProtos (its runner normalizes them too)
        norm = lambda v: numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v
        return [([norm(v) for v in ins], [norm(v) for v in outs]) for ins, outs in case.data]
    inits = {i.name for i in model.graph.initializer}
    ins = [i for i in model.graph.input if i.name not in inits]
    if case.data == "light":  # ONNX's runner: inputs arange(n)/n in the declared shape, outputs shipped beside
        x = ins[0]
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in x.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        inp = (np.arange(n).reshape(shape) / n).astype(np.float32)
        out = _load_tensor(case.model[:-5] + "_output_0.pb", model.graph.output[0].type)
        return [([inp], [out])]
    sets = []
    for d in sorted(glob.glob(os.path.join(case.data, "test_data_set*"))):
        n_in = len(glob.glob(os.path.join(d, "input_*.pb")))
        n_out = len(glob.glob(os.path.join(d, "output_*.pb")))
        inputs = [_load_tensor(os.path.join(d, f"input_{i}.pb"), model.graph.input[i].type) for i in range(n_in)]
        outs = [_load_tensor(os.path.join(d, f"output_{i}.pb"), model.graph.output[i].type) for i in range(n_out)]
        sets.append((inputs, outs))
    return sets


def assert_similar(outputs: list, expected: list, rtol: float, atol: float) -> None:
    """ONNX's runner's comparison: same count, shapes and dtypes, then assert_allclose (bfloat16 as float32)."""
    assert len(outputs) == len(expected), f"{len(outputs)} outputs, expected {len(expected)}"
    for i, (out, ref) in enumerate(zip(outputs, expected)):
        if isinstance(ref, list):
            assert isinstance(out, list) and len(out) == len(ref), f"output {i}: sequence of {len(ref)} expected"
            assert_similar(out, ref, rtol, atol)
            continue
        if ref is None:
            assert out is None, f"output {i}: an empty optional expected"
            continue
        np.testing.assert_array_equal(out.shape, ref.shape, err_msg=f"output {i} has incorrect shape")
        np.testing.assert_equal(out.dtype, ref.dtype)
        r = rtol
        if out.dtype.name == "bfloat16":
            r, out, ref = max(rtol, 2**-6), out.astype(np.float32), ref.astype(np.float32)
        np.testing.assert_allclose(out, ref, rtol=r, atol=atol, err_msg=f"output {i}")


def run_case(case: Case) -> None:
    """Prepare the case's model with uopc's ONNX backend, run every data set, compare."""
    from uopc import Tensor
    from uopc.onnx import backend

    Tensor.manual_seed(0)  # random ops draw the same numbers whichever worker runs the case, after whichever others
    model = onnx.load(case.model) if isinstance(case.model, str) else case.model
    rep = backend.prepare(model, "CPU")
    for inputs, outs in data_sets(case, model):
        assert_similar(list(rep.run(inputs)), outs, case.rtol, case.atol)

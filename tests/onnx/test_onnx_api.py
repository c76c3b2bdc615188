"""uopc.onnx's own API: load from a path, bytes or a proto; calling by position or name; symbolic dims; shape
arithmetic on the host; plan reuse; TinyJit replay; external data; the errors at load and at call."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import uopc.onnx  # noqa: E402
from uopc import Tensor  # noqa: E402
from uopc.engine import realize  # noqa: E402
from uopc.onnx import backend  # noqa: E402
from uopc.onnx.graph import Runner  # noqa: E402

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _mlp(batch="batch"):
    """y = relu(x @ W + b), and z = y * 2: two outputs, a symbolic batch dim."""
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) / 10, "W")
    b = numpy_helper.from_array(np.full(4, -0.5, np.float32), "b")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["y"]),
        helper.make_node("Mul", ["y", "two"], ["z"]),
    ]
    x = helper.make_tensor_value_info("x", F, [batch, 3])
    outs = [helper.make_tensor_value_info("y", F, [batch, 4]), helper.make_tensor_value_info("z", F, [batch, 4])]
    return _model(nodes, [x], outs, [w, b, two])


def _ref(x):
    y = np.maximum(x @ (np.arange(12, dtype=np.float32).reshape(3, 4) / 10) - 0.5, 0)
    return y, y * 2


def test_load_path_bytes_proto_and_call_by_position_or_name(tmp_path):
    proto = _mlp()
    path = tmp_path / "mlp.onnx"
    onnx.save(proto, str(path))
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for src in (str(path), path, proto.SerializeToString(), proto):
        m = uopc.onnx.load(src)
        for out in (m(x), m(x=x), m(Tensor(x))):
            assert set(out) == {"y", "z"} and all(isinstance(t, Tensor) for t in out.values())
            np.testing.assert_allclose(out["y"].numpy(), _ref(x)[0], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(out["z"].numpy(), _ref(x)[1], rtol=1e-6, atol=1e-6)


def test_outputs_are_realized_in_one_plan_and_the_plan_is_reused():
    m = uopc.onnx.load(_mlp())
    x = np.ones((2, 3), np.float32)
    m(x)
    n = len(realize._plans)
    out = m(x + 1)  # same shapes, new data: the structural plan cache serves it
    assert len(realize._plans) == n
    assert "(lazy)" not in repr(out["y"]) and "(lazy)" not in repr(out["z"])
    np.testing.assert_allclose(out["z"].numpy(), _ref(x + 1)[1], rtol=1e-6)


def test_symbolic_dims_bind_per_call_and_must_agree():
    m = uopc.onnx.load(_mlp())
    for b in (1, 5):
        x = np.full((b, 3), 0.5, np.float32)
        np.testing.assert_allclose(m(x)["y"].numpy(), _ref(x)[0], rtol=1e-6)
    add = _model(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        [helper.make_tensor_value_info("a", F, ["n"]), helper.make_tensor_value_info("b", F, ["n"])],
        [helper.make_tensor_value_info("c", F, ["n"])],
    )
    with pytest.raises(ValueError, match="symbolic dim 'n'"):
        uopc.onnx.load(add)(np.ones(2, np.float32), np.ones(3, np.float32))


def test_call_errors_name_the_input():
    m = uopc.onnx.load(_mlp())
    with pytest.raises(TypeError, match="wants dtype float32"):
        m(np.ones((2, 3), np.int64))
    with pytest.raises(ValueError, match="wants rank 2"):
        m(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="dim 3 expected"):
        m(np.ones((2, 4), np.float32))
    with pytest.raises(TypeError, match="missing model input 'x'"):
        m()
    with pytest.raises(TypeError, match="no input 'q'"):
        m(q=np.ones((2, 3), np.float32))


def _shape_model():
    """Reshape(x, Concat(Gather(Shape(x), 0), [-1])): the shape arithmetic of every exported transformer."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["d0"], axis=0),
        helper.make_node("Unsqueeze", ["d0", "zero1"], ["d0u"]),
        helper.make_node("Concat", ["d0u", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "zero1"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
    ]
    x = helper.make_tensor_value_info("x", F, ["b", 2, 3])
    return _model(nodes, [x], [helper.make_tensor_value_info("y", F, ["b", 6])], inits)


def test_shape_subgraphs_are_evaluated_on_the_host():
    m = uopc.onnx.load(_shape_model())
    x = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    np.testing.assert_array_equal(m(x)["y"].numpy(), x.reshape(4, 6))
    runner = Runner(m.opsets, m.weights, {})
    env = {**m.initializers, "x": Tensor(x)}
    runner.run_graph(m.proto.graph, env)
    for name in ("s", "d0", "d0u", "shape"):  # NumPy values: nothing of the shape arithmetic is compiled
        assert isinstance(env[name], np.ndarray), name
    np.testing.assert_array_equal(env["shape"], [4, -1])
    assert isinstance(env["y"], Tensor)


def test_initializers_are_buffers_made_once():
    m = uopc.onnx.load(_mlp())
    before = {k: (v[1], v[1].uop) for k, v in m.weights.items()}
    m(np.ones((2, 3), np.float32))
    m(np.ones((3, 3), np.float32))
    assert {k: (v[1], v[1].uop) for k, v in m.weights.items()} == before


def test_jit_replays_without_building_the_graph():
    m = uopc.onnx.load(_mlp())
    builds = []
    lazy = m.lazy
    m.lazy = lambda *a, **k: builds.append(1) or lazy(*a, **k)
    step = m.jit()
    rng = np.random.default_rng(1)
    for _ in range(4):
        x = rng.standard_normal((2, 3)).astype(np.float32)
        out = step(Tensor(x))
        np.testing.assert_allclose(out["z"].numpy(), _ref(x)[1], rtol=1e-6, atol=1e-6)
    assert len(builds) == 2  # the first call runs, the second captures, later calls replay


def test_jit_returns_sequence_outputs_as_lists():
    # regression: a sequence output under .jit() raised "expected a tensor, got list"
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("SplitToSequence", ["r"], ["parts"], axis=1, keepdims=1),
    ]
    seq = helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None)
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    r_info = helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 3])
    m = uopc.onnx.load(_model(nodes, [x_info], [r_info, seq]))
    step = m.jit()
    rng = np.random.default_rng(2)
    for _ in range(3):  # run, capture, replay
        x = rng.standard_normal((2, 3)).astype(np.float32)
        out = step(Tensor(x))
        np.testing.assert_array_equal(out["r"].numpy(), np.maximum(x, 0))
        assert [p.numpy().tolist() for p in out["parts"]] == [np.maximum(x[:, i : i + 1], 0).tolist() for i in range(3)]


def test_external_data_loads_from_a_path_and_bytes_without_it_raise(tmp_path):
    proto = _mlp()
    path = tmp_path / "ext.onnx"
    onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
                    size_threshold=0)  # fmt: skip
    assert (tmp_path / "w.bin").exists()
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(uopc.onnx.load(path)(x)["y"].numpy(), _ref(x)[0], rtol=1e-6)
    with pytest.raises(ValueError, match="external"):
        uopc.onnx.load(path.read_bytes())


def test_unsupported_op_raises_at_load_naming_op_domain_opset_node():
    node = helper.make_node("Frobnicate", ["x"], ["y"], name="frob1", domain="com.example")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [2])],
                          [helper.make_tensor_value_info("y", F, [2])])  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 3)])
    with pytest.raises(NotImplementedError, match=r"'Frobnicate'.*'com.example'.*opset 3.*'frob1'"):
        uopc.onnx.load(model)


def test_malformed_model_raises_value_error():
    bad = _model([helper.make_node("Relu", ["nope"], ["y"])], [helper.make_tensor_value_info("x", F, [2])],
                 [helper.make_tensor_value_info("y", F, [2])])  # fmt: skip
    with pytest.raises(ValueError, match="malformed"):
        uopc.onnx.load(bad)
    with pytest.raises(ValueError, match="not a serialized ONNX model"):
        uopc.onnx.load(b"\x00garbage\xff")
    with pytest.raises(TypeError):
        uopc.onnx.load(3)


def _branch(name, value):
    c = helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array([value], np.float32)))
    return helper.make_graph([c], name, [], [helper.make_tensor_value_info(name, F, [1])])


def test_if_with_a_call_time_condition_and_loop_with_a_static_trip_count():
    if_node = helper.make_node("If", ["c"], ["y"], then_branch=_branch("t", 1.0), else_branch=_branch("e", -1.0))
    m = uopc.onnx.load(_model([if_node], [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", F, [1])]))  # fmt: skip
    assert m(np.array(True))["y"].numpy().tolist() == [1.0]
    assert m(np.array(False))["y"].numpy().tolist() == [-1.0]
    # Loop: v <- v * 2, M = 5 times; scan output stacks every v
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]), helper.make_node("Add", ["v", "v"], ["v2"]),
         helper.make_node("Identity", ["v2"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []), helper.make_tensor_value_info("v", F, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("v2", F, [2]),
         helper.make_tensor_value_info("scan", F, [2])],
    )  # fmt: skip
    loop = helper.make_node("Loop", ["M", "", "v0"], ["vN", "all"], body=body)
    inits = [numpy_helper.from_array(np.array(5, np.int64), "M")]
    outs = [helper.make_tensor_value_info("vN", F, [2]), helper.make_tensor_value_info("all", F, [5, 2])]
    m = uopc.onnx.load(_model([loop], [helper.make_tensor_value_info("v0", F, [2])], outs, inits))
    out = m(np.array([1.0, 3.0], np.float32))
    assert out["vN"].numpy().tolist() == [32.0, 96.0]
    assert out["all"].numpy()[:, 0].tolist() == [2.0, 4.0, 8.0, 16.0, 32.0]


def test_backend_interface():
    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")
    rep = backend.prepare(_mlp(), "CPU")
    x = np.ones((2, 3), np.float32)
    y, z = rep.run([x])
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_allclose(z, _ref(x)[1], rtol=1e-6)
    (r,) = backend.run_node(helper.make_node("Relu", ["a"], ["b"]), [np.array([-1.0, 2.0], np.float32)])
    assert r.tolist() == [0.0, 2.0]
    with pytest.raises(ValueError, match="CPU"):
        backend.prepare(_mlp(), "CUDA")


def test_random_ops_draw_in_range():
    """RandomUniformLike and Dropout in training mode run on uopc's own generator: checked by range and rate (the
    conformance cases expect NumPy's numbers, listed in onnx_xfail.py)."""
    nodes = [
        helper.make_node("RandomUniformLike", ["x"], ["u"], low=2.0, high=3.0),
        helper.make_node("Dropout", ["x", "ratio", "train"], ["y", "mask"]),
    ]
    inits = [numpy_helper.from_array(np.array(0.25, np.float32), "ratio"),
             numpy_helper.from_array(np.array(True), "train")]  # fmt: skip
    outs = [helper.make_tensor_value_info("u", F, [4096]), helper.make_tensor_value_info("y", F, [4096]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [4096])]  # fmt: skip
    m = uopc.onnx.load(_model(nodes, [helper.make_tensor_value_info("x", F, [4096])], outs, inits))
    out = m(np.ones(4096, np.float32))
    u, y, mask = out["u"].numpy(), out["y"].numpy(), out["mask"].numpy()
    assert u.min() >= 2.0 and u.max() < 3.0
    assert 0.7 < mask.mean() < 0.8  # keeps 75% (4096 draws: 5 sigma is about 0.034)
    np.testing.assert_allclose(y, np.where(mask, 1 / 0.75, 0.0), rtol=1e-6)

"""`uopc onnx run|bench` as a user runs it (a subprocess) on a small model exported from PyTorch: the printed input
and output shapes, onnxruntime's agreement, and the errors for a missing file, a bad --input and a missing onnx."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from uopc.tools import cli  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def uopc_cmd(*args: str, pre: str = "") -> subprocess.CompletedProcess:
    """`python -m uopc ARGS` (after `pre`, Python run first in the same process when given)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "uopc", *args]
    if pre:
        cmd = [sys.executable, "-c", f"{pre}\nimport sys\nfrom uopc.tools.cli import main\nsys.exit(main())", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """A conv-BN-ReLU-pool-linear model with a symbolic batch dim, input "x" (N, 3, 8, 8), output "y" (N, 5)."""
    torch.manual_seed(0)
    nn = torch.nn
    m = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(4, 5),
    ).eval()  # fmt: skip
    path = str(tmp_path_factory.mktemp("onnx") / "m.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            m, (torch.randn(2, 3, 8, 8),), path, dynamo=False, input_names=["x"], output_names=["y"],
            dynamic_axes={"x": {0: "batch"}},
        )  # fmt: skip
    return path


def test_run_prints_shapes_and_percentiles(model, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.ones((4, 3, 8, 8), np.float32))
    r = uopc_cmd("onnx", "run", model, "--runs", "3", "--dim", "batch=2")
    assert r.returncode == 0, r.stderr
    assert "input  x: float32 (2, 3, 8, 8) (random)" in r.stdout
    assert "output y: float32 (2, 5)" in r.stdout
    assert re.search(r"first call: [\d.]+ m?s", r.stdout)
    assert re.search(r"3 runs \(TinyJit replay\): p50 [\d.]+ [mu]?s +p90 [\d.]+ [mu]?s +p99 [\d.]+ [mu]?s", r.stdout)
    r = uopc_cmd("onnx", "run", model, "--runs", "1", "--input", f"x={x}")  # the file's batch 4 binds the dim
    assert r.returncode == 0, r.stderr
    assert f"input  x: float32 (4, 3, 8, 8) (from {x})" in r.stdout
    assert "output y: float32 (4, 5)" in r.stdout


def test_bench_side_by_side_with_onnxruntime(model):
    pytest.importorskip("onnxruntime")
    r = uopc_cmd("onnx", "bench", model, "--runs", "2", "--rounds", "2")
    assert r.returncode == 0, r.stderr
    diff = re.search(r"output y: float32 \(1, 5\)  max \|uopc - onnxruntime\| (\S+) \(max \|out\| (\S+)\)", r.stdout)
    assert diff, r.stdout
    assert float(diff[1]) <= 1e-5 * max(1.0, float(diff[2]))  # the same model: agreement to float rounding
    assert "2 intra-op / 1 inter-op" in r.stdout
    assert re.search(r"^uopc +[\d.]+ m?s", r.stdout, re.M) and re.search(r"^onnxruntime +[\d.]+", r.stdout, re.M)
    assert re.search(r"ratio uopc / onnxruntime \(p50\): [\d.]+", r.stdout)


@pytest.mark.parametrize(
    "args, message",
    [
        (["nope.onnx"], "uopc onnx: no such file 'nope.onnx'"),
        (["{m}", "--input", "x"], "--input wants NAME=VALUE, got 'x'"),
        (["{m}", "--input", "z=a.npy"], "--input 'z': the model has no such input (inputs: ['x'])"),
        (["{m}", "--input", "x=missing.npy"], "--input x: no such file 'missing.npy'"),
        (["{m}", "--dim", "batch=two"], "--dim 'batch=two': 'two' is not an integer"),
    ],
)
def test_bad_command_lines(model, capsys, args, message):
    assert cli.main(["onnx", "run", *[a.format(m=model) for a in args]]) == 2
    assert message in capsys.readouterr().err


def test_input_of_the_wrong_shape(model, tmp_path, capsys):
    x = tmp_path / "x.npy"
    np.save(x, np.ones((1, 3, 9, 9), np.float32))
    assert cli.main(["onnx", "run", model, "--input", f"x={x}"]) == 1
    assert "ValueError: model input 'x': dim 8 expected, got shape (1, 3, 9, 9)" in capsys.readouterr().err


def test_without_the_onnx_package(model):
    r = uopc_cmd("onnx", "run", model, pre="import sys; sys.modules['onnx'] = None  # as if not installed")
    assert r.returncode == 2
    assert "uopc onnx needs the onnx package: pip install uopc[onnx]" in r.stderr

"""ONNX's own conformance suite against uopc.onnx: every node case onnx builds in memory (`collect_testcases()`,
the `_expanded` ones included) and the model tests its wheel ships (pytorch-converted, pytorch-operator, simple,
and the nine light architectures, run by onnx's unchanged `BackendTest`), compared as onnx's runner compares.

    case -> uopc.onnx.backend.prepare(model).run(inputs) -> assert_allclose(out, expected, case.rtol, case.atol)

Out of scope up front (onnx_cases.excluded): string types, 8-bit floats and sub-byte ints, the ML and training
domains. Every other failure is listed in onnx_xfail.py with its reason, as a strict xfail: a case that starts
passing fails the suite until its entry is removed.

The module runs in the first pass of `make test` only: the second pass (UOPC_CHECK_OOB=1 OPT=0) skips it, since
it would compile every kernel again under other settings for no new coverage of the importer. Kernels are shared
between cases through uopc's plan cache and on-disk compile cache (many cases differ only in data).
"""

from __future__ import annotations

import functools
import unittest

import pytest

pytest.importorskip("onnx")

from uopc.helpers import settings  # noqa: E402

if settings().OPT == 0:
    pytest.skip("ONNX conformance runs in the OPT=1 pass of make test only", allow_module_level=True)

import onnx  # noqa: E402
import onnx.backend.test  # noqa: E402
import onnx_cases  # noqa: E402
from onnx_xfail import XFAIL  # noqa: E402

from uopc.onnx import backend  # noqa: E402


def _params(cases: dict[str, onnx_cases.Case], groups: tuple[str, ...]) -> list:
    out = []
    for name, case in cases.items():
        if case.group not in groups:
            continue
        model = onnx.load(case.model) if isinstance(case.model, str) else case.model
        if onnx_cases.excluded(name, model):
            continue
        marks = [pytest.mark.xfail(reason=XFAIL[name], strict=True)] if name in XFAIL else []
        out.append(pytest.param(case, id=name, marks=marks))
    return out


NODE = _params(onnx_cases.node_cases(), ("node", "node-expanded"))
MODELS = _params(onnx_cases.model_cases(), ("pytorch-converted", "pytorch-operator", "simple"))
LIGHT = _params(onnx_cases.model_cases(), ("light",))


@pytest.mark.parametrize("case", NODE)
def test_node(case: onnx_cases.Case):
    onnx_cases.run_case(case)


@pytest.mark.parametrize("case", MODELS)
def test_model(case: onnx_cases.Case):
    onnx_cases.run_case(case)


@functools.cache
def _onnx_runner_light_tests() -> type:
    """onnx's BackendTest over uopc's backend, its light models included (built once per test process)."""
    bt = onnx.backend.test.BackendTest(backend, __name__)
    bt.include("|".join("^" + p.id.replace("test_light_", "test_") + "_cpu$" for p in LIGHT))
    return bt.test_cases["OnnxBackendRealModelTest"]


@pytest.mark.parametrize("case", LIGHT)
def test_light_with_onnx_runner(case: onnx_cases.Case, tmp_path, monkeypatch, context):
    """onnx's BackendTest, unchanged, on one light model: inputs arange(n)/n, the shipped output file. Their weights
    are constant fills (coverage, not numerics), so they run with OPT=0: measured, vgg19 compiles and runs in 10 s
    there against 20 s at OPT=1 (the node cases cover the optimizer)."""
    monkeypatch.setenv("ONNX_HOME", str(tmp_path))  # the runner writes its test data set under here
    monkeypatch.delenv("ONNX_MODELS", raising=False)
    context(OPT=0)
    tests = _onnx_runner_light_tests()
    result = unittest.TestResult()
    tests(case.name.replace("test_light_", "test_") + "_cpu").run(result)
    assert result.testsRun == 1 and not result.skipped, f"onnx's runner did not run {case.name}"
    problems = result.failures + result.errors
    assert not problems, problems[0][1]


def test_pass_rate_of_node_cases():
    """At least 97% of the node cases in scope pass (the xfail list is strict, so this counts passes)."""
    failing = [p for p in NODE if p.marks]
    assert len(NODE) > 1500
    assert len(failing) / len(NODE) <= 0.03, f"{len(failing)} of {len(NODE)} node cases are expected to fail"


def test_every_xfail_entry_names_a_case():
    known = {p.id for p in NODE + MODELS + LIGHT}
    stale = sorted(set(XFAIL) - known)
    assert not stale, f"onnx_xfail.py lists cases that are not run: {stale}"

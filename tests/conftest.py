"""Test-session setup: keep compiled kernels out of the user's cache; the `context` fixture for settings; the
`single_pass` marker on the tests make test runs in its first pass only.

UOPC_CACHE is set (unless the caller already set it) at import time, before any test imports uopc, to a temporary
directory created for this session and removed when the session ends.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile

import pytest

if not os.environ.get("UOPC_CACHE"):
    _session_cache = tempfile.mkdtemp(prefix="uopc-test-cache-")
    os.environ.pop("UOPC_CACHE", None)  # an empty value would mean the default, ~/.cache/uopc
    os.environ.setdefault("UOPC_CACHE", _session_cache)
    atexit.register(shutil.rmtree, _session_cache, True)


@pytest.fixture
def context():
    """Settings for the rest of one test, through uopc's one door: `context(OPT=0)` enters helpers.Context."""
    from uopc.helpers import Context

    with contextlib.ExitStack() as stack:
        yield lambda **kw: stack.enter_context(Context(**kw))


def pytest_addoption(parser):
    parser.addoption(
        "--sweep-dtypes",
        default="",
        help="comma-separated input dtypes (f16,bf16,...): the torch sweep builds only the cases that take one",
    )


# Tests that make test's second pass (OPT=0 with every index checked, -m "not single_pass") skips, as a path or a
# path::test prefix of the test's id. Each either runs exactly what the first pass ran or compiles no kernel form that
# the second pass's own tests do not:
SINGLE_PASS = (
    # tooling, caches, keys and processes rather than the code uopc generates
    "tests/tools/",
    "tests/backend/test_distributed.py",
    "tests/backend/test_plan_store.py",
    "tests/backend/test_runtime.py::test_concurrent_processes_share_cache",
    "tests/unit/test_machine.py::test_repr_is_the_same_in_every_process",
    "tests/schedule/test_kernelize.py::test_plan_cache_is_bounded",
    "tests/schedule/test_kernelize.py::test_plan_cache_stays_bounded_over_3000_shapes",
    "tests/schedule/test_training_plan.py::test_no_plan_or_compile_after_step_two",
    "tests/backend/test_runtime.py::test_two_processes_compiling_one_plan_at_once",
    "tests/backend/test_symbolic_shapes.py::test_a_plan_store_entry_serves_another_process_and_value",
    # the IR alone (UOps, rewrites, the simplifier, dtypes, imports, API names): no kernel runs
    "tests/unit/test_uop.py",
    "tests/unit/test_rewrite.py",
    "tests/unit/test_symbolic.py",
    "tests/unit/test_dtype.py",
    "tests/unit/test_imports.py",
    "tests/unit/test_api_coverage.py",
    # whole models against transformers and torch.onnx exports: the importers and loaders, as the ONNX conformance
    # suite (which skips itself at OPT=0). Their kernels (products, bfloat16 weights, attention, the KV cache's
    # in-place decode, convolutions, norms, pools) are the second pass's in test_gemm, test_half, test_kv_cache,
    # test_conv, test_onnx_facing_ops and the torch sweep
    "tests/models/",
    "tests/onnx/test_onnx_torch_models.py",
    # training loops and JIT replay end to end: their kernels are the ops' own (replay runs the kernels it captured)
    "tests/backend/test_jit.py",
    "tests/backend/test_nn.py::test_mlp_learns_mnist_subset",
    "tests/backend/test_nn.py::test_training_reduces_loss",
    "tests/backend/test_threads.py::test_threads_train_two_models",
    # one op at a time on small contiguous inputs against a reference: the torch sweep's row for each op compiles
    # the same kernels and more (contiguous, non-contiguous, 0-d, size-0 and broadcast inputs, forward and gradient);
    # the finite differences' cases (the same graphs re-run per element) run against torch in test_grad_matches_torch
    "tests/backend/test_api_ops.py::test_forward_and_grad[",
    "tests/backend/test_tensor_ops.py::test_unary[",
    "tests/backend/test_autodiff.py::test_grad_matches_finite_differences[",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SINGLE_PASS):
            item.add_marker(pytest.mark.single_pass)

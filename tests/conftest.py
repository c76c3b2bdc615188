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


# Tests of tooling, caches, keys and processes rather than of the code uopc generates: make test's second pass
# (OPT=0 with every index checked) would run exactly what its first pass ran, so it skips them (-m "not single_pass")
SINGLE_PASS = ("tests/tools/", "tests/backend/test_distributed.py", "tests/backend/test_plan_store.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.nodeid.split("::")[0]
        if path.startswith(SINGLE_PASS):
            item.add_marker(pytest.mark.single_pass)

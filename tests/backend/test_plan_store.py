"""Plans persisted across processes (uopc.engine.plan_store): a warm process reads the plan instead of scheduling and
lowering it; changing the structure, a code setting, the Machine, the compiler or uopc itself invalidates the entry;
a damaged entry is rebuilt. Reference: NumPy (float64 softmax of a product, rtol 1e-5)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from uopc import helpers
from uopc.engine import lower as lowering
from uopc.engine import plan_store, realize
from uopc.runtime import compiler as runtime
from uopc.tensor import Tensor
from uopc.uop import structure_key

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import json, numpy as np
    from uopc.engine import lower as lowering
    from uopc.tensor import Tensor
    x = Tensor(np.arange(96, dtype=np.float32).reshape(8, 12) / 50)
    w = Tensor(np.linspace(-1, 1, 12 * 5, dtype=np.float32).reshape(12, 5))
    y = ((x @ w) * 3.0).softmax(-1).numpy()
    print(json.dumps({"lowered": lowering.lowered_stats["misses"], "y": y.tolist()}))
""")


def _child(cache: Path, **env: str) -> dict:
    import json

    e = {**os.environ, "PYTHONPATH": str(ROOT), "UOPC_CACHE": str(cache), **env}
    p = subprocess.run([sys.executable, "-c", CHILD], env=e, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def _reference() -> np.ndarray:
    x = np.arange(96, dtype=np.float64).reshape(8, 12) / 50
    w = np.linspace(-1, 1, 60, dtype=np.float32).reshape(12, 5).astype(np.float64)
    z = (x @ w) * 3
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_a_second_process_reads_the_plan_instead_of_lowering_it(tmp_path: Path):
    first = _child(tmp_path / "c")
    second = _child(tmp_path / "c")
    assert first["lowered"] > 0 and second["lowered"] == 0
    np.testing.assert_allclose(second["y"], _reference(), rtol=1e-5, atol=1e-7)
    assert first["y"] == second["y"]
    # another code setting is another entry: lowered again (and stored, so a third process reads it)
    flip = "0" if helpers.settings().CHECK_OOB else "1"  # the other value than this run's (make test runs both)
    assert _child(tmp_path / "c", UOPC_CHECK_OOB=flip)["lowered"] > 0
    assert _child(tmp_path / "c", UOPC_CHECK_OOB=flip)["lowered"] == 0


def _digest(x: Tensor) -> str:
    s = helpers.settings()
    key = realize.plan_key(structure_key([x.uop])[0], False, realize.default_opt(), s, runtime.machine())
    return plan_store.digest(key, runtime.compiler_identity())


@pytest.mark.parametrize("change", ["structure", "check_oob", "machine", "compiler_version", "uopc_version"])
def test_every_input_of_the_digest_invalidates_the_entry(change: str, context, monkeypatch):
    x = Tensor(np.ones((4, 4), np.float32))
    base = _digest(x * 2.0)
    if change == "structure":
        assert _digest(x * 3.0) != base  # a Python float is structure
        return
    if change == "check_oob":
        context(CHECK_OOB=0 if helpers.settings().CHECK_OOB else 1)
    elif change == "machine":
        context(CFLAGS=[*runtime.base_cflags(), "-march=x86-64-v3"])
    elif change == "compiler_version":
        cc = runtime._resolve_compiler()
        monkeypatch.setitem(runtime._version_cache, cc, runtime._compiler_version(cc) + " (patched)")
    else:
        plan_store.uopc_version.cache_clear()
        monkeypatch.setattr(plan_store, "uopc_version", lambda: "another uopc")
    assert _digest(x * 2.0) != base


def test_uopc_version_covers_every_module_of_the_package(tmp_path: Path):
    """A change to any of uopc's modules (the optimizer's, not only the engine's) is a new uopc version: it digested
    uopc/engine alone, so a new GEMM tile rule kept running plans stored with the old one."""
    import shutil

    import uopc

    pkg = os.path.dirname(os.path.abspath(uopc.__file__))
    assert plan_store.uopc_version() == plan_store.source_digest(pkg)
    copy = tmp_path / "uopc"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__"))
    base = plan_store.source_digest(str(copy))
    for rel in ("opt/gemm.py", "codegen/vectorize.py", "tensor/tensor.py"):
        with open(copy / rel, "a") as f:
            f.write("\n# changed\n")
        assert plan_store.source_digest(str(copy)) != base, rel
        base = plan_store.source_digest(str(copy))


def test_a_damaged_entry_is_rebuilt(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("UOPC_CACHE", str(tmp_path / "c"))
    g = np.random.default_rng(1).standard_normal((7, 9)).astype(np.float32)
    got = (Tensor(g) * 1.5).exp2().numpy()  # built and stored
    (entry,) = (tmp_path / "c" / "plans").glob("*.plan")
    entry.write_bytes(entry.read_bytes()[:40])  # truncated
    realize._plans.clear()
    lowering.clear_lowered()
    before = lowering.lowered_stats["misses"]
    again = (Tensor(g) * 1.5).exp2().numpy()
    assert lowering.lowered_stats["misses"] > before  # rebuilt, not read
    np.testing.assert_array_equal(got, again)
    np.testing.assert_allclose(again, np.exp2(g.astype(np.float64) * 1.5), rtol=1e-6)
    assert len(list((tmp_path / "c" / "plans").glob("*.plan"))) == 1


def test_storing_plans_does_not_scan_the_folder_each_time(tmp_path: Path, monkeypatch):
    """The plans folder's cap is kept by a scan of every entry; storing a plan runs it only once a share of the cap
    was written since the last one (uopc.runtime.disk_cache.SCAN_SHARE), not once per plan: at make test's 6,000
    plans a scan took 30 ms."""
    monkeypatch.setenv("UOPC_CACHE", str(tmp_path / "c"))
    folder = str(tmp_path / "c" / "plans")
    scans: list[str] = []
    real = os.scandir
    monkeypatch.setattr(plan_store.os, "scandir", lambda p: scans.append(str(p)) or real(p))
    g = np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32)
    for k in range(1, 6):
        got = (Tensor(g) * float(k)).exp2().numpy()  # a Python float is structure: a plan each
        np.testing.assert_allclose(got, np.exp2(g.astype(np.float64) * k), rtol=1e-6)
    assert scans.count(folder) <= 1  # (pathlib's glob below scans too)
    assert len(list((tmp_path / "c" / "plans").glob("*.plan"))) == 5

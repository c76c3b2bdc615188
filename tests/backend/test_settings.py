"""Settings cannot crash or mislead a plan: a snapshot per realize, per thread; plans record what they were built with;
DEBUG=3 never runs an in-place update twice; a forked child realizes after its parent did.

References: NumPy, and the same steps run at the default settings (bit for bit).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from uopc import TinyJit, helpers
from uopc.engine import realize
from uopc.helpers import Context
from uopc.nn import SGD, Linear, parameters
from uopc.runtime import buffer
from uopc.runtime import compiler as runtime
from uopc.tensor import Tensor
from uopc.uop import structure_key, uop

ROOT = Path(__file__).resolve().parents[2]


def test_context_in_one_thread_changes_nothing_in_another():
    inside, seen = threading.Event(), threading.Event()
    got: dict[str, int] = {}

    def worker():
        with Context(CHECK_OOB=1, OPT=0):
            got["worker"] = helpers.settings().CHECK_OOB
            inside.set()
            seen.wait(10)

    t = threading.Thread(target=worker)
    t.start()
    inside.wait(10)
    got["main"] = helpers.settings().CHECK_OOB  # while the worker is inside its Context
    got["main_opt"] = helpers.settings().OPT
    seen.set()
    t.join()
    assert got == {"worker": 1, "main": helpers._ENV_SETTINGS.CHECK_OOB, "main_opt": helpers._ENV_SETTINGS.OPT}


def test_context_restores_and_rejects_unknown_names():
    before = helpers.settings()
    with Context(DEBUG=0, CFLAGS="-O2 -fopenmp") as s:
        assert s.CFLAGS == ("-O2", "-fopenmp") and runtime.base_cflags() == ["-O2", "-fopenmp"]
    assert helpers.settings() is before
    with pytest.raises(ValueError, match="unknown setting"):
        with Context(CHECK_OBB=1):
            pass


def _key_of(t: Tensor) -> tuple:
    s = helpers.settings()
    return realize.plan_key(structure_key([t.uop])[0], False, realize.default_opt(s), s, runtime.machine())


def test_plan_key_holds_the_code_settings():
    x = np.arange(12, dtype=np.float32)
    y = Tensor(x) * 3.0 + 1.0
    k0 = _key_of(y)
    a = y.numpy()
    flip = 0 if helpers.settings().CHECK_OOB else 1  # the other value than this run's (make test runs both)
    with Context(CHECK_OOB=flip):
        y = Tensor(x) * 3.0 + 1.0
        k1 = _key_of(y)
        b = y.numpy()
    np.testing.assert_array_equal(a, x * 3 + 1)
    np.testing.assert_array_equal(b, x * 3 + 1)
    assert k0 != k1, "the plan with index checks must be its own entry"
    assert realize._plans[k0].check_oob is (not flip) and realize._plans[k1].check_oob is bool(flip)


def test_jit_captured_with_index_checks_replays_outside_them():
    # regression: the plan's entry point reads its error record, but the replay passed one only when CHECK_OOB
    # was set at the time of the call: a segfault. Run in a child so that a crash fails this test, not the suite.
    code = textwrap.dedent("""
        import numpy as np
        from uopc import TinyJit
        from uopc.helpers import Context
        from uopc.tensor import Tensor

        def f(x, i):
            return (x * 2.0)[i].sum(1)

        jf = TinyJit(f)
        x = np.arange(20, dtype=np.float32).reshape(5, 4)
        with Context(CHECK_OOB=1):
            for _ in range(2):  # call 1 runs, call 2 captures
                jf(Tensor(x), Tensor(np.array([0, 3], np.int32))).numpy()
        for i in ([4, 1], [2, 2]):
            got = jf(Tensor(x), Tensor(np.array(i, np.int32))).numpy()
            assert np.array_equal(got, (x * 2)[i].sum(1)), (got, i)
        try:  # the plan was built with its checks: replayed outside the Context it still checks
            jf(Tensor(x), Tensor(np.array([0, 9], np.int32))).numpy()
        except IndexError as e:
            print("IndexError", e)
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    assert "IndexError" in out.stdout and out.stdout.strip().endswith("ok"), out.stdout


def _sgd_steps(n_plain: int, n_debug3: int) -> list[np.ndarray]:
    Tensor.manual_seed(0)
    lin = Linear(8, 4)
    opt = SGD(parameters([lin]), lr=0.5)

    def step(x: Tensor, y: Tensor) -> Tensor:
        loss = ((lin(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward(opt.params)
        opt.step(loss)
        return loss

    jstep = TinyJit(step)
    g = np.random.default_rng(0)
    data = [(g.standard_normal((16, 8)).astype(np.float32), g.standard_normal((16, 4)).astype(np.float32))] * 5
    for i, (x, y) in enumerate(data[: n_plain + n_debug3]):
        with Context(DEBUG=3 if i >= n_plain else 0):
            jstep(Tensor(x), Tensor(y)).numpy()
    return [p.numpy() for p in parameters([lin])]


def test_debug3_never_reruns_an_in_place_update(capsys):
    # regression: DEBUG=3's warm re-run of each kernel re-ran the jit's in-place optimizer update, so five SGD
    # steps, the last two at DEBUG=3, moved the weights by 0.02 from the same steps at DEBUG=0
    ref = _sgd_steps(5, 0)
    got = _sgd_steps(3, 2)
    capsys.readouterr()
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_forked_child_realizes_while_another_thread_held_every_lock():
    # regression: after fork() the hash-consing lock, the plan cache's lock and the pool's lock were not made anew:
    # one held by another thread at fork time stays held in the child, which then hangs on its first realize
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    (Tensor(np.ones(64, np.float32)) + 1).numpy()  # the parent has realized (and run OpenMP regions)
    held, release = threading.Event(), threading.Event()
    locks = [uop._cache_lock, realize._plans_lock, buffer._attach_lock, buffer.pool._lock, helpers._recursion_lock]

    def hold():
        for lk in locks:
            lk.acquire()
        held.set()
        release.wait(30)
        for lk in reversed(locks):
            lk.release()

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: a new graph, a new plan, a pool allocation
            code = 1
            try:
                import warnings

                warnings.simplefilter("ignore")
                got = (Tensor(np.arange(6, dtype=np.float32)) * 5.0 - 1.0).sum().numpy()
                code = 0 if got == 69.0 else 2
            finally:
                os._exit(code)
        deadline = 60
        for _ in range(deadline * 20):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            threading.Event().wait(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on its first realize")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        t.join()

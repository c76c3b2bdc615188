"""Tests for uopc.runtime.compiler: compiling, the on-disk kernel cache, argument checks and OpenMP threads."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from uopc import helpers
from uopc.engine import lower as lowering
from uopc.engine import realize
from uopc.renderer.flags import (
    CFLAGS_LINE,
    NO_PEELING,
    PANEL_TRANSFORM,
    SHORT_PEELING,
    WEIGHT_TRANSFORM,
    unit_cflags,
)
from uopc.runtime import compiler as runtime
from uopc.runtime.compiler import CacheDirError, CompileError, CompilerNotFoundError, Program
from uopc.tensor import Tensor
from uopc.uop import Ops

ROOT = Path(__file__).resolve().parents[2]

ADD = (
    "void add(float* restrict a, float* restrict b, float* restrict c) "
    "{ for (int i = 0; i < 16; i++) c[i] = a[i] + b[i]; }"
)

# Elementwise (no reduction), so the thread count cannot change any result bit; also reports the team size.
N_PAR = 1 << 16
PAR = textwrap.dedent(f"""
    #include <omp.h>
    void par(const float* restrict a, float* restrict out, int* restrict nt) {{
      #pragma omp parallel for
      for (int i = 0; i < {N_PAR}; i++) out[i] = a[i] * 1.5f + a[i] * a[i] - 0.25f;
      #pragma omp parallel
      {{
        #pragma omp single
        nt[0] = omp_get_num_threads();
      }}
    }}
""")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh cache directory per test, with the in-process cache emptied so nothing leaks between tests."""
    path = tmp_path / "cache"
    monkeypatch.setenv("UOPC_CACHE", str(path))
    runtime._clear_memory_cache()
    return path


@pytest.fixture
def threads():
    """Restore the thread count a test changes."""
    before = runtime.get_num_threads()
    yield
    runtime.set_num_threads(before)


def run_add(prg: Program) -> None:
    a = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(16).astype(np.float32)
    c = np.zeros(16, np.float32)
    prg(a, b, c)
    np.testing.assert_array_equal(c, a + b)  # a single float add is exact either way


def run_par(prg: Program) -> tuple[np.ndarray, int]:
    a = np.linspace(-3, 3, N_PAR, dtype=np.float32)
    out, nt = np.zeros(N_PAR, np.float32), np.zeros(1, np.int32)
    prg(a, out, nt)
    return out, int(nt[0])


def entry_files(cache: Path) -> tuple[list[Path], list[Path], list[Path]]:
    return sorted(cache.glob("*.so")), sorted(cache.glob("*.json")), sorted(cache.glob(".tmp-*"))


# ---------------------------------------------------------------------------------------------------------------
# compiling and the cache


def test_add_matches_numpy(cache: Path):
    prg = Program(ADD, "add")
    run_add(prg)
    assert prg.src == ADD and prg.name == "add"
    assert Path(prg.lib_path).parent == cache and prg.lib_path.endswith(".so")


def test_same_source_compiles_once(cache: Path):
    before = dict(runtime.stats)
    p1, p2 = Program(ADD, "add"), Program(ADD, "add")
    assert runtime.stats["compiles"] == before["compiles"] + 1
    assert runtime.stats["loads"] == before["loads"] + 1
    assert p1.lib_path == p2.lib_path
    run_add(p2)
    # a new process (simulated by forgetting loaded libraries) finds it on disk: a load, no compile
    runtime._clear_memory_cache()
    run_add(Program(ADD, "add"))
    assert runtime.stats["compiles"] == before["compiles"] + 1
    assert runtime.stats["loads"] == before["loads"] + 2
    so, js, tmp = entry_files(cache)
    assert len(so) == 1 and len(js) == 1 and not tmp


LIBM = """
void sines(float* a, float* out) { for (int i = 0; i < 16; i++) out[i] = __builtin_sinf(a[i] * 7.0f); }
"""


def test_libm_links_only_where_the_process_lacks_it(monkeypatch: pytest.MonkeyPatch):
    # CPython has libm in its global scope, where a kernel's sinf resolves at load: the link skips reading it
    runtime._link_libs.cache_clear()
    assert "-lm" not in runtime._link_libs()
    a = np.linspace(-3, 3, 16, dtype=np.float32)
    out = np.zeros(16, np.float32)
    Program(LIBM, "sines")(a, out)
    np.testing.assert_allclose(out, np.sin(a * np.float32(7)), rtol=1e-6, atol=1e-6)

    class NoGlobals:  # a process whose global scope has no libm (its dlsym finds nothing)
        def __init__(self, name):
            pass

        def __getattr__(self, name):
            raise AttributeError(name)

    monkeypatch.setattr(runtime.ctypes, "CDLL", NoGlobals)
    runtime._link_libs.cache_clear()
    try:
        assert runtime._link_libs()[-1] == "-lm"
    finally:
        monkeypatch.undo()
        runtime._link_libs.cache_clear()


def test_two_functions_one_compile():
    src = "void f(int* a) { a[0] = 1; }\nvoid g(int* a) { a[0] = 2; }"
    before = runtime.stats["compiles"]
    f, g = Program(src, "f"), Program(src, "g")
    assert runtime.stats["compiles"] == before + 1
    x = np.zeros(1, np.int32)
    f(x)
    assert x[0] == 1
    g(x)
    assert x[0] == 2
    with pytest.raises(AttributeError, match="nope"):
        Program(src, "nope")


def test_json_records_size_and_hash():
    path = Path(Program(ADD, "add").lib_path)
    meta = json.loads(path.with_suffix(".json").read_text())
    data = path.read_bytes()
    assert meta == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_key_depends_on_flags_and_source(cache: Path, context):
    base = Program(ADD, "add").lib_path
    assert Program(ADD, "add").lib_path == base
    other_src = Program(ADD + "\n", "add").lib_path
    context(CFLAGS=[*runtime.base_cflags(), "-DUOPC_TEST_FLAG=1"])
    other_flags = Program(ADD, "add")
    run_add(other_flags)
    assert len({base, other_src, other_flags.lib_path}) == 3
    assert len(entry_files(cache)[0]) == 3


def test_compile_error_reports_gcc_and_saves_source(cache: Path):
    bad = "void bad(float* a) { a[0] = undefined_thing; }"
    with pytest.raises(CompileError) as info:
        Program(bad, "bad")
    err = info.value
    assert "undefined_thing" in str(err) and "undeclared" in str(err)  # gcc's own text
    assert "undeclared" in err.stderr and err.src == bad
    assert err.c_path and Path(err.c_path).read_text() == bad
    assert Path(err.c_path).parent == cache / "failed" and err.c_path in str(err)
    assert isinstance(err.cmd, list) and err.cmd[0] == os.path.abspath(shutil.which(helpers.settings().CC))
    assert "-shared" in err.cmd and "-fPIC" in err.cmd
    so, js, tmp = entry_files(cache)
    assert not so and not js and not tmp


def corrupt_truncate(so: Path, js: Path) -> None:
    so.write_bytes(so.read_bytes()[: so.stat().st_size // 2])


def corrupt_empty(so: Path, js: Path) -> None:
    so.write_bytes(b"")


def corrupt_flip_byte(so: Path, js: Path) -> None:
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, so only the hash can catch it
    so.write_bytes(bytes(data))


def corrupt_missing_json(so: Path, js: Path) -> None:
    js.unlink()


def corrupt_garbled_json(so: Path, js: Path) -> None:
    js.write_text('{"size": 12, "sha2')


def corrupt_wrong_json(so: Path, js: Path) -> None:
    js.write_text(json.dumps({"size": so.stat().st_size, "sha256": "0" * 64}))


def corrupt_missing_so(so: Path, js: Path) -> None:
    so.unlink()


@pytest.mark.parametrize(
    "corrupt",
    [
        corrupt_truncate,
        corrupt_empty,
        corrupt_flip_byte,
        corrupt_missing_json,
        corrupt_garbled_json,
        corrupt_wrong_json,
        corrupt_missing_so,
    ],
)
def test_bad_entry_is_rebuilt(cache: Path, corrupt):
    # Build without loading: a file dlopened in this process must not be rewritten in place (it is mapped).
    so = Path(runtime._build(ADD))
    js = so.with_suffix(".json")
    good = so.read_bytes()
    corrupt(so, js)
    before = dict(runtime.stats)
    prg = Program(ADD, "add")  # no exception: the entry is silently recompiled
    run_add(prg)
    assert runtime.stats["compiles"] == before["compiles"] + 1
    assert runtime.stats["rebuilds"] == before["rebuilds"] + 1
    assert so.read_bytes() == good  # gcc output is deterministic
    assert json.loads(js.read_text())["sha256"] == hashlib.sha256(good).hexdigest()
    files, jsons, tmp = entry_files(cache)
    assert files == [so] and jsons == [js] and not tmp


# ---------------------------------------------------------------------------------------------------------------
# the cache directory


def test_cache_dir_created_0700(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "deep" / "er" / "cache"
    monkeypatch.setenv("UOPC_CACHE", str(path))
    old = os.umask(0)  # even with a permissive umask
    try:
        run_add(Program(ADD, "add"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_existing_private_dir_is_accepted(cache: Path):
    cache.mkdir(mode=0o755)
    os.chmod(cache, 0o755)  # readable by others is fine; only writable is not
    run_add(Program(ADD, "add"))
    assert stat.S_IMODE(cache.stat().st_mode) == 0o755  # we never change a directory we did not create


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_writable_by_others_dir_refused(cache: Path, mode: int):
    cache.mkdir()
    os.chmod(cache, mode)
    with pytest.raises(CacheDirError) as info:
        Program(ADD, "add")
    assert isinstance(info.value, PermissionError)
    assert str(cache) in str(info.value) and f"chmod 700 {cache}" in str(info.value)
    assert info.value.path == str(cache)
    assert not list(cache.iterdir())  # nothing was written into it
    # a refusal is not remembered: fixing the directory is enough
    os.chmod(cache, 0o700)
    run_add(Program(ADD, "add"))


def test_symlinked_dir_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("UOPC_CACHE", str(link))
    with pytest.raises(CacheDirError, match="symlink") as info:
        Program(ADD, "add")
    assert str(link) in str(info.value) and "UOPC_CACHE" in str(info.value)
    assert not list(real.iterdir())


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_dir_owned_by_other_user_refused(cache: Path):
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, 65534)
    with pytest.raises(CacheDirError, match="owned by uid 65534") as info:
        Program(ADD, "add")
    assert str(cache) in str(info.value)


def test_cache_dir_removed_while_running(cache: Path):
    run_add(Program(ADD, "add"))
    shutil.rmtree(cache)
    runtime._libs.clear()  # keep the directory verdict, lose the loaded library
    run_add(Program(ADD, "add"))
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700 and len(entry_files(cache)[0]) == 1


# ---------------------------------------------------------------------------------------------------------------
# the compiler


def test_missing_compiler(context, monkeypatch: pytest.MonkeyPatch):
    context(CC="/nonexistent/gcc")
    with pytest.raises(CompilerNotFoundError) as info:
        Program(ADD, "add")
    msg = str(info.value)
    assert "/nonexistent/gcc" in msg and "CC" in msg and "CFLAGS" in msg and "apt-get install gcc" in msg
    context(CC="uopc-no-such-compiler")
    with pytest.raises(CompilerNotFoundError, match="uopc-no-such-compiler.*on PATH"):
        Program(ADD, "add")


def test_compiler_that_cannot_run(context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fake = tmp_path / "fakecc"
    fake.write_text("#!/nonexistent/interpreter\n")
    fake.chmod(0o755)
    context(CC=str(fake))
    with pytest.raises(CompilerNotFoundError, match="could not be executed"):
        Program(ADD, "add")


def test_env_settings_read_at_import_and_error_at_first_compile(tmp_path: Path):
    # CFLAGS replaces the defaults entirely; a bad CC only fails when something is compiled, not at import.
    code = textwrap.dedent(f"""
        from uopc.runtime import compiler as runtime
        print(runtime.base_cflags())
        try:
            runtime.Program({ADD!r}, "add")
        except runtime.CompilerNotFoundError:
            print("not found")
    """)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CFLAGS": "-O1  -fopenmp",
        "CC": "/nonexistent/gcc",
        "UOPC_CACHE": str(tmp_path / "c"),
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["['-O1', '-fopenmp']", "not found"]


def test_default_cflags():
    if helpers.settings().CFLAGS is not None:
        pytest.skip("CFLAGS is set in the environment")
    flags = runtime.base_cflags()
    assert flags[0] == "-O3" and "-fopenmp" in flags and "-ffast-math" not in flags


# ---------------------------------------------------------------------------------------------------------------
# arguments


def test_arguments_must_be_contiguous_arrays():
    prg = Program(ADD, "add")
    a, b, c = (np.zeros(16, np.float32) for _ in range(3))
    with pytest.raises(TypeError, match="argument 1 .*C-contiguous"):
        prg(a, np.zeros(32, np.float32)[::2], c)
    with pytest.raises(TypeError, match="argument 0 .*C-contiguous"):
        prg(np.asfortranarray(np.zeros((4, 4), np.float32)), b, c)
    with pytest.raises(TypeError, match="argument 2 .*ndarray.*list"):
        prg(a, b, [0.0] * 16)
    with pytest.raises(TypeError, match="argument 0 .*ndarray"):
        prg(np.float32(1), b, c)
    ro = np.ones(16, np.float32)
    ro.flags.writeable = False  # read-only inputs are fine
    prg(ro, b, c)
    assert (c == 1).all()


# ---------------------------------------------------------------------------------------------------------------
# several processes sharing one cache

WORKER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from uopc.runtime.compiler import Program
    ready, go, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3])
    open(ready, "w").close()
    deadline = time.time() + 60
    while not os.path.exists(go):  # start compiling together with the other workers
        assert time.time() < deadline, "never got the go signal"
        time.sleep(0.002)
    for k in range(3):
        src = ("void k(float* restrict a, float* restrict out) "
               "{ for (int i = 0; i < 16; i++) out[i] = a[i] + %d.0f; }" % (rnd * 10 + k))
        a = np.arange(16, dtype=np.float32)
        out = np.zeros(16, np.float32)
        Program(src, "k")(a, out)
        assert (out == a + (rnd * 10 + k)).all()
""")


def test_concurrent_processes_share_cache(cache: Path, tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "UOPC_CACHE": str(cache)}
    for rnd in range(3):
        go = tmp_path / f"go{rnd}"
        readies = [tmp_path / f"ready{rnd}-{i}" for i in range(4)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(r), str(go), str(rnd)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in readies
        ]
        try:
            deadline = time.time() + 60
            while not all(r.exists() for r in readies) and time.time() < deadline:
                time.sleep(0.005)
            go.touch()
            results = [p.communicate(timeout=60) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for p, (_, err) in zip(procs, results, strict=True):
            assert p.returncode == 0, err
    so, js, tmp = entry_files(cache)
    assert len(so) == 9 and len(js) == 9 and not tmp
    for s in so:
        meta = json.loads(s.with_suffix(".json").read_text())
        assert meta["sha256"] == hashlib.sha256(s.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# OpenMP threads


def test_thread_count_does_not_change_results(threads):
    prg = Program(PAR, "par")
    runtime.set_num_threads(1)
    out1, nt1 = run_par(prg)
    runtime.set_num_threads(2)
    out2, nt2 = run_par(prg)
    out2b, _ = run_par(prg)
    assert (nt1, nt2) == (1, 2) and runtime.get_num_threads() == 2
    assert out1.tobytes() == out2.tobytes() == out2b.tobytes()


def test_threads_applied_per_python_thread(threads):
    # omp_set_num_threads is per OS thread; a new Python thread must still get the chosen count
    prg = Program(PAR, "par")
    for n in (1, 2, 1):
        runtime.set_num_threads(n)
        seen: list[int] = []
        t = threading.Thread(target=lambda out=seen: out.append(run_par(prg)[1]))
        t.start()
        t.join(30)
        assert seen == [n]
        assert run_par(prg)[1] == n


@pytest.mark.parametrize(
    ("bad", "exc"), [(0, ValueError), (-1, ValueError), (1.5, TypeError), ("2", TypeError), (True, TypeError)]
)
def test_set_num_threads_validates(bad, exc, threads):
    with pytest.raises(exc):
        runtime.set_num_threads(bad)
    runtime.set_num_threads(np.int64(1))
    assert runtime.get_num_threads() == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_runs_parallel_kernel(threads):
    prg = Program(PAR, "par")
    runtime.set_num_threads(2)
    expect, nt = run_par(prg)  # starts libgomp's thread pool in this process
    assert nt == 2
    pid = os.fork()
    if pid == 0:  # child: report through the exit code, never return into pytest
        code = 10
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out, nt = run_par(prg)
                run_par(Program(PAR, "par"))
            forked = [w for w in caught if issubclass(w.category, RuntimeWarning) and "forked child" in str(w.message)]
            code = (
                (0 if out.tobytes() == expect.tobytes() else 1)
                | (0 if nt == 1 else 2)
                | (0 if len(forked) == 1 else 4)
                | (0 if runtime.get_num_threads() == 1 else 8)
            )
        finally:
            os._exit(code)
    deadline = time.time() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("kernel in the forked child hung")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    assert runtime.get_num_threads() == 2 and run_par(prg)[1] == 2  # the parent is unaffected


def test_plan_compiles_one_unit_per_kernel_and_links_one_object(monkeypatch):
    """A plan is one object linked from a unit per distinct kernel plus its entry point; results are unchanged."""
    monkeypatch.setattr(realize, "ONE_UNIT_CHARS", 0)  # every plan per kernel, however small
    x = np.random.default_rng(0).standard_normal((24, 40)).astype(np.float32)
    got = (Tensor(x).softmax(-1) * 3 - 1).exp2().sum(0).numpy()  # a structure used nowhere else: compiled here
    cp = next(reversed(realize._plans.values()))
    assert len(cp.srcs) == len({k.ast for k in cp.kernels}) + 1
    assert cp.src.count("void plan(") == 1 and cp.src.count("typedef __INT8_TYPE__ int8_t;") == len(cp.srcs)
    # each unit stands alone, and units concatenate (the runtime compiles small ones together): the prelude and the
    # helpers are guarded, the kernels' definitions weak
    body = [src.split("\n", 1)[1] if src.startswith(CFLAGS_LINE) else src for src in cp.srcs]  # past a flags line
    assert all(b.startswith("#ifndef UOPC_PRELUDE\n") for b in body)
    assert all('__attribute__((visibility("hidden"), weak))' in src for src in cp.srcs[:-1])
    e = np.exp(x - x.max(-1, keepdims=True))
    ref = np.exp2(e / e.sum(-1, keepdims=True) * 3 - 1).sum(0)
    np.testing.assert_allclose(got, ref, rtol=1e-5)


def test_register_tiled_kernels_carry_their_attribute_under_the_default_flags(context, monkeypatch):
    """A kernel lowered with a vector register tile (the GEMM microkernel) is defined with TILED_OPTIMIZE when the
    flags are uopc's defaults, and no other kernel is; flags the user chose (CFLAGS) are left as they are."""
    from uopc.renderer.c import TILED_OPTIMIZE
    from uopc.renderer.plan import kernel_unit

    monkeypatch.setattr(realize, "ONE_UNIT_CHARS", 0)
    context(OPT=1)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((96, 80)).astype(np.float32), rng.standard_normal((80, 160)).astype(np.float32)
    default = helpers.settings().CFLAGS is None  # make test's x86-64-v3 pass sets CFLAGS
    for flags in ([None] if default else []) + [" ".join(runtime.cflags())]:
        if flags is not None:
            context(CFLAGS=flags)
        got = ((Tensor(a) @ Tensor(b)) * 0.5).sum(0).numpy()
        np.testing.assert_allclose(got, (a @ b * 0.5).sum(0), rtol=1e-4, atol=1e-3)
        cp = next(reversed(realize._plans.values()))
        tiled = [k.register_tile for k in cp.kernels]
        assert any(tiled) and not all(tiled), [(k.name, k.opts) for k in cp.kernels]
        for k in cp.kernels:
            unit = kernel_unit(k.ast, k.name, k.register_tile)
            assert unit.src in cp.srcs
            assert (TILED_OPTIMIZE in unit.src) == (k.register_tile and flags is None), k.name


def test_the_entry_point_compiles_at_o0_and_hand_written_kernels_keep_o3(context, monkeypatch):
    """The entry point only calls kernels: -O0 (char-GPT's 311 calls: gcc 0.69 -> 0.18 s). Fused attention and
    Winograd's transforms keep -O3: under TILED_OPTIMIZE attention ran 2x slower, and the transforms compiled no
    faster."""
    from uopc.renderer.c import TILED_OPTIMIZE
    from uopc.renderer.plan import kernel_unit

    if helpers.settings().CFLAGS is not None:
        pytest.skip("CFLAGS set: the attributes apply under uopc's default flags only")
    monkeypatch.setattr(realize, "ONE_UNIT_CHARS", 0)
    context(WINOGRAD=4)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 8, 10, 10)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    q, k, v = (rng.standard_normal((1, 2, 40, 16)).astype(np.float32) for _ in range(3))
    conv = Tensor(x).conv2d(Tensor(w), padding=1)
    att = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), is_causal=True)
    # (and a ResNet layer's convolution, whose input transform writes the GEMM's panels)
    wide = Tensor(rng.standard_normal((1, 128, 28, 28)).astype(np.float32)).conv2d(
        Tensor(rng.standard_normal((128, 128, 3, 3)).astype(np.float32)), padding=1
    )
    Tensor.realize_all(conv, att, wide)
    got_conv, got_att = conv.numpy(), att.numpy()
    torch = pytest.importorskip("torch")
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True).numpy()
    np.testing.assert_allclose(got_att, want, rtol=1e-4, atol=1e-5)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(got_conv, want, rtol=1e-3, atol=1e-4)
    cp = next(reversed(realize._plans.values()))
    kinds = {kr.ast.src[0].op: kernel_unit(kr.ast, kr.name, kr.register_tile).src for kr in cp.kernels}
    assert TILED_OPTIMIZE not in kinds[Ops.WINOGRAD] and TILED_OPTIMIZE not in kinds[Ops.ATTENTION]
    assert '__attribute__((optimize("O0"))) void plan(' in cp.srcs[-1]
    # a Winograd transform compiles without complete peeling (a weight transform at -O2 too, an input transform
    # writing panels without vectorized epilogues), attention with gcc's own, every other kernel peeling loops of up
    # to 4 iterations (renderer.plan.CFLAGS_LINE)
    want = {Ops.WINOGRAD: list(NO_PEELING), Ops.ATTENTION: []}
    kinds = []
    for kr in cp.kernels:
        got = unit_cflags(kernel_unit(kr.ast, kr.name, kr.register_tile).src)
        if kr.ast.src[0].op is Ops.WINOGRAD and (w := kr.ast.src[0].arg.op).kind in ("w", "in"):
            kinds.append(w.kind if w.kind == "w" or not w.panel else "panels")
            assert got == list(WEIGHT_TRANSFORM if w.kind == "w" else PANEL_TRANSFORM if w.panel else NO_PEELING)
        else:
            assert got == want.get(kr.ast.src[0].op, list(SHORT_PEELING)), kr.name
    # (panels are the optimizer's layout pass: OPT=0 has none)
    assert sorted(kinds) == ["in", "panels" if helpers.settings().OPT >= 1 else "in", "w", "w"]


def test_a_units_own_flags_reach_the_compiler(tmp_path):
    """A unit's first line may name flags of its own (renderer.plan.CFLAGS_LINE): its object compiles with them
    added (a run batches only units of the same flags), and they are part of its source, so of its cache key."""
    from uopc.runtime import objects

    needs = "#ifndef UOPC_UNIT_FLAG\n#error the unit's flags were not passed\n#endif\n"
    needs += "int uopc_flagged_{n}(void) {{ return {n}; }}\n"
    units = [
        objects.Unit(f"{CFLAGS_LINE} -DUOPC_UNIT_FLAG=1\n" + needs.format(n=0), str(tmp_path / "a.o")),
        objects.Unit("int uopc_plain(void) { return 2; }\n", str(tmp_path / "b.o")),
        objects.Unit(f"{CFLAGS_LINE} -DUOPC_UNIT_FLAG=1\n" + needs.format(n=3), str(tmp_path / "c.o")),
    ]
    fail = lambda rc, cmd, err, src: CompileError(f"exit {rc}", cmd, err, src, None)
    objs = objects.gather(units, runtime._resolve_compiler(), runtime.cflags(), str(tmp_path), fail)
    assert objs and all(os.path.exists(u.obj) for u in units)
    bad = objects.Unit(needs.format(n=4), str(tmp_path / "d.o"))  # the same C without the line fails
    with pytest.raises(CompileError) as e:
        objects.gather([bad], runtime._resolve_compiler(), runtime.cflags(), str(tmp_path), fail)
    assert "flags were not passed" in e.value.stderr


def _fresh_plans():
    from uopc.engine import plan_store

    realize._plans.clear()
    lowering.clear_lowered()
    return plan_store


def test_small_plans_compile_as_one_unit(context):
    # under realize.ONE_UNIT_CHARS of kernel C one compiler run builds the whole plan (softmax cut at every reduce,
    # as OPT=0 cuts it: three kernels)
    context(OPT=0)
    x = np.random.default_rng(3).standard_normal((6, 10)).astype(np.float32)
    before = runtime.stats["compiles"]
    got = (Tensor(x).softmax(-1) + 0.25).numpy()
    cp = next(reversed(realize._plans.values()))
    assert len(cp.srcs) == 1 and runtime.stats["compiles"] == before + 1 and len(cp.kernels) == 3
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True) + 0.25, rtol=1e-6)


def test_a_kernel_shared_by_two_plans_compiles_once(cache: Path, monkeypatch, context):
    # the same row-softmax kernels in two different plans: the second plan compiles only what is new to it (softmax
    # cut at every reduce, as OPT=0 cuts it: its max and sum kernels are shared)
    context(OPT=0)
    monkeypatch.setattr(realize, "ONE_UNIT_CHARS", 0)
    _fresh_plans()
    x = np.random.default_rng(1).standard_normal((16, 48)).astype(np.float32)
    a = Tensor(x).softmax(-1).numpy()
    before = dict(runtime.stats)
    b = (Tensor(x).softmax(-1) * 2.0 + 1.0).sum(1).numpy()  # softmax's max and sum kernels again, new last ones
    compiled = runtime.stats["compiles"] - before["compiles"]
    hits = runtime.stats["object_hits"] - before["object_hits"]
    assert hits >= 2 and compiled <= 2, (hits, compiled)  # the shared kernels were linked from the object cache
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(a, e / e.sum(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(b, (2 * e / e.sum(-1, keepdims=True) + 1).sum(1), rtol=1e-5)
    objs = list((cache / "obj").glob("*.o"))
    assert len(objs) == len(list((cache / "obj").glob("*.json")))


def test_one_loop_kernels_of_any_size_share_one_function(cache: Path, monkeypatch, context):
    """A one-loop kernel takes its size as an argument (codegen.loops.size_argument): the same elementwise body at
    another size links the first one's object (no compile of it), keeps its own name in the plan and passes its
    own size. Reference: NumPy, exact. (Under UOPC_CHECK_OOB each index check names its buffer's size: no sharing.)"""
    context(CHECK_OOB=0)
    monkeypatch.setattr(realize, "ONE_UNIT_CHARS", 0)
    _fresh_plans()
    a, b = np.arange(1000, dtype=np.float32), np.arange(3000, dtype=np.float32)[::-1].copy()
    np.testing.assert_array_equal((Tensor(a) * 3.0 - 0.5).numpy(), a * 3 - 0.5)
    first = next(reversed(realize._plans.values()))
    before = dict(runtime.stats)
    np.testing.assert_array_equal((Tensor(b) * 3.0 - 0.5).numpy(), b * 3 - 0.5)
    second = next(reversed(realize._plans.values()))
    assert runtime.stats["object_hits"] - before["object_hits"] == 1 and runtime.stats["units"] == before["units"]
    assert [k.name for k in first.kernels] == ["e_1000"] and [k.name for k in second.kernels] == ["e_3000"]
    assert first.srcs[0] == second.srcs[0] and "var_uopc_n" in first.srcs[0]  # one unit: its loop ends at the argument
    assert ", 1000);" in first.srcs[-1] and ", 3000);" in second.srcs[-1]  # each entry point passes its size


def test_a_corrupted_kernel_object_is_rebuilt(cache: Path, monkeypatch):
    monkeypatch.setattr(realize, "ONE_UNIT_CHARS", 0)
    _fresh_plans()
    x = np.random.default_rng(2).standard_normal((8, 33)).astype(np.float32)
    ref = (Tensor(x) * 3.0).exp2().numpy()
    for obj in (cache / "obj").glob("*.o"):
        obj.write_bytes(obj.read_bytes()[:100])  # truncated
    for so in cache.glob("*.so"):
        so.unlink()  # the plan's object is gone too: it must be linked again from (rebuilt) kernel objects
    runtime._clear_memory_cache()
    _fresh_plans()
    before = dict(runtime.stats)
    again = (Tensor(x) * 3.0).exp2().numpy()
    assert runtime.stats["compiles"] > before["compiles"] and runtime.stats["object_hits"] == before["object_hits"]
    np.testing.assert_array_equal(again, ref)
    np.testing.assert_allclose(again, np.exp2(x.astype(np.float64) * 3), rtol=1e-6)


def test_two_processes_compiling_one_plan_at_once(cache: Path):
    # both succeed, and the cache holds one entry per kernel (atomic writes of identical content under one key)
    code = textwrap.dedent("""
        import numpy as np
        from uopc.engine import realize
        from uopc.tensor import Tensor
        realize.ONE_UNIT_CHARS = 0  # per kernel, however small
        x = np.arange(600, dtype=np.float32).reshape(20, 30) / 100
        y = (Tensor(x).softmax(-1) * Tensor(x).sum(0)).numpy()
        e = np.exp(x - x.max(-1, keepdims=True))
        assert np.allclose(y, e / e.sum(-1, keepdims=True) * x.sum(0), rtol=1e-5), "wrong"
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "UOPC_CACHE": str(cache)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 and o.strip() == "ok" for p, (o, _) in zip(procs, outs, strict=True)), outs
    objs, jsons = list((cache / "obj").glob("*.o")), list((cache / "obj").glob("*.json"))
    assert objs and len(objs) == len(jsons)
    assert len(list(cache.glob("*.so"))) == 1 and not list(cache.glob(".build-*"))


def test_a_big_plan_compiles_its_kernels_while_it_is_lowered(cache: Path, monkeypatch):
    """Past ONE_UNIT_CHARS of kernel C, each distinct kernel goes to gcc as soon as it is lowered (in the
    background, as many at once as there are CPUs); the link waits for those and compiles the rest."""
    monkeypatch.setattr(realize, "ONE_UNIT_CHARS", 0)
    _fresh_plans()
    started: list[str] = []
    real = realize.prefetch
    monkeypatch.setattr(realize, "prefetch", lambda src: (started.append(src), real(src))[1])
    x = np.random.default_rng(5).standard_normal((12, 56)).astype(np.float32)
    before = dict(runtime.stats)
    got = ((Tensor(x).softmax(-1) * 3).exp2().sum(0) + 0.5).numpy()
    cp = next(reversed(realize._plans.values()))
    assert sorted(started) == sorted(cp.srcs[:-1])  # every kernel unit, once, before the link
    # each unit compiled once: early, or by the link if it was still waiting for a CPU then (several to a compiler
    # run when they waited together); the entry by the link's own run
    assert runtime.stats["units"] - before["units"] == len(cp.srcs) - 1
    assert runtime.stats["compiles"] - before["compiles"] <= len(cp.srcs)
    assert runtime.stats["object_hits"] - before["object_hits"] >= 1  # at least one was ready for the link
    assert not list((cache / "obj").glob(".batch-*"))  # no compile left running, no file left behind
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, np.exp2(e / e.sum(-1, keepdims=True) * 3).sum(0) + 0.5, rtol=1e-5)
    # built again with its whole object in the cache but not its kernels': the early compiles nobody links are
    # stopped when the plan is loaded, leaving no file behind
    for f in (cache / "obj").iterdir():
        f.unlink()
    runtime._clear_memory_cache()
    plan_store = _fresh_plans()
    monkeypatch.setattr(plan_store, "load", lambda name: None)
    started.clear()
    hits = runtime.stats["disk_hits"]
    again = ((Tensor(x).softmax(-1) * 3).exp2().sum(0) + 0.5).numpy()
    assert started and runtime.stats["disk_hits"] == hits + 1
    assert not list((cache / "obj").glob(".batch-*"))
    np.testing.assert_array_equal(again, got)


def test_a_stopped_compile_leaves_no_file_even_from_the_compilers_own_children(tmp_path):
    """gcc -pipe runs cc1 and as beside the driver; stopping a run stops them all. Killing only the driver left
    the assembler to write the run's object after its files were removed (a stray .batch-*.o in the cache). The fake
    compiler here leaves that to a child of its own, a moment after it starts."""
    from uopc.runtime import objects

    fake = tmp_path / "slowcc"
    # it writes the file named after -o, from a child of its own
    fake.write_text(
        '#!/bin/sh\nout=""; prev=""\nfor a; do [ "$prev" = -o ] && out="$a"; prev="$a"; done\n'
        '(sleep 0.3; echo late > "$out") &\nwait\n'
    )
    fake.chmod(0o755)
    unit = objects.Unit("int uopc_never(void) { return 0; }\n", str(tmp_path / "never.o"))
    run = objects._start((unit,), str(fake), [], str(tmp_path))
    time.sleep(0.1)  # the child is sleeping
    objects._kill(run)
    time.sleep(0.5)  # past the child's write, had it lived
    assert not list(tmp_path.glob(".batch-*")), list(tmp_path.iterdir())


@pytest.mark.parametrize("kernels,first_sent", [(30, 1), (12, 10), (5, None)])
def test_a_plan_expected_to_compile_per_kernel_starts_gcc_with_its_first_kernel(monkeypatch, kernels, first_sent):
    """Early compiles start once the kernels lowered so far reach ONE_UNIT_CHARS of C, or once they and the kernels
    still to lower, at their mean size, are expected to reach twice it: 30 kernels of 100 characters against a
    threshold of 1000 start with the first; 12 (1200 expected) with the tenth, at 1000 lowered; 5 never."""
    from types import SimpleNamespace

    monkeypatch.setattr(realize, "ONE_UNIT_CHARS", 1000)
    sent: list[int] = []
    monkeypatch.setattr(realize, "prefetch", lambda src: (sent.append(int(src)), src)[1])

    def unit(ast, name, tile):
        return SimpleNamespace(sym=name, src=name[1:], fn=SimpleNamespace(definition=lambda sym: "x" * 100))

    monkeypatch.setattr(realize, "kernel_unit", unit)
    early = realize._EarlyCompile()
    at = None
    for i in range(kernels):
        early(SimpleNamespace(ast=None, name=f"k{i}", register_tile=None), kernels - 1 - i)
        if at is None and sent:
            at = i + 1
    assert at == first_sent
    assert sent == (list(range(kernels)) if first_sent else [])  # then every distinct kernel, once, in order


def test_small_kernel_units_compile_several_to_a_compiler_run(cache: Path, monkeypatch, context):
    """The link compiles the missing units of a plan in balanced runs, one per CPU when they are small: fewer
    compiler runs than units, and every unit's object in the cache under its own key, so that a later plan with one
    of the kernels links it from there."""
    from uopc.runtime import objects

    cpus = 2  # two compiler runs at once, whatever this machine has (the count of runs follows from it)
    monkeypatch.setattr(objects, "available_cpus", lambda: cpus)
    context(OPT=0)  # softmax cut at every reduce: its max and sum kernels are shared with the second plan
    monkeypatch.setattr(realize, "ONE_UNIT_CHARS", 0)
    monkeypatch.setattr(realize, "prefetch", lambda src: src)  # no early compiles: the link compiles every unit
    monkeypatch.setattr(realize, "cancel_prefetches", lambda objs: None)
    _fresh_plans()
    x = np.random.default_rng(8).standard_normal((10, 30)).astype(np.float32)
    before = dict(runtime.stats)
    got = ((Tensor(x).softmax(-1) + 1).log2().sum(0) * Tensor(x).max(0)).numpy()
    cp = next(reversed(realize._plans.values()))
    n = len(cp.srcs) - 1
    assert n > cpus, [k.name for k in cp.kernels]  # enough units to share runs
    assert runtime.stats["units"] - before["units"] == n
    assert runtime.stats["compiles"] - before["compiles"] == cpus + 1  # one run per CPU, and the link
    objs = sorted((cache / "obj").glob("*.o"))
    assert len(objs) == n and len(list((cache / "obj").glob("*.json"))) == n
    assert len({o.stat().st_ino for o in objs}) == cpus  # a run's object, hard-linked under each key
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, np.log2(e / e.sum(-1, keepdims=True) + 1).sum(0) * x.max(0), rtol=1e-5)
    _fresh_plans()
    before = dict(runtime.stats)
    again = (Tensor(x).softmax(-1) * 2).numpy()  # softmax's kernels again, from the objects of the runs above
    assert runtime.stats["object_hits"] - before["object_hits"] >= 2
    np.testing.assert_allclose(again, 2 * e / e.sum(-1, keepdims=True), rtol=1e-5)


def test_a_failed_early_compile_is_reported_by_the_link(cache: Path):
    """An early (prefetched) compile that fails leaves nothing in the cache; the link compiles the unit again and
    raises the compiler's error with the source saved."""
    bad = "void broken(float* a) { a[0] = ; }\n"
    runtime.prefetch(bad)
    with pytest.raises(CompileError) as e:
        Program((bad, "void plan(void) {}\n"), "plan")
    assert "broken" in e.value.src and e.value.c_path and os.path.exists(e.value.c_path)
    assert not list((cache / "obj").glob("*.o"))  # the entry point compiles with the link: no object of its own
    assert not list((cache / "obj").glob(".batch-*"))

"""The tools a user sees: kernel names and the DEBUG=2 line, the cache-miss explainer, the disk cache cap, and each
`uopc` subcommand run in a subprocess as a user would run it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from uopc.engine import realize
from uopc.kernelize import make_plan
from uopc.nn import LayerNorm, Linear, parameters
from uopc.runtime import compiler as runtime
from uopc.runtime import disk_cache
from uopc.tensor import Tensor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = """
import numpy as np
from uopc.tensor import Tensor
for i in range(3):  # a new input each time: a kernel of unchanged inputs would be kept, not run again
    x = Tensor(np.random.default_rng(i).standard_normal((64, 64)).astype(np.float32))
    (x @ x).softmax(-1).realize()
print("tiny script done")
"""


def r(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def uopc_cmd(*args: str, cache: str | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    if cache:
        env["UOPC_CACHE"] = cache
    return subprocess.run(
        [sys.executable, "-m", "uopc", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT
    )


# ---------------------------------------------------------------------------------------------------------------
# kernel names, bytes, ops, and the DEBUG=2 line


def _graphs():
    x = Tensor(r(16, 32))
    ln = LayerNorm(32)
    l1, l2 = Linear(32, 8), Linear(8, 4)
    loss = l2(l1(x).relu()).cross_entropy(Tensor(np.arange(16, dtype=np.int32) % 4))
    loss.backward(parameters([l1, l2]))
    return [
        [x.softmax(-1)],
        [ln(x)],
        [x.var(-1)],
        [loss, *(p.grad for p in parameters([l1, l2]))],
    ]


@pytest.mark.parametrize("opt", [0, 1])
def test_different_kernels_never_share_a_name(context, opt):
    context(OPT=opt)
    for roots in _graphs():
        plan, _ = make_plan([t.uop for t in roots], opt=realize.default_opt())
        by_name: dict[str, object] = {}
        for k in plan.kernels:
            # one name, one AST: identical kernels may share a name (they share one C source and one compile)
            assert by_name.setdefault(k.name, k.ast) is k.ast, [k.name for k in plan.kernels]
        assert len({k.name for k in plan.kernels}) == len({k.ast for k in plan.kernels})


def test_softmax_names_bytes_and_ops(context):
    context(OPT=0)
    plan, _ = make_plan([Tensor(r(4, 8)).softmax(-1).uop])
    assert [k.name for k in plan.kernels] == ["r_4", "r_4n1", "e_4_8"]
    # bytes each kernel must move: every buffer read once plus the output (float32: 4 bytes)
    assert [k.nbytes for k in plan.kernels] == [4 * (32 + 4), 4 * (32 + 4 + 4), 4 * (32 + 4 + 4 + 32)]
    assert [k.op.split()[0] for k in plan.kernels] == ["max", "sum", "elementwise"]
    mm, _ = make_plan([(Tensor(r(8, 16)) @ Tensor(r(16, 4))).uop])
    assert [k.op for k in mm.kernels] == ["matmul"]


def test_debug2_line_per_kernel(context, capsys):
    context(OPT=0)
    Tensor(r(4, 8)).softmax(-1).realize()  # compile outside the captured run
    context(DEBUG=2)
    capsys.readouterr()
    Tensor(r(4, 8)).softmax(-1).realize()
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  ")]
    pat = re.compile(r"^  (\S+) +(\d+\.\d{3}) ms +(\d+\.\d\d) GFLOP/s +(\d+\.\d\d) GB/s  (\S.*)$")
    got = [pat.match(ln) for ln in lines]
    assert all(got), lines
    assert [m.group(1) for m in got] == ["r_4", "r_4n1", "e_4_8"]
    assert [m.group(5).split()[0] for m in got] == ["max", "sum", "elementwise"]
    # GB/s is printed with 2 decimals: tiny kernels on a busy machine may show 0.00, so only the format is checked


# ---------------------------------------------------------------------------------------------------------------
# the cache-miss explainer


def test_cache_miss_explainer_names_the_changing_float(context, capsys):
    context(OPT=0)
    x, y = Tensor(r(8, 4)), Tensor(r(8, 1))
    w = Tensor(r(4, 1), requires_grad=True)
    msgs = []
    for step in range(3):
        lr = 0.001 * 0.99**step  # a Python float that changes every step: a new constant, a new plan
        loss = ((x @ w - y) ** 2).mean()
        loss.backward([w])
        if step > 0:
            context(DEBUG=1)
        w = (w - lr * w.grad).detach().realize()
        w.requires_grad = True
        msgs += [ln for ln in capsys.readouterr().out.splitlines() if "plan cache miss" in ln]
    assert msgs, "no explanation printed"
    assert "CONST 0.00099 (was 0.001)" in msgs[0], msgs[0]
    assert "a Python float that changes every step: pass it as a Tensor" in msgs[0]
    assert re.search(r"at node \d+ of \d+", msgs[0])


def test_explainer_silent_without_a_plan_of_that_size():
    assert realize.explain_miss((("no such structure",), False, None, 0)) is None


# ---------------------------------------------------------------------------------------------------------------
# the disk cache cap


def _src(i: int) -> str:
    return f"void k{i}(float* a) {{ a[0] += {i}.0f; }}"


def test_lru_eviction_keeps_recent_and_loaded_entries(tmp_path, monkeypatch):
    monkeypatch.setenv("UOPC_CACHE", str(tmp_path))
    runtime._clear_memory_cache()
    progs = [runtime.Program(_src(i), f"k{i}") for i in range(4)]
    sos = sorted(tmp_path.glob("*.so"), key=lambda p: p.stat().st_mtime)
    assert len(sos) == 4
    for age, p in enumerate(reversed([pr.lib_path for pr in progs])):  # k0 oldest
        os.utime(p, (time.time() - 100 * (age + 1),) * 2)
    # a hit from the disk touches the entry: k1 becomes the most recently used
    runtime._clear_memory_cache()
    runtime.Program(_src(1), "k1")
    one = sum(p.stat().st_size for p in tmp_path.glob("*.so")) // 4 + 200
    removed = runtime.evict(str(tmp_path), max_bytes=2 * one)
    left = {p.name for p in tmp_path.glob("*.so")}
    assert removed == 2 and os.path.basename(progs[1].lib_path) in left and os.path.basename(progs[3].lib_path) in left
    assert not os.path.exists(progs[0].lib_path[:-3] + ".json")  # the json goes with its .so
    a = np.zeros(1, np.float32)
    progs[0](a)  # evicted from disk, still loaded: it keeps working
    assert a[0] == 0.0
    runtime._clear_memory_cache()
    runtime.Program(_src(0), "k0")(a)  # and is rebuilt when needed again
    assert a[0] == 0.0
    runtime._clear_memory_cache()


def test_eviction_scans_the_cache_once_a_share_of_the_cap_was_written(tmp_path, monkeypatch):
    """Eviction stats every entry (~100 ms at the 15,000 files make test leaves), and every compile asked for it:
    after a write it scans only once the bytes written since the last scan reach 1/SCAN_SHARE of the cap, counted
    across processes in <cache>/.written; a missing or unreadable count is due at once. A scan then brings the cache
    back under the cap, keeping the entry just written."""
    scans: list[str] = []
    real = disk_cache.os.scandir
    monkeypatch.setattr(disk_cache.os, "scandir", lambda p: scans.append(str(p)) or real(p))
    size = 4096
    cap = disk_cache.SCAN_SHARE * 4 * size  # a scan due every 4 entries

    def put(i: int, n: int = size) -> int:
        path = str(tmp_path / f"e{i}.so")
        disk_cache.write_entry(path, b"x" * n, 0o600)
        return disk_cache.evict(str(tmp_path), max_bytes=cap, keep=path, written=n)

    def scanned() -> int:
        return scans.count(str(tmp_path))

    put(0)
    assert scanned() == 1  # no count yet
    for i in range(1, 4):
        put(i)
    assert scanned() == 1
    put(4)  # the fourth entry since the scan
    assert scanned() == 2
    (tmp_path / ".written").write_text("garbled")
    put(5)
    assert scanned() == 3
    assert put(6, 2 * cap) == 6 and scanned() == 4  # over the cap: everything older goes, the new entry stays
    assert sorted(p.name for p in tmp_path.glob("e*")) == ["e6.json", "e6.so"]


# ---------------------------------------------------------------------------------------------------------------
# the uopc command, in subprocesses


@pytest.mark.parametrize("sub", [[], ["bench"], ["profile"], ["cache"], ["machine"]])
def test_help(sub):
    p = uopc_cmd(*sub, "--help")
    assert p.returncode == 0, p.stderr
    assert "usage: uopc" in p.stdout


def test_profile_tiny_script_and_png(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    png = tmp_path / "roof.png"
    p = uopc_cmd("profile", str(script), "--png", str(png))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "tiny script done" in out and "peaks:   FMA" in out
    header = next(ln for ln in out.splitlines() if ln.startswith("kernel"))
    assert header.split() == "kernel calls total ms mean us GFLOP/s GB/s FLOP/B %roof %time op".split()
    rows = [ln for ln in out.split(header)[1].splitlines() if re.match(r"[re]_\S+ +\d+ ", ln)]
    ops = {ln.split(maxsplit=9)[-1] for ln in rows}
    assert "matmul" in ops and any(op.startswith("max") for op in ops), rows  # softmax's max (OPT=1: in its row kernel)
    assert rows and all(int(ln.split()[1]) == 3 for ln in rows)  # 3 iterations, each kernel once
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_compile_split(tmp_path):
    # where a first call's time went: every phase named with its milliseconds, and the parts add up to the wall time
    script = tmp_path / "tiny.py"
    step = "x.grad = None; (x @ x).softmax(-1).sum().backward(); x.grad.realize()"
    script.write_text(TINY.replace("(x @ x).softmax(-1).realize()", step))
    p = uopc_cmd("profile", str(script), "--compile", cache=str(tmp_path / "c"))
    assert p.returncode == 0, p.stderr
    m = re.search(r"where ([\d.]+) s went", p.stdout)
    assert m, p.stdout
    rows = dict(re.findall(r"^  (\S.*?) +([\d.-]+) ms", p.stdout, re.M))
    for phase in ("kernels", "autodiff", "schedule", "lower", "render", "gcc", "graph building and other Python"):
        assert phase in rows, (phase, p.stdout)
    assert float(rows["gcc"]) > 0 and float(rows["lower"]) > 0
    assert abs(sum(map(float, rows.values())) / 1e3 - float(m.group(1))) < 0.01


def test_debug1_prints_the_phases_of_a_plan_build(context, capsys):
    context(DEBUG=1)
    (Tensor(r(7, 13)).exp2() * 3 - 1).softmax(-1).realize()  # a structure built nowhere else
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("realize: built plan"))
    assert re.fullmatch(
        r"realize: built plan of \d+ kernels: schedule [\d.]+ ms, .*lower [\d.]+ ms, render [\d.]+ ms.*", line
    )


def test_profile_missing_script():
    p = uopc_cmd("profile", "/no/such/script.py")
    assert p.returncode != 0 and "no such script" in p.stderr


def test_cache_info_verify_clear(tmp_path):
    cache = str(tmp_path / "c")
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    assert uopc_cmd("profile", str(script), cache=cache).returncode == 0  # fills the cache
    info = uopc_cmd("cache", "info", cache=cache)
    assert info.returncode == 0 and f"cache directory: {cache}" in info.stdout
    n = int(re.search(r"compiled kernels: (\d+) entries", info.stdout).group(1))
    assert n >= 3 and "machine probes: cached" in info.stdout
    ok = uopc_cmd("cache", "verify", cache=cache)
    assert ok.returncode == 0 and f"{n} ok, 0 bad" in ok.stdout
    so = sorted(p for p in os.listdir(cache) if p.endswith(".so"))[0]
    with open(os.path.join(cache, so), "r+b") as f:  # flip a byte: same size, other hash
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    bad = uopc_cmd("cache", "verify", cache=cache)
    assert bad.returncode == 1 and "1 bad" in bad.stdout and so[:-3] in bad.stdout
    cl = uopc_cmd("cache", "clear", cache=cache)
    assert cl.returncode == 0 and "removed" in cl.stdout
    assert "compiled kernels: 0 entries" in uopc_cmd("cache", "info", cache=cache).stdout


def test_bench_quick_json():
    p = uopc_cmd("bench", "--quick", "--json", timeout=240)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["machine"]["peak_gflops"] > 0 and rep["machine"]["bandwidth_gbs"] > 0
    cases = {c["case"]: c for c in rep["results"]}
    assert any(c.startswith("gemm") for c in cases) and "softmax 1024x1024" in cases
    for c in cases.values():
        assert c["median_s"]["uopc"] > 0 and len(c["rounds_s"]["uopc"]) == rep["rounds"]
    assert cases["softmax 1024x1024"]["ratios"]["numpy"] > 0
    assert "OPENBLAS_CORETYPE OPENBLAS_L2_SIZE unset" in rep["libraries"]["numpy"]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="wait_idle reads /proc")
def test_wait_idle_tells_a_spinning_process_from_a_sleeping_one():
    # the benchmarks wait for the NumPy worker's BLAS threads to stop spinning before timing the next side
    from uopc.tools.harness import wait_idle

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert wait_idle(busy.pid, cap=0.5) is False
        assert wait_idle(idle.pid, cap=5.0) is True
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()

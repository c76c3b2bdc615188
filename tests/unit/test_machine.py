"""The Machine record: probed from what the compiler targets (not /proc/cpuinfo), the assembler canary, the vector
width rule, the record on disk, and the Machine in the plan key.

The probe's decisions are checked against a fake compiler (a shell script that answers as gcc 12 does for an Intel
Xeon with AVX512-FP16 and an assembler that rejects its masked vmovsh), so they hold on any machine; the real
compiler is asked only for what every x86-64 gcc knows (-march=x86-64-v3, an AVX2-only target).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from uopc import machine as mach
from uopc.engine import realize
from uopc.helpers import Context
from uopc.runtime import compiler as runtime
from uopc.tensor import Tensor

X86 = platform.machine() in ("x86_64", "AMD64")

FAKE_CC = """#!/bin/sh
# answers like gcc 12 with -march=sapphirerapids: AVX-512 with FP16, 256-bit auto-vectorization, and an assembler
# that rejects the masked vmovsh it emits for half selects unless -mno-avx512fp16 is given
case " $* " in
  *" -dM -E "*)
    printf '#define __AVX2__ 1\\n#define __FMA__ 1\\n#define __F16C__ 1\\n#define __AVX512F__ 1\\n'
    case " $* " in *" -mno-avx512fp16 "*) ;; *) printf '#define __AVX512FP16__ 1\\n' ;; esac
    exit 0 ;;
  *" --help=target "*)
    case " $* " in
      *"-mprefer-vector-width=512"*) printf '  -mprefer-vector-width=      \\t\\t512\\n' ;;
      *) printf '  -mprefer-vector-width=      \\t\\t256\\n' ;;
    esac
    exit 0 ;;
esac
cat > /dev/null
case " $* " in *" -mno-avx512fp16 "*) exit 0 ;; esac
echo "/tmp/x.s:84: Error: unsupported masking for \\`vmovsh'" >&2
exit 1
"""


@pytest.fixture
def fake_cc(tmp_path: Path) -> str:
    p = tmp_path / "fakecc"
    p.write_text(FAKE_CC)
    p.chmod(0o755)
    return str(p)


def test_canary_drops_avx512fp16_when_the_assembler_rejects_it(fake_cc: str):
    m = mach.probe(fake_cc, ["-O3", "-march=sapphirerapids"])
    assert "-mno-avx512fp16" in m.extra_flags and "avx512fp16" not in m.isa and "avx512f" in m.isa
    assert any("vmovsh" in n for n in m.notes)  # what DEBUG=1 prints


def test_vector_width_rule(fake_cc: str):
    # the fake compiler prefers 256-bit loops on an AVX-512 target: the rule asks for 512, and says so
    m = mach.probe(fake_cc, ["-O3"])
    assert m.vector_bytes == 64 and m.vector_registers == 32
    assert "-mprefer-vector-width=512" in m.extra_flags and m.auto_vector_bytes == 64 and m.register == "zmm"
    # a -mprefer-vector-width in CFLAGS always wins
    m256 = mach.probe(fake_cc, ["-O3", "-mprefer-vector-width=256"])
    assert not any(f.startswith("-mprefer") for f in m256.extra_flags) and m256.auto_vector_bytes == 32


def test_record_on_disk_is_read_back_without_asking_the_compiler(fake_cc: str, tmp_path: Path, monkeypatch):
    first = mach.probe(fake_cc, ["-O2"], "fake 1.0", str(tmp_path))
    assert list(tmp_path.glob("machine/*.json"))
    mach._probed.clear()

    def no_compiler(*a, **k):
        raise AssertionError("the compiler was asked again")

    monkeypatch.setattr(mach, "_probe_compiler", no_compiler)
    assert mach.probe(fake_cc, ["-O2"], "fake 1.0", str(tmp_path)) == first
    # another compiler version is another record
    monkeypatch.undo()
    mach._probed.clear()
    mach.probe(fake_cc, ["-O2"], "fake 2.0", str(tmp_path))
    assert len(list(tmp_path.glob("machine/*.json"))) == 2


def test_cores_and_caches_come_from_the_os():
    m = runtime.machine()
    assert m.cores == mach.available_cpus() >= 1
    assert m.l1d_bytes >= 4 << 10 and m.l2_bytes >= 64 << 10
    assert m.model == mach.cpu_model()


@pytest.mark.skipif(not X86, reason="x86-64 targets")
def test_march_in_cflags_decides_the_isa():
    with Context(CFLAGS=[*runtime.base_cflags(), "-march=x86-64-v3"]):
        m = runtime.machine()
    assert {"avx2", "fma", "f16c"} <= m.isa and "avx512f" not in m.isa
    assert (m.vector_bytes, m.vector_registers, m.register) == (32, 16, "ymm")


@pytest.mark.skipif(not X86, reason="x86-64 targets")
@pytest.mark.parametrize("march", [None, "-march=x86-64-v3", "-march=sapphirerapids", "-march=znver3"])
def test_the_options_gcc_lists_agree_with_its_macros(march):
    # the probe reads the ISA from one `-Q --help=target` listing (one gcc start); the macros are the reference
    flags = [*runtime.base_cflags(), *([march] if march else [])]
    cc = runtime._resolve_compiler()
    isa, _ = mach._target(cc, flags)
    assert isa is not None, "an x86-64 gcc lists its -m options"
    assert isa == mach._isa(cc, flags)


@pytest.mark.skipif(not X86, reason="x86-64 targets")
def test_the_native_expansion_agrees_with_the_macros():
    # -march=native: the ISA from the cc1 command the driver prints (`-###`, no compiler started); the macros decide
    flags, cc = runtime.base_cflags(), runtime._resolve_compiler()
    if "-march=native" not in flags or "gcc" not in mach._run([cc, "--version"]).stdout.lower():
        pytest.skip("the driver's expansion of -march=native is gcc's")
    assert mach._native_isa(cc, flags) == mach._isa(cc, flags)
    # other -m options (what they imply is cc1's to work out) and other targets ask the compiler instead
    assert mach._native_isa(cc, [*flags, "-mno-avx512f"]) is None
    assert mach._native_isa(cc, [*flags, "-march=x86-64-v3"]) is None


NATIVE_CC = """#!/bin/sh
# the driver of a gcc on an AVX-512 machine: -### prints the cc1 command, -march=native expanded; every question is
# logged, and nothing else is answered
echo "$*" >> "$0.log"
case " $* " in
  *" -### "*)
    echo 'Target: x86_64-linux-gnu' >&2
    echo ' /usr/lib/gcc/12/cc1 -quiet /dev/null "-march=znver4" -msse4.2 -mavx -mavx2 -mfma -mf16c -mavx512f \
-mavx512vl -mno-avx512fp16 -mno-amx-tile "-mtune=znver4" -O3' >&2
    exit 0 ;;
esac
exit 1
"""


def test_a_native_avx512_target_is_probed_from_the_driver_alone(tmp_path: Path):
    cc = tmp_path / "nativecc"
    cc.write_text(NATIVE_CC)
    cc.chmod(0o755)
    m = mach.probe(str(cc), ["-O3", "-march=native"])
    assert m.isa == {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512vl"}
    # uopc's rule decides the width, whatever the tuning prefers: the driver was the only question
    assert "-mprefer-vector-width=512" in m.extra_flags and m.auto_vector_bytes == 64
    asked = (tmp_path / "nativecc.log").read_text().splitlines()
    assert len(asked) == 1 and "-###" in asked[0].split(), asked
    # a width in CFLAGS: the rule does not decide it, so gcc's listing is asked too
    mach.probe(str(cc), ["-O3", "-march=native", "-mprefer-vector-width=256"])
    assert "--help=target" in (tmp_path / "nativecc.log").read_text()


def test_a_compiler_that_lists_no_options_is_asked_its_macros(fake_cc: str):
    # the fake answers --help=target with the preferred width only (not gcc's -m listing): the ISA comes from -dM
    assert mach._target(fake_cc, ["-O3"])[0] is None
    assert "avx512f" in mach.probe(fake_cc, ["-O3", "-march=x"]).isa


@pytest.mark.skipif(not X86, reason="x86-64 targets")
def test_another_machine_is_another_plan():
    x = np.arange(4096, dtype=np.float32)
    a = (Tensor(x) * 2.0).sum().numpy()
    before = set(realize._plans)
    with Context(CFLAGS=[*runtime.base_cflags(), "-march=x86-64-v3"]):
        b = (Tensor(x) * 2.0).sum().numpy()
    assert a == b == np.float32(x.astype(np.float64).sum() * 2)
    # by key, not by position: the plan cache is bounded, so a worker that built many plans evicts the oldest
    new = [k for k in realize._plans if k not in before]
    assert new and all("avx512f" not in k[-1].isa for k in new), "the x86-64-v3 plan must not reuse the default one"


def test_repr_is_the_same_in_every_process():
    # it keys the search and plan caches on disk: a frozenset's order changes with the hash seed
    code = "from uopc import runtime; print(repr(runtime.machine()))"
    outs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)
    assert len(outs) == 1 and "isa=[" in outs.pop()

"""The machine uopc compiles for, probed once per compiler and flag set and frozen: what the optimizer's choices,
the GEMM microkernel and the search depend on.

    >>> m = probe("/usr/bin/gcc", ["-O3", "-march=native", "-fopenmp"])
    >>> m.vector_bytes, m.vector_registers, m.l2_bytes, "avx512f" in m.isa
    (64, 32, 2097152, True)

The ISA is what the compiler will target with the given flags (the -m options gcc's driver expands -march=native
into, or that `-Q --help=target` lists enabled, or any compiler's predefined macros: `-march` in CFLAGS decides, not
/proc/cpuinfo), and the width of auto-vectorized loops is uopc's own rule (`VECTOR_WIDTH_RULE`) where it has one,
else what the compiler's tuning prefers (the same listing).
Cache sizes come from sysfs, the core count from this process's affinity mask. /proc/cpuinfo is read here and
nowhere else. Where the compiler targets AVX512-FP16, a canary kernel (half-precision loads and stores with masked
tails) is compiled and assembled with the chosen flags; if the assembler rejects it (gcc 12 emits masked `vmovsh`,
which binutils 2.40 refuses), the extension is dropped with `-mno-avx512fp16`.

The probe's result is kept on disk in the kernel cache's `machine/` folder (keyed on the compiler, its version, the
flags, this CPU and `PROBE_VERSION`), so a warm process asks the compiler nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from functools import cache

from uopc.helpers import atomic_write

__all__ = ["VECTOR_WIDTH_RULE", "Machine", "available_cpus", "cpu_fingerprint", "cpu_model", "probe"]

# bump when what the probe records (or how) changes: old records on disk are then never read again
PROBE_VERSION = 3  # 2: l3_bytes; 3: the ISA of -march=native from the driver

# Auto-vectorized loops (gcc's own vectorizer, not uopc's explicit vector types) use the full AVX-512 width on every
# AVX-512 machine. Measured on a Zen 4 (bench/bench_vector_width.py, 9 interleaved rounds, medians, 512 vs 256-bit):
# softmax 4096^2 10.8 vs 14.2 ms, LayerNorm 8192x1024 5.02 vs 5.00, relu chain 2^26 16.8 vs 16.0, row-sum 8192^2
# 7.77 vs 8.00, exp/tanh chain 2^24 166 vs 168: one clear win, the rest within noise. On a Xeon with AVX-512 FP16
# (gcc 12 takes it for a cooperlake, with no preferred width: 512 already), 5 rounds: softmax 12.1 vs 9.3,
# LayerNorm 5.56 vs 4.70, relu chain 26.5 vs 26.9, row-sum 12.2 vs 11.6, exp/tanh 257 vs 289 (the one loss: the
# compute-bound transcendental chain). Where gcc's tuning picks 256 (-march=sapphirerapids implies
# -mprefer-vector-width=256) the rule adds -mprefer-vector-width=512; a -mprefer-vector-width in CFLAGS always wins.
VECTOR_WIDTH_RULE = {"avx512f": 64}

# ISA names uopc cares about, by the macro the compiler predefines when it targets them
_ISA_MACROS = {
    "__SSE4_2__": "sse4_2",
    "__AVX__": "avx",
    "__AVX2__": "avx2",
    "__FMA__": "fma",
    "__F16C__": "f16c",
    "__AVX512F__": "avx512f",
    "__AVX512DQ__": "avx512dq",
    "__AVX512BW__": "avx512bw",
    "__AVX512VL__": "avx512vl",
    "__AVX512BF16__": "avx512bf16",
    "__AVX512FP16__": "avx512fp16",
    "__AMX_TILE__": "amx_tile",
    "__AMX_BF16__": "amx_bf16",
    "__ARM_NEON": "neon",
}
# the same extensions as gcc's -m options, which `-Q --help=target` lists [enabled] or [disabled]
_ISA_OPTIONS = {
    "-msse4.2": "sse4_2",
    "-mavx": "avx",
    "-mavx2": "avx2",
    "-mfma": "fma",
    "-mf16c": "f16c",
    "-mavx512f": "avx512f",
    "-mavx512dq": "avx512dq",
    "-mavx512bw": "avx512bw",
    "-mavx512vl": "avx512vl",
    "-mavx512bf16": "avx512bf16",
    "-mavx512fp16": "avx512fp16",
    "-mamx-tile": "amx_tile",
    "-mamx-bf16": "amx_bf16",
}

# half loads and stores, a half select and a masked tail (n is not known): gcc 12 with AVX512-FP16 turns the select
# into a masked vmovsh, which binutils 2.40 rejects ("unsupported masking for `vmovsh'")
_CANARY = """void uopc_canary(_Float16* restrict a, const _Float16* restrict b, const float* restrict c, int n) {
  for (int i = 0; i < n; i++) a[i] = (_Float16)((float)b[i] * c[i]);
}
void uopc_canary_select(_Float16* restrict a, const _Float16* restrict b, int n) {
  for (int i = 0; i < n; i++) a[i] = b[i] > (_Float16)0 ? b[i] : (_Float16)0;
}
"""


@dataclass(frozen=True)
class Machine:
    """What the compiled code can use. Tests build these directly (`Machine(cores=2, l2_bytes=1 << 20, ...)`)."""

    model: str = "unknown"
    isa: frozenset[str] = frozenset()  # what the compiler targets with the flags: {"avx2", "fma", "avx512f", ...}
    vector_bytes: int = 16  # the widest vector register of that ISA: 64 (AVX-512), 32 (AVX, AVX2), 16 (SSE, NEON)
    auto_vector_bytes: int = 16  # the width gcc's auto-vectorizer uses in uopc's kernels (after extra_flags)
    vector_registers: int = 16  # 32 zmm with AVX-512, else 16
    cores: int = 1  # CPUs this process may run on (its affinity mask); OpenMP's default thread count
    l1d_bytes: int = 32 << 10  # per core
    l2_bytes: int = 1 << 20  # per core
    l3_bytes: int = 8 << 20  # the last level, shared by the cores (as the machine reports it; a VM's share may be less)
    extra_flags: tuple[str, ...] = ()  # what uopc adds to CFLAGS for this machine (part of every compile key)
    notes: tuple[str, ...] = field(default=(), compare=False)  # why: printed at DEBUG=1 when a flag was added

    def __repr__(self) -> str:  # stable across processes (a frozenset's order is not): it keys caches on disk
        fields = ", ".join(
            f"{f.name}={sorted(v) if isinstance(v := getattr(self, f.name), frozenset) else v!r}"
            for f in dataclasses.fields(self)
            if f.compare
        )
        return f"Machine({fields})"

    def __hash__(self) -> int:  # part of every plan key, hashed on every realize: once per record
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.model, self.isa, self.vector_bytes, self.auto_vector_bytes, self.vector_registers))
            h = hash((h, self.cores, self.l1d_bytes, self.l2_bytes, self.l3_bytes, self.extra_flags))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def register(self) -> str:
        """The register name prefix of auto-vectorized code: zmm, ymm or xmm."""
        return {64: "zmm", 32: "ymm"}.get(self.auto_vector_bytes, "xmm")

    def describe(self) -> str:
        isa = ", ".join(sorted(self.isa)) or "baseline"
        return (
            f"{self.model}: {self.cores} cores, {isa}; {self.vector_bytes * 8}-bit vectors "
            f"({self.auto_vector_bytes * 8}-bit auto-vectorized), {self.vector_registers} vector registers, "
            f"L1d {self.l1d_bytes >> 10} KiB, L2 {self.l2_bytes >> 10} KiB per core"
            + (f"; adds {' '.join(self.extra_flags)}" if self.extra_flags else "")
        )


# ---------------------------------------------------------------------------------------------------------------
# what the OS says


@cache
def _cpuinfo() -> tuple[str, ...]:
    """The first processor's block of /proc/cpuinfo (empty where the machine has none)."""
    lines: list[str] = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip() and lines:
                    break
                lines.append(line.rstrip("\n"))
    except OSError:
        pass
    return tuple(lines)


def cpu_model() -> str:
    for line in _cpuinfo():
        k, _, v = line.partition(":")
        if k.strip() in ("model name", "Model", "Hardware"):
            return v.strip()
    return platform.processor() or platform.machine()


@cache
def cpu_fingerprint() -> str:
    """A digest of this CPU (model and flags), so that a cache shared between machines (an NFS home) never runs code
    compiled with -march=native for another CPU."""
    keep = ("model name", "flags", "Features", "CPU implementer", "CPU part")
    parts = [platform.machine(), *(ln.strip() for ln in _cpuinfo() if ln.split(":", 1)[0].strip() in keep)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _cache_size(level: int, kinds: tuple[str, ...], default: int) -> int:
    """Per-core size of a cache level from sysfs (`default` where the machine does not say)."""
    for i in range(8):
        base = f"/sys/devices/system/cpu/cpu0/cache/index{i}"
        try:
            with open(f"{base}/level") as f:
                if int(f.read()) != level:
                    continue
            with open(f"{base}/type") as f:
                if f.read().strip() not in kinds:
                    continue
            with open(f"{base}/size") as f:
                txt = f.read().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20}.get(txt[-1], 1)
            return int(txt.rstrip("KM")) * mult
        except (OSError, ValueError):
            continue
    return default


def available_cpus() -> int:
    """How many CPUs this process may run on (its affinity mask)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# ---------------------------------------------------------------------------------------------------------------
# what the compiler says


def _run(cmd: list[str], src: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(cmd, input=src, capture_output=True, text=True, timeout=120, check=False)


def _isa(cc: str, flags: list[str]) -> frozenset[str]:
    """The ISA extensions from the compiler's predefined macros (any C compiler answers -dM -E)."""
    out = _run([cc, *flags, "-dM", "-E", "-x", "c", "-"]).stdout
    defined = {ln.split()[1] for ln in out.splitlines() if ln.startswith("#define ")}
    return frozenset(name for macro, name in _ISA_MACROS.items() if macro in defined)


_TARGET_OPTION = re.compile(r"^\s+(-m[\w.-]+)\s+\[(enabled|disabled)\]", re.M)


def _target(cc: str, flags: list[str]) -> tuple[frozenset[str] | None, int | None]:
    """One question to gcc (`-Q --help=target`, one compiler start, ~7 ms): the ISA extensions its -m options enable
    (None where it lists none of them: not an x86 gcc, so `_isa` asks the macros) and the bytes its tuning prefers
    for auto-vectorized loops (None: no preference, the widest register). The options and the macros agree (a test
    asks both)."""
    out = _run([cc, *flags, "-Q", "--help=target"]).stdout
    m = re.search(r"-mprefer-vector-width=\s+(\w+)", out)
    width = int(m.group(1)) // 8 if m and m.group(1).isdigit() else None
    states = dict(_TARGET_OPTION.findall(out))
    if not any(opt in states for opt in _ISA_OPTIONS):
        return None, width
    return frozenset(name for opt, name in _ISA_OPTIONS.items() if states.get(opt) == "enabled"), width


def _native_isa(cc: str, flags: list[str]) -> frozenset[str] | None:
    """The ISA extensions gcc's driver expands `-march=native` into, from the cc1 command `-###` prints without running
    it (a driver start, ~2 ms, where `-Q --help=target` starts cc1: ~9 ms of an empty cache's first call). None where
    the flags hold other -m options (an -mno-avx512f there disables what it implies, which only cc1 works out) or the
    driver prints no such command (not gcc)."""
    if "-march=native" not in flags or any(
        f.startswith("-m") and f != "-march=native" and not f.startswith(("-mtune=", "-mprefer-vector-width="))
        for f in flags
    ):
        return None
    out = _run([cc, *flags, "-###", "-S", "-x", "c", "-o", os.devnull, os.devnull]).stderr
    cc1 = next((ln for ln in out.splitlines() if re.match(r'\s*"?\S*/cc1"? ', ln)), None)
    if cc1 is None:
        return None
    enabled: dict[str, bool] = {}
    for no, name in _CC1_OPTION.findall(cc1):  # in order: a later option overrides an earlier one
        enabled["-m" + name] = not no
    if "-mavx" not in enabled and "-msse4.2" not in enabled:  # not the expansion of a native x86 target
        return None
    return frozenset(name for opt, name in _ISA_OPTIONS.items() if enabled.get(opt))


_CC1_OPTION = re.compile(r'(?<=\s)"?-m(no-)?([a-z][\w.-]*)(?=[\s"])')


def _isa_and_width(cc: str, flags: list[str]) -> tuple[frozenset[str], int | None]:
    isa, width = _target(cc, flags)
    return (isa if isa is not None else _isa(cc, flags)), width


def _assembles(cc: str, flags: list[str]) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="uopc-canary-") as d:
        p = _run([cc, *flags, "-c", "-x", "c", "-", "-o", os.path.join(d, "canary.o")], _CANARY)
    return p.returncode == 0, p.stderr.strip()


def _probe_compiler(cc: str, flags: list[str]) -> Machine:
    extra: list[str] = []
    notes: list[str] = []
    user_width = any(f.startswith("-mprefer-vector-width") for f in flags)
    native = _native_isa(cc, flags)
    # where uopc's rule decides the width, gcc's preference is not asked: the driver's expansion is the whole answer
    ruled = native is not None and not user_width and any(name in native for name in VECTOR_WIDTH_RULE)
    if ruled:
        isa, auto = native, None
    else:
        isa, auto = _isa_and_width(cc, flags)  # one gcc start (two, the macros asked too, where it is not gcc)
    if "avx512fp16" in isa:
        # the canary with and without the extension, and the width without it, at once (in sequence they took
        # ~75 ms of an empty cache's first call on a Xeon whose assembler rejects the extension)
        alt = [*flags, "-mno-avx512fp16"]
        with ThreadPoolExecutor(2) as pool:
            alt_ok, alt_width = pool.submit(_assembles, cc, alt), pool.submit(_target, cc, alt)
            ok, err = _assembles(cc, flags)
            if not ok and alt_ok.result()[0]:
                extra.append("-mno-avx512fp16")
                first = err.splitlines()[-1] if err else "an error"
                notes.append(f"the assembler rejects AVX512-FP16 code ({first}): compiling with -mno-avx512fp16")
                isa = isa - {"avx512fp16"}
                auto = alt_width.result()[1]  # (the width with the flag the assembler needs)
    vector = 64 if "avx512f" in isa else 32 if "avx" in isa else 16
    auto = auto or vector
    want = max((w for name, w in VECTOR_WIDTH_RULE.items() if name in isa), default=auto)
    if ruled:  # (whatever gcc's tuning prefers: the flag is redundant where it prefers the rule's width already)
        extra.append(f"-mprefer-vector-width={want * 8}")
        notes.append(f"auto-vectorized loops at {want * 8} bits, uopc's rule for this ISA")
        auto = want
    elif want > auto and not user_width:
        extra.append(f"-mprefer-vector-width={want * 8}")
        notes.append(
            f"the compiler prefers {auto * 8}-bit auto-vectorized loops: uopc's rule for this ISA is {want * 8}"
        )
        auto = want
    return Machine(
        model=cpu_model(),
        isa=isa,
        vector_bytes=vector,
        auto_vector_bytes=min(auto, vector),
        vector_registers=32 if "avx512f" in isa else 16,
        cores=available_cpus(),
        l1d_bytes=_cache_size(1, ("Data", "Unified"), 32 << 10),
        l2_bytes=_cache_size(2, ("Unified", "Data"), 1 << 20),
        l3_bytes=_cache_size(3, ("Unified",), 8 << 20),
        extra_flags=tuple(extra),
        notes=tuple(notes),
    )


def _record_path(cache_dir: str, key: str) -> str:
    return os.path.join(cache_dir, "machine", f"{key}.json")


def _load_record(path: str) -> Machine | None:
    try:
        with open(path) as f:
            d = json.load(f)
        d["isa"], d["extra_flags"], d["notes"] = frozenset(d["isa"]), tuple(d["extra_flags"]), tuple(d["notes"])
        return Machine(**d)
    except (OSError, ValueError, TypeError, KeyError):
        return None


_probed: dict[tuple, Machine] = {}


def probe(cc_path: str, flags: list[str], cc_version: str = "", cache_dir: str | None = None) -> Machine:
    """The Machine for code compiled by `cc_path` with `flags`: from memory, from the record on disk in
    `cache_dir`, or asked of the compiler (and recorded). Cores come from the affinity mask each time a new
    process asks, so a record never carries another process's mask."""
    memo = (cc_path, tuple(flags), cc_version, cache_dir)
    if memo in _probed:
        return _probed[memo]
    key = hashlib.sha256(
        "\0".join([f"probe-v{PROBE_VERSION}", cc_path, cc_version, *flags, cpu_fingerprint()]).encode()
    ).hexdigest()[:32]
    m = _load_record(_record_path(cache_dir, key)) if cache_dir else None
    if m is None:
        m = _probe_compiler(cc_path, flags)
        if cache_dir:
            d = asdict(m)
            d["isa"], d["extra_flags"], d["notes"] = sorted(m.isa), list(m.extra_flags), list(m.notes)
            with contextlib.suppress(OSError):
                atomic_write(_record_path(cache_dir, key), json.dumps(d).encode())
    cores = available_cpus()
    if m.cores != cores:
        m = replace(m, cores=cores)
    _probed[memo] = m
    return m

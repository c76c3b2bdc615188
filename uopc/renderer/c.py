"""The C renderer: a lowered SINK -> one readable C function.

    void e_2_4(float* restrict data0, float* restrict data1) {
      for (int ridx0 = 0; ridx0 < 8; ridx0++) {
        float val1 = data0[ridx0];
        data1[ridx0] = ((val1*2.0f)+1.0f);
      }
    }

Names follow the chapters: `dataN` parameters by buffer slot, `ridxN` loops, `accN` accumulators,
`valN` loads, `aluN` values used more than once (or computed outside the loop that uses them).
Each op's C form is one entry of a table.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from enum import IntEnum
from functools import partial
from typing import NamedTuple

import numpy as np

from uopc import helpers
from uopc.codegen.error_record import ERROR_RECORD, ErrorField
from uopc.codegen.linearize import Linearized, Loop, linearize
from uopc.renderer.attention import render_attention
from uopc.renderer.c_masked import masked_helpers
from uopc.renderer.c_math import F32_BITS, MATH, render_math
from uopc.renderer.c_select import gated_load, gated_vector_load, kept_stores, render_where
from uopc.renderer.flags import flags_line
from uopc.renderer.half import c_conversion, compute_in_float
from uopc.renderer.prefetch import streamed_loads
from uopc.renderer.winograd import render_winograd
from uopc.uop import ALU, OWN_KERNEL, AxisType, Ops, UOp
from uopc.uop.dtype import DType, dtypes, float_to_bf16_bits
from uopc.uop.variable import Variable

# No #include: <math.h> and <stdint.h> were a third of gcc's time on a small kernel (measured: 81 vs 48 ms for a
# 64-element loop, -O3). The integer types come from gcc's predefined macros, inf and NaN and libm from its builtins.
# The prelude and every helper are guarded (#ifndef), so that kernel units concatenate into one translation unit:
# the runtime compiles several small kernels in one gcc run (uopc.runtime.objects).
PRELUDE = """#ifndef UOPC_PRELUDE
#define UOPC_PRELUDE
typedef __INT8_TYPE__ int8_t;
typedef __UINT8_TYPE__ uint8_t;
typedef __INT16_TYPE__ int16_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __INT32_TYPE__ int32_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __INT64_TYPE__ int64_t;
typedef __UINT64_TYPE__ uint64_t;
#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#if defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__
#error "uopc kernels need IEEE inf and NaN: remove -ffast-math / -ffinite-math-only from CFLAGS"
#endif
#endif
"""

# floor division and modulo with Python's semantics; x/0 and x%0 give 0 (as NumPy does), INT_MIN/-1 wraps
_FLOORDIV = """static inline {t} uopc_idiv_{n}({t} a, {t} b) {{
  if (b == 0) return 0;
  if (b == -1) return ({t})(0u - ({u})a);
  {t} q = a / b;
  return q - ((a % b != 0) & ((a < 0) != (b < 0)));
}}
static inline {t} uopc_mod_{n}({t} a, {t} b) {{
  if (b == 0 || b == -1) return 0;
  {t} r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}}
"""
# Every index check, as one function: in range (i..i+w-1 within [lo, n): w > 1 for a vector access), the index is
# used as is, a negative one counting from the end; out of range, the first failure of the run fills the error
# record `err` (uopc.codegen.error_record; atomically, as OpenMP threads may fail at once) for the runtime to raise,
# and element 0 is used instead, so a bad index never reads or writes outside its buffer. A data-dependent index
# (CHECK) passes its kernel's error record; UOPC_CHECK_OOB's bounds checks pass uopc_oob: in a plan the kernel's
# parameter (each call has its own), standalone a global the runtime reads.
_RECORD_WORDS = ", ".join(f.name.lower() for f in ErrorField)
_CHECK = """/* err: {words} */
static inline long long uopc_check(long long* err, long long i, long long w, long long lo, long long n,
                                   long long which) {{
  if (i >= lo && i + w <= n) return i < 0 ? i + n : i;
  long long none = 0;
  if (__atomic_compare_exchange_n(&err[{FAILED}], &none, 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {{
    err[{INDEX}] = i < lo ? i : i + w - 1; err[{LOW}] = lo; err[{SIZE}] = n; err[{WHICH}] = which;
  }}
  return 0;
}}
""".format(words=_RECORD_WORDS, **{f.name: f.value for f in ErrorField})
_OOB_RECORD = f"long long uopc_oob[{ERROR_RECORD}];  /* the first failed bounds check: {_RECORD_WORDS} */\n"
_UNSIGNED_DIV = """static inline {t} uopc_idiv_{n}({t} a, {t} b) {{ return b == 0 ? 0 : a / b; }}
static inline {t} uopc_mod_{n}({t} a, {t} b) {{ return b == 0 ? 0 : a % b; }}
"""


_NARROW_WRAP = {Ops.ADD, Ops.MUL, Ops.NEG, Ops.IDIV, Ops.MOD}

_INFIX = {
    Ops.ADD: "+",
    Ops.MUL: "*",
    Ops.CMPLT: "<",
    Ops.CMPNE: "!=",
    Ops.AND: "&",
    Ops.OR: "|",
    Ops.XOR: "^",
}


class Rank(IntEnum):
    """A helper's place before the kernel: after every helper of a lower rank, which it may use (then by name, so that
    a plan's kernels sharing helpers render them in one order)."""

    TYPES = 0  # vector typedefs
    SHARED = 1  # definitions other helpers use (F32_BITS's bit casts)
    FUNCTIONS = 2  # what the kernel itself uses: conversions, checks, math, the error record


class Helper(NamedTuple):
    """A C definition a kernel needs before it, keyed by the name it defines (a plan's kernels share one copy)."""

    rank: Rank
    code: str


def _helper_text(hs: dict[str, Helper]) -> str:
    """The helpers' definitions in the order their ranks give, each under an include guard named by what it defines
    and a digest of its code: units concatenate (see PRELUDE), and two different definitions of one name would fail
    to compile rather than one silently standing for the other."""
    return "".join(_guarded(name, h.code) for name, h in sorted(hs.items(), key=lambda kv: (kv[1].rank, kv[0])))


def _guarded(name: str, code: str) -> str:
    ident, digest = re.sub(r"\W", "_", name), hashlib.sha256(code.encode()).hexdigest()[:8]
    body = code if code.endswith("\n") else code + "\n"
    return f"#ifndef UOPC_HAVE_{ident}_{digest}\n#define UOPC_HAVE_{ident}_{digest}\n{body}#endif\n"


def _base(buf: UOp) -> UOp:
    """The BUFFER or ALLOC an INDEX addresses, past the AFTER nodes that only order its uses."""
    while buf.op is Ops.AFTER:
        buf = buf.src[0]
    return buf


def render_const(v, dt: DType) -> str:
    """A C literal of dtype `dt` (INFINITY/NAN for the non-finite floats)."""
    if dt.is_bool:
        return "1" if v else "0"
    if dt.is_16bit_float:  # its bits
        with np.errstate(over="ignore"):  # from 65520 up a half is inf
            x = np.array([v], np.float32 if dt is dtypes.bfloat16 else np.float16)
        bits = float_to_bf16_bits(x) if dt is dtypes.bfloat16 else x.view(np.uint16)
        return f"0x{int(bits[0]):04x}"
    if dt.is_float:
        suffix = "f" if dt is not dtypes.float64 else ""
        if math.isnan(v):
            s = "NAN"
        elif math.isinf(v):
            s = "INFINITY" if v > 0 else "-INFINITY"
        else:
            s = repr(float(v)) + suffix
        return s
    if dt.is_unsigned:
        return f"{v}u" if dt.itemsize <= 4 else f"{v}ull"
    if v == dt.min:  # -2147483648 is not a literal in C: it is -(2147483648), which is a long
        return f"({v + 1}{'LL' if dt.itemsize == 8 else ''}-1)"
    return f"{v}LL" if dt.itemsize == 8 else str(v)


class CRenderer:
    """Renders one linearized kernel as C; `code_for_op` maps each ALU op to its C expression."""

    code_for_op: dict[Ops, Callable[[CRenderer, UOp], str]]

    def __init__(self, lin: Linearized, guarded: bool = False):
        self.lin = lin
        self.guarded = guarded  # its buffers have helpers.STORAGE_GUARD bytes around them (a plan's kernel)
        self.names: dict[UOp, str] = {}
        self.n = 0
        self.lines: list[str] = []
        self.helpers: dict[str, Helper] = {}
        self.check_oob = bool(helpers.settings().CHECK_OOB)
        self.kept_stores = kept_stores(lin)
        self.deferred = {ld for ld, _ in self.kept_stores.values()}
        # a streamed load -> the elements ahead it prefetches into L1, and into L2 (or 0) (renderer.prefetch)
        self.prefetched: dict[UOp, tuple[int, int]] = {}

    def use(self, name: str, code: str, rank: Rank = Rank.FUNCTIONS) -> None:
        """Put helper `code`, which defines `name`, before the kernel."""
        self.helpers[name] = Helper(rank, code)

    def use_bits(self) -> None:
        """Put the float <-> integer bit casts (uopc_as_u32, ...) before the helpers that use them."""
        self.use("F32_BITS", F32_BITS, Rank.SHARED)

    def check(self, err: str, i: str, w: int, lo: int, n: int, which: int) -> str:
        """Index `i` (a C expression) checked to address elements i..i+w-1 of [lo, n) (see _CHECK); a failure fills
        the error record `err` with `which`."""
        self.use("uopc_check", _CHECK)
        return f"uopc_check({err}, {i}, {w}, {lo}, {n}, {which})"

    def var(self, u: UOp, prefix: str) -> str:
        self.n += 1
        self.names[u] = f"{prefix}{self.n}"
        return self.names[u]

    def needs_var(self, u: UOp) -> bool:
        """Compute into a named variable: used more than once, or hoisted out of its user's loop."""
        if u.op is Ops.SHUFFLE:  # a transpose's stage: both of the next stage's shuffles read it
            return True
        if u.op not in ALU:
            return False
        users = self.lin.users[u]
        if any(x.op is Ops.MAX and x.dtype.is_float for x in users):  # a float max writes its first operand 3 times
            return True
        if any(x.op is Ops.VECTORIZE and all(s is u for s in x.src) for x in users):  # a broadcast reads it per lane
            return True
        return len(users) > 1 or any(self.lin.scope[x] != self.lin.scope[u] for x in users)

    def expr(self, u: UOp) -> str:
        if u in self.names:
            return self.names[u]
        if u.op in _NARROW_WRAP and u.dtype is not None and u.dtype.is_int and u.dtype.itemsize < 4:
            # C computes narrow ints in int: cast back so int8 100+100 wraps to -56, as NumPy and PyTorch do
            return f"(({u.dtype.cname}){self._expr(u)})"
        return self._expr(u)

    def _expr(self, u: UOp) -> str:
        fn = self.code_for_op.get(u.op)
        if fn is None:
            raise NotImplementedError(f"render_c: no C form for {u.op}")
        return fn(self, u)

    def divmod(self, u: UOp) -> str:
        a, b = u.src
        sym = "/" if u.op is Ops.IDIV else "%"
        if b.op is Ops.CONST and b.arg > 0 and a.vmin >= 0:  # C truncation equals floor here
            return f"({self.expr(a)}{sym}{self.expr(b)})"
        dt = u.dtype
        tag = dt.name
        tmpl = _UNSIGNED_DIV if dt.is_unsigned else _FLOORDIV
        unsigned = {1: "uint8_t", 2: "uint16_t", 4: "uint32_t", 8: "uint64_t"}[dt.itemsize]
        self.use(f"uopc_idiv_{tag}", tmpl.format(t=dt.cname, n=tag, u=unsigned))
        fn = "idiv" if u.op is Ops.IDIV else "mod"
        return f"uopc_{fn}_{tag}({self.expr(a)}, {self.expr(b)})"

    def address(self, idx: UOp) -> str:
        base, i = _base(idx.src[0]), idx.src[1]
        if idx.dtype.count > 1 and base.op is Ops.BUFFER:
            return self.vector_address(idx, base)
        return self.ref(base, self.expr(i))

    def ref(self, base: UOp, i: str) -> str:
        """The C lvalue of element `i` (a C expression) of an ALLOC or BUFFER."""
        if base.op is Ops.ALLOC:
            return self.names[base] if base.arg[1] == 1 else f"{self.names[base]}[{i}]"
        if self.check_oob:  # the buffer's slot names it in the error
            return f"data{base.arg.slot}[{self.check('uopc_oob', i, 1, 0, base.arg.shape[0], base.arg.slot)}]"
        return f"data{base.arg.slot}[{i}]"

    def vector_address(self, idx: UOp, buf: UOp) -> str:
        """A vector of elements i..i+w-1 of a buffer, as an lvalue: aligned only when i is a proven multiple of w
        (uopc's buffers start on 64-byte boundaries), else the unaligned type (vmovups costs the same there)."""
        w, i = idx.dtype.count, self.expr(idx.src[1])
        vt = idx.dtype.cname if _multiple_of(idx.src[1], w) else f"{idx.dtype.cname}_u"
        if self.check_oob:  # the whole span i..i+w-1
            i = self.check("uopc_oob", i, w, 0, buf.arg.shape[0], buf.arg.slot)
        return f"(*({vt}*)(data{buf.arg.slot}+{i}))"

    def masked(self, idx: UOp, val: str | None = None) -> str:
        """The masked load (or, with `val`, store) of a partial vector: idx.arg lanes from element i (c_masked)."""
        buf, m, i = _base(idx.src[0]), idx.arg, self.expr(idx.src[1])
        self.use(*masked_helpers(idx.dtype))
        if self.check_oob:  # the valid lanes only
            i = self.check("uopc_oob", i, m, 0, buf.arg.shape[0], buf.arg.slot)
        t, ptr = idx.dtype.cname, f"data{buf.arg.slot}+{i}"
        return f"uopc_mload_{t}({ptr}, {m})" if val is None else f"uopc_mstore_{t}({ptr}, {val}, {m})"

    def emit(self, u: UOp, ind: str) -> None:
        op = u.op
        if op is Ops.LOAD:
            idx = u.src[0]
            if len(idx.src) > 2:  # gated: PAD's out-of-range elements are never read
                (gated_vector_load if u.dtype.count > 1 else gated_load)(self, u, ind)
                return
            if u in self.deferred:  # read by its store, only where the store needs it (_kept_stores)
                return
            ref = self.address(idx) if idx.arg is None else self.masked(idx)
            name = self.var(u, "val")
            self.lines.append(f"{ind}{u.dtype.cname} {name} = {ref};")
            if (ahead := self.prefetched.get(u)) is not None:
                at = f"data{_base(idx.src[0]).arg.slot}+{self.expr(idx.src[1])}"
                self.lines.append(f"{ind}__builtin_prefetch({at}+{ahead[0]});")
                if ahead[1]:  # and far ahead into L2 (RangeArg.prefetch)
                    self.lines.append(f"{ind}__builtin_prefetch({at}+{ahead[1]}, 0, 2);")
        elif op is Ops.STORE and u in self.kept_stores:
            ld, new = self.kept_stores[u]
            cond = self.expr(u.src[1].src[0])
            if ld is u.src[1].src[1]:
                cond = f"!{cond}"
            out, old = self.address(u.src[0]), self.address(ld.src[0])
            p_out, p_in = (f"data{_base(x.src[0]).arg.slot}" for x in (u.src[0], ld.src[0]))
            self.lines.append(f"{ind}if ({cond}) {out} = {self.expr(new)};")
            self.lines.append(f"{ind}else if ((void*){p_out} != (void*){p_in}) {out} = {old};")
        elif op is Ops.STORE and u.src[0].arg is not None:  # a partial vector (codegen.lanes): its valid lanes
            self.lines.append(f"{ind}{self.masked(u.src[0], self.expr(u.src[1]))};")
        elif op is Ops.STORE:
            val = self.expr(u.src[1])
            self.lines.append(f"{ind}{self.address(u.src[0])} = {val};")
        elif op is Ops.CHECK:  # checked once, into a variable, where the index is first needed
            val = self.expr(u)
            name = self.var(u, "gidx")
            self.lines.append(f"{ind}{u.dtype.cname} {name} = {val};")
        elif op is Ops.ALLOC:
            n, size = u.arg
            self.names[u] = f"acc{n}"
            arr = f"[{size}]" if size > 1 else ""
            self.lines.append(f"{ind}{u.dtype.cname} acc{n}{arr};")
        elif u.op is Ops.VECTORIZE and u.src[0].op is not Ops.CONST and all(x is u.src[0] for x in u.src):
            # a broadcast of a value, named once (a constant one stays inline, where gcc folds it)
            name = self.var(u, "alu")
            self.lines.append(f"{ind}{u.dtype.cname} {name} = {self._expr(u)};")
        elif self.needs_var(u):
            val = self.expr(u)
            name = self.var(u, "alu")
            self.lines.append(f"{ind}{u.dtype.cname} {name} = {val};")

    def loop(self, lp: Loop, ind: str) -> None:
        for x in lp.body:
            if isinstance(x, Loop):
                r = x.rng
                name = f"ridx{r.arg.idx}"
                self.names[r] = name
                if r.arg.kind is AxisType.THREAD:
                    self.lines.append(f"{ind}#pragma omp parallel for")
                self.lines.append(f"{ind}for ({r.dtype.cname} {name} = 0; {name} < {self.expr(r.src[0])}; {name}++) {{")
                if r.arg.kind is AxisType.REDUCE:
                    self.prefetched.update(streamed_loads(x))
                self.loop(x, ind + "  ")
                self.lines.append(f"{ind}}}")
            else:
                self.emit(x, ind)


def _infix(sym: str) -> Callable[[CRenderer, UOp], str]:
    def render(r: CRenderer, u: UOp) -> str:
        if u.dtype is dtypes.bool and u.op in _BOOL_INFIX:  # bool + is OR, * is AND (C would make 2)
            return f"({r.expr(u.src[0])}{_BOOL_INFIX[u.op]}{r.expr(u.src[1])})"
        return f"({r.expr(u.src[0])}{sym}{r.expr(u.src[1])})"

    return render


_BOOL_INFIX = {Ops.ADD: "|", Ops.MUL: "&"}


# A scalar float max, NaN-propagating from either side: `a > b ? a : b` is one maxss (which keeps b when either is
# NaN), then a NaN in a is put back. gcc compiled the one-select form `((a > b) | (a != a)) ? a : b` outside a loop
# it vectorizes to compare-and-jump, which a max over few values mispredicts about every third time on random data.
# Into an accumulator (a pooling window's reduce), measured on Zen 4 (one process, medians): 3x3/2 over (1, 64, 112,
# 112) 2.9 -> 0.85 ms, 2x2 over (128, 16, 28, 28) 0.58 -> 0.19 ms. Elementwise too: a 2x2 window unrolled over
# stride-2 reads (the CNN step's second pool, (128, 32, 14, 14)) ran 1.05 ms against 0.087 ms with the helper in a C
# harness on random data, and where gcc vectorizes (a ReLU, a max of two arrays) the helper ran 0.063 and 0.084 ms
# against the select's 0.068 and 0.089 over 1M floats. Vectors (SIMD code) keep the select of their lanes.
_MAXF = "static inline {t} {name}({t} a, {t} b) {{ {t} m = a > b ? a : b; return a != a ? a : m; }}\n"


def _max(r: CRenderer, u: UOp) -> str:
    a, b = r.expr(u.src[0]), r.expr(u.src[1])
    if u.dtype.is_float and u.dtype.count == 1:
        name = "uopc_maxf" if u.dtype is dtypes.float32 else "uopc_max"
        r.use(name, _MAXF.format(t=u.dtype.cname, name=name))
        return f"{name}({a}, {b})"
    if u.dtype.is_float:  # NaN-propagating, as NumPy's maximum
        return f"((({a}>{b})|({a}!={a}))?{a}:{b})"  # `|`, not `||`: one condition for the vectorizer to pack
    return f"(({a}>{b})?{a}:{b})"


def _cast(r: CRenderer, u: UOp) -> str:
    x = u.src[0]
    conv = c_conversion(u.dtype, x.dtype)  # float32 <-> 16 bits (uopc.renderer.half leaves no other casts of them)
    if conv is not None:
        key, code, fn = conv
        r.use(key, code)
        return f"{fn}({r.expr(x)})"
    if u.dtype.count > 1:  # other vectors of 16-bit floats are never made (uopc.codegen.vectorize)
        raise NotImplementedError(f"render_c: no C form for a vector cast to {u.dtype!r}")
    return f"(({u.dtype.cname})({r.expr(x)}))"


def _multiple_of(i: UOp, w: int) -> bool:
    """Is index expression `i` a multiple of `w` for every value of its loops?"""
    if i.op is Ops.CONST:
        return i.arg % w == 0
    if i.op is Ops.MUL:
        return any(s.op is Ops.CONST and s.arg % w == 0 for s in i.src) or any(_multiple_of(s, w) for s in i.src)
    if i.op is Ops.ADD:
        return all(_multiple_of(s, w) for s in i.src)
    return False


def _shuffle_mask(vt: DType) -> DType:
    """The integer vector of a shuffle's lane indices for vectors `vt` (gcc's __builtin_shuffle: lanes of the size of
    vt's)."""
    return {1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[vt.scalar().itemsize].vec(vt.count)


# two vectors' lanes picked by constant indices: gcc's __builtin_shuffle takes them as a vector of ints, clang's
# __builtin_shufflevector as arguments
_SHUFFLE = """#if defined(__clang__)
#define UOPC_SHUFFLE(a, b, mask, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define UOPC_SHUFFLE(a, b, mask, ...) __builtin_shuffle(a, b, (mask){__VA_ARGS__})
#endif"""


def _shuffle(r: CRenderer, u: UOp) -> str:
    if len(u.src) == 1:  # the first lanes of one vector: its low bytes, which gcc reads as the narrower register
        src, dst = u.src[0].dtype.cname, u.dtype.cname
        name = f"uopc_low_{dst}_{src}"
        r.use(name, f"static inline {dst} {name}({src} v) {{ {dst} x; __builtin_memcpy(&x, &v, sizeof x); return x; }}")
        return f"{name}({r.expr(u.src[0])})"
    r.use("UOPC_SHUFFLE", _SHUFFLE, Rank.SHARED)
    lanes = ", ".join(map(str, u.arg))
    return f"UOPC_SHUFFLE({r.expr(u.src[0])}, {r.expr(u.src[1])}, {_shuffle_mask(u.dtype).cname}, {lanes})"


def _vector_typedefs(ast: UOp) -> dict[str, Helper]:
    """gcc vector types for every vector dtype the kernel uses: `f32x16` (64-byte aligned) and `f32x16_u` (aligned
    as its elements), keyed like the other helpers."""
    out = {}
    nodes = ast.toposort()
    vts = {u.dtype for u in nodes if u.dtype is not None and u.dtype.count > 1}
    for vt in vts | {_shuffle_mask(u.dtype) for u in nodes if u.op is Ops.SHUFFLE}:
        sc, size = vt.scalar(), vt.itemsize
        code = (
            f"typedef {sc.cname} {vt.cname} __attribute__((vector_size({size})));\n"
            f"typedef {sc.cname} {vt.cname}_u __attribute__((vector_size({size}), aligned({sc.itemsize})));\n"
        )
        out[vt.cname] = Helper(Rank.TYPES, code)
    return out


def _check(r: CRenderer, u: UOp) -> str:
    n, which, lo = u.arg  # a data-dependent index: its kernel's error record is src[1], a symbolic size src[2]
    if len(u.src) > 2:
        n = r.expr(u.src[2])
        lo = f"-{n}" if lo else 0
    return f"(({u.dtype.cname}){r.check(f'data{u.src[1].arg.slot}', r.expr(u.src[0]), 1, lo, n, which)})"


# op -> C expression. Each entry renders one node from its sources' expressions.
code_for_op: dict[Ops, Callable[[CRenderer, UOp], str]] = {
    Ops.CONST: lambda r, u: render_const(u.arg, u.dtype),
    Ops.AFTER: lambda r, u: r.expr(u.src[0]),  # ordering only: the value is its first source's
    Ops.INDEX: lambda r, u: r.address(u),
    **{op: _infix(sym) for op, sym in _INFIX.items()},
    Ops.NEG: lambda r, u: f"(-{r.expr(u.src[0])})",
    Ops.MAX: _max,
    Ops.WHERE: render_where,
    Ops.RECIP: lambda r, u: f"({render_const(1.0, u.dtype)}/{r.expr(u.src[0])})",
    **{op: render_math for op in MATH},
    Ops.CAST: _cast,
    Ops.CHECK: _check,
    Ops.IDIV: lambda r, u: r.divmod(u),
    Ops.MOD: lambda r, u: r.divmod(u),
    # SIMD (gcc vector extension): pack lanes, read one lane
    Ops.VECTORIZE: lambda r, u: f"(({u.dtype.cname}){{{', '.join(r.expr(s) for s in u.src)}}})",
    Ops.GEP: lambda r, u: f"({r.expr(u.src[0])}[{u.arg}])",
    Ops.SHUFFLE: lambda r, u: _shuffle(r, u),
    Ops.DEFINE_VAR: lambda r, u: u.arg.cname,
}
CRenderer.code_for_op = code_for_op


class CFunction(NamedTuple):
    """One rendered kernel, under whatever name the caller gives it: its helpers, parameters and statements."""

    helpers: dict[str, Helper]
    params: tuple[str, ...]  # `float* restrict data0`, ..., then `int var_pos`, ...
    body: str  # the statements, indented
    bufs: list[UOp]  # its BUFFERs, by slot
    vars: tuple[Variable, ...] = ()  # the symbolic sizes its loops run to (uopc.uop.variable), by name
    ptr_types: tuple[str, ...] = ()  # the C element type of each of bufs (see _storage_ctype)

    def declaration(self, name: str) -> str:
        return f"void {name}({', '.join(self.params)})"

    def definition(self, name: str) -> str:
        return f"{self.declaration(name)} {{\n{self.body}\n}}\n"


def _storage_ctype(dt: DType, accumulates: bool) -> str:
    """The C element type of a buffer of `dt` in a kernel. In a kernel without accumulators a bool buffer is
    unsigned char (the same 0 and 1 bytes): gcc does not vectorize a loop that loads a `_Bool` from memory (a
    select on a stored mask, ReLU's backward: 3.67 -> 0.81 ms over (128, 16, 28, 28)). A kernel with accumulators
    keeps `_Bool`: vectorized, a masked sum would be reassociated (-fassociative-math), and a scan's blocked sums
    must keep their order (the torch sweep's cumsum row with 1e30 and -1e30 among small values)."""
    return "unsigned char" if dt is dtypes.bool and not accumulates else dt.cname


def _render_function(ast: UOp, oob_param: bool = False, guarded: bool = False) -> CFunction:
    """One kernel as C; `oob_param`: UOPC_CHECK_OOB's error record is its last parameter (in a plan), not a global;
    `guarded`: its buffers are uopc's storage, with guard bytes around them (CRenderer.gated_load)."""
    if ast.src and ast.src[0].op in OWN_KERNEL:  # C of their own (renderer.attention, renderer.winograd)
        if ast.src[0].op is Ops.ATTENTION:
            hs, params, body, bufs, avars, ptr_types = render_attention(ast)
        else:  # (an output transform's epilogue is rendered by scalar_code)
            hs, params, body, bufs, avars, ptr_types = render_winograd(ast, partial(scalar_code, guarded=guarded))
        fhelpers = {n: Helper(Rank(h[0]), h[1]) for n, h in hs.items()}
        if helpers.settings().CHECK_OOB and oob_param:  # (only an epilogue's reads are checked), same signature
            params.append("long long* restrict uopc_oob")
        elif "uopc_check" in fhelpers:  # standalone: the runtime reads the global after each call
            fhelpers["uopc_oob"] = Helper(Rank.FUNCTIONS, _OOB_RECORD)
        return CFunction(fhelpers, tuple(params), body, bufs, avars, ptr_types)
    ast = compute_in_float(ast)  # float16 and bfloat16 only stored and converted: every op on them runs in float32
    lin = linearize(ast)
    r = CRenderer(lin, guarded)
    with helpers.deep_recursion():
        r.loop(lin.root, "  ")
    bufs = sorted({u for u in ast.toposort() if u.op is Ops.BUFFER}, key=lambda b: b.arg.slot)
    r.helpers.update(_vector_typedefs(ast))
    accumulates = any(u.op is Ops.ALLOC for u in lin.users)
    ptr_types = tuple(_storage_ctype(b.dtype, accumulates) for b in bufs)
    params = [f"{t}* restrict data{b.arg.slot}" for t, b in zip(ptr_types, bufs, strict=True)]
    defs = sorted({u for u in ast.toposort() if u.op is Ops.DEFINE_VAR}, key=lambda u: u.arg.name)
    if len({u.arg.name for u in defs}) != len(defs):
        raise ValueError(f"render_c: two Variables of one kernel share a name: {[u.arg for u in defs]}")
    params += [f"{u.dtype.cname} {u.arg.cname}" for u in defs]
    if r.check_oob and oob_param:
        params.append("long long* restrict uopc_oob")
    elif r.check_oob:  # standalone: the runtime reads the global after each call
        r.use("uopc_oob", _OOB_RECORD)
    return CFunction(r.helpers, tuple(params), "\n".join(r.lines), bufs, tuple(u.arg for u in defs), ptr_types)


def scalar_code(
    values: list[UOp], names: dict[UOp, str], first: int = 0, guarded: bool = False
) -> tuple[list[str], list[str], dict[str, Helper], int]:
    """C for scalar `values` (lowered expressions: loads, index arithmetic and ALU ops, as rangeify makes them) inside
    C written by another renderer (a Winograd output transform's epilogue, uopc.renderer.winograd): the nodes in
    `names` are the C expressions given (that code's loop indices, the value it would store), each load and each value
    used twice is a statement of its own, its variable numbered after `first`. Returns (the statements, the values'
    C expressions, the helpers they use, the last number taken)."""
    topo = UOp(Ops.SINK, tuple(values)).toposort(stop=names)[:-1]  # (nothing under a named node)
    users: dict[UOp, list[UOp]] = {u: [] for u in topo}
    for u in topo:
        for x in dict.fromkeys(() if u in names else u.src):
            users[x].append(u)
    r = CRenderer(Linearized(Loop(None), dict.fromkeys(topo, ()), users), guarded)
    r.n = first
    r.names.update(names)
    for u in topo:
        if u not in r.names:
            r.emit(u, "")
    return r.lines, [r.expr(v) for v in values], r.helpers, r.n


def render_c(ast: UOp, name: str, tiled: bool = False) -> str:
    """Render a lowered SINK as a C function `void name(T* restrict dataN, ...)` (with the prelude, after the flags
    line a plan's unit of it would have). `tiled`: it was lowered with a register tile (Opts.register_tile), see
    TILED_OPTIMIZE."""
    fn = _render_function(ast)
    head = flags_line([ast]) + PRELUDE + _helper_text(fn.helpers)
    return head + "\n" + optimize_attribute(tiled) + fn.definition(name)


# A kernel that keeps a register tile of vectors (the GEMM microkernel, convolutions through it) is compiled at gcc's
# -O1 with the -O2 passes it needs (FMA contraction is an "expensive optimization"; strict aliasing) when the flags
# are uopc's defaults (-O3). -O3 lets gcc unroll small loops completely even where the code grows (-fpeel-loops):
# around a tile uopc already unrolled (a convolution's taps around its MR x NR FMAs) the conv kernels ran up to 1.8x
# slower (ResNet-18 at batch 1 45.0 -> 32.4 ms at -O2). Its code is uopc's own vectors, so the rest of -O2 buys no
# speed: on a Zen 4, both forms in one process, alternating, ResNet-18 (batch 1 and 8), the CNN and char-GPT steps,
# GPT-2's forward and GEMMs 1x768x2304 to 1024^3 ran the same, and gcc took a quarter less on each tiled unit (the
# CNN step's largest three: 115/105/91 -> 85/78/76 ms), 8-10% of the CNN's and ResNet-18's cold gcc time. Other
# kernels keep -O3: small window loops that gcc unrolls and vectorizes there ran up to 4x slower at -O2 (the CNN
# step's pooling, 2.3x; ResNet's im2col copies, 2x), and some copies and small reductions 1.2-1.3x. Fused attention
# ran 2x slower under an -O2 attribute (attention 12x512x64 forward 3.7 -> 7.8 ms) though its whole unit compiled
# with -O2 flags ran as fast as -O3: the attribute is not the flag.
TILED_OPTIMIZE = '__attribute__((optimize("O1", "expensive-optimizations", "strict-aliasing"))) '


def optimize_attribute(tiled: bool) -> str:
    """The attributes of a kernel's definition: TILED_OPTIMIZE for a register-tiled kernel under uopc's default
    flags, else none."""
    return TILED_OPTIMIZE if tiled and helpers.settings().CFLAGS is None else ""

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

import math
from collections.abc import Callable

from uopc import helpers
from uopc.dtype import DType, dtypes
from uopc.linearize import Linearized, Loop, linearize
from uopc.uop import ALU, AxisType, Ops, UOp

PRELUDE = """#include <math.h>
#include <stdint.h>
#if defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__
#error "uopc kernels need IEEE inf and NaN: remove -ffast-math / -ffinite-math-only from CFLAGS"
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
# UOPC_CHECK_OOB=1: every buffer index goes through this check; the first failure is recorded for the
# runtime to raise (naming kernel, buffer, index and bound) and the access is redirected to element 0
_OOB_CHECK = """long long uopc_oob[4] = {0, 0, 0, 0};  /* failed, buffer slot, index, size */
static inline long long uopc_chk(long long i, long long n, long long slot) {
  if (i >= 0 && i < n) return i;
  if (!uopc_oob[0]) { uopc_oob[1] = slot; uopc_oob[2] = i; uopc_oob[3] = n; uopc_oob[0] = 1; }
  return 0;
}
"""
# a data-dependent index (GATHER): in range, it is used as is; out of range, the first failure of the run is recorded
# in the error record (atomically: OpenMP threads may fail at once) for the runtime to raise, and 0 is used instead,
# so a bad index never reads outside its buffer
_GATHER_CHECK = """static inline long long uopc_gchk(long long i, long long lo, long long n, long long* err,
                                      long long which) {
  if (i >= lo && i < n) return i < 0 ? i + n : i;
  long long none = 0;
  if (__atomic_compare_exchange_n(&err[0], &none, 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    err[1] = i; err[2] = lo; err[3] = n; err[4] = which;
  }
  return 0;
}
"""
# a vector access checks its whole span [i, i+w)
_OOB_CHECK_VEC = """static inline long long uopc_chkv(long long i, long long w, long long n, long long slot) {
  if (i >= 0 && i + w <= n) return i;
  if (!uopc_oob[0]) { uopc_oob[1] = slot; uopc_oob[2] = i < 0 ? i : i + w - 1; uopc_oob[3] = n; uopc_oob[0] = 1; }
  return 0;
}
"""
_UNSIGNED_DIV = """static inline {t} uopc_idiv_{n}({t} a, {t} b) {{ return b == 0 ? 0 : a / b; }}
static inline {t} uopc_mod_{n}({t} a, {t} b) {{ return b == 0 ? 0 : a % b; }}
"""

_MATH = {  # op -> (float, double) C function
    Ops.SQRT: ("sqrtf", "sqrt"),
    Ops.EXP2: ("exp2f", "exp2"),
    Ops.LOG2: ("log2f", "log2"),
    Ops.SIN: ("sinf", "sin"),
    Ops.TRUNC: ("truncf", "trunc"),
}

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


def render_const(v, dt: DType) -> str:
    """A C literal of dtype `dt` (INFINITY/NAN for the non-finite floats)."""
    if dt.is_bool:
        return "1" if v else "0"
    if dt.is_float:
        suffix = "f" if dt is not dtypes.float64 else ""
        if math.isnan(v):
            s = "NAN"
        elif math.isinf(v):
            s = "INFINITY" if v > 0 else "-INFINITY"
        else:
            s = repr(float(v)) + suffix
        return s if dt is not dtypes.float16 else f"(_Float16){s}"
    if dt.is_unsigned:
        return f"{v}u" if dt.itemsize <= 4 else f"{v}ull"
    if v == dt.min:  # -2147483648 is not a literal in C: it is -(2147483648), which is a long
        return f"({v + 1}{'LL' if dt.itemsize == 8 else ''}-1)"
    return f"{v}LL" if dt.itemsize == 8 else str(v)


class CRenderer:
    """Renders one linearized kernel as C; `code_for_op` maps each ALU op to its C expression."""

    code_for_op: dict[Ops, Callable[[CRenderer, UOp], str]]

    def __init__(self, lin: Linearized, name: str):
        self.lin, self.name = lin, name
        self.names: dict[UOp, str] = {}
        self.n = 0
        self.lines: list[str] = []
        self.helpers: dict[str, str] = {}
        self.check_oob = bool(helpers.CHECK_OOB)
        if self.check_oob:
            self.helpers["~oob"] = _OOB_CHECK

    def var(self, u: UOp, prefix: str) -> str:
        self.n += 1
        self.names[u] = f"{prefix}{self.n}"
        return self.names[u]

    def needs_var(self, u: UOp) -> bool:
        """Compute into a named variable: used more than once, or hoisted out of its user's loop."""
        if u.op not in ALU:
            return False
        users = self.lin.users[u]
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
        self.helpers[tag] = tmpl.format(t=dt.cname, n=tag, u=unsigned)
        fn = "idiv" if u.op is Ops.IDIV else "mod"
        return f"uopc_{fn}_{tag}({self.expr(a)}, {self.expr(b)})"

    def address(self, idx: UOp) -> str:
        buf, i = idx.src[0], idx.src[1]
        base = buf
        while base.op is Ops.AFTER:
            base = base.src[0]
        if base.op is Ops.ALLOC:
            size = base.arg[1]
            return self.names[base] if size == 1 else f"{self.names[base]}[{self.expr(i)}]"
        if idx.dtype.count > 1:
            return self.vector_address(idx, base)
        if self.check_oob:
            return f"data{base.arg.slot}[uopc_chk({self.expr(i)}, {base.arg.shape[0]}, {base.arg.slot})]"
        return f"data{base.arg.slot}[{self.expr(i)}]"

    def vector_address(self, idx: UOp, buf: UOp) -> str:
        """A vector of elements i..i+w-1 of a buffer, as an lvalue: aligned only when i is a proven multiple of w
        (uopc's buffers start on 64-byte boundaries), else the unaligned type (vmovups costs the same there)."""
        w, i = idx.dtype.count, self.expr(idx.src[1])
        vt = idx.dtype.cname if _multiple_of(idx.src[1], w) else f"{idx.dtype.cname}_u"
        if self.check_oob:
            self.helpers["~oobv"] = _OOB_CHECK_VEC
            i = f"uopc_chkv({i}, {w}, {buf.arg.shape[0]}, {buf.arg.slot})"
        return f"(*({vt}*)(data{buf.arg.slot}+{i}))"

    def emit(self, u: UOp, ind: str) -> None:
        op = u.op
        if op is Ops.LOAD:
            idx = u.src[0]
            ref = self.address(idx)
            if len(idx.src) > 2:  # gated: PAD's out-of-range elements are never read
                ref = f"({self.expr(idx.src[2])}?{ref}:{render_const(0, u.dtype)})"
            name = self.var(u, "val")
            self.lines.append(f"{ind}{u.dtype.cname} {name} = {ref};")
        elif op is Ops.STORE:
            self.lines.append(f"{ind}{self.address(u.src[0])} = {self.expr(u.src[1])};")
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


def _max(r: CRenderer, u: UOp) -> str:
    a, b = r.expr(u.src[0]), r.expr(u.src[1])
    if u.dtype.is_float:  # NaN-propagating, as NumPy's maximum
        return f"((({a}>{b})||({a}!={a}))?{a}:{b})"
    return f"(({a}>{b})?{a}:{b})"


def _multiple_of(i: UOp, w: int) -> bool:
    """Is index expression `i` a multiple of `w` for every value of its loops?"""
    if i.op is Ops.CONST:
        return i.arg % w == 0
    if i.op is Ops.MUL:
        return any(s.op is Ops.CONST and s.arg % w == 0 for s in i.src) or any(_multiple_of(s, w) for s in i.src)
    if i.op is Ops.ADD:
        return all(_multiple_of(s, w) for s in i.src)
    return False


def _vector_typedefs(ast: UOp) -> str:
    """gcc vector types for every vector dtype the kernel uses: `float16` (64-byte aligned) and `float16_u`."""
    out = []
    vts = {u.dtype for u in ast.toposort() if u.dtype is not None and u.dtype.count > 1}
    for vt in sorted(vts, key=lambda d: d.cname):
        sc, size = vt.scalar(), vt.itemsize
        out.append(f"typedef {sc.cname} {vt.cname} __attribute__((vector_size({size})));")
        out.append(f"typedef {sc.cname} {vt.cname}_u __attribute__((vector_size({size}), aligned({sc.itemsize})));")
    return "".join(x + "\n" for x in out)


def _math(r: CRenderer, u: UOp) -> str:
    f, d = _MATH[u.op]
    if u.dtype is dtypes.float16:  # no half-precision libm: compute in float, round back
        return f"((_Float16){f}((float){r.expr(u.src[0])}))"
    return f"{d if u.dtype is dtypes.float64 else f}({r.expr(u.src[0])})"


def _check(r: CRenderer, u: UOp) -> str:
    r.helpers["~gather"] = _GATHER_CHECK
    n, which, lo = u.arg
    return f"(({u.dtype.cname})uopc_gchk({r.expr(u.src[0])}, {lo}, {n}, data{u.src[1].arg.slot}, {which}))"


# op -> C expression. Each entry renders one node from its sources' expressions; another backend (CUDA) subclasses
# CRenderer and overrides entries of this table.
code_for_op: dict[Ops, Callable[[CRenderer, UOp], str]] = {
    Ops.CONST: lambda r, u: render_const(u.arg, u.dtype),
    Ops.AFTER: lambda r, u: r.expr(u.src[0]),  # ordering only: the value is its first source's
    Ops.INDEX: lambda r, u: r.address(u),
    **{op: _infix(sym) for op, sym in _INFIX.items()},
    Ops.NEG: lambda r, u: f"(-{r.expr(u.src[0])})",
    Ops.MAX: _max,
    Ops.WHERE: lambda r, u: f"({r.expr(u.src[0])}?{r.expr(u.src[1])}:{r.expr(u.src[2])})",
    Ops.RECIP: lambda r, u: f"({render_const(1.0, u.dtype)}/{r.expr(u.src[0])})",
    **{op: _math for op in _MATH},
    Ops.CAST: lambda r, u: f"(({u.dtype.cname})({r.expr(u.src[0])}))",
    Ops.CHECK: _check,
    Ops.IDIV: lambda r, u: r.divmod(u),
    Ops.MOD: lambda r, u: r.divmod(u),
    # SIMD (gcc vector extension): pack lanes, read one lane
    Ops.VECTORIZE: lambda r, u: f"(({u.dtype.cname}){{{', '.join(r.expr(s) for s in u.src)}}})",
    Ops.GEP: lambda r, u: f"({r.expr(u.src[0])}[{u.arg}])",
}
CRenderer.code_for_op = code_for_op


def render_c(ast: UOp, name: str) -> str:
    """Render a lowered SINK as a C function `void name(T* restrict dataN, ...)` (with the prelude)."""
    lin = linearize(ast)
    r = CRenderer(lin, name)
    with helpers.deep_recursion():
        r.loop(lin.root, "  ")
    bufs = sorted({u for u in ast.toposort() if u.op is Ops.BUFFER}, key=lambda b: b.arg.slot)
    params = ", ".join(f"{b.dtype.cname}* restrict data{b.arg.slot}" for b in bufs)
    head = PRELUDE + _vector_typedefs(ast) + "".join(r.helpers[k] for k in sorted(r.helpers))
    return head + f"\nvoid {name}({params}) {{\n" + "\n".join(r.lines) + "\n}\n"

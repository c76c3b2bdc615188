"""A fused attention kernel as C: flash attention's blocking on a CPU, for a lowered ATTENTION (codegen.attention).

    for each (batch, head, block of `rows` query rows), on threads:        (kind "out")
        for each block of BN keys (up to the causal limit):
            pack k^T and v of the block into L1 (zero past the last key)
            per query row: s = q . k^T (BN lanes, scaled into log2 units), masked to -inf;
                m' = max(m, max s), p = 2^(s - m'), l = l 2^(m - m') + sum p, acc = acc 2^(m - m') + p v
        out = acc / l

The scores of one row and block live in a BN-float array: no (L, S) tensor is ever stored. The backward kernels
recompute p = 2^(s - lse) block by block from the row statistic lse (kind "lse", the same loop without v): "dq" runs
per query block like the forward, "dkv" per key block, over every query row of the heads sharing that key head.
Vectors are GCC vector types of `width` floats; the QK^T and PV loops keep one row's BN scores or Ev outputs in
registers while the packed block streams from L1.
"""

from __future__ import annotations

import math

from uopc.renderer.c_math import F32_BITS, F32_MATH
from uopc.renderer.half import bf16_widening, c_conversion
from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes
from uopc.uop.variable import Variable

__all__ = ["BN", "render_attention"]

BN = 64  # keys per block: one row's scores are BN / width vectors
LOG2E = 1.4426950408889634


def _pad(n: int, w: int) -> int:
    return -(-n // w) * w


def _lead_index(lead: tuple[int, ...], flat: str, prefix: str) -> list[str]:
    """C statements splitting `flat` (row-major over `lead`) into prefix0, prefix1, ..."""
    out, rest = [], flat
    for i in reversed(range(len(lead))):
        out.append(f"long long {prefix}{i} = {rest} % {lead[i]}LL;")
        if i:
            out.append(f"long long {prefix}r{i} = {rest} / {lead[i]}LL;")
            rest = f"{prefix}r{i}"
    return out


def _offset(view, idx: list[str]) -> str:
    return " + ".join([f"{view.offset}LL", *(f"{i} * {s}LL" for i, s in zip(idx, view.lead, strict=True) if s)])


class _Src:
    """One source of the kernel as C: its pointer name and how it is indexed. A 16-bit float source (a bfloat16 KV
    cache) is read as stored and each value widened to float32 as it is loaded."""

    def __init__(self, name: str, buf: UOp, view):
        self.name, self.buf, self.view = name, buf, view
        self.conv = c_conversion(dtypes.float32, buf.dtype) if buf.dtype.is_16bit_float else None

    def at(self, row: str, col: str | None = None) -> str:
        r = f"{self.name}[(long long)({row}) * {self.view.row}LL"
        r += f" + (long long)({col}) * {self.view.col}LL]" if col is not None else "]"
        return f"{self.conv[2]}({r})" if self.conv else r

    def vector(self, W: int, ptr: str) -> str:
        """The W floats at `ptr` (a pointer into this source, unit stride, any alignment) as one vector."""
        if self.buf.dtype is dtypes.bfloat16:
            return f"uopc_attn_bf{W}({ptr})"
        return f"*(const uopc_attn_u{W}*)({ptr})"


def _bf16_vector(W: int) -> str:
    """A helper: W bfloat16 values at any alignment, widened to a float vector (half.bf16_widening)."""
    h = f"uopc_attn_h{W}"
    return (
        f"typedef unsigned short {h} __attribute__((vector_size({2 * W}), aligned(2)));\n"
        + bf16_widening(f"uopc_attn_widen{W}", W, f"uopc_attn_f{W}", h)
        + f"static inline uopc_attn_f{W} uopc_attn_bf{W}(const unsigned short* p) "
        f"{{ return uopc_attn_widen{W}(*(const {h}*)p); }}\n"
    )


def render_attention(ast: UOp) -> tuple[dict[str, tuple[int, str]], list[str], str, list[UOp], tuple, tuple]:
    """(helpers {name: (rank, code)}, parameters, body, buffers by slot, variables, pointer types) of one lowered
    attention kernel; uopc.renderer.c wraps them into its CFunction."""
    node = ast.src[0]
    a = node.arg
    op, W = a.op, a.width
    nsrc = len(a.views)
    srcs_bufs, out = node.src[:nsrc], node.src[nsrc]
    bufs = sorted({*srcs_bufs, out}, key=lambda b: b.arg.slot)
    ptr_types = tuple("unsigned char" if b.dtype.is_bool else b.dtype.cname for b in bufs)
    params = [f"{t}* restrict data{b.arg.slot}" for t, b in zip(ptr_types, bufs, strict=True)]
    S = a.S.cname if isinstance(a.S, Variable) else str(a.S)
    var = (a.S,) if isinstance(a.S, Variable) else ()
    if var:
        params.append(f"int {a.S.cname}")
    vt, it = f"uopc_attn_f{W}", f"uopc_attn_i{W}"
    vmax = (f"static inline {vt} uopc_attn_max{W}({vt} a, {vt} b) {{\n  {it} m = a > b;\n"
            f"  return ({vt})((({it})a & m) | (({it})b & ~m));\n}}\n")  # fmt: skip
    helpers = {
        vt: (0, f"typedef float {vt} __attribute__((vector_size({4 * W})));\n"),
        it: (0, f"typedef int {it} __attribute__((vector_size({4 * W})));\n"),
        f"uopc_attn_max{W}": (2, vmax),
        f"uopc_attn_u{W}": (0, f"typedef float uopc_attn_u{W} __attribute__((vector_size({4 * W}), aligned(4)));\n"),
        f"uopc_attn_sum{W}": (2, _hsum(vt, it, W)),
        "F32_BITS": (1, F32_BITS),
        "uopc_exp2f": (2, F32_MATH[Ops.EXP2][1]),
    }
    if op.kind == "lse":
        helpers["uopc_log2f"] = (2, F32_MATH[Ops.LOG2][1])
    names = ["q", "k", "v", "dout", "lse", "delta"]
    if op.kind not in ("dq", "ds", "dkv"):
        names = names[: nsrc - bool(op.mask)]
    if op.mask:
        names.append("mask")
    src = {n: _Src(f"p_{n}", b, v) for n, b, v in zip(names, srcs_bufs, a.views, strict=True)}
    for x in src.values():
        if x.conv:
            helpers[x.conv[0]] = (1, x.conv[1])
            if x.buf.dtype is dtypes.bfloat16:
                helpers[f"uopc_attn_bf{W}"] = (2, _bf16_vector(W))
    body = _BODIES[op.kind](a, src, S, vt, f"data{out.arg.slot}")
    lines = [f"  {line}" if line else "" for line in body]
    return helpers, params, "\n".join(lines), bufs, var, ptr_types


def _hsum(vt: str, it: str, W: int) -> str:
    """A helper: the sum of a vector's lanes, by a shuffle tree."""
    steps = []
    h = W // 2
    while h:
        perm = ", ".join(str((j + h) % W) for j in range(W))
        steps.append(f"  v += __builtin_shuffle(v, ({it}){{{perm}}});\n")
        h //= 2
    return f"static inline float uopc_attn_sum{W}({vt} v) {{\n{''.join(steps)}  return v[0];\n}}\n"


def _pointers(a, src: dict[str, _Src], idx: list[str], kv_idx: list[str]) -> list[str]:
    """Each source's pointer at the current (*lead) index (keys and values at the key head's)."""
    out = []
    for n, s in src.items():
        ix = kv_idx if n in ("k", "v") else idx
        ct = "unsigned char" if s.buf.dtype.is_bool else s.buf.dtype.cname
        out.append(f"const {ct}* {s.name} = data{s.buf.arg.slot} + ({_offset(s.view, ix)});")
    return out


def _indent(pre: str, lines: list[str]) -> list[str]:
    return [pre + x for x in lines]


def _tile(vt: str, W: int, R: int, nvec: int, K: str, lhs, rhs, dst, acc_init=None, name: str = "t") -> list[str]:
    """An R x nvec register tile of vectors: dst(i, n) = sum over k < K of lhs(i, k) * rhs(k, n), where lhs is a
    scalar expression and rhs the address of a vector (acc_init(i, n): the value to start from, else 0). Written
    out unrolled, so that the accumulators are registers and each loaded vector serves R rows."""
    regs = [(i, n) for i in range(R) for n in range(nvec)]
    init = acc_init or (lambda i, n: f"({vt}){{0}}")
    lines = ["{", *(f"  {vt} {name}{i}_{n} = {init(i, n)};" for i, n in regs), f"  for (int k = 0; k < {K}; k++) {{"]
    lines += [f"    {vt} b{n} = *(const {vt}*)&{rhs('k', n)};" for n in range(nvec)]
    lines += [f"    float a{i} = {lhs(i, 'k')};" for i in range(R)]
    lines += [f"    {name}{i}_{n} += a{i} * b{n};" for i, n in regs]
    lines += ["  }", *(f"  *({vt}*)&{dst(i, n)} = {name}{i}_{n};" for i, n in regs), "}"]
    return lines


def _by_block(a, vt: str, R: int, K: int, rows: str, block: str, dst: str) -> list[str]:
    """dst[i][0..BN) = rows(i) . block (K rows of BN lanes: a packed block transposed) for the tile's R rows;
    `rows` is a format string of i (the i-th query row's K values)."""
    W = a.width
    return _tile(
        vt, W, R, BN // W, str(K), lambda i, k: rows.format(i=i) + f"[{k}]", lambda k, n: f"{block}[{k}][{n * W}]",
        lambda i, n: f"{dst}[{i}][{n * W}]",
    )  # fmt: skip


def _into_rows(vt: str, W: int, R: int, nvec: int, block: str, dst: str, scale: str = "") -> list[str]:
    """dst[r + i] = dst[r + i]{scale} + s[i][0..lmax) . block (rows of a packed block) for the tile's R rows: the
    output rows of the tile stay in registers while the block streams. `scale` formats with i."""
    return _tile(
        vt, W, R, nvec, "lmax", lambda i, k: f"s[{i}][{k}]", lambda k, n: f"{block}[{k}][{n * W}]",
        lambda i, n: f"{dst}[r + {i}][{n * W}]", lambda i, n: f"*({vt}*)&{dst}[r + {i}][{n * W}]" + scale.format(i=i),
    )  # fmt: skip


def _row_masks(a, src: dict[str, _Src], R: int, row0: str, real: str, lim_of) -> list[str]:
    """Per row i of the tile: lim[i] (the keys it sees in this block; 0 for a padding row past `real`), the mask
    applied to s[i] and -inf past lim[i]; lmax = the largest lim."""
    lines = ["int lmax = 0;", f"for (int i = 0; i < {R}; i++) {{", f"  int row = {row0} + i;"]
    lines += ["  " + x for x in lim_of("row")]
    lines.append(f"  if (row >= {real}) lim = 0;  /* a padding row of the tile: nothing to see */")
    if a.op.mask == "float":
        lines.append(f"  for (int c = 0; c < lim; c++) s[i][c] += {src['mask'].at('row', 'j0 + c')} * {LOG2E!r}f;")
    elif a.op.mask == "bool":
        keep = src["mask"].at("row", "j0 + c")
        lines.append(f"  for (int c = 0; c < lim; c++) s[i][c] = {keep} ? s[i][c] : -INFINITY;")
    lines += [
        f"  for (int c = lim > 0 ? lim : 0; c < {BN}; c++) s[i][c] = -INFINITY;",
        "  lim_[i] = lim;",
        "  lmax = lim > lmax ? lim : lmax;",
        "}",
    ]
    return lines


def _limit(a, row: str) -> list[str]:
    """`lim`: the keys of this block row `row` may see (causal: j <= row + offset)."""
    if not a.op.causal:
        return ["int lim = jn;"]
    return [f"int lim = {row} + {a.op.offset} + 1 - j0;", "lim = lim < jn ? lim : jn;"]


def _hmax(vt: str, W: int, R: int, nv: int) -> list[str]:
    """mx[i] = the largest of s[i][0..BN), by vector compares and a shuffle tree (no serial chain of compares)."""
    it = f"uopc_attn_i{W}"
    lines = [f"for (int i = 0; i < {R}; i++) {{", f"  {vt} mv = *({vt}*)&s[i][0];"]
    for n in range(1, nv):
        lines.append(f"  mv = uopc_attn_max{W}(mv, *({vt}*)&s[i][{n * W}]);")
    h = W // 2
    while h:
        perm = ", ".join(str((j + h) % W) for j in range(W))
        lines.append(f"  mv = uopc_attn_max{W}(mv, __builtin_shuffle(mv, ({it}){{{perm}}}));")
        h //= 2
    lines += ["  mx[i] = mv[0];", "}"]
    return lines


def _tile_rows(a) -> int:
    """Query rows per register tile: as many as keep the widest tile (R x max(BN, E, Ev) / width vectors) and its
    operands in the vector registers (32 with 16-float vectors, else 16)."""
    W = a.width
    regs = 32 if W >= 16 else 16
    widest = max(BN // W, _pad(a.E, W) // W, _pad(a.Ev, W) // W)
    R = 4
    while R > 1 and R * widest + widest + R > regs:
        R //= 2
    return R


def _pack(a, src: dict[str, _Src], what: tuple[str, ...]) -> list[str]:
    """Copy the block's keys (kt: k^T, kb: k rows padded) and values (vb: rows padded, vt: v^T) into L1, zero past
    the last key, so masked lanes multiply zeros (never a stale NaN)."""
    W, E, Ev = a.width, a.E, a.Ev
    k, v = src["k"], src.get("v")
    body, zero = [], []
    if "kt" in what:
        body.append(f"  for (int e = 0; e < {E}; e++) kt[e][c] = {k.at('j0 + c', 'e')};")
        zero.append(f"  for (int e = 0; e < {E}; e++) kt[e][c] = 0.0f;")
    if "kb" in what:
        body.append(f"  for (int e = 0; e < {_pad(E, W)}; e++) kb[c][e] = e < {E} ? {k.at('j0 + c', 'e')} : 0.0f;")
        zero.append(f"  for (int e = 0; e < {_pad(E, W)}; e++) kb[c][e] = 0.0f;")
    if "vb" in what:
        body.append(f"  for (int d = 0; d < {_pad(Ev, W)}; d++) vb[c][d] = d < {Ev} ? {v.at('j0 + c', 'd')} : 0.0f;")
        zero.append(f"  for (int d = 0; d < {_pad(Ev, W)}; d++) vb[c][d] = 0.0f;")
    if "vt" in what:
        body.append(f"  for (int d = 0; d < {Ev}; d++) vt[d][c] = {v.at('j0 + c', 'd')};")
        zero.append(f"  for (int d = 0; d < {Ev}; d++) vt[d][c] = 0.0f;")
    return ["for (int c = 0; c < jn; c++) {", *body, "}", f"for (int c = jn; c < {BN}; c++) {{", *zero, "}"]


_ALIGN = "__attribute__((aligned(64)))"


def _row_head(heads: int, t: str, rows: int, row: str) -> str:
    """The output row of (flat lead index t, row): outputs are stored (*batch, rows, heads, cols)."""
    return f"(({t} / {heads}LL * {rows}LL + {row}) * {heads}LL + {t} % {heads}LL)"


def _blocks(a, what: tuple[str, ...]) -> list[str]:
    """The declarations of the packed blocks `what` names (see _pack)."""
    W, E, Ev = a.width, a.E, a.Ev
    decl = {
        "kt": f"float kt[{E}][{BN}] {_ALIGN};",
        "kb": f"float kb[{BN}][{_pad(E, W)}] {_ALIGN};",
        "vb": f"float vb[{BN}][{_pad(Ev, W)}] {_ALIGN};",
        "vt": f"float vt[{Ev}][{BN}] {_ALIGN};",
    }
    return [decl[w] for w in what]


def _query_tasks(a, src, S: str) -> tuple[list[str], str]:
    """The parallel loop over (*lead, query block) and each task's pointers; returns (lines, the flat lead index)."""
    L, lead, g = a.L, a.lead, a.op.groups
    nt = math.prod(lead)
    lines = [
        f"const int S = {S};",
        f"const int nqb = {-(-L // a.rows)};",
        "#pragma omp parallel for schedule(static)",
        f"for (long long task = 0; task < {nt}LL * nqb; task++) {{",
        "  long long t = task / nqb;",
        f"  int r0 = (int)(task % nqb) * {a.rows};",
        f"  int rn = {L} - r0 < {a.rows} ? {L} - r0 : {a.rows};",
    ]
    idx = [f"i{i}" for i in range(len(lead))]
    kv = idx[:-1] + [f"(i{len(lead) - 1} / {g})"] if g > 1 else idx
    lines += ["  " + x for x in _lead_index(lead, "t", "i")]
    lines += ["  " + x for x in _pointers(a, src, idx, kv)]
    if a.op.causal:  # keys past the block's last row's limit are never seen
        lines += [f"  int jend = r0 + rn + {a.op.offset};", "  jend = jend < S ? jend : S;"]
    else:
        lines.append("  int jend = S;")
    return lines, "t"


def _direct(a, src) -> bool:
    """A forward with a query or two (a decode step) reads keys and values where they are, unpacked: packing a
    block costs as much as the few rows' work on it. Whole vectors along unit-stride rows only."""
    if a.op.kind != "out" or a.L > 2 or a.E % a.width or a.Ev % a.width:
        return False
    k, v = src["k"], src["v"]
    if any(x.buf.dtype not in (dtypes.float32, dtypes.bfloat16) for x in (k, v)):
        return False
    return k.view.col == v.view.col == 1


def _forward_direct(a, src, S: str, vt: str, out: str) -> list[str]:
    """Kind "out" for a query or two: per row, each key's score is a dot product of vectors (summed across lanes),
    and p v adds value rows loaded in place."""
    W, E, Ev = a.width, a.E, a.Ev
    nv, nee, nve = BN // W, E // W, Ev // W
    sc = a.op.scale * LOG2E
    k, v = src["k"], src["v"]
    kt, vt_ = (x.buf.dtype.cname for x in (k, v))  # float, or a bfloat16 cache's unsigned short
    lines, t = _query_tasks(a, src, S)
    body = [
        f"float qs[{a.rows}][{E}] {_ALIGN};",
        f"float s[1][{BN}] {_ALIGN};",
        f"float acc[{a.rows}][{Ev}] {_ALIGN};",
        f"float m[{a.rows}], l[{a.rows}], mx[1];",
        "int lim_[1];",
        "for (int r = 0; r < rn; r++) {",
        "  m[r] = -INFINITY; l[r] = 0.0f;",
        f"  for (int d = 0; d < {Ev}; d++) acc[r][d] = 0.0f;",
        f"  for (int e = 0; e < {E}; e++) qs[r][e] = {src['q'].at('r0 + r', 'e')} * {sc!r}f;",
        "}",
        f"for (int j0 = 0; j0 < jend; j0 += {BN}) {{",
        f"  int jn = jend - j0 < {BN} ? jend - j0 : {BN};",
        "  for (int r = 0; r < rn; r++) {",
        "    for (int c = 0; c < jn; c++) {",
        f"      const {kt}* kr = p_k + (long long)(j0 + c) * {k.view.row}LL;",
        f"      {vt} d = *({vt}*)&qs[r][0] * {k.vector(W, 'kr')};",
        *(f"      d += *({vt}*)&qs[r][{n * W}] * {k.vector(W, f'kr + {n * W}')};" for n in range(1, nee)),
        f"      s[0][c] = uopc_attn_sum{W}(d);",
        "    }",
        *("    " + x for x in _row_masks(a, src, 1, "r0 + r", "r0 + rn", lambda row: _limit(a, row))),
        *("    " + x for x in _hmax(vt, W, 1, nv)),
        "    float mn = mx[0] > m[r] ? mx[0] : m[r];",
        "    float mref = mn == -INFINITY ? 0.0f : mn, ps = 0.0f;",
        f"    for (int c = 0; c < {BN}; c++) {{ float p = uopc_exp2f(s[0][c] - mref); s[0][c] = p; ps += p; }}",
        "    float al = uopc_exp2f(m[r] - mref);",
        "    l[r] = l[r] * al + ps; m[r] = mn;",
        *(f"    {vt} o{n} = *({vt}*)&acc[r][{n * W}] * al;" for n in range(nve)),
        "    for (int c = 0; c < lmax; c++) {",
        f"      const {vt_}* vr = p_v + (long long)(j0 + c) * {v.view.row}LL;",
        "      float p = s[0][c];",
        *(f"      o{n} += p * {v.vector(W, f'vr + {n * W}')};" for n in range(nve)),
        "    }",
        *(f"    *({vt}*)&acc[r][{n * W}] = o{n};" for n in range(nve)),
        "  }",
        "}",
        "for (int r = 0; r < rn; r++) {",
        "  float inv = 1.0f / l[r];",
        f"  float* o = {out} + {_row_head(a.lead[-1], t, a.L, 'r0 + r')} * {Ev}LL;",
        f"  for (int d = 0; d < {Ev}; d++) o[d] = acc[r][d] * inv;",
        "}",
    ]
    return [*lines, *("  " + x for x in body), "}"]


def _forward(a, src, S: str, vt: str, out: str) -> list[str]:
    """Kinds "out" (the attention output) and "lse" (each row's log2-sum-exp2 of the scaled scores)."""
    if _direct(a, src):
        return _forward_direct(a, src, S, vt, out)
    W, E, Ev, rows, R = a.width, a.E, a.Ev, a.rows, _tile_rows(a)
    nv, nve, evp = BN // W, _pad(Ev, W) // W, _pad(Ev, W)
    sc = a.op.scale * LOG2E
    with_v = a.op.kind == "out"
    lines, t = _query_tasks(a, src, S)
    body = [
        f"float qs[{rows}][{E}] {_ALIGN};",
        f"float s[{R}][{BN}] {_ALIGN};",
        f"float m[{rows}], l[{rows}], mx[{R}], al[{R}];",
        f"int lim_[{R}];",
        *_blocks(a, ("kt", "vb") if with_v else ("kt",)),
    ]
    if with_v:
        body.append(f"float acc[{rows}][{evp}] {_ALIGN};")
    body += [
        f"for (int r = 0; r < {rows}; r++) {{",
        "  m[r] = -INFINITY; l[r] = 0.0f;",
        f"  for (int d = 0; d < {evp}; d++) acc[r][d] = 0.0f;" if with_v else "",
        f"  for (int e = 0; e < {E}; e++) qs[r][e] = r < rn ? {src['q'].at('r0 + r', 'e')} * {sc!r}f : 0.0f;",
        "}",
        f"for (int j0 = 0; j0 < jend; j0 += {BN}) {{",
        f"  int jn = jend - j0 < {BN} ? jend - j0 : {BN};",
        *("  " + x for x in _pack(a, src, ("kt", "vb") if with_v else ("kt",))),
        f"  for (int r = 0; r < rn; r += {R}) {{",
        *_indent("    ", _by_block(a, vt, R, E, "qs[r + {i}]", "kt", "s")),
        *("    " + x for x in _row_masks(a, src, R, "r0 + r", "r0 + rn", lambda row: _limit(a, row))),
        *("    " + x for x in _hmax(vt, W, R, nv)),
        f"    for (int i = 0; i < {R}; i++) {{",
        "      float mn = mx[i] > m[r + i] ? mx[i] : m[r + i];",
        "      float mref = mn == -INFINITY ? 0.0f : mn;  /* every key so far masked: p = 0, not NaN */",
        "      float ps = 0.0f;",
        f"      for (int c = 0; c < {BN}; c++) {{ float p = uopc_exp2f(s[i][c] - mref); s[i][c] = p; ps += p; }}",
        "      al[i] = uopc_exp2f(m[r + i] - mref);",
        "      l[r + i] = l[r + i] * al[i] + ps; m[r + i] = mn;",
        "    }",
    ]
    if with_v:
        body += _indent("    ", _into_rows(vt, W, R, nve, "vb", "acc", " * al[{i}]"))
    body += ["  }", "}"]
    if with_v:  # l == 0 (every key masked) gives 0 * inf = NaN, as softmax over nothing does
        body += [
            "for (int r = 0; r < rn; r++) {",
            "  float inv = 1.0f / l[r];",
            f"  float* o = {out} + {_row_head(a.lead[-1], t, a.L, 'r0 + r')} * {Ev}LL;",
            f"  for (int d = 0; d < {Ev}; d++) o[d] = acc[r][d] * inv;",
            "}",
        ]
    else:
        body.append(f"for (int r = 0; r < rn; r++) {out}[{t} * {a.L}LL + r0 + r] = m[r] + uopc_log2f(l[r]);")
    return [*lines, *("  " + x for x in body), "}"]


def _dq(a, src, S: str, vt: str, out: str) -> list[str]:
    """Kind "dq": per query block, dq = scale * sum over keys of ds k, with ds = p (dp - delta), p = 2^(s - lse) and
    dp = dout . v. Kind "ds": the same loop, storing ds itself (*lead, L, S): a float mask's gradient."""
    W, E, Ev, rows, R = a.width, a.E, a.Ev, a.rows, _tile_rows(a)
    ep, nee = _pad(E, W), _pad(E, W) // W
    sc = a.op.scale * LOG2E
    dq = a.op.kind == "dq"
    lines, t = _query_tasks(a, src, S)
    body = [
        f"float qs[{rows}][{E}] {_ALIGN};",
        f"float dos[{rows}][{Ev}] {_ALIGN};",
        f"float s[{R}][{BN}] {_ALIGN};",
        f"float dp[{R}][{BN}] {_ALIGN};",
        f"float lr[{rows}], dr[{rows}];",
        f"int lim_[{R}];",
        *_blocks(a, ("kt", "kb", "vt") if dq else ("kt", "vt")),
    ]
    if dq:
        body.append(f"float dqa[{rows}][{ep}] {_ALIGN};")
    body += [
        f"for (int r = 0; r < {rows}; r++) {{",
        f"  for (int e = 0; e < {E}; e++) qs[r][e] = r < rn ? {src['q'].at('r0 + r', 'e')} * {sc!r}f : 0.0f;",
        f"  for (int d = 0; d < {Ev}; d++) dos[r][d] = r < rn ? {src['dout'].at('r0 + r', 'd')} : 0.0f;",
        f"  lr[r] = r < rn ? {src['lse'].at('r0 + r')} : 0.0f; dr[r] = r < rn ? {src['delta'].at('r0 + r')} : 0.0f;",
        f"  for (int e = 0; e < {ep}; e++) dqa[r][e] = 0.0f;" if dq else "",
        "}",
        f"for (int j0 = 0; j0 < jend; j0 += {BN}) {{",
        f"  int jn = jend - j0 < {BN} ? jend - j0 : {BN};",
        *("  " + x for x in _pack(a, src, ("kt", "kb", "vt") if dq else ("kt", "vt"))),
        f"  for (int r = 0; r < rn; r += {R}) {{",
        *_indent("    ", _by_block(a, vt, R, E, "qs[r + {i}]", "kt", "s")),
        *_indent("    ", _by_block(a, vt, R, Ev, "dos[r + {i}]", "vt", "dp")),
        *("    " + x for x in _row_masks(a, src, R, "r0 + r", "r0 + rn", lambda row: _limit(a, row))),
        f"    for (int i = 0; i < {R}; i++)",
        f"      for (int c = 0; c < {BN}; c++) s[i][c] = uopc_exp2f(s[i][c] - lr[r + i]) * (dp[i][c] - dr[r + i]);",
    ]
    if dq:
        body += _indent("    ", _into_rows(vt, W, R, nee, "kb", "dqa"))
        body += [
            "  }",
            "}",
            "for (int r = 0; r < rn; r++) {",
            f"  float* o = {out} + {_row_head(a.lead[-1], t, a.L, 'r0 + r')} * {E}LL;",
            f"  for (int e = 0; e < {E}; e++) o[e] = dqa[r][e] * {a.op.scale!r}f;",
            "}",
        ]
    else:  # every key of a real row is written: masked ones (p = 0) get 0
        body += [
            f"    for (int i = 0; i < {R} && r + i < rn; i++) {{",
            f"      float* o = {out} + ({t} * {a.L}LL + r0 + r + i) * {int(a.S)}LL + j0;",
            "      for (int c = 0; c < jn; c++) o[c] = c < lim_[i] ? s[i][c] : 0.0f;",
            "    }",
            "  }",
            "}",
        ]
    return [*lines, *("  " + x for x in body), "}"]


def _dkv(a, src, S: str, vt: str, out: str) -> list[str]:
    """Kind "dkv": per key block, over every query row of the query heads reading its key head (R rows at a time):
    dv = sum of p dout, dk = scale * sum of ds q. Output rows are dk then dv."""
    W, E, Ev, L, g, R = a.width, a.E, a.Ev, a.L, a.op.groups, _tile_rows(a)
    ep, evp = _pad(E, W), _pad(Ev, W)
    sc = a.op.scale * LOG2E
    lead = a.lead
    lead_kv = lead[:-1] + (lead[-1] // g,)
    s_max = int(a.S)
    lines = [
        f"const int S = {S};",
        f"const int nkb = (S + {BN - 1}) / {BN};",
        "#pragma omp parallel for schedule(static)",
        f"for (long long task = 0; task < {math.prod(lead_kv)}LL * nkb; task++) {{",
        "  long long tk = task / nkb;",
        f"  int j0 = (int)(task % nkb) * {BN};",
        f"  int jn = S - j0 < {BN} ? S - j0 : {BN};",
    ]
    kvi = [f"i{i}" for i in range(len(lead))]
    lines += ["  " + x for x in _lead_index(lead_kv, "tk", "i")]
    body = [
        f"float qr[{R}][{ep}] {_ALIGN};",
        f"float qs[{R}][{E}] {_ALIGN};",
        f"float dor[{R}][{evp}] {_ALIGN};",
        f"float s[{R}][{BN}] {_ALIGN};",
        f"float dp[{R}][{BN}] {_ALIGN};",
        f"float lr[{R}], dr[{R}];",
        f"int lim_[{R}];",
        f"float dka[{BN}][{ep}] {_ALIGN};",
        f"float dva[{BN}][{evp}] {_ALIGN};",
        *_blocks(a, ("kt", "vt")),
        f"for (int c = 0; c < {BN}; c++) {{",
        f"  for (int e = 0; e < {ep}; e++) dka[c][e] = 0.0f;",
        f"  for (int d = 0; d < {evp}; d++) dva[c][d] = 0.0f;",
        "}",
        *_pack(a, src, ("kt", "vt")),
        f"for (int gi = 0; gi < {g}; gi++) {{",
    ]
    qidx = kvi[:-1] + [f"(i{len(lead) - 1} * {g} + gi)"]
    inner = _pointers(a, {n: s for n, s in src.items() if n not in ("k", "v")}, qidx, qidx)
    rs = f"j0 - {a.op.offset}" if a.op.causal else "0"
    inner += [
        f"int rs = {rs};",
        "rs = rs > 0 ? rs : 0;",
        f"for (int r = rs; r < {L}; r += {R}) {{",
        f"  for (int i = 0; i < {R}; i++) {{",
        "    int row = r + i, real = row < " + str(L) + ";",
        f"    for (int e = 0; e < {ep}; e++) qr[i][e] = real && e < {E} ? {src['q'].at('row', 'e')} : 0.0f;",
        f"    for (int e = 0; e < {E}; e++) qs[i][e] = qr[i][e] * {sc!r}f;",
        f"    for (int d = 0; d < {evp}; d++) dor[i][d] = real && d < {Ev} ? {src['dout'].at('row', 'd')} : 0.0f;",
        f"    lr[i] = real ? {src['lse'].at('row')} : 0.0f; dr[i] = real ? {src['delta'].at('row')} : 0.0f;",
        "  }",
        *_indent("  ", _by_block(a, vt, R, E, "qs[{i}]", "kt", "s")),
        *_indent("  ", _by_block(a, vt, R, Ev, "dor[{i}]", "vt", "dp")),
        *("  " + x for x in _row_masks(a, src, R, "r", str(L), lambda row: _limit(a, row))),
        f"  for (int i = 0; i < {R}; i++)",
        f"    for (int c = 0; c < {BN}; c++) {{",
        "      float p = uopc_exp2f(s[i][c] - lr[i]);",
        "      s[i][c] = p; dp[i][c] = p * (dp[i][c] - dr[i]);",
        "    }",
        *("  " + x for x in _accumulate(vt, W, R, evp // W, "s", "dor", "dva")),
        *("  " + x for x in _accumulate(vt, W, R, ep // W, "dp", "qr", "dka")),
        "}",
    ]
    body += ["  " + x for x in inner]
    body += [
        "}",
        "for (int c = 0; c < jn; c++) {",
        f"  float* o = {out} + {_row_head(lead_kv[-1], 'tk', s_max, 'j0 + c')} * {E + Ev}LL;",
        f"  for (int e = 0; e < {E}; e++) o[e] = dka[c][e] * {a.op.scale!r}f;",
        f"  for (int d = 0; d < {Ev}; d++) o[{E} + d] = dva[c][d];",
        "}",
    ]
    # the k and v pointers are at the key head; the others are set per query head inside
    ptrs = _pointers(a, {n: s for n, s in src.items() if n in ("k", "v")}, kvi, kvi)
    return [*lines, *("  " + x for x in ptrs), *("  " + x for x in body), "}"]


def _accumulate(vt: str, W: int, R: int, nvec: int, coef: str, rowvec: str, dst: str) -> list[str]:
    """dst[c] += sum over the tile's rows i of coef[i][c] * rowvec[i] for c < lmax: the R row vectors stay in
    registers, each dst row is loaded and stored once per tile."""
    regs = [(i, n) for i in range(R) for n in range(nvec)]
    lines = ["{", *(f"  {vt} x{i}_{n} = *(const {vt}*)&{rowvec}[{i}][{n * W}];" for i, n in regs)]
    lines += ["  for (int c = 0; c < lmax; c++) {"]
    for n in range(nvec):
        terms = " + ".join(f"{coef}[{i}][c] * x{i}_{n}" for i in range(R))
        lines.append(f"    *({vt}*)&{dst}[c][{n * W}] += {terms};")
    lines += ["  }", "}"]
    return lines


_BODIES = {"out": _forward, "lse": _forward, "dq": _dq, "ds": _dq, "dkv": _dkv}

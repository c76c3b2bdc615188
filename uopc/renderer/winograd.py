"""A Winograd transform as C, for a lowered WINOGRAD (uopc.codegen.winograd; the matrices: uopc.uop.winograd).

    kind "w", w (K, C, 3, 3) -> U (alpha^2, K, C): G g G^T of each filter g, a (k, c) pair per iteration, on threads.

    kind "in", x (N, C, H, W) -> V (C, alpha^2, T):        kind "out", Y (alpha^2, K, T) -> out (N, K, OH, OW):
    for each (image, channel), on threads:                  for each (image, output channel), on threads:
        for each tile (ty, tx):                                 for each tile (ty, tx):
            d = the alpha x alpha inputs at (ty*m, tx*m)            y = the alpha x alpha products of the tile
                - pads (zero outside x)                             store A^T y A, its m x m outputs (those
            V[c, :, t] = B^T d B                                    inside OH x OW)

Each tile's products with the constant matrices are unrolled: a term per nonzero coefficient (a coefficient of +-1
an add or a subtract), so F(4,3)'s input transform is about 150 flops per tile rather than 2 * 6^3 * 2. The tiles of
a (image, channel) pair are written (read) in order. V keeps a channel's alpha^2 rows together: laid out as
(alpha^2, C, T), the alpha^2 streams one tile writes were C*T floats apart, a multiple of 4 KiB at ResNet-18's
14x14 and 7x7 (C*T = 256*16, 512*16): every store of a tile went to one L1 set (0.54 ms for 256 channels at 14x14,
against 0.17 ms for 64 channels at 56x56, three times the data).
"""

from __future__ import annotations

from fractions import Fraction

from uopc.uop import UOp
from uopc.uop.winograd import MATRICES

__all__ = ["render_winograd"]


def _const(c: Fraction) -> str:
    return f"{float(c)!r}f"


def _combo(coeffs, terms: list[str]) -> str:
    """sum(coeff * term) as C, zero terms left out, +-1 as a bare add or subtract."""
    out = []
    for c, t in zip(coeffs, terms, strict=True):
        c = Fraction(c)
        if c == 0:
            continue
        sign = "-" if c < 0 else "+"
        mag = abs(c)
        out.append((sign, t if mag == 1 else f"{_const(mag)} * {t}"))
    if not out:
        return "0.0f"
    first = ("-" if out[0][0] == "-" else "") + out[0][1]
    return " ".join([first, *(f"{s} {t}" for s, t in out[1:])])


def _products(left, names: list[list[str]], right, prefix: str) -> tuple[list[str], list[list[str]]]:
    """C lines computing P = left . X . right^T for the matrix X of C names; returns (lines, P's names)."""
    rows, cols = len(names), len(names[0])
    lines, mid = [], []
    for i in range(len(left)):  # (left . X)[i][j]
        row = []
        for j in range(cols):
            n = f"{prefix}a{i}_{j}"
            lines.append(f"const float {n} = {_combo(left[i], [names[k][j] for k in range(rows)])};")
            row.append(n)
        mid.append(row)
    res = []
    for i in range(len(left)):
        row = []
        for j in range(len(right)):
            n = f"{prefix}b{i}_{j}"
            lines.append(f"const float {n} = {_combo(right[j], mid[i])};")
            row.append(n)
        res.append(row)
    return lines, res


def render_winograd(ast: UOp) -> tuple[dict[str, tuple[int, str]], list[str], str, list[UOp], tuple, tuple]:
    """(helpers, parameters, body, buffers by slot, variables, pointer types) of one lowered Winograd transform;
    uopc.renderer.c wraps them into its CFunction, as it does an attention kernel's."""
    node = ast.src[0]
    src, out = node.src
    k = node.arg
    w = k.op
    m, (th, tw) = w.m, w.tiles
    a = m + 2
    BT, G, AT = MATRICES[m]
    bufs = sorted({src, out}, key=lambda b: b.arg.slot)
    params = [f"float* restrict data{b.arg.slot}" for b in bufs]
    x, o = f"data{src.arg.slot}", f"data{out.arg.slot}"
    if w.kind == "w":
        body = _weight(k, a, G, x, o)
    else:
        body = _input(k, a, m, th, tw, BT, x, o) if w.kind == "in" else _output(k, a, m, th, tw, AT, x, o)
    lines = [f"  {line}" if line else "" for line in body]
    return {}, params, "\n".join(lines), bufs, (), ("float",) * len(bufs)


def _weight(k, a: int, G, x: str, o: str) -> list[str]:
    K, C, _, _ = k.src_shape
    sK, sC, sH, sW = k.strides
    KC, B = K * C, 64  # filters per block: each of the alpha^2 rows is written 64 floats at a time
    g = [[f"ws[{i * sH + j * sW}LL]" for j in range(3)] for i in range(3)]
    prods, u = _products(G, g, G, "")
    return [
        f"#pragma omp parallel for schedule(static) if ({KC}LL > 4096)",
        f"for (long long b0 = 0; b0 < {KC}LL; b0 += {B}) {{",
        f"  const int nb = {KC}LL - b0 < {B} ? (int)({KC}LL - b0) : {B};",
        f"  float blk[{a * a}][{B}];  // (the rows are K*C floats apart: stored one filter at a time, at K*C a",
        "  // multiple of 4 KiB, every store of a filter went to one L1 set)",
        "  for (int f = 0; f < nb; f++) {",
        "    const long long kc = b0 + f;",
        f"    const float* restrict ws = {x} + {k.offset}LL + kc / {C}LL * {sK}LL + kc % {C}LL * {sC}LL;",
        *(f"    {line}" for line in prods),
        *(f"    blk[{i * a + j}][f] = {u[i][j]};" for i in range(a) for j in range(a)),
        "  }",
        f"  for (int r = 0; r < {a * a}; r++)",
        f"    for (int f = 0; f < nb; f++) {o}[r * {KC}LL + b0 + f] = blk[r][f];",
        "}",
    ]


def _planes(flat: str, chan: str, N: int, C: int, tiles: int) -> list[str]:
    """The parallel loop over (image n, channel `chan`) planes, flattened as `flat`, on threads past 64 tiles."""
    return [
        f"#pragma omp parallel for schedule(static) if ({N * C * tiles}LL > 64)",
        f"for (long long {flat} = 0; {flat} < {N * C}LL; {flat}++) {{",
        f"  const long long n = {flat} / {C}LL, {chan} = {flat} % {C}LL;",
    ]


def _input(k, a: int, m: int, th: int, tw: int, BT, x: str, o: str) -> list[str]:
    N, C, H, W = k.src_shape
    sN, sC, sH, sW = k.strides
    pt, pl = k.op.pads
    T = N * th * tw
    PW = tw * m + 2  # one tile row's alpha input rows, zero-padded: every tile then reads without a bound check
    cols = min(W, PW - pl)  # (input columns past the last tile's reach are not read)
    d = [[f"rows[{i}][tx * {m} + {j}]" for j in range(a)] for i in range(a)]
    prods, v = _products(BT, d, BT, "")
    return [
        *_planes("nc", "c", N, C, th * tw),
        f"  const float* restrict xs = {x} + {k.offset}LL + n * {sN}LL + c * {sC}LL;",
        f"  float* restrict vs = {o} + c * {a * a * T}LL + n * {th * tw}LL;",
        f"  float rows[{a}][{PW}];",
        f"  for (int ty = 0; ty < {th}; ty++) {{",
        *(line for i in range(a) for line in _fill_row(i, m, pt, pl, cols, PW, H, sH, sW)),
        f"    float* restrict vt = vs + ty * {tw};",
        f"    for (int tx = 0; tx < {tw}; tx++) {{",
        *(f"      {line}" for line in prods),
        *(f"      vt[{(i * a + j) * T}LL + tx] = {v[i][j]};" for i in range(a) for j in range(a)),
        "    }",
        "  }",
        "}",
    ]


def _fill_row(i: int, m: int, pt: int, pl: int, cols: int, PW: int, H: int, sH: int, sW: int) -> list[str]:
    """C filling rows[i] with input row ty*m - pt + i, zero-padded (zeros when outside the input). Unrolled over i,
    each element written once: gcc 12 at -O3 vectorized a loop over i around these (zero the row, then copy into
    it) across rows, and the first tile row read stale values."""
    return [
        f"    if (ty * {m} + {i - pt} >= 0 && ty * {m} + {i - pt} < {H}) {{",
        f"      const float* restrict xr = xs + (long long)(ty * {m} + {i - pt}) * {sH}LL;",
        f"      for (int j = 0; j < {pl}; j++) rows[{i}][j] = 0.0f;",
        f"      for (int j = 0; j < {cols}; j++) rows[{i}][{pl} + j] = xr[j * {sW}LL];",
        f"      for (int j = {pl + cols}; j < {PW}; j++) rows[{i}][j] = 0.0f;",
        "    } else {",
        f"      for (int j = 0; j < {PW}; j++) rows[{i}][j] = 0.0f;",
        "    }",
    ]


def _output(k, a: int, m: int, th: int, tw: int, AT, y: str, o: str) -> list[str]:
    _, K, _ = k.src_shape
    s0, s1, s2 = k.strides
    N, _, OH, OW = k.op.shape
    yy = [[f"ys[{(i * a + j) * s0}LL + t]" for j in range(a)] for i in range(a)]
    prods, r = _products(AT, yy, AT, "")
    return [
        *_planes("nk", "kk", N, K, th * tw),
        f"  const float* restrict ys0 = {y} + {k.offset}LL + kk * {s1}LL + n * {th * tw * s2}LL;",
        f"  float* restrict os = {o} + nk * {OH * OW}LL;",
        f"  float rows[{m}][{tw * m}];  // one tile row's outputs, then copied out (the last tiles' cut)",
        f"  for (int ty = 0; ty < {th}; ty++) {{",
        f"    const float* restrict ys = ys0 + ty * {tw * s2}LL;",
        f"    for (int tx = 0; tx < {tw}; tx++) {{",
        f"      const long long t = tx * {s2}LL;",
        *(f"      {line}" for line in prods),
        *(f"      rows[{i}][tx * {m} + {j}] = {r[i][j]};" for i in range(m) for j in range(m)),
        "    }",
        f"    for (int i = 0; i < {m} && ty * {m} + i < {OH}; i++)",
        f"      for (int j = 0; j < {OW}; j++) os[(long long)(ty * {m} + i) * {OW} + j] = rows[i][j];",
        "  }",
        "}",
    ]

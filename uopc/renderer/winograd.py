"""A Winograd transform as C, for a lowered WINOGRAD (uopc.codegen.winograd; the matrices: uopc.uop.winograd).

    kind "w", w (K, C, 3, 3) -> U (alpha^2, K, C): G g G^T of each filter g, a (k, c) pair per iteration, on threads.

    kind "in", x (N, C, H, W) -> V (C, alpha^2, T):        kind "out", Y (alpha^2, K, T) -> out (N, K, OH, OW):
    for each (channel, image), on threads:                  for each (output channel, image), on threads:
        for each run of whole tile rows:                        for each chunk of whole tile rows:
            for each tile row of the run:                           for each run of OUT_RUN tiles of the chunk:
                cm, cs = B^T of its alpha input rows,                   for each column q of the tiles' points:
                  column by column (vectorized)                             am[:, q] = A^T y[:, q] (vectorized)
            for each row i of B^T d, each tile t (vectorized):          st[:, t] = am A, m x m outputs (vectorized)
                V[c, i*alpha.., t] = (B^T d)[i, t's columns] B      for each output row of the chunk (inside OH):
                                                                        its tiles' points from st (inside OW)

An output transform with an epilogue (its one reader's elementwise ops: uopc.codegen.winograd) applies it over each
chunk's rows once they are written, in place, in one loop (_Epilogue; the few-tile form over its block's planes).

Where the products would pack V into the microkernel's panels (a B larger than half of L2, uopc.opt.gemm), the
input transform writes the panels itself (Winograd.panel: V as (alpha^2, ceil(T/NR), C, NR)), with no copy between;
panels too large to stay in the last-level cache it writes with non-temporal stores (Winograd.stream, STREAM_HELPER).

Each tile's products with the constant matrices are unrolled: a term per nonzero coefficient (a coefficient of +-1
an add or a subtract), so F(4,3)'s input transform is about 150 flops per tile rather than 2 * 6^3 * 2; its B^T d
half is computed once per column of a tile row, which neighbouring tiles share (their C a third smaller). That half
reads the alpha input rows where they lie (a row outside the input is a row of zeros) and writes each column twice:
into cm from column 0 and into cs from column m, so that over a run of tile rows tile t's column q is cm[t*m + q]
(q < m) or cs[t*m + q - m], and the (B^T d) B half is one loop over the run's tiles per row of B^T d, which gcc
vectorizes. Before, the rows were copied zero-padded and that half looped over one tile row's tiles reading
cv[tx*m + q]: gcc kept it scalar (41% of the time of (64, 64, 28, 28)'s transform, 7 tiles a row) and the copy's
stores, read back at another offset, stalled store forwarding. With its stores left out (a C harness) it now takes
0.65 of the time; in uopc, (64, 64, 28, 28) x (32, 64, 3, 3) forward took 0.95x, (8, 128, 28, 28) x 128 0.91x,
ResNet-18 at batch 8 0.97x and at batch 1 1.0x (interleaved in one process; the rest of the transform is its
writes). Its (B^T d) B half gives alpha of the tile's alpha^2 values per row of B^T d: written out for all alpha^2 at
once, ResNet-18's four F(4,3) input transforms took gcc 167/155/133/76 ms, 79/86/85/64 in the loop, and ran as
fast. The tiles of a (image, channel) pair are written (read) in order. V keeps a channel's alpha^2 rows together:
laid out as (alpha^2, C, T), the alpha^2 streams one tile writes were C*T floats apart, a multiple of 4 KiB at
ResNet-18's 14x14 and 7x7 (C*T = 256*16, 512*16): every store of a tile went to one L1 set (0.54 ms for 256 channels
at 14x14, against 0.17 ms for 64 channels at 56x56, three times the data).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from uopc.uop import Ops, UOp
from uopc.uop.variable import SizeArg
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


class _Sizes:
    """The shape-dependent integers of a weight transform, as its C function's parameters: each is a SizeArg the
    plan's entry point passes as a literal (uopc.renderer.plan), so the weight transform of one F(m, 3) is one
    function for every weight shape, compiled once (ResNet-18's three F(4,3) weight transforms were three units of
    55-75 ms of gcc each). It runs once per weight (uopc.engine.kept), so its sizes cost nothing that counts.
    The input and output transforms keep their sizes in their C: with them as arguments (tried) gcc took 40-70%
    longer on each unit and they ran 1.3-2x slower (ResNet-18 at batch 1, interleaved: input transforms 24 -> 44-57
    ms over 25 calls), where the tile loops' trip counts and the staging arrays' sizes were no longer constants."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def __call__(self, name: str, value: int) -> str:
        self.values[name] = int(value)
        return name

    def times(self, expr: str, name: str, value: int) -> str:
        """`expr * name` as C, or `expr` alone where the stride `value` is 1."""
        return expr if value == 1 else f"{expr} * {self(name, value)}"

    def params(self) -> list[str]:
        return [f"long long {n}" for n in self.values]

    def vars(self) -> tuple[SizeArg, ...]:
        return tuple(SizeArg(n, v) for n, v in self.values.items())


def render_winograd(
    ast: UOp, scalar: Callable | None = None
) -> tuple[dict[str, tuple[int, str]], list[str], str, list[UOp], tuple, tuple]:
    """(helpers, parameters, body, buffers by slot, variables, pointer types) of one lowered Winograd transform;
    uopc.renderer.c wraps them into its CFunction, as it does an attention kernel's. A weight transform's sizes are
    parameters (its variables: SizeArgs, see _Sizes). `scalar` renders an output transform's epilogue
    (uopc.renderer.c.scalar_code: that renderer's C forms of the ops)."""
    node = ast.src[0]
    src, out = node.src[:2]
    k = node.arg
    w = k.op
    m, (th, tw) = w.m, w.tiles
    a = m + 2
    BT, G, AT = MATRICES[m]
    bufs = sorted({b for b in node.toposort() if b.op is Ops.BUFFER}, key=lambda b: b.arg.slot)
    params = [f"float* restrict data{b.arg.slot}" for b in bufs]
    x, o = f"data{src.arg.slot}", f"data{out.arg.slot}"
    sz = _Sizes()
    helpers: dict[str, tuple[int, str]] = {"uopc_stream_floats": (2, STREAM_HELPER)} if w.stream else {}
    if w.kind == "w":
        body = _weight(sz, k, a, G, x, o)
    elif w.kind == "in":
        body = _input(k, a, m, th, tw, BT, x, o)
    else:
        epi = None
        if len(node.src) > 2:
            if scalar is None:
                raise NotImplementedError("render_winograd: an epilogue needs the C renderer's scalar_code")
            epi = _Epilogue(node.src[2], out, scalar)
        by_channel = k.strides[1] == 1 and k.src_shape[1] % CHANNEL_BLOCK == 0
        body = (_output_by_channel if by_channel else _output)(k, a, m, th, tw, AT, x, o, epi)
        if epi is not None:
            helpers.update(epi.helpers)
    lines = [f"  {line}" if line else "" for line in body]
    return helpers, params + sz.params(), "\n".join(lines), bufs, sz.vars(), ("float",) * len(bufs)


_NOT_HOISTED = (Ops.CONST, Ops.RANGE, Ops.BUFFER)


class _Epilogue:
    """An output transform's epilogue (uopc.codegen.winograd): the scalar value of output (n, k, p), RANGEs 0-2 of
    `value` (p: the position in the plane), from the transform's own value there (the loads of `out`). What depends
    on n and k alone (a BatchNorm's scale and shift, its square root) is computed once per output channel
    (`channel`); the rest per element (`store`), over outputs the transform has just stored, in place: in one loop
    over a chunk of rows or over a block's planes, which gcc vectorizes (applied as each output was stored, among a
    tile's scattered stores, it stayed scalar and took up to 1.6x the time of the transform and a separate
    elementwise kernel: ResNet-18's 28x28 layers at batch 1)."""

    def __init__(self, value: UOp, out: UOp, scalar: Callable) -> None:
        topo = value.toposort()
        self.scalar, self.value = scalar, value
        self.loops = {u.arg.idx: u for u in topo if u.op is Ops.RANGE}
        self.own = [u for u in topo if u.op is Ops.LOAD and u.src[0].src[0] is out]
        per_element = {self.loops[2]} if 2 in self.loops else set()
        per_element |= set(self.own)
        varies = set()
        for u in topo:
            if u in per_element or any(s in varies for s in u.src):
                varies.add(u)
        # the values computed per channel: those the per-element part reads, not constants
        self.hoisted = list(dict.fromkeys(
            s for u in topo if u in varies for s in u.src if s not in varies and s.op not in _NOT_HOISTED
        ))  # fmt: skip
        self.helpers: dict[str, tuple[int, str]] = {}
        self.names: dict[UOp, str] = {}
        self.first = 0

    def _index(self, n: str, k: str, p: str = "") -> dict[UOp, str]:
        """The loops' names: C expressions, parenthesized unless a name."""
        named = zip(range(3), (n, k, p), strict=True)
        return {self.loops[i]: c if c.isidentifier() else f"({c})" for i, c in named if i in self.loops and c}

    def _take(self, hs: dict) -> None:
        self.helpers.update({name: (int(h.rank), h.code) for name, h in hs.items()})

    def channel(self, n: str, k: str) -> list[str]:
        """Statements computing the per-channel values of output channel `k` (a C expression) of image `n`."""
        if not self.hoisted:
            return []
        lines, exprs, hs, last = self.scalar(self.hoisted, self._index(n, k))
        self._take(hs)
        self.names = {u: f"ep{j}" for j, u in enumerate(self.hoisted)}
        self.first = last
        types = [u.dtype.cname for u in self.hoisted]
        return [*lines, *(f"const {t} ep{j} = {e};" for j, (t, e) in enumerate(zip(types, exprs, strict=True)))]

    def store(self, dst: str, n: str, k: str, p: str) -> str:
        """One C statement: lvalue `dst`, output (n, k, p) as the transform stored it, = the epilogue's value there."""
        names = {**self.names, **self._index(n, k, p), **dict.fromkeys(self.own, dst)}
        lines, (e,), hs, _ = self.scalar([self.value], names, self.first)
        self._take(hs)
        return "{ " + " ".join([*lines, f"{dst} = {e};"]) + " }"


def _weight(sz: _Sizes, k, a: int, G, x: str, o: str) -> list[str]:
    K, C, _, _ = k.src_shape
    sK, sC, sH, sW = k.strides
    p = k.op.panel
    B = p or 64  # filters per block: each of the alpha^2 rows is written 64 floats (or a panel) at a time
    KS, CS, SK, SC = sz("K", K), sz("C", C), sz("SK", sK), sz("SC", sC)
    g = [[f"ws[{sz.times(str(i), 'SH', sH)} + {sz.times(str(j), 'SW', sW)}]" for j in range(3)] for i in range(3)]
    prods, u = _products(G, g, G, "")
    if p:  # a block is one panel: the filters kb*p .. kb*p + p-1 of channel c, zeros past K
        loop = [
            f"const long long KB = ({KS} + {p - 1}) / {p}, PS = KB * {CS} * {p};  // PS: one point's panels",
            f"#pragma omp parallel for schedule(static) if (KB * {CS} * {p} > 4096)",
            f"for (long long q = 0; q < KB * {CS}; q++) {{",
            f"  const long long kb = q / {CS}, c = q % {CS};",
            f"  const int nb = {KS} - kb * {p} < {p} ? (int)({KS} - kb * {p}) : {p};",
        ]
        src = f"(kb * {p} + f) * {SK} + c * {SC}"
        store = [f"    for (int f = 0; f < {p}; f++) {o}[r * PS + q * {p} + f] = f < nb ? blk[r][f] : 0.0f;"]
    else:
        loop = [
            f"const long long KC = {KS} * {CS};",
            "#pragma omp parallel for schedule(static) if (KC > 4096)",
            f"for (long long b0 = 0; b0 < KC; b0 += {B}) {{",
            f"  const int nb = KC - b0 < {B} ? (int)(KC - b0) : {B};",
        ]
        src = f"(b0 + f) / {CS} * {SK} + (b0 + f) % {CS} * {SC}"
        store = [f"    for (int f = 0; f < nb; f++) {o}[r * KC + b0 + f] = blk[r][f];"]
    return [
        *loop,
        f"  float blk[{a * a}][{B}];  // (the rows are K*C floats apart: stored one filter at a time, at K*C a",
        "  // multiple of 4 KiB, every store of a filter went to one L1 set)",
        "  for (int f = 0; f < nb; f++) {",
        f"    const float* restrict ws = {x} + {sz('OFF', k.offset)} + {src};",
        *(f"    {line}" for line in prods),
        *(f"    blk[{i * a + j}][f] = {u[i][j]};" for i in range(a) for j in range(a)),
        "  }",
        f"  for (int r = 0; r < {a * a}; r++)",
        *store,
        "}",
    ]


# the output transform computes OUT_CHUNK tiles (whole tile rows, at least one) before it writes their outputs: over
# a chunk, each of the alpha^2 products is a run of consecutive floats, so the tile loop vectorizes (a loop over one
# tile row's 7 tiles at 28x28 stayed scalar: 7.2 ms for batch 64 x 64 channels at 28x28, 2.7 ms chunked), and the
# chunk's outputs (16 x 256 floats for F(4,3)) stay in L1 until each output row is written from them. An input
# transform writing panels (Winograd.panel) keeps a chunk the same way before it copies it out.
OUT_CHUNK = 256


def _planes(flat: str, chan: str, N: int, C: int, tiles: int) -> list[str]:
    """The parallel loop over (channel `chan`, image n) planes, flattened as `flat`, on threads past 64 tiles.
    Channel-major: consecutive planes are the images of one channel, whose tiles are adjacent in the products (an
    image's tiles are a run of `tiles` floats in each of the alpha^2 rows, its neighbours' runs share their end
    cache lines). Image-major, 64 planes lay between two writes of a shared line: (64, 64, 28, 28)'s input transform
    took 4.5 ms, channel-major 2.8 ms."""
    return [
        f"#pragma omp parallel for schedule(static) if ({N * C * tiles}LL > 64)",
        f"for (long long {flat} = 0; {flat} < {N * C}LL; {flat}++) {{",
        f"  const long long {chan} = {flat} / {N}LL, n = {flat} % {N}LL;",
    ]


# the input transform takes its tiles in runs of whole tile rows, of at most ROW_TILES tiles (one tile row if it has
# more): a run's B^T d columns (2 x 6 x 64 x 4 floats for F(4,3): 12 KiB) stay in L1 until its (B^T d) B half reads them
ROW_TILES = 64


def _input(k, a: int, m: int, th: int, tw: int, BT, x: str, o: str) -> list[str]:
    N, C, H, W = k.src_shape
    sN, sC, sH, sW = k.strides
    pt, pl = k.op.pads
    T, nr = N * th * tw, k.op.panel
    R = max(1, min(th, ROW_TILES // tw))  # tile rows per run
    pitch = tw * m  # a tile row's columns in cm and cs
    tile = [f"ci[t * {m} + {q}]" if q < m else f"si[t * {m} + {q - m}]" for q in range(a)]  # tile t's column q
    v = [_combo(BT[j], tile) for j in range(a)]
    if nr:  # OUT_CHUNK tiles (whole runs) into st, then their runs of tiles into the panels
        rows = R * max(1, min(-(-th // R), OUT_CHUNK // tw // R))
        stores = [f"        st[i * {a} + {j}][(ty0 % {rows}) * {tw} + t] = {v[j]};" for j in range(a)]
        out = _panel_stores(a * a, *k.op.shape[1:3], T, tw, th, rows, nr, o, "ty0 + nrow - 1", k.op.stream)
        head, dst = [f"  float st[{a * a}][{rows * tw}];"], []
    else:  # straight into V: a run's tiles are consecutive in each of its alpha^2 rows
        stores = [f"        vi[{j * T}LL + t] = {v[j]};" for j in range(a)]
        out, head = [], [f"  float* restrict vs = {o} + c * {a * a * T}LL + n * {th * tw}LL;"]
        dst = [f"      float* restrict vi = vs + ty0 * {tw} + i * {a * T}LL;"]
    return [
        *_planes("cn", "c", N, C, th * tw),
        f"  const float* restrict xs = {x} + {k.offset}LL + n * {sN}LL + c * {sC}LL;",
        f"  static const float zr[{W if sW == 1 else 1}];  // a row above or below the input: zeros",
        *head,
        f"  float cm[{a}][{R * pitch}], cs[{a}][{R * pitch}];",
        f"  for (int ty0 = 0; ty0 < {th}; ty0 += {R}) {{",
        f"    const int nrow = {th} - ty0 < {R} ? {th} - ty0 : {R};",
        "    for (int r = 0; r < nrow; r++) {",
        f"      const int ty = ty0 + r, row = r * {pitch};",
        *(line for i in range(a) for line in _row(i, m, pt, H, sH, sW)),
        *_columns(a, BT, "cm", 0, pitch, pl, W, sW),
        *_columns(a, BT, "cs", m, pitch + 2, pl, W, sW),
        "    }",
        f"    for (int i = 0; i < {a}; i++) {{  // (B^T d) B of row i of each tile of the run: {a} of its {a * a}",
        "      const float* restrict ci = cm[i], * restrict si = cs[i];",
        *dst,
        f"      for (int t = 0; t < nrow * {tw}; t++) {{",
        *stores,
        "      }",
        "    }",
        *out,
        "  }",
        *(_panel_tail(a * a, *k.op.shape[1:3], T, nr, N, o) if nr else []),
        *(
            ["  uopc_stream_fence();  // the plane's streamed stores done before the products read them"]
            if k.op.stream
            else []
        ),
        "}",
    ]


# the streamed panel stores (Winograd.stream): plain stores up to a 64-byte boundary, then whole vectors of the widest
# kind the compiler targets with non-temporal moves (they go to memory without reading the line first), then plain
# stores; a fence after each plane orders them before the barrier that ends the transform (as memcpy's do)
STREAM_HELPER = """static inline void uopc_stream_floats(float* restrict d, const float* restrict s, int n) {
  int u = 0;
  for (; u < n && ((__UINTPTR_TYPE__)(d + u) & 63); u++) d[u] = s[u];
#if defined(__AVX512F__)
  typedef float uopc_nt_t __attribute__((vector_size(64)));
  for (; u + 16 <= n; u += 16) { uopc_nt_t v; __builtin_memcpy(&v, s + u, 64); __builtin_ia32_movntps512(d + u, v); }
#elif defined(__AVX__)
  typedef float uopc_nt_t __attribute__((vector_size(32)));
  for (; u + 8 <= n; u += 8) { uopc_nt_t v; __builtin_memcpy(&v, s + u, 32); __builtin_ia32_movntps256(d + u, v); }
#elif defined(__SSE__)
  typedef float uopc_nt_t __attribute__((vector_size(16)));
  for (; u + 4 <= n; u += 4) { uopc_nt_t v; __builtin_memcpy(&v, s + u, 16); __builtin_ia32_movntps(d + u, v); }
#endif
  for (; u < n; u++) d[u] = s[u];
}
static inline void uopc_stream_fence(void) {
#if defined(__SSE__)
  __builtin_ia32_sfence();
#endif
}
"""


def _row(i: int, m: int, pt: int, H: int, sH: int, sW: int) -> list[str]:
    """C pointing r{i} at input row ty*m - pt + i, or at the zero row where that is outside the input. Read at a
    stride sW (not 1), the row's element j is r{i}[j * s{i}], s{i} 0 for the zero row (a single zero)."""
    y = f"ty * {m} + {i - pt}"
    inside = f"{y} >= 0 && {y} < {H}"
    out = [
        f"      const int in{i} = {inside};",
        f"      const float* restrict r{i} = in{i} ? xs + (long long)({y}) * {sH}LL : zr;",
    ]
    return out if sW == 1 else [*out, f"      const long long s{i} = in{i} ? {sW}LL : 0;"]


def _columns(a: int, BT, dst: str, lo: int, hi: int, pl: int, W: int, sW: int) -> list[str]:
    """C computing B^T d of the columns c in [lo, hi) of a tile row's alpha input rows r0 .. r{a-1} (column c is
    input column c - pl; zeros outside the input) into dst[i][row + c - lo]: cm holds each tile row's columns from
    0 (every tile's first m), cs from m (every tile's last two, the next tile's first ones)."""
    inside = (max(lo, pl), min(hi, pl + W))
    zeros = [z for z in ((lo, min(hi, pl)), (max(lo, pl + W), hi)) if z[0] < z[1]]
    out = []
    for z0, z1 in zeros:
        out.append(f"      for (int c = {z0}; c < {z1}; c++) {{")
        out += [f"        {dst}[{i}][row + c - {lo}] = 0.0f;" for i in range(a)]
        out.append("      }")
    if inside[0] < inside[1]:
        at = [f"c - {pl}" if sW == 1 else f"(c - {pl}) * s{q}" for q in range(a)]
        out.append(f"      for (int c = {inside[0]}; c < {inside[1]}; c++) {{")
        out += [
            f"        {dst}[{i}][row + c - {lo}] = {_combo(BT[i], [f'r{q}[{at[q]}]' for q in range(a)])};"
            for i in range(a)
        ]
        out.append("      }")
    return out


def _panel_stores(
    points: int, blocks: int, C: int, T: int, tw: int, th: int, rows: int, nr: int, o: str, ty: str, stream: bool
):
    """C copying the chunk of tile rows in st[point][tile] into the panels (points, blocks, C, nr) (blocks: ceil(T/nr)
    or a few more, C: their channel slots, uopc.uop.winograd.winograd_panels), after the chunk's last tile row: tile t
    of channel c goes to [point][t / nr][c][t % nr], in runs that end at a panel's end (runs of a whole chunk, not of
    one tile row: a tile row's 7 tiles at 28x28 made the copy cost more than the packing copy it replaces). A run of a
    whole panel row (nr tiles, all but a chunk's last) is copied at its constant size, not by gcc's loop over a run of
    any length: ResNet-18's input transforms at batch 1 (6-tile panels; per kernel, alternating processes) at 28x28
    0.109-0.144 -> 0.089-0.126 ms, at 14x14 0.083-0.088 -> 0.057-0.060; at batch 8 (7x7) within noise."""
    ps = blocks * C * nr  # one point's panels
    copy = f"for (int u = 0; u < run; u++) dst[p * {ps}LL + u] = st[p][i + u];"
    whole = f"__builtin_memcpy(dst + p * {ps}LL, &st[p][i], {4 * nr});"
    return [
        f"    if (({ty}) % {rows} == {rows - 1} || ({ty}) == {th - 1}) {{",
        f"      const int first = ({ty}) - ({ty}) % {rows}, count = (({ty}) - first + 1) * {tw};",
        "      for (int i = 0; i < count;) {",
        f"        const long long t = n * {th * tw}LL + first * {tw}LL + i;",
        f"        const int run = count - i < {nr} - (int)(t % {nr}) ? count - i : {nr} - (int)(t % {nr});",
        f"        float* restrict dst = {o} + t / {nr} * {C * nr}LL + c * {nr}LL + t % {nr};",
        *(
            [f"        for (int p = 0; p < {points}; p++) uopc_stream_floats(dst + p * {ps}LL, &st[p][i], run);"]
            if stream
            else [
                f"        if (run == {nr})",
                f"          for (int p = 0; p < {points}; p++) {whole}",
                "        else",
                f"          for (int p = 0; p < {points}; p++) {copy}",
            ]
        ),
        "        i += run;",
        "      }",
        "    }",
    ]


def _panel_tail(points: int, blocks: int, C: int, T: int, nr: int, N: int, o: str) -> list[str]:
    """C zeroing, once per channel, the last panel's columns past tile T (the products read whole panels; C: the
    channel slots; blocks past it are not read)."""
    if not nr or T % nr == 0:
        return []
    ps, last = blocks * C * nr, (T // nr) * C * nr
    return [
        f"  if (n == {N - 1})",
        f"    for (int p = 0; p < {points}; p++)",
        f"      for (int u = {T % nr}; u < {nr}; u++) {o}[p * {ps}LL + {last}LL + c * {nr}LL + u] = 0.0f;",
    ]


# the output transform's A^T y half reads the products a column q of the tile's points at a time, alpha streams
# rather than alpha^2 at once: they lie K*T floats apart, a multiple of 4 KiB at every ResNet-18 layer at batch 8,
# where 36 streams on one L1 set evicted each other's lines. In a C harness, (8, 64, 56, 56)'s transform took 0.79-0.94
# ms against 1.13-1.20 (points a cache line off 4 KiB: 0.49-0.69); in uopc (DEBUG=2, interleaved) 0.97-1.24 against
# 1.14-1.30, and gcc took 64-125 ms on each of ResNet-18's three such units at batch 8 against 117-188 (one loop over
# q where the alpha^2 products were written out). Its runs of OUT_RUN tiles go to am (4 x 6 x 64 floats), which the A
# half then reads.
OUT_RUN = 64


def _output(k, a: int, m: int, th: int, tw: int, AT, y: str, o: str, epi: _Epilogue | None = None) -> list[str]:
    _, K, _ = k.src_shape
    s0, s1, s2 = k.strides
    N, _, OH, OW = k.op.shape
    rows = max(1, min(th, OUT_CHUNK // tw))  # tile rows per chunk
    full, rem = OW // m, OW % m  # tiles whose m columns are all inside, and the inside columns of the last
    col = [_combo(AT[i], [f"yq[{p * a * s0}LL + t * {s2}LL]" for p in range(a)]) for i in range(m)]
    outs = [[_combo(AT[j], [f"am[{i}][{q}][t]" for q in range(a)]) for j in range(m)] for i in range(m)]
    tail = [f"        orow[{full * m + j}] = st[i * {m} + {j}][b + {full}];" for j in range(rem)]
    chan = epi.channel("n", "kk") if epi is not None else []  # (first: the per-element part reads its names)
    after = []
    if epi is not None:  # over the chunk's rows just written, in L1: one contiguous loop (per row, 28 or 14
        # outputs, the loop's ends cost more than the separate kernel saved: ResNet-18's 28x28 and 14x14 at batch 8)
        after = [
            f"    const int p1 = ((ty0 + nr) * {m} < {OH} ? (ty0 + nr) * {m} : {OH}) * {OW};",
            f"    for (int p = ty0 * {m * OW}; p < p1; p++) {epi.store('os[p]', 'n', 'kk', 'p')}",
        ]
    return [
        *_planes("kn", "kk", N, K, th * tw),
        f"  const float* restrict ys0 = {y} + {k.offset}LL + kk * {s1}LL + n * {th * tw * s2}LL;",
        f"  float* restrict os = {o} + (n * {K}LL + kk) * {OH * OW}LL;",
        *(f"  {line}" for line in chan),
        f"  float st[{m * m}][{rows * tw}];  // a chunk of tile rows' outputs, one row per output point of a tile",
        f"  float am[{m}][{a}][{OUT_RUN}];  // A^T y of a run of tiles",
        f"  for (int ty0 = 0; ty0 < {th}; ty0 += {rows}) {{",
        f"    const int nr = {th} - ty0 < {rows} ? {th} - ty0 : {rows};",
        f"    for (int t0 = 0; t0 < nr * {tw}; t0 += {OUT_RUN}) {{  // the chunk's tiles in runs, a vector at a time",
        f"      const int nt = nr * {tw} - t0 < {OUT_RUN} ? nr * {tw} - t0 : {OUT_RUN};",
        f"      for (int q = 0; q < {a}; q++) {{",
        f"        const float* restrict yq = ys0 + (ty0 * {tw} + t0) * {s2}LL + q * {s0}LL;",
        "        for (int t = 0; t < nt; t++) {",
        *(f"          am[{i}][q][t] = {col[i]};" for i in range(m)),
        "        }",
        "      }",
        "      for (int t = 0; t < nt; t++) {",
        *(f"        st[{i * m + j}][t0 + t] = {outs[i][j]};" for i in range(m) for j in range(m)),
        "      }",
        "    }",
        "    for (int rr = 0; rr < nr; rr++)  // each output row of the chunk, its tiles' points interleaved",
        f"      for (int i = 0; i < {m} && (ty0 + rr) * {m} + i < {OH}; i++) {{",
        f"        const int oy = (ty0 + rr) * {m} + i, b = rr * {tw};",
        f"        float* restrict orow = os + (long long)oy * {OW}LL;",
        f"        for (int tx = 0; tx < {full}; tx++) {{",
        *(f"          orow[tx * {m} + {j}] = st[i * {m} + {j}][b + tx];" for j in range(m)),
        "        }",
        *tail,
        "      }",
        *after,
        "  }",
        "}",
    ]


# products laid out channel-minor (Y^T: a convolution with few tiles computes them as (alpha^2, T, K), uopc.tensor.conv)
# are transformed CHANNEL_BLOCK channels at a time, one vector of channels per product
CHANNEL_BLOCK = 16
# ...over chunks of this many tiles, staged (16 points x 16 tiles x 16 channels: 16 KiB) before the outputs are
# written channel by channel
CHANNEL_TILES = 16


def _output_by_channel(
    k, a: int, m: int, th: int, tw: int, AT, y: str, o: str, epi: _Epilogue | None = None
) -> list[str]:
    """The output transform of products whose channels are contiguous (strides (s0, 1, s2)): vectorized over a block
    of channels (the tile loop would read each product at a stride of K), the outputs staged by tile and written
    out channel by channel, cut to OH x OW."""
    _, K, _ = k.src_shape
    s0, _, s2 = k.strides
    N, _, OH, OW = k.op.shape
    cb, tt = CHANNEL_BLOCK, th * tw
    ct = min(tt, CHANNEL_TILES)
    yy = [[f"ys[{(i * a + j) * s0}LL + c]" for j in range(a)] for i in range(a)]
    prods, r = _products(AT, yy, AT, "")
    after = []
    if epi is not None:  # the block's planes, once all their tiles are written: each in one loop
        after = [
            f"  for (int c = 0; c < {cb}; c++) {{",
            f"    float* restrict oc = {o} + (n * {K}LL + k0 + c) * {OH * OW}LL;",
            *(f"    {line}" for line in epi.channel("n", "k0 + c")),
            f"    for (int p = 0; p < {OH * OW}; p++) {epi.store('oc[p]', 'n', 'k0 + c', 'p')}",
            "  }",
        ]

    return [
        f"#pragma omp parallel for schedule(static) if ({N * K * tt}LL > 64)",
        f"for (long long bn = 0; bn < {K // cb * N}LL; bn++) {{",
        f"  const long long k0 = bn / {N}LL * {cb}, n = bn % {N}LL;",
        f"  float st[{m * m}][{ct}][{cb}];  // a chunk of tiles' outputs, a vector of channels per point and tile",
        f"  for (int t0 = 0; t0 < {tt}; t0 += {ct}) {{",
        f"    const int nt = {tt} - t0 < {ct} ? {tt} - t0 : {ct};",
        "    for (int t = 0; t < nt; t++) {",
        f"      const float* restrict ys = {y} + {k.offset}LL + (n * {tt}LL + t0 + t) * {s2}LL + k0;",
        f"      for (int c = 0; c < {cb}; c++) {{",
        *(f"        {line}" for line in prods),
        *(f"        st[{i * m + j}][t][c] = {r[i][j]};" for i in range(m) for j in range(m)),
        "      }",
        "    }",
        f"    for (int c = 0; c < {cb}; c++) {{",
        f"      float* restrict oc = {o} + (n * {K}LL + k0 + c) * {OH * OW}LL;",
        "      for (int t = 0; t < nt; t++) {",
        f"        const int y0 = (t0 + t) / {tw} * {m}, x0 = (t0 + t) % {tw} * {m};",
        *(
            f"        if (y0 + {i} < {OH} && x0 + {j} < {OW}) oc[(y0 + {i}) * {OW} + x0 + {j}] = st[{i * m + j}][t][c];"
            for i in range(m)
            for j in range(m)
        ),
        "      }",
        "    }",
        "  }",
        *after,
        "}",
    ]

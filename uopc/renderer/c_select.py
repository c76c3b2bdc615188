"""Selects, PAD (gated) loads and stores that keep a copied element (kept_stores) as C. A scalar float select is
bit arithmetic, never `c ? a : b`, and so is an integer one against 0:

data4[i] = uopc_keepf(alu3 < 0.0f, val);         /* where(c, val, 0): val's bits ANDed with c's mask */
data4[i] = uopc_selectf(6.0f < alu5, 6.0f, alu5); /* where(c, a, b): a's bits where c holds, b's elsewhere */

Wherever gcc keeps a loop scalar, it compiled a float select to compare-and-jump (its phi optimization first moves
an accumulator's add into both arms), and on data a coin toss mispredicts half of them: the CNN step's max-pool
backward on a ReLU mask, 2.3 -> 1.0 ms in a C harness on random data; MobileNetV2's head, relu6(BatchNorm(x))
averaged over 1280 x 7 x 7 (four channels' sums interleaved, so not vectorized), 0.28 ms -> 6 us. Where gcc
vectorizes the loop it compiles the bits back to the same compare and masked move as the select (gcc 12, AVX-512:
4M floats, 1.54-1.63 ms either way; relu6 over 1M, 0.08 against 0.11 ms). The bits kept are the values' own: -0.0,
NaN and inf pass through unchanged. Both values are computed: they are loads already read and ALU values, no call
that a branch would skip.
"""

from __future__ import annotations

import math

from uopc import helpers
from uopc.codegen.vectorize import buffer_of
from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes

__all__ = ["gate_load", "gated_load", "gated_vector_load", "kept_stores", "render_where"]

# per float type: its C type, the helpers' name suffix, the unsigned integer of its size, its bit casts' width and
# the unsigned zero that 0 - c makes all ones of
_FLOATS = {dtypes.float32: ("float", "f", "uint32_t", 32, "0u"), dtypes.float64: ("double", "", "uint64_t", 64, "0ull")}
# name and C of: a float kept where c holds (else +0.0), and a float select between two values
_KEEP = {
    dt: (f"uopc_keep{s}", f"static inline {t} uopc_keep{s}(int c, {t} x) "
         f"{{ return uopc_as_f{w}(uopc_as_u{w}(x) & ({z} - ({u})c)); }}\n")
    for dt, (t, s, u, w, z) in _FLOATS.items()
}  # fmt: skip
_SELECT = {
    dt: (f"uopc_select{s}", f"static inline {t} uopc_select{s}(int c, {t} a, {t} b) {{ {u} m = {z} - ({u})c; "
         f"return uopc_as_f{w}((uopc_as_u{w}(a) & m) | (uopc_as_u{w}(b) & ~m)); }}\n")
    for dt, (t, s, u, w, z) in _FLOATS.items()
}  # fmt: skip


# An integer select against 0 (an argmax's `hit ? weight : 0`: max pool's backward, argmax over a window) is the
# value ANDed with 0 - c: where gcc keeps the loop scalar (the remainder of a 14-wide row of the CNN step's 2x2
# argmax) the select was a compare and jump; that kernel ran 0.35 -> 0.25 ms in a C harness, its vectorized part as
# fast. (Other integer selects are left to gcc, which makes them a cmov.)


def _is_pos_zero(x: UOp) -> bool:
    return x.op is Ops.CONST and x.arg == 0 and not math.copysign(1.0, x.arg) < 0


def _kept(u: UOp) -> tuple[UOp, bool] | None:
    """(the value, whether it is kept where the condition holds) of a select of a value against +0.0, else None."""
    if u.op is not Ops.WHERE:
        return None
    if _is_pos_zero(u.src[2]):
        return u.src[1], True
    if _is_pos_zero(u.src[1]):
        return u.src[2], False
    return None


def render_where(r, u: UOp) -> str:
    """C for WHERE `u` (r: the uopc.renderer.c.CRenderer rendering it). A select against +0.0 of one against +0.0
    (where(mask, where(tap == argmax, g, 0), 0): a max-pool's backward) takes both conditions into one mask."""
    c, a, b = u.src
    if c.dtype.count > 1 and c.dtype.is_int:  # a vector mask (codegen.lanes): a's bits where its lane is set, else b's
        it, m = c.dtype.cname, r.expr(c)
        return f"(({u.dtype.cname})((({it}){r.expr(a)} & {m}) | (({it}){r.expr(b)} & ~{m})))"
    if u.dtype.is_int and u.dtype.count == 1 and u.dtype is not dtypes.bool and (kept := _kept(u)) is not None:
        x, when = kept  # an integer against 0: its bits ANDed with 0 - c (see above)
        cond = r.expr(c) if when else f"!{r.expr(c)}"
        return f"({r.expr(x)} & ({u.dtype.cname})(0 - ({u.dtype.cname})({cond})))"
    if u.dtype not in _KEEP:
        return f"({r.expr(c)}?{r.expr(a)}:{r.expr(b)})"
    r.use_bits()
    if (kept := _kept(u)) is None:
        name, code = _SELECT[u.dtype]
        r.use(name, code)
        return f"{name}({r.expr(c)}, {r.expr(a)}, {r.expr(b)})"
    name, code = _KEEP[u.dtype]
    r.use(name, code)
    conds = []
    while kept is not None:
        x, when = kept
        conds.append(r.expr(u.src[0]) if when else f"!{r.expr(u.src[0])}")
        u, kept = x, _kept(x)
    return f"{name}({' & '.join(conds)}, {r.expr(u)})"


def gate_load(r, dtype, gate: str, raw: str, zero: str) -> str:
    """C for a PAD load's value: `raw`, the element read unconditionally, where `gate` holds, else `zero`. A float's
    bits are ANDed with the gate's mask (uopc_keepf), not selected: gcc 12 turned `gate ? raw : 0` into a masked
    load, and a masked load at a stride (a window's tap over the output's innermost loop) stopped its vectorizer. A
    depthwise 3x3 stride-2 convolution's window sum over 8 x 96 x 112 x 112, its window unrolled: 3.1-3.9 ms
    scalar, 1.1-1.7 ms vectorized (a C harness, the same bits)."""
    if dtype not in _KEEP:
        return f"({gate}?{raw}:{zero})"
    name, code = _KEEP[dtype]
    r.use_bits()
    r.use(name, code)
    return f"{name}({gate}, {raw})"


def _slack(r, base: UOp, dtype) -> int:
    """How many elements past either end of `base` a kernel may read: in a plan's kernel (`guarded`) a buffer has
    helpers.STORAGE_GUARD bytes of mapped memory on each side; none elsewhere, nor under UOPC_CHECK_OOB, which checks
    every element read."""
    return helpers.STORAGE_GUARD // dtype.itemsize if r.guarded and base.op is Ops.BUFFER and not r.check_oob else 0


def gated_load(r, u: UOp, ind: str) -> None:
    """A PAD load: read at the index clamped into the buffer (never out of range), then keep it or 0 by the
    gate. The load itself is unconditional: with `gate ? data[i] : 0` (or `data[gate ? i : 0]`) gcc 12.2's
    if-conversion + outer-loop vectorization summed the wrong elements (padded window sum test).

    In a plan's kernel (`guarded`) a buffer has helpers.STORAGE_GUARD bytes of mapped memory on each side, so an
    index that strays no further than that is read unclamped: the loads of a row stay contiguous and gcc
    vectorizes them (a clamp per element made a padded copy a gather: the conv backward's gradient padding ran at
    4 GB/s). Under UOPC_CHECK_OOB the index is clamped as ever, so that the check sees it in range."""
    _, i, gate = u.src[0].src
    base = buffer_of(u.src[0])
    zero = r.expr(UOp.const(0, u.dtype))
    n = base.arg[1] if base.op is Ops.ALLOC else base.arg.shape[0]
    if n == 0:  # a padded empty buffer: every element is padding
        r.lines.append(f"{ind}{u.dtype.cname} {r.var(u, 'val')} = {zero};")
        return
    ie = r.expr(i)
    slack = _slack(r, base, u.dtype)
    strays = i.vmin < -slack or i.vmax > n - 1 + slack
    if strays and (split := _inner_part(r, u, i, slack)) is not None:
        outer, inner = split
        oe = r.expr(outer)
        lo, hi = -slack - inner.vmin, n - 1 + slack - inner.vmax  # (i = outer + inner stays within the guard)
        if outer.vmin < lo:
            oe = f"({oe}<{lo}?{lo}:{oe})"
        if outer.vmax > hi:
            oe = f"({oe}>{hi}?{hi}:{oe})"
        ie = f"({oe}+{r.expr(inner)})"
    elif strays:
        if i not in r.names and i.op is not Ops.CONST:  # the index is used up to three times
            r.n += 1
            r.lines.append(f"{ind}{i.dtype.cname} alu{r.n} = {ie};")
            ie = f"alu{r.n}"
        if i.vmin < 0:
            ie = f"({ie}<0?0:{ie})"
        if i.vmax > n - 1:
            ie = f"({ie}>{n - 1}?{n - 1}:{ie})"
    r.n += 1
    raw = f"val{r.n}"
    ref = r.ref(base, ie)
    r.lines.append(f"{ind}{u.dtype.cname} {raw} = {ref};")
    r.lines.append(f"{ind}{u.dtype.cname} {r.var(u, 'val')} = {gate_load(r, u.dtype, r.expr(gate), raw, zero)};")


def _terms(i: UOp) -> list[UOp]:
    return [t for s in i.src for t in _terms(s)] if i.op is Ops.ADD else [i]


def _inner_part(r, u: UOp, i: UOp, slack: int) -> tuple[UOp, UOp] | None:
    """Index `i` of gated load `u` as (outer, inner): the terms that vary along the innermost loop around the load,
    and the rest, when the inner ones span at most `slack` elements (so that clamping only the outer part, which
    that loop does not change, keeps every index within the guard and every gated-in one as it was); else None.
    The padded rows of a stride-2 copy, ResNet's stem (3 x 224 x 224 split into its four phases, 116 x 115 each),
    reach past the guard: with the whole index clamped gcc kept the copy scalar, with its row part clamped it reads
    the row's pairs as vectors (batch 1, a C harness: 0.080 -> 0.014 ms)."""
    scope = r.lin.scope.get(u, ())
    if not slack or not scope or i.op is not Ops.ADD:
        return None
    inner, outer = [], []
    for t in _terms(i):
        (inner if scope[-1] in t.toposort() else outer).append(t)
    if not inner or not outer:
        return None
    ins, out = sum(inner[1:], inner[0]), sum(outer[1:], outer[0])
    return (out, ins) if ins.vmax - ins.vmin <= slack else None


def gated_vector_load(r, u: UOp, ind: str) -> None:
    """A PAD load of consecutive elements (codegen.lanes), its gate a vector mask: the lanes read as one vector
    (masked past a partial vector's valid lanes), each then kept or 0 by the mask (its bits ANDed), where every
    lane's element lies in the buffer or the guard bytes it may read (_slack); where one might not, the lanes the
    mask holds are read one by one."""
    idx, t = u.src[0], u.dtype.cname
    _, i, mask = idx.src
    base, w = buffer_of(idx), u.dtype.count
    m, it, name = r.expr(mask), mask.dtype.cname, r.var(u, "val")
    slack = _slack(r, base, u.dtype.scalar())
    if i.vmin >= -slack and i.vmax + w <= base.arg.shape[0] + slack:
        raw = r.address(idx) if idx.arg is None else r.masked(idx)
        r.lines.append(f"{ind}{t} {name} = (({t})((({it}){raw}) & {m}));")
        return
    r.n += 1
    lane, first = f"lane{r.n}", f"alu{r.n}"
    r.lines.append(f"{ind}{i.dtype.cname} {first} = {r.expr(i)};")
    r.lines.append(f"{ind}{t} {name} = {{0}};")
    valid = w if idx.arg is None else idx.arg
    read = r.ref(base, f"{first}+{lane}")
    loop = f"for (int {lane} = 0; {lane} < {valid}; {lane}++)"
    r.lines.append(f"{ind}{loop} if ({m}[{lane}]) {name}[{lane}] = {read};")


def kept_stores(lin) -> dict[UOp, tuple[UOp, UOp]]:
    """Stores of `where(c, new, in[i])` (or `where(c, in[i], new)`) into out[i], another buffer at the same index,
    with a condition shared by all lanes and computed outside the store's loop: {store: (the load of in[i], new)}.
    They render as `if (c) out[i] = new; else if (out != in) out[i] = in[i];`, so where the plan writes out in
    place (out is in: TinyJit's update of a KV cache, a masked fill of a parameter's rows) the unchanged elements
    are neither read nor written; elsewhere it is the copy it was."""
    found = {}
    for u in lin.users:
        if u.op is not Ops.STORE or (val := u.src[1]).op is not Ops.WHERE or val.src[0].dtype.count != 1:
            continue
        if u.src[0].arg is not None:  # a partial vector's masked store
            continue
        out = buffer_of(u.src[0])
        for ld, new in ((val.src[2], val.src[1]), (val.src[1], val.src[2])):
            if ld.op is not Ops.LOAD or len(ld.src[0].src) != 2 or ld.src[0].src[1] is not u.src[0].src[1]:
                continue
            src = buffer_of(ld.src[0])
            if src.op is not Ops.BUFFER or out.op is not Ops.BUFFER or src is out or ld.dtype != val.dtype:
                continue
            # the condition computed outside the store's loop (a row's, as a KV cache position): a branch per row,
            # which gcc unswitches; a condition per element stays a select, which vectorizes
            hoisted = lin.scope[val.src[0]] != lin.scope[u]
            if hoisted and lin.users[ld] == [val] and lin.users[val] == [u] and lin.scope[ld] == lin.scope[u]:
                found[u] = (ld, new)
                break
    return found

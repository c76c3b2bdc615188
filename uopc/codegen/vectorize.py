"""Vectorize: after lowering, the copies of an upcast axis whose index is contiguous become SIMD vector ops.

    data2[r0*32+0] = acc0; ... data2[r0*32+15] = acc15      ->      *(f32x16*)(data2+r0*32) = acc0;  (f32x16 acc0)

Stores into one buffer at `width` consecutive indices form a group, and their values are rebuilt lane by lane:
a node that is the same in every lane stays scalar (broadcast with VECTORIZE where a vector needs it), loads at
consecutive indices become one vector load, loads elsewhere a VECTORIZE of scalar loads, the same ALU op the
vector op, and `width` accumulators one vector accumulator. A group holding anything else (a select on lanes, a
libm call, an integer division) is left scalar: gcc's vector extension has no C form for those. So is a group with a
float16 or bfloat16: their values are bits converted by integer helpers (render_c's uopc_f16_ld, ...), which gcc
vectorizes from the scalar loop (a half vector through __builtin_convertvector it converts lane by lane: gcc 12,
113 instructions for 16 lanes). One exception: bfloat16 loads at consecutive elements widened to float32 (a bf16
weight in a matmul) become one vector load of the bits and an integer widening and shift (render_c's uopc_bf16xN_ld).
"""

from __future__ import annotations

from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes
from uopc.uop.symbolic import simplify

__all__ = ["VECTOR_ALU", "buffer_of", "index_step", "split_offset", "vectorize"]

# ALU ops whose C operators apply lane-wise to gcc vectors of floats
VECTOR_ALU = frozenset({Ops.ADD, Ops.MUL, Ops.NEG})


class _Scalar(Exception):
    """This group of lanes has no vector form: keep it scalar."""


def split_offset(idx: UOp) -> tuple[UOp | None, int]:
    """An index as (symbolic part, constant offset): `r0*32+5` -> (r0*32, 5); a constant has no symbolic part."""
    if idx.op is Ops.CONST:
        return None, idx.arg
    if idx.op is Ops.ADD and idx.src[1].op is Ops.CONST:
        return idx.src[0], idx.src[1].arg
    if idx.op is Ops.ADD and idx.src[0].op is Ops.CONST:
        return idx.src[1], idx.src[0].arg
    return idx, 0


def index_step(i: UOp, r: UOp) -> int | None:
    """How far index `i` moves per step of `r` (a loop, a LANE): c where i = c*r + (terms without r), through ADDs
    and MULs by constants; else None."""
    if i is r:
        return 1
    if i.op is Ops.ADD:
        a, b = (index_step(s, r) for s in i.src)
        return None if a is None or b is None else a + b
    if i.op is Ops.MUL and Ops.CONST in (i.src[0].op, i.src[1].op):
        x, c = i.src if i.src[1].op is Ops.CONST else i.src[::-1]
        a = index_step(x, r)
        return None if a is None else a * c.arg
    return 0 if r not in i.toposort() else None


def _consecutive(idxs: tuple[UOp, ...], simp) -> bool:
    """Are these indices i, i+1, ..., i+n-1?"""
    b0, c0 = split_offset(simp(idxs[0]))
    for lane, i in enumerate(idxs):
        b, c = split_offset(simp(i))
        if b is not b0 or c != c0 + lane:
            d = simplify(i - idxs[0])
            if d.op is not Ops.CONST or d.arg != lane:
                return False
    return True


def buffer_of(idx: UOp) -> UOp:
    """The storage an INDEX addresses (through the AFTERs that order an accumulator)."""
    b = idx.src[0]
    while b.op is Ops.AFTER:
        b = b.src[0]
    return b


class _Lanes:
    """Rebuilds tuples of per-lane nodes as one vector node (memoized on the tuple)."""

    def __init__(self, width: int, simp):
        self.width, self.simp = width, simp
        self.memo: dict[tuple[UOp, ...], UOp] = {}

    def vec(self, lanes: tuple[UOp, ...]) -> UOp:
        if (hit := self.memo.get(lanes)) is None:
            hit = self.memo[lanes] = self._vec(lanes)
        return hit

    def wide(self, lanes: tuple[UOp, ...]) -> UOp:
        """A vector value of these lanes: a lane-invariant scalar is broadcast."""
        v = self.vec(lanes)
        if v.dtype is None or v.dtype.count == self.width:
            return v
        return UOp(Ops.VECTORIZE, (v,) * self.width)

    def _vec(self, lanes: tuple[UOp, ...]) -> UOp:
        u = lanes[0]
        if all(x is u for x in lanes):
            return u
        if any(x.op is not u.op or len(x.src) != len(u.src) for x in lanes):
            raise _Scalar
        n, op = self.width, u.op
        if op is Ops.CAST and u.dtype is dtypes.float32 and u.src[0].dtype is dtypes.bfloat16:
            return self._widened(lanes)
        if u.dtype is not None and u.dtype.is_16bit_float:
            raise _Scalar
        if op is Ops.ALLOC:
            if any(x.arg[1] != 1 or x.dtype is not u.dtype for x in lanes):
                raise _Scalar
            return UOp(Ops.ALLOC, (), u.arg, u.dtype.vec(n))
        if op in (Ops.AFTER, Ops.END):
            first = self.vec(tuple(x.src[0] for x in lanes))
            rest = [self.vec(tuple(x.src[k] for x in lanes)) for k in range(1, len(u.src))]
            return UOp(op, (first, *rest), u.arg, first.dtype if op is Ops.AFTER else None)
        if op is Ops.LOAD:
            idx = self._index(tuple(x.src[0] for x in lanes))
            if idx is None:  # a gather: scalar loads packed into a vector
                return UOp(Ops.VECTORIZE, lanes)
            return UOp(Ops.LOAD, (idx,), None, idx.dtype)
        if op is Ops.STORE:
            idx = self._index(tuple(x.src[0] for x in lanes))
            if idx is None:
                raise _Scalar
            return UOp(Ops.STORE, (idx, self.wide(tuple(x.src[1] for x in lanes))))
        if op is Ops.WHERE and all(x.src[0] is u.src[0] for x in lanes):  # one scalar condition for all lanes
            a, b = self.wide(tuple(x.src[1] for x in lanes)), self.wide(tuple(x.src[2] for x in lanes))
            return UOp(Ops.WHERE, (u.src[0], a, b), None, a.dtype)
        if op in VECTOR_ALU and u.dtype.is_float and all(x.dtype is u.dtype for x in lanes):
            srcs = tuple(self.wide(tuple(x.src[k] for x in lanes)) for k in range(len(u.src)))
            return UOp(op, srcs, u.arg, u.dtype.vec(n))
        raise _Scalar

    def _widened(self, lanes: tuple[UOp, ...]) -> UOp:
        """float32 lanes of bfloat16 loads at consecutive elements: one vector load of the 16-bit patterns, widened
        in registers (a bfloat16 weight streamed at half the bytes); any other 16-bit source stays scalar."""
        srcs = tuple(x.src[0] for x in lanes)
        if any(
            x.op is not Ops.CAST or x.dtype is not dtypes.float32 or s.op is not Ops.LOAD for x, s in zip(lanes, srcs)
        ):
            raise _Scalar
        idx = self._index(tuple(s.src[0] for s in srcs))
        if idx is None or buffer_of(idx).op is Ops.ALLOC:
            raise _Scalar
        return UOp(Ops.CAST, (UOp(Ops.LOAD, (idx,), None, idx.dtype),), None, dtypes.float32.vec(self.width))

    def _index(self, idxs: tuple[UOp, ...]) -> UOp | None:
        """One vector INDEX for these lanes, or None if they are not consecutive elements of one buffer."""
        i0 = idxs[0]
        if any(len(i.src) != 2 for i in idxs):  # gated (PAD) lanes are read one by one
            return None
        if buffer_of(i0).op is Ops.ALLOC:
            if any(buffer_of(i) is buffer_of(i0) for i in idxs[1:]):
                # lanes that share one local array (a staged row kept out of the output) read its elements, one by
                # one: taking the array for an accumulator per lane read lane 0's element in every lane
                return None
            # an accumulator per lane: the vector accumulator of these lanes
            buf = self.vec(tuple(i.src[0] for i in idxs))
            return UOp(Ops.INDEX, (buf, i0.src[1]), None, buf.dtype)
        if any(i.src[0] is not i0.src[0] for i in idxs) or not _consecutive(tuple(i.src[1] for i in idxs), self.simp):
            return None
        return UOp(Ops.INDEX, i0.src, None, i0.dtype.vec(self.width))


def vectorize(ast: UOp, width: int) -> UOp:
    """Rewrite groups of `width` stores at consecutive indices of one buffer (and everything only they use) into
    vector ops. Runs before `merge_ends` (each store still ENDs its own reduce loops)."""
    # the index expressions, simplified in one rewrite (shared parts once): the rest of the program need not be
    topo = ast.toposort()
    idxs = list(dict.fromkeys(u.src[1] for u in topo if u.op is Ops.INDEX))
    simplified = dict(zip(idxs, simplify(UOp(Ops.SINK, tuple(idxs))).src, strict=True))

    def simp(i: UOp) -> UOp:
        if (hit := simplified.get(i)) is None:
            hit = simplified[i] = simplify(i)
        return hit

    groups: dict[tuple, dict[int, UOp]] = {}
    for u in topo:
        if u.op is Ops.STORE and u.src[0].src[0].op is Ops.BUFFER and u.src[1].dtype.count == 1:
            b, c = split_offset(simp(u.src[0].src[1]))
            groups.setdefault((u.src[0].src[0], b), {})[c] = u
    lanes = _Lanes(width, simp)
    mapping: dict[UOp, UOp] = {}
    for by_off in groups.values():
        for c in sorted(by_off):
            run = tuple(by_off.get(c + k) for k in range(width))
            if any(s is None or s in mapping for s in run):  # runs start greedily at the lowest free offset
                continue
            try:
                v = lanes.vec(run)  # type: ignore[arg-type]
            except _Scalar:
                continue
            for s in run:
                mapping[s] = v
    if not mapping:
        return ast
    out = ast.substitute(mapping)
    # the lanes of one group now are one store: keep it once in each SINK
    dups = {u: u.replace(src=tuple(dict.fromkeys(u.src))) for u in out.toposort() if u.op is Ops.SINK}
    return out.substitute({k: v for k, v in dups.items() if v is not k})

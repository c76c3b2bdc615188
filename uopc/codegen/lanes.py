"""Lanes: a register tile lowered once per vector, not once per element.

Lowering a GEMM's 6x64 register tile with 16-float vectors as 384 scalar outputs, then regrouping them into vectors
(codegen.vectorize), cost 0.1-0.5 s per kernel: most of a training step's first call. Instead, `lower` gives the
vectorized axis of the tile a LANE, a RANGE of the vector's width (AxisType.UPCAST) that is never a loop, and builds
one scalar expression per vector (24 for that tile). `widen` then turns each into vector ops (and gathers that
read a block of memory together into a transpose in registers, codegen.transpose):

    data2[r0*64 + 16*k + LANE] = acc0      ->      *(f32x16*)(data2 + r0*64 + 16*k) = acc0      (f32x16 acc0)

A partial vector (the last of a region whose columns end inside it, codegen.loops.regions) is widened with `valid`
lanes, in a vector that may be narrower than the others: its loads and stores of the buffer are masked (INDEX.arg =
valid, rendered as masked moves), and a value built lane by lane computes 0 in the lanes past `valid`, which nothing
stores.

A node that does not mention LANE stays scalar (broadcast with VECTORIZE where a vector needs it); a load at an
index `base + LANE` becomes one vector load, a load elsewhere a VECTORIZE of its lanes' scalar loads; the vector ALU
ops (vectorize.VECTOR_ALU) apply lane-wise; an accumulator that lives inside LANE is one vector accumulator. Anything
else (a select on lanes, a libm call, a half-precision value) raises NoLanes: the kernel is then lowered element by
element and left to codegen.vectorize, which keeps such groups scalar. Both give the same vector program.
"""

from __future__ import annotations

from collections.abc import Callable

from uopc.codegen.transpose import transposed_tiles
from uopc.codegen.vectorize import VECTOR_ALU, buffer_of, index_step, split_offset
from uopc.uop import ALU, COMPARE, LOGIC, VECTOR_MATH, AxisType, Ops, RangeArg, UOp
from uopc.uop.dtype import DType, dtypes
from uopc.uop.symbolic import simplify

__all__ = ["NoLanes", "copies", "lane_of", "lane_stats", "partial_width", "widen"]

# a float select on a float compare widens to a select on gcc's vector mask, lanes of this integer type
_MASK = {dtypes.float32: dtypes.int32, dtypes.float64: dtypes.int64}

# lowerings under Opts.vec that built one expression per vector (lanes) or fell back to one per element (elements)
lane_stats = {"lanes": 0, "elements": 0}


class NoLanes(Exception):
    """A lane expression with no vector form: lower this kernel element by element instead."""


def _sum_terms(u: UOp) -> list[UOp]:
    """The operands of a chain of ADDs, left to right."""
    if u.op is Ops.ADD:
        return _sum_terms(u.src[0]) + _sum_terms(u.src[1])
    return [u]


def lane_of(width: int, copies: int, dtype: DType) -> UOp | None:
    """The LANE of a region whose last axis has `copies` upcast copies, when they are whole vectors of `width`."""
    if width < 2 or copies < width or copies % width:
        return None
    return UOp(Ops.RANGE, (UOp.const(width, dtype),), RangeArg(-1, AxisType.UPCAST), dtype)


def copies(part: tuple[UOp, int], lane: UOp) -> list[UOp]:
    """The last axis's index in each vector of its copies: b*f + k*w + LANE (part = (b, f), b a loop or 0)."""
    (b, f), w = part, lane.src[0].arg
    zero = b.op is Ops.CONST and b.arg == 0
    return [(UOp.const(k * w, b.dtype) if zero else b * f + k * w) + lane for k in range(f // w)]


class _Widen:
    """Rewrites scalar expressions in one LANE into vector expressions of its width (memoized per node)."""

    def __init__(self, lane: UOp, free, valid: int | None = None, width: int | None = None, share: bool = False):
        self.lane, self.width, self.free, self.share = lane, width or lane.src[0].arg, free, share
        self.valid = self.width if valid is None else valid  # lanes past it exist in no buffer: masked
        self.memo: dict[UOp, UOp] = {}
        self.simplified: dict[UOp, UOp] = {}  # index -> simplified index (simplify_indices)
        self.lane_values: dict[UOp, list[UOp]] = {}  # index -> its value in each lane (_lanes)

    def vec(self, u: UOp) -> UOp:
        if (hit := self.memo.get(u)) is None:
            hit = self.memo[u] = u if self.free(u) else self._vec(u)
        return hit

    def wide(self, u: UOp) -> UOp:
        """A vector value of u: a lane-free scalar is broadcast. In a partial vector narrower than whole vectors of
        its tile (`share`), a computed scalar's broadcast is the first lanes of the full-width one (a SHUFFLE of one
        source), which the whole vectors broadcast the same scalar to: gcc then loads it once, as a broadcast from
        memory, where a broadcast of its own took a scalar load and a shuffle on the FMA port for each (ResNet-50's
        2048 x 512 @ 512 x 49, 6 rows x (3 vectors + 1 column), alone in a C harness: 0.46 -> 0.40 ms). Not in a
        region of one partial vector (a depthwise convolution's 7-wide rows: 0.026 -> 0.037 ms so)."""
        v = self.vec(u)
        if v.dtype is None or v.dtype.count == self.width:
            return v
        full = self.lane.src[0].arg
        if self.share and self.width < full and v.dtype.count == 1 and v.op is not Ops.CONST:
            whole = UOp(Ops.VECTORIZE, (v,) * full)
            return UOp(Ops.SHUFFLE, (whole,), tuple(range(self.width)), v.dtype.vec(self.width))
        return UOp(Ops.VECTORIZE, (v,) * self.width)

    def _vec(self, u: UOp) -> UOp:
        op, n = u.op, self.width
        if u is self.lane or (u.dtype is not None and u.dtype.is_16bit_float):
            raise NoLanes
        if op is Ops.AFTER:
            base = u.src[0]
            if base.op is Ops.ALLOC:  # an accumulator that lives inside the LANE: one vector accumulator
                if base.arg[1] != 1:
                    raise NoLanes
                first = UOp(Ops.ALLOC, (), base.arg, base.dtype.vec(n))
            else:
                first = self.vec(base)
            rest = tuple(self.vec(s) for s in u.src[1:] if s is not self.lane)
            return UOp(Ops.AFTER, (first, *rest), u.arg, first.dtype)
        if op is Ops.END:
            return UOp(Ops.END, (self.vec(u.src[0]), *u.src[1:]), u.arg)
        if op is Ops.LOAD:
            idx = self._index(u.src[0], u.dtype)
            if idx is None:  # not consecutive: each lane's scalar load, packed into a vector
                return UOp(Ops.VECTORIZE, self._each_lane(u))
            return UOp(Ops.LOAD, (idx,), None, idx.dtype)
        if op is Ops.STORE:
            if (idx := self._index(u.src[0])) is None:
                raise NoLanes
            return UOp(Ops.STORE, (idx, self.wide(u.src[1])))
        if op is Ops.WHERE and self.free(u.src[0]):  # one scalar condition for all lanes
            a, b = self.wide(u.src[1]), self.wide(u.src[2])
            return UOp(Ops.WHERE, (u.src[0], a, b), None, a.dtype)
        if (op in VECTOR_ALU and u.dtype.is_float) or (op in VECTOR_MATH and u.dtype is dtypes.float32):
            return UOp(op, tuple(self.wide(s) for s in u.src), u.arg, u.dtype.vec(n))
        if op is Ops.WHERE and (mask := self._mask(u.src[0], u.dtype)) is not None:  # a ReLU in a GEMM's epilogue
            return UOp(Ops.WHERE, (mask, self.wide(u.src[1]), self.wide(u.src[2])), None, u.dtype.vec(n))
        if op in ALU and not any(x.op is Ops.ALLOC for x in u.src):
            # no vector form (a compare, a select on lanes, max, a math function: a GEMM's epilogue): the scalar op
            # once per lane, on that lane of each source, packed; gcc's SLP vectorizer regroups what it can. Runs once
            # per output element, after the reduction, so it costs little even where it stays scalar
            lanes = tuple(
                UOp(op, tuple(self._lane(s, k) for s in u.src), u.arg, u.dtype) if k < self.valid else self._zero(u)
                for k in range(n)
            )
            return UOp(Ops.VECTORIZE, lanes, None, u.dtype.vec(n))
        raise NoLanes

    def _mask(self, c: UOp, dtype: DType) -> UOp | None:
        """Condition `c` of a select of `dtype` values (or of a gated load's) as a vector mask (gcc's: each lane all
        ones or all zeros, an integer of the float's size): a compare of two `dtype` values or of two integers of the
        mask's size (a PAD gate's `0 <= ow + kw - 1 < W`, _ints), a lane-free bool (the same in every lane), or AND,
        OR and XOR of such masks and of bool constants (all ones for True: a ReLU6's `0 < x & x < 6`, a NOT as XOR
        with True); None for any other."""
        if dtype not in _MASK:
            return None
        lane = _MASK[dtype]
        if c.op is Ops.CONST and c.dtype is dtypes.bool:
            return self.wide(UOp.const(-1 if c.arg else 0, lane))
        if self.free(c) and c.dtype is dtypes.bool:  # one condition for every lane: 0 - c, broadcast
            return self.wide(c.cast(lane).alu(Ops.NEG))
        if c.op in COMPARE:
            if c.src[0].dtype is dtype:
                return UOp(c.op, tuple(self.wide(s) for s in c.src), None, lane.vec(self.width))
            ints = [self._ints(s, lane) for s in c.src] if c.src[0].dtype is lane else [None]
            return None if None in ints else UOp(c.op, tuple(ints), None, lane.vec(self.width))
        if c.op in LOGIC and c.dtype is dtypes.bool:
            parts = [self._mask(s, dtype) for s in c.src]
            return None if None in parts else UOp(c.op, tuple(parts), None, lane.vec(self.width))
        return None

    def _ints(self, u: UOp, lane: DType) -> UOp | None:
        """Integer `u` (of the mask's lane type: a PAD gate's index) as a vector of its value in each lane, when it
        is built from lane-free values and the LANE (0, 1, .., width-1) by ADD and MUL; else None."""
        if self.free(u):
            return self.wide(u)
        if u is self.lane:
            return UOp(Ops.VECTORIZE, tuple(UOp.const(k, lane) for k in range(self.width)), None, lane.vec(self.width))
        if u.op not in (Ops.ADD, Ops.MUL) or u.dtype is not lane:
            return None
        parts = [self._ints(s, lane) for s in u.src]
        return None if None in parts else UOp(u.op, tuple(parts), None, lane.vec(self.width))

    @staticmethod
    def _zero(u: UOp) -> UOp:
        """The value of a lane past `valid`: computed, never stored (a lane-wise division gets no garbage divisor)."""
        return UOp.const(False if u.dtype is dtypes.bool else 0, u.dtype)

    def _lane(self, u: UOp, k: int) -> UOp:
        """Lane k of u's value: u itself if lane-free, the k-th element of a packed vector, else a GEP."""
        if self.free(u):
            return u
        v = self.vec(u)
        if v.op is Ops.VECTORIZE:
            return v.src[k]
        return UOp(Ops.GEP, (v,), k, v.dtype.scalar())

    def _index(self, idx: UOp, dtype: DType | None = None) -> UOp | None:
        """The vector INDEX of these lanes, or None if they are not consecutive elements of one buffer. A gated one
        (a PAD's read of `dtype` values) keeps its gate as a vector mask, its third source; a gate with no mask form
        is read lane by lane."""
        gated = len(idx.src) == 3
        if len(idx.src) != 2 and not (gated and buffer_of(idx).op is Ops.BUFFER):
            return None
        if buffer_of(idx).op is Ops.ALLOC:  # an accumulator: the vector accumulator of these lanes
            if not self.free(idx.src[1]):
                raise NoLanes
            buf = self.vec(idx.src[0])
            return UOp(Ops.INDEX, (buf, idx.src[1]), None, buf.dtype)
        if not self.free(idx.src[0]) or (base := self._base(idx.src[1])) is None:
            return None
        gate: tuple[UOp, ...] = ()
        if gated:
            if (mask := self._mask(self.simplified.get(idx.src[2], idx.src[2]), dtype)) is None:
                return None
            gate = (mask,)
        masked = self.valid if self.valid < self.width else None
        return UOp(Ops.INDEX, (idx.src[0], base, *gate), masked, idx.dtype.vec(self.width))

    def _base(self, i: UOp) -> UOp | None:
        """`b` where index `i` is b + LANE with b lane-free, else None."""
        if self._linear(i):  # as built: a plain ravel needs no simplifying
            return self._drop_lane(i)
        s = self.simplified.get(i) or simplify(i)
        if self._linear(s):
            return self._drop_lane(s)
        if (step := index_step(s, self.lane)) is not None and step != 1:
            return None  # lanes `step` elements apart (a transposing read's): not consecutive
        # not visibly linear (a reshape's div and mod over the lane): compare the lanes' indices one by one
        b0 = simplify(s.substitute({self.lane: UOp.const(0, self.lane.dtype)}))
        for k in range(1, self.valid):
            d = simplify(s.substitute({self.lane: UOp.const(k, self.lane.dtype)}) - b0)
            if d.op is not Ops.CONST or d.arg != k:
                return None
        return b0

    def _drop_lane(self, i: UOp) -> UOp:
        """Sum `i` without its LANE term (_linear holds): only the ADDs on the way to the LANE are rebuilt. An index
        that is the LANE alone (every other term of it folded to 0: a vector at the start of a one-row output) is 0."""
        if i is self.lane:
            return UOp.const(0, i.dtype)
        a, b = i.src
        if b is self.lane or a is self.lane:
            return a if b is self.lane else b
        if self.free(a):
            return a + self._drop_lane(b)
        return self._drop_lane(a) + b

    def _linear(self, i: UOp) -> bool:
        """Is index `i` a sum with the LANE as one of its terms and no other term mentioning it?"""
        terms = _sum_terms(i)
        return sum(t is self.lane for t in terms) == 1 and all(t is self.lane or self.free(t) for t in terms)

    def simplify_indices(self, stores: list[UOp]) -> None:
        """Simplify, in one rewrite (their shared parts once), the buffer indices under `stores` that mention the
        LANE other than as a term of a sum (a view's div and mod over the lane, which the LANE's range folds), and
        the gates of PAD loads that mention it. In a partial vector the lanes past `valid` read and write nothing, so
        the LANE's range there is `valid`: a 14-wide row's window taps at (ow + kw) % 16 (its padded width) are
        ow + kw for ow < 14, not for the 16 lanes of the vector."""
        nodes = [
            x
            for u in UOp(Ops.SINK, tuple(stores)).toposort()
            if u.op is Ops.INDEX and buffer_of(u).op is Ops.BUFFER
            for x in u.src[1:]
            if not self.free(x) and not (x is u.src[1] and self._linear(x))
        ]
        nodes = list(dict.fromkeys(nodes))
        if not nodes:
            return
        sink, lane = UOp(Ops.SINK, tuple(nodes)), self.lane
        if self.valid < self.width:
            lane = UOp(Ops.RANGE, (UOp.const(self.valid, lane.dtype),), RangeArg(-2, AxisType.UPCAST), lane.dtype)
            sink = sink.substitute({self.lane: lane})
        done = simplify(sink)
        if lane is not self.lane:
            done = done.substitute({lane: self.lane})
        self.simplified.update(zip(nodes, done.src, strict=True))

    def _each_lane(self, u: UOp) -> tuple[UOp, ...]:
        """u (a load with no accumulator under it) once per lane, the LANE replaced by the lane's number (a lane past
        `valid` reads nothing: 0)."""
        if any(x.op is Ops.ALLOC for x in u.toposort()):
            raise NoLanes  # an accumulator copied per lane would be shared by every lane
        idx = u.src[0]
        if u.op is Ops.LOAD and len(idx.src) == 2:
            # each lane's index: the lane's value of the index less its constant, memoized (a transposing read's W
            # copies differ only in that constant: a 16 x 16 tile's 256 simplifies took 0.17 s of a 0.2 s lowering),
            # plus the constant
            base, off = split_offset(self.simplified.get(idx.src[1], idx.src[1]))
            dt = self.lane.dtype
            at = [_plus(b, c + off, dt) for b, c in map(split_offset, self._lanes(base))] if base is not None else []
            return tuple(
                UOp(Ops.LOAD, (idx.replace(src=(idx.src[0], at[k] if at else UOp.const(off, dt))),), u.arg, u.dtype)
                if k < self.valid
                else self._zero(u)
                for k in range(self.width)
            )
        return tuple(
            simplify(u.substitute({self.lane: UOp.const(k, self.lane.dtype)})) if k < self.valid else self._zero(u)
            for k in range(self.width)
        )

    def _lanes(self, i: UOp) -> list[UOp]:
        """Index `i` in each of the `valid` lanes, simplified: b + c*k where i = b + c*LANE (b free of the LANE),
        else the LANE replaced by each lane's number; memoized."""
        if (hit := self.lane_values.get(i)) is None:
            dt = self.lane.dtype
            if (step := index_step(i, self.lane)) is not None:
                b, c = split_offset(i.substitute({self.lane: UOp.const(0, dt)}))
                hit = [_plus(b, c + k * step, dt) for k in range(self.valid)]
            else:
                hit = [simplify(i.substitute({self.lane: UOp.const(k, dt)})) for k in range(self.valid)]
            self.lane_values[i] = hit
        return hit


def _plus(base: UOp | None, off: int, dtype: DType) -> UOp:
    """base + off, an index of `dtype` (base None: 0), the constant last."""
    if base is None:
        return UOp.const(off, dtype)
    return base + UOp.const(off, dtype) if off else base


def widen(
    stores: list[UOp],
    lane: UOp,
    loops_of: Callable[[UOp], frozenset[UOp]],
    valid: int | None = None,
    width: int | None = None,
    share: bool = False,
) -> list[UOp]:
    """The vector form of `stores`, scalar STOREs at indices `base + lane` (raises NoLanes where one has none).
    `loops_of(u)` is the set of RANGEs under u (codegen.rangeify keeps it on every node). `valid`: the stores are
    of a partial vector, whose lanes from `valid` on are past the end of their axis (masked), in vectors of `width`
    lanes (at most the LANE's), sharing the broadcasts of whole vectors of the same rows where `share`."""
    w = _Widen(lane, lambda u: lane not in loops_of(u), valid, width, share)
    w.simplify_indices(stores)
    if w.valid == w.width:  # tiles of loads a row apart: vector loads transposed in registers (codegen.transpose)
        w.memo.update(transposed_tiles(stores, lane, w.width, lambda idx: w.simplified.get(idx.src[1], idx.src[1])))
    return [w.vec(s) for s in stores]


def partial_width(valid: int, w: int) -> int:
    """The lanes of a partial vector with `valid` lanes, in a tile of `w`-lane vectors: the fewest, a power of two of
    at least 4 (a 128-bit vector). On Zen 4 a 512-bit FMA takes both 256-bit FMA slots, so a masked 16-lane vector of
    2 valid lanes costs twice a 4-lane one. (codegen.rangeify keeps one valid lane a scalar where no whole vector
    shares its row.)"""
    return min(w, max(4, 1 << (valid - 1).bit_length()))

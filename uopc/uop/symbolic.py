"""simplify: constant folding, algebraic identities, index arithmetic, canonical operand order.

    ((ridx0*8 + ridx1) // 8) % 4      with ridx0 < 4, ridx1 < 8     ->  ridx0
    (b + a), (a + b)                                                 ->  one UOp (operands sorted)
    x * 0  (int x)                                                   ->  0

Integer IDIV/MOD in the IR have Python's floor semantics (and x // 0 == x % 0 == 0, as NumPy gives);
the renderer emits plain C `/` and `%` only where the bounds prove both agree.
Float identities that would change NaN/inf results (x*0 -> 0) are not applied.
"""

from __future__ import annotations

import math
from functools import reduce

import numpy as np

from uopc.uop import ALU, COMMUTATIVE, Ops, UOp
from uopc.uop.dtype import DType, dtypes, float_scalar_type, truncate
from uopc.uop.rewrite import PatternMatcher, UPat, graph_rewrite

# ------------------------------------------------------------------ constant folding


def _floordiv(a: int, b: int) -> int:
    return 0 if b == 0 else a // b


def _floormod(a: int, b: int) -> int:
    return 0 if b == 0 else a % b


_PY_ALU = {
    Ops.ADD: lambda a, b: a + b,
    Ops.MUL: lambda a, b: a * b,
    Ops.MAX: lambda a, b: a if (a > b or a != a) else b,
    Ops.NEG: lambda a: -a,
    Ops.IDIV: _floordiv,
    Ops.MOD: _floormod,
    Ops.CMPLT: lambda a, b: a < b,
    Ops.CMPNE: lambda a, b: a != b,
    Ops.AND: lambda a, b: a & b,
    Ops.OR: lambda a, b: a | b,
    Ops.XOR: lambda a, b: a ^ b,
    Ops.WHERE: lambda c, a, b: a if c else b,
}
_NP_FLOAT = {
    Ops.RECIP: lambda a: np.divide(1, a),
    Ops.SQRT: np.sqrt,
    Ops.EXP2: np.exp2,
    Ops.LOG2: np.log2,
    Ops.SIN: np.sin,
    Ops.TRUNC: np.trunc,
}


def _fold(u: UOp) -> UOp | None:
    """An ALU op whose sources are all constants becomes a constant, computed as C would in u's dtype."""
    # a float CONST keeps its Python double; C sees it rounded to its dtype, so fold with the rounded value
    vals = [float(float_scalar_type(s.dtype)(s.arg)) if s.dtype.is_float else s.arg for s in u.src]
    dt: DType = u.dtype
    with np.errstate(all="ignore"):
        if u.op is Ops.CAST:
            src_dt = u.src[0].dtype
            v = vals[0]
            if dt.is_bool:
                return UOp.const(bool(v), dt)
            if dt.is_int and src_dt.is_float:
                if not math.isfinite(v):
                    return None  # UB in C; leave it to the hardware, as NumPy does
                v = math.trunc(v)
            return UOp.const(truncate(dt, v), dt)
        if u.op in _NP_FLOAT:
            if not dt.is_float:
                return None
            return UOp.const(float(_NP_FLOAT[u.op](float_scalar_type(dt)(vals[0]))), dt)
        if u.op in _PY_ALU:
            if dt.is_float or (u.op is Ops.WHERE and u.src[1].dtype.is_float):
                vals = [float_scalar_type(dt)(v) if isinstance(v, float) else v for v in vals]
            ret = _PY_ALU[u.op](*vals)
            if dt.is_float:
                return UOp.const(float(float_scalar_type(dt)(ret)), dt)
            return UOp.const(truncate(dt, ret) if not dt.is_bool else bool(ret), dt)
    return None


# ------------------------------------------------------------------ canonical order of commutative operands


def order_key(u: UOp) -> tuple:
    """A deterministic structural sort key (identical across processes, unlike hash())."""
    k = u.__dict__.get("_order_key")
    if k is None:
        arg = repr(u.arg) if u.op is not Ops.RANGE else f"{u.arg.idx:08d}"
        k = (u.op is Ops.CONST, u.op.value, arg, u.dtype.name if u.dtype else "", tuple(order_key(s) for s in u.src))
        u.__dict__["_order_key"] = k
    return k


def _canonical(u: UOp) -> UOp | None:
    if len(u.src) != 2:
        return None
    a, b = u.src
    if order_key(b) < order_key(a):
        return u.replace(src=(b, a))
    return None


# ------------------------------------------------------------------ index arithmetic


def _terms(x: UOp) -> list[tuple[UOp | None, int]]:
    """x as a sum of (term, coefficient); a None term is the constant part."""
    if x.op is Ops.ADD:
        return _terms(x.src[0]) + _terms(x.src[1])
    if x.op is Ops.CONST:
        return [(None, x.arg)]
    if x.op is Ops.MUL and x.src[1].op is Ops.CONST:
        return [(t, c * x.src[1].arg) if t is not None else (None, c * x.src[1].arg) for t, c in _terms(x.src[0])]
    return [(x, 1)]


def _build(terms: list[tuple[UOp | None, int]], dtype: DType) -> UOp:
    const = sum(c for t, c in terms if t is None)
    parts = [t if c == 1 else t * UOp.const(c, dtype) for t, c in terms if t is not None and c != 0]
    out = reduce(lambda a, b: a + b, parts) if parts else None
    if out is None:
        return UOp.const(const, dtype)
    return out + UOp.const(const, dtype) if const else out


def _divmod_fold(x: UOp, c: UOp, op: Ops) -> UOp | None:
    """x // c and x % c for a positive constant c: split off the terms that are multiples of c (exact for
    floor division: (q*c + r) // c == q + r // c), drop a remainder whose bounds lie in [0, c)."""
    d = c.arg
    if d <= 0 or not x.dtype.is_int:
        return None
    if d == 1:
        return x if op is Ops.IDIV else UOp.const(0, x.dtype)
    if 0 <= x.vmin and x.vmax < d:
        return UOp.const(0, x.dtype) if op is Ops.IDIV else x
    if (q := x.vmin // d) == x.vmax // d:  # every value in one quotient: (lane + 496) // 48 is 10 for lane < 16
        return UOp.const(q, x.dtype) if op is Ops.IDIV else _build([*_terms(x), (None, -q * d)], x.dtype)
    if x.op is Ops.IDIV and x.src[1].op is Ops.CONST and x.src[1].arg > 0 and op is Ops.IDIV:
        return x.src[0] // UOp.const(x.src[1].arg * d, x.dtype)  # (x // a) // b -> x // (a*b)
    if x.op is Ops.MOD and x.src[1].op is Ops.CONST and op is Ops.MOD and x.src[1].arg > 0 and x.src[1].arg % d == 0:
        return x.src[0] % c  # (x % (k*d)) % d -> x % d
    terms = _terms(x)
    whole = [(t, c_ // d) for t, c_ in terms if c_ % d == 0]
    rest = [(t, c_) for t, c_ in terms if c_ % d != 0]
    if whole and any(t is not None or q != 0 for t, q in whole):
        r = _build(rest, x.dtype) if rest else UOp.const(0, x.dtype)
        if op is Ops.MOD:
            return r % c
        return _build(whole, x.dtype) + (r // c)
    # terms whose coefficients share a factor g of d, plus the rest bounded in [0, g): (g*A + s) // d == (g*A) // d
    # and (g*A + s) % d == (g*A) % d + s under floor division (g*A % d is a multiple of g, at most d - g). A weight
    # gradient's K = N*H*W, run in chunks of 196 positions split into rows: (chunk*196 + row*28 + col) // 784
    for g in sorted({math.gcd(c_, d) for t, c_ in terms if t is not None}, reverse=True):
        big = [(t, c_) for t, c_ in terms if c_ % g == 0]
        small = [(t, c_) for t, c_ in terms if c_ % g != 0]
        if g == 1 or not big or not small:
            continue
        s = _build(small, x.dtype)
        if 0 <= s.vmin and s.vmax < g:
            b = _build(big, x.dtype)
            return b // c if op is Ops.IDIV else b % c + s
    # (a*c + b) % d == (a*(c % d) + b) % d: smaller coefficients let the bounds check above drop the mod
    # (a sliding-window view reads ((k*31 + o) % 30) for k < 3, o < 28, which is k + o)
    if op is Ops.MOD and any(c_ % d != c_ for _, c_ in terms):
        return _build([(t, c_ % d) for t, c_ in terms], x.dtype) % c
    # a common factor of every coefficient and the divisor: (g*a + g*b) // (g*d) -> (a + b) // d
    g = reduce(math.gcd, [abs(c_) for _, c_ in terms] + [d])
    if g > 1 and x.vmin >= 0:
        inner = _build([(t, c_ // g) for t, c_ in terms], x.dtype)
        if op is Ops.IDIV:
            return inner // UOp.const(d // g, x.dtype)
        return (inner % UOp.const(d // g, x.dtype)) * UOp.const(g, x.dtype)
    return None


def _recombine(u: UOp) -> UOp | None:
    """Put an unravelled index back together: y%c + (y//c)*c -> y and y%a + ((y//a)%b)*a -> y%(a*b).

    Exact under floor division for positive constants; a reshape that merges the dims another reshape split
    leaves these sums (((r//3)%3)*3 + r%3 + (r//9)*9 is just r)."""
    # index sums are short; a long chain of ADDs (a sum of many tensors) is not index math: leave it alone
    # without walking it (a recursive walk of a deep chain would overflow the stack)
    stack, n_add = [u], 0
    while stack:
        a = stack.pop()
        if a.op is Ops.ADD:
            n_add += 1
            if n_add > 16:
                return None
            stack.extend(a.src)
    terms = _terms(u)
    if not any(t is not None and t.op is Ops.MOD for t, _ in terms):
        return None
    changed = True
    while changed:
        changed = False
        for i, (t, k) in enumerate(terms):
            if t is None or t.op is not Ops.MOD or t.src[1].op is not Ops.CONST or t.src[1].arg <= 0:
                continue
            y, c1 = t.src[0], t.src[1].arg
            for j, (t2, k2) in enumerate(terms):
                if j == i or t2 is None or k2 != k * c1:
                    continue
                if (
                    t2.op is Ops.IDIV
                    and t2.src[1].op is Ops.CONST
                    and t2.src[1].arg == c1
                    and _congruent(t2.src[0], y, c1)
                ):
                    merged = t2.src[0]  # (y % c may have y's coefficients reduced mod c: _divmod_fold)
                elif (
                    t2.op is Ops.MOD
                    and t2.src[1].op is Ops.CONST
                    and t2.src[1].arg > 0
                    and t2.src[0].op is Ops.IDIV
                    and t2.src[0].src[0] is y
                    and t2.src[0].src[1].op is Ops.CONST
                    and t2.src[0].src[1].arg == c1
                ):
                    merged = y % UOp.const(c1 * t2.src[1].arg, y.dtype)
                else:
                    continue
                terms = [tk for n, tk in enumerate(terms) if n not in (i, j)] + [(merged, k)]
                changed = True
                break
            if changed:
                break
    return None if len(terms) == len(_terms(u)) else _build(terms, u.dtype)


def _congruent(y2: UOp, y: UOp, c: int) -> bool:
    """Is y the sum y2 with its coefficients reduced mod c (or y2 itself)? Then y % c == y2 % c."""
    if y2 is y:
        return True
    terms = _terms(y2)
    return any(k % c != k for _, k in terms) and _build([(t, k % c) for t, k in terms], y2.dtype) is y


def _is_int(*us: UOp) -> bool:
    return all(u.dtype is not None and (u.dtype.is_int or u.dtype.is_bool) for u in us)


def _const(v, dt: DType) -> UOp:
    return UOp.const(v, dt)


def _times_zero(x: UOp, c: UOp) -> UOp | None:
    """x*0: the int 0; for a float x+(-x), the same value (0, or NaN for NaN/inf) where 0 would lose NaN and inf.
    NOTE: not a literal x*0.0 either: gcc's -fno-signed-zeros folds x*0.0f to 0."""
    if _is_int(x):
        return c
    return x + (-x) if x.dtype.is_float else None


x, y, c1, c2 = UPat.var("x"), UPat.var("y"), UPat.cvar("c1"), UPat.cvar("c2")

symbolic = PatternMatcher(
    [
        # constant folding: every source a CONST
        (
            UPat(ALU, src=None, name="u"),
            lambda u: _fold(u) if u.src and all(s.op is Ops.CONST for s in u.src) else None,
        ),
        # canonical order: a+b and b+a are one UOp, constants go last
        (UPat(COMMUTATIVE, name="u"), _canonical),
        # a numeric constant matches by value, int or float (0 matches 0.0, never False); the rule decides by dtype
        (UPat(Ops.ADD, src=(x, UPat.cvar(value=0))), lambda x: x),  # x+0 -> x (signed zeros are not kept)
        (UPat(Ops.MUL, src=(x, UPat.cvar(value=1))), lambda x: x),  # x*1 -> x
        (UPat(Ops.MUL, src=(x, UPat.cvar("c", value=0))), _times_zero),  # int x*0 -> 0, float x*0 -> x+(-x)
        (UPat(Ops.MUL, src=(x, UPat.cvar("c", value=False))), lambda x, c: c),  # bool x*False -> False
        (UPat(Ops.AND, src=(x, UPat.cvar(value=True))), lambda x: x),  # x & True -> x
        (UPat(Ops.AND, src=(x, UPat.cvar("c", value=False))), lambda x, c: c),  # x & False -> False
        (UPat(Ops.OR, src=(x, UPat.cvar(value=False))), lambda x: x),  # x | False -> x
        (UPat(Ops.OR, src=(x, UPat.cvar("c", value=True))), lambda x, c: c),  # x | True -> True
        (UPat(Ops.AND, src=(x, x)), lambda x: x),  # x & x -> x
        (UPat(Ops.MAX, src=(x, x)), lambda x: x),  # max(x, x) -> x
        (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(x,)),)), lambda x: x),  # -(-x) -> x
        (UPat(Ops.WHERE, src=(UPat.cvar("c"), x, y)), lambda c, x, y: x if c.arg else y),  # where(const, x, y)
        (UPat(Ops.WHERE, src=(UPat.var(), x, x)), lambda x: x),  # where(c, x, x) -> x
        (UPat(Ops.CAST, src=(x,), name="u"), lambda u, x: x if u.dtype is x.dtype else None),
        # integer reassociation: constants gather at the right, so index math folds
        (
            UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(x, c1)), c2)),
            lambda x, c1, c2: x + (c1.arg + c2.arg) if _is_int(x) else None,
        ),
        (
            UPat(Ops.MUL, src=(UPat(Ops.MUL, src=(x, c1)), c2)),
            lambda x, c1, c2: x * (c1.arg * c2.arg) if _is_int(x) else None,
        ),
        (UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(x, c1)), y)), lambda x, c1, y: (x + y) + c1 if _is_int(x, y) else None),
        (
            UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(x, c1)), c2)),
            lambda x, c1, c2: x * c2 + c1.arg * c2.arg if _is_int(x) else None,
        ),  # (x+c1)*c2 -> x*c2 + c1*c2
        # comparisons decided by bounds
        (
            UPat(Ops.CMPLT, src=(x, y)),
            lambda x, y: (
                _const(True, dtypes.bool)
                if _is_int(x, y) and x.vmax < y.vmin
                else _const(False, dtypes.bool)
                if _is_int(x, y) and x.vmin >= y.vmax
                else None
            ),
        ),
        (UPat(Ops.ADD, name="u"), lambda u: _recombine(u) if _is_int(u) else None),
        # a data-dependent index whose bounds lie in 0..n-1 needs no check: CHECK(i, n) -> i
        (UPat(Ops.CHECK, src=(x, UPat.var()), name="u"), lambda u, x: x if 0 <= x.vmin and x.vmax < u.arg[0] else None),
        # div/mod by a positive constant, using the bounds of RANGEs
        (UPat(Ops.IDIV, src=(x, UPat.cvar("c"))), lambda x, c: _divmod_fold(x, c, Ops.IDIV)),
        (UPat(Ops.MOD, src=(x, UPat.cvar("c"))), lambda x, c: _divmod_fold(x, c, Ops.MOD)),
    ],
    memo="_simplified",  # the rules read only the graph (bounds included): see PatternMatcher
)


def eval_int(u: UOp, env: dict[UOp, int]) -> int | None:
    """The value of integer expression `u` with the nodes in `env` (RANGEs) bound to ints, in Python's floor
    semantics as simplify folds it; None if it holds anything but constants, bound nodes and integer ALU ops.
    Much cheaper than simplifying a substituted copy (the layout pass asks this of every operand view)."""
    vals: dict[UOp, int] = {}
    for n in u.toposort():
        if n in env:
            vals[n] = env[n]
        elif n.op is Ops.CONST and not isinstance(n.arg, float):
            vals[n] = n.arg
        elif n.op in _PY_ALU and n.dtype is not None and not n.dtype.is_float:
            vals[n] = _PY_ALU[n.op](*(vals[s] for s in n.src))
        elif n.op is Ops.CAST and n.dtype.is_int and n.src[0].dtype is not None and not n.src[0].dtype.is_float:
            vals[n] = vals[n.src[0]]
        else:
            return None
    return vals[u]


def simplify(u: UOp) -> UOp:
    """Apply the symbolic rules to the whole graph until nothing changes."""
    return graph_rewrite(u, symbolic)

"""Symbolic shapes (the seeds' Chapter 15): a `Variable` stands for a size known only when a plan runs.

    pos = Variable("pos", 1, 1024)
    keys = cache.shrink(((0, 1), (0, 12), (0, pos.bind(37)), (0, 64)))    # shape (1, 12, pos, 64)

A Variable is an int whose value is its maximum, so everything that sizes storage, picks an index width or
checks an index against its buffer works with the largest size it can take. It is equal only to a Variable of the
same name and range (never to an int), so shape checks tell a symbolic dim from a fixed one.

Storage keeps the maximum's layout: a materialized (12, pos, 64) value is laid out as (12, 1024, 64), and only
its first `pos` rows along that axis are computed and read. So the strides of every view stay constants, and the
only thing the running value changes is the bounds of the loops over a symbolic axis: lowering makes each such
loop's end a DEFINE_VAR, a kernel argument. A symbolic axis is never split (no register tile, unroll or cache
block over it): its size is not known to divide anything.

The value travels apart from the graph: `var.bind(n)` is a `Bound`, which a Tensor op records (Tensor._vars); the
graph, its structure key, the plan and the compiled C know only the Variable and its range.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Bound", "SizeArg", "Variable", "as_dim", "merge_vars", "symbolic", "symbolic_reshape_ok", "unbind"]


class Variable(int):
    """A size between `vmin` and `vmax` (inclusive) named `name`, bound to a value per call; as an int, `vmax`."""

    name: str
    vmin: int
    vmax: int

    def __new__(cls, name: str, vmin: int, vmax: int) -> Variable:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"Variable: the name must be an identifier, got {name!r}")
        for what, v in (("min", vmin), ("max", vmax)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"Variable {name!r}: {what} must be an int, got {type(v).__name__} {v!r}")
        if not 0 <= vmin <= vmax or vmax < 2:
            raise ValueError(f"Variable {name!r}: need 0 <= min <= max and max >= 2, got min {vmin}, max {vmax}")
        self = super().__new__(cls, int(vmax))
        self.name, self.vmin, self.vmax = name, int(vmin), int(vmax)
        return self

    def _ident(self) -> tuple[str, int, int]:
        return (self.name, self.vmin, self.vmax)

    def __eq__(self, other: object) -> bool:
        return type(other) is Variable and other._ident() == self._ident()

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(("Variable", *self._ident()))

    def __repr__(self) -> str:
        return f"Variable({self.name!r}, {self.vmin}, {self.vmax})"

    def __str__(self) -> str:  # its name: kernel names are made of their loops' sizes (e_pos_64)
        return self.name

    def __reduce__(self) -> tuple:
        return (Variable, self._ident())

    def __bool__(self) -> bool:
        return True

    @property
    def cname(self) -> str:
        """Its name in C: a kernel parameter."""
        return f"var_{self.name}"

    def bind(self, value: int) -> Bound:
        """This variable with a value for one call; ValueError outside [min, max], before anything runs."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{self!r}.bind: the value must be an int, got {type(value).__name__} {value!r}")
        if not self.vmin <= value <= self.vmax:
            raise ValueError(f"{self!r}.bind({value}): the value must be in [{self.vmin}, {self.vmax}]")
        return Bound(self, int(value))


class SizeArg(Variable):
    """A fixed size that a kernel takes as an argument instead of writing it into its C (uopc.codegen.loops.
    size_argument): kernels that differ in nothing else, an optimizer's update of parameters of every shape, then
    share one compiled function, each call passing its own `value`. In the kernel it is a Variable over [0, 2^31 - 1]
    (its bounds), but no plan binds it: the call site writes the value."""

    value: int

    def __new__(cls, name: str, value: int) -> SizeArg:
        self = super().__new__(cls, name, 0, (1 << 31) - 1)
        self.value = int(value)
        return self

    def _ident(self) -> tuple[str, int, int]:
        return (self.name, self.vmin, self.value)

    def __eq__(self, other: object) -> bool:
        return type(other) is SizeArg and other._ident() == self._ident()

    def __hash__(self) -> int:
        return hash(("SizeArg", self.name, self.value))

    def __repr__(self) -> str:
        return f"SizeArg({self.name!r}, {self.value})"

    def __reduce__(self) -> tuple:
        return (SizeArg, (self.name, self.value))


class Bound(NamedTuple):
    """A Variable with the value it takes in one call (what Variable.bind returns)."""

    var: Variable
    value: int

    def __repr__(self) -> str:
        return f"{self.var!r}.bind({self.value})"


def symbolic(shape: tuple[Any, ...]) -> bool:
    """Does the shape have a Variable dim?"""
    return any(type(s) is Variable for s in shape)


def merge_vars(*dicts: dict[Variable, int]) -> dict[Variable, int]:
    """The bindings of several values together; a variable bound to two values is a ValueError."""
    out: dict[Variable, int] = {}
    for d in dicts:
        for v, n in d.items():
            if out.setdefault(v, n) != n:
                raise ValueError(f"{v!r} is bound to {out[v]} and to {n} in one computation")
    return out


def as_dim(s: Any) -> int:
    """A dim of a shape argument: an int, or a Variable kept as it is (int() would drop it to its maximum)."""
    return s if type(s) is Variable else int(s)


def unbind(x: Any) -> tuple[Any, dict[Variable, int]]:
    """A shape or bounds argument with each Bound replaced by its Variable, and the values they bind."""
    if isinstance(x, Bound):
        return x.var, {x.var: x.value}
    if isinstance(x, (tuple, list)) and any(isinstance(y, (Bound, tuple, list)) for y in x):
        parts = [unbind(y) for y in x]
        return type(x)(p[0] for p in parts), merge_vars(*(p[1] for p in parts))
    return x, {}


def symbolic_reshape_ok(old: tuple[int, ...], new: tuple[int, ...]) -> bool:
    """Does a reshape keep every symbolic dim a dim of its own, in order, with as many elements before it? Then its
    index map is the same for every value of the variables (the storage keeps the maxima's layout)."""
    if not (symbolic(old) or symbolic(new)):
        return True

    def parts(shape: tuple[int, ...]) -> tuple[list[Variable], list[int]]:
        vs, sizes, n = [], [], 1
        for s in shape:
            if type(s) is Variable:
                vs.append(s)
                sizes.append(n)
                n = 1
            else:
                n *= s
        return vs, [*sizes, n]

    return parts(old) == parts(new)

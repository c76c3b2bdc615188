"""The IR: op codes and typed args (ops.py), hash-consed nodes and graph walks (uop.py), the weak record of who
reads tracked storage (readers.py), dtypes (dtype.py), pattern rewriting (rewrite.py), index simplification
(symbolic.py), movement ops as index maps (indexing.py).

    from uopc.uop import UOp, Ops, ParamArg      # the names every stage uses, re-exported here
"""

from uopc.uop.ops import (
    ALU,
    BINARY,
    COMMUTATIVE,
    COMPARE,
    LOGIC,
    MOVEMENT,
    OWN_KERNEL,
    REDUCE_OPS,
    STORED,
    TERNARY,
    UNARY,
    VECTOR_MATH,
    Attention,
    AxisType,
    GradFn,
    Ops,
    ParamArg,
    RangeArg,
    Span,
    Winograd,
)
from uopc.uop.readers import add_reader, forget_reader, note_new_reader, read_only_by, readers_epoch, track
from uopc.uop.uop import UOp, base_buffer, epilogue_reduce, identity_element, sink, structure_key

__all__ = [
    "ALU",
    "Attention",
    "BINARY",
    "COMMUTATIVE",
    "COMPARE",
    "LOGIC",
    "MOVEMENT",
    "OWN_KERNEL",
    "REDUCE_OPS",
    "STORED",
    "VECTOR_MATH",
    "TERNARY",
    "UNARY",
    "AxisType",
    "GradFn",
    "Ops",
    "ParamArg",
    "RangeArg",
    "Span",
    "Winograd",
    "UOp",
    "add_reader",
    "base_buffer",
    "epilogue_reduce",
    "forget_reader",
    "identity_element",
    "note_new_reader",
    "read_only_by",
    "readers_epoch",
    "sink",
    "structure_key",
    "track",
]

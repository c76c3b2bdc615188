"""The IR's vocabulary: the op codes, their groups, and the typed args of BUFFER, RANGE and SETITEM nodes.

UOp(Ops.BUFFER, (), ParamArg(0, dtypes.f32, (16,)))      # uopc.uop.uop builds nodes from these
Ops.ADD in ALU and Ops.ADD in COMMUTATIVE                  # True
"""

from __future__ import annotations

from enum import Enum, IntEnum, auto
from typing import NamedTuple

from uopc.uop.dtype import DType

__all__ = [
    "ALU",
    "BINARY",
    "COMMUTATIVE",
    "COMPARE",
    "MOVEMENT",
    "REDUCE_OPS",
    "TERNARY",
    "UNARY",
    "Attention",
    "AxisType",
    "GradFn",
    "Ops",
    "ParamArg",
    "RangeArg",
    "Span",
]


class Ops(IntEnum):  # IntEnum: hashing is int's (C), not Enum's Python __hash__ on this hot path
    # shape graph: storage and constants
    BUFFER = auto()
    CONST = auto()
    # movement ops: index maps
    RESHAPE = auto()
    EXPAND = auto()
    PERMUTE = auto()
    PAD = auto()
    SHRINK = auto()
    FLIP = auto()
    # reductions and materialization requests
    REDUCE = auto()
    STAGE = auto()
    # a data-dependent read: GATHER(x, index) takes x along one axis at positions the index tensor holds
    GATHER = auto()
    # a data-dependent write: SCATTER(base, index, values) combines values into base at positions the index holds
    # (arg: dim, label, wrap, rop with rop ADD, MUL or MAX)
    SCATTER = auto()
    # a static-region write: SETITEM(base, value) is base with the elements of a region (arg: one Span per dim)
    # replaced by value, whose shape is the region's counts
    SETITEM = auto()
    # a gradient marker: CUSTOM_GRAD(value, *inputs) is `value`; autodiff sends its gradient to the inputs through
    # the rule its arg (a GradFn) names, not through value's own graph. The scheduler strips it before cutting.
    CUSTOM_GRAD = auto()
    # fused attention (arg: an Attention): softmax(q k^T * scale + mask) v, or a piece of its backward, computed by
    # one kernel that streams the keys in blocks (uopc.codegen.attention); its sources are read as strided views
    ATTENTION = auto()
    # a Winograd transform (arg: a Winograd): the input's overlapping tiles into the transformed domain, or a
    # batched product's result back into outputs (uopc.uop.winograd); its source is read as a strided view
    WINOGRAD = auto()
    # ALU: unary
    NEG = auto()
    RECIP = auto()
    SQRT = auto()
    EXP2 = auto()
    LOG2 = auto()
    SIN = auto()
    TRUNC = auto()
    CAST = auto()
    # ALU: binary
    ADD = auto()
    MUL = auto()
    MAX = auto()
    IDIV = auto()
    MOD = auto()
    CMPLT = auto()
    CMPNE = auto()
    AND = auto()
    OR = auto()
    XOR = auto()
    # ALU: ternary
    WHERE = auto()
    # lowered program
    RANGE = auto()
    INDEX = auto()
    LOAD = auto()
    STORE = auto()
    ALLOC = auto()
    AFTER = auto()
    END = auto()
    SINK = auto()
    # a data-dependent index, checked at run time: out-of-range values are recorded for the runtime to raise
    CHECK = auto()
    # SIMD vectors (made after lowering by uopc.codegen.vectorize): pack n scalars, take lane i of a vector
    VECTORIZE = auto()
    GEP = auto()
    # two vectors' lanes picked into one of their type (arg: the lane of each, into the two concatenated): the stages
    # of a transpose in registers (uopc.codegen.transpose); of one vector, its first lanes as a narrower one (arg:
    # 0..n-1, the broadcast of a partial vector, uopc.codegen.lanes)
    SHUFFLE = auto()
    # a symbolic size (arg: its uopc.uop.variable.Variable) as a kernel argument: the end of a loop over a symbolic axis
    DEFINE_VAR = auto()

    def __repr__(self) -> str:
        return f"Ops.{self.name}"

    __str__ = __repr__  # not IntEnum's bare number in messages


MOVEMENT = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.PAD, Ops.SHRINK, Ops.FLIP})
UNARY = frozenset({Ops.NEG, Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC, Ops.CAST})
BINARY = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.IDIV, Ops.MOD, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR})
TERNARY = frozenset({Ops.WHERE})
ALU = UNARY | BINARY | TERNARY
COMMUTATIVE = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR})
COMPARE = frozenset({Ops.CMPLT, Ops.CMPNE})
LOGIC = frozenset({Ops.AND, Ops.OR, Ops.XOR})  # bitwise: logic on bools
# float32 math with a form on gcc vectors (uopc.renderer.c_math's EXP2F_VECTOR; a division): what a vector lowering
# (uopc.codegen.lanes) and a GEMM's epilogue (uopc.opt.gemm) may apply to vectors: SiLU, sigmoid, tanh, GELU
VECTOR_MATH = frozenset({Ops.EXP2, Ops.RECIP})
REDUCE_OPS = frozenset({Ops.ADD, Ops.MAX})
# ops computed by a kernel with fixed loops and C of its own (uopc.codegen.attention, uopc.codegen.winograd)
OWN_KERNEL = frozenset({Ops.ATTENTION, Ops.WINOGRAD})
# nodes a kernel reads from memory: a buffer, or a value another kernel stored
STORED = frozenset({Ops.BUFFER, Ops.STAGE, Ops.REDUCE}) | OWN_KERNEL


class ParamArg(NamedTuple):
    """The arg of a BUFFER: its slot (identity), dtype and flat shape."""

    slot: int
    dtype: DType
    shape: tuple[int, ...]


class GradFn(NamedTuple):
    """The arg of a CUSTOM_GRAD node: the name of its gradient rule (uopc.tensor.autodiff.CUSTOM_RULES) and the
    rule's static parameters (ints and tuples of ints: they are part of the structure key)."""

    rule: str
    params: tuple


class Attention(NamedTuple):
    """The arg of an ATTENTION node. Sources, with lead the leading dims of q (batch, heads, ...), lead_kv the same
    with the last one divided by `groups` (grouped-query attention: query head h reads key head h // groups):
      kind "out": q (*lead, L, E), k (*lead_kv, S, E), v (*lead_kv, S, Ev)[, mask] -> (*batch, L, H, Ev)
      kind "lse": q, k[, mask] -> (*lead, L), each row's log2(sum(2^(scores * log2 e))): the backward's statistic
      kind "dq":  q, k, v, do, lse, delta[, mask] -> (*batch, L, H, E), delta = rowsum(do * out)
      kind "dkv": q, k, v, do, lse, delta[, mask] -> (*batch, S, H / groups, E + Ev): dk then dv along the last axis
      kind "ds":  q, k, v, do, lse, delta, mask -> (*lead, L, S): the scores' gradient (a float mask's)
    where lead = (*batch, H): outputs keep rows before heads, the layout a model merges heads from ((B, L, H * E)
    for the output projection) and that q, k and v come from.
    The mask (`mask` "bool": keep where True; "float": added to the scaled scores) is (*lead, L, S). `causal`: key j
    is kept for query i when j <= i + offset (offset 0: PyTorch's is_causal, aligned to the start)."""

    kind: str
    scale: float
    causal: bool = False
    offset: int = 0
    mask: str = ""
    groups: int = 1


class Winograd(NamedTuple):
    """The arg of a WINOGRAD node, one transform of a convolution F(m x m, 3 x 3) (uopc.uop.winograd), with alpha =
    m + 2 and `tiles` = (th, tw) tiles of m x m outputs per image (kind "w": unused, (1, 1)):
      kind "w":   the weight (K, C, 3, 3) -> (alpha^2, K, C), G w G^T of every 3x3 filter; with `panel` p > 0 laid
                  out as the products' packed B instead: (alpha^2, ceil(K/p), C, p), the filters past K zeros
      kind "in":  the input (N, C, H, W), zero-padded by `pads` (top, left) and as far past its end as the tiles
                  reach -> (C, alpha^2, N*th*tw), B^T d B of every tile d; with `panel` p > 0 laid out as the
                  products' packed B instead (uopc.opt.gemm): (alpha^2, B, C', p), panels of p consecutive
                  tiles for all channels, the tiles past T zeros; B >= ceil(T/p) blocks and C' >= C channel
                  slots, a few more where that spaces the points apart in the cache
                  (uopc.uop.winograd.winograd_panels), never read
      kind "out": the products (alpha^2, K, N*th*tw) -> `shape` (N, K, OH, OW), A^T y A of every tile y, cut to
                  OH x OW
    `shape` is the node's shape. `stream`: an input transform's panels are written past the caches (non-temporal
    stores), where they are too large to stay in them for the products."""

    kind: str
    m: int
    tiles: tuple[int, int]
    shape: tuple[int, ...]
    pads: tuple[int, int] = (0, 0)
    panel: int = 0
    stream: bool = False


class Span(NamedTuple):
    """One dim of a SETITEM region: the `count` elements start, start + step, ... (step may be negative)."""

    start: int
    step: int
    count: int


class AxisType(Enum):
    """What a RANGE loop is: a plain loop, a parallel (OpenMP) one, a reduction, or an upcast (unrolled) one."""

    LOOP = auto()
    THREAD = auto()
    REDUCE = auto()
    UPCAST = auto()  # a SIMD lane (codegen.lanes): the lanes of one vector, widened away before any loop is made

    def __repr__(self) -> str:
        return f"AxisType.{self.name}"


class RangeArg(NamedTuple):
    """The arg of a RANGE: its number in the kernel (ridxN) and its kind; for a reduce loop, `prefetch`: the bytes
    ahead its streamed vector loads also prefetch into L2 (Opts.prefetch; 0: only the renderer's near prefetch)."""

    idx: int
    kind: AxisType = AxisType.LOOP
    prefetch: int = 0

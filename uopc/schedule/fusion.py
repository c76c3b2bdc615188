"""Fusion and staging decisions of the scheduler, on the shape graph before it is cut: what to materialize that no
rule of Chapter 7 cuts (values several kernels would recompute: stage_broadcast_compute, stage_shared_chains,
stage_recomputed; read_staged: a value stored anyway is read stored), and which REDUCEs a kernel that reads them
computes per row (row_fusions; a matmul's elementwise tail: uopc.schedule.epilogues). stage_rows, after the cut,
keeps in a row buffer a value two passes over a row would each compute. uopc.schedule.cut applies them; each weighs
bytes against work.
"""

from __future__ import annotations

from typing import Any

from uopc.helpers import prod
from uopc.uop import ALU, MOVEMENT, OWN_KERNEL, STORED, Ops, UOp
from uopc.uop.attention import widened_source
from uopc.uop.indexing import affine_view

__all__ = [
    "MATERIALIZED",
    "broadcast_read",
    "contraction",
    "kernel_region",
    "read_staged",
    "row_fusions",
    "stage_broadcast_compute",
    "stage_recomputed",
    "stage_rows",
    "stage_shared_chains",
]


def kernel_region(body: UOp) -> list[UOp]:
    """The nodes a kernel computing `body` evaluates: its graph down to the materialized nodes it reads (included,
    not entered)."""
    out, seen, stack = [], set(), [body]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        out.append(u)
        if u is body or u.op not in MATERIALIZED:
            stack.extend(u.src)
    return out


def row_fusions(
    roots: list[UOp], points: list[UOp], accepts: Any, taken: frozenset[UOp] = frozenset()
) -> frozenset[UOp]:
    """The REDUCEs computed inside the one kernel that reads them per row (Chapter 7, exercise 8): softmax's max and
    sum, LayerNorm's mean and variance, and their backward sums run as sibling loops over each row of the kernel
    that writes the result, which reads the row while it is in cache.

    r (over the last n axes of a source of shape S, rows = S[:-n]) fuses into its reader k when nothing is then
    computed twice: exactly one kernel reads r, and every path from r up to k's output reads it per row, through
    ALU ops at the row's shape or at S, reshapes to keepdim, an EXPAND back along the n reduced axes, and REDUCEs
    over those same n axes of shape S. Each of r's values then depends on the row loops only, which are k's
    outermost loops, so it is computed once per row, before the loops over the row. An EXPAND along another axis
    or a reduce over other axes on the way ((A @ B) @ C, a normalization over a non-trailing axis, softmax(QK^T) V)
    would put r inside a loop it does not depend on: those stay cut. A contraction (a matmul: see contraction) is
    never a row reduce: it is an epilogue's, if anything's.

    What it saves is bytes: k's second and third reads of the row come from cache instead of memory, and r is not
    written and read back. That holds while a row fits in cache, and rows must be enough to share among the
    cores: the optimizer's `accepts(r, k_body)` weighs both for its machine. Decided consumers first, so a
    reduce read only by a reduce fused above it (softmax's max, read by the fused sum) is weighed against the one
    kernel that then reads it. `taken`: reduces already fused as epilogues. Without an optimizer nothing fuses."""
    if accepts is None:
        return frozenset()
    order = UOp(Ops.SINK, tuple(roots)).toposort()[:-1]
    pointset, rootset, parents = set(points), set(roots), _parents(order)
    fused: set[UOp] = set()
    kernels: dict[UOp, set[UOp]] = {}  # the kernels computing each node, given the decisions above it
    for u in reversed(order):
        if u in rootset:
            kernels.setdefault(u, set()).add(u)
        mine = kernels.get(u, set())
        if u in pointset and u.op is Ops.REDUCE and u not in rootset and u not in taken and len(mine) == 1:
            (k,) = mine
            body = k.src[0] if k.op is Ops.STAGE else k
            if _row_read(u, k, parents) and not contraction(u) and accepts(u, body):
                fused.add(u)
        own = u in pointset and u not in fused and u not in taken
        for x in u.src:
            if x.op is Ops.CONST or (x in pointset and x.op is not Ops.REDUCE):
                continue
            kernels.setdefault(x, set()).update({u} if own else mine)
    return frozenset(fused)


def _parents(order: list[UOp]) -> dict[UOp, list[UOp]]:
    """The consumers of each node of `order` (a topological order)."""
    parents: dict[UOp, list[UOp]] = {}
    for u in order:
        for x in u.src:
            parents.setdefault(x, []).append(u)
    return parents


def _row_read(r: UOp, k: UOp, parents: dict[UOp, list[UOp]]) -> bool:
    """Does kernel point `k` read REDUCE `r` only per row (see row_fusions)? Walks up from r to k, each node at the
    row's shape (a value per row) or at r's source shape S (a value per element of the row)."""
    src_shape, n = r.src[0].shape, r.arg[1]
    rows = src_shape[: len(src_shape) - n]
    per_row = {rows, rows + (1,) * n}
    if prod(src_shape[len(src_shape) - n :]) < 2:  # a reduce over size-1 axes: S is a per-row shape too
        return False
    seen, stack = set(), [r]
    while stack:
        u = stack.pop()
        if u in seen or u is k:
            continue
        seen.add(u)
        row = u.shape in per_row
        for c in parents.get(u, ()):
            if c.op is Ops.STAGE and c is k:
                continue
            if c.op in ALU and c.shape in (per_row if row else {src_shape}):
                pass
            elif row and c.op is Ops.RESHAPE and c.shape in per_row:
                pass
            elif row and c.op is Ops.EXPAND and u.shape == rows + (1,) * n and c.shape == src_shape:
                pass
            elif not row and c.op is Ops.REDUCE and c.arg[1] == n and c.src[0].shape == src_shape:
                pass
            else:
                return False
            stack.append(c)
    return k in seen or any(k in parents.get(u, ()) for u in seen)


def contraction(r: UOp) -> bool:
    """Is REDUCE `r` a contraction: a sum of products of two broadcast operands (Tensor.matmul, dot, a convolution's
    GEMM)? A reduce of a value computed in place (a random normal from a few counter words) is not."""
    src = r.src[0]
    while src.op is Ops.CAST:
        src = src.src[0]
    return r.arg[0] is Ops.ADD and src.op is Ops.MUL and all(broadcast_read(s) for s in src.src)


# a value the passes over a row share is kept in a row buffer (a local array of the kernel) once it costs this many
# ALU ops per element (an exp2 or a division: _OP_COST), where storing and loading it back costs about two...
ROW_STAGE_MIN_WORK = 8
# ...for rows up to this many elements (64 KiB of float32 on each thread's stack)
ROW_STAGE_MAX = 1 << 14


def stage_rows(body: UOp) -> UOp:
    """In a kernel with reduces fused per row (row_fusions), keep a value that two passes over the row would each
    compute in a row buffer: STAGE(value, ("row", n)), filled once per row and read by both passes.

    softmax's exp(x - max) is computed in the row-sum's loop and again for the output: at 4096 columns the second
    exp2 cost as much as the whole pass. A cheap value (LayerNorm's x - mean) is recomputed (ROW_STAGE_MIN_WORK);
    a value over a row longer than ROW_STAGE_MAX too. Decided from the kernel's output down: the loop that fills a
    staged value is one more pass for what it is computed from (the random normal that softmax(randn(...)) draws
    in its row kernel is kept once for the max and the exp, and the counter bits under it are computed once)."""
    reds = [u for u in body.toposort() if u.op is Ops.REDUCE and not contraction(u)]
    if not reds or reds == [body]:
        return body
    rows = {r.src[0].shape: r.arg[1] for r in reds}
    order = body.toposort()
    passes: dict[UOp, set[UOp]] = {body: {body}}  # per node, the loops over the row that compute it
    todo = set()
    for u in reversed(order):
        mine = passes.get(u, set())
        if u.op is Ops.REDUCE:  # its source is computed once per row, in the reduce's own loop
            passes.setdefault(u.src[0], set()).add(u)
            continue
        worth = len(mine) >= 2 and u.op in ALU and u.op is not Ops.CAST and u.shape in rows
        if (
            worth
            and prod(u.shape[len(u.shape) - rows[u.shape] :]) <= ROW_STAGE_MAX
            and _row_work(u) >= ROW_STAGE_MIN_WORK
        ):
            todo.add(u)
            mine = {u}  # computed once, by its fill loop
        for x in u.src:
            passes.setdefault(x, set()).update(mine)
    if not todo:
        return body
    body = UOp.wrap([body], todo, lambda u: UOp(Ops.STAGE, (u,), ("row", rows[u.shape])))[0]
    # one staged value may be kept in the output's own row, which the kernel writes anyway (_fills_output)
    stages = [u for u in body.toposort() if u.op is Ops.STAGE and u.arg[0] == "row"]
    own = next((u for u in stages if _fills_output(body, u, u.arg[1])), None)
    return body if own is None else body.substitute({own: UOp(Ops.STAGE, own.src, (*own.arg, "out"))})


def _fills_output(body: UOp, u: UOp, n: int) -> bool:
    """May the value `u` staged over the last `n` axes live in the kernel's output row instead of a row buffer?

    The output element reads it at its own index only (through ALU ops of the output's shape), and every reduce that
    reads it is a reduce over that row broadcast back along it, which reads the row before the output loop stores
    into it. softmax's exp(x - max) then goes to the output row, and the last pass scales it there: a 4096-wide
    row, its row buffer and the output's row took 48 KiB, more than a 32 KiB L1 (4096x4096: 7.4-8.1 ms -> 5.4-5.7)."""
    if u.shape != body.shape or u.dtype != body.dtype:
        return False
    shape, reach = body.shape, set()
    for y in body.toposort():  # the nodes computed from `u`
        if y is u or any(s in reach for s in y.src):
            reach.add(y)
    stack, seen = [body], set()
    while stack:
        y = stack.pop()
        if y is u or y in seen or y not in reach:
            continue
        seen.add(y)
        if (y.op in ALU or y.op is Ops.STAGE) and y.shape == shape:
            stack.extend(y.src)
        elif (red := _row_broadcast(y, n)) is not None:
            stack.append(red.src[0])
        else:
            return False
    return True


def _row_broadcast(e: UOp, n: int) -> UOp | None:
    """The REDUCE over the last `n` axes that `e` copies back along them (EXPAND(RESHAPE(REDUCE)), a keepdim
    reduce's broadcast), or None."""
    r = e.src[0] if e.op is Ops.EXPAND else None
    red = r.src[0] if r is not None and r.op is Ops.RESHAPE else None
    if red is None or red.op is not Ops.REDUCE or red.arg[1] != n or r.shape != red.shape + (1,) * n:
        return None
    return red if red.src[0].shape == e.shape else None


def _row_work(u: UOp) -> int:
    """ALU ops per element computing `u` takes, weighted as the cost rule weighs them (_OP_COST), up to loads and
    reduces."""
    n, seen, stack = 0, set(), [u]
    while stack:
        x = stack.pop()
        if x in seen or x.op in (Ops.REDUCE, Ops.BUFFER):
            continue
        seen.add(x)
        n += _OP_COST.get(x.op, 1) if x.op in ALU and x.op is not Ops.CAST else 0
        stack.extend(x.src)
    return n


# a node's kernel reads what it was computed from: buffers and other kernels' results
MATERIALIZED = STORED | {Ops.SCATTER, Ops.SETITEM}


def _fused_work(u: UOp) -> int:
    """ALU ops times elements that recomputing `u` would cost (stopping at materialized nodes)."""
    n, seen, stack = 0, set(), [u]
    while stack:
        x = stack.pop()
        if x in seen or x.op in MATERIALIZED:
            continue
        seen.add(x)
        n += x.op in ALU
        stack.extend(x.src)
    return n * prod(u.shape)


def stage_broadcast_compute(roots: list[UOp], factor: int = 4, min_work: int = 4096) -> list[UOp]:
    """Materialize a computed value that an EXPAND copies `factor`+ times, when recomputing it is expensive.

    Fusion is free only if nothing is recomputed: a LayerNorm output feeding a matmul would otherwise be
    recomputed for every output column. Tiny values (softmax's 1/sum) and bare CASTs are left fused.
    """
    order = UOp(Ops.SINK, tuple(roots)).toposort()
    found: dict[UOp, list[UOp]] = {}  # value -> the EXPANDs that copy it
    for u in order:
        if u.op is not Ops.EXPAND or prod(u.shape) < factor * prod(u.src[0].shape):
            continue
        src = u.src[0]
        while src.op in MOVEMENT or _value_pad(src):
            src = src.src[1] if src.op is Ops.WHERE else src.src[0]
        if src.op in ALU and src.op is not Ops.CAST and src.shape and _fused_work(src) >= min_work:
            found.setdefault(src, []).append(u)
    # a per-row value (LayerNorm's 1/std) copied along the row's trailing axes into values read per row is computed
    # once per row by the kernel that reads it (its loops over the row nest inside the row's): not staged
    parents = _parents(order)
    staged = {v for v, es in found.items() if not all(_trailing(e) for e in es)}
    stops = staged | set(roots)
    todo = {v for v, es in found.items() if v in staged or not all(_read_per_row(e, parents, stops) for e in es)}
    return UOp.wrap(roots, todo, lambda n: UOp(Ops.STAGE, (n,))) if todo else roots


def _value_pad(u: UOp) -> bool:
    """Is `u` a pad with a value other than zero (Tensor.pad: where(pad(True), pad(x), value), a max-pool's -inf):
    a select on its index whose reader computes it as index arithmetic, so what a copy must keep is x, unpadded."""
    if u.op is not Ops.WHERE or u.src[2].op is not Ops.CONST or u.src[1].op is not Ops.PAD:
        return False
    mask = u.src[0]
    while mask.op in MOVEMENT:
        mask = mask.src[0]
    return mask.op is Ops.CONST


def _trailing(e: UOp) -> bool:
    """Does EXPAND `e` copy its source along trailing axes only (a per-row value across its row)?"""
    src, first = e.src[0].shape, None
    for i, (a, b) in enumerate(zip(src, e.shape, strict=True)):
        if a != b and first is None:
            first = i
        if first is not None and a != 1:
            return False
    return first is not None


def _read_per_row(e: UOp, parents: dict[UOp, list[UOp]], stops: set[UOp]) -> bool:
    """Is the row-wide copy `e` (of shape S) read only per element of S up to a reduce over the copied axes, a
    staged value or a root? Then each kernel computes the copied value once per row (see _trailing)."""
    n = sum(a != b for a, b in zip(e.src[0].shape, e.shape, strict=True))
    seen, stack = set(), [e]
    while stack:
        u = stack.pop()
        if u in seen or u in stops:
            continue
        seen.add(u)
        for c in parents.get(u, ()):
            if c.op is Ops.REDUCE and c.src[0].shape == e.shape and c.arg[1] >= n:
                continue  # per row again: the reduce's own reader is weighed by row_fusions
            if c.op in ALU and c.shape == e.shape or c.op is Ops.STAGE:
                stack.append(c)
            elif c.op is not Ops.SINK:
                return False
    return True


def read_staged(roots: list[UOp]) -> list[UOp]:
    """Every reader of an elementwise value that the graph stores anyway (a STAGE: a convolution's input made
    contiguous) reads it stored, where computing it reads an input of its own size (so a recomputation would read as
    many bytes and compute more). MobileNetV2's residual stream: each block's output, stored for the next block's
    1x1 convolution, was recomputed by the next residual add from the projection's product; read stored, it is the
    projection's epilogue and the add is one more term of the next one's."""
    order = UOp(Ops.SINK, tuple(roots)).toposort()
    todo = set()
    for u in order:
        if u.op is Ops.STAGE and u.arg is None and (v := u.src[0]).op in ALU and v.shape:
            n = prod(v.shape)
            if any(x is not v and x.op in MATERIALIZED and prod(x.shape) >= n for x in kernel_region(v)):
                todo.add(v)
    return UOp.wrap(roots, todo, lambda n: UOp(Ops.STAGE, (n,))) if todo else roots


def stage_shared_chains(roots: list[UOp], min_reads: int = 3) -> list[UOp]:
    """Materialize an elementwise value that two or more kernels would each recompute from `min_reads` or more
    materialized inputs of its own size (buffers, reductions, staged values; a broadcast bias or statistic is not
    counted: re-reading it is cheap).

    Fusion recomputes an unmaterialized value in every kernel that reads it. That is free for a short chain, but a
    transformer's residual stream x + attn_1 + mlp_1 + ... + mlp_L, read by layer L's LayerNorm reductions, grew by
    two full-size reads per layer: GPT-2's 12 layers had 49 distinct LayerNorm kernels (6.5 KB to 12.7 KB of C each,
    none shared between layers, quadratic work to lower, compile and run). Staged once it reaches `min_reads`, the
    stream restarts from one buffer and every layer schedules to the same kernels. Bottom-up, a staged value counts
    as one read for the values built on it. Counting only full-size reads leaves alone the many-input but
    non-growing elementwise chains of a BatchNorm backward (staging those measured 10% slower on the CNN step)."""
    order = UOp(Ops.SINK, tuple(roots)).toposort()[:-1]
    kernels = _computing_kernels(order, set(roots))
    # per node: the materialized inputs its recomputation reads, with their element counts
    reads: dict[UOp, frozenset[tuple[UOp, int]]] = {}
    todo: set[UOp] = set()
    for u in order:
        if u.op in MATERIALIZED:
            reads[u] = frozenset(((u, prod(u.shape)),))
            continue
        r = frozenset().union(*(reads[x] for x in u.src))
        if u.op in ALU and u.op is not Ops.CAST and u.shape and len(kernels.get(u, ())) >= 2:
            n = prod(u.shape)
            if sum(size >= n for _, size in r) >= min_reads:
                todo.add(u)
                r = frozenset(((u, n),))
        reads[u] = r
    return UOp.wrap(roots, todo, lambda n: UOp(Ops.STAGE, (n,))) if todo else roots


def _computing_kernels(order: list[UOp], rootset: set[UOp]) -> dict[UOp, set[UOp]]:
    """The kernels that would compute each node of `order` (topological): a materialized consumer is one kernel,
    other consumers pass theirs on (stage_recomputed walks the same way, deciding as it goes)."""
    kernels: dict[UOp, set[UOp]] = {}
    for u in reversed(order):
        if u in rootset:
            kernels.setdefault(u, set()).add(u)
        mine = kernels.get(u, set())
        for x in u.src:
            if x.op in MATERIALIZED or x.op is Ops.CONST:
                continue
            kernels.setdefault(x, set()).update({u} if u.op in MATERIALIZED else mine)
    return kernels


# ALU ops per element that recomputing a value costs, by op: a square root, a division or a transcendental takes
# the time of several adds (their throughput on x86 vectors is a fraction of an add's)
_OP_COST = {Ops.SQRT: 8, Ops.RECIP: 8, Ops.EXP2: 8, Ops.LOG2: 8, Ops.SIN: 16, Ops.IDIV: 8, Ops.MOD: 8}
# staging a value writes it once and reads it back once (8 bytes per float32 element) in place of recomputing it:
# worth it when the kernels besides the first would together spend more than RECOMPUTE_OPS_PER_BYTE ALU ops per
# byte that adds (elementwise code runs at a few ops per byte of memory traffic on the CPUs we target)
RECOMPUTE_OPS_PER_BYTE = 2
# ...and when the ops it saves in all come to more than a kernel launch costs (a few microseconds: stage_broadcast_
# compute's 4096): a scalar that 40 kernels recompute per element is not worth a kernel of its own
RECOMPUTE_MIN_GAIN = 4096


def stage_recomputed(
    roots: list[UOp], ops_per_byte: int = RECOMPUTE_OPS_PER_BYTE, rowwise: frozenset[UOp] = frozenset()
) -> list[UOp]:
    """Materialize an elementwise value that several kernels would each recompute when, by the cost rule, the
    recomputation costs more than one write and one read of it (Chapter 7, exercise 9: ALU ops against bytes, at a
    machine balance of `ops_per_byte`).

    A CNN's activation relu(batchnorm(conv)) is read by the max-pool, by its backward (where the maximum is) and by
    BatchNorm's backward reductions: five kernels each recomputing the normalization (a square root and a division
    per element) measured 1.5x slower than the step with it staged. Weighed from the consumers down, so a chain's
    top is staged first and the values under it are then computed once, by its kernel. `rowwise`: the reduces
    row_fusions would compute inside their reader, which are then no kernels of their own (softmax's exp(x - max),
    read by its row sum and its output, is one kernel's, and stage_rows gives it a row buffer there)."""
    order = UOp(Ops.SINK, tuple(roots)).toposort()[:-1]
    rootset, todo, parents = set(roots), set(), _parents(order)
    # per node, bottom-up: ALU ops per element to compute it, and the materialized nodes computing it reads
    work: dict[UOp, int] = {}
    reads: dict[UOp, frozenset] = {}
    for u in order:
        if u.op in MATERIALIZED or u.op is Ops.CONST:
            work[u], reads[u] = 0, frozenset((u,)) if u.op is not Ops.CONST else frozenset()
        else:
            work[u] = sum(work[x] for x in u.src) + (_OP_COST.get(u.op, 1) if u.op in ALU else 0)
            reads[u] = frozenset().union(*(reads[x] for x in u.src))
    # top-down, consumers first: the kernels that compute each node, given what was staged above it; a staged value
    # is computed once, by its own kernel, so the values under it are weighed with that
    kernels: dict[UOp, set[UOp]] = {}
    for u in reversed(order):
        if u in rootset:
            kernels.setdefault(u, set()).add(u)
        k = len(kernels.get(u, ()))
        if u.op in ALU and u.op is not Ops.CAST and u.shape and k >= 2:
            n, size = prod(u.shape), u.dtype.itemsize
            # bytes per element of u that computing it reads (a broadcast input: its share), less those its readers
            # read anyway for another of their sources: a ReLU's where(x > 0, x, 0) reads x besides x > 0, so
            # staging the comparison (a bool, cheap to store) saves no read of x's inputs
            anyway = reads[u].intersection(*(_other_reads(p, u, reads) for p in parents.get(u, ())))
            in_bytes = sum(x.dtype.itemsize * min(1.0, prod(x.shape) / n) for x in reads[u] - anyway)
            # k kernels recomputing u: (k-1) extra computations and reads of its inputs; staged: its inputs read
            # once, u written once and read k times
            gain = (k - 1) * work[u] + ops_per_byte * ((k - 1) * in_bytes - (k + 1) * size)
            if gain * n > RECOMPUTE_MIN_GAIN:  # and it pays for the staging kernel's own launch
                todo.add(u)
        mine = {u} if u in todo else kernels.get(u, set())
        for x in u.src:
            if (x.op in MATERIALIZED and x not in rowwise) or x.op is Ops.CONST:
                continue
            kernels.setdefault(x, set()).update({u} if u.op in MATERIALIZED and u not in rowwise else mine)
    return UOp.wrap(roots, todo, lambda n: UOp(Ops.STAGE, (n,))) if todo else roots


def _other_reads(p: UOp, u: UOp, reads: dict[UOp, frozenset]) -> frozenset:
    """The materialized nodes elementwise `p` reads through its sources other than `u` (none for any other op)."""
    if p.op not in ALU:
        return frozenset()
    return frozenset().union(*(reads[s] for s in p.src if s is not u))


def broadcast_read(u: UOp) -> bool:
    """Whether `u` reads buffers and every one is smaller than `u`: its values are broadcast (a matmul operand)."""
    sizes = [prod(b.arg.shape) for b in u.toposort() if b.op is Ops.BUFFER]
    return bool(sizes) and max(sizes) < prod(u.shape)


def stage_attention_operands(roots: list[UOp], points: list[UOp]) -> tuple[list[UOp], bool]:
    """A fused attention kernel reads each source as an affine view of a buffer (uopc.codegen.attention), and so does
    a Winograd transform (uopc.codegen.winograd). A source
    that is not one is staged: at the node under its views when those views are affine over it (q, k and v taken
    by reshapes and permutes from a projection's output, which is then materialized once, in its own layout), else
    the view itself (a padded or otherwise non-affine view is copied contiguously). A source already an affine view
    of a buffer or of a materialized node (a matmul, a KV cache written in place) is read where it is: when that
    node is elementwise (a root), its views get a STAGE("detach") barrier between them and it, so that the layout
    pass does not move them below it (a recomputation of the root inside the attention kernel). The scheduler
    strips the barriers after that pass; the second value says whether there are any."""
    done = set(points)
    todo: set[UOp] = set()
    guard: dict[UOp, list[int]] = {}  # attention node -> the sources that get a barrier
    topo = UOp(Ops.SINK, tuple(roots)).toposort()[:-1]
    for u in topo:
        if u.op not in OWN_KERNEL:
            continue
        for i, s in enumerate(u.src):
            s = widened_source(u, s)
            base = s
            while base.op in MOVEMENT:
                base = base.src[0]
            affine = affine_view(s, base) is not None
            if base.op is not Ops.BUFFER and base not in done:
                todo.add(base if affine else s)
            elif not affine:
                todo.add(s)
            elif base.op in ALU and s is not base:
                guard.setdefault(u, []).append(i)
    if not todo and not guard:
        return roots, False
    new: dict[UOp, UOp] = {}  # one bottom-up rebuild, so that every reader sees the same rebuilt nodes
    for u in topo:
        src = tuple(new[x] for x in u.src)
        n = u if src == u.src else u.replace(src=src)
        if u in guard:
            src = list(n.src)
            for i in guard[u]:
                base = widened_source(u, src[i])
                while base.op in MOVEMENT:
                    base = base.src[0]
                src[i] = src[i].substitute({base: UOp(Ops.STAGE, (base,), "detach")})
            n = n.replace(src=tuple(src))
        new[u] = UOp(Ops.STAGE, (n,)) if u in todo else n
    return [new[r] for r in roots], bool(guard)

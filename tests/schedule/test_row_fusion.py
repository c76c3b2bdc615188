"""Per-row reduce fusion (uopc.schedule.fusion.row_fusions, Chapter 7 exercise 8): a reduce read per row by one
kernel is computed inside it, before the loops over the row, when the optimizer says a row fits its machine's cache.

Kernel counts hold for the optimizer of the run (OPT=1, or OPT=2's search; the hand heuristic under OPT=0, which
has none); the hand heuristic's own choices (threads, row buffers) are asserted with HandOpt. Expected counts follow
from the Machine record (its L2 size and cores), never from the machine the test was written on. Values: PyTorch
and NumPy, at the stated tolerances.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from uopc import helpers, nn
from uopc.codegen.rangeify import Ctx, Opts, lanes, lower
from uopc.engine.realize import default_opt
from uopc.kernelize import make_plan
from uopc.machine import Machine
from uopc.opt import HandOpt
from uopc.renderer.c import render_c
from uopc.runtime import compiler as runtime
from uopc.runtime import machine
from uopc.runtime.buffer import aligned_empty
from uopc.runtime.compiler import Program
from uopc.schedule import fusion, schedule
from uopc.tensor import Tensor
from uopc.uop import Ops, ParamArg, UOp
from uopc.uop.dtype import dtypes

rng = np.random.default_rng(0)


def r(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def optimizer():
    """The run's optimizer (OPT=2: the search), or the hand heuristic where the run has none (OPT=0)."""
    return default_opt() or HandOpt(machine())


def kernels(*ts: Tensor) -> list[str]:
    plan, _ = make_plan([t.uop for t in ts], opt=optimizer())
    return [k.name for k in plan.kernels]


@pytest.mark.parametrize(
    "name,fn,ref",
    [
        ("softmax", lambda t: t.softmax(-1), lambda t: t.softmax(-1)),
        ("log_softmax", lambda t: t.log_softmax(-1), lambda t: t.log_softmax(-1)),
        ("layernorm", lambda t: t.layernorm(-1), lambda t: torch.nn.functional.layer_norm(t, t.shape[-1:])),
        (
            "rmsnorm",
            lambda t: t * (t.square().mean(-1, keepdim=True) + 1e-6).rsqrt(),
            lambda t: t * torch.rsqrt(t.square().mean(-1, keepdim=True) + 1e-6),
        ),
    ],
)
def test_row_kernels_are_one_kernel(name, fn, ref):
    # every reduce of the row is computed in the kernel that writes the result: one kernel, no temporaries
    x = r(64, 96)
    plan, _ = make_plan([fn(Tensor(x)).uop], opt=optimizer())
    assert [k.name for k in plan.kernels] == ["r_64_96"] and plan.temps == ()
    np.testing.assert_allclose(fn(Tensor(x)).numpy(), ref(torch.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


def _reads_output(k) -> bool:
    """Does kernel k load from a buffer it stores into?"""
    topo = k.ast.toposort()
    stored = {_storage(u.src[0]) for u in topo if u.op is Ops.STORE and _storage(u.src[0]).op is Ops.BUFFER}
    return any(u.op is Ops.LOAD and _storage(u.src[0]) in stored for u in topo)


def _storage(index: UOp) -> UOp:
    """The BUFFER or ALLOC an INDEX addresses, past the AFTERs that order its uses."""
    b = index.src[0]
    while b.op is Ops.AFTER:
        b = b.src[0]
    return b


def test_each_reduce_is_computed_once():
    # softmax's max is read by the sum and by the output: one accumulator for it, one for the sum (the two reads'
    # index expressions are the same UOp, so lowering computes it once), and exp(x - max), which the sum and the
    # output both read, is computed once per row (stage_rows) into the output's own row, scaled there by the last
    # pass: no row buffer
    plan, _ = make_plan([Tensor(r(64, 96)).softmax(-1).uop], opt=HandOpt(machine()))  # one thread per row
    (k,) = plan.kernels
    n = lanes()  # the max's accumulators: an array of them where the row splits into whole lanes
    assert sorted(u.arg[1] for u in k.ast.toposort() if u.op is Ops.ALLOC) == sorted([1, n if 96 % n == 0 else 1])
    assert sum(u.op is Ops.EXP2 for u in k.ast.toposort()) == 1 and _reads_output(k)


@pytest.mark.parametrize("cflags", [None, "user"])
def test_a_float_max_keeps_lanes_as_the_flags_allow(cflags):
    # a float max keeps 16 accumulators under uopc's own flags (its units peel loops of up to 4 iterations) and 64
    # under a user's CFLAGS (gcc would unroll a 16-iteration loop whole and keep it scalar); NaN still propagates
    x = r(8, 256)
    x[3, 100] = np.nan
    flags = None if cflags is None else [*runtime.base_cflags()]
    with helpers.Context(CFLAGS=flags):
        assert lanes() == (16 if cflags is None else 64)
        plan, _ = make_plan([Tensor(x).max(-1).uop], opt=HandOpt(machine()))
        assert {u.arg[1] for k in plan.kernels for u in k.ast.toposort() if u.op is Ops.ALLOC} == {lanes()}
        np.testing.assert_array_equal(Tensor(x).max(-1).numpy(), x.max(-1))


def _row_case(kind: str) -> tuple[UOp, UOp]:
    """(kernel body, the staged value e = exp2(x - max)) of a row kernel over x (8, 8), built from UOps as the
    scheduler sees them (movement ops where the body reads e, not pushed through it)."""
    x = UOp(Ops.BUFFER, (), ParamArg(0, dtypes.float32, (64,))).reshape((8, 8))
    w = UOp(Ops.BUFFER, (), ParamArg(1, dtypes.float32, (64,))).reshape((8, 8))

    def per_row(v: UOp, op: Ops) -> UOp:  # a keepdim reduce over the row, broadcast back along it
        return v.reduce(op).reshape((8, 1)).expand((8, 8))

    e = (x - per_row(x, Ops.MAX)).alu(Ops.EXP2)
    inv = per_row(e, Ops.ADD).alu(Ops.RECIP)
    body = {
        "softmax": e * inv,
        "flipped": e.flip((1,)) + e * inv,  # the output at column j reads e at 7 - j
        "transposed": e.permute((1, 0)) + e * inv,  # ... at row j, column i
        # a reduce inside the loop over the output's columns reads the whole row at every column
        "per-column reduce": e * (e.reshape((8, 1, 8)).expand((8, 8, 8)) * w.reshape((1, 8, 8)).expand((8, 8, 8)))
        .reduce(Ops.ADD),
        "another dtype": (e * inv).cast(dtypes.float16),
    }[kind]  # fmt: skip
    return body, e


@pytest.mark.parametrize("kind", ["softmax", "flipped", "transposed", "per-column reduce", "another dtype"])
def test_a_staged_row_lives_in_the_output_only_where_nothing_reads_it_after_the_store(kind):
    # exp(x - max) may live in the output's row when every read of it comes before the output stores there: the
    # output's own element, or a reduce over the row broadcast back along it; not a read at another column, another
    # row, inside a reduce per output column, or where the output is another dtype
    body, e = _row_case(kind)
    assert fusion._fills_output(body, e, 1) is (kind == "softmax")


@pytest.mark.parametrize(
    "cols,opts",
    [
        (100, Opts(upcast={1: 3})),
        (100, Opts(upcast={1: 8}, thread=0)),
        (100, Opts(upcast={0: 3})),
        (96, Opts(tile={0: 32, 1: 32})),
        (96, Opts(upcast={1: 16}, thread=0, unroll=4)),
        (100, Opts(upcast={1: 8}, vec=8)),
        (100, Opts(upcast={1: 16}, vec=16)),
    ],
    ids=["copies", "copies on threads", "rows", "cache blocks", "search", "vectors of 8", "vectors of 16"],
)
def test_a_staged_row_in_the_output_under_opts_that_split_the_output(cols, opts):
    # Opts an optimizer may choose (the search's candidates among them): 100 columns in 3s (8s) split the output into
    # a nest of whole copies and a nest of the rest, and cache blocks of 32 columns loop over the row; each would fill
    # the row again over the outputs already stored there (64 rows in 3s: nests of other rows only), so the row stays
    # in a local array. Read in vectors, its copies are consecutive elements of that one array, not one accumulator
    # per lane: vectorize read lane 0's element in every lane (off by 0.13-0.27). The values are PyTorch's
    x = r(64, cols)
    sched, _ = schedule([Tensor(x).softmax(-1).uop], False, HandOpt(machine()))
    (item,) = sched.items
    assert [u.arg for u in item.body.toposort() if u.op is Ops.STAGE] == [("row", 1, "out")]
    xa, got = aligned_empty(x.size, dtypes.float32), aligned_empty(x.size, dtypes.float32)  # as uopc's buffers are
    xa[:] = x.reshape(-1)
    Program(render_c(lower(item.body, item.out, Ctx(opts=opts)), "k"), "k")(xa, got)
    want = torch.tensor(x).softmax(-1).numpy()
    np.testing.assert_allclose(got.reshape(64, cols), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape", [(1, 4096), (3, 2000), (2, 5, 300)])
def test_softmax_in_its_output_row_matches_torch(shape):
    # one row (threads may share its columns: then the row keeps its buffer), rows not a multiple of anything, and
    # several leading axes; the values are PyTorch's
    x = r(*shape)
    out = Tensor(x).softmax(-1)
    np.testing.assert_allclose(out.numpy(), torch.tensor(x).softmax(-1).numpy(), rtol=1e-5, atol=1e-7)


def test_softmax_assigned_over_its_input():
    # x.assign(x.softmax(-1)): the kernel's output is x's storage, which the row's passes read
    x = r(64, 96)
    t = Tensor(x.copy()).realize()
    t.assign(t.softmax(-1)).realize()
    np.testing.assert_allclose(t.numpy(), torch.tensor(x).softmax(-1).numpy(), rtol=1e-5, atol=1e-7)


def test_a_cheap_shared_value_is_recomputed():
    # LayerNorm's x - mean is one subtraction: both passes recompute it rather than go through a row buffer
    plan, _ = make_plan([Tensor(r(64, 96)).layernorm(-1).uop], opt=HandOpt(machine()))
    (k,) = plan.kernels
    assert sorted(u.arg[1] for u in k.ast.toposort() if u.op is Ops.ALLOC) == [1, 1]


def test_without_an_optimizer_every_reduce_is_cut():
    # OPT=0 keeps Chapter 7's cuts
    plan, _ = make_plan([Tensor(r(64, 96)).softmax(-1).uop])
    assert len(plan.kernels) == 3


def test_matmul_chain_stays_two_kernels():
    # (A @ B) @ C: the first product is read through an EXPAND inside the second one's reduce loop (the recompute
    # disaster of Chapter 7): it stays its own kernel
    a, b, c = Tensor(r(32, 48)), Tensor(r(48, 40)), Tensor(r(40, 24))
    ks = kernels((a @ b) @ c)
    assert sum(k.startswith("r_") for k in ks) == 2, ks
    np.testing.assert_allclose(((a @ b) @ c).numpy(), (a.numpy() @ b.numpy()) @ c.numpy(), rtol=1e-4, atol=1e-3)


def test_statistics_over_a_leading_axis_stay_cut():
    # a normalization over axis 0 reads its statistic per column, inside the loop over rows: recomputed per row if
    # fused, so it stays a kernel of its own
    x = r(256, 64)
    t = Tensor(x)
    y = t - t.mean(0, keepdim=True)
    assert len(kernels(y)) == 2
    np.testing.assert_allclose(y.numpy(), x - x.mean(0, keepdims=True), rtol=1e-5, atol=1e-5)


def test_softmax_into_matmul_keeps_the_matmul_apart():
    # softmax(S) @ V: the row sum fuses into the probabilities, which the matmul reads through an EXPAND: the
    # probabilities are their own kernel, the matmul another
    s, v = r(64, 64), r(64, 32)
    out = Tensor(s).softmax(-1) @ Tensor(v)
    ks = kernels(out)
    assert len(ks) == 2, ks
    ref = torch.tensor(s).softmax(-1) @ torch.tensor(v)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-5)


def test_a_row_larger_than_the_cache_is_not_fused():
    # a row of twice the L2 size cannot stay in cache between the passes: three kernels, as cut at every reduce
    m: Machine = machine()
    cols = m.l2_bytes // 2  # float32: 2 x L2 bytes per row
    ks = kernels(Tensor.empty(2, cols).softmax(-1))
    assert len(ks) >= 3 and ks[-1] == f"e_2_{cols}", ks  # the reduces (split among threads or not), then the output


def test_rows_fewer_than_cores_are_not_fused():
    # one long row: fused, the row's reduce would run on one core; cut, the reduce kernel splits it among the
    # cores. Fused only where the machine has one core (or the work is too small to thread anyway).
    ks = kernels(Tensor(r(1, 1 << 15)).softmax(-1))
    if machine().cores == 1:
        assert ks == ["r_1_32768"]
    else:
        assert len(ks) >= 3 and ks[-1] == "e_1_32768", ks


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layernorm"])
def test_row_kernel_gradients_match_torch(op):
    x, g = r(48, 80), r(48, 80)
    t = Tensor(x, requires_grad=True)
    tt = torch.tensor(x, requires_grad=True)
    if op == "layernorm":
        ln, tln = nn.LayerNorm(80), torch.nn.LayerNorm(80)
        with torch.no_grad():
            tln.weight.copy_(torch.tensor(ln.weight.numpy()))
            tln.bias.copy_(torch.tensor(ln.bias.numpy()))
        y, ty = ln(t), tln(tt)
    else:
        y, ty = getattr(t, op)(-1), getattr(tt, op)(-1)
    (y * Tensor(g)).sum().backward()
    (ty * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_rows_are_shared_among_threads_along_a_row_axis():
    # GPT-2 at batch 1: LayerNorm over (1, 64, 256) threads its 64 rows (axis 1), never an axis along the row
    plan, _ = make_plan([Tensor(r(1, 64, 256)).layernorm(-1).uop], opt=HandOpt(machine()))
    (k,) = plan.kernels
    assert k.opts.thread == (1 if machine().cores > 1 else None)


def test_a_computed_row_is_fused_and_computed_once_per_pass():
    # softmax of a random normal drawn in the same graph: the draw (a few counter words in, not a matmul) is
    # computed in the row kernel, and kept in a row buffer the passes share; the values are those of the draw
    # realized first
    Tensor.manual_seed(3)
    fused = Tensor.randn(64, 96).softmax(-1)
    plan, _ = make_plan([fused.uop], opt=HandOpt(machine()))
    assert [k.name for k in plan.kernels] == ["r_64_96"]
    Tensor.manual_seed(3)
    x = Tensor.randn(64, 96).numpy()
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(fused.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)

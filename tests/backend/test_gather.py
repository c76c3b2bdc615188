"""GATHER: a load whose index comes from data, checked when the kernel runs.

Reference: NumPy's take_along_axis. A bad index raises IndexError after the plan runs, naming the op, the value and
the valid range; it never reads outside the buffer (the check substitutes 0) and never fails silently.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from uopc.engine.realize import default_opt, realize
from uopc.runtime.buffer import buffer_data, new_buffer
from uopc.uop import Ops, UOp
from uopc.uop.dtype import dtypes

rng = np.random.default_rng(0)


def buf(a: np.ndarray) -> UOp:
    dt = {np.dtype(np.float32): dtypes.f32, np.dtype(np.int32): dtypes.int32, np.dtype(np.int64): dtypes.int64}
    return new_buffer(dt[a.dtype], a.size, a).reshape(a.shape)


def run(u: UOp) -> np.ndarray:
    (b,) = realize([u], opt=default_opt())
    return buffer_data(b).reshape(u.shape).copy()


@pytest.mark.parametrize("opt", [0, 1, 2])
@pytest.mark.parametrize("shape,dim,ishape", [((5, 7), 1, (5, 3)), ((6, 4), 0, (9, 4)), ((3, 4, 5), 2, (3, 2, 6))])
def test_gather_matches_take_along_axis(context, opt, shape, dim, ishape):
    context(OPT=opt)
    x = rng.standard_normal(shape).astype(np.float32)
    idx = rng.integers(0, shape[dim], ishape).astype(np.int32)
    got = run(buf(x).gather(buf(idx), dim) * 2.0 + 1.0)
    # PyTorch's gather allows an index smaller than the input off `dim`: the reference cuts the input to match
    cut = tuple(slice(0, s) if d != dim else slice(None) for d, s in enumerate(ishape))
    np.testing.assert_array_equal(got, np.take_along_axis(x[cut], idx, dim) * 2.0 + 1.0)


def test_gather_of_computed_values_with_computed_int64_index():
    x = rng.standard_normal((8, 16)).astype(np.float32)
    idx = rng.integers(0, 15, (8, 4)).astype(np.int64)
    got = run((buf(x) * 3.0).gather(buf(idx) + 1, 1).reduce(Ops.ADD, 1))
    np.testing.assert_allclose(got, (np.take_along_axis(x * 3.0, idx + 1, 1)).sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [4, 1000, -1])
def test_out_of_range_index_raises_naming_op_value_and_range(bad):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[0, 3], [2, bad], [1, 1]], np.int32)
    with pytest.raises(IndexError, match=rf"embedding lookup: index {bad} is out of range .*valid indices 0\.\.3"):
        run(buf(x).gather(buf(idx), 1, "embedding lookup"))


def test_index_check_is_always_on(context):
    context(CHECK_OOB=0, OPT=1)  # the full bounds checker is off; data-dependent checks stay on
    x = np.ones((2, 3), np.float32)
    with pytest.raises(IndexError, match="index 3"):
        run(buf(x).gather(buf(np.array([[0], [3]], np.int32)), 1))


def test_bad_gather_arguments_raise_before_compiling():
    x = buf(np.ones((3, 4), np.float32))
    with pytest.raises(TypeError, match="integer"):
        x.gather(buf(np.ones((3, 2), np.float32)), 1)
    with pytest.raises(ValueError, match="do not fit"):
        x.gather(buf(np.zeros((3,), np.int32)), 1)
    with pytest.raises(ValueError, match="larger"):
        x.gather(buf(np.zeros((4, 2), np.int32)), 1)


def test_error_records_are_per_call_across_threads():
    # concurrent realizes of one plan: only the calls whose own index is bad raise
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    good, bad = np.array([[1], [2], [3], [4]], np.int32), np.array([[1], [2], [9], [4]], np.int32)
    results: dict[int, str] = {}

    def work(i: int) -> None:
        try:
            out = run(buf(x).gather(buf(bad if i % 2 else good), 1) + 0.5)
            results[i] = "ok" if np.array_equal(out, np.take_along_axis(x, good, 1) + 0.5) else "wrong"
        except IndexError:
            results[i] = "raised"

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[i] == ("raised" if i % 2 else "ok") for i in range(16)), results


def _scatter_ref(base: np.ndarray, idx: np.ndarray, vals: np.ndarray, dim: int) -> np.ndarray:
    out = base.copy()
    for pos in np.ndindex(*idx.shape):
        tgt = list(pos)
        tgt[dim] = idx[pos]
        out[tuple(tgt)] += vals[pos]
    return out


@pytest.mark.parametrize("opt", [0, 1])
@pytest.mark.parametrize("shape,dim,ishape", [((5, 7), 1, (5, 9)), ((6, 4), 0, (9, 4)), ((3, 4, 5), 2, (3, 2, 6))])
def test_scatter_add_accumulates_repeated_indices(context, opt, shape, dim, ishape):
    context(OPT=opt)
    base = rng.standard_normal(shape).astype(np.float32)
    idx = rng.integers(0, shape[dim], ishape).astype(np.int32)  # more indices than slots: repeats are certain
    vals = rng.standard_normal(ishape).astype(np.float32)
    got = run((buf(base) * 2.0).scatter_add(buf(idx), buf(vals) + 1.0, dim) - 1.0)
    np.testing.assert_allclose(got, _scatter_ref(base * 2.0, idx, vals + 1.0, dim) - 1.0, rtol=1e-5, atol=1e-5)


def test_scatter_add_checks_its_indices():
    base, vals = np.zeros((2, 3), np.float32), np.ones((2, 2), np.float32)
    with pytest.raises(IndexError, match=r"embedding backward: index -2 is out of range .*valid indices 0\.\.2"):
        run(buf(base).scatter_add(buf(np.array([[0, 1], [-2, 2]], np.int32)), buf(vals), 1, "embedding backward"))


def test_scatter_plan_is_a_copy_then_a_serial_accumulate(context):
    from uopc.kernelize import make_plan
    from uopc.schedule import Ref, RefKind

    context(OPT=1)
    base, idx, vals = (
        buf(np.zeros((4, 8), np.float32)),
        buf(np.zeros((4, 3), np.int32)),
        buf(np.ones((4, 3), np.float32)),
    )
    plan, _ = make_plan([base.scatter_add(idx, vals, 1)])
    assert [k.name for k in plan.kernels] == ["e_4_8", "s_4_3"]
    assert plan.kernels[0].refs[-1] == plan.kernels[1].refs[-2] == Ref(RefKind.OUT, 0)  # both write the output
    assert plan.n_err == 1 and plan.kernels[1].checks == ("scatter_add",)


# ------------------------------------------------------------------ the Tensor layer (reference: PyTorch)

torch = pytest.importorskip("torch")


def test_tensor_gather_and_scatter_add_forward_and_gradient_match_torch():
    from uopc import Tensor

    x = rng.standard_normal((4, 6)).astype(np.float32)
    i = rng.integers(0, 6, (4, 9))
    w = rng.standard_normal((4, 9)).astype(np.float32)
    tx, ts = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    g = tx.gather(1, Tensor(i.astype(np.int32)))
    s = Tensor(np.zeros((4, 6), np.float32)).scatter_add(1, Tensor(i.astype(np.int32)), ts * 2)
    ((g * Tensor(w)).sum() + (s * s).sum()).backward()
    X, S = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    G = X.gather(1, torch.tensor(i))
    Sc = torch.zeros(4, 6).scatter_add(1, torch.tensor(i), S * 2)
    ((G * torch.tensor(w)).sum() + (Sc * Sc).sum()).backward()
    np.testing.assert_allclose(g.numpy(), G.detach().numpy(), rtol=0, atol=0)
    np.testing.assert_allclose(s.numpy(), Sc.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(tx.grad.numpy(), X.grad.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ts.grad.numpy(), S.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_fancy_indexing_and_embedding_match_torch_with_gradients():
    from uopc import Tensor
    from uopc.nn import Embedding

    x = rng.standard_normal((5, 3, 4)).astype(np.float32)
    ids = np.array([[4, -1, 0], [2, 2, -5]])  # negative indices count from the end, as in NumPy and PyTorch
    tx = Tensor(x, requires_grad=True)
    out = tx[Tensor(ids.astype(np.int32)), 1:]
    (out * out).sum().backward()
    X = torch.tensor(x, requires_grad=True)
    ref = X[torch.tensor(ids), 1:]
    (ref * ref).sum().backward()
    np.testing.assert_array_equal(out.numpy(), ref.detach().numpy())
    np.testing.assert_allclose(tx.grad.numpy(), X.grad.numpy(), rtol=1e-6, atol=1e-6)

    emb = Embedding(7, 3)
    tok = np.array([[1, 6, 1], [0, 0, 3]])
    e = emb(Tensor(tok.astype(np.int32)))
    (e * e).sum().backward()
    W = torch.tensor(emb.weight.numpy(), requires_grad=True)
    E = torch.nn.functional.embedding(torch.tensor(tok), W)
    (E * E).sum().backward()
    np.testing.assert_array_equal(e.numpy(), E.detach().numpy())
    np.testing.assert_allclose(emb.weight.grad.numpy(), W.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_embedding_reads_only_the_rows_it_needs():
    # regression: Embedding was a one-hot matmul, reading the whole (vocab, dim) table for every token
    from uopc import Tensor
    from uopc.kernelize import make_plan
    from uopc.nn import Embedding

    emb = Embedding(50_000, 8)
    plan, _ = make_plan([emb(Tensor(np.array([3, 49_999], np.int32))).uop])
    assert [k.name for k in plan.kernels] == ["e_2_8"]  # one elementwise kernel: no reduction over the vocabulary


@pytest.mark.parametrize(
    "what,call,message",
    [
        ("cross_entropy", lambda T, E: T(np.zeros((3, 5), np.float32)).cross_entropy(T([1, 7, 0])), "index 7"),
        ("fancy index", lambda T, E: T(np.zeros((3, 5), np.float32))[T([5, 0])], "index 5"),
        ("negative fancy index", lambda T, E: T(np.zeros((3, 5), np.float32))[T([-4])], "index -4"),
        ("Embedding", lambda T, E: E(5, 2)(T([7])), "index 7"),
        # several Tensor indices: each is checked against its own dim, so 6 (flat 0*5 + 6, in range) still raises
        ("second of two fancy indices", lambda T, E: T(np.zeros((3, 5), np.float32))[T([0]), T([6])], "index 6"),
        ("first of two fancy indices", lambda T, E: T(np.zeros((3, 5), np.float32))[T([-4]), T([0])], "index -4"),
    ],
)
def test_bad_data_dependent_index_raises_instead_of_a_silent_zero(what, call, message):
    # regression: these gave a number, a zero row and a zero vector (one-hot selects never read the index)
    from uopc import Tensor
    from uopc.nn import Embedding

    with pytest.raises(IndexError, match=message):
        call(Tensor, Embedding).realize()


def test_cross_entropy_ignore_index_is_not_an_error():
    from uopc import Tensor

    x = rng.standard_normal((3, 5)).astype(np.float32)
    got = Tensor(x).cross_entropy(Tensor([1, -100, 4])).item()
    ref = torch.nn.functional.cross_entropy(torch.tensor(x), torch.tensor([1, -100, 4])).item()
    assert abs(got - ref) < 1e-6


# ------------------------------------------------------------------ index checks that survive a folded load
# regression: a GATHER whose value never depends on the index (a constant source, a size-1 gathered axis, an integer
# value times 0) lost its index check with the load: ones(3, 5).cross_entropy([1, 7, 0]) gave 1.609, zeros(4, 3)[[0, 9]]
# zero rows. Each case raises the message the same expression on a buffer gives (up to the kernel name).

_FOLDED_SOURCES = {  # name -> (the expression on a lazy constant, the same on a buffer of the same values)
    "cross_entropy": (
        lambda T: T.ones(3, 5).cross_entropy(T([1, 7, 0])),
        lambda T: T(np.ones((3, 5), np.float32)).cross_entropy(T([1, 7, 0])),
    ),
    "fancy index": (lambda T: T.zeros(4, 3)[T([0, 9])], lambda T: T(np.zeros((4, 3), np.float32))[T([0, 9])]),
    "negative fancy index": (
        lambda T: T.full((5,), 2.0)[T([1, -6])],
        lambda T: T(np.full(5, 2.0, np.float32))[T([1, -6])],
    ),
    "2-d index (embedding-like)": (
        lambda T: T.zeros(5, 2)[T([[1, 2], [0, 7]])],
        lambda T: T(np.zeros((5, 2), np.float32))[T([[1, 2], [0, 7]])],
    ),
    "expanded scalar": (
        lambda T: T.full((), 3.0).reshape(1, 1).expand(4, 3)[T([4])],
        lambda T: T(np.full((4, 3), 3.0, np.float32))[T([4])],
    ),
    "gather along dim 0": (
        lambda T: T.ones(3, 5).gather(0, T([[0, 3]])),
        lambda T: T(np.ones((3, 5), np.float32)).gather(0, T([[0, 3]])),
    ),
    "gather along dim 1": (
        lambda T: T.full((3, 5), 7, dtype=dtypes.int32).gather(1, T([[1], [5], [0]])),
        lambda T: T(np.full((3, 5), 7, np.int32)).gather(1, T([[1], [5], [0]])),
    ),
    "gather of ones_like": (
        lambda T: T(np.zeros((2, 4), np.float32)).ones_like().gather(1, T([[0], [-1]])),
        lambda T: T(np.ones((2, 4), np.float32)).gather(1, T([[0], [-1]])),
    ),
    "eye (a padded constant)": (lambda T: T.eye(3)[T([3])], lambda T: T(np.eye(3, dtype=np.float32))[T([3])]),
    "int source times 0": (
        lambda T: (T(np.arange(5, dtype=np.int32)) * 0)[T([7])],
        lambda T: T(np.zeros(5, np.int32))[T([7])],
    ),
    "scatter_add into a constant": (
        lambda T: T.zeros(4).scatter_add(0, T([5]), T([1.0])),
        lambda T: T(np.zeros(4, np.float32)).scatter_add(0, T([5]), T([1.0])),
    ),
    "gathered int times 0": (
        lambda T: T(np.arange(5, dtype=np.int32))[T([7])] * 0,
        lambda T: T(np.arange(5, dtype=np.int32))[T([7])],
    ),
}


def _index_error(call) -> str:
    """The IndexError message of realizing call(Tensor), without the kernel name (which depends on the fusion)."""
    from uopc import Tensor

    with pytest.raises(IndexError) as e:
        call(Tensor).realize()
    return str(e.value).split(", in kernel")[0]


@pytest.mark.parametrize("opt", [0, 1])
@pytest.mark.parametrize("case", list(_FOLDED_SOURCES))
def test_bad_index_into_a_constant_raises_as_for_a_buffer(context, opt, case):
    context(OPT=opt)
    const, buffer = _FOLDED_SOURCES[case]
    assert _index_error(const) == _index_error(buffer)


_ONE_ELEMENT_AXES = {  # name -> (expression, message): the index of a size-1 axis never reaches the address
    "size-1 axis": (lambda T: T(np.ones((1, 3), np.float32))[T([0, 9])], r"index: index 9 .*valid indices -1\.\.0"),
    "expanded row": (lambda T: T(np.ones((1, 3), np.float32)).expand(4, 3)[T([0, 9])], r"index 9 .*-4\.\.3"),
    "one slot": (lambda T: T.zeros(1).scatter_add(0, T([5]), T([1.0])), r"scatter_add: index 5 .*0\.\.0"),
    "scatter": (lambda T: T.zeros(4, 1).scatter(1, T([[0], [1], [0], [0]]), 1.0), r"scatter: index 1 .*0\.\.0"),
}


@pytest.mark.parametrize("case", list(_ONE_ELEMENT_AXES))
def test_bad_index_along_an_axis_of_one_element_raises(context, case):
    from uopc import Tensor

    context(OPT=1)
    call, message = _ONE_ELEMENT_AXES[case]
    with pytest.raises(IndexError, match=message):
        call(Tensor).realize()


@pytest.mark.parametrize("opt", [0, 1])
def test_valid_indices_into_constants_match_numpy(context, opt):
    from uopc import Tensor

    context(OPT=opt)
    idx = np.array([[0, 4], [-1, 2]], np.int32)
    np.testing.assert_array_equal(Tensor.full((5, 3), 2.5)[Tensor(idx)].numpy(), np.full((5, 3), 2.5)[idx])
    np.testing.assert_array_equal(Tensor.eye(5)[Tensor(idx)].numpy(), np.eye(5)[idx])
    col = np.array([[1], [4], [0]], np.int32)
    got = Tensor.full((3, 5), 7, dtype=dtypes.int32).gather(1, Tensor(col)).numpy()
    np.testing.assert_array_equal(got, np.take_along_axis(np.full((3, 5), 7, np.int32), col, 1))
    # reference: log_softmax of equal logits is -log(5) for every class
    loss = Tensor.ones(3, 5).cross_entropy(Tensor([1, 4, 0])).item()
    assert abs(loss - np.log(5)) < 1e-6
    ones = Tensor.ones(4).scatter_add(0, Tensor([3, 3, 0]), Tensor([1.0, 2.0, 3.0])).numpy()
    np.testing.assert_array_equal(ones, [4, 1, 1, 4])


def test_a_constant_gathered_at_an_in_range_index_has_no_check(context):
    # an index whose bounds prove it in range needs no check at run time: the gather folds to the constant
    from uopc import Tensor
    from uopc.kernelize import make_plan
    from uopc.schedule import RefKind

    context(OPT=1)
    x, pos = Tensor.full((4, 6), 2.0), Tensor.full((4, 2), 5, dtype=dtypes.int32)
    plan, _ = make_plan([x.gather(1, pos).uop])
    (k,) = plan.kernels
    assert not any(u.op is Ops.CHECK for u in k.ast.toposort())
    assert k.refs[-1].kind is not RefKind.ERR  # the error record is not even a parameter
    np.testing.assert_array_equal(x.gather(1, pos).numpy(), np.full((4, 2), 2.0))


def test_jit_replay_checks_an_index_into_a_constant():
    from uopc import Tensor, TinyJit

    @TinyJit
    def pick(i: Tensor) -> Tensor:
        return (Tensor.full((4, 3), 2.0)[i] + 1).realize()

    for _ in range(3):  # capture, then replay
        np.testing.assert_array_equal(pick(Tensor([0, 3])).numpy(), np.full((2, 3), 3.0))
    with pytest.raises(IndexError, match=r"index: index 9 is out of range .*valid indices -4\.\.3"):
        pick(Tensor([0, 9]))

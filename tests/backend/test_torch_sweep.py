"""The differential sweep: every public Tensor op, forward and gradient, against PyTorch (rows in sweep_rows.py).

Each case draws its inputs (0-d, size-0, broadcast and non-contiguous views; values with large magnitudes such as
±300 and ±1e30), runs the op in uopc and in PyTorch on the same values, and compares the outputs and the gradients
of sum(out * W) (W fixed random weights) with respect to every float input. All cases are built first and realized
in one `Tensor.realize_all` call, so the sweep is one plan whose kernels compile once.

Tolerances (|ours - torch| <= atol + rtol |torch|, NaNs must match):
    float32 forward  atol 1e-6, rtol 1e-3      float32 gradient  atol 1e-4, rtol 1e-3
    softmax (both)   atol 1e-7, rtol 1e-3      float16 (both)    one half ulp (see FWD, GRAD), a few rows their own
    ints and bools   exact
dtypes: ours must equal PyTorch's, except that PyTorch's int64 results (sums, argmax, one_hot) are int32 here
(uopc's default int).

    python -m pytest tests/backend/test_torch_sweep.py -s      # prints the count of ops and cases
"""

from __future__ import annotations

import time
import zlib

import numpy as np
import pytest
import torch

from tests.backend.sweep_rows import EXCLUDED, ROWS, Inp, Row
from uopc import Tensor, dtypes

# float16: within one half ulp (np.spacing at PyTorch's value; 2^-10 relative at most) of PyTorch, which computes each
# op in float32 and rounds once, as uopc does: the two float32 results differ by a few float32 ulps, which moves the
# rounded half by at most one. Gradients may instead be within one ulp of PyTorch's float32 gradient rounded to half
# (f32ref): PyTorch evaluates its backward formulas op by op in float16, rounding in their middle (tanh's 1 - y*y),
# where uopc computes a composite's gradient in float32 and rounds it once
FWD = {"f32": dict(atol=1e-6, rtol=1e-3), "f16": dict(ulps=1, atol=0.0)}
GRAD = {"f32": dict(atol=1e-4, rtol=1e-3), "f16": dict(ulps=1, atol=0.0, f32ref=True)}
NP = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "bool": np.bool_}
BIG = {"f32": 1e30, "f16": 6e4}  # a large magnitude that the dtype still holds

# special values of the pow domains, laid out so that a (n, 1) base column against a (1, n) exponent row meets
# every pair: 0**0, negative bases with integer and fractional exponents, 0**negative, and (forward only: PyTorch's
# gradients there are mostly NaN or inf by accident of its formula) ±inf and NaN on both sides
POW_BASES = [0.0, -2.0, 2.0, 1.0, -1.0, 0.5, -0.5, 3.0, -3.0, 1.5]
POW_EXPS = [0.0, 3.0, 0.5, -1.0, 2.0, -2.0, 1.0, 2.5, -0.5, 4.0]
POW_BASES_NF = POW_BASES + [np.inf, -np.inf, np.nan]
POW_EXPS_NF = POW_EXPS + [np.nan, np.inf, -np.inf]


# ---------------------------------------------------------------- drawing inputs


def _specials(domain: str, dt: str) -> list[float]:
    big = BIG[dt]
    return {
        "any": [0.0, 300.0, -300.0, big, -big],
        "wide": [0.0, 300.0, -300.0, big, -big],
        "pos": [300.0, big, 1e-30 if dt == "f32" else 1e-4],
        "trig": [0.0, 50.0, -50.0],
        "frac": [0.5, -0.5, 2.0, -2.0, big, -big],
        "nonzero": [300.0, -300.0, big, -big],
        "ties": [0.0, 0.0, 1.0, big, -big],
        "huge": [big, -big, 300.0],
        "powbase": POW_BASES,
        "powexp": POW_EXPS,
        "powbase_nf": POW_BASES_NF,
        "powexp_nf": POW_EXPS_NF,
        "unit": [0.0, 0.5, -0.5],
        "ge1": [1.5, 300.0, big],
        "prob": [0.0, 1.0, 0.5],
        "nf": [np.inf, -np.inf, np.nan, 0.0, big, -big],
    }.get(domain, [])


def draw(domain: str, dt: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Values of `domain` for one input; large magnitudes and special values come first in the flat order."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dt == "bool":
        return (rng.random(n) < 0.5).reshape(shape)
    if dt == "i32":
        lo, hi = {
            "pos": (1, 7),
            "cls": (0, 5),
            "cls4": (0, 4),
            "cls_ign": (-1, 5),
            "powexp": (0, 4),
            "powbase": (-3, 4),
        }.get(domain, (-6, 7))
        a = rng.integers(lo, hi, n)
        if domain == "nonzero":
            a = np.where(a == 0, 5, a)
        if domain == "wide":
            a[: min(n, 4)] = [10**9, -(10**9), 2**31 - 1, -(2**31)][: min(n, 4)]
        return a.astype(np.int32).reshape(shape)
    x = rng.standard_normal(n) * 2
    x = {
        "pos": np.abs(x) + 0.05,
        "trig": rng.uniform(-6, 6, n),
        "tan": rng.uniform(-1.4, 1.4, n),
        "frac": x * 1.5,
        "nonzero": np.where(np.abs(x) < 0.25, 0.25 + np.abs(x), np.abs(x)) * np.sign(x + 1e-9),
        "ties": np.round(x),
        "big": x * BIG[dt] / 10,
        "large": x * 1e15,
        "unit": rng.uniform(-0.95, 0.95, n),
        "ge1": np.abs(x) + 1.05,
        "prob": rng.uniform(0, 1, n),
        "round": np.round(x),
        "perm": (rng.permutation(n) - n // 2) * 0.25,  # distinct values, exact in float16
    }.get(domain, x)
    sp = _specials(domain, dt)
    if n > 1 or domain.startswith("pow"):
        k = min(n, len(sp))
        x[:k] = sp[:k]
    return x.astype(NP[dt]).reshape(shape)


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _view(base, ndim: int):
    """The non-contiguous view: slice the first dim, flip the last, reverse the dims (uopc and torch alike)."""
    if ndim == 0:
        return base
    return base[1:-1].flip(ndim - 1).permute(*reversed(range(ndim)))


def _base_shape(inp: Inp) -> tuple[int, ...]:
    if inp.layout == "c" or not inp.shape:
        return inp.shape
    rev = tuple(reversed(inp.shape))
    return (rev[0] + 2,) + rev[1:]


# ---------------------------------------------------------------- one case


class Case:
    """One row applied to one set of inputs: our lazy results and PyTorch's values, compared after the realize."""

    def __init__(self, row: Row, inputs: tuple[Inp, ...], idx: int):
        self.row, self.inputs, self.label = row, inputs, f"{row.name}[{idx}] {inputs}"
        self.error: str | None = None
        self.ours: list[Tensor] = []
        self.grads: list[Tensor] = []
        self.ref: list = []
        self.ref_grads: list = []
        # float16 cases: PyTorch's float32 results for the same (half) inputs and weights, rounded to half once
        self.ref32: list | None = None
        self.ref_grads32: list | None = None
        self.got: list[np.ndarray] = []  # our outputs and gradients, realized
        bases = [
            draw(i.domain or row.domain, i.dtype, _base_shape(i), _seed(row.name, idx, k)) for k, i in enumerate(inputs)
        ]
        self.extra = (idx,) if row.variant else ()
        self.float_in = [k for k, i in enumerate(inputs) if i.dtype in ("f32", "f16")]
        try:
            self.ref, self.ref_grads, half_out = self._torch(bases)
        except Exception as e:  # noqa: BLE001 - PyTorch rejects the case: uopc must reject it too
            self.ref_error = f"{type(e).__name__}: {e}"
        else:
            self.ref_error = None
            if not row.random and any(i.dtype == "f16" for i in inputs):
                try:
                    self.ref32, self.ref_grads32, _ = self._torch(bases, half_out)
                except Exception:  # noqa: BLE001 - the op takes no float32 in place of half: only its half result counts
                    pass
        try:
            self._ours(bases)
        except Exception as e:  # noqa: BLE001 - recorded and reported by the row's test
            if self.ref_error is None:
                self.error = f"uopc raised {type(e).__name__}: {e}"
            self.ours, self.grads = [], []
            return
        if self.ref_error is not None:
            self.error = f"PyTorch raised ({self.ref_error}) but uopc did not"

    @staticmethod
    def _outs(out) -> list:
        """The outputs as a flat list (a row may return nested tuples, such as two (values, indices) pairs); a
        random row's (lo, hi) ranges stay whole."""
        if not isinstance(out, tuple) or all(isinstance(v, (int, float, str)) for v in out):
            return [out]
        return [o for x in out for o in Case._outs(x)]

    def _weights(self, outs) -> list[np.ndarray]:
        rng = np.random.default_rng(_seed(self.label, "w"))
        return [rng.standard_normal(tuple(o.shape)).astype(np.float32) for o in outs]

    def _torch(self, bases: list[np.ndarray], half_out: list[bool] | None = None) -> tuple[list, list, list[bool]]:
        """PyTorch's outputs and gradients (and which outputs are float16). Given `half_out`, the float16 inputs are
        widened to float32 first, and the results of float16 outputs and inputs rounded back to float16 once."""
        wide = half_out is not None
        grad_in = self.float_in if self.row.grad else []
        leaves = [
            torch.tensor(b.astype(np.float32) if wide and b.dtype == np.float16 else b, requires_grad=k in grad_in)
            for k, b in enumerate(bases)
        ]
        args = [_view(t, len(i.shape)) if i.layout == "nc" else t for t, i in zip(leaves, self.inputs)]
        outs = self._outs(self.row.ref(*args, *self.extra))
        if self.row.random:
            return outs, [], []
        half_out = half_out or [o.dtype == torch.float16 for o in outs]
        ref = [_rounded(o.detach().numpy(), h and wide) for o, h in zip(outs, half_out)]
        if not (self.row.grad and self.float_in):
            return ref, [], half_out
        loss = sum(
            ((o if o.is_floating_point() else o.float()) * _tw(w, o, h)).sum()
            for o, w, h in zip(outs, self._weights(outs), half_out)
        )
        targets = [leaves[k] for k in self.float_in]
        halves = [bases[k].dtype == np.float16 and wide for k in self.float_in]
        gs = [None] * len(targets)
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            gs = torch.autograd.grad(loss, targets, allow_unused=True)
        grads = [np.zeros(t.shape, t.detach().numpy().dtype) if g is None else g.numpy() for g, t in zip(gs, targets)]
        return ref, [_rounded(g, h) for g, h in zip(grads, halves)], half_out

    def _ours(self, bases: list[np.ndarray]) -> None:
        leaves = [Tensor(b) for b in bases]
        args = [_view(t, len(i.shape)) if i.layout == "nc" else t for t, i in zip(leaves, self.inputs)]
        outs = self._outs(self.row.ours(*args, *self.extra))
        self.ours = outs
        if self.row.random or not (self.row.grad and self.float_in):
            return
        loss = None
        for o, w in zip(outs, self._weights(outs)):
            term = ((o if o.dtype.is_float else o.float()) * _uw(w, o)).sum()
            loss = term if loss is None else loss + term
        self.grads = loss.gradient(*(leaves[k] for k in self.float_in))

    def tensors(self) -> list[Tensor]:
        return self.ours + self.grads

    def check(self) -> list[str]:
        """Every mismatch of this case, one line each."""
        if self.error:
            return [f"{self.label}: {self.error}"]
        if self.ref_error:
            return []
        if len(self.ours) != len(self.ref):
            return [f"{self.label}: {len(self.ours)} outputs, PyTorch {len(self.ref)}"]
        outs, grads = self.got[: len(self.ours)], self.got[len(self.ours) :]
        if self.row.random:
            return [m for o, r in zip(outs, self.ref) for m in _check_random(self.label, o, r)]
        msgs = []
        for k, (o, r) in enumerate(zip(outs, self.ref)):
            r32 = self.ref32[k] if self.ref32 else None
            tol = self.row.htol if o.dtype == np.float16 else self.row.tol
            msgs += _compare(f"{self.label} out {k}", o, r, tol, ref32=r32)
        for k, (g, r) in enumerate(zip(grads, self.ref_grads)):
            r32 = self.ref_grads32[k] if self.ref_grads32 else None
            tol = self.row.hgtol if g.dtype == np.float16 else self.row.gtol
            msgs += _compare(f"{self.label} grad of input {self.float_in[k]}", g, r, tol, True, r32)
        return msgs


def _tw(w: np.ndarray, o, half: bool = False) -> torch.Tensor:
    """The weights of output o in its dtype (float16 weights widened to o's float32 in the widened run)."""
    if half:
        return torch.tensor(w, dtype=torch.float16).to(o.dtype)
    return torch.tensor(w, dtype=o.dtype if o.is_floating_point() else torch.float32)


def _rounded(a: np.ndarray, half: bool) -> np.ndarray:
    return a.astype(np.float16) if half else a.copy()


def _uw(w: np.ndarray, o: Tensor) -> Tensor:
    return Tensor(w, dtype=o.dtype if o.dtype.is_float else dtypes.float32)


_INT64_AS = {"int64": "int32"}


def _compare(
    label: str, got: np.ndarray, ref: np.ndarray, tol: dict | None, grad: bool = False, ref32: np.ndarray | None = None
) -> list[str]:
    if got.dtype.name not in (ref.dtype.name, _INT64_AS.get(ref.dtype.name)):
        return [f"{label}: dtype {got.dtype.name}, PyTorch {ref.dtype.name}"]
    if got.shape != ref.shape:
        return [f"{label}: shape {got.shape}, PyTorch {ref.shape}"]
    if got.dtype.kind in "biu":
        bad = got != ref
        if bad.any():
            return [f"{label}: {int(bad.sum())} of {bad.size} differ, e.g. {got[bad][:3]} vs {ref[bad][:3]}"]
        return []
    dt = "f16" if got.dtype == np.float16 else "f32"
    t = tol or (GRAD if grad else FWD)[dt]
    g64, r64 = got.astype(np.float64), ref.astype(np.float64)
    with np.errstate(invalid="ignore"):
        if dt == "f16":
            ok = _within_ulps(g64, ref, t)
            if t.get("f32ref") and ref32 is not None:  # or within them of PyTorch's float32 result, rounded once
                ok |= _within_ulps(g64, ref32, t)
        else:
            ok = np.isclose(g64, r64, atol=t["atol"], rtol=t["rtol"], equal_nan=True)
        ok |= g64 == r64
    if ok.all():
        return []
    idx = np.argwhere(~ok)[:3]
    return [
        f"{label}: {int((~ok).sum())} of {ok.size} off (tol {t}), e.g. at {[tuple(i) for i in idx]}: "
        f"{[g64[tuple(i)] for i in idx]} vs {[r64[tuple(i)] for i in idx]}"
    ]


def _within_ulps(g64: np.ndarray, ref: np.ndarray, t: dict) -> np.ndarray:
    """|ours - ref| <= ulps float16 ulps at ref (np.spacing: the gap from |ref| to the next half) + atol, or equal."""
    r64 = ref.astype(np.float64)
    ulp = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)
    return (np.abs(g64 - r64) <= t["ulps"] * ulp + t["atol"]) | (np.isnan(g64) & np.isnan(r64)) | (g64 == r64)


def _check_random(label: str, a: np.ndarray, rng_ref: tuple) -> list[str]:
    """rng_ref is (lo, hi) or (lo, hi, dtype name): the values must lie in [lo, hi) and not all be equal."""
    lo, hi, *dt = rng_ref
    want = dt[0] if dt else "int32" if isinstance(lo, int) and lo >= 5 else "float32"
    if a.dtype.name != want or a.shape not in ((3, 4), (2, 3)):
        return [f"{label}: dtype {a.dtype} shape {a.shape}"]
    if not (np.isfinite(a).all() and a.min() >= lo and a.max() < hi and len(np.unique(a)) > 1):
        return [f"{label}: values outside [{lo}, {hi}) or constant: {a.ravel()[:6]}"]
    return []


# ---------------------------------------------------------------- the sweep: build every case, one realize


# rows about the 16-bit floats themselves (their inputs are float32): kept by --sweep-dtypes=f16 or bf16
_DTYPE_ROWS = {"f16": ("half",), "bf16": ("bfloat16",)}


def _selected(row: Row, inputs: tuple[Inp, ...], only: set[str]) -> bool:
    """Is this case in the run? (`make test`'s x86-64-v3 pass builds only the 16-bit float cases: --sweep-dtypes)"""
    if not only:
        return True
    return any(i.dtype in only for i in inputs) or any(w in row.name for d in only for w in _DTYPE_ROWS.get(d, ()))


@pytest.fixture(scope="module")
def sweep(request) -> dict[str, list[str]]:
    t0 = time.perf_counter()
    Tensor.manual_seed(0)
    only = {d for d in request.config.getoption("--sweep-dtypes").split(",") if d}
    cases = [Case(row, inputs, i) for row in ROWS for i, inputs in enumerate(row.cases) if _selected(row, inputs, only)]
    # one flat float64 vector per row (every output and gradient of its cases, cast exactly): a row is one fused
    # kernel plus its reductions, and all rows are one plan
    by_row: dict[str, list[Case]] = {}
    for c in cases:
        by_row.setdefault(c.row.name, []).append(c)
    packs = {name: _pack(cs) for name, cs in by_row.items()}
    t1 = time.perf_counter()
    try:
        Tensor.realize_all(*(p for p in packs.values() if p is not None))
    except Exception:  # noqa: BLE001 - find the row that breaks the batch, one realize per row
        for name, p in packs.items():
            try:
                if p is not None:
                    p.realize()
            except Exception as e:  # noqa: BLE001
                packs[name] = None
                for c in by_row[name]:
                    c.error = c.error or f"realize raised {type(e).__name__}: {e}"
    t2 = time.perf_counter()
    results: dict[str, list[str]] = {}
    for name, cs in by_row.items():
        _unpack(cs, packs[name])
        results[name] = [m for c in cs for m in c.check()]
        if all(c.ref_error for c in cs) and cs[0].row.cases:  # a row must compare something
            results[name].append(f"{name}: PyTorch raised in every case, e.g. {cs[0].ref_error}")
    n_grad = sum(len(c.grads) for c in cases)
    n_out = sum(len(c.ours) for c in cases)
    print(
        f"\ntorch sweep: {len(ROWS)} rows covering {len(covered())} public Tensor ops, {len(cases)} cases, "
        f"{n_out} outputs and {n_grad} gradients compared; build {t1 - t0:.1f} s, realize {t2 - t1:.1f} s, "
        f"{sum(map(bool, results.values()))} rows failing"
    )
    return results


def _pack(cases: list[Case]) -> Tensor | None:
    pieces = [t.cast(dtypes.float64).reshape(-1) for c in cases if not c.error for t in c.tensors() if t.numel()]
    return Tensor.cat(*pieces) if pieces else None


def _unpack(cases: list[Case], packed: Tensor | None) -> None:
    """Cut the realized vector back into each case's arrays, in their own dtypes."""
    flat = packed.numpy() if packed is not None else np.zeros(0)
    at = 0
    for c in cases:
        if c.error:
            continue
        arrays = []
        for t in c.tensors():
            n = t.numel()
            arrays.append((flat[at : at + n] if n else np.zeros(0)).astype(t.dtype.np).reshape(t.shape))
            at += n
        c.got = arrays


def covered() -> set[str]:
    names = set()
    for row in ROWS:
        names |= set(row.covers) | ({row.name} if row.cover_name else set())
    return names


def public_api() -> set[str]:
    own = set().union(*(vars(c) for c in Tensor.__mro__ if c is not object))  # dunders Tensor or a mixin defines
    return {n for n in dir(Tensor) if not n.startswith("_") or (n.startswith("__") and n in own)} - {
        "__doc__",
        "__module__",
        "__dict__",
        "__weakref__",
        "__annotations__",
        "__firstlineno__",
        "__static_attributes__",
    }


def test_every_public_op_has_a_row():
    """A new public Tensor op fails here until it has a row in sweep_rows.py (or a reason in EXCLUDED)."""
    missing = sorted(public_api() - covered() - EXCLUDED)
    assert not missing, f"public Tensor ops without a row in the torch sweep: {missing}"
    stale = sorted((covered() | EXCLUDED) - public_api() - {r.name for r in ROWS if not r.cover_name})
    assert not stale, f"rows or exclusions naming no public Tensor attribute: {stale}"


@pytest.mark.parametrize("name", [r.name for r in ROWS])
def test_row(sweep, name):
    if name not in sweep:
        pytest.skip("no case of this row takes a dtype of --sweep-dtypes")
    msgs = sweep[name]
    assert not msgs, f"{len(msgs)} mismatches against PyTorch:\n" + "\n".join(msgs[:12])


def test_metadata_matches_torch():
    for shape in [(), (0, 3), (4, 5)]:
        a, t = Tensor.zeros(*shape), torch.zeros(shape)
        assert a.shape == tuple(t.shape) and a.ndim == t.dim() and a.numel() == t.numel()
        assert a.size() == tuple(t.size()) and a.dtype is dtypes.float32 and a.device == "CPU"
        for d in range(-a.ndim, a.ndim):
            assert a.size(d) == t.size(d)


# ---------------------------------------------------------------- the requires_grad rule (README, "Gradients")


def test_requires_grad_none_receives_a_gradient():
    a = Tensor(np.array([-1.0, 2.0, -3.0, 4.0], np.float32))  # created without requires_grad: None, "not decided"
    assert a.requires_grad is None
    (a * (a < 0)).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [1.0, 0.0, 1.0, 0.0])
    r = Tensor.randn(3)
    (r * r).sum().backward()
    np.testing.assert_allclose(r.grad.numpy(), 2 * r.numpy(), rtol=1e-6)


def test_requires_grad_false_never_receives_one():
    a = Tensor([1.0, 2.0], requires_grad=False)
    b = Tensor([3.0, 4.0])
    (a * b).sum().backward()
    assert a.grad is None
    np.testing.assert_array_equal(b.grad.numpy(), [1.0, 2.0])
    c = Tensor([1.0, 2.0]).requires_grad_(False)
    d = Tensor([1.0, 2.0], requires_grad=True).detach()
    assert d.requires_grad is False
    with pytest.raises(RuntimeError, match="nothing in this graph can receive a gradient"):
        (c * d).sum().backward()
    assert c.grad is None and d.grad is None


def test_backward_where_nothing_can_receive_a_gradient_raises():
    i = Tensor([1, 2, 3])  # ints never carry gradients
    with pytest.raises(RuntimeError, match="nothing in this graph can receive a gradient"):
        (i * 2).sum().float().backward()
    with pytest.raises(RuntimeError, match="nothing in this graph can receive a gradient"):
        Tensor.ones(3).sum().backward()  # a lazy constant is not a tensor made from data


def test_sigmoid_tanh_gradients_at_minus_300_are_zero():
    x = Tensor(np.array([-300.0, 300.0, -1e30, 1e30, 0.0], np.float32))
    for f in (Tensor.sigmoid, Tensor.tanh, Tensor.silu, Tensor.softplus, Tensor.logsigmoid):
        (g,) = f(x).sum().gradient(x)
        t = torch.tensor(x.numpy(), requires_grad=True)
        ref = {
            Tensor.sigmoid: torch.sigmoid,
            Tensor.tanh: torch.tanh,
            Tensor.silu: torch.nn.functional.silu,
            Tensor.softplus: torch.nn.functional.softplus,
            Tensor.logsigmoid: torch.nn.functional.logsigmoid,
        }[f]
        (tg,) = torch.autograd.grad(ref(t).sum(), t)
        assert np.isfinite(g.numpy()).all(), f.__name__
        np.testing.assert_allclose(g.numpy(), tg.numpy(), atol=1e-6, err_msg=f.__name__)


def test_modes():
    """Tensor.train()/Tensor.test() set the training/no_grad flags for a block and restore them after."""
    assert Tensor.training is False and Tensor.no_grad is False
    with Tensor.train():
        assert Tensor.training is True
        with Tensor.train(False):
            assert Tensor.training is False
        assert Tensor.training is True
    assert Tensor.training is False
    a = Tensor([1.0, 2.0], requires_grad=True)
    with Tensor.test():
        assert Tensor.no_grad is True
        assert (a * 2).requires_grad is not True
    assert Tensor.no_grad is False and (a * 2).requires_grad is True

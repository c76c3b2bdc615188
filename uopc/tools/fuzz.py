"""Differential fuzzing: random valid Tensor programs, run by uopc and by NumPy, must agree.

    python -m uopc.tools.fuzz --n 10000 --seed 0        # a long run; prints the seed and a reproduction on a mismatch
    python -m uopc.tools.fuzz --n 2000 --grad           # gradients of each program against PyTorch autograd
    python -m uopc.tools.fuzz --n 2000 --threads 4      # 4 Python threads running programs concurrently, each checked

Program i runs under one of four modes (OPT=0 or 1, fuse_reduce off or on), cycling, so every mode sees
every kind of program. Shapes include 1, 0-size and broadcast dims; dtypes int32, float32 and bool.
With --grad, the gradient of sum(last float value * W) with respect to every float input is compared with PyTorch's
(the program's lines replayed on torch tensors through `_TorchT`, which speaks uopc's method names); programs without
a float value are counted as skipped. With --threads, the settings are global, so the programs of one mode run
together: the main thread sets the mode, N threads run that mode's seeds, and the next mode starts after they join.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from uopc.helpers import Context
from uopc.tensor import Tensor
from uopc.uop.dtype import dtypes, promote

MODES = [(0, False), (1, False), (0, True), (1, True)]  # (OPT, fuse_reduce)
NP = {dtypes.float32: np.float32, dtypes.int32: np.int32, dtypes.bool: np.bool_}


@dataclass
class Val:
    t: Tensor
    a: np.ndarray
    name: str
    leaf: bool = False  # a fresh input (a gradient target in --grad mode)


class FuzzProgram:
    """A random program built step by step; every step records the Python line that reproduces it."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.vals, self.lines, self.n = rng, [], [], 0

    def fresh(self, shape: tuple[int, ...], dt=None) -> Val:
        rng = self.rng
        dt = dt or rng.choice([dtypes.float32, dtypes.float32, dtypes.int32, dtypes.bool])
        if dt is dtypes.float32:
            a = rng.standard_normal(shape).astype(np.float32)
        elif dt is dtypes.int32:
            a = rng.integers(-6, 7, shape).astype(np.int32)
        else:
            a = rng.random(shape) < 0.5
        name = f"x{self.n}"
        self.lines.append(f"{name} = Tensor(np.array({a.tolist()!r}, dtype=np.{a.dtype.name}).reshape({shape}))")
        return self.add(Val(Tensor(a), a, name, leaf=True))

    def add(self, v: Val) -> Val:
        self.n += 1
        self.vals.append(v)
        return v

    def step(self, code: str, t: Tensor, a: np.ndarray) -> Val:
        name = f"x{self.n}"
        self.lines.append(f"{name} = {code}")
        return self.add(Val(t, np.asarray(a).astype(NP[t.dtype]) if t.dtype in NP else np.asarray(a), name))

    def pick(self) -> Val:
        return self.vals[int(self.rng.integers(len(self.vals)))]


def _shape(rng) -> tuple[int, ...]:
    nd = int(rng.integers(0, 4))
    return tuple(int(rng.choice([1, 2, 3, 4, 5, 0] if rng.random() < 0.1 else [1, 2, 3, 4, 5])) for _ in range(nd))


def _partner(p: FuzzProgram, v: Val) -> Val:
    """Another value broadcastable with v: some dims dropped or set to 1."""
    shape = list(v.a.shape)
    for i in range(len(shape)):
        if p.rng.random() < 0.3:
            shape[i] = 1
    if shape and p.rng.random() < 0.3:
        shape = shape[int(p.rng.integers(len(shape) + 1)) :]
    return p.fresh(tuple(shape))


def _np_dtype(t: Tensor):
    return NP.get(t.dtype)


# every op: (program, value) -> new value or None when it does not apply
def op_unary(p: FuzzProgram, v: Val):
    fl = v.t.dtype is dtypes.float32
    choices = (
        ["neg", "abs", "relu", "sigmoid", "tanh", "sin", "exp", "sqrt", "square"] if fl else ["neg", "abs", "square"]
    )
    if v.t.dtype is dtypes.bool:
        return p.step(f"{v.name}.logical_not()", v.t.logical_not(), np.logical_not(v.a))
    f = str(p.rng.choice(choices))
    with np.errstate(all="ignore"):
        ref = {
            "neg": lambda a: -a,
            "abs": np.abs,
            "relu": lambda a: np.where(a > 0, a, 0),
            "sigmoid": lambda a: 1 / (1 + np.exp(-a)),
            "tanh": np.tanh,
            "sin": np.sin,
            "exp": lambda a: np.exp(np.clip(a, -10, 10)),
            "sqrt": lambda a: np.sqrt(np.abs(a)),
            "square": np.square,
        }[f](v.a)
    if f == "exp":
        return p.step(f"{v.name}.clip(-10, 10).exp()", v.t.clip(-10, 10).exp(), ref)
    if f == "sqrt":
        return p.step(f"{v.name}.abs().sqrt()", v.t.abs().sqrt(), ref)
    if f == "square" and v.t.dtype is dtypes.int32 and np.abs(v.a).max(initial=0) > 1000:
        return None
    return p.step(f"{v.name}.{f}()", getattr(v.t, f)(), ref)


def op_binary(p: FuzzProgram, v: Val):
    w = _partner(p, v) if p.rng.random() < 0.7 else p.pick()
    try:
        np.broadcast_shapes(v.a.shape, w.a.shape)
    except ValueError:
        return None
    f = str(p.rng.choice(["+", "*", "-", "maximum", "minimum", "<", "==", "where", "//", "%"]))
    out_dt = promote(v.t.dtype, w.t.dtype)
    if f in ("//", "%"):
        if out_dt is not dtypes.int32:
            return None
        # a nonzero divisor of either sign: floor semantics on negative operands
        d_t, d_a = (w.t * w.t + 1) * (1 - 2 * (w.t < 0).int()), (w.a * w.a + 1) * (1 - 2 * (w.a < 0).astype(np.int32))
        code = f"({w.name} * {w.name} + 1) * (1 - 2 * ({w.name} < 0).int())"
        t = v.t // d_t if f == "//" else v.t % d_t
        ref = np.floor_divide(v.a, d_a) if f == "//" else np.mod(v.a, d_a)
        return p.step(f"{v.name} {f} ({code})", t, ref.astype(np.int32))
    if f == "-" and out_dt is dtypes.bool:
        return None
    if f == "where":
        c = p.fresh(np.broadcast_shapes(v.a.shape, w.a.shape), dtypes.bool)
        return p.step(
            f"{c.name}.where({v.name}, {w.name})", c.t.where(v.t, w.t), np.where(c.a, v.a, w.a).astype(NP[out_dt])
        )
    a, b = v.a.astype(NP[out_dt]), w.a.astype(NP[out_dt])
    with np.errstate(all="ignore"):
        if f in ("+", "*", "-", "<", "=="):
            fns = {
                "+": lambda: v.t + w.t,
                "*": lambda: v.t * w.t,
                "-": lambda: v.t - w.t,
                "<": lambda: v.t < w.t,
                "==": lambda: v.t == w.t,
            }
            t = fns[f]()
            if out_dt is dtypes.bool and f in "+*":
                ref = (a | b) if f == "+" else (a & b)
            else:
                refs = {
                    "+": lambda: a + b,
                    "*": lambda: a * b,
                    "-": lambda: a - b,
                    "<": lambda: a < b,
                    "==": lambda: a == b,
                }
                ref = refs[f]()
            return p.step(f"{v.name} {f} {w.name}", t, ref)
        t = getattr(v.t, f)(w.t)
        return p.step(f"{v.name}.{f}({w.name})", t, getattr(np, f)(a, b))


def op_movement(p: FuzzProgram, v: Val):
    rng, s = p.rng, v.a.shape
    f = str(rng.choice(["permute", "flip", "pad", "shrink", "reshape", "expand", "slice"]))
    if not s:
        f = "reshape"
    if f == "permute":
        order = tuple(int(i) for i in rng.permutation(len(s)))
        return p.step(f"{v.name}.permute({order})", v.t.permute(order), v.a.transpose(order))
    if f == "flip":
        ax = int(rng.integers(len(s)))
        return p.step(f"{v.name}.flip({ax})", v.t.flip(ax), np.flip(v.a, ax))
    if f == "pad":
        pads = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in s)
        return p.step(f"{v.name}.pad({pads})", v.t.pad(pads), np.pad(v.a, pads))
    if f == "shrink":
        bounds = []
        for n in s:
            lo = int(rng.integers(0, n + 1))
            bounds.append((lo, int(rng.integers(lo, n + 1))))
        bounds = tuple(bounds)
        return p.step(f"{v.name}.shrink({bounds})", v.t.shrink(bounds), v.a[tuple(slice(lo, hi) for lo, hi in bounds)])
    if f == "slice":
        ax = int(rng.integers(len(s)))
        st = int(rng.choice([-3, -2, -1, 2, 3]))
        idx = (slice(None),) * ax + (slice(None, None, st),)
        return p.step(f"{v.name}[{'' if not ax else ':, ' * ax}::{st}]", v.t[idx], v.a[idx])
    if f == "expand":
        if 1 not in s:
            return None
        new = tuple(int(rng.integers(1, 4)) if n == 1 else n for n in s)
        return p.step(f"{v.name}.expand({new})", v.t.expand(new), np.broadcast_to(v.a, new))
    n = int(np.prod(s))
    new = [n] if n else [0]
    if n > 1 and rng.random() < 0.7:
        d = [k for k in range(2, n + 1) if n % k == 0]
        k = int(rng.choice(d))
        new = [k, n // k]
    new = tuple(new) if rng.random() < 0.8 else (1, *new)
    return p.step(f"{v.name}.reshape({new})", v.t.reshape(new), v.a.reshape(new))


def op_reduce(p: FuzzProgram, v: Val):
    rng, s = p.rng, v.a.shape
    if not s:
        return None
    axes = tuple(sorted({int(a) for a in rng.integers(0, len(s), int(rng.integers(1, len(s) + 1)))}))
    keep = bool(rng.random() < 0.5)
    f = str(rng.choice(["sum", "max", "mean"] if v.t.dtype is dtypes.float32 else ["sum", "max"]))
    if f == "max" and any(s[a] == 0 for a in axes):
        return None
    if v.t.dtype is dtypes.bool:
        f = "sum"
    if f == "mean" and any(s[a] == 0 for a in axes):
        return None
    a = v.a.astype(np.int32) if v.t.dtype is dtypes.bool else v.a
    ref = getattr(np, f)(a, axis=axes, keepdims=keep)
    return p.step(f"{v.name}.{f}({axes}, keepdim={keep})", getattr(v.t, f)(axes, keepdim=keep), ref)


def op_matmul(p: FuzzProgram, v: Val):
    if v.t.dtype is not dtypes.float32 or not v.a.shape or v.a.size == 0:
        return None
    w = p.fresh((v.a.shape[-1], int(p.rng.integers(1, 6))), dtypes.float32)
    return p.step(f"{v.name} @ {w.name}", v.t @ w.t, v.a @ w.a)


def op_softmax(p: FuzzProgram, v: Val):
    if v.t.dtype is not dtypes.float32 or not v.a.shape or v.a.size == 0:
        return None
    e = np.exp(v.a - v.a.max(-1, keepdims=True))
    return p.step(f"{v.name}.softmax(-1)", v.t.softmax(-1), e / e.sum(-1, keepdims=True))


def op_cast(p: FuzzProgram, v: Val):
    dt = p.rng.choice([dtypes.float32, dtypes.int32, dtypes.bool])
    if dt is dtypes.int32 and v.t.dtype is dtypes.float32:
        a = np.clip(v.a, -100, 100)
        return p.step(f"{v.name}.clip(-100, 100).cast(dtypes.int32)", v.t.clip(-100, 100).cast(dt), np.trunc(a))
    return p.step(f"{v.name}.cast(dtypes.{dt.name})", v.t.cast(dt), v.a.astype(NP[dt]))


OPS = [op_unary, op_binary, op_binary, op_movement, op_movement, op_reduce, op_matmul, op_softmax, op_cast]


def generate(seed: int) -> FuzzProgram:
    rng = np.random.default_rng(seed)
    p = FuzzProgram(rng)
    p.fresh(_shape(rng))
    for _ in range(int(rng.integers(1, 7))):
        v = p.vals[-1] if rng.random() < 0.7 else p.pick()
        op = OPS[int(rng.integers(len(OPS)))]
        op(p, v)
    return p


class _Mode:
    """Program `seed`'s mode (OPT and fuse_reduce) for the duration of a `with` block."""

    def __init__(self, seed: int):
        self.opt, self.fuse = MODES[seed % len(MODES)]

    def __enter__(self):
        self.old_fuse = Tensor.fuse_reduce
        Tensor.fuse_reduce = self.fuse  # a Tensor class setting, not a helpers one: Context does not cover it
        self.ctx = Context(OPT=self.opt)
        self.ctx.__enter__()

    def __exit__(self, *exc):
        self.ctx.__exit__(*exc)
        Tensor.fuse_reduce = self.old_fuse


def check(seed: int, grad: bool = False) -> str | None:
    """Run program `seed` in its mode; None if uopc agrees with NumPy (with PyTorch's gradients if `grad`), else a
    report with a reproduction."""
    with _Mode(seed):
        return _run_grad(seed) if grad else _run(seed)


def _run(seed: int) -> str | None:
    """Build program `seed`, realize it in the current mode and compare with NumPy."""
    try:
        p = generate(seed)
    except Exception:
        return f"MISMATCH seed={seed}: building the program raised:\n{traceback.format_exc()}"
    # the last value, and every third program an earlier one too, realized together in one plan
    outs = [p.vals[-1]]
    if seed % 3 == 0 and len(p.vals) > 2:
        outs.append(p.vals[int(p.rng.integers(1, len(p.vals) - 1))])
    try:
        Tensor.realize_all(*(v.t for v in outs))
        got = [v.t.numpy() for v in outs]
    except Exception:
        return _report(seed, p, f"uopc raised:\n{traceback.format_exc()}", outs)
    for g, v in zip(got, outs):
        if g.shape != v.a.shape or g.dtype != v.a.dtype:
            what = f"{v.name}: shape/dtype {g.shape} {g.dtype} != numpy {v.a.shape} {v.a.dtype}"
            return _report(seed, p, what, outs)
        if g.dtype.kind == "f":
            ok = np.allclose(g, v.a, rtol=1e-3, atol=1e-4, equal_nan=True)
        else:
            ok = np.array_equal(g, v.a)
        if not ok:
            return _report(seed, p, f"{v.name} differs:\nuopc  {g!r}\nnumpy {v.a!r}", outs)
    return None


def _report(
    seed: int, p: FuzzProgram, what: str, outs: list[Val] | None = None, grad_of: list[str] | None = None
) -> str:
    opt, fuse = MODES[seed % len(MODES)]
    names = ", ".join(v.name for v in outs or [p.vals[-1]])
    if grad_of:  # the gradients of sum(out * W), W as _run_grad draws it
        last = (outs or [p.vals[-1]])[0].name
        run = (
            f"    w = np.random.default_rng({seed + 1}).standard_normal({last}.shape).astype(np.float32)\n"
            f"    print([g.numpy() for g in ({last} * Tensor(w)).sum().gradient({', '.join(grad_of)})])\n"
        )
    else:
        run = f"    Tensor.realize_all({names})\n    print([t.numpy() for t in ({names},)])\n"
    return (
        f"MISMATCH seed={seed} (OPT={opt}, fuse_reduce={fuse}): {what}\n--- reproduction ---\n"
        "import numpy as np\nfrom uopc import dtypes\n"
        "from uopc.helpers import Context\nfrom uopc.tensor import Tensor\n"
        f"Tensor.fuse_reduce = {fuse}\n" + "\n".join(p.lines) + "\n"
        f"with Context(OPT={opt}):\n" + run
    )


# ---------------------------------------------------------------- gradients against PyTorch autograd

SKIPPED = "skipped"  # _run_grad's answer for a program with no float value to differentiate


class _TorchT:
    """A torch tensor behind the uopc method names the generated lines use, so the lines replay under autograd."""

    def __init__(self, t):
        self.t = t

    @staticmethod
    def _u(x):
        return x.t if isinstance(x, _TorchT) else x

    def __getattr__(self, name):  # methods whose names and meaning agree: call torch's, wrap the result
        f = getattr(self.t, name)
        return lambda *a, **k: _TorchT(f(*map(self._u, a), **{n: self._u(v) for n, v in k.items()}))

    def __add__(self, o):
        return _TorchT(self.t + self._u(o))

    __radd__ = __add__

    def __sub__(self, o):  # torch refuses `-` on a bool tensor even beside a float one; uopc promotes it
        a, b = self.t, self._u(o)
        if a.dtype is _torch().bool and isinstance(b, _torch().Tensor):
            a = a.to(b.dtype)
        if isinstance(b, _torch().Tensor) and b.dtype is _torch().bool:
            b = b.to(a.dtype)
        return _TorchT(a - b)

    def __rsub__(self, o):
        return _TorchT(self._u(o) - self.t)

    def __mul__(self, o):
        return _TorchT(self.t * self._u(o))

    __rmul__ = __mul__

    def __floordiv__(self, o):
        return _TorchT(self.t // self._u(o))

    def __mod__(self, o):
        return _TorchT(self.t % self._u(o))

    def __matmul__(self, o):
        return _TorchT(self.t @ self._u(o))

    def __lt__(self, o):
        return _TorchT(self.t < self._u(o))

    def __eq__(self, o):  # type: ignore[override]
        return _TorchT(self.t == self._u(o))

    def __neg__(self):
        return _TorchT(-self.t)

    def __getitem__(self, idx):  # negative steps: torch slices forward only, so flip first
        t = self.t
        for ax, sl in enumerate(idx if isinstance(idx, tuple) else (idx,)):
            if isinstance(sl, slice) and sl.step is not None and sl.step < 0:
                t = t.flip(ax)[(slice(None),) * ax + (slice(None, None, -sl.step),)]
            elif sl != slice(None):
                t = t[(slice(None),) * ax + (sl,)]
        return _TorchT(t)

    def where(self, a, b):
        return _TorchT(_torch().where(self.t, self._u(a), self._u(b)))

    def maximum(self, o):
        return _TorchT(_torch().maximum(self.t, self._u(o)))

    def minimum(self, o):
        return _TorchT(_torch().minimum(self.t, self._u(o)))

    def pad(self, pads):
        flat = [n for lo_hi in reversed(pads) for n in lo_hi]
        return _TorchT(_torch().nn.functional.pad(self.t, flat))

    def shrink(self, bounds):
        return _TorchT(self.t[tuple(slice(lo, hi) for lo, hi in bounds)])

    def max(self, axes, keepdim=False):
        return _TorchT(self.t.amax(axes, keepdim))

    def cast(self, dt):
        return _TorchT(self.t.to(dt))


def _torch():
    import torch  # PyTorch is a test dependency, needed only by --grad

    return torch


def _torch_tensor(arr: np.ndarray) -> _TorchT:
    return _TorchT(_torch().tensor(arr, requires_grad=arr.dtype == np.float32))


def _torch_dtypes():
    torch = _torch()
    return type("dtypes", (), {"float32": torch.float32, "int32": torch.int32, "bool": torch.bool})


def _run_grad(seed: int) -> str | None:
    """Build program `seed`; compare d sum(out * W) / d input for its float inputs with PyTorch autograd."""
    try:
        p = generate(seed)
    except Exception:
        return f"MISMATCH seed={seed}: building the program raised:\n{traceback.format_exc()}"
    outs = [v for v in p.vals if v.t.dtype is dtypes.float32 and v.a.size]
    leaves = [v for v in p.vals if v.leaf and v.t.dtype is dtypes.float32]
    if not outs or not leaves:
        return SKIPPED
    out = outs[-1]
    w = np.random.default_rng(seed + 1).standard_normal(out.a.shape).astype(np.float32)
    try:
        grads = (out.t * Tensor(w)).sum().gradient(*(v.t for v in leaves))
        Tensor.realize_all(*grads)
        got = [g.numpy() for g in grads]
    except Exception:
        return _report(seed, p, f"uopc's gradient raised:\n{traceback.format_exc()}", [out])
    torch = _torch()
    env = {"Tensor": _torch_tensor, "np": np, "dtypes": _torch_dtypes()}
    try:
        for line in p.lines:
            exec(line, env)
        tout = env[out.name].t
        targets = [env[v.name].t for v in leaves]
        if tout.requires_grad:
            tg = torch.autograd.grad((tout * torch.tensor(w)).sum(), targets, allow_unused=True)
        else:
            tg = [None] * len(targets)
    except Exception:
        return _report(seed, p, f"the PyTorch replay raised:\n{traceback.format_exc()}", [out])
    for v, g, t in zip(leaves, got, tg, strict=True):
        ref = np.zeros(v.a.shape, np.float32) if t is None else t.numpy()
        if g.shape != ref.shape or not np.allclose(g, ref, rtol=1e-3, atol=1e-4, equal_nan=True):
            what = f"d {out.name} / d {v.name} differs:\nuopc  {g!r}\ntorch {ref!r}"
            return _report(seed, p, what, [out], grad_of=[v.name for v in leaves])
    return None


# ---------------------------------------------------------------- the command line


def _sequential(seeds: list[int], grad: bool) -> list[str | None]:
    return [check(s, grad) for s in seeds]


def _threaded(seeds: list[int], grad: bool, n_threads: int) -> list[str | None]:
    """The seeds of each mode run together on n_threads threads (settings are global, so modes take turns)."""
    results: dict[int, str | None] = {}
    for m in range(len(MODES)):
        group = [s for s in seeds if s % len(MODES) == m]
        if not group:
            continue
        with _Mode(group[0]), ThreadPoolExecutor(n_threads) as pool:
            run = _run_grad if grad else _run
            for s, r in zip(group, pool.map(_guarded(run), group), strict=True):
                results[s] = r
    return [results[s] for s in seeds]


def _guarded(run):
    def go(seed: int) -> str | None:
        try:
            return run(seed)
        except Exception:  # a crash in one thread is a finding, not the end of the run
            return f"MISMATCH seed={seed}: the thread raised:\n{traceback.format_exc()}"

    return go


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="differential fuzzing of uopc against NumPy (and PyTorch autograd)")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0, help="first seed; program i uses seed + i")
    ap.add_argument("--grad", action="store_true", help="check gradients against PyTorch autograd")
    ap.add_argument("--threads", type=int, default=0, help="run programs on this many Python threads at once")
    args = ap.parse_args(argv)
    bad, skipped, done, t0 = 0, 0, 0, time.perf_counter()
    seeds = list(range(args.seed, args.seed + args.n))
    for start in range(0, args.n, 100):
        chunk = seeds[start : start + 100]
        reps = _threaded(chunk, args.grad, args.threads) if args.threads else _sequential(chunk, args.grad)
        for rep in reps:
            if rep == SKIPPED:
                skipped += 1
            elif rep:
                bad += 1
                print(rep, flush=True)
        done += len(chunk)
        print(f"  {done}/{args.n} programs, {bad} mismatches, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    how = (" gradients vs PyTorch" if args.grad else "") + (f", {args.threads} threads" if args.threads else "")
    print(
        f"fuzz{how}: {args.n} programs (seeds {args.seed}..{args.seed + args.n - 1}), {bad} mismatches"
        + (f", {skipped} without a float value to differentiate" if args.grad else "")
        + f", {time.perf_counter() - t0:.0f} s"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

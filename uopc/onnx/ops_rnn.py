"""ONNX recurrent layers (RNN, GRU, LSTM), unrolled over the sequence while the graph is built.

    H_t = tanh(X_t @ W.T + H_{t-1} @ R.T + Wb + Rb)            RNN, one step; GRU and LSTM add gates

Every direction and layout, the activation lists with their alpha/beta, `clip`, GRU's linear_before_reset, LSTM's
peepholes and input_forget; `sequence_lens` masks the steps past each batch entry's length (forward direction).
"""

from __future__ import annotations

import numpy as np

from uopc import Tensor
from uopc.onnx.graph import Node, op


def _activation(name: str, alpha: float | None, beta: float | None):
    a = alpha
    table = {
        "relu": lambda x: x.relu(),
        "tanh": lambda x: x.tanh(),
        "sigmoid": lambda x: x.sigmoid(),
        "affine": lambda x: x * a + beta,
        "leakyrelu": lambda x: x.leaky_relu(0.01 if a is None else a),
        "thresholdedrelu": lambda x: (x > (1.0 if a is None else a)).where(x, 0.0),
        "scaledtanh": lambda x: (x * beta).tanh() * a,
        "hardsigmoid": lambda x: (x * (0.2 if a is None else a) + (0.5 if beta is None else beta)).clip(0, 1),
        "elu": lambda x: x.elu(1.0 if a is None else a),
        "softsign": lambda x: x.softsign(),
        "softplus": lambda x: x.relu() + (-x.abs()).exp().log1p(),
    }
    key = name.lower()
    if key not in table:
        raise NotImplementedError(f"uopc.onnx: recurrent activation {name!r} is not supported")
    return table[key]


_NEEDS = {"affine": 2, "leakyrelu": 1, "thresholdedrelu": 1, "scaledtanh": 2, "hardsigmoid": 2, "elu": 1}


def _activations(n: Node, defaults: list[str], ndir: int) -> list[list]:
    names = n.attr("activations") or defaults * ndir
    alphas, betas = list(n.attr("activation_alpha", [])), list(n.attr("activation_beta", []))
    fns = []
    for name in names:
        k = _NEEDS.get(name.lower(), 0)
        a = alphas.pop(0) if k >= 1 and alphas else None
        b = betas.pop(0) if k >= 2 and betas else None
        fns.append(_activation(name, a, b))
    per = len(defaults)
    return [fns[d * per : (d + 1) * per] for d in range(ndir)]


def _setup(n: Node, x, w, r, b, lens, h0, gates: int):
    x, w, r = n.t(x), n.t(w), n.t(r)
    if n.attr("layout", 0):
        x = x.permute(1, 0, 2)  # (batch, seq, in) -> (seq, batch, in)
    seq, batch = x.shape[0], x.shape[1]
    ndir, hid = w.shape[0], n.attr("hidden_size", r.shape[-1])
    bias = n.t(b) if b is not None else Tensor.zeros(ndir, 2 * gates * hid, dtype=x.dtype)
    h = n.t(h0) if h0 is not None else Tensor.zeros(ndir, batch, hid, dtype=x.dtype)
    mask = None
    if lens is not None:
        ln = n.host(lens).astype(np.int64)
        if (ln < seq).any():
            mask = ln
    return x, w, r, bias, h, mask, seq, batch, ndir, hid


def _directions(n: Node, ndir: int) -> list[bool]:
    d = n.attr("direction", "forward")
    return [False, True] if d == "bidirectional" else [d == "reverse"] * ndir


def _clip(n: Node, v: Tensor) -> Tensor:
    c = n.attr("clip")
    return v if c is None else v.clip(-c, c)


def _step_mask(mask, t: int, batch: int):
    return None if mask is None else Tensor((t < mask).reshape(batch, 1))


def _outputs(n: Node, ys: list[list[Tensor]], finals: list[list[Tensor]]):
    """Y (seq, dirs, batch, hidden) or with layout 1 (batch, seq, dirs, hidden), then Y_h (and Y_c)."""
    y = Tensor.stack(*[Tensor.stack(*steps, dim=0) for steps in ys], dim=1)
    outs = [Tensor.stack(*f, dim=0) for f in finals]
    if n.attr("layout", 0):
        y = y.permute(2, 0, 1, 3)
        outs = [o.permute(1, 0, 2) for o in outs]
    return (y, *outs)


def _run(n: Node, x, w, r, bias, mask, seq, batch, ndir, hid, states, cell):
    ys, finals = [], [[] for _ in states]
    for d, rev in enumerate(_directions(n, ndir)):
        st = [s[d] for s in states]
        steps = []
        order = range(seq - 1, -1, -1) if rev else range(seq)
        for t in order:
            new = cell(d, x[t], st)
            m = _step_mask(mask, t, batch)
            if m is not None:
                new = [m.where(a, b) for a, b in zip(new, st)]
                steps.append(m.where(new[0], 0.0))
            else:
                steps.append(new[0])
            st = new
        ys.append(steps[::-1] if rev else steps)
        for f, s in zip(finals, st):
            f.append(s)
    return _outputs(n, ys, finals)


@op("RNN")
def _rnn(n: Node, x, w, r, b=None, lens=None, h0=None):
    x, w, r, bias, h, mask, seq, batch, ndir, hid = _setup(n, x, w, r, b, lens, h0, 1)
    acts = _activations(n, ["Tanh"], ndir)

    def cell(d, xt, st):
        pre = xt @ w[d].T + st[0] @ r[d].T + bias[d, :hid] + bias[d, hid:]
        return [acts[d][0](_clip(n, pre))]

    return _run(n, x, w, r, bias, mask, seq, batch, ndir, hid, [h], cell)


@op("GRU")
def _gru(n: Node, x, w, r, b=None, lens=None, h0=None):
    x, w, r, bias, h, mask, seq, batch, ndir, hid = _setup(n, x, w, r, b, lens, h0, 3)
    acts = _activations(n, ["Sigmoid", "Tanh"], ndir)
    lbr = n.attr("linear_before_reset", 0)

    def cell(d, xt, st):
        f, g = acts[d]
        hp = st[0]
        wb, rb = bias[d, : 3 * hid], bias[d, 3 * hid :]
        xw = xt @ w[d].T + wb  # (batch, 3*hid): z, r, h
        rz, rr, rh = (r[d][i * hid : (i + 1) * hid] for i in range(3))
        z = f(_clip(n, xw[:, :hid] + hp @ rz.T + rb[:hid]))
        rt = f(_clip(n, xw[:, hid : 2 * hid] + hp @ rr.T + rb[hid : 2 * hid]))
        if lbr:
            hh = g(_clip(n, xw[:, 2 * hid :] + rt * (hp @ rh.T + rb[2 * hid :])))
        else:
            hh = g(_clip(n, xw[:, 2 * hid :] + (rt * hp) @ rh.T + rb[2 * hid :]))
        return [(1 - z) * hh + z * hp]

    return _run(n, x, w, r, bias, mask, seq, batch, ndir, hid, [h], cell)


@op("LSTM")
def _lstm(n: Node, x, w, r, b=None, lens=None, h0=None, c0=None, p=None):
    x, w, r, bias, h, mask, seq, batch, ndir, hid = _setup(n, x, w, r, b, lens, h0, 4)
    c = n.t(c0) if c0 is not None else Tensor.zeros(ndir, batch, hid, dtype=x.dtype)
    peep = n.t(p) if p is not None else None
    acts = _activations(n, ["Sigmoid", "Tanh", "Tanh"], ndir)
    couple = n.attr("input_forget", 0)

    def cell(d, xt, st):
        f, g, hfn = acts[d]
        hp, cp = st
        pre = xt @ w[d].T + hp @ r[d].T + bias[d, : 4 * hid] + bias[d, 4 * hid :]
        gi, go, gf, gc = (pre[:, k * hid : (k + 1) * hid] for k in range(4))
        if peep is not None:
            gi, gf = gi + peep[d, :hid] * cp, gf + peep[d, 2 * hid :] * cp
        i = f(_clip(n, gi))
        ft = 1 - i if couple else f(_clip(n, gf))
        ct = ft * cp + i * g(_clip(n, gc))
        if peep is not None:
            go = go + peep[d, hid : 2 * hid] * ct
        o = f(_clip(n, go))
        return [o * hfn(ct), ct]

    return _run(n, x, w, r, bias, mask, seq, batch, ndir, hid, [h, c], cell)

"""How much of tinygrad's user-facing Tensor API uopc has, counted against the list in docs/tinygrad_api.txt.

The floor only goes up: adding a name raises it, and removing one fails this test. `pytest -s` prints the count.
"""

from __future__ import annotations

import os

from uopc import Tensor

LIST = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "tinygrad_api.txt"
)
FLOOR = 211  # names uopc has today; raise it when the API grows


def tinygrad_names() -> list[str]:
    with open(LIST) as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]


def covered() -> tuple[list[str], list[str]]:
    t = Tensor([1.0])  # instance attributes (grad, requires_grad) count too
    names = tinygrad_names()
    have = [n for n in names if hasattr(Tensor, n) or hasattr(t, n)]
    return have, [n for n in names if n not in have]


def test_list_is_the_documented_one():
    names = tinygrad_names()
    assert len(names) == len(set(names)) == 223
    assert {"conv2d", "scaled_dot_product_attention", "sort", "cumsum"} <= set(names)


def test_api_coverage_never_drops():
    have, missing = covered()
    print(f"\nuopc has {len(have)} of {len(have) + len(missing)} tinygrad Tensor names; missing: {' '.join(missing)}")
    assert len(have) >= FLOOR, f"uopc lost tinygrad names: has {len(have)}, floor {FLOOR}"


def test_api_page_names_every_public_name():
    """docs/api.md, the one API page, mentions every public Tensor name and every uopc.nn name."""
    import uopc.nn as nn

    with open(os.path.join(os.path.dirname(LIST), "api.md")) as f:
        doc = f.read()
    tensor_names = {n for n in dir(Tensor) if not n.startswith("_")}
    missing = sorted(n for n in tensor_names if not any(p in doc for p in (f"`{n}`", f"`{n}(", f".{n}(", f"`x.{n}")))
    assert not missing, f"Tensor names missing from docs/api.md: {missing}"
    missing_nn = sorted(n for n in nn.__all__ if f"`{n}" not in doc)
    assert not missing_nn, f"uopc.nn names missing from docs/api.md: {missing_nn}"

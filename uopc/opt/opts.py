"""Opts: how one kernel maps onto the machine; a small frozen record shared by the heuristic, the search, the
on-disk search cache, lowering and the DEBUG printout.

    Opts(upcast={0: 4, 1: 4}, thread=0, tile={0: 128, 1: 128})   # 4x4 register tile, threads over rows, blocks

Its key and its JSON come from its fields, so a new field can never be forgotten by one of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Opts:
    """How to map one kernel onto the machine. Chosen by uopc.opt, applied by uopc.codegen.rangeify during lowering."""

    upcast: dict[int, int] = field(default_factory=dict)  # output axis -> copies per iteration (register tile)
    thread: int | None = None  # output axis run in parallel (OpenMP)
    unroll: int = 1  # unroll factor of the innermost reduce axis
    tile: dict[int, int] = field(default_factory=dict)  # output axis -> cache block size
    ktile: int = 0  # chunk of the innermost reduce axis, looped outside the register tiles of a cache block
    vec: int = 0  # SIMD width in elements: upcast copies at consecutive addresses become vector ops (0: none)
    prefetch: int = 0  # bytes ahead the reduce loops' streamed vector loads also prefetch into L2 (0: none)

    @property
    def register_tile(self) -> bool:
        """Does the kernel keep a tile of SIMD vectors over two or more output axes in registers (the GEMM
        microkernel's MR x NR)?"""
        return self.vec > 0 and sum(1 for n in self.upcast.values() if n > 1) >= 2

    def key(self) -> tuple:
        """A hashable identity of these choices, from every field (dicts as sorted item tuples)."""
        return tuple(_hashable(getattr(self, f.name)) for f in dataclasses.fields(self))

    def __hash__(self) -> int:
        return hash(self.key())

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (dict keys become strings, as JSON needs)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Opts:
        """The inverse of to_json; fields missing from `d` keep their defaults, unknown keys are an error."""
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in d:
                v = d[f.name]
                kw[f.name] = {int(k): int(x) for k, x in v.items()} if isinstance(v, dict) else v
        extra = set(d) - set(kw)
        if extra:
            raise KeyError(f"Opts.from_json: unknown field(s) {sorted(extra)}")
        return cls(**kw)


def _hashable(v: Any) -> Any:
    return tuple(sorted(v.items())) if isinstance(v, dict) else v

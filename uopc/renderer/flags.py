"""A kernel unit's own compiler flags, on its first line: `// uopc cflags: ...`.

    flags_line([ast])  ->  "// uopc cflags: --param=max-completely-peel-times=4 ...\n"   (or "" under a user's CFLAGS)
    unit_cflags(src)   ->  ["--param=max-completely-peel-times=4", ...]                  (what uopc.runtime adds)

Every C unit of a kernel starts with the line its kernels ask for: a plan's units (uopc.renderer.plan) and a kernel
rendered alone (uopc.renderer.c.render_c: the autotuner times what the plan will run).
"""

from __future__ import annotations

from uopc import helpers
from uopc.uop import Ops, UOp

__all__ = [
    "CFLAGS_LINE",
    "NO_PEELING",
    "PANEL_TRANSFORM",
    "SHORT_PEELING",
    "WEIGHT_TRANSFORM",
    "flags_line",
    "unit_cflags",
]


# A unit's own compiler flags, on its first line (added to the CFLAGS it compiles with: uopc.runtime reads them, and
# they are part of the source every cache key covers). Under uopc's default flags they limit gcc's complete peeling of
# small loops (-O3 unrolls every loop of up to 16 iterations whole). A Winograd transform takes none: its C is written
# out per tile already, and the peeling tripled its code; ResNet-18's transforms compiled in 1.3 s of gcc's 4.5, up
# to a third less without it, and ran no slower (input transforms 23-27 ms against 23-75 over 25 calls, output
# transforms 11 against 14-35). Other kernels peel loops of up to 4 iterations (a pooling window's, a fold's last
# steps): a 512x512 softmax compiled in 82 ms against 94 and ran 3% faster (0.087-0.089 ms against 0.090-0.091,
# 3 alternating rounds), with no peeling at all 3% slower; max pools, GEMMs and the GPT-2 forward measured the same.
# Fused attention keeps gcc's default: its blocks are written for their 16-float loops to unroll (5-7% slower
# without). A Winograd weight transform, which runs once per weight change, compiles at -O2 too: ResNet-18's three
# took 145/82/59 ms of gcc, 62/62/47 at -O2, and ran as fast (3 convolutions whose weights change every call, 30
# calls: 31.9-38.8 ms against 31.0-42.3, alternating processes); the input and output transforms ran slower there.
# An input transform that writes a GEMM's panels (Winograd.panel) compiles without vectorized epilogues: ResNet-18's
# 28x28 one took gcc 233-237 ms, 133-135 without, and ran as fast (89-100 us a call against 89-103, alternating);
# its 14x14 and 7x7 ones compiled as long either way, and the 56x56 transform that writes no panels ran 20% slower.
#
# Ordinary kernels also let gcc check up to 64 pairs of pointers for overlap before a vectorized loop, not 10: in a
# parallel loop's outlined body `restrict` is lost, so gcc vectorizes a loop only behind such checks, and a group of
# updates reads and writes more arrays than 10 checks cover (AdamW's m, v and p: 4 reads, 3 writes, 15 checks). Not
# vectorized, that kernel moved 21.6 GB/s, against 33 for the three kernels it replaces (4 x 2048^2 parameters). Of
# the 219 units of the four bench models only it vectorizes differently (gcc -fopt-info-vec, each unit both ways);
# vectorized, it takes 3.2-4.1 ms a step there against 4.8-5.0 for the three (DEBUG=3's second runs). Keeping
# `restrict` instead, by making a parallel loop's body an always_inline function of restrict pointers called from
# the loop (gcc carries restrict through inlining; restrict locals inside the region it ignores), took the checks out
# of 22 of the CNN step's 25 units that had them, but gcc took as long (3.20 s against 3.19 over its 74 units) and
# the step ran 1.05x slower (41 alternating rounds, both orders; char-GPT 1.00x): not kept.
CFLAGS_LINE = "// uopc cflags:"
NO_PEELING = ("--param=max-completely-peel-times=1",)
SHORT_PEELING = ("--param=max-completely-peel-times=4", "--param=vect-max-version-for-alias-checks=64")
WEIGHT_TRANSFORM = (*NO_PEELING, "-O2")
PANEL_TRANSFORM = (*NO_PEELING, "--param=vect-epilogues-nomask=0")


def unit_cflags(src: str) -> list[str]:
    """The flags a unit's first line asks for (see CFLAGS_LINE), or none."""
    if not src.startswith(CFLAGS_LINE):
        return []
    return src[len(CFLAGS_LINE) : src.index("\n")].split()


def flags_line(asts: list[UOp]) -> str:
    """The CFLAGS_LINE of a unit holding these kernels, or "" (a CFLAGS of the user's applies as it is)."""
    if helpers.settings().CFLAGS is not None or not asts or any(a.src[0].op is Ops.ATTENTION for a in asts):
        return ""
    if all(a.src[0].op is Ops.WINOGRAD for a in asts):
        ops = [a.src[0].arg.op for a in asts]
        if all(w.kind == "w" for w in ops):
            flags = WEIGHT_TRANSFORM
        elif all(w.kind == "in" and w.panel for w in ops):
            flags = PANEL_TRANSFORM
        else:
            flags = NO_PEELING
    else:
        flags = SHORT_PEELING
    return f"{CFLAGS_LINE} {' '.join(flags)}\n"

"""Software prefetches for the loads that stream through memory: which loads of a reduce loop take one, and how far
ahead they read (uopc.renderer.c writes `__builtin_prefetch` after each such load).

    for (k = 0; k < K; k++) {                      a microkernel's B panel, NR floats a step (offsets in floats)
      f32x16 b0 = *(f32x16*)(data1 + i + k*64);
      __builtin_prefetch(data1 + i + k*64 + 1024);              PREFETCH_BYTES or PREFETCH_MIN_STEPS iterations
                                                                ahead, whichever is further, into L1
      __builtin_prefetch(data1 + i + k*64 + 4096, 0, 2);        the loop's RangeArg.prefetch ahead, into L2
"""

from __future__ import annotations

from uopc.codegen.linearize import Loop
from uopc.codegen.vectorize import buffer_of, index_step
from uopc.uop import Ops, UOp

__all__ = ["PREFETCH_BYTES", "PREFETCH_MIN_STEPS", "streamed_loads"]


# A vector load that runs through memory a vector or more per iteration of its reduce loop (the microkernel's B
# panels, KC x NR floats read row by row; a weight streamed per call) also prefetches what it reads this many bytes
# ahead. The hardware's stream prefetchers do not keep up with a panel read 256 bytes per 24 FMAs from memory: on a
# Xeon (Sapphire Rapids class, a VM, 2 threads), ResNet-18 at batch 1 had its three 512-channel Winograd products
# (16 x (16 x 512) @ (512 x 512), 16 MiB of transformed weight) at 1.43 ms each, 1.05-1.10 with a prefetch 2 KiB
# ahead (one process, interleaved: ResNet-18 batch 1 0.90x, batch 8 0.95x, the conv forward + backward 0.90x, the CNN
# step 0.95x, GPT-2's forward 0.95x, char-GPT's step and 1024^3 0.99-1.0x; 4 KiB ahead no better, 1 KiB less; 12
# pairs of (768 x 3072, 3072 x 768) weights, 226 MB, after one row 0.93x, after 4 rows 0.82x).
# A reduce loop may also carry a distance of its own (RangeArg.prefetch, from Opts.prefetch: the optimizer sets it
# for a microkernel whose B comes from memory for few row tiles), prefetched into L2 as well.
PREFETCH_BYTES = 2048
# ...and at least this many iterations ahead (at most a quarter of the loop's: what is prefetched past its end is
# wasted): a load that jumps far each iteration was prefetched one iteration ahead, a few dozen cycles before its use.
# B read in place a row of the activation per k (12.5 KB apart in MobileNetV2's 24 x 144 @ 144 x 3136 projections at
# batch 8, whose 14 MB come from memory) took 1.43 -> 1.07 ms so; a panel's loads, 8 iterations ahead by the bytes,
# go 16. One process, interleaved, 11-15 rounds: MobileNetV2 0.958-0.969x at batch 1, 0.991-0.995x at batch 8, the
# CNN step 0.978x, GPT-2's forward 0.984x, char-GPT's step 0.988x, ResNet-18 0.990-0.994x, the conv forward +
# backward 1.004-1.016x. (Without the quarter-of-the-loop cap a K = 32 product, MobileNetV2's 16 x 32 @ 32 x 12544 at
# batch 8, ran 0.68 -> 0.93 ms: half its prefetches fell past the loop.)
PREFETCH_MIN_STEPS = 16


def streamed_loads(lp: Loop) -> dict[UOp, tuple[int, int]]:
    """The vector loads of plain buffer memory in reduce loop `lp`'s own body whose index advances by a vector or
    more per iteration: {load: the elements ahead its prefetches read, PREFETCH_BYTES (or _min_steps iterations,
    if further) and the loop's own distance (0: none), rounded up to whole steps}."""
    out = {}
    for x in lp.body:
        if isinstance(x, Loop) or x.op is not Ops.LOAD or x.dtype.count == 1:
            continue
        idx = x.src[0]
        if len(idx.src) > 2 or idx.arg is not None or buffer_of(idx).op is not Ops.BUFFER:
            continue  # gated or partial vectors: their own code paths
        step, size = index_step(idx.src[1], lp.rng), x.dtype.scalar().itemsize
        if step is not None and step * size >= x.dtype.itemsize:
            near, far = (-(-d // (step * size)) * step for d in (PREFETCH_BYTES, lp.rng.arg.prefetch))
            out[x] = (max(near, _min_steps(lp.rng) * step), far)
    return out


def _min_steps(rng: UOp) -> int:
    """The fewest iterations ahead a load of loop `rng` prefetches: PREFETCH_MIN_STEPS, at most a quarter of the
    loop's (0 for a loop that ends at a kernel argument)."""
    end = rng.src[0]
    return min(PREFETCH_MIN_STEPS, end.arg // 4) if end.op is Ops.CONST else 0

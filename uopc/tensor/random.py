"""Random numbers generated in the graph, training mode, dropout, and the weight initializers built on them.

Every sample is a counter-based hash (Philox-2x32, 10 rounds) of a one-element key tensor (the seed) and a 64-bit
counter: element i of a draw of n values hashes `counter + i`, and the draw advances the counter tensor by n with a
lazy assign. The counter is realized together with whatever realize comes next, inside the same plan, so a plan
replayed with the same structure reads the advanced counter and draws fresh numbers; `manual_seed` reproduces them.

    round:  hi, lo = mulhilo(0xD256D193, R);  (L, R) = (lo, hi ^ key ^ L);  key += 0x9E3779B9

The 32x32 -> 64-bit products are uint64 multiplies of values below 2^32 (never wrapping), hi/lo an IDIV/MOD by 2^32.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, ClassVar, Self

import numpy as np

from uopc.helpers import prod
from uopc.tensor.shape import shape_arg
from uopc.uop import UOp
from uopc.uop.dtype import dtypes, least_upper_float, to_dtype

_PHILOX_M = 0xD256D193
_PHILOX_W = 0x9E3779B9
_ROUNDS = 10
_2_32 = 1 << 32


class _Mode(contextlib.ContextDecorator):
    """Set a class flag of Tensor for the duration of a `with` block (or a decorated function)."""

    def __init__(self, cls: type, name: str, mode: bool):
        self.cls, self.name, self.mode = cls, name, mode

    def __enter__(self) -> None:
        self.prev = getattr(self.cls, self.name)
        setattr(self.cls, self.name, self.mode)

    def __exit__(self, *exc: Any) -> None:
        setattr(self.cls, self.name, self.prev)


class RandomMixin:
    """Random creation (class methods), dropout and the training/no_grad switches of Tensor."""

    training: ClassVar[bool] = False  # dropout and BatchNorm-style layers act only while training
    no_grad: ClassVar[bool] = False  # while True, new results do not track gradients
    _rng_key: ClassVar[Any] = None  # (1,) uint64 tensor holding the 32-bit seed
    _rng_counter: ClassVar[Any] = None  # (1,) uint64 tensor: how many values were drawn since the seed

    @classmethod
    def train(cls, mode: bool = True) -> _Mode:
        """`with Tensor.train():` sets Tensor.training for the block (tinygrad's form); also a decorator."""
        return _Mode(cls, "training", mode)

    @classmethod
    def test(cls, mode: bool = True) -> _Mode:
        """`with Tensor.test():` sets Tensor.no_grad for the block (tinygrad's form): no gradients are tracked."""
        return _Mode(cls, "no_grad", mode)

    # ---------------------------------------------------------------- the generator

    @classmethod
    def manual_seed(cls, seed: int = 0) -> None:
        """Make every later random draw reproducible: the key becomes `seed` (mod 2^32) and the counter 0."""
        RandomMixin._rng_key = cls(np.array([int(seed) % _2_32], np.uint64))
        RandomMixin._rng_counter = cls(np.zeros(1, np.uint64))

    @classmethod
    @contextlib.contextmanager
    def seeded(cls, seed: int):
        """`with Tensor.seeded(s):` draws inside the block come from a generator seeded with `s` (key s, counter 0);
        the generator outside it continues afterwards as if the block had drawn nothing (ONNX's `seed` attribute)."""
        saved = RandomMixin._rng_key, RandomMixin._rng_counter
        cls.manual_seed(seed)
        try:
            yield
        finally:
            RandomMixin._rng_key, RandomMixin._rng_counter = saved

    @classmethod
    def _rng_state(cls) -> tuple[Any, Any]:
        if RandomMixin._rng_key is None:  # unseeded: a key from the OS, as an unseeded NumPy generator
            cls.manual_seed(int.from_bytes(os.urandom(4), "little"))
        return RandomMixin._rng_key, RandomMixin._rng_counter

    @classmethod
    def _iota(cls, n: int) -> Self:
        """0..n-1 as uint64 without a host buffer: a sum of one lazy 0/1 bit pattern per binary digit."""
        k = max(1, (n - 1).bit_length())
        out = None
        for b in range(k):
            bit = UOp.const(1, dtypes.uint64).reshape((1,)).pad(((1, 0),))  # [0, 1]
            shape = (1,) * b + (2,) + (1,) * (k - 1 - b)
            t = cls(bit.reshape(shape).expand((2,) * k)) * (1 << (k - 1 - b))
            out = t if out is None else out + t
        return out.reshape(1 << k).shrink(((0, n),))

    @classmethod
    def _philox(cls, n: int) -> tuple[Self, Self]:
        """Two independent uint64 tensors of n hashed 32-bit words; advances the counter by n (lazily)."""
        key, counter = cls._rng_state()
        ctr = counter + cls._iota(n)
        counter.assign(counter + n)  # ctr keeps the old value's graph; the next draw sees the advanced one
        r, lft = ctr % _2_32, ctr // _2_32
        for i in range(_ROUNDS):
            k = key if i == 0 else (key + (i * _PHILOX_W) % _2_32) % _2_32
            p = r * _PHILOX_M
            r, lft = (p // _2_32) ^ k ^ lft, p % _2_32
        return r, lft

    @classmethod
    def random_bits(cls, *shape: Any) -> Self:
        """Uniformly distributed uint32 words of `shape`, hashed in the graph."""
        shape = shape_arg(shape)
        if prod(shape) == 0:
            return cls.zeros(shape, dtype=dtypes.uint32)
        return cls._philox(prod(shape))[0].cast(dtypes.uint32).reshape(shape)

    @classmethod
    def _unit(cls, bits: Self, dtype: Any) -> Self:
        """Uniform [0, 1) in float32 from the top 24 bits of a word (float64 uses 32; half rounds float32)."""
        if to_dtype(dtype) is dtypes.float64:
            return bits.cast(dtypes.float64) * 2.0**-32
        return (bits // 256).cast(dtypes.float32) * 2.0**-24

    @classmethod
    def _sample(cls, t: Any, requires_grad: bool | None) -> Self:
        """Samples as a new tensor that behaves like one created from data: requires_grad None (undecided) lets
        backward() without a parameter list find it, as it finds a Tensor made from an array."""
        out = cls(t.uop, requires_grad=requires_grad)
        return out.requires_grad_(None) if requires_grad is None else out

    @classmethod
    def rand(cls, *shape: Any, dtype: Any = None, requires_grad: bool | None = None) -> Self:
        """Uniform samples in [0, 1)."""
        shape = shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if not dt.is_float:
            raise TypeError(f"rand needs a float dtype, got {dt!r}")
        if prod(shape) == 0:
            return cls.zeros(shape, dtype=dt, requires_grad=requires_grad)
        u = cls._unit(cls._philox(prod(shape))[0], dt).cast(dt).reshape(shape)
        return cls._sample(u, requires_grad)

    @classmethod
    def randn(cls, *shape: Any, dtype: Any = None, requires_grad: bool | None = None) -> Self:
        """Standard normal samples: Box-Muller from the two words of each hash."""
        shape = shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if not dt.is_float:
            raise TypeError(f"randn needs a float dtype, got {dt!r}")
        if prod(shape) == 0:
            return cls.zeros(shape, dtype=dt, requires_grad=requires_grad)
        a, b = cls._philox(prod(shape))
        wide = dtypes.float64 if dt is dtypes.float64 else dtypes.float32
        u1 = 1.0 - cls._unit(a, wide)  # (0, 1]: log never sees 0
        u2 = cls._unit(b, wide)
        z = ((u1.log() * -2.0).sqrt() * (u2 * (2 * math.pi)).cos()).cast(dt).reshape(shape)
        return cls._sample(z, requires_grad)

    @classmethod
    def uniform(
        cls, *shape: Any, low: float = 0.0, high: float = 1.0, dtype: Any = None, requires_grad: bool | None = None
    ) -> Self:
        """Uniform samples in [low, high)."""
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        u = cls.rand(*shape, dtype=dtypes.float64 if dt is dtypes.float64 else dtypes.float32)
        return cls._sample((u * (high - low) + low).cast(dt), requires_grad)

    @classmethod
    def normal(
        cls, *shape: Any, mean: float = 0.0, std: float = 1.0, dtype: Any = None, requires_grad: bool | None = None
    ) -> Self:
        """Normal samples with `mean` and `std`."""
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        z = cls.randn(*shape, dtype=dtypes.float64 if dt is dtypes.float64 else dtypes.float32)
        return cls._sample((z * std + mean).cast(dt), requires_grad)

    @classmethod
    def randint(cls, *shape: Any, low: int = 0, high: int = 10, dtype: Any = None) -> Self:
        """Random integers in [low, high) (int32 unless `dtype`); a word modulo the range (bias < range / 2^32)."""
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_int
        if not dt.is_int:
            raise TypeError(f"randint needs an int dtype, got {dt!r}")
        if high <= low:
            raise ValueError(f"randint: high ({high}) must be greater than low ({low})")
        shape = shape_arg(shape)
        if prod(shape) == 0:
            return cls.zeros(shape, dtype=dt)
        r = cls._philox(prod(shape))[0] % (high - low)
        return (r.cast(dtypes.int64) + low).cast(dt).reshape(shape)

    def rand_like(self, dtype: Any = None, requires_grad: bool | None = None) -> Self:
        """Uniform [0, 1) samples with self's shape and (float) dtype."""
        return self.rand(self.shape, dtype=dtype or least_upper_float(self.dtype), requires_grad=requires_grad)

    def randn_like(self, dtype: Any = None, requires_grad: bool | None = None) -> Self:
        """Standard normal samples with self's shape and (float) dtype."""
        return self.randn(self.shape, dtype=dtype or least_upper_float(self.dtype), requires_grad=requires_grad)

    @classmethod
    def randperm(cls, n: int, dtype: Any = None) -> Self:
        """A random permutation of 0..n-1: the argsort of n random words (ties broken by position)."""
        if n < 0:
            raise ValueError(f"randperm: n must be >= 0, got {n}")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_int
        if n == 0:
            return cls.zeros(0, dtype=dt)
        return cls.random_bits(n).cast(dtypes.int64).argsort().cast(dt)

    def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Self:
        """Indices drawn from the (unnormalized) weights in the last dim of a 1-D or 2-D tensor.

        With replacement: inverse CDF, count(cdf <= u). Without: the top `num_samples` of log(w) + Gumbel noise."""
        if self.ndim not in (1, 2):
            raise ValueError(f"multinomial needs a 1-D or 2-D tensor of weights, got shape {self.shape}")
        if num_samples < 1 or (not replacement and num_samples > self.shape[-1]):
            raise ValueError(
                f"multinomial: cannot draw {num_samples} samples from {self.shape[-1]} categories "
                f"({'with' if replacement else 'without'} replacement)"
            )
        w = self.reshape(-1, self.shape[-1])._to_float()
        rows, n = w.shape
        if replacement:
            cdf = w.cumsum(1)
            cdf = cdf / cdf[:, -1:]
            u = self.rand(rows, num_samples, 1)
            out = (cdf.reshape(rows, 1, n) <= u).sum(-1).minimum(n - 1)
        else:
            g = -(-(self.rand(rows, n) * (1 - 2**-24) + 2**-25).log()).log()
            out = (w.log() + g).topk(num_samples, dim=1)[1]
        out = out.cast(dtypes.int32)
        return out.reshape(num_samples) if self.ndim == 1 else out

    # ---------------------------------------------------------------- initializers (tinygrad's names)

    @classmethod
    def scaled_uniform(cls, *shape: Any, dtype: Any = None, requires_grad: bool | None = None) -> Self:
        """U(-1, 1) / sqrt(numel)."""
        shape = shape_arg(shape)
        bound = prod(shape) ** -0.5
        return cls.uniform(*shape, low=-bound, high=bound, dtype=dtype, requires_grad=requires_grad)

    @classmethod
    def glorot_uniform(cls, *shape: Any, dtype: Any = None, requires_grad: bool | None = None) -> Self:
        """U(-b, b) with b = sqrt(6 / (shape[0] + prod(shape[1:]))) (Xavier/Glorot)."""
        shape = shape_arg(shape)
        bound = math.sqrt(6 / (shape[0] + prod(shape[1:])))
        return cls.uniform(*shape, low=-bound, high=bound, dtype=dtype, requires_grad=requires_grad)

    @classmethod
    def kaiming_uniform(
        cls, *shape: Any, a: float = 0.01, dtype: Any = None, requires_grad: bool | None = None
    ) -> Self:
        """U(-b, b) with b = sqrt(3) * gain / sqrt(fan_in), gain = sqrt(2 / (1 + a^2)), fan_in = prod(shape[1:])."""
        shape = shape_arg(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a * a)) / math.sqrt(prod(shape[1:]))
        return cls.uniform(*shape, low=-bound, high=bound, dtype=dtype, requires_grad=requires_grad)

    @classmethod
    def kaiming_normal(cls, *shape: Any, a: float = 0.01, dtype: Any = None, requires_grad: bool | None = None) -> Self:
        """N(0, std) with std = gain / sqrt(fan_in), gain = sqrt(2 / (1 + a^2))."""
        shape = shape_arg(shape)
        std = math.sqrt(2.0 / (1 + a * a)) / math.sqrt(prod(shape[1:]))
        return cls.normal(*shape, mean=0.0, std=std, dtype=dtype, requires_grad=requires_grad)

    # ---------------------------------------------------------------- dropout

    def dropout(self, p: float = 0.5) -> Self:
        """While Tensor.training: zero each element with probability p and scale the rest by 1/(1-p); else x."""
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        if not type(self).training or p == 0.0:
            return self
        if p == 1.0:
            return self * 0
        keep = self.rand(self.shape) >= p
        return keep.where(self * (1.0 / (1.0 - p)), 0).cast(self.dtype)

"""Losses for Tensor: one_hot, PyTorch's cross_entropy and tinygrad's sparse_categorical_crossentropy.

Both cross-entropies are one rule, mean/sum/none of -sum_c q_c log_softmax(x)_c, where q is the (smoothed) target
distribution; class-index targets pick log_softmax with a checked gather (a bad class id raises IndexError).
"""

from __future__ import annotations

from typing import Any, Self

from uopc.tensor.elementwise import opmath
from uopc.uop.dtype import dtypes


class LossMixin:
    """The losses of Tensor; every Tensor is a LossMixin (so isinstance tells a tensor target from data)."""

    # ---------------------------------------------------------------- losses

    def one_hot(self, num_classes: int = -1) -> Self:
        """int32 one-hot vectors in a new last dim of num_classes, as F.one_hot: rows of eye(C) picked by a checked
        gather, so a class outside 0..C-1 raises IndexError when the result is computed. num_classes=-1 takes
        max + 1, which realizes self to read it."""
        if not self.dtype.is_int:
            raise TypeError(f"one_hot needs an int tensor of class indices, got {self.dtype!r}")
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < -1:
            raise ValueError(f"one_hot: num_classes must be a non-negative int or -1, got {num_classes!r}")
        if num_classes == -1:
            if self.numel() == 0:
                raise ValueError("one_hot: cannot infer num_classes (-1) from an empty tensor")
            num_classes = int(self.max().item()) + 1
        n = self.numel()
        if n == 0 or num_classes == 0:
            if n:
                raise ValueError(f"one_hot: num_classes=0 cannot hold the classes of a tensor of shape {self.shape}")
            return self.full((*self.shape, num_classes), 0, dtype=dtypes.int32)
        idx = self.reshape(n, 1).expand(n, num_classes)
        rows = self.eye(num_classes, dtype=dtypes.int32)._gather(0, idx, "one_hot class")
        return rows.reshape(*self.shape, num_classes)

    @opmath
    def cross_entropy(
        self, target: Any, reduction: str = "mean", label_smoothing: float = 0.0, ignore_index: int = -100
    ) -> Self:
        """PyTorch's cross_entropy on logits with the class dim 1 (or 0 for a 1-D input).

        `target` is class indices (int, the input's shape without the class dim) or probabilities (float, same shape).
        """
        if self.ndim == 0:
            raise ValueError("cross_entropy needs logits with a class dim, got a 0-d tensor")
        cdim = 1 if self.ndim > 1 else 0
        target = target if isinstance(target, LossMixin) else type(self)(target)
        return self._cross_entropy(target, cdim, reduction, label_smoothing, ignore_index)

    @opmath
    def sparse_categorical_crossentropy(
        self, Y: Any, ignore_index: int = -1, label_smoothing: float = 0.0, reduction: str = "mean"
    ) -> Self:
        """tinygrad's loss: class dim last, Y int class indices; entries equal to ignore_index count for nothing."""
        if self.ndim == 0:
            raise ValueError("sparse_categorical_crossentropy needs logits with a class dim, got a 0-d tensor")
        Y = Y if isinstance(Y, LossMixin) else type(self)(Y)
        return self._cross_entropy(Y, self.ndim - 1, reduction, label_smoothing, ignore_index)

    def _cross_entropy(self, target: Self, cdim: int, reduction: str, smoothing: float, ignore: int) -> Self:
        """Mean/sum/none of -sum_c q_c log_softmax(x)_c over logits x = self, with the class dim `cdim`."""
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        if not 0.0 <= smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {smoothing}")
        x = self
        n_cls = x.shape[cdim]
        logp = x.log_softmax(cdim)
        if target.dtype.is_float:  # class probabilities
            if target.shape != x.shape:
                raise ValueError(
                    f"probability targets must have the input's shape: input {x.shape}, target {target.shape}"
                )
            q = target * (1 - smoothing) + smoothing / n_cls if smoothing else target
            loss = -(logp * q).sum(cdim)
            return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss
        if target.dtype.is_bool:
            raise TypeError(f"class-index targets must be an int tensor, got {target.dtype!r}")
        expected = x.shape[:cdim] + x.shape[cdim + 1 :]
        if target.shape != expected:
            raise ValueError(
                f"class-index targets must have the input's shape without the class dim {cdim}: "
                f"input {x.shape}, target {target.shape}, expected {expected}"
            )
        keep = target != ignore
        # pick each target's log-probability with a checked gather: a class id outside 0..C-1 raises IndexError
        # (ignored entries point at class 0 and are masked out below)
        picked = logp._gather(cdim, keep.where(target, 0).unsqueeze(cdim), "cross_entropy target")
        loss = -picked.squeeze(cdim)
        if smoothing:
            loss = loss * (1 - smoothing) - logp.mean(cdim) * smoothing
        loss = keep.where(loss, 0)
        if reduction == "none":
            return loss
        return loss.sum() if reduction == "sum" else loss.sum() / keep.sum()

"""The lazy Tensor, one concern per file, composed in tensor.py:

shape.py        pure argument rules (dims, broadcasting, movement-op checks)
creation.py     from data, constants, ranges, random samples
elementwise.py  broadcasting binary ops, comparisons, math built from the IR's ALU ops
reduce.py       reductions, the softmax family, matmul
movement.py     reshape/permute/expand/pad/shrink/flip, indexing, cat/stack/split/repeat
loss.py         one_hot and the cross-entropies
random.py       in-graph random numbers (Philox), training mode, dropout, initializers
scan.py         cumsum/cumprod/cummax, sort/argsort/topk, exact prod
math.py         inverse trig, hyperbolic, erf, activations, rounding, NaN/inf tests, shifts
extras.py       einsum, roll, diag, unfold, meshgrid, linspace, pad modes, item assignment, nll/bce losses
conv.py         convolutions (window views + one REDUCE)
pool.py         max/avg/adaptive pooling, max unpooling, interpolate
attention.py    tril/triu, masked_fill, scaled_dot_product_attention
norm.py         batchnorm, layernorm, linear, sequential (tinygrad's functional layers)
tensor.py       the Tensor class: construction, realize/numpy, assign/detach, casts, gradients
"""

from uopc.tensor.tensor import Tensor, no_grad

__all__ = ["Tensor", "no_grad"]

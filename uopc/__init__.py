"""uopc: a small ML compiler. Lazy tensors become hash-consed UOps, fused kernels, C, and gcc-compiled code.

    from uopc import Tensor, dtypes
    Tensor([[1.0, 2.0], [3.0, 4.0]]).softmax(-1).numpy()

Importing uopc loads only the Tensor front end; the compiler stages load on the first realize.
"""

from uopc.dtype import dtypes
from uopc.tensor import Tensor

__all__ = ["Tensor", "dtypes"]

"""uopc: a small ML compiler. Lazy tensors become hash-consed UOps, fused kernels, C, and gcc-compiled code.

    from uopc import Tensor, dtypes
    Tensor([[1.0, 2.0], [3.0, 4.0]]).softmax(-1).numpy()

Importing uopc loads only the Tensor front end; the compiler stages load on the first realize.
"""

from uopc.runtime.threads import get_num_threads, set_num_threads
from uopc.tensor import Tensor, no_grad
from uopc.uop.dtype import dtypes
from uopc.uop.variable import Variable


def __getattr__(name: str):
    """`uopc.TinyJit`, loaded on first use: it sits above realize, and `import uopc` must not load the compiler."""
    if name == "TinyJit":
        from uopc.engine.jit import TinyJit

        return TinyJit
    raise AttributeError(f"module 'uopc' has no attribute {name!r}")


__all__ = ["Tensor", "TinyJit", "Variable", "dtypes", "no_grad", "set_num_threads", "get_num_threads"]

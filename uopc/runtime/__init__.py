"""The runtime: compile C with the system compiler and load it (compiler.py: `Program`, flags, linked plans), the
per-kernel objects, batched and compiled early (objects.py), the on-disk cache's files (disk_cache.py), OpenMP
threads (threads.py), and the storage behind BUFFER UOps (buffer.py: aligned arrays with guard bytes, the reuse
pool).

    from uopc.runtime import Program      # the chapters' name: loaded from compiler.py on first use

The compiler module loads lazily: the Tensor front end imports storage from here, and `import uopc` must not load
the compiler.
"""

from typing import Any

__all__ = [
    "CacheDirError",
    "CompileError",
    "CompilerNotFoundError",
    "Program",
    "base_cflags",
    "cflags",
    "ensure_threads",
    "entry_ok",
    "evict",
    "get_num_threads",
    "machine",
    "set_num_threads",
    "stats",
]


def __getattr__(name: str) -> Any:
    """The compiler module's public names, loaded on first use."""
    if name in __all__:
        from uopc.runtime import compiler

        return getattr(compiler, name)
    raise AttributeError(f"module 'uopc.runtime' has no attribute {name!r}")

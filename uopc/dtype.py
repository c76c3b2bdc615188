"""The chapters' name for the dtypes (`from uopc.dtype import dtypes`), kept as a thin re-export: the module is
uopc.uop.dtype."""

from uopc.uop.dtype import DType, dtypes

__all__ = ["DType", "dtypes"]

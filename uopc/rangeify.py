"""The chapters' name for lowering (`from uopc.rangeify import lower, Ctx, Opts`), kept as a thin re-export: the
module is uopc.codegen.rangeify."""

from uopc.codegen.rangeify import AxisType, Ctx, Opts, lower, lower_scatter, lower_setitem, rangeify

__all__ = ["AxisType", "Ctx", "Opts", "lower", "lower_scatter", "lower_setitem", "rangeify"]

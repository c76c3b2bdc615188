"""The chapters' name for the C renderer (`from uopc.render_c import render_c`), kept as a thin re-export: the
module is uopc.renderer.c."""

from uopc.renderer.c import render_c
from uopc.renderer.plan import render_plan

__all__ = ["render_c", "render_plan"]

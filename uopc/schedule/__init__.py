"""The scheduler (Chapter 7): cut a shape graph into kernels at materialization points (cut.py), handing on the
plan's records and placing its temps (plan.py). Lowering is the engine's (uopc.engine.lower).

    sched, inputs = schedule(roots, fuse_reduce, opt)     # unlowered ScheduleItems, then uopc.kernelize.make_plan
"""

from uopc.schedule.cut import (
    checks_of,
    kernel_name,
    kernel_op,
    moved_bytes,
    schedule,
    stage_broadcast_compute,
    strip_detach,
)
from uopc.schedule.plan import Arena, Copy, Kernel, Out, Plan, Ref, RefKind, Schedule, ScheduleItem, Temp, plan_memory

__all__ = [
    "Arena",
    "Copy",
    "Kernel",
    "Out",
    "Plan",
    "Ref",
    "RefKind",
    "Schedule",
    "ScheduleItem",
    "Temp",
    "checks_of",
    "kernel_name",
    "kernel_op",
    "moved_bytes",
    "plan_memory",
    "schedule",
    "stage_broadcast_compute",
    "strip_detach",
]

"""The chapters' name for the kernelizer, kept as an alias: the work now lives in two stages.

`uopc.schedule` cuts the graph into kernels (`Plan`, `Kernel`, `stage_broadcast_compute`), the engine lowers them
(`make_plan`: schedule, then lower); `uopc.engine.realize` caches compiled plans by structure and runs them (`realize`,
`_plans`).
Storage moved to `uopc.runtime.buffer`; `base_buffer` lives with the IR in `uopc.uop`.
"""

from uopc.engine.lower import make_plan
from uopc.engine.realize import _plans, default_opt, realize
from uopc.runtime.buffer import buffer_data, is_contiguous_buffer, new_buffer
from uopc.schedule import Kernel, Plan, stage_broadcast_compute
from uopc.uop import base_buffer

__all__ = [
    "Kernel",
    "Plan",
    "_plans",
    "base_buffer",
    "buffer_data",
    "default_opt",
    "is_contiguous_buffer",
    "make_plan",
    "new_buffer",
    "realize",
    "stage_broadcast_compute",
]

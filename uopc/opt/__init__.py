"""The CPU optimizer: a layout pass on the shape graph, then Opts per kernel (hand heuristic or search).

    A @ B  (B read down its columns)   --layout_pass-->   STAGE(B.T) -> a contiguous copy, then
    r_N_N with Opts(upcast={0: 4, 1: 4}, thread=0): a 4x4 register tile, rows split among OpenMP threads

OPT=0 runs nothing here; OPT=1 (default) is HandOpt(machine); OPT=2 is SearchOpt(machine, timer), which times candidates
once per kernel and remembers the winner on disk (so a second run does no timing). Every choice is made for the
`uopc.machine.Machine` the optimizer was built with, never for the CPU the code happens to run on.

    gemm.py       packed operands, the register-blocked microkernel, split-K
    layout.py     the layout pass (push_views, strides through rangeify)
    heuristic.py  hand_opt_choice, HandOpt
    search.py     candidate_opts, search_opt, SearchOpt
"""

from uopc.opt.heuristic import THREAD_MIN_WORK, UNROLL_MAX_REDUCE, HandOpt, hand_opt_choice
from uopc.opt.layout import layout_pass, push_views
from uopc.opt.opts import Opts
from uopc.opt.search import SearchOpt, Timer, candidate_opts, search_key, search_opt, search_stats

__all__ = [
    "THREAD_MIN_WORK",
    "UNROLL_MAX_REDUCE",
    "HandOpt",
    "Opts",
    "SearchOpt",
    "Timer",
    "candidate_opts",
    "hand_opt_choice",
    "layout_pass",
    "push_views",
    "search_key",
    "search_opt",
    "search_stats",
]

"""The engine: drives the stages for one realize (schedule, optimize, lower, render, compile, run) and replays.

    lower.py   make_plan: the schedule's kernels lowered into a Plan (Opts from the optimizer, ASTs from codegen)
    tune.py    KernelTimer: how the autotuner times candidate Opts (the optimizer imports no renderer or runtime)

Nothing is imported here: `import uopc` must not load the compiler.
"""

"""The engine: drives the stages for one realize and replays captured steps.

    realize.py     the plan cache (structure key -> compiled plan), compile, run, error records, DEBUG printing
    lower.py       make_plan: the schedule's kernels lowered into a Plan (Opts from the optimizer, ASTs from codegen)
    tune.py        KernelTimer: how the autotuner times candidate Opts (the optimizer imports no renderer or runtime)
    plan_store.py  plans persisted across processes, keyed on structure, settings, Machine, compiler and uopc
    jit.py         TinyJit: capture a function's plans, replay them with new inputs and in-place state

Nothing is imported here: `import uopc` must not load the compiler.
"""

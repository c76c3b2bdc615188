"""The renderer: a lowered kernel -> readable C. c.py (`render_c`, the op table), plan.py (`render_plan`: a plan's
units and entry point), c_math.py (uopc's own exp2/log2/sin), half.py (float16 and bfloat16 as storage: every op
on them rewritten to float32 first).

    src = render_c(ast, "k")      # uopc.renderer.c; the chapters import it from uopc.render_c
"""

"""Lowering (Chapter 6 as the chapters use it): one kernel body -> loops over RANGEs (rangeify.py), SIMD vectors
(vectorize.py), nodes placed and ordered in their scopes (linearize.py); the error record a kernel's index checks
write (error_record.py).

    ast = lower(body, out, Ctx(opts=opts))      # uopc.codegen.rangeify; the engine calls it (uopc.engine.lower)
"""

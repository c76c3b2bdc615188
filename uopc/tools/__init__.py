"""Tools beside the pipeline: the `uopc` command line (cli), the benchmark harness and suite, the profiler and its
roofline picture, and the cache commands. Nothing in the compiler imports them."""

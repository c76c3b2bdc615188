"""Tools beside the pipeline: the `uopc` command line (cli), the benchmark harness and suite, the profiler and its
roofline picture, the cache commands, and `uopc onnx` (onnx_cli). Nothing in the compiler imports them."""

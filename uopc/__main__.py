"""`python -m uopc`: the same as the `uopc` command (bench, profile, cache, machine, onnx); see uopc.tools.cli."""

import sys

from uopc.tools.cli import main

sys.exit(main())

"""Test-session setup: make the repository importable and keep compiled kernels out of the user's cache.

UOPC_CACHE is set (unless the caller already set it) at import time, before any test imports uopc, to a temporary
directory created for this session and removed when the session ends.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

if not os.environ.get("UOPC_CACHE"):
    _session_cache = tempfile.mkdtemp(prefix="uopc-test-cache-")
    os.environ.pop("UOPC_CACHE", None)  # an empty value would mean the default, ~/.cache/uopc
    os.environ.setdefault("UOPC_CACHE", _session_cache)
    atexit.register(shutil.rmtree, _session_cache, True)

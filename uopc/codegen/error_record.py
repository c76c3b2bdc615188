"""The error record: the int64 words the first failing index check of a run fills, for the runtime to raise.

    uopc_check(err, 9, 1, 0, 4, 2)      (index 9, one element, valid 0..3, check number 2: render_c's one check)
      ->  0, and err = {1, 9, 0, 4, 2, 0}  ->  IndexError("uopc: <label of check 2>: index 9 is out of range ...")

A kernel's data-dependent checks (GATHER, SCATTER) share one record, a BUFFER parameter that lowering makes
(uopc.codegen.rangeify); UOPC_CHECK_OOB's bounds checks fill one per plan call (or the standalone kernel's global
uopc_oob).
The renderer writes the fields by these offsets, the engine and the runtime read them by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Any

__all__ = ["ERROR_RECORD", "ErrorField", "check_error", "error_slot", "oob_error"]


class ErrorField(IntEnum):
    """The offset of each word of an error record."""

    FAILED = 0  # set by the first failing check: later ones leave the record as it is
    INDEX = 1  # the offending index
    LOW = 2  # the lowest valid index: 0, or -size where negative indices count from the end
    SIZE = 3  # the size of the indexed dimension (of the whole buffer, for a bounds check)
    WHICH = 4  # the check's number in its kernel (uopc.schedule.checks_of), or a bounds check's buffer slot
    KERNEL = 5  # the kernel's number in its plan (a bounds check: one record serves the whole plan)


ERROR_RECORD = len(ErrorField)  # words


def error_slot(out: Any) -> int:
    """The parameter slot of a kernel's error record (a BUFFER that lowering makes): right after its output `out`."""
    return out.arg.slot + 1


def check_error(rec: Any, kernel: str, labels: Sequence[str]) -> IndexError:
    """The error of a filled record of kernel `kernel`'s data-dependent checks, named by `labels` (by check number)."""
    value, lo, size = int(rec[ErrorField.INDEX]), int(rec[ErrorField.LOW]), int(rec[ErrorField.SIZE])
    return IndexError(
        f"uopc: {labels[int(rec[ErrorField.WHICH])]}: index {value} is out of range for a dimension of size {size} "
        f"(valid indices {lo}..{size - 1}, in kernel {kernel})"
    )


def oob_error(rec: Any, kernel: str) -> IndexError:
    """The error of a filled record of UOPC_CHECK_OOB's bounds checks, which failed in kernel `kernel`."""
    slot, idx, size = rec[ErrorField.WHICH], rec[ErrorField.INDEX], rec[ErrorField.SIZE]
    return IndexError(
        f"uopc: out-of-bounds access in kernel {kernel}: data{slot}[{idx}], "
        f"but data{slot} has {size} elements (valid indices 0..{size - 1})"
    )

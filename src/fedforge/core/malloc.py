"""Keep freed memory inside the process (Linux, glibc) for CPU runs.

The engines update parameters out of place, so every local step allocates fresh
model-sized tensors. glibc hands large freed blocks back to the kernel and page-faults them
in again on the next step (≈ 2 ms of a 12 ms W1 step on the CPU). Raising the trim and
mmap thresholds keeps those pages: W1 on 2 cores gains 8-12 % for every engine and for a
plain PyTorch loop alike (benchmarks/history/2026-11.md). Memory is then not returned to the OS
until the process exits, which suits an experiment process. The ``fedforge`` command calls
:func:`keep_freed_memory` at start-up; ``FEDFORGE_MALLOC_TUNING=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt parameters from glibc's <malloc.h>
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's ceiling on 64-bit (larger values are refused)


def keep_freed_memory() -> bool:
    """Tune glibc malloc to keep freed blocks; False where it does not apply (not Linux,
    not glibc, or ``FEDFORGE_MALLOC_TUNING=0``)."""
    if not sys.platform.startswith("linux") or os.environ.get("FEDFORGE_MALLOC_TUNING") == "0":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl or another libc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
    ok &= mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    ok &= mallopt(M_TOP_PAD, 256 * 2**20)
    return bool(ok)

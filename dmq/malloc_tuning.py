"""glibc's malloc told to keep freed memory in the broker process.

By default glibc returns freed memory to the kernel eagerly: the top of a heap is trimmed
once 128 KiB of it is free (more once the dynamic threshold has grown), and allocations
of 128 KiB or more get their own mmap, unmapped again at free. A broker allocates and
frees buffers of that size all the time (request bodies, record batches, Raft frames and
journal writes of 16 KiB-1 MiB), so each new buffer was fresh memory: a page fault per
4 KiB and a zeroed page, on a VM a fault in the host too. `perf` of a 3-node cluster's
follower put 4-5 % of its samples in page faults (`exc_page_fault`, `do_anonymous_page`,
`clear_page_erms`); bench/README.md, "Freed memory kept in the process", has the figures.

`keep_freed_memory` raises the trim threshold to TRIM_THRESHOLD_BYTES, pads each heap
growth by TOP_PAD_BYTES and serves allocations up to MMAP_THRESHOLD_BYTES (glibc's
maximum on 64-bit) from the heaps, so freed buffers are reused by the next ones. The cost
is memory: a heap keeps up to TRIM_THRESHOLD_BYTES free at its top, so the broker's
resident size follows its peak use rather than its current use (each thread's arena
trims on its own).

An operator's own `MALLOC_*_` tunables (glibc's environment variables) win: if any is
set, nothing is changed. Elsewhere than glibc (musl, macOS) nothing is changed either.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

from log.limits import MiB

# mallopt(3) parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

TRIM_THRESHOLD_BYTES = 128 * MiB
TOP_PAD_BYTES = 16 * MiB
MMAP_THRESHOLD_BYTES = 32 * MiB  # glibc refuses more on 64-bit (HEAP_MAX_SIZE / 2)

_OPERATOR_TUNABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")


def keep_freed_memory(environ: Mapping[str, str] = os.environ) -> bool:
    """Tune glibc's malloc as the module docstring says; True if it was tuned."""
    if any(name in environ for name in _OPERATOR_TUNABLES):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    settings = (
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        (M_TOP_PAD, TOP_PAD_BYTES),
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
    )
    return all(mallopt(param, value) == 1 for param, value in settings)

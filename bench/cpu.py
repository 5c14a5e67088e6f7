"""CPU seconds another process has used, to the nanosecond: what every benchmark prices.

`/proc/<pid>/stat` counts utime and stime in clock ticks (10 ms here): a short run of a
quick benchmark used fewer ticks than its idle time subtracted, and read 0.0 (a quick
benchmark's test then failed on a figure that was not positive). The kernel keeps each
process's CPU time in nanoseconds too, behind a CPU-time clock any process may read
(`clock_getcpuclockid(3)`, then `clock_gettime`); it counts every thread, ended ones too.
Where that clock cannot be had (not Linux, no libc through ctypes), the ticks are read.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _cpu_clock_of() -> Callable[[int, Any], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None).clock_getcpuclockid
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    function.restype = ctypes.c_int
    return function


_CPU_CLOCK_OF = _cpu_clock_of()


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads) so far."""
    if _CPU_CLOCK_OF is not None:
        clock = ctypes.c_int()
        if _CPU_CLOCK_OF(pid, ctypes.byref(clock)) == 0:
            try:
                return time.clock_gettime(clock.value)
            except OSError:
                pass  # the process ended between the two calls: /proc says so below
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

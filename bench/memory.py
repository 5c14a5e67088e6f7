"""The machine's memory state, printed beside every throughput figure a benchmark records.

On this project's VM a page of memory the host has taken back costs ~2.4 ms of CPU per MiB
at its first write, against 0.17 ms for a page just freed (bench/README.md, "The ceiling of
one write per replica, and what a fresh page costs on this VM"): the same code measures up
to a third slower with much memory free than with the page cache full. A figure is read
with the state it was measured in.
"""

from __future__ import annotations

from pathlib import Path


def memory_state() -> str:
    """ "MemFree N MB, free page reporting ...": the state a figure was measured in."""
    meminfo = Path("/proc/meminfo")
    free_mb = -1
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemFree:"):
                free_mb = int(line.split()[1]) // 1024
    params = Path("/sys/module/page_reporting/parameters")
    reporting = "no free page reporting"
    if params.is_dir():
        values = [f"{name} {(params / name).read_text().strip()}"
                  for name in ("min_free_ms", "page_reporting_order") if (params / name).exists()]  # fmt: skip
        reporting = "free page reporting " + ", ".join(values)
    return f"MemFree {free_mb} MB, {reporting}"

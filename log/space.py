"""Free space of a data directory: the floor below which appends are refused.

A full disk is the most common way a Kafka broker goes down (it halts on a log-directory
failure). dmq follows Redpanda instead (`storage_min_free_bytes`, space alerts): below a
free-space *floor* the broker refuses produce before anything is written, and keeps
serving everything else. The floor is also the reserve the writes that free space or keep
the cluster running may still use (the metadata group's journal, a topic deletion, a
retention change, Raft votes and terms): produce may not.

Levels, for `free` bytes available to the broker (statvfs f_bavail, what a non-root
process may still write)::

    full   free < floor                    produce refused (507 insufficient_storage)
    alert  floor <= free < alert level     produce accepted; /readyz and status say so
    ok     free >= alert level

The arithmetic is pure (`default_floor_bytes`, `level_for`, `admits`); `SpaceGuard` adds
the one system call, statvfs, bounded to one probe per PROBE_INTERVAL_S: between probes
it subtracts the bytes it admitted since the last one, so a burst of produces cannot
overshoot the floor by more than what was already in flight when the probe ran.

No network, no clock but the monotonic one for the probe interval. Not locked: the event
loop admits appends, and a Raft tick thread asks for the level (a follower's write gate);
a race between them can only refresh the probe early or count one admission against a
stale probe, never admit past a fresh one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from log.limits import GiB

StorageLevel = Literal["ok", "alert", "full"]

# Default floor: the smaller of FLOOR_BYTES_CAP and FLOOR_FRACTION of the filesystem, so
# that it also works unchanged on a small disk (1 GiB of a 32 MiB tmpfs would refuse all).
FLOOR_BYTES_CAP = 1 * GiB
FLOOR_FRACTION = 0.05
# Default alert level: this many times the floor (an operator sees it coming).
ALERT_FLOOR_MULTIPLE = 2
# An append is charged this many times its size: the batch lands in the Raft journal and
# again in the partition's segment before the journal is compacted.
WRITE_AMPLIFICATION = 2
# statvfs at most this often; admitted bytes are subtracted in between.
PROBE_INTERVAL_S = 0.05


def default_floor_bytes(total_bytes: int) -> int:
    """The smaller of 1 GiB and 5% of the filesystem (total_bytes >= 0)."""
    return min(FLOOR_BYTES_CAP, int(total_bytes * FLOOR_FRACTION))


def level_for(free_bytes: int, floor_bytes: int, alert_bytes: int) -> StorageLevel:
    """ok, alert or full for `free_bytes` (alert_bytes >= floor_bytes)."""
    if free_bytes < floor_bytes:
        return "full"
    if free_bytes < alert_bytes:
        return "alert"
    return "ok"


def admits(free_bytes: int, floor_bytes: int, size_bytes: int) -> bool:
    """Whether an append of size_bytes keeps the free space at or above the floor.
    A floor of 0 is no floor at all: every append is tried (and a full disk answered by
    the ENOSPC path: raft/README.md, "A full disk")."""
    return floor_bytes == 0 or free_bytes - WRITE_AMPLIFICATION * size_bytes >= floor_bytes


@dataclass(frozen=True, slots=True)
class SpaceReport:
    """One look at a data directory's filesystem."""

    free_bytes: int
    total_bytes: int
    floor_bytes: int
    alert_bytes: int
    level: StorageLevel


class StorageFull(Exception):
    """An append would take the free space below the floor (nothing was written).

    Raised by SpaceGuard.check_append; the partition room turns it into the broker's
    InsufficientStorage (HTTP 507), naming free_bytes and floor_bytes.
    """

    def __init__(self, path: str, free_bytes: int, floor_bytes: int, size_bytes: int) -> None:
        super().__init__(
            f"{path} has {free_bytes} bytes free, below the floor of {floor_bytes} bytes "
            f"(storage_min_free_bytes) for an append of {size_bytes} bytes: produce is "
            "refused until retention, deleted records or topics, or a bigger disk free space"
        )
        self.path = path
        self.free_bytes = free_bytes
        self.floor_bytes = floor_bytes
        self.size_bytes = size_bytes


def probe(path: Path) -> tuple[int, int]:
    """(free bytes a non-root writer may use, filesystem size) of the filesystem at path."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


class SpaceGuard:
    """The floor of one data directory, checked before every append (module docstring).

    floor_bytes / alert_bytes None: the defaults, computed from the filesystem's size.
    """

    def __init__(
        self,
        path: Path,
        *,
        floor_bytes: int | None = None,
        alert_bytes: int | None = None,
        probe_fn: Callable[[Path], tuple[int, int]] = probe,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        if floor_bytes is not None and floor_bytes < 0:
            raise ValueError(f"storage floor must be >= 0 bytes, got {floor_bytes}")
        if alert_bytes is not None and floor_bytes is not None and alert_bytes < floor_bytes:
            raise ValueError(f"storage alert level {alert_bytes} is below the floor {floor_bytes}")
        self.path = path
        self._floor_config = floor_bytes
        self._alert_config = alert_bytes
        self._probe = probe_fn
        self._clock_s = clock_s
        self._probed_at = -1e18
        self._free_bytes = 0
        self._total_bytes = 0
        self._admitted_bytes = 0  # admitted since the last probe
        self.refused_appends = 0  # a metric: appends refused below the floor
        self.refused_bytes = 0

    def _floors(self, total_bytes: int) -> tuple[int, int]:
        floor = (
            default_floor_bytes(total_bytes) if self._floor_config is None else self._floor_config
        )
        alert = ALERT_FLOOR_MULTIPLE * floor if self._alert_config is None else self._alert_config
        return floor, max(alert, floor)

    def report(self, *, fresh: bool = False) -> SpaceReport:
        """The free space now (probed at most every PROBE_INTERVAL_S unless fresh)."""
        now = self._clock_s()
        if fresh or now - self._probed_at >= PROBE_INTERVAL_S:
            self._free_bytes, self._total_bytes = self._probe(self.path)
            self._probed_at = now
            self._admitted_bytes = 0
        free = max(0, self._free_bytes - WRITE_AMPLIFICATION * self._admitted_bytes)
        floor, alert = self._floors(self._total_bytes)
        return SpaceReport(free, self._total_bytes, floor, alert, level_for(free, floor, alert))

    def check_append(self, size_bytes: int) -> None:
        """Admit an append of size_bytes, or raise StorageFull (and count the refusal)."""
        report = self.report()
        if not admits(report.free_bytes, report.floor_bytes, size_bytes):
            self.refused_appends += 1
            self.refused_bytes += size_bytes
            raise StorageFull(str(self.path), report.free_bytes, report.floor_bytes, size_bytes)
        self._admitted_bytes += size_bytes

"""Cheap run-time figures the tick thread keeps for a metrics exporter to read.

raft/ imports no metrics library (raft/README.md, "Imports"): a `LatencyBuckets` is a fixed
array of counts that the tick thread bumps with two clock reads and one bisect per
observation, and that any thread may copy. dmq/broker/metrics.py turns it into a
Prometheus histogram at scrape time.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

# fdatasync of a journal: ~50 us on a RAM-backed or battery-cached disk, ~1-10 ms on an
# SSD, tens of ms on a busy or networked disk; a second or more is a failing disk.
SYNC_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class BucketsSnapshot:
    """A copy: `counts[i]` observations <= bounds[i] (not cumulative); the last one is
    over every bound (+Inf). `count` is their sum, so the two always agree."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum_s: float

    @property
    def count(self) -> int:
        return sum(self.counts)


class LatencyBuckets:
    """A histogram's buckets, written by one thread (the tick thread), read by any."""

    def __init__(self, bounds: tuple[float, ...] = SYNC_BUCKETS_S) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("bucket bounds must be distinct and increasing")
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self._sum_s += seconds

    def snapshot(self) -> BucketsSnapshot:
        # tuple() of a list is one C call: another thread's += lands before or after it.
        return BucketsSnapshot(self.bounds, tuple(self._counts), self._sum_s)

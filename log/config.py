"""Configuration of one partition log: segments, indexes, retention, flush policy.

Every field is a tunable limit with its default and the cost it bounds; the broker
maps topic settings (`segment_bytes`, `retention_ms`, ...) onto these names.
`LogConfig.__post_init__` checks the relations between them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from log import limits

DAY_MS = 24 * 60 * 60 * 1000


class CleanupPolicy(enum.StrEnum):
    DELETE = "delete"  # retention by age and size deletes whole closed segments
    COMPACT = "compact"  # keep the last record per key; retention by age/size is off
    COMPACT_DELETE = "compact,delete"  # both


@dataclass(frozen=True, slots=True)
class FlushPolicy:
    """When appended data is fsynced (fdatasync) to stable storage.

    A flush happens after an append once `interval_records` records are unflushed,
    or once `interval_ms` has passed since the last flush (checked at each append and
    by `PartitionLog.maybe_flush`). `interval_records=1` flushes every append; None
    disables that trigger. With both None, data is flushed only on segment roll and
    close, and relies on the page cache (and, in a cluster, on replication).
    """

    interval_records: int | None = 1
    interval_ms: int | None = None

    def __post_init__(self) -> None:
        if self.interval_records is not None and self.interval_records < 1:
            raise ValueError("flush interval_records must be >= 1 or None")
        if self.interval_ms is not None and self.interval_ms < 0:
            raise ValueError("flush interval_ms must be >= 0 or None")


@dataclass(frozen=True, slots=True)
class LogConfig:
    # Roll to a new segment when the active one would pass this size. Bigger segments
    # mean fewer files and coarser retention; positions in the index are u32.
    segment_bytes: int = 256 * limits.MiB
    # Roll when the incoming batch's max timestamp is this much newer than the active
    # segment's first batch, so time retention can delete old data of a quiet topic.
    segment_ms: int = 7 * DAY_MS
    # One offset-index entry per this many bytes of batches: the most a lookup scans.
    index_interval_bytes: int = 4 * limits.KiB
    # Roll when the active segment's offset index has this many entries (16 B each in
    # memory): bounds index memory per segment.
    index_entries_max: int = 65_536
    # Delete closed segments whose newest record is older than this (None: never).
    retention_ms: int | None = 7 * DAY_MS
    # Delete the oldest closed segments while the log is larger than this (None: no cap).
    retention_bytes: int | None = None
    cleanup_policy: CleanupPolicy = CleanupPolicy.DELETE
    # Tiered storage (dmq/tiered/README.md): the broker uploads closed segments to an
    # object store; then only this much stays on local disk (None: no local limit but the
    # total retention above). The log itself never deletes by these: its owner does, for
    # segments the partition's Raft group recorded as uploaded (delete_oldest_segments).
    remote_storage_enable: bool = False
    local_retention_ms: int | None = None
    local_retention_bytes: int | None = None
    # Compaction keeps a tombstone (null value) this long after its timestamp, so
    # consumers that are behind still see the delete.
    delete_retention_ms: int = DAY_MS
    # Largest batch append accepts (the edge enforces the per-record limits).
    batch_bytes_max: int = limits.BATCH_BYTES_MAX
    flush: FlushPolicy = field(default_factory=FlushPolicy)

    def __post_init__(self) -> None:
        if not 1 <= self.segment_bytes <= limits.SEGMENT_BYTES_CEILING:
            raise ValueError(
                f"segment_bytes must be in [1, {limits.SEGMENT_BYTES_CEILING}], "
                f"got {self.segment_bytes}"
            )
        if self.batch_bytes_max > limits.SEGMENT_BYTES_CEILING - self.segment_bytes + 1:
            # A batch is only rolled past when the segment is non-empty, so one
            # segment can reach segment_bytes - 1 + batch_bytes_max bytes.
            raise ValueError("segment_bytes + batch_bytes_max must fit u32 index positions")
        if self.segment_ms < 1 or self.index_interval_bytes < 1 or self.index_entries_max < 2:
            raise ValueError("segment_ms, index_interval_bytes >= 1, index_entries_max >= 2")
        if self.retention_ms is not None and self.retention_ms < 0:
            raise ValueError("retention_ms must be >= 0 or None")
        if self.retention_bytes is not None and self.retention_bytes < 0:
            raise ValueError("retention_bytes must be >= 0 or None")
        for name in ("local_retention_ms", "local_retention_bytes"):
            local = getattr(self, name)
            if local is not None and local < 0:
                raise ValueError(f"{name} must be >= 0 or None")
        if self.delete_retention_ms < 0:
            raise ValueError("delete_retention_ms must be >= 0")
        if not 1 <= self.batch_bytes_max <= limits.BATCH_BYTES_MAX:
            raise ValueError(f"batch_bytes_max must be in [1, {limits.BATCH_BYTES_MAX}]")

    @property
    def deletes(self) -> bool:
        return self.cleanup_policy in (CleanupPolicy.DELETE, CleanupPolicy.COMPACT_DELETE)

    @property
    def compacts(self) -> bool:
        return self.cleanup_policy in (CleanupPolicy.COMPACT, CleanupPolicy.COMPACT_DELETE)

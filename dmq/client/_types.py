"""The client's value types: what `send`, `poll` and the admin calls return.

All are frozen, slotted dataclasses, except `TopicPartition`, a NamedTuple so that a plain
`("orders", 0)` and `TopicPartition("orders", 0)` are interchangeable (equal, same hash).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class TopicPartition(NamedTuple):
    """One partition of one topic."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a produced record landed. `offset` is None when sent with acks=0."""

    topic: str
    partition: int
    offset: int | None


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    """One fetched record. `key=None` (no key) and `value=None` (a tombstone) differ from b""."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition of a topic description; offsets as of the moment it was described,
    by the answering broker's replica (None when that broker holds no replica of it)."""

    partition: int
    leader: str | None
    replicas: tuple[str, ...]
    log_start_offset: int | None
    high_watermark: int | None  # first offset not yet committed: consumers read below it
    log_end_offset: int | None  # next offset to assign
    status: str = "active"  # decommissioned: takes no new records; gone: removed
    # Tiered storage: uploaded up to (None: nothing or off); local and remote bytes.
    remote_end_offset: int | None = None
    local_bytes: int | None = None
    remote_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    partitions: tuple[PartitionInfo, ...]
    replication_factor: int
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def partition_count(self) -> int:
        return len(self.partitions)


@dataclass(frozen=True, slots=True)
class TopicSummary:
    """One entry of `list_topics`."""

    name: str
    partitions: int
    replication_factor: int


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """Answer of the offsets endpoint. `offset` is the first record at or after the asked
    timestamp; None when no timestamp was asked, or no record is that recent."""

    topic: str
    partition: int
    log_start_offset: int
    high_watermark: int
    offset: int | None = None
    # The first offset of the oldest open transaction (else the high watermark): where
    # read_committed readers stop. None from brokers without transactions.
    last_stable_offset: int | None = None


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: str
    http_addr: str


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """`GET /v1/cluster`: the cluster, its brokers, and the node that answered."""

    cluster_id: str
    node_id: str
    brokers: tuple[BrokerInfo, ...]

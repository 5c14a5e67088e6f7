"""The broker's value types: what the services take and answer, and what http_api reads.

Frozen, slotted dataclasses (STYLE.md 14), with no behaviour: every service and the HTTP
layer may import this module, and it imports no service (dmq/README.md, "dmq/broker/").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from dmq.metadata.machine import PARTITION_ACTIVE, TopicInfo
from log.partition_log import ReadResult
from log.records import Header, Record

Acks = Literal["0", "1", "all"]
# What a read promises (dmq/README.md, "Read consistency"): "linearizable" confirms the
# leadership after the read arrived (raft/read_index.py); "leader" answers from the
# partition leader's state at once, and may be stale if it was deposed without knowing.
Consistency = Literal["linearizable", "leader"]
CONSISTENCIES: tuple[Consistency, ...] = ("linearizable", "leader")


class ForwardRequest(Exception):  # noqa: N818 - a control signal, not an error
    """Not a DmqError: tells the HTTP layer to relay this request to `http_addr`.

    `hops` is the forwarded header's value on the relayed request (consumer-group requests
    may take two: observer -> voter -> metadata leader; everything else takes one).
    `node_id`, when given, is the broker at `http_addr`: the relay is given up once that
    broker goes out of reach (`BrokerContext.out_of_reach`)."""

    def __init__(self, http_addr: str, hops: int = 1, node_id: str | None = None) -> None:
        super().__init__(http_addr)
        self.http_addr = http_addr
        self.hops = hops
        self.node_id = node_id


@dataclass(frozen=True, slots=True)
class ProducerSequence:
    """An idempotent producer's fields for one batch (dmq/partition/producers.py checks them)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int


@dataclass(frozen=True, slots=True)
class ProduceRecord:
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    partition: int | None = None
    timestamp_ms: int | None = None
    deliver_at_ms: int | None = None  # delayed (dmq/broker/delay.py): appended at this time
    delay_ms: int | None = None  # or this long after the broker receives it


@dataclass(frozen=True, slots=True)
class OffsetRun:
    """`count` consecutive records of a produce request, in request order, that went to
    `partition` at offsets base_offset, base_offset + 1, ... (None for acks=0 and 1).

    A produce answers one entry per record; runs keep that answer compact (a
    1000-record batch is one run) until the HTTP layer writes it out.
    """

    partition: int
    base_offset: int | None
    count: int


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """Offsets are this broker's replica's; None when no replica is placed here."""

    partition: int
    leader: str | None
    replicas: tuple[str, ...]
    log_start_offset: int | None
    high_watermark: int | None
    log_end_offset: int | None
    status: str = PARTITION_ACTIVE  # or decommissioned (no new records), gone
    # Tiered storage (tiered.py), this broker's replica: uploaded up to (None: nothing
    # uploaded), bytes of its local segments, bytes in the object store.
    remote_end_offset: int | None = None
    local_bytes: int | None = None
    remote_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    replication_factor: int
    partitions: tuple[PartitionInfo, ...]
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicSummary:
    name: str
    partitions: int
    replication_factor: int


@dataclass(frozen=True, slots=True)
class TopicView:
    """A catalogue topic as the produce path reads it (built once per metadata version)."""

    name: str
    topic_id: int
    partitions: int
    replication_factor: int
    config: dict[str, Any]
    info: TopicInfo
    # Partitions taking new records (not decommissioned or gone), ascending: keyed and
    # sticky choices map onto these (raft/README.md, "Decommission a partition").
    active: tuple[int, ...] = ()


@dataclass(slots=True)
class FetchResult:
    """Records from `offset`: decoded (`records`) or raw batches (`raw`, to be closed)."""

    topic: str
    partition: int
    offset: int
    next_offset: int
    high_watermark: int
    log_start_offset: int
    records: list[Record] = field(default_factory=list)
    raw: ReadResult | None = None
    # dmq/broker/transactions.py: the partition's LSO, and for a raw read_committed read
    # the aborted transactions (producer_id, first_offset, marker_offset) it overlaps.
    last_stable_offset: int | None = None
    aborted: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetsResult:
    partition: int
    log_start_offset: int
    high_watermark: int
    offset: int | None
    last_stable_offset: int | None = None  # transactions.py: read_committed's end

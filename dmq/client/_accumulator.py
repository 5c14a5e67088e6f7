"""The producer's batching: which partition a record goes to, and which batch it joins.

Pure bookkeeping, no I/O and no clock (time comes in as `now_s`), so it is tested alone.
Each record waits in the open batch of its partition; a batch closes when one more record
would take it past `batch_bytes`, when it is `linger_ms` old, or when the producer flushes.
Closed batches of one partition are sent one at a time, in the order they closed, which
keeps a partition's records in `send` order even across retries.

Partition choice, as the broker's (dmq/partitioner.py):

1. an explicit `partition` is used as given;
2. a keyed record goes to `partition_for_key(key, partition_count)`, as Kafka's default
   partitioner; once partitions are decommissioned, to `active[partition_for_key(key,
   len(active))]` over the partitions still taking records (raft/README.md);
3. an unkeyed record goes to its topic's sticky partition, which moves round-robin each
   time a batch that took sticky records closes, so unkeyed records fill whole batches.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from dmq.client._types import TopicPartition
from dmq.partitioner import StickyPartitioner, partition_for_key
from log.records import HEADER_BYTES, Record

W = TypeVar("W")  # what waits for a record's outcome: an asyncio.Future in the producer

# Upper bound of a record's framing in a batch: length, attributes, timestamp delta,
# offset delta, key length, value length and header count varints (log/records.py).
_RECORD_FRAMING_BYTES = 5 + 1 + 10 + 5 + 5 + 5 + 5
_HEADER_FRAMING_BYTES = 5 + 5


def record_size_bytes(record: Record) -> int:
    """An upper bound of the bytes `record` adds to an uncompressed batch."""
    size = _RECORD_FRAMING_BYTES + len(record.key or b"") + len(record.value or b"")
    for h in record.headers:
        size += _HEADER_FRAMING_BYTES + len(h.key.encode("utf-8")) + len(h.value)
    return size


@dataclass(slots=True)
class ProducerBatch(Generic[W]):
    """Records bound for one partition, in send order, with who waits for each."""

    topic_partition: TopicPartition
    created_s: float
    records: list[Record] = field(default_factory=list)
    waiters: list[W] = field(default_factory=list)
    size_bytes: int = HEADER_BYTES  # upper bound, uncompressed
    sticky: bool = False  # holds records placed by the sticky partitioner
    # When its first record's delivery_timeout_ms ends (the producer's clock): the batch
    # fails then rather than be sent or retried any longer.
    deadline_s: float = math.inf


class RecordAccumulator(Generic[W]):
    """Open batches (one per partition) and closed batches waiting to be sent.

    Invariant: a partition has at most one open batch, and its closed batches wait in
    `_ready[tp]` in the order they closed.
    """

    def __init__(self, *, batch_bytes: int, linger_ms: int, sticky_start: int = 0) -> None:
        if batch_bytes < 1 or linger_ms < 0:
            raise ValueError("need batch_bytes >= 1 and linger_ms >= 0")
        self._batch_bytes = batch_bytes
        self._linger_s = linger_ms / 1000
        self._sticky_start = sticky_start
        self._sticky: dict[str, StickyPartitioner] = {}
        self._open: dict[TopicPartition, ProducerBatch[W]] = {}
        self._ready: dict[TopicPartition, deque[ProducerBatch[W]]] = {}

    def append(
        self,
        topic: str,
        record: Record,
        waiter: W,
        *,
        partition_count: int,
        partition: int | None,
        now_s: float,
        active: Sequence[int] | None = None,
        deadline_s: float = math.inf,
    ) -> tuple[TopicPartition, bool]:
        """Add a record to its partition's open batch; the batch's deadline becomes the
        earliest of its records' `deadline_s`.

        Returns the partition and whether the set of batches changed in a way the sender
        must see (a batch closed, or a new one opened and so a new linger deadline).
        """
        sticky = partition is None and record.key is None
        # Keyed and sticky records go to the partitions taking records (all of them unless
        # some were decommissioned): partition i of `choices`.
        choices: Sequence[int] = active if active else range(partition_count)
        tp = TopicPartition(topic, self._choose(topic, record.key, partition, choices))
        size = record_size_bytes(record)
        changed = False
        batch = self._open.get(tp)
        if batch is not None and batch.size_bytes + size > self._batch_bytes:
            self._close(tp)
            changed = True
            if sticky:  # closing moved the sticky partition: follow it
                sticky_at = self._sticky_for(topic).partition(len(choices))
                tp = TopicPartition(topic, choices[sticky_at])
                batch = self._open.get(tp)
                if batch is not None and batch.size_bytes + size > self._batch_bytes:
                    self._close(tp)
            batch = self._open.get(tp)
        if batch is None:
            batch = self._open[tp] = ProducerBatch(tp, now_s)
            changed = True
        batch.records.append(record)
        batch.waiters.append(waiter)
        batch.size_bytes += size
        batch.sticky = batch.sticky or sticky
        batch.deadline_s = min(batch.deadline_s, deadline_s)
        if batch.size_bytes >= self._batch_bytes:  # full already (or one oversized record)
            self._close(tp)
        return tp, changed

    def _choose(
        self, topic: str, key: bytes | None, partition: int | None, choices: Sequence[int]
    ) -> int:
        if partition is not None:
            return partition
        if key is not None:
            return choices[partition_for_key(key, len(choices))]
        return choices[self._sticky_for(topic).partition(len(choices))]

    def _sticky_for(self, topic: str) -> StickyPartitioner:
        sticky = self._sticky.get(topic)
        if sticky is None:
            sticky = self._sticky[topic] = StickyPartitioner(self._sticky_start)
        return sticky

    def _close(self, tp: TopicPartition) -> None:
        batch = self._open.pop(tp)
        self._ready.setdefault(tp, deque()).append(batch)
        if batch.sticky:
            self._sticky_for(tp.topic).next_batch()

    def close_expired(self, now_s: float, *, force: bool = False) -> bool:
        """Close batches that lingered long enough (all of them with `force`)."""
        expired = [
            tp for tp, b in self._open.items() if force or now_s - b.created_s >= self._linger_s
        ]
        for tp in expired:
            self._close(tp)
        return bool(expired)

    def next_deadline_s(self) -> float | None:
        """When the oldest open batch has lingered enough; None with no open batch."""
        if not self._open:
            return None
        return min(b.created_s for b in self._open.values()) + self._linger_s

    def take_sendable(self, busy: set[TopicPartition]) -> list[ProducerBatch[W]]:
        """The oldest closed batch of every partition that has no request in flight."""
        out = []
        for tp, queue in self._ready.items():
            if queue and tp not in busy:
                out.append(queue.popleft())
        for batch in out:
            if not self._ready[batch.topic_partition]:
                del self._ready[batch.topic_partition]
        return out

    def is_empty(self) -> bool:
        return not self._open and not self._ready

"""Produce: choose partitions, check records, build batches, append or forward, acks.

The path of one produce (dmq/README.md, "dmq/broker/"): the topic (created if
auto_create_topics), a partition per record (explicit, else the key's hash over the
active partitions, else the sticky partition of this batch), every record checked against
the limits before any is queued, one RecordBatch per partition; then per partition:
with a replica here it is proposed to the partition's group (a follower's proposal
reaches the leader through pysyncobj; a follower cut off from its leader refuses it at
once, not_leader); without one it is forwarded to a broker hosting a replica, the
reported leader first, skipping brokers out of reach, retrying across leader changes for
one election (two maximum election timeouts), and given up (504, outcome unknown) once
its target goes out of reach. acks=all answers after apply (offsets are assigned there), acks=1 once the
leader's journal has it, acks=0 at once (failures are only logged).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any

from dmq import errors
from dmq.broker.context import BrokerContext
from dmq.broker.routing import Routing
from dmq.broker.topics import TopicsService
from dmq.broker.translate import translate
from dmq.broker.types import Acks, OffsetRun, ProduceRecord, ProducerSequence, TopicView
from dmq.metadata.machine import PARTITION_ACTIVE, InitProducerFenceable
from dmq.metadata.service import wall_ms
from dmq.partitioner import StickyPartitioner, partition_for_key
from log import errors as log_errors
from log import limits as log_limits

# validate_batch imports its numpy walk (and numpy, ~0.1-0.3 s) at the first batch of
# VECTORISED_RECORDS_MIN records, so that clients importing log never load it; a broker
# loads it here, when it starts, rather than inside its first large produce.
from log import record_walk  # noqa: F401
from log.records import Record, RecordLimits, encode_batch, validate_batch

_log = logging.getLogger("dmq.broker")

# A relayed append (no replica here) retries refusals for this many maximum election
# timeouts: long enough for one election, short of the request timeout (_append_remote).
RELAY_RETRY_ELECTIONS = 2

# Records of one request by partition, each with its index in the request.
ByPartition = dict[int, list[tuple[int, Record]]]
# A transactional produce (dmq/broker/transactions.py): called with the topic, the
# partitions and the producer (id, epoch) before any batch is appended; its batches carry
# the transactional attribute.
BeforeAppend = Callable[[str, list[int], int, int], Awaitable[None]]


class ProduceService:
    """Owns the sticky partitioner and the acks=0 appends still running."""

    def __init__(self, ctx: BrokerContext, routing: Routing, topics: TopicsService) -> None:
        self._ctx = ctx
        self._routing = routing
        self._topics = topics
        self._sticky = StickyPartitioner()
        self._fire_and_forget: set[asyncio.Task[Any]] = set()
        self.acks0_refused = 0  # acks=0 appends a full disk refused after the answer

    async def produce(
        self,
        topic_name: str,
        records: Sequence[ProduceRecord],
        *,
        acks: Acks = "all",
        producer: ProducerSequence | None = None,
        before_append: BeforeAppend | None = None,
    ) -> list[OffsetRun]:
        """Append records (JSON/text paths): choose partitions, build one batch per
        partition, commit them, answer one offset per record in request order.

        With `producer` (an idempotent producer's batch) every record must go to one
        partition: the sequence numbers are per partition."""
        if not records:
            raise errors.InvalidRequest("records must hold at least one record", field="records")
        topic = await self._topics.topic_for_produce(topic_name)
        by_partition = self._place_records(topic, records)
        if producer is not None and len(by_partition) != 1:
            raise errors.InvalidRequest(
                "an idempotent produce (producer_id) must put every record on one partition: "
                "give ?partition= or one key",
                field="producer_id",
            )
        if before_append is not None:
            if producer is None:
                raise errors.InvalidRequest(
                    "a transactional produce needs producer_id, producer_epoch and base_sequence",
                    field="producer_id",
                )
            await before_append(
                topic.name, sorted(by_partition), producer.producer_id, producer.producer_epoch
            )
        batches = {
            p: self._encode(p, items, producer, transactional=before_append is not None)
            for p, items in by_partition.items()
        }
        base_offsets = await self._append_batches(topic, batches, acks)
        return _offset_runs(len(records), by_partition, base_offsets)

    def place_records(self, topic: TopicView, records: Sequence[ProduceRecord]) -> ByPartition:
        """Partitions for records produced later (dmq/broker/delay.py), as produce does."""
        return self._place_records(topic, records)

    def _place_records(self, topic: TopicView, records: Sequence[ProduceRecord]) -> ByPartition:
        """Each record checked, stamped and given its partition, in request order."""
        limit = topic.config["max_record_bytes"]
        sticky = self._sticky_partition(topic)
        self._sticky.next_batch()
        now = wall_ms()
        by_partition: ByPartition = {}
        for i, r in enumerate(records):
            _check_record(r, i, limit)
            p = self._choose_partition(topic, r, sticky, i)
            ts = now if r.timestamp_ms is None else r.timestamp_ms
            by_partition.setdefault(p, []).append((i, Record(r.key, r.value, r.headers, ts)))
        return by_partition

    def _encode(
        self,
        partition: int,
        items: list[tuple[int, Record]],
        producer: ProducerSequence | None,
        *,
        transactional: bool = False,
    ) -> bytes:
        batch = (
            encode_batch([rec for _, rec in items])
            if producer is None
            else encode_batch(
                [rec for _, rec in items],
                producer_id=producer.producer_id,
                producer_epoch=producer.producer_epoch,
                base_sequence=producer.base_sequence,
                is_transactional=transactional,
            )
        )
        batch_bytes_max = self._ctx.config.batch_bytes_max
        if len(batch) > batch_bytes_max:
            raise errors.RecordTooLarge(
                f"the records for partition {partition} make a {len(batch)}-byte batch; "
                f"batch_bytes_max is {batch_bytes_max}",
                field="records",
                limit=batch_bytes_max,
            )
        return batch

    async def produce_batch(
        self,
        topic_name: str,
        batch: bytes,
        *,
        partition: int | None,
        acks: Acks = "all",
        before_append: BeforeAppend | None = None,
    ) -> list[OffsetRun]:
        """Append a ready RecordBatch from a client (the binary fast path), as is. A
        transactional batch needs `before_append` (its transactional id); control
        batches (transaction markers) are written by the coordinator only."""
        topic = await self._topics.topic_for_produce(topic_name)
        try:
            header = validate_batch(batch, self._record_limits(topic))
        except log_errors.LogError as exc:
            raise translate(exc) from exc
        if header.is_control or header.is_transactional != (before_append is not None):
            raise errors.InvalidRequest(
                "control batches are written by the transaction coordinator only; a "
                "transactional batch needs ?transactional_id= and the transactional "
                "attribute, a plain one neither",
                field="batch.attributes",
            )
        if partition is None:
            partition = self._sticky_partition(topic)
            self._sticky.next_batch()
        elif not 0 <= partition < topic.partitions:
            raise errors.PartitionNotFound(
                f"partition {partition} is not in 0..{topic.partitions - 1}",
                field="partition",
                limit=topic.partitions - 1,
            )
        _check_writable(topic, partition, "partition")
        if before_append is not None:
            await before_append(topic.name, [partition], header.producer_id, header.producer_epoch)
        base = (await self._append_batches(topic, {partition: batch}, acks))[partition]
        return [OffsetRun(partition, base, header.record_count)]

    async def append_forwarded(
        self,
        topic_name: str,
        topic_id: int,
        partition: int,
        batch: bytes,
        *,
        acks: Acks,
        log_append_time_ms: int | None,
    ) -> int | None:
        """Internal: a batch another broker validated, for a replica hosted here."""
        view = self._routing.topic(topic_name)
        self._routing.check_partition(view, partition)
        # Checked again here: a batch that reaches a Raft log must be one apply accepts.
        try:
            validate_batch(batch, self._record_limits(view))
        except log_errors.LogError as exc:
            raise translate(exc) from exc
        replica = self._ctx.replicas.local(topic_name, partition, topic_id)
        if replica is None:
            raise errors.BrokerUnavailable(
                f"no replica of {topic_name}-{partition} (topic id {topic_id}) here",
                retry_after_ms=200,
            )
        base = await replica.append(batch, log_append_time_ms, acks)
        self._ctx.traffic.produced(topic_name, partition, batch)  # traffic.py
        return base

    async def append_marker(self, topic_name: str, partition: int, marker: bytes) -> None:
        """A transaction marker (dmq/broker/transactions.py) to one partition, acks=all,
        here or at a broker hosting a replica; a topic deleted meanwhile needs none."""
        view = self._routing.view(topic_name)
        if view is None or not 0 <= partition < view.partitions:
            return
        await self._append_batches(view, {partition: marker}, "all")

    async def init_producer(self, transactional_id: str) -> tuple[int, int]:
        """A producer id and epoch from the metadata group (idempotent producers); the same
        transactional id gets its id back with the epoch + 1, fencing the old instance."""
        applied = await self._ctx.metadata.propose(
            InitProducerFenceable(transactional_id, wall_ms())
        )
        assert applied.producer is not None
        return applied.producer

    def _record_limits(self, topic: TopicView) -> RecordLimits:
        return RecordLimits(
            record_bytes_max=topic.config["max_record_bytes"],
            batch_bytes_max=self._ctx.config.batch_bytes_max,
        )

    def _sticky_partition(self, topic: TopicView) -> int:
        """The sticky partition of the current batch, among the active ones."""
        return topic.active[self._sticky.partition(len(topic.active))]

    @staticmethod
    def _choose_partition(topic: TopicView, record: ProduceRecord, sticky: int, i: int) -> int:
        if record.partition is not None:
            if not 0 <= record.partition < topic.partitions:
                raise errors.PartitionNotFound(
                    f"records[{i}].partition {record.partition} is not in "
                    f"0..{topic.partitions - 1}",
                    field=f"records[{i}].partition",
                    limit=topic.partitions - 1,
                )
            _check_writable(topic, record.partition, f"records[{i}].partition")
            return record.partition
        if record.key is not None:
            # Over the active partitions only: with none decommissioned this is Kafka's
            # murmur2 % partitions; decommissioning one remaps keys (raft/README.md).
            return topic.active[partition_for_key(record.key, len(topic.active))]
        return sticky

    async def _append_batches(
        self, topic: TopicView, batches: dict[int, bytes], acks: Acks
    ) -> dict[int, int | None]:
        append_time = wall_ms() if topic.config["timestamp_type"] == "log_append" else None
        # Check every local partition can take its batch before queueing any: a refusal
        # after some were queued would commit part of a request the client retries.
        for p, b in batches.items():
            replica = self._ctx.replicas.get(topic.name, p)
            if replica is not None:
                replica.check_capacity(len(b))
        coroutines = {
            p: self._append_one(topic, p, b, append_time, acks) for p, b in batches.items()
        }
        if acks == "0":
            self._fire_and_forget_all(coroutines.values())
            return {p: None for p in coroutines}
        # Wait for all of them: each outcome is known before the request is answered.
        outcomes = await asyncio.gather(*coroutines.values(), return_exceptions=True)
        out: dict[int, int | None] = {}
        for p, outcome in zip(coroutines, outcomes, strict=True):
            if isinstance(outcome, log_errors.LogError):
                raise translate(outcome) from outcome
            if isinstance(outcome, BaseException):
                raise outcome
            out[p] = outcome
        return out

    def _fire_and_forget_all(self, coroutines: Iterable[Coroutine[Any, Any, int | None]]) -> None:
        """acks=0: the appends run on; a reference is kept until each is done."""
        for coroutine in coroutines:
            task = asyncio.get_running_loop().create_task(coroutine)
            self._fire_and_forget.add(task)
            task.add_done_callback(self._fire_and_forget_done)

    def _fire_and_forget_done(self, task: asyncio.Task[Any]) -> None:
        self._fire_and_forget.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.warning("acks=0 append failed: %s", task.exception())
            if isinstance(task.exception(), errors.InsufficientStorage):
                self.acks0_refused += 1  # a full disk: counted, never silent (storage.py)

    async def _append_one(
        self, topic: TopicView, partition: int, batch: bytes, append_time: int | None, acks: Acks
    ) -> int | None:
        replica = self._ctx.replicas.local(topic.name, partition, topic.topic_id)
        if replica is not None:
            base = await replica.append(batch, append_time, acks)
            self._ctx.traffic.produced(topic.name, partition, batch)  # traffic.py
            return base
        return await self._append_remote(topic, partition, batch, append_time, acks)

    async def _append_remote(
        self, topic: TopicView, partition: int, batch: bytes, append_time: int | None, acks: Acks
    ) -> int | None:
        """No replica here: hand the batch to a broker hosting one, the leader first.

        A broker out of reach (`BrokerContext.out_of_reach`: not heard from within an
        election timeout) is skipped, nothing sent; refusals (not_leader, unavailable) are
        retried across the hosting brokers for at most `relay_retry_s` (one election), not
        the whole request timeout: a bridge partition can keep every hosting broker on
        this side without a leader for as long as it lasts, and the client does better
        asking another broker (dmq/README.md, "Errors under a partition")."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._ctx.timeout_s
        give_up_at = min(deadline, loop.time() + self._relay_retry_s())
        delay = 0.02
        last: errors.DmqError = errors.NotLeader(
            f"no broker hosting {topic.name}-{partition} answered", retry_after_ms=200
        )
        while True:
            placement = topic.info.partitions[partition].replicas
            leader = self._routing.leader_of(topic, partition)
            order = sorted(placement, key=lambda n: (n != leader, placement.index(n)))
            for node_id in order:
                addr = self._routing.http_addr_of(node_id)
                remaining = deadline - loop.time()
                if addr is None or remaining <= 0:
                    continue
                if self._ctx.out_of_reach(node_id):
                    last = errors.NotLeader(
                        f"broker {node_id} hosting {topic.name}-{partition} is out of reach "
                        "from here (not heard from within an election timeout)",
                        retry_after_ms=200,
                    )
                    continue
                append = self._ctx.peers.append(
                    addr,
                    topic.name,
                    topic.topic_id,
                    partition,
                    batch,
                    acks=acks,
                    log_append_time_ms=append_time,
                    timeout_s=remaining,
                )
                lost = functools.partial(self._lost_after_sending, node_id)
                try:
                    return await self._ctx.unless_out_of_reach(node_id, append, lost)
                except (errors.NotLeader, errors.BrokerUnavailable) as exc:
                    last = exc  # this broker cannot take it now: try the next
            if loop.time() + delay >= give_up_at:
                raise last
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _relay_retry_s(self) -> float:
        """How long a relayed append retries refusals: two maximum election timeouts."""
        node = self._ctx.raft_node
        return RELAY_RETRY_ELECTIONS * (
            node.config.election_timeout_max_s if node is not None else 1.0
        )

    @staticmethod
    def _lost_after_sending(node_id: str) -> errors.DmqError:
        """A relayed append whose target went out of reach after the batch left: the batch
        may have arrived and may commit, as the request timeout would say 10 s later."""
        return errors.RequestTimeout(
            f"broker {node_id} went out of reach while it held the batch (not heard from "
            "within an election timeout); the outcome is unknown",
            retry_after_ms=200,
        )


def _check_writable(topic: TopicView, partition: int, field: str) -> None:
    """Decommissioned (or gone) partitions take no new records."""
    status = topic.info.partitions[partition].status
    if status != PARTITION_ACTIVE:
        raise errors.PartitionDecommissioned(
            f"partition {partition} of {topic.name!r} is {status}: it takes no new "
            f"records (active partitions: {list(topic.active)})",
            field=field,
        )


def _check_record(record: ProduceRecord, i: int, record_bytes_max: int) -> None:
    key_len = len(record.key) if record.key is not None else 0
    if key_len > log_limits.KEY_BYTES_MAX:
        raise errors.RecordTooLarge(
            f"records[{i}].key is {key_len} bytes; key_bytes_max is {log_limits.KEY_BYTES_MAX}",
            field=f"records[{i}].key",
            limit=log_limits.KEY_BYTES_MAX,
        )
    if len(record.headers) > log_limits.HEADER_COUNT_MAX:
        raise errors.RecordTooLarge(
            f"records[{i}] has {len(record.headers)} headers; header_count_max is "
            f"{log_limits.HEADER_COUNT_MAX}",
            field=f"records[{i}].headers",
            limit=log_limits.HEADER_COUNT_MAX,
        )
    size = key_len + (len(record.value) if record.value is not None else 0)
    for h in record.headers:
        hk = len(h.key.encode())
        if hk > log_limits.HEADER_KEY_BYTES_MAX:
            raise errors.RecordTooLarge(
                f"records[{i}] header key is {hk} bytes; header_key_bytes_max is "
                f"{log_limits.HEADER_KEY_BYTES_MAX}",
                field=f"records[{i}].headers",
                limit=log_limits.HEADER_KEY_BYTES_MAX,
            )
        size += hk + len(h.value)
    if size > record_bytes_max:
        raise errors.RecordTooLarge(
            f"records[{i}] is {size} bytes; max_record_bytes is {record_bytes_max}",
            field=f"records[{i}].value",
            limit=record_bytes_max,
        )


def _offset_runs(
    count: int, by_partition: ByPartition, base_offsets: dict[int, int | None]
) -> list[OffsetRun]:
    """One offset per record in request order, as runs of consecutive offsets."""
    placed: list[tuple[int, int | None]] = [(0, None)] * count
    for p, items in by_partition.items():
        base = base_offsets[p]
        for j, (i, _) in enumerate(items):
            placed[i] = (p, None if base is None else base + j)
    runs: list[OffsetRun] = []
    for p, offset in placed:
        last = runs[-1] if runs else None
        if (
            last is not None
            and last.partition == p
            and (offset is None) == (last.base_offset is None)
            and (offset is None or offset == last.base_offset + last.count)  # type: ignore[operator]
        ):
            runs[-1] = OffsetRun(p, last.base_offset, last.count + 1)
        else:
            runs.append(OffsetRun(p, offset, 1))
    return runs

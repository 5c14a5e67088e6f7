"""Delayed records on the broker: schedule, release at their time, count, cancel.

The replicated part is the partition's delay store (dmq/partition/delay.py); this
service proposes its commands and runs the release duty:

1. a produce whose records carry `deliver_at` or `delay_ms` (or the request's
   `?delay_ms=` / `?deliver_at=`) is checked (`max_delay_ms`; acks=all), placed on
   partitions as an ordinary produce, and each partition's records are proposed as one
   `schedule` command to its group (from a hosting broker: any replica's proposal
   reaches the leader). Records due already are produced at once. An idempotent
   producer's request is one schedule on one partition that the partition dedupes by
   (producer_id, epoch, base_sequence) (`_produce_idempotent`);
2. the answer gives each delayed record its schedule id, `<partition>-<deliver_at>-<sid>`,
   which `cancel` takes back;
3. every `RELEASE_TICK_MS` the release duty looks at each partition this broker leads
   whose store holds records (`ReplicaSet.delay_pending`, kept by the stores: an
   idle partition costs nothing) and says something is due (`due_hint_ms`, read without
   a thread hop), reads
   the due records on the storage thread and proposes one `release` command for them
   (at most `RELEASE_RECORDS_MAX` records, `RELEASE_BYTES_MAX` bytes). Apply appends
   them to the log and removes them from the store in one step; a release proposed twice
   (two brokers that both believe they lead, a retry) appends nothing twice.

A record is thus late by about one tick plus one Raft commit, and never early by the
releasing leader's clock (apply skips a record whose deliver_at is after the command's
now_ms). After a leader failover the new leader's first tick releases what was due.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from dmq import errors, planted
from dmq.broker.context import BrokerContext
from dmq.broker.produce import ProduceService
from dmq.broker.routing import Routing
from dmq.broker.topics import TopicsService
from dmq.broker.translate import translate
from dmq.broker.types import Acks, ProduceRecord, ProducerSequence, TopicView
from dmq.metadata.service import wall_ms
from dmq.partition.delay import KIND_CANCEL, KIND_RELEASE, KIND_SCHEDULE, DelayCommand
from dmq.partition.replica import PartitionReplica
from log.errors import LogError
from log.records import Record, decode_batch, encode_batch

_log = logging.getLogger("dmq.broker.delay")

RELEASE_TICK_MS = 50  # how often the leader looks for due records: bounds lateness
RELEASE_RECORDS_MAX = 2_000  # records one release command appends (one batch)
RELEASE_BYTES_MAX = 1024 * 1024  # about this many bytes of records per release
DELAY_EARLY_MS = 2_000  # the planted bug delay-early (dmq/planted.py)


@dataclass(frozen=True, slots=True)
class Placed:
    """One produced record's answer: an offset now, or a schedule."""

    partition: int
    offset: int | None = None
    deliver_at_ms: int | None = None
    schedule_id: str | None = None


def schedule_id_text(partition: int, deliver_at_ms: int, sid: int) -> str:
    return f"{partition}-{deliver_at_ms}-{sid}"


def parse_schedule_id(text: str) -> tuple[int, int, int]:
    parts = text.split("-")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() and len(p) <= 20 for p in parts):
        raise errors.InvalidRequest(
            f"schedule id {text!r} is not <partition>-<deliver_at>-<sid>", field="id"
        )
    partition, at, sid = (int(p) for p in parts)
    return partition, at, sid


def _chunks(
    scheduled: tuple[tuple[int, bytes], ...], bytes_max: int
) -> list[tuple[tuple[int, bytes], ...]]:
    """Schedules of at most about bytes_max each (a Raft entry holds one produce batch's
    worth, raft_config_for), one record at least."""
    out: list[tuple[tuple[int, bytes], ...]] = []
    current: list[tuple[int, bytes]] = []
    size = 0
    for item in scheduled:
        cost = len(item[1]) + 12
        if current and size + cost > bytes_max:
            out.append(tuple(current))
            current, size = [], 0
        current.append(item)
        size += cost
    out.append(tuple(current))
    return out


class DelayService:
    def __init__(
        self,
        ctx: BrokerContext,
        routing: Routing,
        topics: TopicsService,
        produce: ProduceService,
    ) -> None:
        self._ctx = ctx
        self._routing = routing
        self._topics = topics
        self._produce = produce
        self._releasing: set[tuple[str, int]] = set()  # partitions with a release in flight
        self._tasks: set[asyncio.Task[None]] = set()

    # --- produce ---------------------------------------------------------------------------

    async def produce(
        self,
        topic_name: str,
        records: list[ProduceRecord],
        *,
        acks: Acks,
        producer: ProducerSequence | None,
    ) -> list[Placed]:
        """Schedule the delayed records, produce the others; one answer per record."""
        if acks != "all":
            raise errors.InvalidRequest(
                "delayed records are answered once scheduled: use acks=all", field="acks"
            )
        if producer is not None:
            return await self._produce_idempotent(topic_name, records, producer)
        now = wall_ms()
        deliver_at = [self._deliver_at(r, i, now) for i, r in enumerate(records)]
        topic = await self._topics.topic_for_produce(topic_name)
        out: list[Placed | None] = [None] * len(records)
        due_now = [i for i, at in enumerate(deliver_at) if at <= now]
        if due_now:
            runs = await self._produce.produce(topic_name, [records[i] for i in due_now], acks=acks)
            flat = [(run.partition, run.base_offset, j) for run in runs for j in range(run.count)]
            for i, (p, base, j) in zip(due_now, flat, strict=True):
                out[i] = Placed(p, None if base is None else base + j)
        later = [i for i, at in enumerate(deliver_at) if at > now]
        if later:
            by_partition = self._produce.place_records(topic, [records[i] for i in later])
            results = await asyncio.gather(
                *(
                    self._schedule(topic, p, [(later[j], rec) for j, rec in items], deliver_at, now)
                    for p, items in by_partition.items()
                )
            )
            for placed in results:
                for i, item in placed:
                    out[i] = item
        assert all(o is not None for o in out)
        return [o for o in out if o is not None]

    async def _produce_idempotent(
        self, topic_name: str, records: list[ProduceRecord], producer: ProducerSequence
    ) -> list[Placed]:
        """An idempotent producer's delayed produce: every record scheduled (even one due
        already: the release duty appends it within a tick) in ONE schedule command on
        ONE partition, which the partition answers with the first one's schedule ids if
        it repeats one of the producer's last 5 (dmq/partition/producers.py). Every record
        gives `deliver_at`: a retry must be the same request, and `delay_ms` counts from
        its arrival."""
        now = wall_ms()
        for i, record in enumerate(records):
            if record.deliver_at_ms is None:
                raise errors.InvalidRequest(
                    f"records[{i}]: an idempotent delayed produce gives every record "
                    "deliver_at (delay_ms would differ on a retry)",
                    field=f"records[{i}].deliver_at",
                )
        deliver_at = [self._deliver_at(r, i, now) for i, r in enumerate(records)]
        topic = await self._topics.topic_for_produce(topic_name)
        by_partition = self._produce.place_records(topic, records)
        if len(by_partition) != 1:
            raise errors.InvalidRequest(
                "an idempotent produce (producer_id) must put every record on one partition",
                field="producer_id",
            )
        ((partition, items),) = by_partition.items()
        scheduled = tuple((deliver_at[i], encode_batch([rec])) for i, rec in items)
        if len(_chunks(scheduled, self._ctx.config.batch_bytes_max)) > 1:
            raise errors.RecordTooLarge(
                "an idempotent delayed produce is one schedule command: at most "
                "batch_bytes_max bytes",
                field="records",
                limit=self._ctx.config.batch_bytes_max,
            )
        self._check_pending(topic, partition, sum(len(b) for _, b in scheduled))
        ident = (producer.producer_id, producer.producer_epoch, producer.base_sequence)
        command = DelayCommand(KIND_SCHEDULE, now, scheduled=scheduled, producer=ident)
        sids = await self.propose(topic, partition, command.encode())
        out: list[Placed | None] = [None] * len(records)
        for (i, _), sid in zip(items, sids, strict=True):
            out[i] = Placed(
                partition, None, deliver_at[i], schedule_id_text(partition, deliver_at[i], sid)
            )
        assert all(o is not None for o in out)
        return [o for o in out if o is not None]

    def _check_pending(self, topic: TopicView, partition: int, size: int) -> None:
        replica = self._ctx.replicas.local(topic.name, partition, topic.topic_id)
        limit = self._ctx.config.delay_pending_bytes_max
        if replica is not None and replica.delay_pending_bytes + size > limit:
            raise errors.Backpressure(
                f"partition {partition} holds {replica.delay_pending_bytes} bytes of delayed "
                f"records (delay_pending_bytes_max)",
                limit=limit,
            )

    def _deliver_at(self, record: ProduceRecord, i: int, now: int) -> int:
        limit = self._ctx.config.max_delay_ms
        if record.deliver_at_ms is not None and record.delay_ms is not None:
            raise errors.InvalidRequest(
                f"records[{i}] gives both deliver_at and delay_ms", field=f"records[{i}].delay_ms"
            )
        if record.delay_ms is not None:
            if record.delay_ms > limit:
                raise errors.InvalidRequest(
                    f"records[{i}].delay_ms {record.delay_ms} is over max_delay_ms {limit}",
                    field=f"records[{i}].delay_ms",
                    limit=limit,
                )
            return now + record.delay_ms
        at = record.deliver_at_ms if record.deliver_at_ms is not None else now
        if at - now > limit:
            raise errors.InvalidRequest(
                f"records[{i}].deliver_at is {at - now} ms ahead; max_delay_ms is {limit}",
                field=f"records[{i}].deliver_at",
                limit=limit,
            )
        return at

    async def _schedule(
        self,
        topic: TopicView,
        partition: int,
        items: list[tuple[int, Record]],
        deliver_at: list[int],
        now: int,
    ) -> list[tuple[int, Placed]]:
        scheduled = tuple((deliver_at[i], encode_batch([rec])) for i, rec in items)
        self._check_pending(topic, partition, sum(len(b) for _, b in scheduled))
        sids: list[int] = []
        for chunk in _chunks(scheduled, self._ctx.config.batch_bytes_max):
            command = DelayCommand(KIND_SCHEDULE, now, scheduled=chunk).encode()
            sids += await self.propose(topic, partition, command)
        return [
            (i, Placed(partition, None, deliver_at[i], schedule_id_text(partition, deliver_at[i], sid)))
            for (i, _), sid in zip(items, sids, strict=True)
        ]  # fmt: skip

    async def propose(self, topic: TopicView, partition: int, command: bytes) -> list[int]:
        """A delay command through a replica here, else through a broker hosting one."""
        replica = self._ctx.replicas.local(topic.name, partition, topic.topic_id)
        if replica is not None:
            try:
                return await replica.propose_delay(command)
            except LogError as exc:  # a refused idempotent schedule (fenced)
                raise translate(exc) from exc
        last: errors.DmqError = errors.NotLeader(
            f"no broker hosting {topic.name}-{partition} answered", retry_after_ms=200
        )
        for addr in self._hosts(topic, partition):
            try:
                doc = await self._ctx.peers.call(
                    "POST", addr, f"/v1/internal/delay/{topic.name}/{partition}",
                    params={"topic_id": str(topic.topic_id)}, body=command,
                    timeout_s=self._ctx.timeout_s, retry_safe=False,
                )  # fmt: skip
                return [int(r) for r in doc["results"]]
            except (errors.NotLeader, errors.BrokerUnavailable) as exc:
                last = exc
        raise last

    async def propose_forwarded(
        self, topic_name: str, topic_id: int, partition: int, command: bytes
    ) -> list[int]:
        """Internal: a delay command from another broker, for a replica hosted here."""
        DelayCommand.decode(command)  # refuse what apply could not read
        replica = self._ctx.replicas.local(topic_name, partition, topic_id)
        if replica is None:
            raise errors.BrokerUnavailable(
                f"no replica of {topic_name}-{partition} here", retry_after_ms=200
            )
        return await replica.propose_delay(command)

    def _hosts(self, topic: TopicView, partition: int) -> list[str]:
        placement = topic.info.partitions[partition].replicas
        leader = self._routing.leader_of(topic, partition)
        order = sorted(placement, key=lambda n: (n != leader, placement.index(n)))
        return [a for a in (self._routing.http_addr_of(n) for n in order) if a is not None]

    # --- count and cancel ------------------------------------------------------------------

    async def scheduled(self, topic_name: str) -> dict[str, Any]:
        """Per partition and in all: pending delayed records and the next due time."""
        topic = self._routing.topic(topic_name)
        parts = await asyncio.gather(
            *(self._partition_summary(topic, p) for p in range(topic.partitions))
        )
        dues = [p["next_deliver_at"] for p in parts if p["next_deliver_at"] is not None]
        return {
            "topic": topic.name,
            "count": sum(p["count"] for p in parts),
            "next_deliver_at": min(dues) if dues else None,
            "partitions": parts,
        }

    async def _partition_summary(self, topic: TopicView, partition: int) -> dict[str, Any]:
        replica = self._ctx.replicas.local(topic.name, partition, topic.topic_id)
        if replica is not None:
            return await self.local_summary(replica)
        for addr in self._hosts(topic, partition):
            try:
                doc: dict[str, Any] = await self._ctx.peers.call(
                    "GET", addr, f"/v1/internal/delay/{topic.name}/{partition}",
                    timeout_s=self._ctx.timeout_s,
                )  # fmt: skip
                return doc
            except errors.RetriableError:
                continue
        raise errors.BrokerUnavailable(f"no broker hosting {topic.name}-{partition} answered")

    async def local_summary(self, replica: PartitionReplica) -> dict[str, Any]:
        count, next_due = await replica.with_machine(
            lambda m: (m.delay.pending_count, m.delay.next_due_ms)
        )
        return {"partition": replica.partition, "count": count, "next_deliver_at": next_due}

    def local_replica(self, topic_name: str, partition: int) -> PartitionReplica:
        """This broker's replica; 404 for a topic or partition that does not exist, 503
        for one placed elsewhere (as the internal catch-up read, fetch.py)."""
        view = self._routing.topic(topic_name)
        self._routing.check_partition(view, partition)
        replica = self._ctx.replicas.get(topic_name, partition)
        if replica is None:
            raise errors.BrokerUnavailable(f"no replica of {topic_name}-{partition} here")
        return replica

    async def cancel(self, topic_name: str, schedule_id: str) -> None:
        """Cancel a pending delayed record; NotFound if it is not pending (released,
        cancelled, or never scheduled)."""
        partition, at, sid = parse_schedule_id(schedule_id)
        topic = self._routing.topic(topic_name)
        self._routing.check_partition(topic, partition)
        command = DelayCommand(KIND_CANCEL, wall_ms(), targets=((sid, at),)).encode()
        if await self.propose(topic, partition, command) != [1]:
            raise errors.NotFound(
                f"{schedule_id} is not pending in {topic_name!r} (released, cancelled or unknown)",
                field="id",
            )

    # --- the release duty ------------------------------------------------------------------

    async def release_loop(self) -> None:
        """Each tick, release what is due on the partitions this broker leads. It looks
        only at the replicas whose store holds records (`ReplicaSet.delay_pending`, which
        the stores keep): scanning every replica 20 times a second was three quarters of
        an idle broker's event loop with 1,000 partitions (bench/README.md)."""
        replicas = self._ctx.replicas
        while True:
            await asyncio.sleep(RELEASE_TICK_MS / 1000)
            now = wall_ms() + (DELAY_EARLY_MS if planted.active("delay-early") else 0)
            for key in list(replicas.delay_pending):
                replica = replicas.get(*key)
                if replica is None:
                    replicas.delay_pending.discard(key)  # removed: a new one adds itself
                    continue
                hint = replica.delay_due_hint_ms
                if hint is None:
                    # Empty: drop the key, then look again, since the store may have started
                    # holding records (and added its key) just before the discard.
                    replicas.delay_pending.discard(key)
                    hint = replica.delay_due_hint_ms
                    if hint is None:
                        continue
                    replicas.delay_pending.add(key)
                if hint > now or key in self._releasing or replica.closed:
                    continue
                status = replica.raft.status() if replica.raft is not None else None
                if status is None or not status.is_leader:
                    continue
                self._releasing.add(key)
                task = asyncio.get_running_loop().create_task(self._release(key, replica, now))
                self._tasks.add(task)  # a reference until done (the loop keeps only weak ones)
                task.add_done_callback(self._tasks.discard)

    async def _release(self, key: tuple[str, int], replica: PartitionReplica, now: int) -> None:
        bytes_max = min(RELEASE_BYTES_MAX, self._ctx.config.batch_bytes_max)  # one batch
        try:
            targets = await replica.with_machine(
                lambda m: m.delay.due(now, RELEASE_RECORDS_MAX, bytes_max)
            )
            if targets:
                command = DelayCommand(KIND_RELEASE, now, targets=tuple(targets)).encode()
                await replica.propose_delay(command)
        except errors.DmqError as exc:  # not the leader any more, closing: the next tick
            _log.debug("release on %s: %s", replica.name, exc)
        finally:
            self._releasing.discard(key)


def records_of_batch(body: bytes, partition: int | None) -> list[ProduceRecord]:
    """A binary produce's RecordBatch as records to schedule one by one."""
    try:
        batch = decode_batch(body, verify=True)
    except LogError as exc:
        raise errors.InvalidRequest(f"not a valid RecordBatch: {exc}", field="body") from exc
    if batch.header.producer_id >= 0:
        raise errors.InvalidRequest(
            "delayed records cannot carry producer_id (each is scheduled on its own)",
            field="producer_id",
        )
    return [
        ProduceRecord(r.key, r.value, r.headers, partition, r.timestamp_ms) for r in batch.records
    ]

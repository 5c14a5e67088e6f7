"""Confluent REST Proxy v2 consumer instances, kept on dmq's consumer groups.

The REST proxy keeps, for each client, a consumer instance between calls: its embedded
format, its subscription and how far it has fetched. Here an instance is one member of a
dmq consumer group (groups/, dmq/broker/groups.py) plus that state, kept in memory by the
metadata group's leader: http_api/rest_v2.py relays every consumer-instance request
there, as the /v1 group routes are relayed.

1. Create: an instance without a member yet (a Kafka consumer joins on its first poll).
2. Subscribe: the instance joins its group as a member whose session timeout is the
   instance timeout (`rest_v2_instance_timeout_ms`, the proxy's
   `consumer.instance.timeout.ms`), so no background heartbeat is needed: every call on
   the instance touches the member. A new subscription leaves and joins again.
3. Expiry: an instance idle longer than the instance timeout is deleted, and leaves its
   group, on the next consumer-instance call this broker serves; the group's own session
   expiry removes its member even if no call comes.
4. Fetch: first acknowledges any revocation (a heartbeat at the group's generation) and
   forgets the positions of partitions no longer assigned; a partition without a
   position starts at the group's committed offset, else at `auto.offset.reset`
   (earliest: the log start; latest: the high watermark; none: 422). The assigned
   partitions are read at once and long-polled together up to the request's timeout;
   each answered record moves its partition's position past it.
5. Commit: the offsets given, or with none every position fetched (of partitions the
   member holds). With `auto.commit.enable` the positions of the previous fetch are
   committed at the start of the next one and when the instance is deleted, as Kafka's
   auto-commit commits on poll and on close.

Limits: `rest_v2_instances_max` instances per broker (429 beyond); each holds one group
member and one position per assigned partition. A leader change of the metadata group
loses the instances (the next call answers 40403), as a restart of a REST proxy does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from dmq import errors
from dmq.broker.fetch import FetchService
from dmq.broker.groups import GroupsService, PartitionFetch
from dmq.types import Record

_log = logging.getLogger("dmq.rest_v2")

EmbeddedFormat = Literal["binary", "json"]
OffsetReset = Literal["earliest", "latest", "none"]
TopicPartition = tuple[str, int]
T = TypeVar("T")


@dataclass(slots=True)
class ConsumerInstance:
    """One v2 consumer instance. Mutated only under `lock` (calls on one instance run one
    at a time, as the proxy runs them on one Kafka consumer)."""

    group: str
    name: str
    format: EmbeddedFormat
    auto_offset_reset: OffsetReset
    auto_commit: bool
    request_timeout_ms: int  # a fetch's wait without ?timeout= (consumer.request.timeout.ms)
    last_used_s: float  # monotonic
    member_id: str = ""  # "" until subscribed
    topics: tuple[str, ...] = ()
    topic_pattern: str = ""
    positions: dict[TopicPartition, int] = field(default_factory=dict)  # next offset to fetch
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(frozen=True, slots=True)
class FetchedRecord:
    topic: str
    partition: int
    record: Record


class RestConsumers:
    def __init__(
        self,
        groups: GroupsService,
        fetch: FetchService,
        *,
        instance_timeout_ms: int,
        instances_max: int,
        fetch_records_max: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._groups = groups
        self._fetch = fetch
        self._instance_timeout_ms = instance_timeout_ms
        self._instances_max = instances_max
        self._fetch_records_max = fetch_records_max
        self._clock = clock
        self._instances: dict[tuple[str, str], ConsumerInstance] = {}

    # --- instances ------------------------------------------------------------------------

    async def create(
        self,
        group: str,
        name: str,
        fmt: EmbeddedFormat,
        auto_offset_reset: OffsetReset,
        auto_commit: bool,
        request_timeout_ms: int,
    ) -> ConsumerInstance:
        await self.maybe_expire()
        if not name:
            name = f"rest-consumer-{uuid.uuid4().hex[:16]}"
        if (group, name) in self._instances:
            raise errors.ConsumerInstanceExists(
                f"consumer instance {name!r} already exists in group {group!r}", field="name"
            )
        if len(self._instances) >= self._instances_max:
            raise errors.Backpressure(
                f"this broker keeps at most rest_v2_instances_max={self._instances_max} "
                "consumer instances: delete some",
                field="rest_v2_instances_max",
                limit=self._instances_max,
            )
        instance = ConsumerInstance(
            group, name, fmt, auto_offset_reset, auto_commit, request_timeout_ms, self._clock()
        )
        self._instances[(group, name)] = instance
        return instance

    def instance(self, group: str, name: str) -> ConsumerInstance:
        """The live instance; touching it restarts its idle clock."""
        found = self._instances.get((group, name))
        if found is None or self._idle(found):
            raise errors.ConsumerInstanceNotFound(
                f"consumer instance {name!r} not found in group {group!r}", field="instance"
            )
        found.last_used_s = self._clock()
        return found

    async def delete(self, group: str, name: str) -> None:
        instance = self.instance(group, name)
        async with instance.lock:
            self._instances.pop((group, name), None)
            if instance.auto_commit:
                await self._commit_positions(instance)
            await self._leave(instance)

    async def maybe_expire(self) -> bool:
        """Delete the instances idle past the instance timeout; return whether any was."""
        idle = [i for i in self._instances.values() if self._idle(i)]
        for instance in idle:
            _log.info("rest v2: consumer %s/%s idle: deleted", instance.group, instance.name)
            self._instances.pop((instance.group, instance.name), None)
            with contextlib.suppress(errors.DmqError):  # it may have expired from the group
                await self._leave(instance)
        return bool(idle)

    def _idle(self, instance: ConsumerInstance) -> bool:
        return self._clock() - instance.last_used_s > self._instance_timeout_ms / 1000

    # --- subscription ---------------------------------------------------------------------

    async def subscribe(
        self, group: str, name: str, topics: tuple[str, ...], topic_pattern: str
    ) -> None:
        instance = self.instance(group, name)
        async with instance.lock:
            await self._leave(instance)
            view = await self._groups.join(
                group,
                topics=topics,
                topic_pattern=topic_pattern,
                session_timeout_ms=self._instance_timeout_ms,
                assignor="sticky",
                instance_id="",
            )
            instance.member_id = view.member_id
            instance.topics, instance.topic_pattern = topics, topic_pattern

    async def unsubscribe(self, group: str, name: str) -> None:
        instance = self.instance(group, name)
        async with instance.lock:
            await self._leave(instance)

    async def _leave(self, instance: ConsumerInstance) -> None:
        member_id, instance.member_id = instance.member_id, ""
        instance.topics, instance.topic_pattern = (), ""
        instance.positions.clear()
        if member_id:
            with contextlib.suppress(errors.UnknownMember):  # expired meanwhile: gone anyway
                await self._groups.leave(instance.group, member_id)

    def assignment(self, group: str, name: str) -> tuple[TopicPartition, ...]:
        instance = self.instance(group, name)
        if not instance.member_id:
            return ()
        return self._member(instance)[1]

    def _member(self, instance: ConsumerInstance) -> tuple[int, tuple[TopicPartition, ...]]:
        """(group generation, assigned partitions); an expired member is a dead instance."""
        try:
            g, m = self._groups.touch_member(instance.group, instance.member_id)
        except errors.UnknownMember:
            self._instances.pop((instance.group, instance.name), None)
            raise errors.ConsumerInstanceNotFound(
                f"consumer instance {instance.name!r} of group {instance.group!r} expired "
                "from its group: create it again",
                field="instance",
            ) from None
        return g.generation, m.assigned

    # --- fetch ----------------------------------------------------------------------------

    async def fetch(
        self,
        group: str,
        name: str,
        wait_ms: int | None,
        max_bytes: int,
        encode: Callable[[FetchedRecord], T],
        keep: Callable[[str], bool] = lambda topic: True,
    ) -> list[T]:
        """Records of the assigned partitions from the instance's positions (steps 4, 5),
        each as `encode` makes it. A record `encode` refuses (raises) ends the answer
        before it, and is not passed: the first one's error is raised, so the instance
        never moves past a record it could not deliver. Only the partitions of topics
        `keep` keeps are read (those the caller may read: a pattern matches no other)."""
        await self.maybe_expire()
        instance = self.instance(group, name)
        async with instance.lock:
            if not instance.member_id:
                raise errors.InvalidRequest(
                    "the consumer instance is not subscribed to any topic", field="subscription"
                )
            wait_ms = instance.request_timeout_ms if wait_ms is None else wait_ms
            if instance.auto_commit:
                await self._commit_positions(instance)
            assigned = await self._acknowledged_assignment(instance)
            assigned = tuple(tp for tp in assigned if keep(tp[0]))
            positions = await self._positions(instance, assigned)
            found = await self._groups.read_positions(
                positions,
                wait_ms,
                lambda t, p, offset, wait: self._fetch.partition_read(
                    t, p, offset, wait, self._fetch_records_max, max_bytes
                ),
            )
            encoded: list[T] = []
            for r in _within(found, max_bytes, self._fetch_records_max):
                try:
                    encoded.append(encode(r))
                except errors.DmqError:
                    if not encoded:
                        raise
                    break
                instance.positions[(r.topic, r.partition)] = r.record.offset + 1
            return encoded

    async def _acknowledged_assignment(
        self, instance: ConsumerInstance
    ) -> tuple[TopicPartition, ...]:
        generation, assigned = self._member(instance)
        view = await self._groups.heartbeat(instance.group, instance.member_id, generation)
        assigned = view.assignment
        for tp in set(instance.positions) - set(assigned):
            del instance.positions[tp]  # revoked: its next holder starts from the commit
        return assigned

    async def _positions(
        self, instance: ConsumerInstance, assigned: tuple[TopicPartition, ...]
    ) -> list[tuple[str, int, int]]:
        missing = [tp for tp in assigned if tp not in instance.positions]
        if missing:
            committed = await self._groups.committed(instance.group)
            for topic, partition in missing:
                offset = committed.get((topic, partition))
                if offset is None:
                    offset = await self._reset_offset(instance, topic, partition)
                instance.positions[(topic, partition)] = offset
        return [(t, p, instance.positions[(t, p)]) for t, p in assigned]

    async def _reset_offset(self, instance: ConsumerInstance, topic: str, partition: int) -> int:
        if instance.auto_offset_reset == "none":
            raise errors.InvalidRequest(
                f"{topic}/{partition} has no committed offset and auto.offset.reset is none",
                field="auto.offset.reset",
            )
        found = await self._fetch.partition_offsets(topic, partition)
        if instance.auto_offset_reset == "earliest":
            return int(found.log_start_offset)
        return int(found.high_watermark)

    # --- offsets --------------------------------------------------------------------------

    async def commit(
        self, group: str, name: str, offsets: tuple[tuple[str, int, int], ...] | None
    ) -> None:
        """Commit `offsets`, or with None every fetched position (step 5)."""
        instance = self.instance(group, name)
        async with instance.lock:
            if offsets is None:
                await self._commit_positions(instance)
                return
            if not instance.member_id:
                raise errors.InvalidRequest(
                    "the consumer instance is not subscribed: it holds no partition",
                    field="offsets",
                )
            generation, _ = self._member(instance)
            await self._groups.commit(group, instance.member_id, generation, offsets)

    async def _commit_positions(self, instance: ConsumerInstance) -> None:
        if not instance.member_id or not instance.positions:
            return
        generation, assigned = self._member(instance)
        held = set(assigned)
        offsets = tuple(
            (t, p, o) for (t, p), o in sorted(instance.positions.items()) if (t, p) in held
        )
        if offsets:
            await self._groups.commit(instance.group, instance.member_id, generation, offsets)

    async def committed(
        self, group: str, name: str, partitions: tuple[TopicPartition, ...]
    ) -> list[tuple[str, int, int | None]]:
        """The group's committed offsets of `partitions` (None: nothing committed)."""
        self.instance(group, name)
        committed = await self._groups.committed(group)
        return [(t, p, committed.get((t, p))) for t, p in partitions]

    async def seek(
        self,
        group: str,
        name: str,
        offsets: tuple[tuple[str, int, int], ...],
    ) -> None:
        """The next fetch of each partition starts at the offset given (it must be
        assigned to the instance, as Kafka's seek requires)."""
        instance = self.instance(group, name)
        async with instance.lock:
            assigned = set(self._member(instance)[1]) if instance.member_id else set()
            for i, (topic, partition, offset) in enumerate(offsets):
                if (topic, partition) not in assigned:
                    raise errors.InvalidRequest(
                        f"offsets[{i}]: {topic}/{partition} is not assigned to this consumer "
                        "instance",
                        field=f"offsets[{i}]",
                    )
                instance.positions[(topic, partition)] = offset

    async def seek_edge(
        self,
        group: str,
        name: str,
        partitions: tuple[TopicPartition, ...],
        edge: Literal["beginning", "end"],
    ) -> None:
        offsets = []
        for topic, partition in partitions:
            found = await self._fetch.partition_offsets(topic, partition)
            edge_offset = found.log_start_offset if edge == "beginning" else found.high_watermark
            offsets.append((topic, partition, int(edge_offset)))
        await self.seek(group, name, tuple(offsets))


def _within(found: list[PartitionFetch], max_bytes: int, records_max: int) -> list[FetchedRecord]:
    """Records of the partitions read, in partition order, until their keys and values
    reach `max_bytes` (the proxy's max_bytes counts those) or they number `records_max`;
    the first record always, so that a record larger than max_bytes cannot stall the
    instance. The rest stay past the positions and come in a later fetch."""
    taken: list[FetchedRecord] = []
    budget = max_bytes
    for f in found:
        for record in f.result.records:
            size = len(record.key or b"") + len(record.value or b"")
            if taken and (size > budget or len(taken) >= records_max):
                return taken
            taken.append(FetchedRecord(f.topic, f.partition, record))
            budget -= size
    return taken


__all__ = [
    "ConsumerInstance",
    "EmbeddedFormat",
    "FetchedRecord",
    "OffsetReset",
    "RestConsumers",
]

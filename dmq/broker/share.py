"""Share groups (queues) on the broker: polls, acknowledgements, sessions, dead letters.

The machine is groups/share.py (pure); its state lives in the metadata group
(dmq/metadata/share_groups.py), so every share-group request is answered by the metadata
leader (`GroupsService.route` relays it there, as for consumer groups). This service:

1. **Poll** (`poll`): reads each of the member's partitions from its share-partition's
   end offset (from the log start for a new one) without waiting, and proposes ONE
   `AcquireRecords` carrying the offsets it read; apply decides what the member gets
   (redeliveries first, the in-flight window bound, another poll racing for the same
   records). The records are then served from what was read, or read again from the log
   for redeliveries; a redelivery whose read fails is left out of the reply (it stays
   locked until its lock runs out), and only an offset the log no longer holds is handed
   over with no record. A poll reads `SHARE_READ_AHEAD_FACTOR` times what it may take (in
   total over its partitions), so polls racing on one partition take distinct records in
   the same Raft round. With nothing to take, it waits until a partition with room in its
   window gets records in its log, a share command applied here
   (an ack, a release, a leave) may have freed records, the next lock or release delay of
   its partitions runs out, or `SHARE_RECHECK_MS`; then it looks again, until `wait_ms`.
2. **Acks** (`ack`): ONE `AckRecords` per request; all or nothing (409 lock_not_held).
3. **Sessions**, as consumer groups: the metadata leader keeps each member's last call in
   memory and proposes `LeaveShareGroup` for members silent past the group's
   `session_timeout_ms` (their locks are released); a new leader starts every session
   afresh. It also proposes `ExpireShareLocks` when a lock ran out (so that records out of
   attempts reach the dead-letter topic even when nobody polls).
4. **Dead letters, exactly once.** A record rejected, or out of attempts, is
   DEAD_LETTERING in the replicated state with a sequence number drawn from the group's
   counter. The metadata leader writes it to partition 0 of the group's dead-letter topic
   (created on demand, one partition) as an idempotent produce: the group's producer id
   and epoch (allocated once, recorded in the state by `SetDeadLetterProducer`) and that
   sequence; then proposes `MarkDeadLettered`, which archives it. A leader that dies
   between the write and the mark leaves the record DEAD_LETTERING: the next leader writes
   it again with the same producer id, epoch and sequence, and the partition answers the
   retry with the original offset instead of appending it (dmq/partition/producers.py:
   the last 5 batches of a producer are recognised), so the topic holds it once. Hence at
   most `DLQ_WRITES_PER_MARK` (5) writes go out before each mark. Each group is written
   in its own try (one failing group holds up no other); a dead letter the topic refuses
   for good is written truncated (`dmq.dlq.truncated`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from dmq import errors, planted
from dmq.broker.context import BrokerContext
from dmq.broker.fetch import FetchService
from dmq.broker.produce import ProduceService
from dmq.broker.topics import TopicsService
from dmq.broker.types import FetchResult, ProduceRecord, ProducerSequence
from dmq.metadata.machine import PARTITION_GONE
from dmq.metadata.service import wall_ms
from dmq.metadata.share_groups import ShareApplied
from dmq.selector import RecordFilter
from groups import share
from groups.share_commands import (
    ACK_TYPES,
    AckItem,
    AckRecords,
    AcquireItem,
    AcquireRecords,
    DeleteShareGroup,
    ExpireShareLocks,
    JoinShareGroup,
    LeaveShareGroup,
    MarkDeadLettered,
    PutShareGroup,
    SetDeadLetterProducer,
    ShareCommand,
)
from log.limits import HEADER_COUNT_MAX
from log.records import Header, Record

_log = logging.getLogger("dmq.share")

SHARE_CHECK_MS: Final = 200  # the metadata leader's sessions, locks and dead-letter pass
# A waiting poll looks at the state again at least this often (changes proposed by another
# broker, during a change of metadata leader, wake it no later).
SHARE_RECHECK_MS: Final = 250
# A poll reads this many times the records it may take: polls racing on one partition
# (their reads start at the same end offset) then take distinct records in one Raft round
# (apply gives each the next fresh ones) instead of all but one taking none and retrying.
# Each record read is decoded: the factor trades that CPU against lost races.
SHARE_READ_AHEAD_FACTOR: Final = 4
DLQ_WRITES_PER_MARK: Final = 5  # = PRODUCER_BATCHES_KEPT: every unmarked write is recognised
DLQ_HEADER_PREFIX: Final = "dmq.dlq."
DLQ_TRUNCATED_REASON_BYTES: Final = 200  # the dmq.dlq.truncated header's value, at most
# What http_api (which reaches groups/ only through dmq.broker) validates and documents.
SHARE_LIMITS: Final = share.ShareLimits()
ACK_KINDS: Final = ACK_TYPES
Ack = AckItem


@dataclass(frozen=True, slots=True)
class Delivery:
    """A record handed to a member: the lock and the record (None if the log lost it)."""

    acquired: share.Acquired
    record: Record | None


class ShareService:
    def __init__(
        self,
        ctx: BrokerContext,
        fetch: FetchService,
        produce: ProduceService,
        topics: TopicsService,
        is_leader: Callable[[], bool],
        allows: Callable[[str, str, str, str], bool] = lambda principal, rtype, name, op: True,
    ) -> None:
        self._ctx = ctx
        # (stored principal, resource type, name, operation) -> allowed? (SecurityService)
        self._allows = allows
        self._fetch = fetch
        self._produce = produce
        self._topics = topics
        self._is_leader = is_leader
        self._seen: dict[tuple[str, str], float] = {}  # (group, member) -> monotonic s
        self._was_leader = False
        # Set (and replaced) after each share command proposed here that may make records
        # available: waiting polls look again at once rather than at their next recheck.
        self._changed = asyncio.Event()

    # --- state ----------------------------------------------------------------------------

    def _state(self) -> share.ShareGroupsState:
        return self._ctx.metadata.state.share_groups

    async def _propose(self, command: ShareCommand) -> ShareApplied:
        applied = await self._ctx.metadata.propose(command)
        assert isinstance(applied, ShareApplied)
        if not isinstance(command, AcquireRecords):  # records may have become available
            self._changed.set()
            self._changed = asyncio.Event()
        return applied

    def group(self, name: str) -> share.ShareGroup:
        group = self._state().groups.get(name)
        if group is None:
            raise errors.GroupNotFound(f"share group {name!r} does not exist", field="group")
        return group

    def _member(
        self, group_name: str, member_id: str
    ) -> tuple[share.ShareGroup, share.ShareMember]:
        group = self._state().groups.get(group_name)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            raise errors.UnknownMember(
                f"{member_id!r} is not a member of share group {group_name!r} (it left, "
                "expired or never joined): join again"
            )
        self._touch(group_name, member_id)
        return group, member

    def member_topics(self, group: str, member_id: str) -> tuple[str, ...]:
        """The topics a member joined with; () for an unknown one (the poll refuses it)."""
        g = self._state().groups.get(group)
        member = None if g is None else g.members.get(member_id)
        return () if member is None else member.topics

    def _touch(self, group: str, member_id: str) -> None:
        """The member's session runs from now (maybe_expire_members)."""
        self._seen[(group, member_id)] = time.monotonic()

    # --- config and membership --------------------------------------------------------------

    async def put_group(
        self, name: str, changes: dict[str, Any], principal: str = ""
    ) -> share.ShareGroup:
        """Create a share group or change the given settings (the others stay); its
        dead-letter topic is written from now on with `principal`'s rights."""
        found = self._state().groups.get(name)
        c = share.ShareConfig() if found is None else found.config
        await self._propose(
            PutShareGroup(
                name,
                changes.get("lock_duration_ms", c.lock_duration_ms),
                changes.get("max_delivery_attempts", c.max_delivery_attempts),
                changes.get("dead_letter_topic", c.dead_letter_topic),
                changes.get("max_in_flight_records", c.max_in_flight_records),
                changes.get("session_timeout_ms", c.session_timeout_ms),
                wall_ms(),
                configured_by=principal,
            )
        )
        return self.group(name)

    def dead_letter_topic_after(self, name: str, changes: dict[str, Any]) -> str:
        """The dead-letter topic group `name` writes to once `put_group(name, changes)`
        applies: the one `changes` names, else the group's own, else `<name>.dlq`. The
        PUT stamps its caller as the principal those writes are made for, so the caller
        must have the rights on this topic, whichever way it was chosen."""
        found = self._state().groups.get(name)
        own = "" if found is None else found.config.dead_letter_topic
        return changes.get("dead_letter_topic") or own or name + share.DLQ_SUFFIX

    async def join(self, group: str, topics: tuple[str, ...], principal: str = "") -> str:
        """Join; a group this creates writes its dead letters with `principal`'s rights."""
        for topic in topics:
            if topic not in self._ctx.metadata.state.topics:
                raise errors.TopicNotFound(f"topic {topic!r} does not exist", field="topics")
        member_id = f"member-{uuid.uuid4().hex[:16]}"
        await self._propose(
            JoinShareGroup(group, member_id, topics, wall_ms(), configured_by=principal)
        )
        self._touch(group, member_id)
        return member_id

    async def leave(self, group: str, member_id: str) -> None:
        self._member(group, member_id)
        await self._propose(LeaveShareGroup(group, (member_id,), wall_ms()))
        self._seen.pop((group, member_id), None)

    async def delete_group(self, group: str) -> None:
        self.group(group)
        await self._propose(DeleteShareGroup(group, wall_ms()))

    # --- poll -----------------------------------------------------------------------------

    async def poll(
        self,
        group: str,
        member_id: str,
        max_records: int,
        max_bytes: int,
        wait_ms: int,
        *,
        record_filter: RecordFilter | None = None,
    ) -> list[Delivery]:
        """Records locked to the member. With a filter (`tags=`/`filter=`), only matching
        fresh records are acquired; the others are skipped for the whole group, as
        consumed: the share-partition's end moves past them and no member gets them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while True:
            g, member = self._member(group, member_id)
            tps = self._partitions_of(member.topics)
            items, reads = await self._read_fresh(g, tps, max_records, max_bytes, record_filter)
            if items:
                # The session is refreshed when the locks are stamped, not only when the
                # poll began: the reads above may take seconds (a partition leader paused
                # or cut off), and a session that ran from the poll's start could expire
                # before locks taken at its end ran out, ending them early (jepsen,
                # correct build, `share:lock-cut-short`: a 5.9-s poll, its member expired
                # 0.9 s into its 2-s locks and the records went to another member).
                self._touch(group, member_id)
                applied = await self._propose(
                    AcquireRecords(group, member_id, tuple(items), max_records, wall_ms())
                )
                if applied.acquired:
                    return await self._deliveries(applied.acquired, reads, max_bytes)
            remaining_ms = int((deadline - loop.time()) * 1000)
            if remaining_ms <= 0:
                return []
            await self._wait_for_records(g, tps, min(remaining_ms, SHARE_RECHECK_MS))

    def _partitions_of(self, topics: tuple[str, ...]) -> list[tuple[str, int]]:
        found = []
        for name in topics:
            info = self._ctx.metadata.state.topics.get(name)
            if info is None:
                continue
            found += [
                (name, p) for p, pi in enumerate(info.partitions) if pi.status != PARTITION_GONE
            ]
        return found

    async def _read_fresh(
        self,
        g: share.ShareGroup,
        tps: list[tuple[str, int]],
        max_records: int,
        max_bytes: int,
        record_filter: RecordFilter | None = None,
    ) -> tuple[list[AcquireItem], dict[tuple[str, int], FetchResult]]:
        """Each partition read at its share-partition's end, without waiting; the items of
        an AcquireRecords for those with fresh records or a record to redeliver, or (with
        a filter) records skipped: the filtered read's next_offset moves the end past
        them (`_take`: the gap after the last fresh record is skipped)."""
        now_ms = wall_ms()
        # The read-ahead is bounded in total, not per partition: it is shared among the
        # partitions (each reads its share, at least one record) and cut to the total below.
        budget = min(max_records * SHARE_READ_AHEAD_FACTOR, SHARE_LIMITS.records_per_command_max)
        each = max(1, -(-budget // max(1, len(tps))))

        async def one(tp: tuple[str, int]) -> tuple[tuple[str, int], FetchResult | None]:
            sp = g.partitions.get(tp)
            room = g.config.max_in_flight_records - (0 if sp is None else len(sp.records))
            offset = 0 if sp is None else sp.end_offset  # below the log start reads from it
            try:
                if room <= 0:  # a full window takes no fresh record: offsets only
                    return tp, await self._fetch.partition_read(tp[0], tp[1], offset, 0, 1, 1)
                want = min(each, room)
                return tp, await self._fetch.partition_read(
                    tp[0], tp[1], offset, 0, want, max_bytes, record_filter=record_filter
                )
            except errors.DmqError as exc:  # left out of this poll; the others are served
                _log.debug("share poll: %s-%d left out: %s", tp[0], tp[1], exc)
                return tp, None

        reads: dict[tuple[str, int], FetchResult] = {}
        items: list[AcquireItem] = []
        for tp, result in await asyncio.gather(*(one(tp) for tp in tps)):
            if result is None:
                continue
            sp = g.partitions.get(tp)
            full = sp is not None and len(sp.records) >= g.config.max_in_flight_records
            fresh = () if full else tuple(r.offset for r in result.records)[:budget]
            read_end = result.offset if full else result.next_offset
            if len(fresh) < len(result.records) and not full:  # cut: the rest is not skipped
                read_end = fresh[-1] + 1 if fresh else result.offset
            budget -= len(fresh)
            redeliver = sp is not None and share.offerable(sp, now_ms)
            behind = sp is not None and sp.start_offset < result.log_start_offset
            skipped = record_filter is not None and read_end > (0 if sp is None else sp.end_offset)
            if fresh or redeliver or behind or skipped:
                reads[tp] = result
                items.append((tp[0], tp[1], result.log_start_offset, fresh, read_end))
        return items, reads

    async def _deliveries(
        self,
        acquired: tuple[share.Acquired, ...],
        reads: dict[tuple[str, int], FetchResult],
        max_bytes: int,
    ) -> list[Delivery]:
        found: dict[tuple[str, int, int], Record] = {
            (tp[0], tp[1], r.offset): r for tp, result in reads.items() for r in result.records
        }
        # Offsets the log no longer holds (below its start, or compacted away: a read went
        # past them): delivered with no record, for the member to acknowledge. A read that
        # began past the offset (partition_read moves a position below the log start it
        # was told of to that start) says nothing of it: a tiered partition's local start
        # moving during the read told it of the local start, and records still in the
        # object store went out empty (jepsen, the correct build with every workload,
        # seed 4: share:unexpected 2).
        gone: set[tuple[str, int, int]] = set()
        missing = [a for a in acquired if (a.topic, a.partition, a.offset) not in found]
        for a in missing:  # redeliveries: read again from the log (few, usually)
            key = (a.topic, a.partition, a.offset)
            if key in found or key in gone:
                continue
            run = [b.offset for b in missing if (b.topic, b.partition) == (a.topic, a.partition)]
            run = [o for o in run if o >= a.offset]
            try:
                result = await self._fetch.partition_read(
                    a.topic, a.partition, a.offset, 0, max(run) - a.offset + 1, max_bytes
                )
            except errors.DmqError as exc:  # left out: it stays locked until its lock runs
                _log.warning(  # out, then comes again (a delivery attempt is spent)
                    "share poll: %s-%d offset %d unread, held back: %s",
                    a.topic, a.partition, a.offset, exc,
                )  # fmt: skip
                continue
            for r in result.records:
                found.setdefault((a.topic, a.partition, r.offset), r)
            for o in run:  # gone: below the partition's start, or read past without it
                if o < result.log_start_offset or (
                    result.offset <= o < result.next_offset
                    and (a.topic, a.partition, o) not in found
                ):
                    gone.add((a.topic, a.partition, o))
        # A record neither read nor gone (a read error, or past max_bytes) is left out of
        # the reply: it stays locked until its lock runs out, and is never handed over empty.
        deliveries = [
            Delivery(a, found.get((a.topic, a.partition, a.offset)))
            for a in acquired
            if (a.topic, a.partition, a.offset) in found or (a.topic, a.partition, a.offset) in gone
        ]
        if planted.active("share-double-delivery"):  # planted: records read, locked or not
            deliveries += planted_unlocked(acquired, reads)
        return deliveries

    async def _wait_for_records(
        self, g: share.ShareGroup, tps: list[tuple[str, int]], wait_ms: int
    ) -> None:
        """Until a partition gets records past its share-partition's end, a share command
        applied here changes the state (an ack, a release, a leave), the next lock or
        release delay of these partitions runs out, or wait_ms."""
        changed = self._changed
        now_ms = wall_ms()
        due = [
            r.locked_until_ms if r.state == share.ACQUIRED else r.available_ms
            for tp in tps
            if (sp := g.partitions.get(tp)) is not None
            for r in sp.records.values()
            if r.state in (share.ACQUIRED, share.AVAILABLE)
        ]
        next_due_ms = min(due, default=now_ms + wait_ms) - now_ms
        wait_ms = max(1, min(wait_ms, next_due_ms + 1))

        window = g.config.max_in_flight_records

        def has_room(tp: tuple[str, int]) -> bool:
            sp = g.partitions.get(tp)
            return sp is None or len(sp.records) < window

        async def one(tp: tuple[str, int]) -> bool:
            sp = g.partitions.get(tp)
            offset = 0 if sp is None else sp.end_offset
            try:
                result = await self._fetch.partition_read(tp[0], tp[1], offset, wait_ms, 1, 1)
            except errors.DmqError:
                await asyncio.sleep(wait_ms / 1000)
                return False
            return bool(result.records)

        async def state_changed() -> bool:
            await changed.wait()
            return True

        async def timer() -> bool:
            await asyncio.sleep(wait_ms / 1000)
            return True

        # A full share-partition takes no fresh record: new records in its log are no reason
        # to look again (its backlog would answer at once and the poll would spin); an ack,
        # a release or a lock running out (the changed and timer wake-ups) are.
        logs = [one(tp) for tp in tps if has_room(tp)]
        tasks = [asyncio.ensure_future(c) for c in (state_changed(), timer(), *logs)]
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(t.result() for t in done):
                    return
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- acks -----------------------------------------------------------------------------

    async def ack(self, group: str, member_id: str, acks: tuple[AckItem, ...]) -> int:
        self._member(group, member_id)
        await self._propose(AckRecords(group, member_id, acks, wall_ms()))
        return len(acks)

    # --- the metadata leader's duties ---------------------------------------------------------

    async def run(self) -> None:
        """Every SHARE_CHECK_MS (at once again while dead letters are queued)."""
        backlog = False
        while True:
            if not backlog:
                await asyncio.sleep(SHARE_CHECK_MS / 1000)
            backlog = False
            try:
                await self.maybe_expire_members()
                await self.maybe_expire_locks()
                backlog = await self.maybe_write_dead_letters() >= DLQ_WRITES_PER_MARK
            except errors.DmqError as exc:  # no quorum now, say: the next pass retries
                _log.debug("share groups: %s", exc)
            except Exception:  # a bug: keep serving the other duties rather than stop
                _log.exception("share groups duty failed")

    async def maybe_expire_members(self) -> bool:
        leader = self._is_leader()
        if leader and not self._was_leader:
            self._seen.clear()  # a new leader: every member gets a fresh session
        self._was_leader = leader
        if not leader:
            return False
        now = time.monotonic()
        acted = False
        for g in list(self._state().groups.values()):
            silent = []
            for m in g.members:
                seen = self._seen.setdefault((g.name, m), now)
                if now - seen > g.config.session_timeout_ms / 1000:
                    silent.append(m)
            if silent:
                _log.info("share group %s: expiring %s", g.name, ", ".join(silent))
                await self._propose(LeaveShareGroup(g.name, tuple(silent), wall_ms()))
                for m in silent:
                    self._seen.pop((g.name, m), None)
                acted = True
        return acted

    async def maybe_expire_locks(self) -> bool:
        if not self._is_leader():
            return False
        now_ms = wall_ms()
        if not share.expired_locks(self._state(), now_ms):
            return False
        await self._propose(ExpireShareLocks(now_ms))
        return True

    async def maybe_write_dead_letters(self) -> int:
        """Write (then mark) up to DLQ_WRITES_PER_MARK dead letters per group. A group whose
        writes fail is logged and retried at the next pass: the other groups go on."""
        if not self._is_leader():
            return 0
        written = 0
        for g in list(self._state().groups.values()):
            pending = share.dead_letters(g)[:DLQ_WRITES_PER_MARK]
            if not pending:
                continue
            try:
                written += await self._write_dead_letters(g, pending)
            except errors.DmqError as exc:
                _log.warning("share group %s: dead letters not written yet: %s", g.name, exc)
        return written

    async def _write_dead_letters(
        self, g: share.ShareGroup, pending: list[tuple[int, str, int, int, share.InFlight]]
    ) -> int:
        topic = g.dead_letter_topic
        exists = topic in self._ctx.metadata.state.topics
        self._check_dead_letter_rights(g, topic, exists)
        if not exists:
            with contextlib.suppress(errors.TopicAlreadyExists):
                await self._topics.create_topic(
                    topic, partitions=1, config=self._dlq_config({t for _, t, *_ in pending})
                )
        producer = g.dlq_producer or await self._new_producer(g.name, None)
        done: list[tuple[str, int, int]] = []
        written = 0
        try:
            for seq, t, p, o, inflight in pending:
                try:
                    await self._write_one(g, topic, producer, seq, t, p, o, inflight)
                except errors.OutOfOrderSequence:
                    # An earlier sequence was never written (its share-partition went with
                    # its topic): a new producer id accepts any sequence. What this one
                    # wrote is marked first (below), and the pending list read again: a
                    # write of the old producer is never repeated under the new one.
                    await self._mark(g.name, done)
                    done = []
                    await self._ctx.metadata.commit_barrier()
                    now = self._state().groups.get(g.name)
                    if now is not None and now.dlq_producer == producer:
                        await self._new_producer(g.name, producer)
                    return 0  # the next pass recomputes what is pending, with the new one
                done.append((t, p, o))
                written += 1
        finally:
            await self._mark(g.name, done)
        _log.info("share group %s: %d records dead-lettered to %s", g.name, written, topic)
        return written

    def _check_dead_letter_rights(self, g: share.ShareGroup, topic: str, exists: bool) -> None:
        """The dead-letter topic is written (and created) with the rights of the principal
        that configured the group, checked at each write: an ACL removed since stops it.
        Refused: Forbidden, and the records stay DEAD_LETTERING (nothing is dropped) until
        the rights are given or the group is configured again by a principal that has them."""
        who = g.config.configured_by
        for operation in ("write",) if exists else ("create", "write"):
            if not self._allows(who, "topic", topic, operation):
                raise errors.Forbidden(
                    f"{who or 'a principal unknown (set before auth)'} may not {operation} "
                    f"topic {topic!r}: share group {g.name!r} cannot dead-letter until it "
                    "has that right or is configured again by a principal that has it",
                    operation=operation, resource_type="topic", resource_name=topic,
                    principal=who,
                )  # fmt: skip

    async def _write_one(
        self, g: share.ShareGroup, topic: str, producer: tuple[int, int], seq: int,
        t: str, p: int, o: int, inflight: share.InFlight,
    ) -> None:  # fmt: skip
        """One dead letter; if the dead-letter topic refuses it for good (too large, too
        many headers), a truncated one: its value and headers dropped, the reason in a
        `dmq.dlq.truncated` header (the key too if even that is refused)."""
        ps = ProducerSequence(producer[0], producer[1], seq)
        record = await self._dead_letter(g, t, p, o, inflight)
        try:
            await self._produce.produce(topic, [record], producer=ps)
            return
        except errors.RecordTooLarge as exc:  # permanent: the same record fails again
            why = exc.message
        _log.warning("share group %s: dead letter of %s-%d@%d truncated: %s", g.name, t, p, o, why)
        ours = _dlq_headers(g, t, p, o, inflight)
        mark = Header(DLQ_HEADER_PREFIX + "truncated", why.encode()[:DLQ_TRUNCATED_REASON_BYTES])
        try:
            await self._produce.produce(
                topic, [ProduceRecord(record.key, None, (*ours, mark), partition=0)], producer=ps
            )
        except errors.RecordTooLarge:  # the key itself is over the topic's limit
            await self._produce.produce(
                topic, [ProduceRecord(None, None, (*ours, mark), partition=0)], producer=ps
            )

    def _dlq_config(self, sources: set[str]) -> dict[str, Any] | None:
        """The dead-letter topic takes the largest max_record_bytes of its source topics."""
        sizes = [
            int(v)
            for t in sources
            if (info := self._ctx.metadata.state.topics.get(t)) is not None
            for k, v in info.config
            if k == "max_record_bytes"
        ]
        return {"max_record_bytes": max(sizes)} if sizes else None

    async def _mark(self, group: str, done: list[tuple[str, int, int]]) -> None:
        if done:
            await self._propose(MarkDeadLettered(group, tuple(done), wall_ms()))
            done.clear()

    async def _new_producer(self, group: str, replaces: tuple[int, int] | None) -> tuple[int, int]:
        """Compare-and-set: installed only if the group still has `replaces` (so two
        would-be leaders cannot both install their own); the state's producer either way."""
        producer_id, epoch = await self._produce.init_producer("")
        old = -1 if replaces is None else replaces[0]
        try:
            await self._propose(
                SetDeadLetterProducer(
                    group, producer_id, epoch, wall_ms(), replaces_producer_id=old
                )
            )
        except errors.DmqError:  # refused (or unknown outcome): what does the state hold?
            await self._ctx.metadata.commit_barrier()
            g = self._state().groups.get(group)
            if g is None or g.dlq_producer is None or g.dlq_producer == replaces:
                raise
            return g.dlq_producer  # another leader installed one first: use it
        return producer_id, epoch

    async def _dead_letter(
        self, g: share.ShareGroup, topic: str, partition: int, offset: int, r: share.InFlight
    ) -> ProduceRecord:
        """The dead letter of a record: its key, value and headers, and headers naming
        where it came from and why (the value is null if retention removed the record).
        The source's own headers are cut to leave room for ours (HEADER_COUNT_MAX)."""
        result = await self._fetch.partition_read(topic, partition, offset, 0, 1)
        found = [x for x in result.records if x.offset == offset]
        original = found[0] if found else None
        headers = _dlq_headers(g, topic, partition, offset, r)
        if original is None:
            return ProduceRecord(None, None, headers, partition=0)
        room = HEADER_COUNT_MAX - len(headers) - 1  # and one for dmq.dlq.truncated
        if len(original.headers) > room:
            dropped = len(original.headers) - room
            note = Header(DLQ_HEADER_PREFIX + "truncated", f"{dropped} headers dropped".encode())
            headers = (*original.headers[:room], *headers, note)
        else:
            headers = original.headers + headers
        return ProduceRecord(original.key, original.value, headers, partition=0)

    # --- views ----------------------------------------------------------------------------

    def describe(self, name: str) -> dict[str, Any]:
        return group_json(self.group(name), wall_ms())

    def list_groups(self) -> list[dict[str, Any]]:
        now_ms = wall_ms()
        return [group_json(g, now_ms, partitions=False) for g in self._state().groups.values()]


def _dlq_headers(
    g: share.ShareGroup, topic: str, partition: int, offset: int, r: share.InFlight
) -> tuple[Header, ...]:
    """The headers naming where a dead letter came from and why."""
    ours = {
        "group": g.name,
        "topic": topic,
        "partition": str(partition),
        "offset": str(offset),
        "delivery_count": str(r.delivery_count),
        "reason": r.reason,
    }
    return tuple(Header(DLQ_HEADER_PREFIX + k, v.encode()) for k, v in ours.items())


def planted_unlocked(
    acquired: tuple[share.Acquired, ...], reads: dict[tuple[str, int], FetchResult]
) -> list[Delivery]:
    """Planted bug share-double-delivery: every fresh record read is delivered, whether
    this poll locked it or another poll holds it."""
    mine = {(a.topic, a.partition, a.offset) for a in acquired}
    extra = []
    for tp, result in reads.items():
        for r in result.records:
            if (tp[0], tp[1], r.offset) not in mine:
                extra.append(Delivery(share.Acquired(tp[0], tp[1], r.offset, 1, 0), r))
    return extra


def group_json(g: share.ShareGroup, now_ms: int, *, partitions: bool = True) -> dict[str, Any]:
    c = g.config
    doc: dict[str, Any] = {
        "group": g.name,
        "lock_duration_ms": c.lock_duration_ms,
        "max_delivery_attempts": c.max_delivery_attempts,
        "dead_letter_topic": g.dead_letter_topic,
        "max_in_flight_records": c.max_in_flight_records,
        "session_timeout_ms": c.session_timeout_ms,
        "member_count": len(g.members),
    }
    if not partitions:
        return doc
    doc["members"] = [
        {"member_id": m.member_id, "topics": list(m.topics), "joined_ms": m.joined_ms}
        for m in g.members.values()
    ]
    doc["partitions"] = [partition_json(t, p, sp, now_ms) for (t, p), sp in g.partitions.items()]
    return doc


def partition_json(
    topic: str, partition: int, sp: share.SharePartition, now_ms: int
) -> dict[str, Any]:
    def count(pred: Callable[[share.InFlight], bool]) -> int:
        return sum(1 for r in sp.records.values() if pred(r))

    return {
        "topic": topic,
        "partition": partition,
        "start_offset": sp.start_offset,
        "end_offset": sp.end_offset,
        "in_flight": len(sp.records),
        "acquired": count(lambda r: r.state == share.ACQUIRED and r.locked_until_ms > now_ms),
        "available": count(
            lambda r: (
                r.state == share.AVAILABLE
                or (r.state == share.ACQUIRED and r.locked_until_ms <= now_ms)
            )
        ),
        "dead_lettering": count(lambda r: r.state == share.DEAD_LETTERING),
        "accepted": sp.accepted,
        "archived": sp.archived,
        "dead_lettered": sp.dead_lettered,
    }

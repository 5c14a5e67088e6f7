"""Proves ShareService:
- never hands over a record it could not read: a redelivery whose log read fails is left
  out of the poll's reply (it stays locked until its lock runs out), and only an offset
  the log no longer holds comes with no record;
- on an out-of-order sequence, marks what it wrote before it switches dead-letter
  producer, so nothing is written twice, and switches by compare-and-set;
- reads ahead SHARE_READ_AHEAD_FACTOR x max_records in total over a member's partitions;
- never expires a member before the locks its poll took run out, however long the poll's
  reads took (the session is refreshed when the locks are stamped).
The
metadata state is a real MetadataMachine; only the Raft round-trip (propose) and the
partition's log (partition_read, with a read that fails) are stand-ins, as neither runs
without brokers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from dmq import errors
from dmq.broker.share import SHARE_READ_AHEAD_FACTOR, ShareService
from dmq.broker.types import FetchResult
from dmq.metadata.machine import CreateTopic, MetadataMachine, RegisterBroker, encode_command
from groups import share
from groups.share_commands import AckRecords, AcquireRecords, PutShareGroup, SetDeadLetterProducer
from log.records import Record


class Metadata:
    """The MetadataService surface ShareService uses, over a real machine."""

    def __init__(self) -> None:
        self.machine = MetadataMachine()
        self.proposed: list[Any] = []

    @property
    def state(self) -> Any:
        return self.machine.state

    async def propose(self, command: Any) -> Any:
        self.proposed.append(command)
        return self.machine.apply(encode_command(command))

    async def read_barrier(self) -> None:
        pass  # one machine: every change is in its state already

    async def commit_barrier(self) -> None:
        pass  # the same: nothing is ever uncommitted


class Log:
    """Partition t-0: offsets [0, 5) but the `compacted` ones; reads from `failing`
    offsets raise."""

    def __init__(self) -> None:
        self.failing: set[int] = set()
        self.compacted: set[int] = set()
        self.end = 5
        # A read from below this starts here, the partition's first offset staying 0: as
        # partition_read moves a position below the start an OffsetOutOfRange named (a
        # tiered partition's local start, moved by a local deletion during the read).
        self.moved_to: int | None = None

    async def partition_read(
        self, topic: str, partition: int, offset: int, wait_ms: int, max_records: int,
        max_bytes: int = 1 << 20, record_filter: object = None,
    ) -> FetchResult:  # fmt: skip
        if offset in self.failing:
            raise errors.BrokerUnavailable("the partition's leader is gone", retry_after_ms=500)
        if self.moved_to is not None and offset < self.moved_to:
            offset = self.moved_to
        offsets = [o for o in range(offset, self.end) if o not in self.compacted][:max_records]
        found = [Record(None, b"v%d" % o, offset=o) for o in offsets]
        next_offset = found[-1].offset + 1 if found else offset
        return FetchResult(topic, partition, offset, next_offset, 5, 0, found)


def test_a_redelivery_that_cannot_be_read_is_held_back_not_handed_over_empty() -> None:
    async def run() -> None:
        metadata, log = Metadata(), Log()
        metadata.machine.apply(encode_command(RegisterBroker("n1", "h:1", "r:1", 1)))
        metadata.machine.apply(encode_command(CreateTopic("t", 1, 1, (), 2)))
        await metadata.propose(PutShareGroup("g", 60_000, 5, "", 100, 60_000, 3))
        ctx = SimpleNamespace(metadata=metadata)
        svc = ShareService(ctx, log, None, None, lambda: True)  # type: ignore[arg-type]
        member = await svc.join("g", ("t",))
        first = await svc.poll("g", member, 5, 1 << 20, 0)
        assert [(d.acquired.offset, d.record is not None) for d in first] == [
            (o, True) for o in range(5)
        ]
        acks = tuple(("t", 0, o, "accept" if o < 2 else "release", 0) for o in range(5))
        await metadata.propose(AckRecords("g", member, acks, share_now(metadata)))
        log.failing = {2}  # the read from 2 fails
        log.compacted = {3}  # compaction removed 3 meanwhile: a read from 3 passes it
        again = await svc.poll("g", member, 5, 1 << 20, 0)
        assert sorted(d.acquired.offset for d in again) == [3, 4], again  # 2 held back
        got = {d.acquired.offset: d.record for d in again}
        assert got[3] is None  # the log no longer holds it: acknowledge it
        assert got[4] is not None and got[4].value == b"v4"
        sp = metadata.state.share_groups.groups["g"].partitions[("t", 0)]
        r2 = sp.records[2]  # still locked to the member: it comes again when that runs out
        assert (r2.state, r2.member_id, r2.delivery_count) == (share.ACQUIRED, member, 2)

    asyncio.run(run())


def test_a_redelivery_read_that_began_past_the_offset_holds_it_back() -> None:
    """partition_read began at 4, past the released 1 and 3 (the partition still starts
    at 0): the read says nothing of them, so they are held back, never handed over empty
    as if the log had lost them (jepsen, the correct build, tiered: share:unexpected)."""

    async def run() -> None:
        log = Log()
        svc, metadata = started(log)
        await metadata.propose(PutShareGroup("g", 60_000, 5, "", 100, 60_000, 3))
        member = await svc.join("g", ("t",))
        assert len(await svc.poll("g", member, 5, 1 << 20, 0)) == 5
        acks = tuple(("t", 0, o, "release" if o in (1, 3) else "accept", 0) for o in range(5))
        await metadata.propose(AckRecords("g", member, acks, share_now(metadata)))
        log.moved_to = 4
        again = await svc.poll("g", member, 5, 1 << 20, 0)
        assert [(d.acquired.offset, d.record) for d in again] == [], again
        log.moved_to = None  # the next read from 1 finds them
        later = await svc.poll("g", member, 5, 1 << 20, 0)
        sp = metadata.state.share_groups.groups["g"].partitions[("t", 0)]
        assert {sp.records[o].state for o in (1, 3)} == {share.ACQUIRED}
        assert [d.record for d in later] == [], later  # still locked to the member

    asyncio.run(run())


def share_now(metadata: Metadata) -> int:
    return int(metadata.state.clock_ms)


class Produce:
    """The dead-letter topic's partition: producer 1 is refused (out of order) at its
    third write; init_producer hands out 2."""

    def __init__(self) -> None:
        self.written: list[tuple[int, int, bytes | None]] = []  # producer, sequence, value

    async def produce(self, topic: str, records: list[Any], producer: Any) -> None:
        if producer.producer_id == 1 and len(self.written) == 2:
            raise errors.OutOfOrderSequence("sequence out of order")
        self.written.append((producer.producer_id, producer.base_sequence, records[0].value))

    async def init_producer(self, transactional_id: str) -> tuple[int, int]:
        return 2, 0


class Topics:
    async def create_topic(self, name: str, **kw: Any) -> None:
        raise errors.TopicAlreadyExists(name)


def started(log: Log, produce: Any = None) -> tuple[ShareService, Metadata]:
    metadata = Metadata()
    metadata.machine.apply(encode_command(RegisterBroker("n1", "h:1", "r:1", 1)))
    metadata.machine.apply(encode_command(CreateTopic("t", 1, 1, (), 2)))
    ctx = SimpleNamespace(metadata=metadata)
    svc = ShareService(ctx, log, produce, Topics(), lambda: True)  # type: ignore[arg-type]
    return svc, metadata


def test_a_producer_switch_marks_what_was_written_first() -> None:
    async def run() -> None:
        produce = Produce()
        svc, metadata = started(Log(), produce)
        await metadata.propose(PutShareGroup("g", 60_000, 5, "", 100, 60_000, 3))
        member = await svc.join("g", ("t",))
        assert len(await svc.poll("g", member, 5, 1 << 20, 0)) == 5
        rejects = tuple(("t", 0, o, "reject", 0) for o in range(5))
        await metadata.propose(AckRecords("g", member, rejects, share_now(metadata)))
        await metadata.propose(SetDeadLetterProducer("g", 1, 0, share_now(metadata)))
        assert await svc.maybe_write_dead_letters() == 0  # two written, then refused
        kinds = [type(c).__name__ for c in metadata.proposed[-2:]]
        assert kinds == ["MarkDeadLettered", "SetDeadLetterProducer"], kinds  # mark first
        assert metadata.state.share_groups.groups["g"].dlq_producer == (2, 0)
        await svc.maybe_write_dead_letters()
        values = [v for _, _, v in produce.written]
        assert values == [b"v0", b"v1", b"v2", b"v3", b"v4"], produce.written  # each once
        assert [p for p, _, _ in produce.written] == [1, 1, 2, 2, 2]
        (sp,) = metadata.state.share_groups.groups["g"].partitions.values()
        assert sp.dead_lettered == 5

    asyncio.run(run())


def test_the_read_ahead_is_bounded_in_total_over_the_partitions() -> None:
    async def run() -> None:
        log = Log()
        log.end = 1_000
        svc, metadata = started(log)
        metadata.machine.apply(encode_command(CreateTopic("u", 8, 1, (), 2)))
        member = await svc.join("g", ("t", "u"))
        got = await svc.poll("g", member, 2, 1 << 20, 0)
        assert len(got) == 2
        (acquire,) = [c for c in metadata.proposed if isinstance(c, AcquireRecords)]
        fresh = sum(len(item[3]) for item in acquire.partitions)
        assert fresh <= 2 * SHARE_READ_AHEAD_FACTOR, acquire.partitions
        # What was read but not proposed is not skipped: it is acquired later.
        sp = metadata.state.share_groups.groups["g"].partitions
        assert all(p.end_offset <= 1 for p in sp.values()), sp

    asyncio.run(run())


class SlowLog(Log):
    """Every read takes `delay_s`: a partition whose leader is paused or cut off."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def partition_read(self, *args: Any, **kwargs: Any) -> FetchResult:
        await asyncio.sleep(self.delay_s)
        return await super().partition_read(*args, **kwargs)


def test_a_slow_poll_s_locks_outlive_its_member_s_session_check() -> None:
    """A poll whose reads took most of the session timeout (jepsen, the correct build:
    `share:lock-cut-short`, a 5.9-s poll under a fault): the metadata leader's session
    check must not expire its member before the locks the poll took at its end run out.
    The session used to run from the poll's start, so the member was expired, its locks
    released and the records handed to another member early."""

    async def run() -> None:
        log = SlowLog(delay_s=0.7)
        svc, metadata = started(log)
        # lock 1 s, session 1 s (the smallest the group allows)
        await metadata.propose(PutShareGroup("g", 1_000, 5, "", 100, 1_000, 3))
        assert not await svc.maybe_expire_members()  # leader from here on: sessions run
        member = await svc.join("g", ("t",))
        got = await svc.poll("g", member, 5, 1 << 20, 0)  # reads 0.7 s, then locks 1 s
        assert [d.acquired.offset for d in got] == [0, 1, 2, 3, 4]
        await asyncio.sleep(0.5)  # 1.2 s after the poll began, inside the 1-s locks
        assert not await svc.maybe_expire_members(), "the member was expired mid-lock"
        sp = metadata.state.share_groups.groups["g"].partitions[("t", 0)]
        assert {(r.state, r.member_id) for r in sp.records.values()} == {(share.ACQUIRED, member)}
        await asyncio.sleep(0.7)  # past the session from the locks' stamp: now it goes
        assert await svc.maybe_expire_members()
        assert member not in metadata.state.share_groups.groups["g"].members

    asyncio.run(run())

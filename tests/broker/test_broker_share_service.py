"""Proves ShareService never hands over a record it could not read: a redelivery whose
log read fails is left out of the poll's reply (it stays locked until its lock runs out),
and only an offset the log no longer holds (below its start) comes with no record. The
metadata state is a real MetadataMachine; only the Raft round-trip (propose) and the
partition's log (partition_read, with a read that fails) are stand-ins, as neither runs
without brokers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from dmq import errors
from dmq.broker.share import ShareService
from dmq.broker.types import FetchResult
from dmq.metadata.machine import CreateTopic, MetadataMachine, RegisterBroker, encode_command
from groups import share
from groups.share_commands import AckRecords, PutShareGroup
from log.records import Record


class Metadata:
    """The MetadataService surface ShareService uses, over a real machine."""

    def __init__(self) -> None:
        self.machine = MetadataMachine()

    @property
    def state(self) -> Any:
        return self.machine.state

    async def propose(self, command: Any) -> Any:
        return self.machine.apply(encode_command(command))


class Log:
    """Partition t-0: offsets [0, 5) but the `compacted` ones; reads from `failing`
    offsets raise."""

    def __init__(self) -> None:
        self.failing: set[int] = set()
        self.compacted: set[int] = set()

    async def partition_read(
        self, topic: str, partition: int, offset: int, wait_ms: int, max_records: int,
        max_bytes: int = 1 << 20,
    ) -> FetchResult:  # fmt: skip
        if offset in self.failing:
            raise errors.BrokerUnavailable("the partition's leader is gone", retry_after_ms=500)
        offsets = [o for o in range(offset, 5) if o not in self.compacted][:max_records]
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


def share_now(metadata: Metadata) -> int:
    return int(metadata.state.clock_ms)

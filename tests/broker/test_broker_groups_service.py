"""Proves GroupsService bounds its remote work:
- a reset of a group with members, or of more partitions than one command carries, is
  refused before any partition is asked for its offsets; an empty group's reset asks
  each partition once and commits the answers;
- describe asks at most GROUP_DESCRIBE_CONCURRENCY_MAX partitions at once, and answers
  every partition (unknown high watermark and lag where a leader fails);
- a group fetch leaves out the partitions it cannot read now and serves the others. The metadata state is a real MetadataMachine; only the Raft
round-trip (propose) and the partition leaders (offsets_of) are stand-ins, as neither runs
without brokers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from dmq import errors, limits
from dmq.broker.groups import GroupsService
from dmq.metadata.machine import (
    Applied,
    CreateTopic,
    MetadataMachine,
    RegisterBroker,
    encode_command,
)
from groups.commands import CommitOffsets, JoinGroup


class Metadata:
    """The MetadataService surface GroupsService uses, over a real machine."""

    def __init__(self) -> None:
        self.machine = MetadataMachine()

    @property
    def state(self) -> Any:
        return self.machine.state

    async def propose(self, command: Any) -> Applied:
        result = self.machine.apply(encode_command(command))
        assert isinstance(result, Applied), result
        return result


def service() -> tuple[GroupsService, Metadata, list[tuple[str, int]]]:
    metadata = Metadata()
    metadata.machine.apply(encode_command(RegisterBroker("n1", "h:1", "r:1", 1)))
    metadata.machine.apply(encode_command(CreateTopic("t", 4, 1, (), 2)))
    metadata.machine.apply(encode_command(CreateTopic("wide", 200, 1, (), 2)))
    asked: list[tuple[str, int]] = []
    svc = GroupsService(lambda: metadata, lambda _: None, list, lambda a, h: RuntimeError())  # type: ignore[arg-type, return-value]
    return svc, metadata, asked


def test_reset_refusals_come_before_any_partition_is_asked() -> None:
    svc, metadata, asked = service()

    async def offsets_of(topic: str, partition: int, ts: int | None) -> Any:
        asked.append((topic, partition))
        return SimpleNamespace(log_start_offset=0, high_watermark=9, offset=None)

    def count(topic: str) -> int:
        return len(metadata.state.topics[topic].partitions)

    async def run() -> None:
        await metadata.propose(JoinGroup("busy", "m", "", ("t",), "", 10_000, "sticky", 3))
        with pytest.raises(errors.GroupNotEmpty):
            await svc.reset_to("busy", ("t",), "latest", (), count, offsets_of)
        many = ("t",) * (limits.OFFSETS_PER_COMMIT_MAX // 4 + 1)
        with pytest.raises(errors.InvalidRequest) as too_many:
            await svc.reset_to("idle", many, "latest", (), count, offsets_of)
        assert too_many.value.field == "topics"
        assert asked == []  # neither refusal asked a partition leader anything
        done = await svc.reset_to("idle", ("t",), "latest", (), count, offsets_of)
        assert done == {("t", p): 9 for p in range(4)} and len(asked) == 4
        assert metadata.state.groups.groups["idle"].committed == done

    asyncio.run(run())


def test_describe_asks_a_bounded_number_of_partitions_at_once() -> None:
    svc, metadata, asked = service()
    running = 0
    most = 0

    async def offsets_of(topic: str, partition: int, ts: int | None) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001)
        running -= 1
        if partition == 7:
            raise errors.BrokerUnavailable("no leader")
        return SimpleNamespace(log_start_offset=0, high_watermark=10, offset=None)

    async def run() -> dict[str, Any]:
        offsets = tuple(("wide", p, 4) for p in range(200))
        await metadata.propose(CommitOffsets("g", "", -1, offsets, 3))
        return await svc.describe("g", offsets_of)

    doc = asyncio.run(run())
    assert 1 < most <= limits.GROUP_DESCRIBE_CONCURRENCY_MAX
    rows = {r["partition"]: r for r in doc["partitions"]}
    assert len(rows) == 200 and rows[0]["lag"] == 6
    assert rows[7]["high_watermark"] is None and rows[7]["lag"] is None


def test_a_group_fetch_serves_the_partitions_it_can_read() -> None:
    svc, metadata, _ = service()

    async def read(topic: str, partition: int, offset: int, wait_ms: int) -> Any:
        if partition == 1:
            raise errors.BrokerUnavailable("no leader for t-1 now")
        return SimpleNamespace(records=[SimpleNamespace(offset=offset)], high_watermark=1)

    async def log_start(topic: str, partition: int) -> int:
        if partition == 2:
            raise errors.BrokerUnavailable("no leader for t-2 now")
        return 0

    async def run() -> list[int]:
        await metadata.propose(JoinGroup("g", "m", "", ("t",), "", 10_000, "sticky", 3))
        _, found = await svc.fetch("g", "m", 0, read, log_start)
        return sorted(f.partition for f in found)

    assert asyncio.run(run()) == [0, 3]  # 1 and 2 left out, not the whole fetch

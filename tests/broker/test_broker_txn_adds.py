"""Proves the transactional produce's server-side add (dmq/broker/transactions.py,
`before_append`): a partition the broker's applied metadata state already shows in the
ongoing transaction of that producer id and epoch is added without a Raft round; any
other (a new partition, another epoch, a decided transaction) is proposed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from dmq.broker.transactions import TransactionsService
from dmq.metadata.machine import (
    Applied,
    CreateTopic,
    EndTxnBumpEpoch,
    InitProducerFenceable,
    MetadataMachine,
    RegisterBroker,
    encode_command,
)


class RefusedError(Exception):
    pass


class _Metadata:
    """The metadata service as `before_append` uses it: the applied state, and propose
    (applied here, counted)."""

    def __init__(self) -> None:
        self.machine = MetadataMachine()
        self.proposed: list[Any] = []
        self.now = 1_000

    @property
    def state(self) -> Any:
        return self.machine.state

    def apply(self, command: Any) -> Any:
        self.now += 1
        result = self.machine.apply(encode_command(command))
        assert isinstance(result, Applied), result
        return result

    async def propose(self, command: Any) -> Any:
        self.proposed.append(type(command).__name__)
        self.now += 1
        result = self.machine.apply(encode_command(command))
        if not isinstance(result, Applied):
            raise RefusedError(result.code)
        return result

    async def wait_changed(self, timeout_s: float) -> bool:
        await asyncio.sleep(timeout_s)
        return False


def test_an_add_the_applied_state_already_shows_makes_no_round() -> None:
    metadata = _Metadata()
    metadata.apply(RegisterBroker("n1", "127.0.0.1:1", "127.0.0.1:2", 1))
    metadata.apply(CreateTopic("a", 3, 1, (), 2))
    pid, epoch = metadata.apply(InitProducerFenceable("t1", 3)).producer
    service = TransactionsService(
        SimpleNamespace(metadata=metadata, timeout_s=2.0),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
    )
    add = service.before_append("t1", 60_000)

    async def scenario() -> None:
        await add("a", [0], pid, epoch)  # the transaction's first batch to a:0: proposed
        await add("a", [0], pid, epoch)  # a second one: the state shows it, no round
        await add("a", [0, 1], pid, epoch)  # a:1 is new: proposed
        await add("a", [1], pid, epoch)
        assert metadata.proposed == ["AddPartitionsToTxn", "AddPartitionsToTxn"]
        # Decided (and bumped): the old epoch is not shown ongoing any more: proposed,
        # and the coordinator refuses it.
        metadata.apply(EndTxnBumpEpoch("t1", pid, epoch, 1, metadata.now))
        with pytest.raises(RefusedError, match="producer_fenced"):
            await add("a", [0], pid, epoch)
        assert metadata.proposed[-1] == "AddPartitionsToTxn" and len(metadata.proposed) == 3

    asyncio.run(scenario())
    assert metadata.state.transactions["t1"].partitions == ("a:0", "a:1")

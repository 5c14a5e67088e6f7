"""Proves propose(wait="append") (Kafka's acks=1, raft/replica.py `Replica.take_appended`):

- three in-process RaftNodes, the two followers stopped: on the leader, wait="append"
  returns None within a fraction of a second with the command in the leader's synced
  journal, while wait="apply" cannot commit and times out; the appended entry commits once
  a follower is back;
- with every node up, wait="append" through a follower (which cannot answer early) returns
  None after the apply, as every replica applies the command;
- an unknown `wait` is refused.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from raft_harness import free_port_on

from raft import RaftConfig, RaftNode, Replica, Timeout


class Recorder:
    def __init__(self) -> None:
        self.commands: list[bytes] = []

    def apply(self, command: bytes) -> int:
        self.commands.append(command)
        return len(self.commands) - 1

    def snapshot(self) -> bytes:
        return b"\n".join(self.commands)

    def restore(self, snapshot: bytes) -> None:
        self.commands = snapshot.split(b"\n") if snapshot else []


async def wait_until(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def test_append_acks_on_the_leader_alone_apply_waits_for_a_majority(tmp_path: Path) -> None:
    hosts = [f"127.0.0.{11 + k}" for k in range(3)]
    port = free_port_on(hosts)
    peers = {f"n{k + 1}": f"{host}:{port}" for k, host in enumerate(hosts)}
    # The leader must not step down (no majority heard from) during the test.
    config = replace(RaftConfig(), leader_step_down_s=30.0)

    async def scenario() -> None:
        nodes = {n: RaftNode(n, peers, tmp_path / n, config) for n in peers}
        machines = {n: Recorder() for n in peers}
        replicas: dict[str, Replica] = {}
        try:
            for n, node in nodes.items():
                replicas[n] = await node.add_group(1, machines[n])
                await node.start()
            await replicas["n1"].propose(b"first", timeout_s=10)
            leader = next(n for n, r in replicas.items() if r.status().is_leader)
            followers = [n for n in peers if n != leader]

            # A follower cannot answer early: it answers after its apply, with None.
            assert await replicas[followers[0]].propose(b"via follower", wait="append") is None
            assert machines[followers[0]].commands[-1] == b"via follower"

            for n in followers:
                await nodes[n].stop()
            journal = replicas[leader].journal
            last_before = journal.last_index
            started = time.monotonic()
            assert await replicas[leader].propose(b"acks=1", timeout_s=5, wait="append") is None
            assert time.monotonic() - started < 2.5  # answered at append, not at its 5 s timeout
            assert journal.last_index == last_before + 1 and journal.is_synced()
            assert b"acks=1" not in machines[leader].commands  # not committed, not applied
            with pytest.raises(Timeout):
                await replicas[leader].propose(b"acks=all", timeout_s=0.5)
            assert replicas[leader].status().is_leader

            # A follower comes back: both entries commit and are applied in order.
            back = followers[0]
            nodes[back] = RaftNode(back, peers, tmp_path / back, config)
            machines[back] = Recorder()
            replicas[back] = await nodes[back].add_group(1, machines[back])
            await nodes[back].start()
            await wait_until(
                lambda: machines[leader].commands[-2:] == [b"acks=1", b"acks=all"],
                10,
                "the appended entries did not commit",
            )
            with pytest.raises(ValueError):
                await replicas[leader].propose(b"x", wait="sometime")  # type: ignore[arg-type]
        finally:
            for node in nodes.values():
                await node.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))

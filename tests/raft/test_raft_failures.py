"""Proves that a state machine error stops the node instead of being swallowed (raft/node.py):

- apply() raising: the node records the error (RaftNode.failed), its tick thread exits,
  the proposal and every later one fail ReplicaStopped (pysyncobj lets apply's exceptions
  out of doTick);
- restore() raising while a follower installs the leader's snapshot (pysyncobj catches and
  logs that one, then answers the leader success): the follower's node stops as well, and
  the two others keep committing;
- restore() raising at add_group (the group's own snapshot file): add_group raises it,
  the group is not added and its files are closed.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from raft_harness import free_port_on

from raft import RaftConfig, RaftError, RaftNode, Replica, ReplicaStopped


class Recorder:
    """Records commands; apply raises on b"boom", restore raises once `broken` is set."""

    def __init__(self, *, broken: bool = False) -> None:
        self.commands: list[bytes] = []
        self.broken = broken

    def apply(self, command: bytes) -> int:
        if command == b"boom":
            raise RuntimeError("apply failed")
        self.commands.append(command)
        return len(self.commands) - 1

    def snapshot(self) -> bytes:
        return b"\n".join(self.commands)

    def restore(self, snapshot: bytes) -> None:
        if self.broken:
            raise OSError("fetch_missing failed")
        self.commands = snapshot.split(b"\n") if snapshot else []


async def wait_until(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def test_apply_raising_stops_the_node(tmp_path: Path) -> None:
    async def scenario() -> None:
        port = free_port_on(["127.0.0.11"])
        node = RaftNode("n1", {"n1": f"127.0.0.11:{port}"}, tmp_path)
        replica = await node.add_group(1, Recorder())
        await node.start()
        try:
            assert await replica.propose(b"fine") == 0
            with pytest.raises(ReplicaStopped):
                await replica.propose(b"boom", timeout_s=5)
            await wait_until(lambda: node.thread_count() == 0, 5, "tick thread still running")
            assert isinstance(node.failed, RuntimeError)
            with pytest.raises(ReplicaStopped):
                await replica.propose(b"after")
        finally:
            await node.stop()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_failed_snapshot_install_stops_the_follower(tmp_path: Path) -> None:
    hosts = [f"127.0.0.{11 + k}" for k in range(3)]
    port = free_port_on(hosts)
    peers = {f"n{k + 1}": f"{host}:{port}" for k, host in enumerate(hosts)}
    # Compact after a few entries, so a follower starting empty gets a snapshot.
    config = replace(RaftConfig(), log_compaction_min_entries=4)

    async def scenario() -> None:
        nodes = {n: RaftNode(n, peers, tmp_path / n, config) for n in peers}
        replicas: dict[str, Replica] = {}
        try:
            for n, node in nodes.items():
                replicas[n] = await node.add_group(1, Recorder())
                await node.start()
            await replicas["n1"].propose(b"first", timeout_s=10)
            leader = next(n for n, r in replicas.items() if r.status().is_leader)
            victim = next(n for n in peers if n != leader)
            await nodes[victim].remove_group(1, delete=True)
            for k in range(20):
                await replicas[leader].propose(b"x%d" % k, timeout_s=10)
            assert replicas[leader].snapshots_written > 0  # the entries it lacks are gone

            replicas[victim] = await nodes[victim].add_group(1, Recorder(broken=True))
            await wait_until(lambda: nodes[victim].failed is not None, 10, "victim still up")
            await wait_until(lambda: nodes[victim].thread_count() == 0, 5, "thread still up")
            assert isinstance(nodes[victim].failed, RaftError)
            assert isinstance(nodes[victim].failed.__cause__, OSError)
            with pytest.raises(ReplicaStopped):
                await replicas[victim].propose(b"on the failed node")
            assert await replicas[leader].propose(b"still", timeout_s=10) is not None
        finally:
            for node in nodes.values():
                await node.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_failed_restore_at_add_group_raises_and_closes_files(tmp_path: Path) -> None:
    config = replace(RaftConfig(), log_compaction_min_entries=4)

    async def scenario() -> None:
        port = free_port_on(["127.0.0.11"])
        peers = {"n1": f"127.0.0.11:{port}"}
        node = RaftNode("n1", peers, tmp_path, config)
        replica = await node.add_group(1, Recorder())
        await node.start()
        for k in range(20):
            await replica.propose(b"x%d" % k)
        assert replica.snapshots_written > 0
        await node.stop()

        again = RaftNode("n1", peers, tmp_path, config)
        await again.start()
        try:
            fds_before = len(os.listdir("/proc/self/fd"))
            with pytest.raises(RaftError) as raised:
                await again.add_group(1, Recorder(broken=True))
            assert isinstance(raised.value.__cause__, OSError)
            assert 1 not in again.groups
            assert len(os.listdir("/proc/self/fd")) == fds_before
        finally:
            await again.stop()

    asyncio.run(asyncio.wait_for(scenario(), 30))

"""Proves RaftNode.remove_group (raft/node.py):

- on a running one-node RaftNode: proposals racing with the removal either commit or fail
  ReplicaStopped, later ones fail ReplicaStopped at once; the group's files are closed (no
  descriptor is left behind); re-added with the same id it is a new Replica reopened from
  its directory (its journal replayed), and the old Replica object stays stopped;
  with delete=True its directory is gone and a re-added group starts empty; removing an
  unknown group raises ValueError;
- in three in-process RaftNodes: a group removed on a follower keeps committing on the
  other two, frames for it count as frames for an unknown group, and once re-added it catches up.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from raft_harness import free_port_on

from raft import RaftNode, Replica, ReplicaStopped


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


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_removed_group_stops_closes_its_files_and_can_come_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        port = free_port_on(["127.0.0.11"])
        node = RaftNode("n1", {"n1": f"127.0.0.11:{port}"}, tmp_path)
        await node.start()
        try:
            fds_before = open_fds()
            first = Recorder()
            replica = await node.add_group(5, first)
            assert await replica.propose(b"a") == 0
            racing = [asyncio.ensure_future(replica.propose(b"r%d" % k)) for k in range(50)]
            await asyncio.sleep(0)  # the first reach the tick thread, the rest race the removal
            await node.remove_group(5)
            outcomes = await asyncio.gather(*racing, return_exceptions=True)
            failed = [o for o in outcomes if isinstance(o, BaseException)]
            assert all(isinstance(o, ReplicaStopped) for o in failed), failed
            with pytest.raises(ReplicaStopped):
                await replica.propose(b"late")
            assert 5 not in node.groups
            assert open_fds() == fds_before  # journal, meta and pysyncobj's pipes closed

            second = Recorder()
            again = await node.add_group(5, second)
            assert again is not replica and node.groups[5] is again
            position = await again.propose(b"b")
            # Reopened: the journal was replayed. A racing proposal that reached the log
            # before the removal, though it failed ReplicaStopped, may commit now.
            assert second.commands[: len(first.commands)] == first.commands
            assert set(second.commands[len(first.commands) : position]) <= {
                b"r%d" % k for k in range(50)
            }
            assert second.commands[position] == b"b"
            with pytest.raises(ReplicaStopped):
                await replica.propose(b"still stopped")

            await node.remove_group(5, delete=True)
            assert not (tmp_path / "groups" / "5").exists()
            fresh = Recorder()
            third = await node.add_group(5, fresh)
            assert await third.propose(b"c") == 0 and fresh.commands == [b"c"]
            with pytest.raises(ValueError):
                await node.remove_group(6)
        finally:
            await node.stop()

    asyncio.run(asyncio.wait_for(scenario(), 30))


async def wait_until(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def test_group_removed_on_one_of_three_nodes(tmp_path: Path) -> None:
    hosts = [f"127.0.0.{11 + k}" for k in range(3)]
    port = free_port_on(hosts)
    peers = {f"n{k + 1}": f"{host}:{port}" for k, host in enumerate(hosts)}

    async def scenario() -> None:
        nodes = {n: RaftNode(n, peers, tmp_path / n) for n in peers}
        machines = {n: Recorder() for n in peers}
        replicas: dict[str, Replica] = {}
        try:
            for n, node in nodes.items():
                replicas[n] = await node.add_group(1, machines[n])
                await node.start()
            await replicas["n1"].propose(b"before", timeout_s=10)
            # Remove it on a follower: removing the leader's copy is legal too, but the
            # re-election that follows makes in-flight proposals' outcome unknown.
            leader = next(n for n, r in replicas.items() if r.status().is_leader)
            victim = next(n for n in peers if n != leader)
            await nodes[victim].remove_group(1)
            unknown_before = nodes[victim].network.stats.frames_unknown_group
            for k in range(20):  # the two others are a majority: it still commits
                await replicas[leader].propose(b"x%d" % k, timeout_s=10)
            await wait_until(
                lambda: nodes[victim].network.stats.frames_unknown_group > unknown_before,
                5,
                "no frame for the removed group counted as unknown",
            )

            machines[victim] = Recorder()
            replicas[victim] = await nodes[victim].add_group(1, machines[victim])
            await replicas[leader].propose(b"after", timeout_s=10)
            await wait_until(
                lambda: machines[victim].commands == machines[leader].commands,
                10,
                "the re-added group did not catch up",
            )
            assert machines[victim].commands[0] == b"before"
            assert machines[victim].commands[-1] == b"after"
        finally:
            for node in nodes.values():
                await node.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))

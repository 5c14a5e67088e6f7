"""Proves RaftNode's membership calls (raft/membership.py) on four RaftNodes in this process
(127.0.0.11-14), one group first on n1-n3, which know only each other:

- `add_peer` makes a node that joined later reachable; `change_membership(add)` on the
  leader commits, a repeat finds nothing to do; the new member, opened with the new
  configuration, receives the whole log and every later command;
- `group_progress` shows the new member and its match index at the leader's last index;
- a follower refuses membership calls (NotLeader naming the leader), the leader refuses
  to remove itself (RequestDenied);
- `transfer_leadership` hands the group to the new member, which then removes the old
  leader: commands still commit on the three remaining members, and the removed replica's
  vote requests are dropped (counted) instead of raising the group's term;
- a replica whose configuration does not name the leader (a promoting metadata voter
  that missed the entry adding the next leader) still follows it: it receives the whole
  log, and a command proposed through it is forwarded to that leader and answered;
- a group reopened with `members_from_log` after a crash that lost the commit-index hint
  (the journal persists it at most once a second) uses the configuration of its journal
  (n4 added, n3 removed), not the stale one it is opened with, and commits with it; the
  same journal reopened without the flag shows the stale configuration that pysyncobj
  alone would use (a majority that need not overlap the current one's).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from raft_harness import free_port_on

from raft import NotLeader, RaftNode, Replica, RequestDenied
from raft.journal import DurableJournal

GROUP = 7
WAIT_S = 20.0


class Log:
    """Every command applied, in order."""

    def __init__(self) -> None:
        self.items: list[bytes] = []

    def apply(self, command: bytes) -> Any:
        self.items.append(command)
        return len(self.items)

    def snapshot(self) -> bytes:
        return b"\n".join(self.items)

    def restore(self, snapshot: bytes) -> None:
        self.items = snapshot.split(b"\n") if snapshot else []


async def until(probe: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def leader_of(replicas: dict[str, Replica]) -> str | None:
    leaders = [n for n, r in replicas.items() if r.status().is_leader]
    return leaders[0] if len(leaders) == 1 else None


def four_peers() -> tuple[dict[str, str], dict[str, str]]:
    """n1-n4, each on its own loopback address, and n1-n3 (`first`), which know only
    each other."""
    hosts = [f"127.0.0.{11 + k}" for k in range(4)]
    port = free_port_on(hosts)
    peers = {f"n{k + 1}": f"{host}:{port}" for k, host in enumerate(hosts)}
    return peers, {n: a for n, a in peers.items() if n != "n4"}


async def start_group_on_three(
    tmp_path: Path, peers: dict[str, str], first: dict[str, str]
) -> tuple[dict[str, RaftNode], dict[str, Log], dict[str, Replica]]:
    """Four nodes started, group GROUP on n1-n3 only: (nodes, logs, replicas)."""
    nodes = {n: RaftNode(n, first if n != "n4" else peers, tmp_path / n) for n in peers}
    logs = {n: Log() for n in peers}
    replicas = {n: await nodes[n].add_group(GROUP, logs[n]) for n in first}
    for node in nodes.values():
        await node.start()
    return nodes, logs, replicas


def test_add_transfer_remove_one_member_at_a_time(tmp_path: Path) -> None:
    peers, first = four_peers()

    async def scenario() -> None:
        nodes, logs, replicas = await start_group_on_three(tmp_path, peers, first)
        try:
            old = await until(lambda: leader_of(replicas), "a leader")
            for k in range(50):
                await replicas[old].propose(b"before-%d" % k)
            follower = next(n for n in first if n != old)
            with pytest.raises(NotLeader) as refused:
                await nodes[follower].change_membership(GROUP, "add", "n4", timeout_s=5)
            assert refused.value.leader_id == old
            with pytest.raises(RequestDenied):  # n4 is not a peer of the leader yet
                await nodes[old].change_membership(GROUP, "add", "n4", timeout_s=5)
            for n in first:
                assert await nodes[n].add_peer("n4", peers["n4"])
            assert await nodes[old].change_membership(GROUP, "add", "n4", timeout_s=10)
            assert not await nodes[old].change_membership(GROUP, "add", "n4", timeout_s=10)
            replicas["n4"] = await nodes["n4"].add_group(GROUP, logs["n4"], members=list(peers))
            await replicas[old].propose(b"after-add")
            await until(lambda: logs["n4"].items == logs[old].items, "n4 holds the log")
            # The leader learns n4's match index from n4's answer, a moment after n4 applied.
            deadline = time.monotonic() + WAIT_S
            while True:
                progress = await nodes[old].group_progress(GROUP)
                if progress.match_index["n4"] == progress.last_index:
                    break
                assert time.monotonic() < deadline, f"n4 not caught up: {progress}"
                await asyncio.sleep(0.05)
            assert progress.members == ("n1", "n2", "n3", "n4")
            assert progress.match_index["n4"] == progress.last_index
            with pytest.raises(RequestDenied):
                await nodes[old].change_membership(GROUP, "remove", old, timeout_s=5)

            deadline = time.monotonic() + WAIT_S
            while leader_of(replicas) != "n4":
                assert time.monotonic() < deadline, "n4 never led"
                # Denied while n4 misses the newest entry (pysyncobj's rule): ask again.
                with contextlib.suppress(RequestDenied, NotLeader):
                    await nodes[old].transfer_leadership(GROUP, "n4")
                await asyncio.sleep(0.2)
            assert await nodes["n4"].change_membership(GROUP, "remove", old, timeout_s=10)
            term = replicas["n4"].status().term
            for k in range(20):
                await replicas["n4"].propose(b"after-remove-%d" % k)
            stayers = [n for n in peers if n != old]
            await until(
                lambda: all(logs[n].items == logs["n4"].items for n in stayers), "3 members"
            )
            assert logs[old].items[-1] != logs["n4"].items[-1]  # the removed one gets none
            await asyncio.sleep(3.0)  # several election timeouts of the removed replica
            assert replicas["n4"].status().term == term and replicas["n4"].status().is_leader
            dropped = sum(nodes[n].network.stats.votes_dropped_non_member for n in stayers)
            assert dropped > 0
        finally:
            for node in nodes.values():
                await node.stop()

    asyncio.run(scenario())


def test_a_follower_follows_a_leader_its_configuration_does_not_name(tmp_path: Path) -> None:
    peers, first = four_peers()

    async def scenario() -> None:
        nodes, logs, replicas = await start_group_on_three(tmp_path, peers, first)
        try:
            leader = await until(lambda: leader_of(replicas), "a leader")
            for k in range(20):
                await replicas[leader].propose(b"before-%d" % k)
            for n in first:
                assert await nodes[n].add_peer("n4", peers["n4"])
            assert await nodes[leader].change_membership(GROUP, "add", "n4", timeout_s=10)
            # n4 opens the group knowing every member but the leader: as a broker that
            # opened group 0 with the voters it observed, one of which was then replaced by
            # the broker that leads now, in an entry it never received.
            stale = [n for n in peers if n != leader]
            replicas["n4"] = await nodes["n4"].add_group(GROUP, logs["n4"], members=stale)
            await replicas[leader].propose(b"after-add")
            await until(lambda: logs["n4"].items == logs[leader].items, "n4 holds the log")
            assert await replicas["n4"].propose(b"through-n4", timeout_s=10) == len(
                logs["n4"].items
            )
            await until(
                lambda: all(logs[n].items[-1:] == [b"through-n4"] for n in peers), "committed"
            )
            assert replicas["n4"].status().leader_id == leader
            assert replicas["n4"].transport.frames_from_unnamed_leader > 0
            assert all(r.status().is_leader == (n == leader) for n, r in replicas.items())
        finally:
            for node in nodes.values():
                await node.stop()

    asyncio.run(scenario())


def forget_commit_hint(group_dir: Path) -> None:
    """A crash image whose persisted commit index predates every membership entry."""
    journal = DurableJournal(group_dir)
    journal.setRaftCommitIndex(0)
    journal.close()


def test_reopened_group_takes_its_configuration_from_its_journal(tmp_path: Path) -> None:
    hosts = [f"127.0.0.{11 + k}" for k in range(4)]
    port = free_port_on(hosts)
    peers = {f"n{k + 1}": f"{host}:{port}" for k, host in enumerate(hosts)}
    stale = ["n1", "n2", "n3"]
    current = ["n1", "n2", "n4"]

    async def build() -> None:
        nodes = {n: RaftNode(n, peers, tmp_path / n) for n in peers}
        logs = {n: Log() for n in peers}
        replicas = {n: await nodes[n].add_group(GROUP, logs[n], members=stale) for n in stale}
        for node in nodes.values():
            await node.start()
        try:
            leader = await until(lambda: leader_of(replicas), "a leader")
            if leader == "n3":  # the leader cannot remove itself: make n3 a follower
                while leader_of(replicas) in (None, "n3"):
                    with contextlib.suppress(RequestDenied, NotLeader):
                        await nodes["n3"].transfer_leadership(GROUP, "n1")
                    await asyncio.sleep(0.2)
                leader = await until(lambda: leader_of(replicas), "a leader")
            await replicas[leader].propose(b"before")
            assert await nodes[leader].change_membership(GROUP, "add", "n4", timeout_s=10)
            replicas["n4"] = await nodes["n4"].add_group(GROUP, logs["n4"], members=list(peers))
            assert await nodes[leader].change_membership(GROUP, "remove", "n3", timeout_s=10)
            await replicas[leader].propose(b"after")
            await until(lambda: all(logs[n].items == logs[leader].items for n in current), "log")
        finally:
            for node in nodes.values():
                await node.stop()

    async def reopen() -> None:
        for n in current:
            forget_commit_hint(tmp_path / n / "groups" / str(GROUP))
        plain = RaftNode("n1", peers, tmp_path / "n1")
        replica = await plain.add_group(GROUP, Log(), members=stale)
        assert replica.members == stale  # what pysyncobj alone reopens with
        await plain.stop()
        nodes = {n: RaftNode(n, peers, tmp_path / n) for n in current}
        logs = {n: Log() for n in current}
        replicas = {  # each opened with a stale configuration (n4: the one it joined with)
            n: await nodes[n].add_group(
                GROUP, logs[n], members=sorted({*stale, n}), members_from_log=True
            )
            for n in current
        }
        assert all(r.members == current for r in replicas.values())
        for node in nodes.values():
            await node.start()
        try:
            leader = await until(lambda: leader_of(replicas), "a leader among n1, n2, n4")
            await replicas[leader].propose(b"reopened")
            await until(
                lambda: all(logs[n].items[-1:] == [b"reopened"] for n in current), "all apply"
            )
            assert all(r.members == current for r in replicas.values())
        finally:
            for node in nodes.values():
                await node.stop()

    asyncio.run(build())
    asyncio.run(reopen())

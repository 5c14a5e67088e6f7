"""Proves RaftNode.maybe_balance_leaders (raft/leadership.py): leaders bunched on some nodes
spread out evenly.

Three RaftNodes in this process on 127.0.0.11-13, 30 groups on all three. n3 starts only
after n1 and n2 elected a leader in every group, so it leads none (the bunching seen at
1,000 groups: 602/398/0). Each node then runs maybe_balance_leaders() periodically: within
a bounded time each leads 10 +- 1, balancing then stops acting (no flapping), and every
group still commits proposals.
"""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pysyncobj import FAIL_REASON
from raft_harness import Register, free_port_on

from raft import RaftNode, Replica, leadership

_S = TypeVar("_S")

GROUPS = 30
BALANCE_PERIOD_S = 0.3
BALANCE_BOUND_S = 20.0


def leader_counts(replicas: dict[str, list[Replica]]) -> dict[str, int]:
    return {n: sum(r.status().is_leader for r in rs) for n, rs in replicas.items()}


async def wait_for_leaders(replicas: dict[str, list[Replica]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(leader_counts(replicas).values()) != GROUPS:
        assert time.monotonic() < deadline, leader_counts(replicas)
        await asyncio.sleep(0.05)


async def balance_until(
    nodes: dict[str, RaftNode],
    state: Callable[[], _S],
    done: Callable[[_S], bool],
    each_call: Callable[[], None] = lambda: None,
) -> tuple[_S, float]:
    """Every node balances every BALANCE_PERIOD_S (each_call() after each call) until
    done(state()); that state and the seconds it took. Fails after BALANCE_BOUND_S."""
    started = time.monotonic()
    while True:
        await asyncio.gather(*(node.maybe_balance_leaders() for node in nodes.values()))
        each_call()
        await asyncio.sleep(BALANCE_PERIOD_S)
        now = state()
        if done(now):
            return now, time.monotonic() - started
        assert time.monotonic() - started < BALANCE_BOUND_S, now


async def start_n3_last(nodes: dict[str, RaftNode], replicas: dict[str, list[Replica]]) -> None:
    """n1 and n2 elect a leader in every group; then n3 starts, and leads none."""
    await nodes["n1"].start()
    await nodes["n2"].start()
    await wait_for_leaders({n: replicas[n] for n in ("n1", "n2")}, 15)
    await nodes["n3"].start()
    await asyncio.sleep(0.5)  # n3 connects and catches up; it leads nothing
    counts = leader_counts(replicas)
    assert counts["n3"] == 0 and sum(counts.values()) == GROUPS, counts


def test_leaders_spread_evenly_over_three_nodes(tmp_path: Path) -> None:
    hosts = [f"127.0.0.{11 + k}" for k in range(3)]
    port = free_port_on(hosts)
    peers = {f"n{k + 1}": f"{host}:{port}" for k, host in enumerate(hosts)}

    async def scenario() -> None:
        nodes = {n: RaftNode(n, peers, tmp_path / n) for n in peers}
        replicas = {
            n: [await node.add_group(g, Register()) for g in range(GROUPS)]
            for n, node in nodes.items()
        }
        try:
            await start_n3_last(nodes, replicas)
            before = leader_counts(replicas)

            counts, took = await balance_until(
                nodes,
                lambda: leader_counts(replicas),
                lambda c: sum(c.values()) == GROUPS and all(v == GROUPS // 3 for v in c.values()),
            )
            print(f"leaders {before} -> {counts} in {took:.1f} s")

            # Balanced: further calls change nothing.
            for _ in range(3):
                acted = await asyncio.gather(*(n.maybe_balance_leaders() for n in nodes.values()))
                assert not any(acted)
                await asyncio.sleep(BALANCE_PERIOD_S)
            counts = leader_counts(replicas)
            assert all(abs(c - GROUPS // 3) <= 1 for c in counts.values()), counts

            # Every group still commits (proposed through n1: followers forward).
            results = await asyncio.gather(
                *(r.propose(b"g%d" % r.group_id, timeout_s=10) for r in replicas["n1"])
            )
            assert results == [b"g%d" % g for g in range(GROUPS)]
        finally:
            for node in nodes.values():
                await node.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_node_that_is_down_gets_no_leadership_and_the_others_still_balance(
    tmp_path: Path,
) -> None:
    """n3 is a member of every group but never starts: it leads nothing, so it would
    always be the member leading fewest. A transfer to it cannot land; before, pysyncobj
    accepted each one (it remembers n3's match index from the group's start), the group was
    kept awake as transferring, and n1 and n2 never balanced between themselves."""
    hosts = [f"127.0.0.{11 + k}" for k in range(3)]
    port = free_port_on(hosts)
    peers = {f"n{k + 1}": f"{host}:{port}" for k, host in enumerate(hosts)}

    async def scenario() -> None:
        nodes = {n: RaftNode(n, peers, tmp_path / n) for n in ("n1", "n2")}
        replicas = {
            n: [await node.add_group(g, Register()) for g in range(GROUPS)]
            for n, node in nodes.items()
        }
        try:
            await asyncio.gather(*(node.start() for node in nodes.values()))
            await wait_for_leaders(replicas, 15)
            for replica in replicas["n2"]:  # every leader on n1: 30 / 0, n3 down
                if replica.status().is_leader:
                    await nodes["n2"].transfer_leadership(replica.group_id, "n1")
            deadline = time.monotonic() + 15
            while leader_counts(replicas)["n1"] != GROUPS:
                assert time.monotonic() < deadline, leader_counts(replicas)
                await asyncio.sleep(0.05)

            def no_transfer_to_n3() -> None:
                for node in nodes.values():
                    assert all(t != "n3" for t, _ in node._transfers.values()), node._transfers

            await balance_until(
                nodes,
                lambda: leader_counts(replicas),
                lambda c: sum(c.values()) == GROUPS and abs(c["n1"] - c["n2"]) <= 1,
                no_transfer_to_n3,
            )
        finally:
            for node in nodes.values():
                await node.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_new_groups_first_leader_is_its_preferred_member(tmp_path: Path) -> None:
    """add_group(preferred_leader=...) (Replica.stand_first): 30 new groups on n1-n3, group
    g preferring n{g % 3 + 1}, all three nodes started together: every group's first
    leader is its preferred member, elected in term 1 (no contested election), so the
    leaders start balanced 10/10/10 with no balancer. Without it the first timer to fire
    wins, and the counts are whatever the timers made them. Three more groups prefer n4,
    a member that never starts: n1 or n2 leads each of them once the others' hold ends."""
    hosts = [f"127.0.0.{11 + k}" for k in range(4)]
    port = free_port_on(hosts)
    peers = {f"n{k + 1}": f"{host}:{port}" for k, host in enumerate(hosts)}
    orphans = range(GROUPS, GROUPS + 3)

    async def scenario() -> None:
        nodes = {n: RaftNode(n, peers, tmp_path / n) for n in ("n1", "n2", "n3")}
        replicas: dict[str, list[Replica]] = {n: [] for n in nodes}
        for n, node in nodes.items():
            for g in range(GROUPS):
                preferred = f"n{g % 3 + 1}"
                replicas[n].append(
                    await node.add_group(
                        g, Register(), members=["n1", "n2", "n3"], preferred_leader=preferred
                    )
                )
        orphan_replicas = [
            await nodes[n].add_group(
                g, Register(), members=["n1", "n2", "n4"], preferred_leader="n4"
            )
            for n in ("n1", "n2")
            for g in orphans
        ]
        try:
            await asyncio.gather(*(node.start() for node in nodes.values()))
            await wait_for_leaders(replicas, 15)
            leaders = {r.group_id: r.status() for r in replicas["n1"]}
            wrong = {
                g: (s.leader_id, s.term)
                for g, s in leaders.items()
                if (s.leader_id, s.term) != (f"n{g % 3 + 1}", 1)
            }
            assert not wrong, wrong
            assert leader_counts(replicas) == {"n1": 10, "n2": 10, "n3": 10}

            deadline = time.monotonic() + 15
            while not all(r.status().leader_id in ("n1", "n2") for r in orphan_replicas):
                assert time.monotonic() < deadline, [r.status() for r in orphan_replicas]
                await asyncio.sleep(0.05)
        finally:
            for node in nodes.values():
                await node.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_balancer_moves_groups_back_to_their_preferred_members(tmp_path: Path) -> None:
    """30 groups, group g preferring n{g % 3 + 1}; n3 starts only after n1 and n2 elected a
    leader in every group (so its 10 lead elsewhere, 15/15/0 or so). Balancing ends with
    every group led by its preferred member (by counts alone it ends 10/10/10 with any
    groups on n3: without the rule it fails)."""
    hosts = [f"127.0.0.{11 + k}" for k in range(3)]
    port = free_port_on(hosts)
    peers = {f"n{k + 1}": f"{host}:{port}" for k, host in enumerate(hosts)}

    def preferred(g: int) -> str:
        return f"n{g % 3 + 1}"

    async def scenario() -> None:
        nodes = {n: RaftNode(n, peers, tmp_path / n) for n in peers}
        replicas = {
            n: [
                await node.add_group(g, Register(), preferred_leader=preferred(g))
                for g in range(GROUPS)
            ]
            for n, node in nodes.items()
        }
        try:
            await start_n3_last(nodes, replicas)
            await balance_until(
                nodes,
                lambda: {r.group_id: r.status().leader_id for r in replicas["n1"]},
                lambda leaders: all(leaders[g] == preferred(g) for g in range(GROUPS)),
            )
        finally:
            for node in nodes.values():
                await node.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


class _FakeSyncObj:
    """What leadership.balance reads of a replica's SyncObj, for a pure check."""

    def __init__(self, me: str, leader: str, members: list[str]) -> None:
        self.me, self.leader = me, leader
        self.otherNodes = [types.SimpleNamespace(id=m) for m in members if m != me]
        self.asked: list[str] = []

    def _isLeader(self) -> bool:  # noqa: N802 - pysyncobj's name
        return self.leader == self.me

    def _getLeader(self) -> types.SimpleNamespace:  # noqa: N802
        return types.SimpleNamespace(id=self.leader)

    def transferLeadership(self, node: Any, callback: Any) -> None:  # noqa: N802
        self.asked.append(str(node.id))
        callback(None, FAIL_REASON.SUCCESS)


def test_a_group_its_preferred_member_cannot_take_moves_by_counts() -> None:
    """X leads 4 groups preferring P, P leads 4 preferring X, Y leads none: neither
    preferred member leads two fewer than the other, so the groups move by counts, to Y
    (the rule for preferred members alone left Y with nothing, for good)."""
    members = ["P", "X", "Y"]
    mine = []
    for g in range(4):
        sync_obj = _FakeSyncObj("X", "X", members)
        mine.append(
            types.SimpleNamespace(
                group_id=g + 1, members=members, preferred_leader="P", syncobj=sync_obj
            )
        )
    theirs = [
        types.SimpleNamespace(
            group_id=g + 5,
            members=members,
            preferred_leader="X",
            syncobj=_FakeSyncObj("X", "P", members),
        )
        for g in range(4)
    ]
    transfers: leadership.Transfers = {}
    replicas: list[Any] = [*mine, *theirs]  # what balance() reads of a Replica
    acted = leadership.balance(
        "X", members, replicas, transfers, now=0.0, transfers_max=32,
        election_timeout_max_s=0.8, on_transfer=lambda _: None,
    )  # fmt: skip
    assert acted
    assert sorted(t for t, _ in transfers.values()) == ["Y", "Y"]  # 4/4/0 -> 2/4/2

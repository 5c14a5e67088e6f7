"""Proves the metadata group's read barriers (dmq/metadata/service.py) on three in-process
voters (raft_harness.InProcessCluster, each with its MetadataService on group 0):

- on the group-0 leader `read_barrier` goes through ReadIndex: 30 concurrent barriers
  append no log entry (the commit index stays put), take at most a few confirmation
  rounds, and each sees a change a follower voter committed before it was called;
- `commit_barrier` (and `read_barrier` on a follower voter) commit one no-op each, as
  before: the callers that must learn the fate of entries already in the leader's log;
- a group-0 leader cut off from both followers answers no `read_barrier` (NotLeader)
  while the others commit a change it does not have.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from raft_harness import InProcessCluster, ready_leader
from raft_harness import wait_until_async as wait_until

from dmq import errors
from dmq.metadata.brokers import RegisterBroker
from dmq.metadata.service import MetadataService
from raft import RaftConfig


async def start_services(tmp_path: Path) -> tuple[InProcessCluster, dict[str, MetadataService]]:
    cluster = InProcessCluster(tmp_path / "raft", config=RaftConfig())
    voters = sorted(cluster.nodes)
    services = {
        n: MetadataService(
            n,
            voters,
            node,
            None,  # type: ignore[arg-type]  # voters of one group need no HTTP peers
            lambda: [],
            timeout_s=5.0,
            on_change=lambda: None,
            left_marker=tmp_path / n / "metadata_left",
        )
        for n, node in cluster.nodes.items()
    }
    for service in services.values():
        await service.start()
    await cluster.start()
    replicas = {n: s.open_replica for n, s in services.items()}
    await wait_until(lambda: ready_leader(replicas) is not None, 10, "no group-0 leader")
    for n, service in services.items():  # a no-op barrier is a heartbeat: known brokers only
        await service.propose(register(n))
    return cluster, services


def register(node_id: str) -> RegisterBroker:
    return RegisterBroker(node_id, f"{node_id}.test:80", f"{node_id}.test:81", 1_000)


async def stop_services(cluster: InProcessCluster, services: dict[str, MetadataService]) -> None:
    for service in services.values():
        await service.stop()
    await cluster.stop()


def test_the_leader_s_read_barrier_uses_read_index_and_appends_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        cluster, services = await start_services(tmp_path)
        try:
            replicas = {n: s.open_replica for n, s in services.items()}
            leader = str(ready_leader(replicas))
            follower = next(n for n in services if n != leader)
            replica = replicas[leader]
            assert replica is not None
            other = replicas[follower]
            assert other is not None

            def applied() -> int:
                return other.status().last_applied

            await services[follower].propose(register("b9"))
            await wait_until(lambda: replica.status().last_applied >= applied(), 5, "lagging")
            commit = replica.status().commit_index
            rounds = replica.reads.rounds_sent
            await asyncio.gather(*(services[leader].read_barrier() for _ in range(30)))
            assert "b9" in services[leader].state.brokers
            assert replica.status().commit_index == commit, "a read barrier appended an entry"
            assert 1 <= replica.reads.rounds_sent - rounds <= 10
            # The strong barrier, and any barrier on a follower voter: one no-op each.
            await services[leader].commit_barrier()
            await wait_until(
                lambda: replica.status().commit_index == commit + 1, 5, "no no-op committed"
            )
            await services[follower].read_barrier()
            await wait_until(
                lambda: replica.status().commit_index == commit + 2, 5, "no no-op committed"
            )
        finally:
            await stop_services(cluster, services)

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_cut_off_group_0_leader_answers_no_read_barrier(tmp_path: Path) -> None:
    async def scenario() -> None:
        cluster, services = await start_services(tmp_path)
        try:
            replicas = {n: s.open_replica for n, s in services.items()}
            old = str(ready_leader(replicas))
            others = [n for n in services if n != old]
            for n in others:
                cluster.cut(old, n)
            majority = {n: replicas[n] for n in others}
            await wait_until(lambda: ready_leader(majority) is not None, 10, "no new leader")
            await services[others[0]].propose(register("b10"))
            with pytest.raises(errors.NotLeader):
                await services[old].read_barrier()
            assert "b10" not in services[old].state.brokers
        finally:
            await stop_services(cluster, services)

    asyncio.run(asyncio.wait_for(scenario(), 60))

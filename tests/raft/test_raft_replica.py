"""Proves the facade's contract (raft/replica.py, raft/node.py) in-process, on real sockets
and journals:

- a one-node group (the single-node default) elects itself and commits alone; propose()
  returns each command's own apply() result, in log order, also for many concurrent
  proposals (coalesced into few Raft entries: group commit);
- the node restarted on the same directory replays its journal: the state machine gets
  the same commands again, and a new proposal continues after them;
- errors are raft/errors.py types, never pysyncobj codes: a command over batch_bytes_max
  raises CommandTooLarge; with no reachable majority, propose() retries NotLeader until
  its deadline and then raises it (leader unknown); too many proposals in flight raise
  QueueFull at once; proposals to a stopped node raise ReplicaStopped;
- the node runs exactly one thread of its own.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from raft_harness import free_port_on

from raft import (
    CommandTooLarge,
    NotLeader,
    QueueFull,
    RaftConfig,
    RaftNode,
    ReplicaStopped,
)


class Recorder:
    """A StateMachine that records commands; apply returns (position, command)."""

    def __init__(self) -> None:
        self.commands: list[bytes] = []

    def apply(self, command: bytes) -> tuple[int, bytes]:
        self.commands.append(command)
        return len(self.commands) - 1, command

    def snapshot(self) -> bytes:
        return b"\n".join(self.commands)

    def restore(self, snapshot: bytes) -> None:
        self.commands = snapshot.split(b"\n") if snapshot else []


def one_node(tmp_path: Path, config: RaftConfig | None = None) -> RaftNode:
    port = free_port_on(["127.0.0.11"])
    return RaftNode("n1", {"n1": f"127.0.0.11:{port}"}, tmp_path, config)


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_single_node_group_commits_alone_and_answers_each_proposal(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = one_node(tmp_path)
        machine = Recorder()
        replica = await node.add_group(7, machine)
        threads_before = threading.active_count()
        await node.start()
        assert threading.active_count() == threads_before + 1
        assert await replica.propose(b"first") == (0, b"first")
        results = await asyncio.gather(*(replica.propose(b"c%d" % k) for k in range(500)))
        assert sorted(position for position, _ in results) == list(range(1, 501))
        assert all(machine.commands[position] == command for position, command in results)
        assert node.syncs < 250  # 500 proposals took far fewer fsyncs: group commit
        status = replica.status()
        assert status.is_leader and status.leader_id == "n1"
        await node.stop()

        restarted = one_node(tmp_path)
        replayed = Recorder()
        again = await restarted.add_group(7, replayed)
        await restarted.start()
        assert await again.propose(b"after") == (501, b"after")
        assert replayed.commands == [*machine.commands, b"after"]
        await restarted.stop()

    run(scenario())


def test_errors_are_raft_errors(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = one_node(tmp_path, replace(RaftConfig(), proposals_max=4096))
        replica = await node.add_group(1, Recorder())
        await node.start()
        with pytest.raises(CommandTooLarge):
            await replica.propose(bytes(RaftConfig().batch_bytes_max + 1))
        flood = [asyncio.ensure_future(replica.propose(b"x")) for _ in range(5000)]
        results = await asyncio.gather(*flood, return_exceptions=True)
        assert {type(r) for r in results if isinstance(r, BaseException)} == {QueueFull}
        assert sum(not isinstance(r, BaseException) for r in results) == 4096
        await node.stop()
        with pytest.raises(ReplicaStopped):
            await replica.propose(b"late")

    run(scenario())


def test_no_majority_raises_not_leader_at_the_deadline(tmp_path: Path) -> None:
    async def scenario() -> None:
        hosts = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
        port = free_port_on(hosts)
        peers = {f"n{k + 1}": f"{host}:{port}" for k, host in enumerate(hosts)}
        node = RaftNode("n1", peers, tmp_path)  # n2 and n3 never start
        replica = await node.add_group(1, Recorder())
        await node.start()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(NotLeader) as raised:
            await replica.propose(b"x", timeout_s=0.5)
        assert 0.3 <= loop.time() - started < 1.5
        assert raised.value.leader_id is None and raised.value.retriable
        await node.stop()

    run(scenario())


def test_calls_queued_while_a_round_runs_its_calls_wait_for_the_next_round(
    tmp_path: Path,
) -> None:
    """A round runs the calls queued before it (on_tick_thread, add_group, ...) and no more.
    Each call here queues the next one: draining until empty ran them all in one round,
    with no poll, tick or sync between (a broker opening 1,000 new replicas spent up to
    1.8 s so, and every new group's election came late, all at once)."""
    node = one_node(tmp_path)
    rounds: list[int] = []

    def chain(left: int) -> None:
        rounds.append(node.rounds)
        if left:
            node._calls.append(lambda: chain(left - 1))

    async def scenario() -> None:
        await node.start()
        try:
            await node.on_tick_thread(lambda: chain(20))
            while len(rounds) < 21:
                await asyncio.sleep(0.01)
        finally:
            await node.stop()

    run(scenario())
    assert rounds == sorted(rounds) and len(set(rounds)) == 21, rounds

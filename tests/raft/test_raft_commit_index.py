"""Proves that the commit index rides on later messages (raft/transport.py, "Commit index"),
on three in-process nodes with a slow heartbeat (0.4 s), so that a held-back commit index
would show as whole heartbeats:

- sequential proposals on the leader: it holds back the append_entries that only carried
  the new commit index (counted), sends well under the 4 frames a proposal it sent before
  (entries and commit index to each follower), and every follower still applies every
  command, learning the last commit index from the heartbeat;
- proposals made through a follower (answered when the follower applied them) do not wait
  for that heartbeat: 30 of them take far less than the 30 heartbeats they would;
- a group added with prompt_commit_index (the metadata group) holds nothing back;
- a follower acknowledges new entries before it applies the ones their message committed
  (the round releases the poll's replies before its ticks): with followers that take
  SLOW_APPLY_S per apply, a proposal does not wait for their applies.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from raft_harness import InProcessCluster, Register, ready_leader
from raft_harness import wait_until_async as wait_until

from raft import RaftConfig

CONFIG = RaftConfig(
    heartbeat_interval_s=0.4,
    election_timeout_min_s=2.0,
    election_timeout_max_s=3.0,
    leader_step_down_s=3.0,
)
PROPOSALS = 60
SLOW_APPLY_S = 0.08


def test_the_commit_index_rides_on_later_messages(tmp_path: Path) -> None:
    async def scenario() -> None:
        cluster = InProcessCluster(tmp_path, config=CONFIG)
        replicas, leader = await cluster.start_group(1)
        try:
            node = cluster.nodes[leader]
            held, frames = node.network.stats.appends_held_back, node.network.stats.frames_sent
            for k in range(PROPOSALS):
                await replicas[leader].propose(b"x%d" % k)
            held = node.network.stats.appends_held_back - held
            per_proposal = (node.network.stats.frames_sent - frames) / PROPOSALS
            assert held >= PROPOSALS, held  # about one per follower per proposal
            assert per_proposal < 3.5, per_proposal  # 4.6 before
            last = b"x%d" % (PROPOSALS - 1)
            await wait_until(
                lambda: all(r.machine.value == last for r in replicas.values()),
                3 * CONFIG.heartbeat_interval_s + 2,
                "a follower never applied the last command",
            )

            follower = next(n for n in replicas if n != leader)
            started = time.monotonic()
            for k in range(30):
                assert await replicas[follower].propose(b"f%d" % k) == b"f%d" % k
            took = time.monotonic() - started
            assert took < 30 * CONFIG.heartbeat_interval_s / 4, took  # 12 s if each waited

            prompt = {
                n: await node.add_group(2, Register(), prompt_commit_index=True)
                for n, node in cluster.nodes.items()
            }
            await wait_until(lambda: ready_leader(prompt) is not None, 10, "no leader of 2")
            held = sum(n.network.stats.appends_held_back for n in cluster.nodes.values())
            for k in range(20):
                await prompt[str(ready_leader(prompt))].propose(b"p%d" % k)
            now_held = sum(n.network.stats.appends_held_back for n in cluster.nodes.values())
            assert now_held == held  # group 1 is idle: its heartbeats are far apart
        finally:
            await cluster.stop()

    asyncio.run(asyncio.wait_for(scenario(), 90))


class SlowRegister(Register):
    """A Register whose applies take SLOW_APPLY_S once `slow` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.slow = False

    def apply(self, command: bytes) -> bytes:
        if self.slow:
            time.sleep(SLOW_APPLY_S)
        return super().apply(command)


def test_a_followers_acknowledgement_does_not_wait_for_its_applies(tmp_path: Path) -> None:
    async def scenario() -> list[float]:
        cluster = InProcessCluster(tmp_path, config=CONFIG)
        machines = {n: SlowRegister() for n in cluster.nodes}
        replicas = {n: await node.add_group(1, machines[n]) for n, node in cluster.nodes.items()}
        await cluster.start()
        try:
            await wait_until(lambda: ready_leader(replicas) is not None, 10, "no leader")
            leader = str(ready_leader(replicas))
            for n, machine in machines.items():
                machine.slow = n != leader
            latencies = []
            for k in range(8):
                started = time.monotonic()
                await replicas[leader].propose(b"s%d" % k)
                latencies.append(time.monotonic() - started)
                # The followers finish their applies; the commit index of this proposal
                # reaches them with the next one's entries (the heartbeat is 0.4 s apart).
                await asyncio.sleep(2 * SLOW_APPLY_S)
            return latencies
        finally:
            await cluster.stop()

    latencies = sorted(asyncio.run(asyncio.wait_for(scenario(), 60)))
    # Each proposal's entries carry the commit of the one before: a follower that applied
    # it before acknowledging them made every proposal wait SLOW_APPLY_S (all but the few
    # whose commit index came with a heartbeat instead).
    assert latencies[len(latencies) // 2] < SLOW_APPLY_S / 2, latencies

"""Proves that a follower cut off from its leader answers proposals promptly
(`Replica.leader_lost`, raft/README.md "Linearizable reads (ReadIndex), pre-vote and
check-quorum") on in-process nodes whose links the test cuts (raft_harness.InProcessCluster):

- bridge: on 3 nodes the link between the leader and one follower is cut; the third still
  links both, so the leader stays and no new one is elected while the cut lasts. A proposal
  the follower forwarded just after the cut fails (outcome unknown) once the follower gives
  its leader up, about an election timeout later, not at its 10 s deadline; every later
  proposal there is refused at once (NotLeader, nothing proposed); writes through the
  leader commit meanwhile; once healed the follower's proposals commit again;
- an isolated leader: a proposal through a follower is refused promptly while the other
  two elect a leader, and succeeds through the same follower once they have; a proposal
  the isolated leader appended but cannot commit fails (outcome unknown) once
  check-quorum steps it down (`Replica.give_up_commits`), not at its deadline.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from raft_harness import InProcessCluster, ready_leader
from raft_harness import wait_until_async as wait_until

from raft import NotLeader, OutcomeUnknown, RaftConfig

REQUEST_TIMEOUT_S = 10.0  # a broker's request timeout: what a proposal used to wait


async def timed_propose(replica: object, command: bytes) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        await replica.propose(command, timeout_s=REQUEST_TIMEOUT_S)  # type: ignore[attr-defined]
    except (NotLeader, OutcomeUnknown) as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def test_bridge_a_follower_cut_from_its_leader_refuses_at_once(tmp_path: Path) -> None:
    config = RaftConfig()
    prompt_s = config.election_timeout_max_s + 0.5  # its election deadline, plus slack

    async def scenario() -> None:
        cluster = InProcessCluster(tmp_path, config=config)
        replicas, leader = await cluster.start_group(1)
        try:
            follower = next(n for n in replicas if n != leader)
            await replicas[follower].propose(b"before", timeout_s=5.0)
            cluster.cut(leader, follower)
            # Forwarded into the cut: unknown, but known to be so within an election timeout.
            took, error = await timed_propose(replicas[follower], b"into-the-cut")
            assert isinstance(error, OutcomeUnknown | NotLeader), error
            assert took < prompt_s, f"the forwarded proposal waited {took:.2f} s"
            refusals = []
            for k in range(10):
                took, error = await timed_propose(replicas[follower], b"r%d" % k)
                assert isinstance(error, NotLeader), error
                refusals.append(took)
                await replicas[leader].propose(b"w%d" % k, timeout_s=5.0)  # the leader writes
            # The first may wait for the follower to give its leader up; then at once (the
            # bound is loose for a loaded machine: waiting for the cut shows as >= prompt_s).
            assert refusals[0] < prompt_s and max(refusals[1:]) < prompt_s / 2, f"took {refusals}"
            assert ready_leader(replicas) == leader
            cluster.heal(leader, follower)
            await wait_until(
                lambda: not replicas[follower].leader_lost(time.monotonic()),
                5,
                "the follower never heard its leader again",
            )
            took, error = await timed_propose(replicas[follower], b"after-heal")
            assert error is None, error
        finally:
            await cluster.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_follower_whose_leader_is_isolated_refuses_then_writes_through_the_new_one(
    tmp_path: Path,
) -> None:
    config = RaftConfig()

    async def scenario() -> None:
        cluster = InProcessCluster(tmp_path, config=config)
        replicas, old = await cluster.start_group(1)
        try:
            others = sorted(n for n in replicas if n != old)
            await replicas[others[0]].propose(b"before", timeout_s=5.0)
            for n in others:
                cluster.cut(old, n)
            cut_at = time.monotonic()
            # In the isolated leader's log, never committed while the cut lasts: it fails
            # once check-quorum steps the leader down, not at its 10 s deadline.
            stranded = asyncio.ensure_future(timed_propose(replicas[old], b"stranded"))
            attempts: list[tuple[float, BaseException | None]] = []
            while True:
                took, error = await timed_propose(replicas[others[0]], b"x%d" % len(attempts))
                attempts.append((took, error))
                if error is None:
                    break
                assert time.monotonic() - cut_at < 8, f"no write through a new leader: {attempts}"
                await asyncio.sleep(0.05)
            slowest = max(took for took, _ in attempts)
            assert slowest < config.election_timeout_max_s + 0.5, attempts
            new = ready_leader({n: replicas[n] for n in others})
            assert new is not None and new != old
            took, error = await stranded
            assert isinstance(error, OutcomeUnknown), error
            assert took < config.leader_step_down_s + 0.5, f"it waited {took:.2f} s"
        finally:
            await cluster.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_group_that_never_had_a_leader_is_not_lost(tmp_path: Path) -> None:
    """leader_lost is about a leader that went silent: a just-opened replica waits for its
    group's first election as before (its proposals are retried, not refused)."""

    async def scenario() -> None:
        cluster = InProcessCluster(tmp_path)
        replicas = await cluster.add_group(1)
        try:
            assert not any(r.leader_lost(time.monotonic() + 60) for r in replicas.values())
            await cluster.start()
            # Proposed before any leader: retried until the first election, then committed.
            await replicas["n1"].propose(b"first", timeout_s=REQUEST_TIMEOUT_S)
        finally:
            await cluster.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_command_for_a_leader_whose_link_is_down_is_proposed_again(tmp_path: Path) -> None:
    """The follower still hears its leader (the leader's own connection is up) but its
    link to the leader is down and reconnects only after 1 s (as after a heal): the
    forwarded command never leaves, fails as not applied (GroupTransport._unsent_command)
    and is proposed again once the link is back, not lost until its 10 s deadline."""

    async def scenario() -> None:
        cluster = InProcessCluster(tmp_path)
        replicas, leader = await cluster.start_group(1)
        try:
            follower = next(n for n in replicas if n != leader)
            await replicas[follower].propose(b"before", timeout_s=5.0)
            network = cluster.nodes[follower].network

            def drop_link() -> None:
                link = network._outbound[leader]
                network._close_outbound(link, notify=True)
                link.next_attempt_at = time.monotonic() + 1.0

            await cluster.nodes[follower]._on_tick_thread(drop_link)
            took, error = await timed_propose(replicas[follower], b"while-down")
            assert error is None, error
            assert 0.5 < took < 3.0, f"took {took:.2f} s"
        finally:
            await cluster.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))

"""Proves ReadIndex (raft/read_index.py, Replica.read_index) on in-process nodes:

- a read on the leader returns an index at least the commit index of every write
  acknowledged before it began, and the leader's state machine has applied it;
- reads are batched: 300 concurrent reads cost at most 30 confirmation rounds, not 300;
- a quiesced group answers reads and stays quiesced (its followers ack without a tick);
- a follower refuses at once (NotLeader, naming the leader);
- a leader cut off from both followers, that still believes it leads (check-quorum set
  to 30 s so it does not step down), never answers a read once the others elected a new
  leader and committed a write there: the read times out instead of returning stale;
- the bookkeeping, property-tested: a read is answered only once a majority acked a
  round sent after it was recorded, in the leader's term, and its index is applied.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from raft_harness import InProcessCluster, ready_leader
from raft_harness import wait_until_async as wait_until

from raft import RaftConfig
from raft.errors import NotLeader, Timeout
from raft.read_index import PendingRead, ReadIndexState, ack_for


def test_reads_on_the_leader_see_every_acknowledged_write_and_are_batched(tmp_path: Path) -> None:
    # One leader throughout is this test's premise, so elections are slow: with the
    # defaults (0.4-0.8 s), a full run's load once stalled the three in-process nodes long
    # enough to elect again mid-test (NotLeader, "no leader known").
    config = RaftConfig(
        election_timeout_min_s=3.0, election_timeout_max_s=6.0, leader_step_down_s=6.0
    )

    async def scenario() -> None:
        cluster = InProcessCluster(tmp_path, config=config)
        replicas, _ = await cluster.start_group(1)
        try:
            leader = replicas[str(ready_leader(replicas))]
            for k in range(5):
                await leader.propose(b"w%d" % k)
                commit = leader.status().commit_index
                index = await leader.read_index()
                assert index >= commit
                assert leader.syncobj.raftLastApplied >= index
                assert leader.machine.value == b"w%d" % k
            rounds = leader.reads.rounds_sent
            indexes = await asyncio.gather(*(leader.read_index() for _ in range(300)))
            assert min(indexes) >= commit
            # One round per read would be 300. The tick thread may run rounds while the loop
            # is still handing the reads over (the GIL switches between them), so a loaded
            # machine spreads them over more rounds: 14 were seen in a full run.
            assert leader.reads.rounds_sent - rounds <= 30, "reads were not batched"
            everyone = list(replicas.values())

            def quiesced() -> bool:
                return leader.lead_quiesce == "quiesced" and all(
                    r.quiesced_leader is not None for r in everyone if r is not leader
                )

            await wait_until(quiesced, 10, "the idle group did not quiesce")
            assert await leader.read_index() >= commit
            assert quiesced(), "a read woke the quiesced group"
            follower = next(r for r in replicas.values() if r is not leader)
            with pytest.raises(NotLeader) as refused:
                await follower.read_index()
            assert refused.value.leader_id == leader.node.node_id
        finally:
            await cluster.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_deposed_leader_that_believes_it_leads_answers_no_read(tmp_path: Path) -> None:
    config = RaftConfig(leader_step_down_s=30.0)  # no check-quorum: ReadIndex alone

    async def scenario() -> None:
        cluster = InProcessCluster(tmp_path, config=config)
        replicas, _ = await cluster.start_group(1)
        try:
            old = str(ready_leader(replicas))
            await replicas[old].propose(b"before")
            others = [n for n in replicas if n != old]
            for n in others:
                cluster.cut(old, n)
            pending = asyncio.ensure_future(replicas[old].read_index(timeout_s=4.0))

            def new_leader() -> bool:
                return any(replicas[n].status().is_leader for n in others)

            await wait_until(new_leader, 10, "the majority elected no leader")
            fresh = next(replicas[n] for n in others if replicas[n].status().is_leader)
            await fresh.propose(b"after")
            assert replicas[old].status().is_leader, "the old leader stepped down: no test"
            with pytest.raises(Timeout):
                await pending  # never an answer from the old leader's state ("before")
            assert replicas[old].machine.value == b"before"
        finally:
            await cluster.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


@settings(max_examples=60, deadline=None)
@given(
    followers=st.integers(0, 4),
    steps=st.lists(
        st.tuples(st.sampled_from(["read", "round", "ack", "apply"]), st.integers(0, 4)),
        max_size=40,
    ),
)
def test_a_read_is_answered_only_after_a_majority_acked_a_later_round(
    followers: int, steps: list[tuple[str, int]]
) -> None:
    """Model: commit index and applied index grow; acks come for rounds already sent."""
    names = [f"f{k}" for k in range(followers)]
    state = ReadIndexState()
    state.new_term(7)
    answered: list[tuple[int, int]] = []  # (read id, index)
    recorded: dict[int, tuple[int, int]] = {}  # read id -> (index, round that covers it)
    acks: dict[str, int] = {}
    commit = applied = 0
    for kind, arg in steps:
        if kind == "read":
            rid = len(recorded)
            state.incoming.append(PendingRead(lambda i, e, rid=rid: answered.append((rid, i))))
            commit += arg
            if state.record(commit):
                state.next_round()
            recorded[rid] = (commit, state.seq)
        elif kind == "ack" and names and state.seq:
            peer = names[arg % len(names)]
            seq = 1 + arg % state.seq
            if state.on_ack(peer, 7, seq):
                acks[peer] = max(acks.get(peer, 0), seq)
            assert not state.on_ack(peer, 6, seq), "an ack of another term counted"
        elif kind == "apply":
            applied = min(commit, applied + arg)
        state.answer_ready(state.confirmed(names), applied)
        for rid, index in answered:
            want_index, seq = recorded[rid]
            assert index == want_index and index <= applied
            majority = sum(acks.get(p, 0) >= seq for p in names) + 1 > (len(names) + 1) / 2
            assert majority, "answered before a majority acked its round"


def test_a_follower_acks_a_read_round_only_from_a_term_not_below_its_own() -> None:
    assert ack_for({"type": "dmq_read", "term": 5, "seq": 3}, 5) == {
        "type": "dmq_read_ack", "term": 5, "seq": 3,
    }  # fmt: skip
    assert ack_for({"type": "dmq_read", "term": 5, "seq": 3}, 4) is not None
    assert ack_for({"type": "dmq_read", "term": 5, "seq": 3}, 6) is None

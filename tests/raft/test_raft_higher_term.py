"""Proves that a member whose term is above its leader's is never left behind
(raft/higher_term.py), on in-process nodes whose links the test cuts
(raft_harness.InProcessCluster), with pre-vote and check-quorum on as dmq runs them:

- a follower cut off from both others is made to campaign several times with pre-vote
  bypassed (as a leadership transfer's TimeoutNow does), so its term rises above the
  leader's while the leader goes on committing with the third node. Once the cut heals,
  within a few election timeouts the group has a leader of a term above the raised one,
  the follower's commit index reaches the leader's, and it applies a new entry. Without
  the answer with the higher term (the fix) pysyncobj drops the leader's lower-term
  append_entries unanswered, the leader keeps its majority, and the follower stays behind
  for good;
- the same, but the leader is cut off from both others as the follower comes back: the
  remaining follower, whose log is the longer, asks for a pre-vote of a term not above the
  raised one, is answered with the raised term (as etcd answers MsgPreVote), takes it, and
  wins the next pre-vote and election; the follower left behind catches up from it.
  Without that answer neither could ever win (one's term too low, the other's log);
- the rule itself: which messages are answered with the higher term, and which terms are
  taken.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from raft_harness import InProcessCluster, ready_leader
from raft_harness import wait_until_async as wait_until

from raft import RaftConfig, higher_term, prevote, quiesce, read_index

# Elections the cut-off follower runs on its own: its term ends this far above the leader's.
FORCED_ELECTIONS = 4
# How long the group may take to take the follower back, in maximum election timeouts: the
# leader steps down on the first heartbeat answered, then one pre-vote round (refused while
# the third node still hears its old leader, up to one timeout) and one election. The
# margin is for a loaded 2-core machine; without the fix it never happens at all.
REJOIN_ELECTION_TIMEOUTS = 10


async def force_election(cluster: InProcessCluster, node_id: str, replica: Any) -> None:
    """Make `node_id` campaign now, as a TimeoutNow from its leader would: pre-vote is
    skipped and pysyncobj raises the term (its request_vote goes nowhere: it is cut off)."""
    node = cluster.nodes[node_id]

    def campaign() -> None:
        replica.syncobj._SyncObj__raftElectionDeadline = 0.0
        replica.syncobj._SyncObj__transferInProgress = True
        node._touch(replica)  # ticked and synced in the round that runs this

    term = replica.status().term
    await node.on_tick_thread(campaign)
    await wait_until(lambda: replica.status().term > term, 10, f"{node_id} did not campaign")


async def rejoin_after_a_term_raised_while_cut_off(
    tmp_path: Path, *, leader_gone: bool = False
) -> dict[str, Any]:
    config = RaftConfig()
    cluster = InProcessCluster(tmp_path, config=config)
    replicas, leader = await cluster.start_group(1)
    try:
        behind = sorted(n for n in replicas if n != leader)[0]
        third = next(n for n in replicas if n not in (leader, behind))
        for k in range(5):
            await replicas[leader].propose(b"before-%d" % k, timeout_s=5.0)
        for other in (leader, third):
            cluster.cut(behind, other)
        for _ in range(FORCED_ELECTIONS):
            await force_election(cluster, behind, replicas[behind])
        for k in range(20):  # the leader goes on without it: the follower falls behind
            await replicas[leader].propose(b"during-%d" % k, timeout_s=5.0)
        raised = replicas[behind].status().term
        assert raised > replicas[leader].status().term, "the cut-off term did not rise"
        assert replicas[behind].status().commit_index < replicas[leader].status().commit_index

        if leader_gone:  # it stays cut off from both: only the other two can elect
            cluster.cut(leader, third)
            cluster.heal(behind, third)
        else:
            for other in (leader, third):
                cluster.heal(behind, other)
        healed_at = time.monotonic()
        electable = {third} if leader_gone else {leader, third}

        def rejoined() -> bool:
            now_leader = ready_leader({n: replicas[n] for n in (behind, *electable)})
            if now_leader is None or now_leader not in electable:
                return False
            status = replicas[now_leader].status()
            caught_up = replicas[behind].status().commit_index >= status.commit_index
            return bool(status.term > raised and caught_up)

        bound_s = REJOIN_ELECTION_TIMEOUTS * config.election_timeout_max_s
        await wait_until(rejoined, bound_s, f"{behind} (term {raised}) never rejoined")
        took_s = time.monotonic() - healed_at
        new_leader = str(ready_leader({n: replicas[n] for n in (behind, *electable)}))
        await replicas[new_leader].propose(b"after", timeout_s=5.0)
        await wait_until(
            lambda: replicas[behind].machine.value == b"after", 5, "the new entry not applied"
        )
        return {
            "took_s": took_s,
            "taken": sum(node.higher_terms_taken for node in cluster.nodes.values()),
            "answered": cluster.nodes[behind].higher_terms_answered,
        }
    finally:
        await cluster.stop()


def test_a_follower_whose_term_rose_while_cut_off_rejoins_once_healed(tmp_path: Path) -> None:
    seen = asyncio.run(asyncio.wait_for(rejoin_after_a_term_raised_while_cut_off(tmp_path), 90))
    # How it rejoined: it answered the old leader's heartbeats with its term, and a node
    # (the old leader at least) took that term.
    assert seen["answered"] >= 1 and seen["taken"] >= 1, seen


def test_with_the_leader_gone_the_other_follower_learns_the_term_and_takes_it_back(
    tmp_path: Path,
) -> None:
    run = rejoin_after_a_term_raised_while_cut_off(tmp_path, leader_gone=True)
    seen = asyncio.run(asyncio.wait_for(run, 90))
    assert seen["answered"] >= 1 and seen["taken"] >= 1, seen


def test_only_a_lower_terms_leader_or_candidate_messages_are_answered() -> None:
    heartbeat = {"type": "append_entries", "term": 4, "commit_index": 9, "prevLogIdx": 9,
                 "prevLogTerm": 4, "entries": ()}  # fmt: skip
    assert higher_term.answer_for("append_entries", heartbeat, 7) == {
        "type": higher_term.HIGHER_TERM,
        "term": 7,
    }
    assert higher_term.answer_for("append_entries", heartbeat, 4) is None  # its own term
    for kind in (read_index.READ, quiesce.QUIESCE, quiesce.UNQUIESCE):
        assert higher_term.answer_for(kind, {"type": kind, "term": 4}, 7) is not None
    # A pre-vote asks for its sender's term + 1: asking for 7 means the sender is at 6.
    assert higher_term.answer_for(prevote.PREVOTE, prevote.request(6, 9, 4), 7) is not None
    assert higher_term.answer_for(prevote.PREVOTE, prevote.request(7, 9, 4), 7) is None
    # Replies and votes are not a leader's: never answered, whatever their term.
    for kind in ("next_node_idx", "request_vote", "response_vote", quiesce.QUIESCED):
        assert higher_term.answer_for(kind, {"type": kind, "term": 1}, 7) is None
    assert higher_term.answer_for("append_entries", {"term": "4"}, 7) is None
    assert higher_term.newer_term({"type": higher_term.HIGHER_TERM, "term": 7}, 4) == 7
    assert higher_term.newer_term({"type": higher_term.HIGHER_TERM, "term": 4}, 4) is None
    assert higher_term.newer_term({"type": higher_term.HIGHER_TERM, "term": True}, 0) is None

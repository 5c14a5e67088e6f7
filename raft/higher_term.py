"""A node whose term is higher than its leader's is never left behind: it answers the
leader's messages with its term, and the leader steps down (etcd-io/raft's rule).

How a node gets there: a leadership transfer (TimeoutNow) skips pre-vote, so a node that
was asked to take over and is then cut off campaigns again and again; an older build
without pre-vote did the same. Its term is then above the leader's. pysyncobj 0.3.17 drops
an append_entries of a lower term without an answer, and its replies (next_node_idx) carry
no term, so the leader never learns the higher term. With pre-vote and check-quorum on, as
dmq runs them, nothing else tells it either: the node's pre-votes are refused (the leader
never grants one, and the others hear a live leader), and the leader keeps its majority.
The node stayed behind for good (issue 39: a metadata replica at index 57 while the others
reached 578, still so after a restart of every broker).

etcd's raft.go (`Step`, the case `m.Term < r.Term`) says why it answers such messages when
checkQuorum or preVote is on: without the answer, a node that advanced its term during a
partition could never rejoin, because its own higher-term messages no longer disrupt the
leader. The same rule here (raft/node.py calls these functions; the message is in
raft/wire.py):

1. **answer** (any member, on the tick thread, before pysyncobj sees the message): a
   message that only a leader sends (append_entries, which heartbeats are too, a
   confirmation round's READ, QUIESCE, UNQUIESCE) whose term is below this node's, or a
   PREVOTE asking for a term not above this node's (its sender's term is below), is
   answered HIGHER_TERM {term: this node's term}. The message itself goes on as before
   (pysyncobj ignores it; the pre-vote is refused). Only members are answered: no one
   else can be a leader or candidate of the group.
2. **step down** (the leader, or a candidate, receiving HIGHER_TERM from a member with a
   term above its own): Raft's rule for any message of a later term, which pysyncobj
   applies to request_vote and append_entries only: take that term with no vote, become a
   follower, follow no leader (proposals it held fail OutcomeUnknown, as at check-quorum).
   The term is in the journal's meta file before any reply of the round leaves (the node
   syncs the replica in that round).
3. **elect again**: the deposed leader's election deadline has passed (a leader does not
   move it), so it asks for pre-votes for the new term + 1 at once; the others grant it
   once they have not heard a leader for an election timeout, the node left behind grants
   it if the asker's log is as up to date as its own, and the winner's append_entries
   carry a term the node accepts: it catches up. A member still at the old term that asks
   for pre-votes first is answered HIGHER_TERM (step 1) and takes the term too.

Nothing here is needed for safety (Raft is safe whatever terms nodes hold); it is for
liveness, and it never lets a node with a stale log win: elections still need a majority
of up-to-date votes. It does not disturb a healthy group: a term above the leader's exists
only where some node campaigned without winning.

This module imports nothing of raft/ but the message names it answers: raft/wire.py
encodes HIGHER_TERM.
"""

from __future__ import annotations

from typing import Any

from raft import prevote, quiesce, read_index

HIGHER_TERM = "dmq_higher_term"  # member -> leader or candidate of a lower term: {term}

# Messages only a leader sends, in its term: a lower one means a stale leader (step 1).
LEADER_MESSAGES = frozenset({"append_entries", read_index.READ, quiesce.QUIESCE, quiesce.UNQUIESCE})


def answer_for(kind: Any, message: Any, current_term: int) -> dict[str, Any] | None:
    """Step 1: HIGHER_TERM for a message from a leader or candidate of a lower term, else
    None. A PREVOTE carries the term its sender asks for, its own term + 1."""
    term = message.get("term") if isinstance(message, dict) else None
    if type(term) is not int:
        return None
    stale = (kind in LEADER_MESSAGES and term < current_term) or (
        kind == prevote.PREVOTE and term <= current_term
    )
    return {"type": HIGHER_TERM, "term": current_term} if stale else None


def newer_term(message: Any, current_term: int) -> int | None:
    """Step 2: the term a HIGHER_TERM tells this node to take, or None if not above its own."""
    term = message.get("term") if isinstance(message, dict) else None
    return term if type(term) is int and term > current_term else None

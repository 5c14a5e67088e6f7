"""Pre-vote: a node asks whether it could win before it raises its term (Raft dissertation 9.6).

pysyncobj 0.3.17 starts an election as soon as a follower's election deadline passes: it
raises its term and asks for votes. A node cut off from the leader but not from the others
(a bridge partition, a flapping link) then raises its term again and again, and each higher
term it sends deposes the leader that a majority still follows: on 5 nodes jepsen/ saw no
send acknowledged for 17 s. With pre-vote (the hooks are in raft/replica.py and
raft/node.py):

1. **hold** (`Replica.maybe_hold_election`, just before each tick): a follower or
   candidate whose election deadline has passed does not let pysyncobj campaign. It moves
   its deadline one random election timeout on and sends PREVOTE {term: its term + 1,
   last_log_index, last_log_term} to the group's other members. Not held: a leadership
   transfer (pysyncobj's TimeoutNow, the leader asked for it), a one-member group, a node
   connected to nobody (pysyncobj would not campaign either).
2. **answer** (any member, on the tick thread, without a tick): PREVOTE_ANSWER {term,
   granted}, granted iff the asked term is above its own, the asker's log is at least as
   up to date as its own (Raft's voting rule), and it has not heard from a live leader
   within the minimum election timeout: it is not the leader itself, and it has not had
   an append_entries from the leader it follows (or, quiesced, a frame from that leader's
   node) that recently (`grant`). Nothing changes on the answering node: no term, no vote,
   no deadline.
3. **campaign**: once a majority of the group (the asker included) granted the term it
   asked for, while its term is still the one below it, the node sets pysyncobj's election
   deadline to 0 and is ticked: pysyncobj runs its ordinary election (term + 1,
   request_vote). A pre-vote round that does not reach a majority simply ends at the next
   deadline, which starts a new one.

Check-quorum is pysyncobj's own: a leader that had no reply from a majority within
`leader_step_down_s` (dmq sets it to the maximum election timeout) steps down
(`leaderFallbackTimeout`). Together: a node that the leader's majority still hears never
gets a pre-vote majority, so it never raises its term and never deposes that leader; a
leader that lost its majority steps down within an election timeout, and the majority,
hearing no leader, grants pre-votes and elects one. Safety does not rest on any of it:
pre-vote only withholds elections that Raft would allow.

This module imports nothing of raft/: raft/wire.py encodes its messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PREVOTE = "dmq_prevote"  # candidate -> member: {term, last_log_index, last_log_term}
PREVOTE_ANSWER = "dmq_prevote_answer"  # member -> candidate: {term, granted}
PREVOTE_TYPES = frozenset({PREVOTE, PREVOTE_ANSWER})


@dataclass(slots=True)
class PreVoteRound:
    """A node's pre-vote in progress: the term it asks for and who granted it."""

    term: int
    grants: set[str] = field(default_factory=set)


def request(term: int, last_log_index: int, last_log_term: int) -> dict[str, Any]:
    return {
        "type": PREVOTE,
        "term": term + 1,
        "last_log_index": last_log_index,
        "last_log_term": last_log_term,
    }


def grant(
    message: dict[str, Any],
    *,
    current_term: int,
    last_log_index: int,
    last_log_term: int,
    leader_alive: bool,
) -> bool:
    """Step 2: whether a member would vote for the asker in the term it asks for."""
    term = message.get("term")
    their_term = message.get("last_log_term")
    their_index = message.get("last_log_index")
    if not (isinstance(term, int) and isinstance(their_term, int) and isinstance(their_index, int)):
        return False
    if leader_alive or term <= current_term:
        return False
    return their_term > last_log_term or (
        their_term == last_log_term and their_index >= last_log_index
    )


def answer(message: dict[str, Any], granted: bool) -> dict[str, Any]:
    return {"type": PREVOTE_ANSWER, "term": message.get("term", 0), "granted": granted}


def won(round_: PreVoteRound | None, members: int) -> bool:
    """Step 3: a majority of the group (the asker counts itself) granted the round."""
    return round_ is not None and len(round_.grants) + 1 > members / 2

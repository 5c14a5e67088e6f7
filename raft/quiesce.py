"""Quiesced groups: an idle, caught-up group sends no heartbeats; node liveness stands in.

At 1,000 groups per node, per-group heartbeats (a frame to each follower and its reply every
heartbeat_interval_s, and a tick for each) were most of an idle node's CPU. A group that is
idle and fully replicated has nothing to say; what its followers need from heartbeats is
only "the leader is alive", and that is a property of the leader's *node*, which
raft/transport.py now proves for every group at once (`Network.last_heard`, refreshed by
any frame and by a node heartbeat every heartbeat_interval_s).

The protocol, with the states of raft/replica.py (`Replica.lead_quiesce`, `quiesced_leader`):

1. A leader whose group is idle and caught up after a tick (`Replica.quiesce_ready`: no
   proposal waiting or in flight, journal synced, commit == applied == last index, every
   connected follower's match index at the last index), and has been since a tick at
   least IDLE_HEARTBEATS heartbeat intervals ago, sends QUIESCE(term, last, last_term)
   to its connected followers and becomes *quiescing*: it still ticks and heartbeats.
2. A follower accepts QUIESCE only if it follows that leader in that term and holds the
   same last entry, committed (Log Matching: then it holds the leader's whole log). It
   answers QUIESCED and becomes *quiesced*: it is no longer ticked. Plain heartbeats from
   its leader keep it quiesced (`is_leader_heartbeat`); any other message for the group,
   or a proposal, un-quiesces it first.
3. The leader becomes *quiesced* once every connected follower answered: no tick, no
   heartbeat. A caught-up reply (`is_caught_up_reply`) keeps it so; any other message,
   a proposal, a follower's node reconnecting, a WAKE from a member whose replica was just
   opened (`add_group`), or a leadership transfer un-quiesces it:
   it sends UNQUIESCE to every follower and ticks (heartbeats resume at once, since one is
   long overdue). Leaving *quiescing* for any reason (it is not ready any more, or lost
   leadership) also sends UNQUIESCE, so no follower stays quiesced under a leader that
   has gone back to ticking or stopped leading.
4. Liveness: a quiesced follower is looked at again when its leader's node has been silent
   for its own random election timeout (`follower_wake_at`); then pysyncobj's election
   deadline is set to that moment and it is ticked: it starts an election as it would have
   without heartbeats, so failover time is unchanged. A quiesced leader is looked at when
   fewer than a majority of its group's nodes were heard from within leader_step_down_s
   (`leader_wake_at`); then pysyncobj's response times are set to those node times and it
   is ticked, and pysyncobj steps down exactly as it would have.

Safety does not depend on any of this (Raft's does not rest on heartbeats); a lost or late
control message at worst costs an election, as a lost heartbeat would.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

QUIESCE = "dmq_quiesce"  # leader -> follower: {term, last, last_term, round}
QUIESCED = "dmq_quiesced"  # follower -> leader: {term, last, round}
UNQUIESCE = "dmq_unquiesce"  # leader -> follower: {term}
WAKE = "dmq_wake"  # a replica just opened -> the other members: {term}
CONTROL_TYPES = frozenset({QUIESCE, QUIESCED, UNQUIESCE, WAKE})
# A quiescing leader sends QUIESCE again to followers that did not answer, at most this often
# (a follower whose group is not open yet never answers; the leader keeps heartbeating it).
QUIESCE_RETRY_S = 1.0
# A leader quiesces only once its group was ready at every tick for this many heartbeat
# intervals, so at its first heartbeat tick after the last commit. Quiescing at the commit
# itself put QUIESCE, QUIESCED and UNQUIESCE around every request of a client sending one at
# a time (six frames and four wake-ups of a follower per record, #22), for an idle period
# too short to save any heartbeat.
IDLE_HEARTBEATS = 1.0


def is_leader_heartbeat(message: Any, from_leader: bool, term: int, last_index: int) -> bool:
    """An empty append_entries from the leader that tells a caught-up follower nothing new."""
    return (
        from_leader
        and isinstance(message, dict)
        and message.get("type") == "append_entries"
        and not message.get("entries")
        and "serialized" not in message
        and "transmission" not in message
        and message.get("term") == term
        and message.get("prevLogIdx") == last_index == message.get("commit_index")
    )


def is_caught_up_reply(message: Any, last_index: int) -> bool:
    """A follower's success reply acknowledging the leader's whole log."""
    return (
        isinstance(message, dict)
        and message.get("type") == "next_node_idx"
        and bool(message.get("success"))
        and not message.get("reset")
        and message.get("next_node_idx") == last_index + 1
    )


def follower_wake_at(last_heard: dict[str, float], leader_id: str, timeout_s: float) -> float:
    """When a quiesced follower must act: its leader's node silent for its election timeout."""
    return last_heard.get(leader_id, 0.0) + timeout_s


def leader_wake_at(
    last_heard: dict[str, float], followers: Iterable[str], members: int, step_down_s: float
) -> float | None:
    """When a quiesced leader must tick: no majority of its group heard within step_down_s.

    None for a one-node group (it is its own majority). The leader counts itself, so it
    needs members // 2 followers heard from.
    """
    needed = members // 2
    if needed == 0:
        return None
    heard = sorted((last_heard.get(peer, 0.0) for peer in followers), reverse=True)
    return heard[needed - 1] + step_down_s

"""Membership of one Raft group at run time, through pysyncobj's own mechanisms.

pysyncobj 0.3.17 changes a group's members one server at a time (Raft's single-server
change, `dynamicMembershipChange=True`): the leader appends an `add`/`rem` entry and the
new configuration takes effect on every member as soon as the entry is in its log (on
append, not on commit, as the Raft thesis prescribes). A second change is refused
(REQUEST_DENIED) until the first is applied, and none is accepted before the leader's
no-op of its term is applied. `transferLeadership` (Raft's TimeoutNow) moves the
leadership to a caught-up member. raft/ adds nothing to the protocol; this module only
runs those calls on the node's tick thread and reports back.

Everything here runs on the tick thread (RaftNode wraps each call with `_on_tick_thread`).

Steps of one change as `RaftNode.change_membership(group, "add" | "remove", member)` runs
them (the caller orders the changes; dmq/broker/operations.py adds before it removes):

1. On the group's leader only (else NotLeader naming the leader): a member already in
   (add) or already out (remove) of the configuration, with no change pending, is done
   (idempotent: a retried step after a crash finds it done).
2. A change pending (appended, not yet applied): RequestDenied, retry later.
3. Otherwise pysyncobj's addNodeToCluster / removeNodeFromCluster; the returned future
   resolves when the entry is committed (FAIL_REASON.SUCCESS) or fails. A leader cannot
   remove itself (pysyncobj refuses): transfer the leadership first.

A replica that is not in a group's configuration cannot disrupt it: RaftNode drops its
`request_vote` messages (a new replica opened before the leader added it, or one removed
and not yet deleted, would otherwise bump the term with elections it cannot win). Refusing
a vote is always safe in Raft; it only costs liveness if the refusing member lags behind a
configuration that includes the candidate, and then the members that hold it vote.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from typing import Any, Literal

from pysyncobj import FAIL_REASON
from pysyncobj.node import Node
from pysyncobj.syncobj import _COMMAND_TYPE

from raft import safe_pickle
from raft.errors import NotLeader, RequestDenied
from raft.replica import Replica

Action = Literal["add", "remove"]


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """A leader's view of its group: who is in it and how far each member's log is."""

    group_id: int
    leader_id: str
    term: int
    commit_index: int
    last_index: int
    members: tuple[str, ...]  # the configuration, sorted, leader included
    match_index: dict[str, int]  # member -> highest index known replicated there
    change_pending: bool  # a membership entry appended and not yet applied
    # member -> seconds since the leader last heard an answer from it (a quiesced group
    # exchanges nothing: a member holding the whole log is current whatever its age).
    response_age_s: dict[str, float]

    def caught_up(self, member: str, lag_entries_max: int = 0) -> bool:
        """Whether `member` holds the log up to the commit index (minus a tolerated lag)."""
        if member == self.leader_id:
            return True
        return self.match_index.get(member, 0) >= self.commit_index - lag_entries_max

    def to_json(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "leader": self.leader_id,
            "term": self.term,
            "commit_index": self.commit_index,
            "last_index": self.last_index,
            "members": list(self.members),
            "match_index": dict(self.match_index),
            "change_pending": self.change_pending,
            "response_age_s": {k: round(v, 3) for k, v in self.response_age_s.items()},
        }


def is_member(replica: Replica, node_id: str) -> bool:
    if node_id == replica.node.node_id:
        return True
    return any(str(n.id) == node_id for n in replica.syncobj._SyncObj__otherNodes)


def change_pending(replica: Replica) -> bool:
    """pysyncobj's own rule (`__changeCluster`): a change appended at an index not yet
    applied blocks the next one."""
    sync_obj = replica.syncobj
    index = sync_obj._SyncObj__changeClusterIDx
    return index is not None and sync_obj.raftLastApplied < index


def require_leader(replica: Replica) -> None:
    sync_obj = replica.syncobj
    if not sync_obj._isLeader():
        leader = sync_obj._getLeader()
        leader_id = None if leader is None else str(leader.id)
        raise NotLeader(replica.group_id, leader_id, replica.node.address_of(leader_id))


def progress(replica: Replica) -> GroupProgress:
    """The leader's view (NotLeader elsewhere)."""
    require_leader(replica)
    sync_obj = replica.syncobj
    match: dict[Any, int] = sync_obj._SyncObj__raftMatchIndex
    responses: dict[Any, float] = sync_obj._SyncObj__lastResponseTime
    now = time.monotonic()
    return GroupProgress(
        group_id=replica.group_id,
        leader_id=replica.node.node_id,
        term=int(sync_obj.raftCurrentTerm),
        commit_index=int(sync_obj.raftCommitIndex),
        last_index=int(replica.journal.last_index),
        members=tuple(replica.members),
        match_index={str(node.id): int(index) for node, index in match.items()},
        change_pending=change_pending(replica),
        response_age_s={str(node.id): max(0.0, now - at) for node, at in responses.items()},
    )


def start_change(
    replica: Replica, action: Action, node_id: str
) -> concurrent.futures.Future[bool] | None:
    """Steps 1-3 of the module docstring. None: nothing to do (already so); else a future
    that resolves True once the change entry commits (or raises RequestDenied)."""
    require_leader(replica)
    present = is_member(replica, node_id)
    pending = change_pending(replica)
    if (action == "add") == present:
        if not pending:
            return None
        raise RequestDenied(f"group {replica.group_id}: a membership change is pending")
    if pending:
        raise RequestDenied(f"group {replica.group_id}: a membership change is pending")
    if action == "remove" and node_id == replica.node.node_id:
        raise RequestDenied(
            f"group {replica.group_id}: the leader cannot remove itself; transfer leadership"
        )
    done: concurrent.futures.Future[bool] = concurrent.futures.Future()

    def on_result(_result: Any, reason: int) -> None:
        if done.done():
            return
        if reason == FAIL_REASON.SUCCESS:
            done.set_result(True)
        else:
            done.set_exception(
                RequestDenied(f"group {replica.group_id}: {action} {node_id}: reason {reason}")
            )

    if action == "add":
        replica.syncobj.addNodeToCluster(Node(node_id), on_result)
    else:
        replica.syncobj.removeNodeFromCluster(Node(node_id), on_result)
    return done


def adopt_logged_changes(replica: Replica) -> int:
    """Reopening a group: take on the membership entries of its journal past the applied
    index (Raft's rule: a server uses the latest configuration in its log, committed or
    not). pysyncobj only takes them on when it applies them, i.e. up to the commit index
    its journal persisted (a restart hint, at most 1 s old): a member killed right after
    one or two changes would otherwise reopen with the configuration it was created
    with, whose majority need not overlap the current one's. Returns how many changes it
    took on. Reads every entry after the applied index: for small groups (metadata).
    """
    sync_obj = replica.syncobj
    applied = int(sync_obj.raftLastApplied)
    journal = replica.journal
    taken = 0
    for position in range(len(journal)):
        command, idx, _term = journal[position]
        if idx <= applied or command[:1] != bytes([_COMMAND_TYPE.MEMBERSHIP]):
            continue
        # The same request pysyncobj applies later; applying it twice is a no-op there.
        if sync_obj._SyncObj__doChangeCluster(safe_pickle.load_membership(command[1:])):
            taken += 1
    return taken


def transfer_leadership(replica: Replica, target: str) -> None:
    """Ask pysyncobj to hand the leadership to `target` (a member holding the whole log);
    RequestDenied if it refuses (target not caught up or not connected). The caller polls
    the leader to see it done."""
    require_leader(replica)
    if target == replica.node.node_id:
        return
    nodes = [n for n in replica.syncobj._SyncObj__otherNodes if str(n.id) == target]
    if not nodes:
        raise RequestDenied(f"group {replica.group_id}: {target} is not a member")
    outcome: list[int] = []
    # The callback runs before transferLeadership returns (it only sends timeout_now).
    replica.syncobj.transferLeadership(nodes[0], lambda _r, reason: outcome.append(reason))
    if not outcome or outcome[0] != FAIL_REASON.SUCCESS:
        raise RequestDenied(
            f"group {replica.group_id}: leadership transfer to {target} refused "
            f"(reason {outcome[0] if outcome else None}: not caught up or not connected)"
        )

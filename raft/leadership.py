"""Leader balancing: which groups a node hands to which member, on the tick thread.

`RaftNode.maybe_balance_leaders()` runs this periodically on every node; each node moves
only the groups it leads. No fair-share floor: with 7 groups on 3 nodes, 3/3/1 has every
node at or below ceil(7/3) = 3 and still needs a move (to 2/3/2). Leader counts are this
node's view (each replica's known leader), plus the transfers asked for recently and not
yet seen done, so repeated calls do not move the same surplus twice. A group moves only to
a member leading at least two fewer than this node (no ping-pong between nodes one apart),
and a group with a preferred leader (`Replica.preferred_leader`, the broker's placement
choice) that is not leading it only to that member, while it can take it (a member,
reachable, not avoided) and leads two fewer: leadership goes back where the placement
balanced it, as Kafka's preferred-leader rebalance does, and those groups move first.
Groups led by their preferred member, or whose preferred member cannot take them, move
by the counts alone (the placement's preferred leaders may be uneven after replica
moves). The rule for both is the same count condition, so a group moved off its
preferred member is never moved back by the first rule: no flapping.
pysyncobj's transferLeadership sends the target 'timeout_now' if it holds the whole log
(else it is denied and retried by a later call); the target starts an election at once
and wins it.

A transfer asked for (here, or by `RaftNode.transfer_leadership`) is remembered in the
node's `Transfers` until it is seen done or expires; meanwhile the group is not quiesced.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterable
from typing import Any

from pysyncobj import FAIL_REASON

from raft.replica import Replica

# Leadership transfers accepted per maybe_balance_leaders() call, at most. The broker calls
# it every 5 s on every node: with 4, the 1,000 partitions of a fresh topic on 3 nodes took
# ~160 s to balance once and were not balanced 180 s after the create twice; with 32,
# 36-85 s (3 runs; bench/README.md, "Leader balance after a create"). Each transfer is one
# election in one group; Kafka's preferred-leader election moves every partition at once.
BALANCE_TRANSFERS_MAX = 32

# Transfers asked for and not yet seen done: group id -> (target node id, expiry as
# time.monotonic() seconds).
Transfers = dict[int, tuple[str, float]]


def transfer_expiry(now: float, election_timeout_max_s: float) -> float:
    """When a transfer asked for at `now` counts as failed if not seen done."""
    # A transfer not seen done after an election timeout or two has failed.
    return now + 2 * election_timeout_max_s


def count_leads(
    node_id: str,
    peers: Iterable[str],
    replicas: Iterable[Replica],
    transfers: Transfers,
    now: float,
) -> tuple[collections.Counter[str], list[Replica]]:
    """Groups led per node as this node sees them (a pending transfer counts as done),
    and the replicas this node leads with no transfer pending. Drops from `transfers`
    those done or given up on."""
    leads: collections.Counter[str] = collections.Counter({p: 0 for p in peers})
    mine: list[Replica] = []
    for replica in replicas:
        sync_obj = replica.syncobj
        pending = transfers.get(replica.group_id)
        if pending is not None and (pending[1] < now or not sync_obj._isLeader()):
            del transfers[replica.group_id]  # done, or given up on
            pending = None
        if pending is not None:
            leads[pending[0]] += 1  # as if already moved
        elif sync_obj._isLeader():
            leads[node_id] += 1
            mine.append(replica)
        else:
            leader = sync_obj._getLeader()
            if leader is not None:
                leads[str(leader.id)] += 1
    return leads, mine


def balance(
    node_id: str,
    peers: Iterable[str],
    replicas: Iterable[Replica],
    transfers: Transfers,
    *,
    now: float,
    transfers_max: int,
    election_timeout_max_s: float,
    on_transfer: Callable[[Replica], None],
    avoid: frozenset[str] = frozenset(),
) -> bool:
    """Ask for at most `transfers_max` accepted transfers (module docstring), record them in
    `transfers`, and call `on_transfer` on each replica whose transfer pysyncobj accepted
    (its timeout_now is queued: the node ticks it in this round). True if any was."""
    leads, mine = count_leads(node_id, peers, replicas, transfers, now)
    acted = False
    transfers_done = 0

    # Groups away from their preferred member first (they go home), group 0 (a broker's
    # metadata group) last: its leader is busiest moving.
    def order(replica: Replica) -> tuple[bool, bool, int]:
        home = replica.preferred_leader in (None, node_id)
        return home, replica.group_id == 0, replica.group_id

    for replica in sorted(mine, key=order):
        if transfers_done >= transfers_max:
            break
        # `avoid`: members the caller will not hand leadership to (a full disk).
        candidates = [m for m in replica.members if m != node_id and m not in avoid]
        if not candidates:
            continue
        preferred = replica.preferred_leader  # read once: the event loop may set it
        if preferred in candidates and leads[preferred] + 2 <= leads[node_id]:
            target = preferred  # back where the placement put it
        else:
            target = min(candidates, key=lambda m: (leads[m], m))
            if leads[target] + 2 > leads[node_id]:
                continue
        outcome: list[int] = []
        target_node = next(n for n in replica.syncobj.otherNodes if str(n.id) == target)
        # The callback runs before transferLeadership returns (it only sends a message).
        replica.syncobj.transferLeadership(target_node, functools.partial(_record_reason, outcome))
        if outcome and outcome[0] == FAIL_REASON.SUCCESS:
            transfers_done += 1  # a denied one (target behind) leaves the budget to others
            transfers[replica.group_id] = (target, transfer_expiry(now, election_timeout_max_s))
            leads[target] += 1
            leads[node_id] -= 1
            on_transfer(replica)
            acted = True
    return acted


def _record_reason(outcome: list[int], _result: Any, reason: int) -> None:
    outcome.append(reason)

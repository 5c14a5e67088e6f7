"""The batch plumbing between `Replica.propose()` and pysyncobj, in both directions.

A proposal is one command and the future its proposer awaits (on the event loop). On the
tick thread the waiting proposals of a group are coalesced into batches (group commit:
at most batch_commands_max commands and batch_bytes_max bytes each); a batch is one Raft
entry, pickled here as pysyncobj's `@replicated` call of `GroupSyncObj._apply_batch`
(raft/group_syncobj.py). When the entry is applied, or fails, pysyncobj calls back on the
tick thread with a FAIL_REASON code; `error_for` turns it into a raft/errors.py exception
(no FAIL_REASON leaves the package), and `settle_batch` runs on the event loop to answer
each proposer with its own result.
"""

from __future__ import annotations

import asyncio
import collections
import pickle
from dataclasses import dataclass
from typing import Any

from pysyncobj import FAIL_REASON

from raft.errors import (
    Discarded,
    NotLeader,
    OutcomeUnknown,
    QueueFull,
    RaftError,
    RequestDenied,
    Timeout,
)


@dataclass(slots=True, eq=False)
class Proposal:
    command: bytes
    future: asyncio.Future[Any]
    append: bool = False  # wait="append": answered once in the leader's durable journal


def take_batch(
    pending: collections.deque[Proposal], commands_max: int, bytes_max: int
) -> tuple[Proposal, ...]:
    """Pop the next batch off `pending`: at most `commands_max` commands and `bytes_max`
    bytes (a single larger command still goes alone), skipping proposals already answered."""
    batch: list[Proposal] = []
    size = 0
    while pending and len(batch) < commands_max:
        proposal = pending[0]
        if batch and size + len(proposal.command) > bytes_max:
            break
        pending.popleft()
        if proposal.future.done():
            continue  # timed out or cancelled before it reached the log: skip it
        batch.append(proposal)
        size += len(proposal.command)
    return tuple(batch)


def encode_batch(apply_batch_id: int, batch: tuple[Proposal, ...]) -> bytes:
    """The pysyncobj command that applies `batch` through the method `apply_batch_id`."""
    # What the @replicated decorator would hand to _applyCommand, but pickled with
    # the highest protocol: pysyncobj's protocol 2 turns every bytes object into a
    # latin-1 str and back, which cost more than all the rest of replication.
    return pickle.dumps((apply_batch_id, ([p.command for p in batch],)), pickle.HIGHEST_PROTOCOL)


def error_for(
    reason: int,
    group_id: int,
    leader_id: str | None,
    leader_address: str | None,
    queue_size: int,
) -> RaftError:
    """The raft/errors.py exception for one of pysyncobj's FAIL_REASON codes (not SUCCESS)."""
    if reason in (FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER):
        return NotLeader(group_id, leader_id, leader_address)
    if reason == FAIL_REASON.QUEUE_FULL:
        return QueueFull(group_id, queue_size)
    if reason == FAIL_REASON.DISCARDED:
        return Discarded(f"group {group_id}: entry overwritten by a new leader")
    if reason == FAIL_REASON.REQUEST_DENIED:
        return RequestDenied(f"group {group_id}: request denied")
    # LEADER_CHANGED, UNKNOWN_OUTCOME: the command may still commit.
    return OutcomeUnknown(f"group {group_id}: outcome unknown (reason {reason})")


def expire(future: asyncio.Future[Any], group_id: int, timeout_s: float) -> None:
    if not future.done():
        future.set_exception(Timeout(group_id, timeout_s))


def settle_batch(batch: tuple[Proposal, ...], result: Any, error: BaseException | None) -> None:
    """On the event loop: resolve each proposal with its own result (or the batch's error).

    result None: the wait="append" proposals of a round. A proposal answered before (by that
    early answer, or timed out) is skipped: the later commit callback cannot answer twice.
    """
    for k, proposal in enumerate(batch):
        if proposal.future.done():
            continue
        if error is not None:
            proposal.future.set_exception(error)
        else:
            proposal.future.set_result(None if result is None or proposal.append else result[k])

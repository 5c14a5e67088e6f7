"""RaftNode: one thread, one TCP address, many pysyncobj groups; Replica: the async facade.

A RaftNode owns a Network (raft/transport.py), every group's SyncObj and DurableJournal,
and the one tick thread that drives them all with `doTick(0)`. Each round of that thread:

1. poll the sockets (at most until the next group is due): each received message is
   handed to its group at once; pysyncobj appends entries to the journal and queues its
   reply, which the transport holds;
2. hand every group's waiting proposals to pysyncobj, coalesced into one command per group
   (group commit): the leader appends it to its journal and queues append_entries;
3. tick every group that needs it: one that received a proposal or a message that changed
   something (a heartbeat does not), and one whose idle tick is due (a leader every
   heartbeat, a follower every follower_tick_interval_s; a follower that hears from its
   leader and has nothing to apply only at its election deadline or once a second:
   `Replica.quiet_until`), and a leader that can commit
   more on what it already knows (`Replica.can_commit_more`: a one-node group, which no
   reply would tick). A tick commits (counting followers' replies), applies committed
   commands and answers their proposers. A quiesced group (raft/quiesce.py: idle and
   caught up) is not ticked at all until a proposal or message wakes it, or node liveness
   says its leader (or its majority) went silent;
4. write the queued append_entries to the sockets (they acknowledge nothing);
5. sync every journal changed in this round: one fdatasync per group covers all its
   entries of the round, and term and vote;
6. release the held messages (append and vote replies) to the sockets.

So no reply leaves before what it acknowledges is on disk; and a leader, which counts
itself in every majority, commits an entry only in a round after the one that appended it,
so after step 5 of that round made its own copy durable. raft/README.md has the whole
protocol and the proofs.

`Replica.propose(command)` is the facade: it resolves after the command is committed by a
majority and applied by this node's state machine, with the state machine's result. On a
follower pysyncobj forwards the command to the leader and the future still resolves after
the local apply. With wait="append" (acks=1) the leader answers after step 5 of the round
that appended the command to its journal (`Replica.take_appended`). pysyncobj's
FAIL_REASON codes become raft/errors.py exceptions here.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import heapq
import itertools
import logging
import os
import pickle
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import crc32c
from pysyncobj import FAIL_REASON, SyncObj, replicated
from pysyncobj.node import Node
from pysyncobj.syncobj import _COMMAND_TYPE

from raft import membership, quiesce, safe_pickle
from raft.config import RaftConfig, build_syncobj_conf
from raft.errors import (
    CommandTooLarge,
    Discarded,
    NotLeader,
    OutcomeUnknown,
    QueueFull,
    RaftError,
    ReplicaStopped,
    RequestDenied,
    StoppedInFlight,
    Timeout,
)
from raft.journal import DurableJournal, JournalCorrupt
from raft.messages import trim_append_entries
from raft.transport import GROUP_ID_MAX, GroupTransport, Network

logger = logging.getLogger(__name__)
# pysyncobj unpickles its log commands itself: only through the restricted unpickler.
safe_pickle.guard_pysyncobj()

# A proposal with no timeout of its own waits this long.
PROPOSE_TIMEOUT_S_DEFAULT = 10.0
# While no leader is known, propose() retries this often (doubling up to the max).
PROPOSE_RETRY_S_MIN = 0.005
PROPOSE_RETRY_S_MAX = 0.1
# Proposals handed to pysyncobj per group per round, at most (each is one Raft entry).
BATCHES_PER_ROUND_MAX = 8
# Leadership transfers asked for per maybe_balance_leaders() call, at most.
BALANCE_TRANSFERS_MAX = 4
# An idle follower that hears from its leader is ticked at least this often (pysyncobj's
# once-a-second journal timer and time-based log compaction run in its tick).
FOLLOWER_QUIET_MAX_S = 1.0
SNAPSHOT_FILE = "snapshot"
_T = TypeVar("_T")
_SNAPSHOT_MAGIC = b"DMQRSNP1"
_SNAPSHOT_HEADER = struct.Struct("<8sIQ")  # magic, crc32c(payload), payload length


class StateMachine(Protocol):
    """What a group replicates. apply() must be deterministic: same commands, same state.

    apply() runs on the tick thread, in log order, once per committed command, on every
    replica; it must not raise (an exception stops the node: replicas would diverge), nor
    should restore() (it stops the node too: the state would be half-restored).
    snapshot() / restore() serialise the whole state for log compaction and for followers
    that fell behind the leader's compacted log.
    """

    def apply(self, command: bytes) -> Any: ...

    def snapshot(self) -> bytes: ...

    def restore(self, snapshot: bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    group_id: int
    node_id: str
    is_leader: bool
    leader_id: str | None
    term: int
    commit_index: int
    last_applied: int
    journal_entries: int
    # A leader has applied the no-op pysyncobj appends when it is elected: only then does
    # its state hold every entry committed before its term (Raft dissertation 6.4, the
    # first step of a read). Before, its high watermark may lag what the previous leader
    # acknowledged (a stale read jepsen/ found at leadership transfers).
    leader_ready: bool = False


def _leader_ready(sync_obj: SyncObj) -> bool:
    """Leader, and its election no-op (pysyncobj's private index of it) is applied."""
    noop = sync_obj._SyncObj__noopIDx
    return bool(sync_obj._isLeader()) and noop is not None and sync_obj.raftLastApplied >= noop


class _GroupSyncObj(SyncObj):  # type: ignore[misc]  # pysyncobj is untyped
    """A SyncObj whose one replicated method applies a batch of commands to a StateMachine."""

    def __init__(self, machine: StateMachine, *args: Any, **kwargs: Any) -> None:
        self._machine = machine
        super().__init__(*args, **kwargs)

    @replicated  # type: ignore[untyped-decorator]
    def _apply_batch(self, commands: list[bytes]) -> list[Any]:
        # A machine with `apply_at(index, position, command)` is told where each command
        # sits in the Raft log (raft/partition.py skips what it applied before a restart).
        # pysyncobj raises raftLastApplied only after the entry's apply returns.
        apply_at = getattr(self._machine, "apply_at", None)
        if apply_at is None:
            return [self._machine.apply(command) for command in commands]
        index = self.raftLastApplied + 1
        return [apply_at(index, k, command) for k, command in enumerate(commands)]


@dataclass(slots=True, eq=False)
class _Proposal:
    command: bytes
    future: asyncio.Future[Any]
    append: bool = False  # wait="append": answered once in the leader's durable journal


class Replica:
    """One group on one node: `await propose(command)` and `status()`.

    propose() and status() are for the event loop that started the RaftNode; the other
    methods run on the node's tick thread.
    """

    def __init__(
        self,
        node: RaftNode,
        group_id: int,
        directory: Path,
        machine: StateMachine,
        members: list[str],
    ) -> None:
        self.group_id = group_id
        self.node = node
        self.directory = directory
        self.machine = machine
        self._config = node.config
        self._pending: collections.deque[_Proposal] = collections.deque()  # loop -> tick thread
        self._queued = False  # in node._ready; cleared by the tick thread before draining
        self._inflight = 0  # proposals between propose() and its return (loop thread only)
        self._inflight_bytes = 0
        self._submitted: set[tuple[_Proposal, ...]] = set()  # tick thread only
        # Batches handed to pysyncobj in this round that hold a wait="append" proposal; looked
        # at right after this round's tick (take_appended), then forgotten.
        self._append_batches: list[tuple[_Proposal, ...]] = []
        # Set by the tick thread once the SyncObj is destroyed (node stop, remove_group); a
        # proposal that passed the check before is failed by the round (fail_pending).
        self.stopped = False
        # An error pysyncobj caught and logged that must stop the node (_read_snapshot).
        self.failure: BaseException | None = None
        # Quiescence (raft/quiesce.py), tick thread only. As leader: "active", "quiescing"
        # (QUIESCE sent, answers in quiesce_acks) or "quiesced" (not ticked). As follower:
        # quiesced_leader is the leader's node id while quiesced (not ticked), else None.
        self.lead_quiesce: Literal["active", "quiescing", "quiesced"] = "active"
        self.quiesce_acks: set[str] = set()
        self.quiesce_sent_at = 0.0
        self.quiesce_round = 0  # echoed by QUIESCED: an answer to an older QUIESCE is ignored
        self.quiesced_leader: str | None = None
        self.quiesce_timeout_s = 0.0  # the follower's election timeout while quiesced
        self._status = ReplicaStatus(group_id, node.node_id, False, None, 0, 0, 0, 0)
        self.journal = DurableJournal(
            directory,
            durability=self._config.durability,
            cache_bytes_max=self._config.journal_cache_bytes_max,
            write_buffer_bytes_max=self._config.journal_write_buffer_bytes_max,
            snapshot_path=directory / SNAPSHOT_FILE,
            durable_trace=node.durable_trace,
        )
        conf = build_syncobj_conf(
            self._config,
            journal=self.journal,
            snapshot_path=str(directory / SNAPSHOT_FILE),
            serializer=self._write_snapshot,
            deserializer=self._read_snapshot,
        )
        holder: list[GroupTransport] = []

        def make_transport(sync_obj: Any, self_node: Any, other_nodes: Any) -> GroupTransport:
            transport = GroupTransport(
                sync_obj,
                self_node,
                other_nodes,
                network=node.network,
                group_id=group_id,
                term_at=self.journal.term_at,
            )
            holder.append(transport)
            return transport

        self.syncobj = _GroupSyncObj(
            machine,
            Node(node.node_id),
            [Node(member) for member in members if member != node.node_id],
            conf,
            transportClass=make_transport,
        )
        self.transport = holder[0]
        _close_dropped_transfers(self.syncobj._SyncObj__serializer)
        self._apply_batch_id = self.syncobj._methodToID[self.syncobj._getFuncName("_apply_batch")]
        self.next_due = 0.0
        self.last_tick = 0.0
        self.snapshots_written = 0
        self.snapshots_restored = 0  # at start-up from its own file, or sent by the leader

    # --- the event loop's side --------------------------------------------------------------

    async def propose(
        self,
        command: bytes,
        *,
        timeout_s: float | None = None,
        wait: Literal["apply", "append"] = "apply",
    ) -> Any:
        """Commit `command` through Raft and return this replica's apply() result.

        wait="append" (Kafka's acks=1) returns None as soon as this node, as leader, has the
        command in its own fdatasync'ed journal, before any follower holds it (raft/README.md,
        "Durability contract": it may be lost on failover). On a node that is not the leader
        it returns None after the apply, as wait="apply" would.

        Raises CommandTooLarge or QueueFull at once; retries while no leader is known
        (NotLeader) or the entry was discarded, until the deadline; then raises the last
        NotApplied error, or Timeout if the command may still commit.
        """
        if wait not in ("apply", "append"):
            raise ValueError(f"wait must be 'apply' or 'append', not {wait!r}")
        loop = asyncio.get_running_loop()
        timeout = PROPOSE_TIMEOUT_S_DEFAULT if timeout_s is None else timeout_s
        deadline = loop.time() + timeout
        delay = PROPOSE_RETRY_S_MIN
        while True:
            try:
                return await self._propose_once(command, deadline, timeout, wait == "append")
            except (NotLeader, Discarded):
                if loop.time() + delay >= deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, PROPOSE_RETRY_S_MAX)

    async def _propose_once(
        self, command: bytes, deadline: float, timeout_s: float, append: bool
    ) -> Any:
        if self.node.failed is not None or self.node.stopping or self.stopped:
            raise self._stopped_error()
        if len(command) > self._config.batch_bytes_max:
            raise CommandTooLarge(self.group_id, len(command), self._config.batch_bytes_max)
        if (
            self._inflight >= self._config.proposals_max
            or self._inflight_bytes + len(command) > self._config.proposal_bytes_max
        ):
            raise QueueFull(self.group_id, self._config.proposals_max)
        loop = asyncio.get_running_loop()
        proposal = _Proposal(bytes(command), loop.create_future(), append)
        self._inflight += 1
        self._inflight_bytes += len(command)
        # One timer handle per proposal: asyncio.wait_for costs three times as much, and
        # at tens of thousands of proposals a second that is the event loop's main cost.
        timer = loop.call_at(deadline, _expire, proposal.future, self.group_id, timeout_s)
        try:
            self._pending.append(proposal)
            self.node.schedule(self)
            return await proposal.future
        finally:
            timer.cancel()
            self._inflight -= 1
            self._inflight_bytes -= len(command)

    def status(self) -> ReplicaStatus:
        """As of this group's last tick (any thread may read it)."""
        return self._status

    # --- the tick thread's side -------------------------------------------------------------

    def drain_proposals(self) -> bool:
        """Hand waiting proposals to pysyncobj, coalesced; True if any were handed over."""
        handed = False
        for _ in range(BATCHES_PER_ROUND_MAX):
            batch = self._take_batch()
            if not batch:
                break
            self._submitted.add(batch)
            if any(proposal.append for proposal in batch):
                self._append_batches.append(batch)
            callback = functools.partial(self._on_batch_result, batch)
            # What the @replicated decorator would hand to _applyCommand, but pickled with
            # the highest protocol: pysyncobj's protocol 2 turns every bytes object into a
            # latin-1 str and back, which cost more than all the rest of replication.
            command = pickle.dumps(
                (self._apply_batch_id, ([p.command for p in batch],)), pickle.HIGHEST_PROTOCOL
            )
            self.syncobj._applyCommand(command, callback, _COMMAND_TYPE.REGULAR)
            handed = True
        return handed

    def _take_batch(self) -> tuple[_Proposal, ...]:
        batch: list[_Proposal] = []
        size = 0
        pending = self._pending
        while pending and len(batch) < self._config.batch_commands_max:
            proposal = pending[0]
            if batch and size + len(proposal.command) > self._config.batch_bytes_max:
                break
            pending.popleft()
            if proposal.future.done():
                continue  # timed out or cancelled before it reached the log: skip it
            batch.append(proposal)
            size += len(proposal.command)
        return tuple(batch)

    def take_appended(self) -> list[_Proposal]:
        """Right after this round's tick: the wait="append" proposals this node appended to
        its journal as leader (answered after the round's sync), then forgets the batches.

        pysyncobj 0.3.17's tick ends with `_checkCommandsToApply`, which takes every queued
        command (until a time budget of appendEntriesPeriod runs out) and, on the leader,
        appends it to the journal at the current term; on a follower it forwards it to the
        leader, with no leader it fails it (MISSING_LEADER). Nothing after that call in the
        tick, and nothing before this check, changes the role. So if this node leads now
        and pysyncobj's queue is empty, every batch drained in this round is in its journal.
        Otherwise the proposals wait for the commit callback (or fail) as wait="apply" ones.
        A batch no longer in _submitted already failed (QUEUE_FULL) and is skipped.
        """
        batches, self._append_batches = self._append_batches, []
        if not batches or not self.syncobj._isLeader():
            return []
        queue: collections.deque[Any] = self.syncobj._SyncObj__commandsQueue._FastQueue__queue
        if queue:
            return []
        return [p for batch in batches if batch in self._submitted for p in batch if p.append]

    def _on_batch_result(self, batch: tuple[_Proposal, ...], result: Any, reason: int) -> None:
        self._submitted.discard(batch)
        error = None if reason == FAIL_REASON.SUCCESS else self._error_for(reason)
        self.node.settle(batch, result, error)

    def _error_for(self, reason: int) -> RaftError:
        leader = self.syncobj._getLeader()
        leader_id = None if leader is None else str(leader.id)
        if reason in (FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER):
            return NotLeader(self.group_id, leader_id, self.node.address_of(leader_id))
        if reason == FAIL_REASON.QUEUE_FULL:
            return QueueFull(self.group_id, self._config.commands_queue_size)
        if reason == FAIL_REASON.DISCARDED:
            return Discarded(f"group {self.group_id}: entry overwritten by a new leader")
        if reason == FAIL_REASON.REQUEST_DENIED:
            return RequestDenied(f"group {self.group_id}: request denied")
        # LEADER_CHANGED, UNKNOWN_OUTCOME: the command may still commit.
        return OutcomeUnknown(f"group {self.group_id}: outcome unknown (reason {reason})")

    def needs_tick_after(self, message: Any) -> bool:
        """Whether a message just delivered needs this round's tick and sync.

        Heartbeats and their replies, the bulk of an idle node's messages, change nothing
        that a tick or a sync would act on; everything else is ticked at once. A changed
        journal always is: the sync step covers only the groups ticked in the round.
        """
        if not self.journal.is_synced():
            return True
        kind = message.get("type") if isinstance(message, dict) else None
        sync_obj = self.syncobj
        if kind == "append_entries":  # entries would have changed the journal
            return bool(sync_obj.raftCommitIndex > sync_obj.raftLastApplied)
        if kind == "next_node_idx":  # the commit index may move only if this acks more
            acked = message.get("next_node_idx", 0) - 1
            return bool(message.get("success")) and acked > sync_obj.raftCommitIndex
        return True

    def tick(self) -> None:
        # An exception from apply() is not caught by pysyncobj: it leaves doTick and stops
        # the node. One from restore() is (see _read_snapshot): raised here instead.
        self.syncobj.doTick(0.0)
        self.raise_failure()
        sync_obj = self.syncobj
        leader = sync_obj._getLeader()
        self._status = ReplicaStatus(
            self.group_id,
            self.node.node_id,
            bool(sync_obj._isLeader()),
            None if leader is None else str(leader.id),
            sync_obj.raftCurrentTerm,
            sync_obj.raftCommitIndex,
            sync_obj.raftLastApplied,
            len(self.journal),
            _leader_ready(sync_obj),
        )

    def quiet_until(self, now: float) -> float | None:
        """For a follower whose idle tick is due: until when a tick would do nothing.

        pysyncobj's follower tick checks the election deadline (which every append_entries
        from the leader pushes forward), applies committed entries and runs its timers. A
        follower that knows its leader, has nothing to apply and a synced journal is looked
        at again at its election deadline (or FOLLOWER_QUIET_MAX_S after its last tick)
        instead of being ticked every follower_tick_interval_s. None: tick it now.
        """
        sync_obj = self.syncobj
        if (
            sync_obj._isLeader()
            or sync_obj._getLeader() is None
            or sync_obj.raftCommitIndex > sync_obj.raftLastApplied
            or not self.journal.is_synced()
        ):
            return None
        deadline: float = sync_obj._SyncObj__raftElectionDeadline
        until = min(deadline, self.last_tick + FOLLOWER_QUIET_MAX_S)
        return until if until > now else None

    def can_commit_more(self) -> bool:
        """Whether a tick now would raise the commit index: the leader re-ticks next round.

        pysyncobj's tick counts the majority before it appends the queued commands, and a
        leader is otherwise ticked again only when a follower's reply arrives or its
        heartbeat is due. In a one-node group no reply ever comes: each entry waited for the
        next heartbeat (~100 ms). True when the majority's match index (the leader counting
        its own journal end) is past the commit index at an entry of the current term, the
        condition under which pysyncobj's commit loop advances; the tick it triggers then
        commits up to that index, so the condition is false again unless new entries were
        appended or replies came in: an idle group never re-ticks. The next round comes
        after this round's sync, so the leader's own copy is durable before it counts.
        """
        sync_obj = self.syncobj
        if not sync_obj._isLeader():
            return False
        last = self.journal.last_index
        commit = int(sync_obj.raftCommitIndex)
        if last <= commit:
            return False
        # pysyncobj 0.3.17's private match indexes (by Node), read-only; the version is pinned.
        match_index: dict[Any, int] = sync_obj._SyncObj__raftMatchIndex
        others = sync_obj._SyncObj__otherNodes
        matched = sorted([last] + [min(match_index.get(n, 0), last) for n in others], reverse=True)
        quorum_index = matched[len(matched) // 2]  # held by a majority (the leader included)
        return quorum_index > commit and self.journal.term_at(quorum_index) == (
            sync_obj.raftCurrentTerm
        )

    # --- quiescence (raft/quiesce.py; the tick thread's side) --------------------------------

    @property
    def quiesced(self) -> bool:
        """Not ticked: a quiesced leader, or a follower quiesced under its leader."""
        return self.lead_quiesce == "quiesced" or self.quiesced_leader is not None

    @property
    def in_quiescence(self) -> bool:
        """Quiesced, or a leader waiting for its followers' QUIESCED answers."""
        return self.lead_quiesce != "active" or self.quiesced_leader is not None

    @property
    def members(self) -> list[str]:
        """The group's configuration as this replica knows it now (it changes at run time:
        raft/membership.py), sorted, this node included."""
        return membership.member_ids(self)

    @property
    def followers(self) -> list[str]:
        return [str(n.id) for n in self.syncobj._SyncObj__otherNodes]

    def quiesce_ready(self, is_up: Callable[[str], bool]) -> bool:
        """Leader: idle and every connected follower holds the whole, committed log."""
        sync_obj = self.syncobj
        if self._pending or self._submitted or self._commands_queued():
            return False
        last = self.journal.last_index
        if not self.journal.is_synced() or not (
            sync_obj.raftCommitIndex == sync_obj.raftLastApplied == last
        ):
            return False
        match_index: dict[Any, int] = sync_obj._SyncObj__raftMatchIndex
        return all(
            match_index.get(node, 0) >= last or not is_up(node.id)
            for node in sync_obj._SyncObj__otherNodes
        )

    def _commands_queued(self) -> int:
        return len(self.syncobj._SyncObj__commandsQueue._FastQueue__queue)

    def accept_quiesce(self, peer_id: str, message: dict[str, Any]) -> bool:
        """Follower: become quiesced under `peer_id` if its QUIESCE matches this log."""
        sync_obj = self.syncobj
        leader = sync_obj._getLeader()
        last = message.get("last")
        if (
            sync_obj._isLeader()
            or leader is None
            or str(leader.id) != peer_id
            or message.get("term") != sync_obj.raftCurrentTerm
            or last != self.journal.last_index
            or last is None
            or self.journal.term_at(last) != message.get("last_term")
            or sync_obj.raftCommitIndex != last
            or self._pending
            or self._submitted
        ):
            return False
        self.quiesced_leader = peer_id
        self.quiesce_timeout_s = float(sync_obj._SyncObj__generateRaftTimeout())
        return True

    def is_benign(self, peer_id: str, message: Any) -> bool:
        """Whether a message leaves a quiesced (or quiescing) replica as it is."""
        if self.quiesced_leader is not None:
            return quiesce.is_leader_heartbeat(
                message,
                peer_id == self.quiesced_leader,
                self.syncobj.raftCurrentTerm,
                self.journal.last_index,
            )
        return quiesce.is_caught_up_reply(message, self.journal.last_index)

    def send_control(self, kind: str, peer_ids: Iterable[str], **fields: Any) -> None:
        message = {"type": kind, "term": self.syncobj.raftCurrentTerm, **fields}
        wanted = set(peer_ids)
        for node in self.syncobj._SyncObj__otherNodes:
            if node.id in wanted:
                self.transport.send(node, message)

    def send_quiesce(self, peer_ids: Iterable[str], now: float) -> None:
        last = self.journal.last_index
        self.send_control(
            quiesce.QUIESCE,
            peer_ids,
            last=last,
            last_term=self.journal.term_at(last),
            round=self.quiesce_round,
        )
        self.quiesce_sent_at = now

    def resume_leading(self, last_heard: dict[str, float]) -> None:
        """A quiesced leader ticks again: its followers' nodes were heard from at
        `last_heard`, which stands in for the replies pysyncobj's step-down check counts."""
        responses: dict[Any, float] = self.syncobj._SyncObj__lastResponseTime
        for node in self.syncobj._SyncObj__otherNodes:
            heard = last_heard.get(node.id)
            if heard is not None and heard > responses.get(node, 0.0):
                responses[node] = heard

    def resume_following(self, election_deadline: float) -> None:
        self.syncobj._SyncObj__raftElectionDeadline = election_deadline

    def stop(self) -> None:
        """Close the group's files and fail every proposal not answered yet (idempotent)."""
        if not self.stopped:
            self.stopped = True
            self.syncobj.destroy()  # autoTick=False: destroys transport and journal at once
            _close_pysyncobj_files(self.syncobj)
        stopped = StoppedInFlight(f"group {self.group_id}: stopped on node {self.node.node_id}")
        for batch in list(self._submitted):
            self.node.settle(batch, None, stopped)
        self._submitted.clear()
        self._append_batches.clear()
        self.fail_pending()

    def fail_pending(self) -> None:
        """Fail proposals still waiting for the tick thread (a stopped or removed group)."""
        leftover = tuple(self._pending)
        self._pending.clear()
        if leftover:
            self.node.settle(leftover, None, self._stopped_error())

    def _stopped_error(self) -> ReplicaStopped:
        return ReplicaStopped(f"group {self.group_id}: stopped on node {self.node.node_id}")

    # --- snapshots (pysyncobj's serializer hooks, on the tick thread) -----------------------

    def _write_snapshot(self, path: str, data: Any) -> None:
        """pysyncobj's `serializer(fileName, data)`: state + its raft bookkeeping, fsynced."""
        payload = pickle.dumps((tuple(data), self.machine.snapshot()), pickle.HIGHEST_PROTOCOL)
        with open(path, "wb") as file:
            file.write(_SNAPSHOT_HEADER.pack(_SNAPSHOT_MAGIC, crc32c.crc32c(payload), len(payload)))
            file.write(payload)
            file.flush()
            if self._config.durability == "fsync":
                os.fsync(file.fileno())
        self.snapshots_written += 1

    def _read_snapshot(self, path: str) -> tuple[Any, ...]:
        """pysyncobj's `deserializer(fileName)`: restore the state, return the bookkeeping.

        pysyncobj calls it from `__loadDumpFile`, which logs and swallows any exception and
        carries on (even answers the leader success=True after a failed install). A failed
        restore leaves the state machine half-restored, so the error is recorded here and
        raised by RaftNode after the tick or message that caused it (raise_failure): the
        node stops before any reply of that round leaves.
        """
        try:
            return self._restore_from(path)
        except BaseException as error:
            self.failure = error
            raise

    def _restore_from(self, path: str) -> tuple[Any, ...]:
        with open(path, "rb") as file:
            raw = file.read()
        magic, crc, length = _SNAPSHOT_HEADER.unpack_from(raw)
        payload = raw[_SNAPSHOT_HEADER.size :]
        if magic != _SNAPSHOT_MAGIC or len(payload) != length or crc32c.crc32c(payload) != crc:
            raise RaftError(f"{path}: snapshot fails its checks")
        data, state = safe_pickle.load_snapshot(payload)  # the file is ours or the leader's
        self.machine.restore(state)
        self.snapshots_restored += 1
        return tuple(data)

    def raise_failure(self) -> None:
        """Raise what pysyncobj swallowed (a failed restore), so that the node stops."""
        if self.failure is not None:
            raise RaftError(f"group {self.group_id}: {self.failure!r}") from self.failure


class RaftNode:
    """Hosts many groups on one address with one tick thread (module docstring).

    Start it from a running event loop (`await node.start()`); add groups before or after.
    """

    def __init__(
        self,
        node_id: str,
        peers: dict[str, str],
        data_dir: Path,
        config: RaftConfig | None = None,
        *,
        durable_trace: bool = False,
        cluster_secret: bytes | None = None,
    ) -> None:
        self.config = config or RaftConfig()
        self.config.check()
        if node_id not in peers:
            raise ValueError(f"node {node_id} is not among the peers {sorted(peers)}")
        self.node_id = node_id
        self.peers = dict(peers)
        self.data_dir = data_dir
        self.durable_trace = durable_trace
        self.network = Network(
            node_id,
            peers[node_id],
            self.peers,
            self.config,
            on_message=self._on_message,
            on_peer_up=self._on_peer_up,
            on_peer_down=self._on_peer_down,
            secret=cluster_secret,  # raft/auth.py; None: an unsecured cluster
        )
        self.groups: dict[int, Replica] = {}
        self.failed: BaseException | None = None
        self.stopping = False
        self.rounds = 0
        self.ticks = 0
        # When the last round ended: what it read was applied to every status by then
        # (the broker's read lease counts from it, not from a newer last_heard).
        self.round_done_at = time.monotonic()
        self.syncs = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._ready: collections.deque[Replica] = collections.deque()
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._wake_pending = False
        self._touched: set[Replica] = set()
        # (due time, tie-breaker, replica); an entry is stale if replica.next_due moved on.
        self._due: list[tuple[float, int, Replica]] = []
        self._due_seq = itertools.count()
        # Leadership transfers asked for by maybe_balance_leaders: group -> (target, expiry).
        self._transfers: dict[int, tuple[str, float]] = {}

    # --- lifecycle (event loop thread) ------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.network.open()
        self._thread = threading.Thread(
            target=self._run, name=f"dmq-raft-{self.node_id}", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        self.stopping = True
        if self._thread is None:
            for replica in self.groups.values():
                replica.stop()
            self.network.close()
            return
        self.wake()
        await asyncio.wrap_future(self._stopped)

    async def add_group(
        self,
        group_id: int,
        machine: StateMachine,
        *,
        members: Iterable[str] | None = None,
        members_from_log: bool = False,
    ) -> Replica:
        """Create (or reopen from its directory) group `group_id` with these members.

        members_from_log: on reopening, the membership changes in the group's journal
        override `members` (membership.adopt_logged_changes), as Raft requires when the
        caller cannot know the current members (the metadata group's own voters)."""
        return await self._on_tick_thread(
            lambda: self._add_group(group_id, machine, members, members_from_log)
        )

    async def remove_group(self, group_id: int, *, delete: bool = False) -> None:
        """Stop group `group_id` on this node; with delete=True also remove its directory.

        Its proposals fail with ReplicaStopped, its files are closed, frames for it count as
        for an unknown group. It may be added again with the same id (reopened from its
        directory unless deleted). Deleting drops entries this node may have acknowledged:
        only for a group no longer replicated here (the caller's membership decision).
        """
        await self._on_tick_thread(lambda: self._remove_group(group_id, delete=delete))

    async def _on_tick_thread(self, call: Callable[[], _T]) -> _T:
        """Run `call` on the tick thread (or here, before start) and return its result."""
        if self._thread is None:
            return call()
        done: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(call())
            except BaseException as error:  # handed to the caller
                done.set_exception(error)

        self._calls.append(run)
        self.wake()
        return await asyncio.wrap_future(done)

    def _add_group(
        self,
        group_id: int,
        machine: StateMachine,
        members: Iterable[str] | None,
        members_from_log: bool = False,
    ) -> Replica:
        if not 0 <= group_id <= GROUP_ID_MAX:
            raise ValueError(f"group id {group_id} out of range")
        if group_id in self.groups:
            raise ValueError(f"group {group_id} exists on node {self.node_id}")
        member_list = sorted(self.peers if members is None else members)
        unknown = set(member_list) - set(self.peers)
        if unknown or self.node_id not in member_list:
            raise ValueError(f"group {group_id}: bad members {member_list}")
        directory = self.data_dir / "groups" / str(group_id)
        replica = Replica(self, group_id, directory, machine, member_list)
        try:
            # pysyncobj loads its snapshot on its first tick and expects no message before it.
            replica.tick()
            if members_from_log:
                membership.adopt_logged_changes(replica)
        except BaseException:
            replica.stop()  # close its files; the caller gets the error (a failed restore)
            raise
        if len(member_list) == 1:
            # A one-member group has nobody to wait for: it elects itself at its next tick
            # instead of after an election timeout (a one-node cluster's topics are usable
            # at once). pysyncobj 0.3.17's private deadline; the version is pinned.
            replica.syncobj._SyncObj__raftElectionDeadline = 0.0
        self.groups[group_id] = replica
        for peer_id in self.network.up_peers():
            replica.transport.peer_up(peer_id)
        self._touched.add(replica)  # synced (and ticked) in this round
        # A member that leads this group quiesced would not heartbeat the new replica.
        replica.send_control(quiesce.WAKE, replica.followers)
        return replica

    def _remove_group(self, group_id: int, *, delete: bool) -> None:
        replica = self.groups.pop(group_id, None)
        if replica is None:
            raise ValueError(f"group {group_id} does not exist on node {self.node_id}")
        # Entries in _due and _ready may still name this Replica: the round skips any that
        # is not the one in self.groups (identity, so a group re-added with the same id is
        # not mistaken for it).
        self._touched.discard(replica)
        self._transfers.pop(group_id, None)
        self._unquiesce(replica)  # its followers must not wait on this node's liveness
        replica.stop()
        if delete:
            shutil.rmtree(replica.directory)

    async def maybe_balance_leaders(self, *, transfers_max: int = BALANCE_TRANSFERS_MAX) -> bool:
        """Hand the leadership of groups this node leads to the member that leads the
        fewest, while that member leads at least two fewer; True if it asked for at least
        one transfer.

        Meant to run periodically on every node (each moves only what it leads). No
        fair-share floor: with 7 groups on 3 nodes, 3/3/1 has every node at or below
        ceil(7/3) = 3 and still needs a move (to 2/3/2). Leader counts are this node's view
        (each replica's known leader), plus the transfers asked for recently and not yet
        seen done, so repeated calls do not move the same surplus twice. A group moves only
        to a member leading at least two fewer than this node (no ping-pong between nodes
        one apart), at most `transfers_max` per call. pysyncobj's transferLeadership sends
        the target 'timeout_now' if it holds the whole log (else it is denied and retried
        by a later call); the target starts an election at once and wins it.
        """
        return await self._on_tick_thread(lambda: self._balance_leaders(transfers_max))

    def _balance_leaders(self, transfers_max: int) -> bool:
        now = time.monotonic()
        leads: collections.Counter[str] = collections.Counter({p: 0 for p in self.peers})
        mine: list[Replica] = []
        for replica in self.groups.values():
            sync_obj = replica.syncobj
            pending = self._transfers.get(replica.group_id)
            if pending is not None and (pending[1] < now or not sync_obj._isLeader()):
                del self._transfers[replica.group_id]  # done, or given up on
                pending = None
            if pending is not None:
                leads[pending[0]] += 1  # as if already moved
            elif sync_obj._isLeader():
                leads[self.node_id] += 1
                mine.append(replica)
            else:
                leader = sync_obj._getLeader()
                if leader is not None:
                    leads[str(leader.id)] += 1
        acted = False
        transfers = 0
        for replica in sorted(mine, key=lambda r: r.group_id):
            if transfers >= transfers_max:
                break
            candidates = [m for m in replica.members if m != self.node_id]
            if not candidates:
                continue
            target = min(candidates, key=lambda m: (leads[m], m))
            if leads[target] + 2 > leads[self.node_id]:
                continue
            outcome: list[int] = []
            target_node = next(n for n in replica.syncobj.otherNodes if str(n.id) == target)
            # The callback runs before transferLeadership returns (it only sends a message).
            replica.syncobj.transferLeadership(
                target_node, functools.partial(_record_reason, outcome)
            )
            transfers += 1
            if outcome and outcome[0] == FAIL_REASON.SUCCESS:
                # A transfer not seen done after an election timeout or two has failed.
                deadline = now + 2 * self.config.election_timeout_max_s
                self._transfers[replica.group_id] = (target, deadline)
                leads[target] += 1
                leads[self.node_id] -= 1
                self._touch(replica)  # its timeout_now leaves in this round
                acted = True
        return acted

    # --- membership (raft/membership.py) ----------------------------------------------------

    async def add_peer(self, node_id: str, address: str) -> bool:
        """Make `node_id` at `address` (its Raft host:port) reachable; True if it was new.

        A broker that joins a running cluster is known to the others only from then on:
        groups may name it as a member, and its connections are accepted."""

        def add() -> bool:
            if self.peers.get(node_id) == address:
                return False
            self.peers[node_id] = address
            self.network.add_peer(node_id, address)
            return True

        return await self._on_tick_thread(add)

    async def change_membership(
        self, group_id: int, action: membership.Action, node_id: str, *, timeout_s: float
    ) -> bool:
        """Add or remove one member of a group this node leads; True once the change is
        committed, False if there was nothing to do. NotLeader, RequestDenied (a change
        pending, or the leader removing itself) or Timeout otherwise."""

        def start() -> concurrent.futures.Future[bool] | None:
            replica = self._group(group_id)
            membership.require_leader(replica)
            if action == "add" and node_id not in self.peers:
                raise RequestDenied(f"group {group_id}: {node_id} is not a known peer")
            done = membership.start_change(replica, action, node_id)
            if done is not None:
                self._touch(replica)  # the entry is appended (and sent) in this round
            return done

        done = await self._on_tick_thread(start)
        if done is None:
            return False
        try:
            return await asyncio.wait_for(asyncio.wrap_future(done), timeout_s)
        except TimeoutError:
            raise Timeout(group_id, timeout_s) from None

    async def group_progress(self, group_id: int) -> membership.GroupProgress:
        """The leader's view of a group's members and their logs (NotLeader elsewhere)."""
        return await self._on_tick_thread(lambda: membership.progress(self._group(group_id)))

    async def transfer_leadership(self, group_id: int, target: str) -> None:
        """Ask this node's group to hand its leadership to `target` (see membership.py)."""

        def transfer() -> None:
            replica = self._group(group_id)
            membership.transfer_leadership(replica, target)
            deadline = time.monotonic() + 2 * self.config.election_timeout_max_s
            self._transfers[group_id] = (target, deadline)  # no quiescing meanwhile
            self._touch(replica)  # its timeout_now leaves in this round

        await self._on_tick_thread(transfer)

    def _group(self, group_id: int) -> Replica:
        replica = self.groups.get(group_id)
        if replica is None:
            raise ReplicaStopped(f"group {group_id} is not open on node {self.node_id}")
        return replica

    def address_of(self, node_id: str | None) -> str | None:
        return None if node_id is None else self.peers.get(node_id)

    def thread_count(self) -> int:
        """Threads this node started (the tick thread), for tests of the threading bound."""
        return 1 if self._thread is not None and self._thread.is_alive() else 0

    # --- cross-thread hand-offs -------------------------------------------------------------

    def wake(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            self.network.wake()

    def schedule(self, replica: Replica) -> None:
        """A replica has new proposals (event loop thread)."""
        if not replica._queued:
            replica._queued = True
            self._ready.append(replica)
        self.wake()

    def settle(
        self, batch: tuple[_Proposal, ...], result: Any, error: BaseException | None
    ) -> None:
        """Answer a batch's proposers on their event loop (from the tick thread)."""
        loop = self._loop
        if loop is None:
            return
        # RuntimeError: the loop is closed, nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle_batch, batch, result, error)

    # --- the tick thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self.stopping:
                self._round()
        except BaseException as error:
            logger.exception("raft node %s stopped by an error", self.node_id)
            self.failed = error
        finally:
            self._shutdown()

    def _round(self) -> None:
        now = time.monotonic()
        self.network.maintain(now)
        self.network.poll(self._poll_timeout(now))
        self._wake_pending = False
        while self._calls:
            self._calls.popleft()()
        while self._ready:
            replica = self._ready.popleft()
            replica._queued = False
            if self.groups.get(replica.group_id) is not replica:
                replica.fail_pending()  # removed: proposals that raced with its stop
            elif replica.drain_proposals():
                self._touch(replica)
        self._take_due(time.monotonic())
        touched, self._touched = self._touched, set()
        appended: list[_Proposal] = []
        for replica in touched:
            replica.tick()
            appended += replica.take_appended()
            self._after_tick(replica)
        self._sync_and_release(touched)
        if appended:  # in the leader's journal, synced just now: wait="append" is answered
            self.settle(tuple(appended), None, None)
        self.rounds += 1
        self.ticks += len(touched)
        self.round_done_at = time.monotonic()

    def _take_due(self, now: float) -> None:
        """Round step 3's choice: groups whose idle tick is due (stale heap entries skipped)."""
        while self._due and self._due[0][0] <= now:
            due, _, replica = heapq.heappop(self._due)
            if replica.next_due != due or self.groups.get(replica.group_id) is not replica:
                continue
            if replica.quiesced:
                wake_at = self._quiesced_wake_at(replica)
                if wake_at is None:
                    continue  # a one-node group: nothing to watch
                if wake_at > now:
                    self._push_due(replica, wake_at)
                else:  # its leader's node went silent, or a majority of its members did
                    self._touch(replica)
                continue
            quiet_until = replica.quiet_until(now)
            if quiet_until is None:
                self._touched.add(replica)
            else:  # an idle follower hearing from its leader: look again later
                self._push_due(replica, quiet_until)

    def _after_tick(self, replica: Replica) -> None:
        """Quiesce a leader that may, and schedule the replica's next look."""
        replica.last_tick = now = time.monotonic()
        if replica.lead_quiesce != "active" or replica.status().is_leader:
            self._maybe_quiesce(replica, now)
        if replica.quiesced:
            wake_at = self._quiesced_wake_at(replica)
            if wake_at is not None:
                self._push_due(replica, wake_at)
            return
        # From the end of this tick: a leader's next idle tick then finds its heartbeat due
        # (pysyncobj sends one when heartbeat_interval_s passed since the last send).
        if replica.can_commit_more():
            interval = 0.0  # ticked next round, after this round's sync (see the method)
        elif replica.status().is_leader:
            interval = self.config.heartbeat_interval_s
        else:
            interval = self.config.follower_tick_interval_s
        self._push_due(replica, now + interval)

    def _push_due(self, replica: Replica, when: float) -> None:
        replica.next_due = when  # any older heap entry of this replica is now stale
        heapq.heappush(self._due, (when, next(self._due_seq), replica))

    # --- quiescence (raft/quiesce.py has the protocol) -------------------------------------

    def _touch(self, replica: Replica) -> None:
        """Tick this replica in this round; a quiesced one un-quiesces first."""
        self._unquiesce(replica)
        self._touched.add(replica)

    def _unquiesce(self, replica: Replica) -> None:
        if replica.lead_quiesce != "active":
            if replica.lead_quiesce == "quiesced":
                replica.resume_leading(self.network.last_heard)
            replica.lead_quiesce = "active"
            replica.send_control(quiesce.UNQUIESCE, replica.followers)
        leader_id = replica.quiesced_leader
        if leader_id is not None:
            replica.quiesced_leader = None
            # As if its leader's heartbeats had kept coming while its node was heard from.
            last_heard = self.network.last_heard
            replica.resume_following(
                quiesce.follower_wake_at(last_heard, leader_id, replica.quiesce_timeout_s)
            )

    def _quiesced_wake_at(self, replica: Replica) -> float | None:
        last_heard = self.network.last_heard
        if replica.quiesced_leader is not None:
            return quiesce.follower_wake_at(
                last_heard, replica.quiesced_leader, replica.quiesce_timeout_s
            )
        return quiesce.leader_wake_at(
            last_heard, replica.followers, len(replica.members), self.config.leader_step_down_s
        )

    def _maybe_quiesce(self, replica: Replica, now: float) -> None:
        """After a tick of a leader (or of one that was quiescing): steps 1 and 3."""
        ready = (
            replica.status().is_leader
            and replica.group_id not in self._transfers
            and replica.quiesce_ready(self.network.is_up)
        )
        if not ready:
            self._unquiesce(replica)
            return
        connected = [p for p in replica.followers if self.network.is_up(p)]
        if replica.lead_quiesce == "active":
            replica.lead_quiesce = "quiescing"
            replica.quiesce_acks.clear()
            replica.quiesce_round += 1
            replica.send_quiesce(connected, now)
        elif replica.lead_quiesce == "quiescing" and now - replica.quiesce_sent_at >= (
            quiesce.QUIESCE_RETRY_S
        ):
            replica.send_quiesce([p for p in connected if p not in replica.quiesce_acks], now)
        self._maybe_become_quiesced(replica, now)

    def _maybe_become_quiesced(self, replica: Replica, now: float) -> None:
        if replica.lead_quiesce != "quiescing":
            return
        if any(p not in replica.quiesce_acks and self.network.is_up(p) for p in replica.followers):
            return
        wake_at = self._quiesced_wake_at(replica)
        # Not while a majority's nodes are about to count as silent: it would wake at once.
        if wake_at is None or wake_at > now + self.config.heartbeat_interval_s:
            replica.lead_quiesce = "quiesced"
            if wake_at is not None:
                self._push_due(replica, wake_at)

    def _on_control(self, replica: Replica, peer_id: str, kind: str, message: Any) -> None:
        """QUIESCE, QUIESCED and UNQUIESCE (steps 2 and 3 of raft/quiesce.py)."""
        if kind == quiesce.QUIESCE:
            if replica.accept_quiesce(peer_id, message):
                fields = {"last": message["last"], "round": message.get("round")}
                replica.send_control(quiesce.QUIESCED, [peer_id], **fields)
                self._touched.add(replica)  # applies what it must; _after_tick parks it
        elif kind == quiesce.QUIESCED:
            if (
                replica.lead_quiesce == "quiescing"
                and message.get("term") == replica.syncobj.raftCurrentTerm
                and message.get("last") == replica.journal.last_index
                and message.get("round") == replica.quiesce_round
            ):
                replica.quiesce_acks.add(peer_id)
                self._maybe_become_quiesced(replica, time.monotonic())
        elif (kind == quiesce.UNQUIESCE and replica.quiesced_leader == peer_id) or (
            kind == quiesce.WAKE and replica.lead_quiesce != "active"
        ):
            self._touch(replica)  # its leader resumed ticking / a member needs heartbeats

    def _poll_timeout(self, now: float) -> float:
        if self._ready or self._calls or self._touched:
            return 0.0
        if not self._due:
            return self.config.tick_interval_s
        return min(self.config.tick_interval_s, max(0.0, self._due[0][0] - now))

    def _sync_and_release(self, touched: Iterable[Replica]) -> None:
        # Steps 4 to 6 of the round. append_entries leave first, so a follower's fsync
        # overlaps the leader's; replies and votes leave only after the journals are durable.
        self.network.write_unheld()
        for replica in touched:
            if replica.journal.needs_sync():
                replica.journal.sync()
                self.syncs += 1
            if not replica.journal.is_synced():
                # Only touched groups change their journals; a miss here would let a reply
                # out before what it acknowledges is durable. Stop rather than do that.
                raise JournalCorrupt(f"group {replica.group_id}: journal changed but not synced")
        self.network.release()

    def _on_message(self, group_id: int, peer_id: str, message: Any) -> None:
        replica = self.groups.get(group_id)
        if replica is None:
            self.network.stats.frames_unknown_group += 1
            return
        kind = message.get("type") if isinstance(message, dict) else None
        if kind in quiesce.CONTROL_TYPES:
            self._on_control(replica, peer_id, kind, message)
            return
        if kind == "request_vote" and not membership.is_member(replica, peer_id):
            # A replica outside the configuration (opened before its add, or removed and
            # not yet deleted) cannot win; its vote requests would only bump the term.
            self.network.stats.votes_dropped_non_member += 1
            return
        if replica.in_quiescence and not replica.is_benign(peer_id, message):
            self._touch(replica)  # un-quiesced, and ticked now: heartbeats resume at once
        journal = replica.journal
        message = trim_append_entries(message, journal.term_at, journal.last_index)
        replica.transport.deliver(peer_id, message)
        # A snapshot from the leader is installed during deliver(); if its restore failed,
        # pysyncobj queued a success reply anyway: stop now, before the round releases it.
        replica.raise_failure()
        if replica.needs_tick_after(message):
            self._touched.add(replica)

    def _on_peer_up(self, peer_id: str) -> None:
        for replica in self.groups.values():
            replica.transport.peer_up(peer_id)
            # The peer may have restarted and lost its groups' state: heartbeat it again.
            if replica.lead_quiesce != "active" and peer_id in replica.members:
                self._touch(replica)

    def _on_peer_down(self, peer_id: str) -> None:
        for replica in self.groups.values():
            replica.transport.peer_down(peer_id)

    def _shutdown(self) -> None:
        for replica in self.groups.values():
            try:
                replica.stop()
            except Exception:
                logger.exception("stopping group %d", replica.group_id)
        self.network.close()
        self._stopped.set_result(None)


def _close_pysyncobj_files(sync_obj: Any) -> None:
    """Close what SyncObj.destroy() leaves open in pysyncobj 0.3.17 with autoTick=False.

    Its notifier pipe pair, and a snapshot being sent or received: harmless at process exit,
    a leak of two or more descriptors per remove_group otherwise. Private names: the
    version is pinned.
    """
    notifier = getattr(sync_obj, "_SyncObj__pipeNotifier", None)
    if notifier is not None:
        pipe_r = notifier._PipeNotifier__pipeR
        sync_obj._poller.unsubscribe(pipe_r)
        for fd in (pipe_r, notifier._PipeNotifier__pipeW):
            with contextlib.suppress(OSError):
                os.close(fd)
    serializer = sync_obj._SyncObj__serializer
    incoming = serializer._Serializer__incomingTransmissionFile
    if incoming is not None and not isinstance(incoming, bytes):  # bytes: in-memory mode
        incoming.close()
        serializer._Serializer__incomingTransmissionFile = None
    for transmission in serializer._Serializer__transmissions.values():
        file = transmission.get("file")
        if file is not None:
            file.close()
    serializer._Serializer__transmissions.clear()


def _close_dropped_transfers(serializer: Any) -> None:
    """Make pysyncobj 0.3.17's Serializer close the snapshot files it drops.

    A leader opens its snapshot file once per follower it sends it to, and forgets it
    unclosed when the transfer ends, is cancelled, or a new snapshot resets the transfers:
    a descriptor leaked per transfer until the garbage collector (and a ResourceWarning).
    Each of the three methods that drop transfers is wrapped to close what it dropped.
    """

    def closing(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            before: dict[Any, dict[str, Any]] = serializer._Serializer__transmissions
            if not before:  # the usual case (checkSerializing runs in every tick)
                return method(*args)
            files = [t["file"] for t in before.values() if "file" in t]
            try:
                return method(*args)
            finally:
                kept = {id(t.get("file")) for t in serializer._Serializer__transmissions.values()}
                for file in files:
                    if id(file) not in kept:
                        file.close()

        return call

    for name in ("getTransmissionData", "checkSerializing", "cancelTransmisstion"):
        setattr(serializer, name, closing(getattr(serializer, name)))


def _record_reason(outcome: list[int], _result: Any, reason: int) -> None:
    outcome.append(reason)


def _expire(future: asyncio.Future[Any], group_id: int, timeout_s: float) -> None:
    if not future.done():
        future.set_exception(Timeout(group_id, timeout_s))


def _settle_batch(batch: tuple[_Proposal, ...], result: Any, error: BaseException | None) -> None:
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

"""Replica: one Raft group on one node, and its async facade `await replica.propose(command)`.

`Replica.propose(command)` resolves after the command is committed by a majority and
applied by this node's state machine, with the state machine's result. On a follower
pysyncobj forwards the command to the leader and the future still resolves after the local
apply. With wait="append" (acks=1) the leader answers after step 5 of the round that
appended the command to its journal (`Replica.take_appended`). pysyncobj's FAIL_REASON
codes become raft/errors.py exceptions here (through raft/proposals.py).

A Replica owns its group's SyncObj (raft/group_syncobj.py), DurableJournal, GroupTransport
and snapshot file (raft/snapshot.py); the RaftNode that hosts it (raft/node.py) owns the
tick thread and decides, each round, which replicas to tick: the round's steps are in
raft/node.py's docstring. propose() and status() run on the event loop; every other
method runs on the node's tick thread. The node is seen here only through `ReplicaHost`,
the few things a replica asks of it, so that this module does not import raft/node.py.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, Protocol

from pysyncobj import FAIL_REASON
from pysyncobj.node import Node
from pysyncobj.syncobj import _COMMAND_TYPE

from raft import prevote, quiesce
from raft.config import RaftConfig, build_syncobj_conf
from raft.errors import (
    CommandTooLarge,
    Discarded,
    GroupStalled,
    NotLeader,
    OutcomeUnknown,
    QueueFull,
    RaftError,
    ReplicaStopped,
    StalledInFlight,
    StoppedInFlight,
)
from raft.group_syncobj import (
    GroupSyncObj,
    become_follower_at,
    close_dropped_transfers,
    close_pysyncobj_files,
    leader_ready,
)
from raft.journal import DurableJournal
from raft.proposals import Proposal, encode_batch, error_for, expire, take_batch
from raft.read_index import READ, PendingRead, ReadIndexState
from raft.snapshot import SNAPSHOT_FILE, read_snapshot, write_snapshot
from raft.transport import GroupTransport, Network
from raft.types import ReplicaStatus, StateMachine

logger = logging.getLogger(__name__)

# A proposal with no timeout of its own waits this long.
PROPOSE_TIMEOUT_S_DEFAULT = 10.0
# A read_index() with no timeout of its own waits this long (a new leader applying its
# no-op, a confirmation round to followers: normally one round trip).
READ_TIMEOUT_S_DEFAULT = 5.0
# While no leader is known, propose() retries this often (doubling up to the max).
PROPOSE_RETRY_S_MIN = 0.005
PROPOSE_RETRY_S_MAX = 0.1
# Proposals handed to pysyncobj per group per round, at most (each is one Raft entry).
BATCHES_PER_ROUND_MAX = 8
# A stalled group (its storage refused a write: raft/README.md, "A full disk") retries
# this often: one sync (and one tick) per retry, so a full disk costs almost nothing.
STALL_RETRY_S = 0.2
# An idle follower that hears from its leader is ticked at least this often (pysyncobj's
# once-a-second journal timer and time-based log compaction run in its tick).
FOLLOWER_QUIET_MAX_S = 1.0
# A new group's first election (`Replica.stand_first`): its preferred member campaigns
# after this fraction of the minimum election timeout; every other member holds its first
# campaign back by this many maximum election timeouts, plus a random one.
PREFERRED_FIRST_CAMPAIGN_FRACTION = 0.25
OTHERS_FIRST_HOLD_TIMEOUTS = 2
# A compaction asked for by size that has not happened (a full disk put it off) is asked
# for again after this long.
COMPACTION_ASK_AGAIN_S = 10.0


class ReplicaHost(Protocol):
    """What a Replica uses of the RaftNode that hosts it (raft/node.py's RaftNode is one).

    Read-only properties, so that RaftNode's plain attributes satisfy them. The broker's
    read lease reads `config`, `network.last_heard` and `round_done_at` through
    `replica.node` too.
    """

    @property
    def node_id(self) -> str: ...

    @property
    def config(self) -> RaftConfig: ...

    @property
    def network(self) -> Network: ...

    @property
    def durable_trace(self) -> bool: ...

    @property
    def failed(self) -> BaseException | None: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def round_done_at(self) -> float: ...

    def address_of(self, node_id: str | None) -> str | None: ...

    def schedule(self, replica: Replica) -> None:
        """The replica has new proposals (event loop thread): drain them next round."""

    def settle(self, batch: tuple[Proposal, ...], result: Any, error: BaseException | None) -> None:
        """Answer a batch's proposers on their event loop (from the tick thread)."""

    def call_soon_after_round(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any
    ) -> None:
        """Run fn(*args) on `loop`, batched with the tick thread's round (RaftNode)."""


class Replica:
    """One group on one node: `await propose(command)` and `status()`.

    propose() and status() are for the event loop that started the RaftNode; the other
    methods run on the node's tick thread.
    """

    def __init__(
        self,
        node: ReplicaHost,
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
        self._pending: collections.deque[Proposal] = collections.deque()  # loop -> tick thread
        self._queued = False  # in node._ready; cleared by the tick thread before draining
        self._inflight = 0  # proposals between propose() and its return (loop thread only)
        self._inflight_bytes = 0
        self._submitted: set[tuple[Proposal, ...]] = set()  # tick thread only
        # Batches handed to pysyncobj in this round that hold a wait="append" proposal; looked
        # at right after this round's tick (take_appended), then forgotten.
        self._append_batches: list[tuple[Proposal, ...]] = []
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
        self.busy_at = 0.0  # as leader: the last tick after which it was not quiesce_ready
        self.quiesced_leader: str | None = None
        self.quiesce_timeout_s = 0.0  # the follower's election timeout while quiesced
        # A full disk (raft/README.md): set while this group's journal or state machine
        # cannot write. The node then neither ticks it nor delivers to it, and retries at
        # stall_retry_at; proposals are refused with GroupStalled meanwhile.
        self.stall: GroupStalled | None = None
        self.stall_retry_at = 0.0
        self.stalls = 0  # times this group stalled or failed a retry (a metric)
        self.stall_reported = False  # logged as stalled, not yet as resumed (tick thread)
        # write_gate() False: this node's disk is below its floor. As a follower the group
        # then takes no new entries (it stops acknowledging; the majority carries on). The
        # metadata group has none: it may use the reserve below the floor.
        self.write_gate: Callable[[], bool] | None = None
        # ReadIndex (raft/read_index.py): reads waiting on this replica as leader.
        self.reads = ReadIndexState()
        # Pre-vote (raft/prevote.py), tick thread only: the round this node asks for, the
        # term in which a won round lets pysyncobj campaign, when an append_entries from
        # the leader it follows last came, and the rounds asked for (a metric).
        self.prevote_round: prevote.PreVoteRound | None = None
        self.prevote_won_term: int | None = None
        # The member its leadership belongs on (RaftNode.add_group): a new group's first
        # election goes to it, and the leader balancer moves the group back to it.
        self.preferred_leader: str | None = None
        # The journal's first index when a compaction was last asked for, and until when
        # not to ask again while it stays so (_maybe_force_compaction).
        self._compaction_asked = (-1, 0.0)
        self.leader_heard_at = 0.0
        self.prevotes_sent = 0
        self._status = ReplicaStatus(group_id, node.node_id, False, None, 0, 0, 0, 0)
        self.journal = DurableJournal(
            directory,
            durability=self._config.durability,
            cache_bytes_max=self._config.journal_cache_bytes_max,
            write_buffer_bytes_max=self._config.journal_write_buffer_bytes_max,
            snapshot_path=directory / SNAPSHOT_FILE,
            durable_trace=node.durable_trace,
        )
        self._finish_interrupted_compaction()
        self.syncobj, self.transport = self._open_syncobj(members)
        close_dropped_transfers(self.syncobj._SyncObj__serializer)
        self._apply_batch_id = self.syncobj._methodToID[self.syncobj._getFuncName("_apply_batch")]
        self.next_due = 0.0
        self.last_tick = 0.0
        self.last_leader_id: str | None = None  # RaftNode counts leader changes (a metric)
        self.snapshots_written = 0
        self.snapshots_restored = 0  # at start-up from its own file, or sent by the leader

    def _open_syncobj(self, members: list[str]) -> tuple[GroupSyncObj, GroupTransport]:
        """The group's SyncObj, with this replica's journal and snapshot hooks, and the
        GroupTransport pysyncobj builds for it (through transportClass) on the node's Network."""
        node = self.node
        conf = build_syncobj_conf(
            self._config,
            journal=self.journal,
            snapshot_path=str(self.directory / SNAPSHOT_FILE),
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
                group_id=self.group_id,
                term_at=self.journal.term_at,
            )
            holder.append(transport)
            return transport

        syncobj = GroupSyncObj(
            self.machine,
            Node(node.node_id),
            [Node(member) for member in members if member != node.node_id],
            conf,
            transportClass=make_transport,
        )
        return syncobj, holder[0]

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
        NotApplied error, or Timeout if the command may still commit. A follower cut off
        from its leader (`leader_lost`) raises NotLeader at once instead, nothing proposed:
        forwarded, the command would be lost in the cut, and the leader may stay out of
        reach for as long as the partition lasts (a bridge partition: raft/README.md).
        """
        if wait not in ("apply", "append"):
            raise ValueError(f"wait must be 'apply' or 'append', not {wait!r}")
        loop = asyncio.get_running_loop()
        timeout = PROPOSE_TIMEOUT_S_DEFAULT if timeout_s is None else timeout_s
        deadline = loop.time() + timeout
        delay = PROPOSE_RETRY_S_MIN
        while True:
            if self.leader_lost(time.monotonic()):
                raise NotLeader(self.group_id, None, None)
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
        stall = self.stall
        if stall is not None:
            raise GroupStalled(str(stall), no_space=stall.no_space)
        if len(command) > self._config.batch_bytes_max:
            raise CommandTooLarge(self.group_id, len(command), self._config.batch_bytes_max)
        if (
            self._inflight >= self._config.proposals_max
            or self._inflight_bytes + len(command) > self._config.proposal_bytes_max
        ):
            raise QueueFull(self.group_id, self._config.proposals_max)
        loop = asyncio.get_running_loop()
        proposal = Proposal(bytes(command), loop.create_future(), append)
        self._inflight += 1
        self._inflight_bytes += len(command)
        # One timer handle per proposal: asyncio.wait_for costs three times as much, and
        # at tens of thousands of proposals a second that is the event loop's main cost.
        timer = loop.call_at(deadline, expire, proposal.future, self.group_id, timeout_s)
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

    def leader_lost(self, now: float) -> bool:
        """A follower that followed a leader since it opened and has not heard from it
        within the maximum election timeout (a quiesced follower: from its node): its
        own election deadline has passed, so the leader is dead or out of reach. A group
        that never had a leader here (just opened) is not lost: one is being elected.
        Any thread: it reads values the tick thread writes, so it may lag by a round,
        which only shifts by a round the moment proposals start or stop being refused."""
        if self._status.is_leader:
            return False
        quiesced = self.quiesced_leader
        if quiesced is not None:
            heard = self.node.network.last_heard.get(quiesced, 0.0)
        else:
            heard = self.leader_heard_at
        return heard > 0.0 and now - heard >= self._config.election_timeout_max_s

    async def read_index(self, *, timeout_s: float | None = None) -> int:
        """ReadIndex (raft/read_index.py): wait until a read of this replica's state machine
        is linearizable, and return the commit index it is at least at.

        On the leader: the commit index when the read reached the tick thread, once a
        majority confirmed in a round sent after that that this node still leads, and once
        this node applied that index. Read the state machine right after it returns.
        Raises NotLeader at once on a follower or when leadership is lost meanwhile,
        QueueFull past reads_max, Timeout at the deadline (default 5 s).
        """
        if self.node.failed is not None or self.node.stopping or self.stopped:
            raise self._stopped_error()
        stall = self.stall
        if stall is not None:
            if not self.followers and self.syncobj._isLeader():
                # A group of one member: no other node can lead it or commit to it, so what
                # this node applied is the latest state; a full disk stalls its writes, not
                # its reads. A stalled member of a larger group cannot confirm: refused.
                return int(self.syncobj.raftLastApplied)
            raise GroupStalled(str(stall), no_space=stall.no_space)
        if len(self.reads) >= self._config.reads_max:
            raise QueueFull(self.group_id, self._config.reads_max)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()

        def answer(index: int | None, error: BaseException | None) -> None:  # tick thread
            self.node.call_soon_after_round(loop, _settle_read, future, index, error)

        timeout = READ_TIMEOUT_S_DEFAULT if timeout_s is None else timeout_s
        timer = loop.call_later(timeout, expire, future, self.group_id, timeout)
        try:
            self.reads.incoming.append(PendingRead(answer))
            self.node.schedule(self)
            return await future
        finally:
            timer.cancel()

    # --- the tick thread's side -------------------------------------------------------------

    def drain_proposals(self) -> bool:
        """Hand waiting proposals to pysyncobj, coalesced; True if any were handed over."""
        handed = False
        for _ in range(BATCHES_PER_ROUND_MAX):
            batch = take_batch(
                self._pending, self._config.batch_commands_max, self._config.batch_bytes_max
            )
            if not batch:
                break
            self._submitted.add(batch)
            if any(proposal.append for proposal in batch):
                self._append_batches.append(batch)
            callback = functools.partial(self._on_batch_result, batch)
            command = encode_batch(self._apply_batch_id, batch)
            self.syncobj._applyCommand(command, callback, _COMMAND_TYPE.REGULAR)
            handed = True
        return handed

    def take_appended(self) -> list[Proposal]:
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

    def _on_batch_result(self, batch: tuple[Proposal, ...], result: Any, reason: int) -> None:
        self._submitted.discard(batch)
        error = None if reason == FAIL_REASON.SUCCESS else self._error_for(reason)
        self.node.settle(batch, result, error)

    def _error_for(self, reason: int) -> RaftError:
        leader = self.syncobj._getLeader()
        leader_id = None if leader is None else str(leader.id)
        return error_for(
            reason,
            self.group_id,
            leader_id,
            self.node.address_of(leader_id),
            self._config.commands_queue_size,
        )

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
        if not len(self.journal) and not self.syncobj._SyncObj__needLoadDumpFile:
            # No entry, not even its snapshot's last: pysyncobj reads the log's first entry
            # in any tick with entries to apply (IndexError, and the node stopped). It does
            # nothing until reopened on its snapshot, as it takes no message (RaftNode
            # _refuse_with_empty_log); the first tick, which loads the snapshot, still runs.
            return
        if self._config.pre_vote:
            self.maybe_hold_election(time.monotonic())
        was_leader = self.syncobj._isLeader()
        self.syncobj.doTick(0.0)
        self.raise_failure()
        sync_obj = self.syncobj
        self._maybe_force_compaction(sync_obj)
        if was_leader and not sync_obj._isLeader():
            # Check-quorum stepped it down (a higher term arrives as a message, not in a
            # tick): no majority hears it, so nothing tells it its entries' fate soon.
            self.give_up_commits()
        leader = sync_obj._getLeader()
        if leader is not None and sync_obj._isLeader():
            # Leading counts as hearing from the leader (leader_lost): a leader deposed
            # by check-quorum refuses proposals an election timeout later, as a follower.
            self.leader_heard_at = time.monotonic()
        self._status = ReplicaStatus(
            self.group_id,
            self.node.node_id,
            bool(sync_obj._isLeader()),
            None if leader is None else str(leader.id),
            sync_obj.raftCurrentTerm,
            sync_obj.raftCommitIndex,
            sync_obj.raftLastApplied,
            len(self.journal),
            leader_ready(sync_obj),
        )

    def _maybe_force_compaction(self, sync_obj: Any) -> None:
        """pysyncobj compacts on a count of entries or on time only: past
        log_compaction_bytes, ask it for one (a flag its next tick reads). Once per
        compaction: asked again in the ticks before the first one ends, it ran a second
        right after on a journal a few MiB long."""
        journal = self.journal
        if journal.size_bytes <= self._config.log_compaction_bytes:
            return
        now = time.monotonic()
        if journal.first_index == self._compaction_asked[0] and now < self._compaction_asked[1]:
            return  # asked already, and no compaction since
        self._compaction_asked = (journal.first_index, now + COMPACTION_ASK_AGAIN_S)
        sync_obj.forceLogCompaction()

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
        # tuple() first: status readers call this off the tick thread, which may change the set
        # meanwhile (iterating it directly could raise "set changed size during iteration").
        others = tuple(self.syncobj._SyncObj__otherNodes)
        return sorted([self.node.node_id, *(str(n.id) for n in others)])

    @property
    def followers(self) -> list[str]:
        return [str(n.id) for n in self.syncobj._SyncObj__otherNodes]

    def followers_out_of_sync(self, is_up: Callable[[str], bool], now: float, lag_s: float) -> int:
        """Leader, tick thread: followers whose link is down, or that lack committed
        entries and were not heard from for `lag_s` (RaftNode.followers_out_of_sync)."""
        sync_obj = self.syncobj
        commit = int(sync_obj.raftCommitIndex)
        match_index: dict[Any, int] = sync_obj._SyncObj__raftMatchIndex
        heard: dict[Any, float] = sync_obj._SyncObj__lastResponseTime
        return sum(
            1
            for node in tuple(sync_obj._SyncObj__otherNodes)
            if not is_up(node.id)
            or (match_index.get(node, 0) < commit and now - heard.get(node, 0.0) > lag_s)
        )

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

    # --- ReadIndex and pre-vote (raft/read_index.py, raft/prevote.py; tick thread) ----------

    def step_reads(self) -> None:
        """ReadIndex steps 1 to 3 for this replica's reads: after reads arrived, after a
        tick (the role, the commit and applied indexes may have moved), after an ack."""
        reads = self.reads
        if not reads:
            return
        sync_obj = self.syncobj
        if self.stopped or not sync_obj._isLeader():
            reads.fail_all(self._stopped_error() if self.stopped else self._not_leader())
            return
        if reads.new_term(sync_obj.raftCurrentTerm) and reads.waiting:
            stale, reads.waiting = reads.waiting, []  # rounds of a term this node left
            for read in stale:
                read.answer(None, self._not_leader())
        if not leader_ready(sync_obj):
            return  # a new leader: its commit index is known once its no-op is applied
        if reads.record(int(sync_obj.raftCommitIndex)):
            seq = reads.next_round()
            self.send_control(READ, self.followers, seq=seq)
        reads.answer_ready(reads.confirmed(self.followers), int(sync_obj.raftLastApplied))

    def _not_leader(self) -> NotLeader:
        leader = self.syncobj._getLeader()
        leader_id = None if leader is None or self.syncobj._isLeader() else str(leader.id)
        return NotLeader(self.group_id, leader_id, self.node.address_of(leader_id))

    def send_to(self, peer_id: str, message: dict[str, Any]) -> None:
        for node in self.syncobj._SyncObj__otherNodes:
            if node.id == peer_id:
                self.transport.send(node, message)

    def maybe_hold_election(self, now: float) -> bool:
        """Pre-vote step 1, just before a tick: an election pysyncobj would start now is
        held and a pre-vote round asked for instead; True if it was."""
        sync_obj = self.syncobj
        if (
            sync_obj._isLeader()
            or sync_obj._SyncObj__raftElectionDeadline >= now
            or sync_obj._SyncObj__transferInProgress  # TimeoutNow: the leader asked
            or not sync_obj._SyncObj__otherNodes  # one member: nobody to ask
            or not sync_obj._SyncObj__connectedToAnyone()  # pysyncobj would not campaign
        ):
            return False
        term = int(sync_obj.raftCurrentTerm)
        if self.prevote_won_term == term:
            self.prevote_won_term = None
            return False  # a majority granted: pysyncobj campaigns in this tick
        sync_obj._SyncObj__raftElectionDeadline = now + sync_obj._SyncObj__generateRaftTimeout()
        # Its leader went silent: it knows none (as pysyncobj's campaign would have said),
        # and the commands it forwarded to that leader fail now with LEADER_CHANGED
        # (OutcomeUnknown), as pysyncobj's campaign fails them, not at their deadline.
        if sync_obj._SyncObj__raftLeader is not None:
            sync_obj._SyncObj__raftLeader = None
            sync_obj._SyncObj__onLeaderChanged()
            self.give_up_commits()
        self.prevote_round = prevote.PreVoteRound(term + 1)
        self.prevotes_sent += 1
        message = prevote.request(term, *self._last_log())
        for node in sync_obj._SyncObj__otherNodes:
            self.transport.send(node, message)
        return True

    def stand_first(self, preferred: str, now: float) -> None:
        """A new group's first election goes to its preferred member (Kafka's preferred
        replica; the broker's placement picks one per partition, balanced over brokers), so
        that a fresh topic's leaders start where the placement put them instead of wherever
        a timer fired first (skewed, then moved one by one by the leader balancer).

        The preferred member campaigns soon (its pre-vote round, then pysyncobj's election);
        the others hold their first campaign back by OTHERS_FIRST_HOLD_TIMEOUTS election
        timeouts: the preferred member has two rounds or more to win, or to find peers
        that opened the group after it. A bias, not a rule: if the preferred member is down
        the others elect one of them after the hold, and nothing changes once the group had
        a term. A group that is not new (it has a term, or entries past pysyncobj's first
        no-op: a reopen after a restart) is left as it is.
        """
        sync_obj = self.syncobj
        if int(sync_obj.raftCurrentTerm) != 0 or self._last_log()[0] > 1:
            return
        if preferred == self.node.node_id:
            delay = PREFERRED_FIRST_CAMPAIGN_FRACTION * self._config.election_timeout_min_s
        else:
            hold = OTHERS_FIRST_HOLD_TIMEOUTS * self._config.election_timeout_max_s
            delay = hold + sync_obj._SyncObj__generateRaftTimeout()
        sync_obj._SyncObj__raftElectionDeadline = now + delay

    def give_up_commits(self) -> None:
        """This node lost its leader, or its leadership, without learning of a new one:
        every proposal batch handed to pysyncobj here and not settled yet (forwarded to
        the lost leader, or waiting for its entry to commit) fails now with OutcomeUnknown
        (the entry may still commit), not at its deadline: until the partition heals
        nothing would settle it, and its proposers may ask elsewhere meanwhile.
        pysyncobj's own later callback finds them answered (settle_batch skips them).
        Membership changes (raft/membership.py) are left to pysyncobj's callbacks."""
        batches, self._submitted = self._submitted, set()
        for batch in batches:
            error = OutcomeUnknown(
                f"group {self.group_id}: the leader was lost before the entry was known to "
                "commit; it may still commit"
            )
            self.node.settle(batch, None, error)

    def take_higher_term(self, term: int) -> None:
        """A member holds a later term (raft/higher_term.py step 2): follow no one at it;
        what a deposed leader held fails OutcomeUnknown, as at check-quorum."""
        if become_follower_at(self.syncobj, term):
            self.give_up_commits()

    def answer_prevote(self, peer_id: str, message: dict[str, Any], now: float) -> None:
        """Pre-vote step 2 (any member, no tick)."""
        last_index, last_term = self._last_log()
        granted = prevote.grant(
            message,
            current_term=int(self.syncobj.raftCurrentTerm),
            last_log_index=last_index,
            last_log_term=last_term,
            leader_alive=self.leader_alive(now),
        )
        self.send_to(peer_id, prevote.answer(message, granted))

    def _last_log(self) -> tuple[int, int]:
        """(index, term) of the last log entry as pysyncobj's own votes compare them
        (its private getters: the entry may be in the snapshot, not the journal)."""
        sync_obj = self.syncobj
        return (
            int(sync_obj._SyncObj__getCurrentLogIndex()),
            int(sync_obj._SyncObj__getCurrentLogTerm()),
        )

    def leader_alive(self, now: float) -> bool:
        """This node leads, or heard from the leader it follows within the minimum election
        timeout (a quiesced follower: from that leader's node)."""
        sync_obj = self.syncobj
        if sync_obj._isLeader():
            return True
        if self.quiesced_leader is not None:
            heard = self.node.network.last_heard.get(self.quiesced_leader, 0.0)
        elif sync_obj._getLeader() is not None:
            heard = self.leader_heard_at
        else:
            return False
        return now - heard < self._config.election_timeout_min_s

    def on_prevote_answer(self, peer_id: str, message: dict[str, Any]) -> bool:
        """Pre-vote step 3: count a grant; True once a majority granted (then the node
        ticks this replica: pysyncobj campaigns at once)."""
        round_ = self.prevote_round
        sync_obj = self.syncobj
        if (
            round_ is None
            or not message.get("granted")
            or message.get("term") != round_.term
            or sync_obj.raftCurrentTerm != round_.term - 1
            or sync_obj._isLeader()
        ):
            return False
        round_.grants.add(peer_id)
        if not prevote.won(round_, len(self.members)):
            return False
        self.prevote_round = None
        self.prevote_won_term = int(sync_obj.raftCurrentTerm)
        sync_obj._SyncObj__raftElectionDeadline = 0.0
        return True

    def stop(self) -> None:
        """Close the group's files and fail every proposal not answered yet (idempotent)."""
        if not self.stopped:
            self.stopped = True
            self.syncobj.destroy()  # autoTick=False: destroys transport and journal at once
            close_pysyncobj_files(self.syncobj)
        stopped = StoppedInFlight(f"group {self.group_id}: stopped on node {self.node.node_id}")
        for batch in list(self._submitted):
            self.node.settle(batch, None, stopped)
        self._submitted.clear()
        self._append_batches.clear()
        self.fail_pending()

    def become_stalled(self, reason: str, *, no_space: bool, now: float) -> None:
        """Storage refused a write (tick thread): stop until the retry at stall_retry_at.

        Proposals in pysyncobj's hands may still commit (here after the retry, or on the
        others): they are answered StalledInFlight now, and their later commit callback
        finds them answered. Proposals not handed over yet are refused."""
        self.stall = GroupStalled(
            f"group {self.group_id} on {self.node.node_id}: storage refused a write: {reason}",
            no_space=no_space,
        )
        self.stall_retry_at = now + STALL_RETRY_S
        self.stalls += 1
        in_flight = StalledInFlight(str(self.stall), no_space=no_space)
        for batch in list(self._submitted):
            self.node.settle(batch, None, in_flight)
        self._submitted.clear()
        self._append_batches.clear()
        self.fail_pending()

    def end_stall(self) -> None:
        self.stall = None

    def follows(self, peer_id: str, term: Any) -> bool:
        """Whether this replica follows `peer_id` as leader in `term` (its current term)."""
        sync_obj = self.syncobj
        leader = sync_obj._getLeader()
        return (
            not sync_obj._isLeader()
            and leader is not None
            and str(leader.id) == peer_id
            and term == sync_obj.raftCurrentTerm
        )

    def hold_election(self, now: float) -> None:
        """A message from the leader was refused (write_gate): its leader is alive all the
        same, so the election deadline moves as if the message had been delivered."""
        timeout = float(self.syncobj._SyncObj__generateRaftTimeout())
        self.syncobj._SyncObj__raftElectionDeadline = now + timeout

    def fail_pending(self) -> None:
        """Fail proposals still waiting for the tick thread and every read (a stopped,
        removed or stalled group)."""
        leftover = tuple(self._pending)
        self._pending.clear()
        if leftover or self.reads:
            stall = self.stall
            error: RaftError = (
                self._stopped_error()
                if stall is None or self.stopped
                else GroupStalled(str(stall), no_space=stall.no_space)
            )
            if leftover:
                self.node.settle(leftover, None, error)
            self.reads.fail_all(error)

    def _stopped_error(self) -> ReplicaStopped:
        return ReplicaStopped(f"group {self.group_id}: stopped on node {self.node.node_id}")

    # --- snapshots (pysyncobj's serializer hooks, on the tick thread) -----------------------

    def _write_snapshot(self, path: str, data: Any) -> None:
        """pysyncobj's `serializer(fileName, data)`: state + its raft bookkeeping, fsynced."""
        fsync = self._config.durability == "fsync"
        try:
            write_snapshot(path, data, self.machine.snapshot(), fsync=fsync)
        except OSError:
            # A full disk: pysyncobj logs it and tries at its next log compaction; the
            # half-written file (pysyncobj's `.tmp`) must not hold the space meanwhile.
            Path(path).unlink(missing_ok=True)
            raise
        self.snapshots_written += 1

    def _finish_interrupted_compaction(self) -> None:
        """At open, before pysyncobj loads its snapshot: the journal compaction a crash
        cut off after the snapshot was written is finished (DurableJournal.finish_compaction
        says why pysyncobj would otherwise drop every entry after the snapshot)."""
        path = self.directory / SNAPSHOT_FILE
        if not path.exists():
            return
        data, _ = read_snapshot(str(path))  # (last entry, previous entry, members)
        last, previous = data[0], data[1]
        dropped = self.journal.finish_compaction((previous[1], previous[2]), (last[1], last[2]))
        if dropped:
            logger.warning(
                "group %s: a compaction was cut off after its snapshot at index %d; "
                "dropped the %d journal entries the snapshot covers, kept the rest",
                self.group_id, last[1], dropped,
            )  # fmt: skip

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
        data, state = read_snapshot(path)
        self.machine.restore(state)
        self.snapshots_restored += 1
        return data

    def raise_failure(self) -> None:
        """Raise what pysyncobj swallowed (a failed restore), so that the node stops."""
        if self.failure is not None:
            raise RaftError(f"group {self.group_id}: {self.failure!r}") from self.failure


def _settle_read(
    future: asyncio.Future[int], index: int | None, error: BaseException | None
) -> None:
    """On the event loop: answer a read_index() (unless it timed out meanwhile)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(int(index or 0))

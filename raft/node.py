"""RaftNode: one thread, one TCP address, many pysyncobj groups (raft/replica.py's Replica).

A RaftNode owns a Network (raft/transport.py), the registry of its groups (each a Replica
with its SyncObj and DurableJournal), and the one tick thread that drives them all with
`doTick(0)`. Each round of that thread:

1. poll the sockets (at most until the next group is due): each received message is
   handed to its group at once; pysyncobj appends entries to the journal and queues its
   reply, which the transport holds (ReadIndex and pre-vote messages, raft/read_index.py
   and raft/prevote.py, are answered here by RaftNode, without a tick); if a reply is
   held, steps 4 to 6 run now for the groups the poll touched, so that a follower's
   acknowledgement does not wait for its ticks (its applies), and again at the end;
2. hand every group's waiting proposals to pysyncobj, coalesced into one command per group
   (group commit): the leader appends it to its journal and queues append_entries; new
   reads get their commit index and one confirmation round per group (`step_reads`,
   again after each tick of step 3);
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
4. write the queued append_entries to the sockets (they acknowledge nothing), then, if
   step 5 will wait for the disk, wake the event loop once for everything the round has
   for it (`call_soon_after_round`: answers to proposers, applied offsets), so it runs
   meanwhile (else that wake-up comes after step 6);
5. sync every journal changed in this round: one fdatasync per group covers all its
   entries of the round, and term and vote;
6. release the held messages (append and vote replies) to the sockets.

So no reply leaves before what it acknowledges is on disk; and a leader, which counts
itself in every majority, commits an entry only in a round after the one that appended it,
so after step 5 of that round made its own copy durable. raft/README.md has the whole
protocol and the proofs.

The facade a caller awaits, `Replica.propose(command)`, is in raft/replica.py; membership
changes are in raft/membership.py, leader balancing in raft/leadership.py, the quiescence
protocol in raft/quiesce.py (its scheduling is here, with the round's). `Replica`,
`ReplicaStatus` and `StateMachine` are re-exported for modules that import them from here.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import heapq
import itertools
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from pysyncobj import FAIL_REASON

from raft import higher_term, leadership, membership, prevote, quiesce, read_index
from raft.config import RaftConfig
from raft.errors import ApplyDeferred, ReplicaStopped, RequestDenied, Timeout
from raft.journal import JournalCorrupt, JournalWriteFailed
from raft.messages import trim_append_entries
from raft.proposals import Proposal, settle_batch
from raft.replica import STALL_RETRY_S, Replica
from raft.stats import LatencyBuckets
from raft.tls import RaftTls
from raft.transport import GROUP_ID_MAX, Network
from raft.types import ReplicaStatus, StateMachine

__all__ = ["RaftNode", "Replica", "ReplicaStatus", "StateMachine"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


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
        cluster_id: bytes = b"",
        tls: RaftTls | None = None,
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
            cluster_id=cluster_id,  # raft/auth.py; b"": none known yet
            tls=tls,  # raft/tls.py; None: plain TCP
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
        # Metrics (raft/stats.py), tick thread only: how long each journal sync took, and
        # how often a group here saw a new leader (its first one included).
        self.sync_seconds = LatencyBuckets()
        self.leader_changes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._ready: collections.deque[Replica] = collections.deque()
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._wake_pending = False
        # Calls for event loops made by the tick thread during a round, handed over once per
        # round (call_soon_after_round has when); tick thread only.
        self._loop_calls: dict[
            asyncio.AbstractEventLoop, list[tuple[Callable[..., Any], tuple[Any, ...]]]
        ] = {}
        self._in_round = False
        self._tick_ident: int | None = None
        self._touched: set[Replica] = set()
        # (due time, tie-breaker, replica); an entry is stale if replica.next_due moved on.
        self._due: list[tuple[float, int, Replica]] = []
        self._due_seq = itertools.count()
        # Leadership transfers asked for and not yet seen done (raft/leadership.py).
        self._transfers: leadership.Transfers = {}
        # Groups whose storage refused a write (raft/README.md, "A full disk"): not
        # ticked, not delivered to, retried at their stall_retry_at.
        self._stalled: set[Replica] = set()
        self.frames_dropped_stalled = 0  # messages for a stalled group, dropped
        self.entries_refused_full = 0  # append_entries a write gate refused
        # raft/higher_term.py: stale leaders' and candidates' messages answered with this
        # node's higher term, and higher terms taken (a leader or candidate stepping down).
        self.higher_terms_answered = 0
        self.higher_terms_taken = 0
        self.frames_refused_empty_log = 0  # messages for a replica whose log holds no entry
        self._empty_log_warned: set[int] = set()  # group ids: logged once each

    def set_cluster_id(self, cluster_id: bytes) -> None:
        """Name this cluster in every hello from now on, and refuse hellos naming another
        (raft/auth.py). Connections already up stay: their peers named none, or this one."""
        self.network.cluster_id = cluster_id

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
        prompt_commit_index: bool = False,
        preferred_leader: str | None = None,
    ) -> Replica:
        """Create (or reopen from its directory) group `group_id` with these members.

        members_from_log: on reopening, the membership changes in the group's journal
        override `members` (membership.adopt_logged_changes), as Raft requires when the
        caller cannot know the current members (the metadata group's own voters).
        prompt_commit_index: as leader, send followers each new commit index at once, so
        that what they applied trails this node by a round, not by up to a heartbeat
        (raft/transport.py, "Commit index"): for a machine read on every member (the
        metadata catalogue), at the cost of a frame each way per commit.
        preferred_leader: the member the group's leadership belongs on: a new group's
        first election goes to it (`Replica.stand_first`; not for a group reopened with a
        term), and the leader balancer moves the group back to it (raft/leadership.py)."""
        return await self._on_tick_thread(
            lambda: self._add_group(
                group_id, machine, members, members_from_log, prompt_commit_index, preferred_leader
            )
        )

    async def remove_group(self, group_id: int, *, delete: bool = False) -> None:
        """Stop group `group_id` on this node; with delete=True also remove its directory.

        Its proposals fail with ReplicaStopped, its files are closed, frames for it count as
        for an unknown group. It may be added again with the same id (reopened from its
        directory unless deleted). Deleting drops entries this node may have acknowledged:
        only for a group no longer replicated here (the caller's membership decision).
        """
        await self._on_tick_thread(lambda: self._remove_group(group_id, delete=delete))

    async def on_tick_thread(self, call: Callable[[], _T]) -> _T:
        """Run `call` on the tick thread, between two rounds, and return its result: for
        a caller changing what the thread uses (e.g. reloading the RaftTls contexts' files)."""
        return await self._on_tick_thread(call)

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
        prompt_commit_index: bool = False,
        preferred_leader: str | None = None,
    ) -> Replica:
        if not 0 <= group_id <= GROUP_ID_MAX:
            raise ValueError(f"group id {group_id} out of range")
        if group_id in self.groups:
            raise ValueError(f"group {group_id} exists on node {self.node_id}")
        member_list = sorted(self.peers if members is None else members)
        unknown = set(member_list) - set(self.peers)
        if unknown or self.node_id not in member_list:
            raise ValueError(f"group {group_id}: bad members {member_list}")
        if preferred_leader is not None and preferred_leader not in member_list:
            raise ValueError(f"group {group_id}: preferred leader {preferred_leader} not a member")
        directory = self.data_dir / "groups" / str(group_id)
        replica = Replica(self, group_id, directory, machine, member_list)
        replica.transport.lazy_commit_index = not prompt_commit_index
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
        elif preferred_leader is not None:
            replica.stand_first(preferred_leader, time.monotonic())
        replica.preferred_leader = preferred_leader  # where the leader balancer sends it back
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

    async def maybe_balance_leaders(
        self,
        *,
        transfers_max: int = leadership.BALANCE_TRANSFERS_MAX,
        avoid: frozenset[str] = frozenset(),
    ) -> bool:
        """Hand the leadership of groups this node leads to the member that leads the
        fewest, while that member leads at least two fewer; True if it asked for at least
        one transfer. At most `transfers_max` per call; raft/leadership.py has the rules.

        Meant to run periodically on every node (each moves only what it leads). No
        group is handed to a node in `avoid` (the caller's choice: a full disk).
        """
        return await self._on_tick_thread(lambda: self._balance_leaders(transfers_max, avoid))

    def _balance_leaders(self, transfers_max: int, avoid: frozenset[str]) -> bool:
        # A peer this node has no connection to is no target: it leads nothing, so it
        # would always be the one chosen, and pysyncobj, which remembers its match index,
        # accepts a transfer to it that can never land (the group kept awake meanwhile).
        down = frozenset(p for p in self.peers if p != self.node_id and not self.network.is_up(p))
        return leadership.balance(
            self.node_id,
            self.peers,
            self.groups.values(),
            self._transfers,
            now=time.monotonic(),
            transfers_max=transfers_max,
            election_timeout_max_s=self.config.election_timeout_max_s,
            on_transfer=self._touch,  # its timeout_now leaves in this round
            avoid=avoid | down,
        )

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
            deadline = leadership.transfer_expiry(
                time.monotonic(), self.config.election_timeout_max_s
            )
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

    def settle(self, batch: tuple[Proposal, ...], result: Any, error: BaseException | None) -> None:
        """Answer a batch's proposers on their event loop (from the tick thread)."""
        loop = self._loop
        if loop is not None:
            self.call_soon_after_round(loop, settle_batch, batch, result, error)

    def call_soon_after_round(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any
    ) -> None:
        """Run fn(*args) on `loop`. From the tick thread during a round: all of the round's
        calls for one loop in one wake-up of it, in the order made, once the round's
        append_entries are written: before its journal syncs if one of them waits for the
        disk (fsync), else at the end of the round, after its replies are released (and
        calls made after the syncs, at the end). Anywhere else: at once, as
        loop.call_soon_threadsafe.

        Each wake-up of a loop is a write to its self-pipe, and the woken loop thread then
        takes the GIL from the tick thread at its next system call. Woken at each apply, it
        ran ahead of the rest of the round's ticks, syncs and sends, once per apply; woken
        here, it runs while the tick thread waits for the disk, or once the round's frames
        are out (#22). A closed loop is skipped: nobody waits on it.
        """
        if self._in_round and threading.get_ident() == self._tick_ident:
            self._loop_calls.setdefault(loop, []).append((fn, args))
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(fn, *args)

    def _flush_loop_calls(self) -> None:
        if not self._loop_calls:
            return
        batches, self._loop_calls = self._loop_calls, {}
        for loop, calls in batches.items():
            with contextlib.suppress(RuntimeError):  # closed: nobody waits on it any more
                loop.call_soon_threadsafe(_run_calls, calls)

    # --- the tick thread --------------------------------------------------------------------

    def _run(self) -> None:
        self._tick_ident = threading.get_ident()
        try:
            while not self.stopping:
                self._in_round = True
                try:
                    self._round()
                finally:
                    self._in_round = False
                    self._flush_loop_calls()
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
        if self.network.has_held():
            # Step 1's replies leave now, their journals synced first, not after this
            # round's ticks: a follower's applies are not on its leader's way to a commit.
            self._sync_and_release(tuple(self._touched))
        # Only the calls queued before this round: the event loop queues more meanwhile (a
        # broker opening 1,000 new replicas, 16 at a time, each an add_group of ~10 ms),
        # and draining until empty ran rounds of up to 1.8 s with no poll, tick or sync
        # (no election, no heartbeat) in between.
        for _ in range(len(self._calls)):
            self._calls.popleft()()
        while self._ready:
            replica = self._ready.popleft()
            replica._queued = False
            if self.groups.get(replica.group_id) is not replica or replica.stall is not None:
                replica.fail_pending()  # removed or stalled: proposals that raced with it
                continue
            if replica.drain_proposals():
                self._touch(replica)
            replica.step_reads()  # new reads: recorded, and one confirmation round sent
        self._take_due(time.monotonic())
        if self._stalled:
            self._retry_stalled(time.monotonic())
        touched, self._touched = self._touched, set()
        appended: list[Proposal] = []
        for replica in touched:
            if replica.stall is not None:
                continue  # stalled earlier in this round: its sync is still checked below
            try:
                replica.tick()
            except ApplyDeferred as deferred:
                self._stall(replica, str(deferred), no_space=deferred.no_space)
                continue
            if replica.stall_reported:  # the first tick after a stall went through
                replica.stall_reported = False
                logger.info("raft node %s: group %d resumes", self.node_id, replica.group_id)
            appended += replica.take_appended()
            self._after_tick(replica)
            replica.step_reads()  # the role, commit and applied indexes may have moved
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
            if (
                replica.next_due != due
                or self.groups.get(replica.group_id) is not replica
                or replica.stall is not None  # _retry_stalled looks after it
            ):
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
        leader = replica.status().leader_id
        if leader is not None and leader != replica.last_leader_id:  # a metric
            replica.last_leader_id = leader
            self.leader_changes += 1
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
            replica.leader_heard_at = last_heard.get(leader_id, 0.0)  # for pre-vote answers
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
            replica.busy_at = now
            self._unquiesce(replica)
            return
        if replica.lead_quiesce == "active" and (
            now - replica.busy_at < quiesce.IDLE_HEARTBEATS * self.config.heartbeat_interval_s
        ):
            return  # idle only just now: looked at again at its next heartbeat tick
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
        if any(replica.journal.sync_waits_for_disk() for replica in touched):
            self._flush_loop_calls()  # the loop runs while this thread waits for the disk
        failed = False
        for replica in touched:
            try:
                if replica.journal.needs_sync():
                    self.syncs += 1
                    started = time.perf_counter()
                    replica.journal.sync()
                    self.sync_seconds.observe(time.perf_counter() - started)
            except JournalWriteFailed as error:
                self._stall(replica, str(error), no_space=error.no_space)
                failed = True
                continue
            if not replica.journal.is_synced():
                # Only touched groups change their journals; a miss here would let a reply
                # out before what it acknowledges is durable. Stop rather than do that.
                raise JournalCorrupt(f"group {replica.group_id}: journal changed but not synced")
        if failed:
            # Held frames are per peer, not per group: drop them all, so that nothing the
            # failed sync was to cover is acknowledged. Raft tolerates lost messages; the
            # other groups' leaders send again at their next heartbeat.
            self.network.drop_held()
        self.network.release()

    # --- a full disk (raft/README.md, "A full disk") ----------------------------------------

    def _stall(self, replica: Replica, reason: str, *, no_space: bool) -> None:
        if not replica.stall_reported:  # once per stall, however often the retry fails
            replica.stall_reported = True
            logger.warning(
                "raft node %s: group %d stalls (retried every %.1f s): %s",
                self.node_id,
                replica.group_id,
                STALL_RETRY_S,
                reason,
            )
        replica.become_stalled(reason, no_space=no_space, now=time.monotonic())
        self._stalled.add(replica)
        self._touched.discard(replica)

    def _retry_stalled(self, now: float) -> None:
        """Sync each stalled group whose retry is due; on success tick it again this round
        (a deferred apply is tried again by that tick, and may stall the group anew)."""
        for replica in list(self._stalled):
            if self.groups.get(replica.group_id) is not replica:
                self._stalled.discard(replica)  # removed meanwhile
                continue
            if replica.stall_retry_at > now:
                continue
            try:
                replica.journal.sync()
            except JournalWriteFailed as error:
                replica.become_stalled(str(error), no_space=error.no_space, now=now)
                continue
            replica.end_stall()
            self._stalled.discard(replica)
            self._touch(replica)

    async def followers_out_of_sync(self, lag_s: float) -> dict[int, int]:
        """For each group led here: how many followers are not in sync, i.e. their link is
        down, or they lack committed entries and the leader heard nothing from them for
        `lag_s` (as Kafka's replica.lag.time.max.ms). One hop to the tick thread; {}
        once the node stops (no tick thread would run the call)."""
        if self.stopping or self.failed is not None:
            return {}

        def count() -> dict[int, int]:
            now = time.monotonic()
            out: dict[int, int] = {}
            for group_id, replica in self.groups.items():
                if replica.stopped or not replica.status().is_leader:
                    continue
                out[group_id] = replica.followers_out_of_sync(self.network.is_up, now, lag_s)
            return out

        return await self._on_tick_thread(count)

    def stalled_groups(self) -> list[int]:
        """Ids of the groups stalled now (any thread: a copy)."""
        return sorted(r.group_id for r in tuple(self._stalled))

    def _on_message(self, group_id: int, peer_id: str, message: Any) -> None:
        replica = self.groups.get(group_id)
        if replica is None:
            self.network.stats.frames_unknown_group += 1
            return
        if replica.stall is not None:
            self.frames_dropped_stalled += 1  # it acknowledges nothing until it resumes
            return
        if not len(replica.journal):
            self._refuse_with_empty_log(replica, peer_id, message)
            return
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == higher_term.HIGHER_TERM:
            self._on_higher_term(replica, peer_id, message)
            return
        self._maybe_answer_lower_term(replica, peer_id, kind, message)
        if kind in quiesce.CONTROL_TYPES:
            self._on_control(replica, peer_id, kind, message)
            return
        if kind in read_index.READ_TYPES or kind in prevote.PREVOTE_TYPES:
            self._on_read_or_prevote(replica, peer_id, kind, message)
            return
        if kind == "append_entries" and message.get("term", -1) >= replica.syncobj.raftCurrentTerm:
            replica.leader_heard_at = time.monotonic()  # pysyncobj follows the sender: alive
        if kind == "request_vote" and not membership.is_member(replica, peer_id):
            # A replica outside the configuration (opened before its add, or removed and
            # not yet deleted) cannot win; its vote requests would only bump the term.
            self.network.stats.votes_dropped_non_member += 1
            return
        if replica.in_quiescence and not replica.is_benign(peer_id, message):
            self._touch(replica)  # un-quiesced, and ticked now: heartbeats resume at once
        journal = replica.journal
        message = trim_append_entries(message, journal.term_at, journal.last_index)
        if self._refused_by_gate(replica, peer_id, kind, message):
            return
        replica.transport.deliver(peer_id, message)
        # A snapshot from the leader is installed during deliver(); if its restore failed,
        # pysyncobj queued a success reply anyway: stop now, before the round releases it.
        replica.raise_failure()
        if replica.needs_tick_after(message):
            self._touched.add(replica)

    def _refuse_with_empty_log(self, replica: Replica, peer_id: str, message: Any) -> None:
        """A replica whose log holds no entry takes no message, rather than stop the node.

        pysyncobj 0.3.17 always keeps one entry (the one its snapshot ends at) and reads the
        first or last in nearly every handler: with none, the first append_entries raised
        IndexError in `__getEntries`, which stopped the tick thread and the broker (issue
        39: a snapshot past its journal's end, then a compaction that dropped every entry).
        Refused, it acknowledges nothing and the majority commits without it; a message
        from a leader of its term or later holds its election back (that leader is alive),
        as a full disk's write gate does, so its own tick never campaigns on an empty log.
        It takes entries again once its log is anchored (restarted on its snapshot)."""
        self.frames_refused_empty_log += 1
        term = message.get("term") if isinstance(message, dict) else None
        leading = isinstance(message, dict) and message.get("type") == "append_entries"
        if leading and type(term) is int and term >= replica.syncobj.raftCurrentTerm:
            replica.hold_election(time.monotonic())
        if replica.group_id not in self._empty_log_warned:
            self._empty_log_warned.add(replica.group_id)
            logger.warning(
                "raft node %s: group %d has no log entry (not even its snapshot's last); "
                "it refuses every message from %s and the others until it is reopened",
                self.node_id, replica.group_id, peer_id,
            )  # fmt: skip

    def _maybe_answer_lower_term(
        self, replica: Replica, peer_id: str, kind: Any, message: Any
    ) -> None:
        """raft/higher_term.py step 1: a leader's (or candidate's) message of a lower term
        is answered with this node's term, which pysyncobj would never tell it; the message
        itself goes on to be ignored (pysyncobj) or refused (a pre-vote)."""
        reply = higher_term.answer_for(kind, message, int(replica.syncobj.raftCurrentTerm))
        if reply is not None and membership.is_member(replica, peer_id):
            replica.send_to(peer_id, reply)
            self.higher_terms_answered += 1

    def _on_higher_term(self, replica: Replica, peer_id: str, message: Any) -> None:
        """raft/higher_term.py step 2: a member holds a later term; take it and follow no
        one (a leader steps down), so that the group elects again with that member in it."""
        term = higher_term.newer_term(message, int(replica.syncobj.raftCurrentTerm))
        if term is None or not membership.is_member(replica, peer_id):
            return
        replica.take_higher_term(term)
        self.higher_terms_taken += 1
        logger.info(
            "raft node %s: group %d takes term %d from %s", self.node_id, replica.group_id,
            term, peer_id,
        )  # fmt: skip
        # Ticked and synced in this round: the term is on disk before any reply leaves, and
        # the election deadline (a leader's is long past) starts a pre-vote round at once.
        self._touch(replica)

    def _on_read_or_prevote(self, replica: Replica, peer_id: str, kind: Any, message: Any) -> None:
        """ReadIndex and pre-vote messages (raft/read_index.py, raft/prevote.py): answered
        here, without a tick, so a quiesced replica stays quiesced."""
        if kind == read_index.READ:
            ack = read_index.ack_for(message, int(replica.syncobj.raftCurrentTerm))
            if ack is not None:
                replica.send_to(peer_id, ack)
        elif kind == read_index.READ_ACK:
            if replica.reads.on_ack(peer_id, message.get("term"), message.get("seq")):
                replica.step_reads()
        elif not membership.is_member(replica, peer_id):
            self.network.stats.votes_dropped_non_member += 1  # as request_vote: cannot win
        elif kind == prevote.PREVOTE:
            replica.answer_prevote(peer_id, message, time.monotonic())
        elif replica.on_prevote_answer(peer_id, message):
            self._touch(replica)  # a majority granted: pysyncobj campaigns in this round

    def _refused_by_gate(self, replica: Replica, peer_id: str, kind: Any, message: Any) -> bool:
        """A follower whose write gate is shut (its disk below the floor) takes no new
        entries from the leader it follows: it does not acknowledge them, and the majority
        commits without it. Its election deadline moves as if they had come (the leader is
        alive), so it disrupts nobody; it catches up once the gate opens. As leader it
        takes no command a follower forwards (_maybe_refuse_forwarded)."""
        gate = replica.write_gate
        if kind == "apply_command" and gate is not None and replica.status().is_leader:
            return self._maybe_refuse_forwarded(replica, peer_id, message, gate)
        if (
            gate is None
            or kind != "append_entries"
            or not (message.get("entries") or "transmission" in message)
            or not replica.follows(peer_id, message.get("term"))
            or gate()
        ):
            return False
        replica.hold_election(time.monotonic())
        self.entries_refused_full += 1
        return True

    def _maybe_refuse_forwarded(
        self, replica: Replica, peer_id: str, message: Any, gate: Callable[[], bool]
    ) -> bool:
        """A leader whose write gate is shut takes no command a follower forwards (the
        follower's broker checked its own disk, not this one's): it answers NOT_LEADER,
        which the follower's propose() retries until the leadership moved to a broker
        with space (dmq/broker/storage.py hands it over) or its deadline."""
        if gate():
            return False
        self.entries_refused_full += 1
        node = next((n for n in replica.syncobj._SyncObj__otherNodes if n.id == peer_id), None)
        if node is not None and "request_id" in message:
            reply = {
                "type": "apply_command_response",
                "request_id": message["request_id"],
                "error": FAIL_REASON.NOT_LEADER,
            }
            replica.transport.send(node, reply)
        return True

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


def _run_calls(calls: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
    """On an event loop: a round's calls for it, in order (one failing does not stop the
    rest; it is logged as the loop would log a failing callback)."""
    for fn, args in calls:
        try:
            fn(*args)
        except Exception:
            logger.exception("callback %r from the raft tick thread failed", fn)

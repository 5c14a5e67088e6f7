"""The broker's view of the metadata group: the cluster catalogue and how to change it.

The metadata group (Raft group 0) runs dmq/metadata/machine.py's MetadataMachine on the voters
(bootstrapped from `metadata_voters`, then the catalogue's `voters`). The other brokers
are observers: they do not vote and follow the voters' state over HTTP. A broker switches
role when the voter set changes (raft/README.md, "Metadata voter changes"): an observer
in `voters_target` opens group 0 and serves the observed catalogue until its machine
caught up (promotion); a voter that the leader says left writes `metadata_left`, deletes
group 0 and follows (demotion); at start, group 0 opens whenever its directory exists.
Either way this service offers the same three things to the Broker:

- `state`: the catalogue as this broker last applied (voter) or received (observer). Reads
  are never older than that, and it only moves forward (`metadata_version` never drops);
- `propose(command)`: commit a command and return its `Applied` result once this broker's
  state includes it (read-your-writes), or raise the dmq error for a `Rejected` one;
- `read_barrier()`: a linearizable read. On the group-0 leader through ReadIndex
  (raft/read_index.py, no log entry); on another voter it commits a no-op heartbeat through
  the group (Raft's read-index by log); an observer asks a voter for its state after a
  barrier there and adopts it. `commit_barrier()` always commits the no-op (on a voter):
  for callers that must also learn the fate of entries already in the leader's log.

`on_change` is called on the event loop after every change of `metadata_version`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dmq import errors
from dmq.metadata.machine import (
    REJECT_NOT_ENOUGH_BROKERS,
    REJECT_PARTITION_GONE,
    REJECT_TOO_MANY_TOPICS,
    REJECT_TOPIC_EXISTS,
    REJECT_UNKNOWN_BROKER,
    REJECT_UNKNOWN_PARTITION,
    REJECT_UNKNOWN_TOPIC,
    REJECT_VOTERS_CHANGE_RUNNING,
    REJECT_VOTERS_UNKNOWN,
    Applied,
    BrokerHeartbeat,
    Command,
    CommandDecodeError,
    MetadataMachine,
    MetadataState,
    Rejected,
    Result,
    decode_command,
    encode_command,
    state_from_json,
    state_to_json,
)
from dmq.peers import PeerClient
from log.segment import write_durably
from raft import errors as raft_errors
from raft.node import RaftNode, Replica

_log = logging.getLogger("dmq.metadata.service")

METADATA_GROUP_ID = 0
# An observer's long-poll for a newer state: how long a voter holds it.
FOLLOW_WAIT_MS = 5_000
# After a failed follow call, the observer waits this long before the next voter.
FOLLOW_RETRY_S = 0.2
# How often a voter that does not lead asks the leader whether it is still a member
# (pysyncobj does not tell a removed one): a removed voter keeps its group-0 copy, idle,
# for up to this long. One read barrier on the leader per voter per check.
METADATA_MEMBERSHIP_CHECK_S = 2.0
# ... but only while it has a reason to doubt (no known leader, or a voter change in its
# catalogue: a removed member has one or the other), and else once in this long: each
# answer costs the leader a read barrier (a Raft commit), which must not keep an idle
# group 0 busy.
METADATA_MEMBERSHIP_CHECK_IDLE_S = 30.0
METADATA_LEFT_MARKER = "metadata_left"  # in <data dir>/meta/
# Written durably before a broker opens group 0 to become a voter, removed once its
# machine caught up: a broker killed in between reopens group 0 still promoting, with the
# members (and their Raft addresses) it opened with, which the marker records as JSON.
METADATA_PROMOTING_MARKER = "metadata_promoting"  # next to METADATA_LEFT_MARKER


def wall_ms() -> int:
    """The wall clock in ms: the time a proposer stamps into commands (and records)."""
    return time.time_ns() // 1_000_000


GROUP_REJECT_ERRORS: dict[str, type[errors.DmqError]] = {
    "unknown_member": errors.UnknownMember,
    "stale_generation": errors.StaleGeneration,
    "group_not_empty": errors.GroupNotEmpty,
    "group_not_found": errors.GroupNotFound,
    "inconsistent_assignor": errors.InconsistentAssignor,
    "unknown_partition": errors.PartitionNotFound,
    "lock_not_held": errors.LockNotHeld,  # share groups (groups/share.py)
}


TXN_REJECT_ERRORS: dict[str, type[errors.DmqError]] = {
    "unknown_transactional_id": errors.TransactionNotFound,
    "producer_fenced": errors.ProducerFenced,
    "invalid_txn_state": errors.InvalidTxnState,
    "concurrent_transactions": errors.ConcurrentTransactions,
}


def error_for_rejected(rejected: Rejected) -> errors.DmqError:
    """A metadata command's refusal as the user's error (the field names the input)."""
    field = rejected.field
    if rejected.code == REJECT_TOPIC_EXISTS:
        return errors.TopicAlreadyExists(rejected.message, field="name")
    if rejected.code == REJECT_UNKNOWN_TOPIC:
        return errors.TopicNotFound(rejected.message, field="topic")
    if rejected.code == REJECT_UNKNOWN_PARTITION:
        return errors.PartitionNotFound(rejected.message, field="partition")
    if rejected.code == REJECT_PARTITION_GONE:
        return errors.PartitionGone(rejected.message, field="partition")
    if rejected.code == REJECT_UNKNOWN_BROKER:
        return errors.BrokerUnavailable(rejected.message, retry_after_ms=500)
    if rejected.code == REJECT_NOT_ENOUGH_BROKERS:
        return errors.InvalidRequest(rejected.message, field="replication_factor")
    if rejected.code == REJECT_VOTERS_CHANGE_RUNNING:
        return errors.OperationConflict(rejected.message, field=field)
    if rejected.code == REJECT_VOTERS_UNKNOWN:  # the leader records group 0's set soon
        return errors.BrokerUnavailable(rejected.message, retry_after_ms=500)
    if rejected.code == REJECT_TOO_MANY_TOPICS:
        return errors.InvalidRequest(rejected.message, field="name")
    txn_error = TXN_REJECT_ERRORS.get(rejected.code)
    if txn_error is not None:  # transactions (dmq/metadata/transactions.py)
        return txn_error(rejected.message, field=field)
    group_error = GROUP_REJECT_ERRORS.get(rejected.code)
    if group_error is not None:  # consumer-group refusals (groups/state.py)
        return group_error(rejected.message, field=field)
    return errors.InvalidRequest(rejected.message, field=field)


def translate_raft_error(exc: raft_errors.RaftError, what: str) -> errors.DmqError:
    """raft/ errors at the Broker's border (they never reach users as they are)."""
    if isinstance(exc, raft_errors.QueueFull):
        return errors.Backpressure(f"{what}: too many proposals in flight", retry_after_ms=100)
    if isinstance(exc, raft_errors.CommandTooLarge):
        return errors.RecordTooLarge(f"{what}: {exc}", field="records")
    if isinstance(exc, raft_errors.GroupStalled):  # a full disk, or a failing one
        return storage_refusal(exc, what, no_space=exc.no_space)
    if isinstance(exc, raft_errors.StoppedInFlight):
        return errors.RequestTimeout(
            f"{what}: this broker stopped while the request was in flight; the outcome is unknown",
            retry_after_ms=1000,
        )
    if isinstance(exc, raft_errors.ReplicaStopped):
        return errors.BrokerUnavailable(f"{what}: this broker is stopping", retry_after_ms=1000)
    if isinstance(exc, raft_errors.NotApplied):  # NotLeader, Discarded, RequestDenied
        return errors.NotLeader(
            f"{what}: no leader could take the request: {exc}", retry_after_ms=200
        )
    # Timeout, OutcomeUnknown: it may still commit. A retry may duplicate it.
    return errors.RequestTimeout(f"{what}: {exc}; the outcome is unknown", retry_after_ms=200)


def storage_refusal(exc: Exception, what: str, *, no_space: bool) -> errors.DmqError:
    """A write the disk refused (raft/ GroupStalled, log/ StorageWriteError): 507 when
    the disk is full and nothing of the request is in the log, else 503; either way the
    broker goes on, and the group retries. A request already in the group's log when it
    stalled may still be applied after the retry: 503 with outcome "unknown" (as a
    timeout, a blind retry may duplicate it; idempotent producers are safe)."""
    if isinstance(exc, raft_errors.OutcomeUnknown):
        return errors.BrokerUnavailable(
            f"{what}: a write failed after the request was in the log (it may still be "
            f"applied once the disk has room): {exc}",
            outcome="unknown",
            retry_after_ms=1000,
        )
    if no_space:
        return errors.InsufficientStorage(f"{what}: the disk is full: {exc}", retry_after_ms=1000)
    return errors.BrokerUnavailable(f"{what}: a write failed: {exc}", retry_after_ms=1000)


class _NotifyingMachine(MetadataMachine):
    """MetadataMachine that tells the event loop when the catalogue changed."""

    def __init__(self, notify: Callable[[], None]) -> None:
        super().__init__()
        self._notify = notify

    def apply(self, command: bytes) -> Result:
        version = self.state.metadata_version
        result = super().apply(command)
        if self.state.metadata_version != version:
            self._notify()
        return result

    def restore(self, snapshot: bytes) -> None:
        super().restore(snapshot)
        self._notify()


class MetadataService:
    """This broker's side of group 0 (module docstring): a voter or an observer, and the
    switches between the two when the voter set changes (raft/README.md, "Metadata voter
    changes")."""

    def __init__(
        self,
        node_id: str,
        voters: list[str],
        raft_node: RaftNode,
        peers: PeerClient,
        voter_http: Callable[[], list[str]],
        *,
        timeout_s: float,
        on_change: Callable[[], None],
        left_marker: Path,
        own_cluster_id: Callable[[], str] = lambda: "",
    ) -> None:
        self.node_id = node_id
        # The cluster this broker's data directory belongs to ("" while it names none: a
        # new directory, or one from before cluster ids): `_same_cluster` compares every
        # catalogue with it first, also before this service has seen any catalogue (a
        # restarted observer starts with an empty `_observed`).
        self._own_cluster_id = own_cluster_id
        self.config_voters = voters  # the bootstrap set (`metadata_voters`)
        self._raft_node = raft_node
        self._peers = peers
        self._voter_http = voter_http  # HTTP addresses of the other voters, best guess first
        self._timeout_s = timeout_s
        self._on_change = on_change
        # Written durably before a removed voter deletes its group-0 directory: on restart
        # it stays an observer although `metadata_voters` may name it.
        self._left_marker = left_marker
        self._promoting_marker = left_marker.with_name(METADATA_PROMOTING_MARKER)
        self._machine: _NotifyingMachine | None = None
        self._replica: Replica | None = None
        # Group 0 is open but its machine has not reached the observed catalogue yet: the
        # observed one is still served (an empty machine would make the broker delete
        # every local replica), proposals go through the other voters.
        self._promoting = False
        self._observed = MetadataState()
        self._changed = asyncio.Event()
        self._follow_task: asyncio.Task[None] | None = None
        self._check_task: asyncio.Task[None] | None = None
        self._role_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._notify_pending = False

    @property
    def state(self) -> MetadataState:
        return self._machine.state if self.is_voter and self._machine else self._observed

    @property
    def is_voter(self) -> bool:
        """Group 0 is open here and its machine serves the catalogue."""
        return self._machine is not None and not self._promoting

    @property
    def voters(self) -> list[str]:
        """Group 0's voters as the catalogue last recorded them (configured ones before)."""
        return list(self.state.voters) or list(self.config_voters)

    @property
    def replica(self) -> Replica | None:
        """Group 0's replica once it serves the catalogue (None on observers and while
        promoting: callers use it to lead or route, which needs the machine's state)."""
        return self._replica if self.is_voter else None

    @property
    def open_replica(self) -> Replica | None:
        """Group 0's replica if it is open here at all (status reports)."""
        return self._replica

    async def start(self) -> None:
        """Open group 0 whenever its directory exists (members from its own journal: the
        configured voters only a fallback); without one, a broker that left the voter set
        stays an observer, and a configured voter bootstraps a new cluster."""
        self._loop = asyncio.get_running_loop()
        group_dir = self._raft_node.data_dir / "groups" / str(METADATA_GROUP_ID)
        if group_dir.exists():
            # Killed while promoting: the members may not have added it yet, so it
            # cannot reach a leader through its own replica (they ignore a non-member):
            # it observes and proposes through the voters, as before the kill, or it
            # could never heartbeat and the leader, waiting for it to be live, would
            # never add it (found by jepsen/, README "Findings").
            self._promoting = self._promoting_marker.exists()
            members = sorted({*self.config_voters, self.node_id})
            if self._promoting:
                # Its journal names no member yet (nobody sends entries to a non-member):
                # the configured voters may have all left since, the leader among them,
                # whose messages a replica drops unless it names it (jepsen/ README,
                # run 36). It reopens with the members it first opened with.
                members = await self._promoting_members() or members
                _log.info("reopening group 0 still promoting (members %s)", members)
            await self._open_group(members)
            if self._promoting:
                self._follow_task = self._loop.create_task(self._follow())
        elif not self._left_marker.exists() and self.node_id in self.config_voters:
            await self._open_group(self.config_voters)
        else:
            self._follow_task = self._loop.create_task(self._follow())

    async def _open_group(self, members: list[str]) -> None:
        self._machine = _NotifyingMachine(self._notify_from_thread)
        # prompt_commit_index: every broker serves the catalogue from its own replica; a
        # topic created through one broker is known to the other voters a round later,
        # not a heartbeat later (raft/transport.py, "Commit index").
        self._replica = await self._raft_node.add_group(
            METADATA_GROUP_ID,
            self._machine,
            members=members,
            members_from_log=True,
            prompt_commit_index=True,
        )
        assert self._loop is not None
        if self._check_task is None or self._check_task.done():
            self._check_task = self._loop.create_task(self._check_membership_loop())

    async def stop(self) -> None:
        for task in (self._role_task, self._check_task, self._follow_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    # --- change notification ------------------------------------------------------------

    def _notify_from_thread(self) -> None:
        """On the tick thread: one wake-up of the loop per burst of changes."""
        if self._loop is None or self._notify_pending:
            return
        self._notify_pending = True
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens any more
            self._loop.call_soon_threadsafe(self._changed_on_loop)

    def _changed_on_loop(self) -> None:
        self._notify_pending = False
        self._maybe_finish_promotion()
        self._maybe_start_promotion()
        self._changed.set()
        self._changed = asyncio.Event()
        self._on_change()

    async def wait_changed(self, timeout_s: float) -> bool:
        """Wait (at most timeout_s) for the next applied change of any domain, including
        those that do not bump metadata_version (transactions, groups); True if one came."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def wait_for_version(self, version: int, timeout_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.state.metadata_version < version:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise errors.RequestTimeout(
                    f"metadata version {version} did not reach this broker in {timeout_s}s"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    # --- proposals ----------------------------------------------------------------------

    async def propose(self, command: Command) -> Applied:
        """Commit `command`; its Applied result once this broker's state includes it."""
        replica = self.replica
        if replica is not None:
            try:
                result = await replica.propose(encode_command(command), timeout_s=self._timeout_s)
            except raft_errors.RaftError as exc:
                raise translate_raft_error(exc, "metadata") from exc
            if isinstance(result, Rejected):
                raise error_for_rejected(result)
            assert isinstance(result, Applied)
            return result
        version = await self._propose_through_voter(command)
        await self.wait_for_version(version, self._timeout_s)
        return Applied(version)

    async def propose_encoded(self, data: bytes) -> Applied:
        """A command another broker encoded (an observer's, relayed to this voter)."""
        if not self.is_voter:
            raise errors.NotLeader("this broker is not a metadata voter", retry_after_ms=200)
        try:
            command = decode_command(data)
        except CommandDecodeError as exc:
            raise errors.InvalidRequest(f"metadata command: {exc}", field="body") from exc
        return await self.propose(command)

    async def _propose_through_voter(self, command: Command) -> int:
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        body = encode_command(command)
        while True:
            try:
                answer = await self._call_voters("POST", "/v1/internal/metadata/propose", body=body)
                return int(answer["metadata_version"])
            except errors.RetriableError:
                if asyncio.get_running_loop().time() + FOLLOW_RETRY_S >= deadline:
                    raise
            await asyncio.sleep(FOLLOW_RETRY_S)

    async def _call_voters(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        params: dict[str, str] | None = None,
        wait_ms: int = 0,
    ) -> Any:
        """Ask each voter in turn; the first answer, or the last retriable error."""
        last: errors.DmqError = errors.BrokerUnavailable("no metadata voter is known")
        for addr in self._voter_http():
            try:
                return await self._peers.call(
                    method,
                    addr,
                    path,
                    body=body,
                    params=params,
                    timeout_s=wait_ms / 1000 + self._timeout_s,
                )
            except errors.RetriableError as exc:
                last = exc
        raise last

    async def read_barrier(self) -> None:
        """After this, `state` includes every change committed before the call.

        On the group-0 leader through ReadIndex (raft/read_index.py: one confirmation
        round shared by the reads of a tick, no log entry); elsewhere as
        `commit_barrier`. It does not settle entries still uncommitted in the leader's
        log when it arrived: a caller that must learn the fate of such an entry (its own
        proposal whose outcome is unknown, a membership change) uses `commit_barrier`."""
        replica = self.replica
        if replica is not None and replica.status().is_leader:
            try:
                await replica.read_index(timeout_s=self._timeout_s)
                return
            except raft_errors.NotLeader:
                pass  # it lost the leadership meanwhile: the no-op finds the new leader
            except raft_errors.Timeout as exc:
                raise errors.NotLeader(
                    f"metadata: leadership not confirmed in {self._timeout_s} s",
                    retry_after_ms=200,
                ) from exc
            except raft_errors.RaftError as exc:
                raise translate_raft_error(exc, "metadata read") from exc
        await self.commit_barrier()

    async def commit_barrier(self) -> None:
        """After this, `state` includes every change committed before the call and, on a
        voter, every entry that was in the leader's log when the no-op heartbeat this
        commits reached it (Raft's read-index by log); an observer asks a voter for its
        state after a read barrier there and adopts it."""
        if self.is_voter:
            await self.propose(BrokerHeartbeat(self.node_id, wall_ms()))
            return
        doc = await self._fetch_state(after_version=-1, wait_ms=0, linearizable=True)
        self._adopt(doc)

    # --- observers ----------------------------------------------------------------------

    async def _follow(self) -> None:
        """Observer (and promoting voter): long-poll the voters for each newer state."""
        while not self.is_voter:
            try:
                doc = await self._fetch_state(
                    after_version=self._observed.metadata_version, wait_ms=FOLLOW_WAIT_MS
                )
                self._adopt(doc)
                self._maybe_start_promotion()  # again, if an earlier attempt failed
            except errors.DmqError as exc:
                _log.debug("following the metadata group: %s", exc)
                await asyncio.sleep(FOLLOW_RETRY_S)

    async def _fetch_state(
        self, *, after_version: int, wait_ms: int, linearizable: bool = False
    ) -> dict[str, Any]:
        params = {"after_version": str(after_version), "wait_ms": str(wait_ms)}
        if linearizable:
            params["consistency"] = "linearizable"
        answer: dict[str, Any] = await self._call_voters(
            "GET", "/v1/internal/metadata", params=params, wait_ms=wait_ms
        )
        return answer

    def _adopt(self, doc: dict[str, Any]) -> None:
        state = state_from_json(doc["state"])
        if not self._same_cluster(state, "a catalogue"):
            return
        if state.metadata_version > self._observed.metadata_version or (
            state.metadata_version == self._observed.metadata_version
            and state.clock_ms > self._observed.clock_ms
        ):
            changed = state.metadata_version != self._observed.metadata_version
            self._observed = state
            if changed:
                self._changed_on_loop()

    def _same_cluster(self, other: MetadataState, what: str) -> bool:
        """False (and one error line) if `other` is another cluster's catalogue than ours
        (both formed): nothing is taken from it. Ours is the data directory's (so a
        restarted observer, or a voter whose machine has not replayed its id yet, never
        takes a first catalogue from another cluster), else the catalogue's. The cluster
        id is checked on every call between brokers (http_api/identity.py); this holds
        even if that were bypassed."""
        ours = self._own_cluster_id() or self.state.cluster_id or self._observed.cluster_id
        if not ours or not other.cluster_id or other.cluster_id == ours:
            return True
        _log.error(
            "ignored %s of cluster %s: this broker is of cluster %s", what, other.cluster_id, ours
        )
        return False

    async def state_after(self, after_version: int, wait_ms: int) -> dict[str, Any]:
        """For an observer's long-poll: the state once newer than `after_version`."""
        with contextlib.suppress(errors.RequestTimeout):
            await self.wait_for_version(after_version + 1, wait_ms / 1000)
        return {"state": state_to_json(self.state)}

    # --- voter set changes (raft/README.md, "Metadata voter changes") ------------------

    def _maybe_start_promotion(self) -> bool:
        """An observer that finds itself in `voters_target` opens group 0; True if it began."""
        if self._machine is not None or self._loop is None:
            return False
        if self.node_id not in self._observed.voters_target:
            return False
        if self._role_task is not None and not self._role_task.done():
            return False
        self._role_task = self._loop.create_task(self._become_voter_logged())
        return True

    async def _become_voter_logged(self) -> None:
        try:
            await self._become_voter()
        except Exception:  # the follow loop's next answer tries again
            _log.exception("opening the metadata group to become a voter failed")

    async def _become_voter(self) -> None:
        observed = self._observed
        members = sorted({*observed.voters, self.node_id})
        for member in members:  # joined brokers: make every member reachable first
            info = observed.brokers.get(member)
            if info is not None and member != self.node_id:
                await self._raft_node.add_peer(member, info.raft_addr)
        _log.info("joining the metadata voters (group 0 members %s)", members)
        self._promoting = True
        raft_addrs = {m: info.raft_addr for m in members if (info := observed.brokers.get(m))}
        marker = {"joining": "metadata voters", "members": members, "raft_addrs": raft_addrs}
        write_durably(self._promoting_marker, json.dumps(marker).encode() + b"\n")
        try:
            await self._open_group(members)
        except BaseException:
            self._promoting = False
            self._machine = None
            raise
        self._left_marker.unlink(missing_ok=True)
        self._maybe_finish_promotion()

    async def _promoting_members(self) -> list[str] | None:
        """The members `metadata_promoting` records, each made a reachable peer; None if
        it records none (a marker from before they were recorded)."""
        try:
            marker = json.loads(self._promoting_marker.read_bytes())
            members = sorted({str(m) for m in marker["members"]} | {self.node_id})
            raft_addrs = {str(m): str(a) for m, a in marker.get("raft_addrs", {}).items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None
        for member in members:
            addr = raft_addrs.get(member)
            if addr is not None and member != self.node_id:
                await self._raft_node.add_peer(member, addr)
        if any(m not in self._raft_node.peers for m in members):
            return None  # a member with no address: as before, the configured voters
        return members

    def _maybe_finish_promotion(self) -> bool:
        """A promoting voter serves its machine once it holds the observed catalogue
        (versions never go back); True when it switched."""
        machine = self._machine
        if not self._promoting or machine is None:
            return False
        if machine.state.metadata_version < self._observed.metadata_version:
            return False
        if self._observed.metadata_version == 0:  # restarted promoting: nothing observed yet
            return False
        self._promoting = False
        self._promoting_marker.unlink(missing_ok=True)
        _log.info(
            "metadata voter now: group 0 caught up to version %d", machine.state.metadata_version
        )
        return True

    async def _check_membership_loop(self) -> None:
        """pysyncobj never tells a removed member: a voter that does not lead asks the
        metadata leader every METADATA_MEMBERSHIP_CHECK_S whether it is still one, when
        it has a reason to doubt it, else every METADATA_MEMBERSHIP_CHECK_IDLE_S."""
        assert self._loop is not None
        last_check = self._loop.time()
        while self._replica is not None:
            await asyncio.sleep(METADATA_MEMBERSHIP_CHECK_S)
            replica = self._replica
            if replica is None:
                return
            doubt = replica.status().leader_id is None or bool(self.state.voters_target)
            if not doubt and self._loop.time() - last_check < METADATA_MEMBERSHIP_CHECK_IDLE_S:
                continue
            last_check = self._loop.time()
            try:
                await self._maybe_become_observer()
            except errors.DmqError as exc:
                _log.debug("metadata membership check: %s", exc)
            except Exception:
                _log.exception("metadata membership check failed")

    async def _maybe_become_observer(self) -> bool:
        replica = self._replica
        if replica is None or replica.status().is_leader:
            return False
        view = await self._call_voters("GET", "/v1/internal/metadata/voters")
        leader_state = state_from_json(view["state"])
        own_version = max(self.state.metadata_version, self._observed.metadata_version)
        # Only positive evidence from a leader at least as new as what this broker saw: a
        # stale answer must never make a member delete its copy of the log.
        if view["leader"] == self.node_id or leader_state.metadata_version < own_version:
            return False
        if not self._same_cluster(leader_state, "a leader's word that this voter left"):
            return False  # never delete group 0 on the word of another cluster
        if self.node_id in view["members"] or self.node_id in leader_state.voters_target:
            return False
        await self._become_observer(leader_state)
        return True

    async def _become_observer(self, leader_state: MetadataState) -> None:
        _log.info("left the metadata voters: deleting group 0 here, following the catalogue")
        write_durably(self._left_marker, b"left the metadata voters\n")
        self._promoting_marker.unlink(missing_ok=True)
        served = self.state
        replica = self._replica
        self._replica = None
        self._machine = None
        self._promoting = False
        if leader_state.metadata_version >= served.metadata_version:
            self._observed = leader_state
        else:
            self._observed = served
        if replica is not None:  # its proposals in flight fail with ReplicaStopped (503)
            await self._raft_node.remove_group(METADATA_GROUP_ID, delete=True)
        assert self._loop is not None
        if self._follow_task is None or self._follow_task.done():
            self._follow_task = self._loop.create_task(self._follow())
        self._changed_on_loop()

    async def leader_view(self) -> dict[str, Any]:
        """For the membership check: on the group-0 leader only, its configuration and its
        catalogue. The configuration is read before a read barrier: the barrier's commit
        also commits every membership entry appended before it, so the answer names a
        committed configuration of a leader that was still leading (a member must never
        delete its log on a removal that a new leader could undo)."""
        replica = self.replica
        if replica is None or not replica.status().is_leader:
            raise errors.NotLeader("this broker does not lead the metadata group")
        try:
            progress = await self._raft_node.group_progress(METADATA_GROUP_ID)
        except raft_errors.RaftError as exc:
            raise translate_raft_error(exc, "metadata voters") from exc
        await self.commit_barrier()  # commits the membership entries appended before it
        return {
            "leader": self.node_id,
            "members": list(progress.members),
            "change_pending": progress.change_pending,
            "state": state_to_json(self.state),
        }

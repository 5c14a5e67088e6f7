"""Consumer groups on the broker: routing, sessions and the group fetch.

The protocol itself is groups/ (pure); its state lives in the metadata group
(dmq/metadata/machine.py). This service is the broker's side:

1. Routing. Every group request is answered by the metadata group's leader: it holds the
   members' last-heard times and reads the newest committed offsets. A broker that does not
   lead the metadata group relays the request there (`ForwardRequest`); an observer first
   relays to a voter, which relays once more to the leader (`GROUP_HOPS_MAX`).
2. Sessions, as Kafka's group coordinator: a heartbeat is not a Raft entry. The leader
   keeps each member's last-heard time in memory (heartbeats, fetches and commits count)
   and proposes `ExpireMembers`, stamped with its own clock, for members silent longer than
   their session timeout. A new leader knows no last-heard time: it starts every member's
   session afresh at the moment it first sees it, so a leader change can delay an expiry by
   up to one session timeout. The silence is checked again just before each proposal; a
   call that arrives while the expiry commits is answered, and the member's next call
   gets 409 unknown_member.
3. A heartbeat becomes a Raft entry only when it acknowledges a revocation
   (`AckGeneration`), once per member per rebalance. A member that keeps heartbeating but
   does not acknowledge a revocation within `rebalance_timeout_ms` (KIP-848's rebalance
   timeout) is expired too, so that the partitions can move: the leader notes when it
   first saw the member's oldest unacknowledged revocation.
4. The group fetch reads each of the member's assigned partitions from the group's
   committed offset (the log start when none): fetch, process, commit `next_offset`. A fetch
   also acknowledges the current generation (as a heartbeat would), so fetch + commit alone
   is a complete consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dmq import errors, limits, planted
from dmq.metadata.machine import ExpireTransactions, transactional_ids_to_expire
from dmq.metadata.service import MetadataService, wall_ms
from groups.commands import (
    AckGeneration,
    CommitOffsets,
    DeleteGroup,
    ExpireGroups,
    ExpireMembers,
    GroupCommand,
    JoinGroup,
    LeaveGroup,
    ResetOffsets,
)
from groups.state import Group, Member, expired_groups

_log = logging.getLogger("dmq.groups")

GROUP_HOPS_MAX = 2  # observer -> voter -> metadata leader
# A group fetch by a member with no partition yet looks again this often within wait_ms.
EMPTY_ASSIGNMENT_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class MemberView:
    group: str
    member_id: str
    generation: int
    assignment: tuple[tuple[str, int], ...]
    revoking: tuple[tuple[str, int], ...]
    assignment_changed: bool
    session_timeout_ms: int
    topics: tuple[str, ...] = ()  # the topics it named ((): a topic_pattern)


@dataclass(frozen=True, slots=True)
class PartitionFetch:
    """What a group fetch read from one partition: records as the Broker's fetch returns."""

    topic: str
    partition: int
    offset: int
    result: Any  # dmq.broker.FetchResult


class GroupsService:
    def __init__(
        self,
        metadata: Callable[[], MetadataService],
        http_addr_of: Callable[[str], str | None],
        voter_http: Callable[[], list[str]],
        forward: Callable[[str, int], BaseException],
        *,
        rebalance_timeout_ms: int = limits.GROUP_REBALANCE_TIMEOUT_MS_DEFAULT,
        offsets_retention_ms: int = limits.GROUP_OFFSETS_RETENTION_MS_DEFAULT,
        transactional_id_expiration_ms: int = limits.TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT,
    ) -> None:
        self._metadata = metadata
        self._http_addr_of = http_addr_of
        self._voter_http = voter_http
        self._forward = forward  # builds the ForwardRequest the HTTP layer relays
        self._seen: dict[tuple[str, str], float] = {}  # (group, member) -> monotonic s
        self._rebalance_timeout_s = rebalance_timeout_ms / 1000
        self._offsets_retention_ms = offsets_retention_ms
        self._transactional_id_expiration_ms = transactional_id_expiration_ms
        # How often the leader looks for idle transactional ids (limits.py), and when next.
        self._txn_expiry_check_s = (
            min(limits.TRANSACTIONAL_ID_EXPIRY_CHECK_MS, transactional_id_expiration_ms / 2) / 1000
        )
        self._next_txn_expiry_check = 0.0  # monotonic s
        # (group, member) -> (its oldest unacknowledged revocation's generation, monotonic s
        # when this leader first saw it)
        self._revoking: dict[tuple[str, str], tuple[int, float]] = {}
        self._was_leader = False

    # --- routing --------------------------------------------------------------------------

    def is_leader(self) -> bool:
        replica = self._metadata().replica
        return replica is not None and replica.status().is_leader

    def route(self, hops: int) -> None:
        """Return if this broker answers group requests; raise the relay (or 503) if not."""
        if self.is_leader():
            return
        replica = self._metadata().replica
        addr: str | None = None
        if replica is not None:
            leader = replica.status().leader_id
            addr = None if leader is None else self._http_addr_of(leader)
        elif voters := self._voter_http():
            addr = voters[int(time.monotonic() * 1000) % len(voters)]
        if addr is None or hops >= GROUP_HOPS_MAX:
            raise errors.NotLeader(
                "the metadata group has no leader reachable from here yet", retry_after_ms=200
            )
        raise self._forward(addr, hops + 1)

    # --- proposals ------------------------------------------------------------------------

    async def _propose(self, command: GroupCommand | ExpireTransactions) -> None:
        await self._metadata().propose(command)

    def _touch(self, group: str, member_id: str) -> None:
        self._seen[(group, member_id)] = time.monotonic()

    def _group(self, name: str) -> Group:
        group = self._metadata().state.groups.groups.get(name)
        if group is None:
            raise errors.GroupNotFound(f"group {name!r} does not exist", field="group")
        return group

    def _member(self, group_name: str, member_id: str) -> tuple[Group, Member]:
        group = self._metadata().state.groups.groups.get(group_name)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            raise errors.UnknownMember(
                f"{member_id!r} is not a member of group {group_name!r} (it left, expired or "
                "never joined): join again"
            )
        return group, member

    def _view(self, group: Group, member: Member, known_generation: int) -> MemberView:
        return MemberView(
            group.name,
            member.member_id,
            group.generation,
            member.assigned,
            member.revoking,
            member.assignment_generation > known_generation,
            member.session_timeout_ms,
            member.topics,
        )

    # --- membership -----------------------------------------------------------------------

    async def join(
        self,
        group: str,
        *,
        topics: tuple[str, ...],
        topic_pattern: str,
        session_timeout_ms: int,
        assignor: str,
        instance_id: str,
        member_id: str = "",
    ) -> MemberView:
        """Join; with the client's own `member_id` a retry of the same join is answered
        again (groups/state.py), without it the broker draws an id."""
        if len(instance_id) > limits.INSTANCE_ID_CHARS_MAX:  # the member id must fit too
            raise errors.InvalidRequest(
                f"instance_id is longer than {limits.INSTANCE_ID_CHARS_MAX} characters",
                field="instance_id",
                limit=limits.INSTANCE_ID_CHARS_MAX,
            )
        if not member_id:
            suffix = uuid.uuid4().hex[: limits.MEMBER_ID_SUFFIX_CHARS - 1]
            member_id = f"{instance_id or 'member'}-{suffix}"
        await self._propose(
            JoinGroup(
                group,
                member_id,
                instance_id,
                topics,
                topic_pattern,
                session_timeout_ms,
                assignor,
                wall_ms(),
            )
        )
        self._touch(group, member_id)
        g, m = self._member(group, member_id)
        return self._view(g, m, -1)

    async def heartbeat(self, group: str, member_id: str, generation: int) -> MemberView:
        g, m = self._member(group, member_id)
        self._touch(group, member_id)
        if not 0 <= generation <= g.generation:
            raise errors.StaleGeneration(
                f"generation {generation} is not in [0, {g.generation}]: join again"
            )
        if any(0 < h.revoked_at <= generation for h in m.held):
            await self._propose(AckGeneration(group, member_id, generation, wall_ms()))
            g, m = self._member(group, member_id)
        return self._view(g, m, generation)

    async def delete_group(self, group: str) -> None:
        """Forget an empty group and its committed offsets (409 group_not_empty if not)."""
        self._group(group)
        await self._propose(DeleteGroup(group, wall_ms()))

    async def leave(self, group: str, member_id: str) -> None:
        self._member(group, member_id)
        await self._propose(LeaveGroup(group, member_id, wall_ms()))
        self._seen.pop((group, member_id), None)

    async def commit(
        self, group: str, member_id: str, generation: int, offsets: tuple[tuple[str, int, int], ...]
    ) -> None:
        if member_id:
            self._touch(group, member_id)
        if planted.volatile_commit(group, offsets):  # planted bug volatile-offsets
            return
        await self._propose(CommitOffsets(group, member_id, generation, offsets, wall_ms()))

    async def reset(self, group: str, offsets: tuple[tuple[str, int, int], ...]) -> None:
        await self._propose(ResetOffsets(group, offsets, wall_ms()))

    async def committed(self, group: str) -> dict[tuple[str, int], int]:
        """Linearizable: a read barrier through the metadata group first, so every commit
        acknowledged before this call is in the answer."""
        await self._metadata().read_barrier()
        found = self._metadata().state.groups.groups.get(group)
        return dict(planted.volatile_view(group, {} if found is None else found.committed))

    async def reset_to(
        self,
        group: str,
        topics: tuple[str, ...],
        to: str | int | None,
        explicit: tuple[tuple[str, int, int], ...],
        partition_count: Callable[[str], int],
        offsets_of: Callable[[str, int, int | None], Awaitable[Any]],
    ) -> dict[tuple[str, int], int]:
        """Reset an empty group's offsets: `explicit` ones, or every partition of `topics`
        to "earliest", "latest" or the first offset at or after timestamp `to` (ms).

        The cheap refusals come before any partition is asked for its offsets: a group
        with members (apply refuses it again, in case one joins meanwhile) and more
        partitions than one command may carry."""
        found = self._metadata().state.groups.groups.get(group)
        if found is not None and found.members:
            raise errors.GroupNotEmpty(
                f"group {group!r} has {len(found.members)} "
                f"member{'' if len(found.members) == 1 else 's'}: offsets can be reset "
                "only in an empty group",
                field="group",
            )
        counts = [partition_count(topic) for topic in topics]
        if len(explicit) + sum(counts) > limits.OFFSETS_PER_COMMIT_MAX:
            raise errors.InvalidRequest(
                f"the reset covers {len(explicit) + sum(counts)} partitions; at most "
                f"{limits.OFFSETS_PER_COMMIT_MAX}",
                field="topics",
                limit=limits.OFFSETS_PER_COMMIT_MAX,
            )
        offsets = list(explicit)
        gone = self._metadata().state.groups.gone  # decommissioned and removed: no log
        for topic, count in zip(topics, counts, strict=True):
            for p in range(count):
                if (topic, p) in gone:
                    continue
                found = await offsets_of(topic, p, to if isinstance(to, int) else None)
                if to == "earliest":
                    offsets.append((topic, p, found.log_start_offset))
                elif to == "latest" or found.offset is None:  # no record that late: the end
                    offsets.append((topic, p, found.high_watermark))
                else:
                    offsets.append((topic, p, found.offset))
        await self._propose(ResetOffsets(group, tuple(offsets), wall_ms()))
        return {(t, p): o for t, p, o in offsets}

    async def describe(
        self,
        name: str,
        offsets_of: Callable[[str, int, int | None], Awaitable[Any]],
        visible: Callable[[str], bool] = lambda topic: True,
    ) -> dict[str, Any]:
        """Members, assignment, and per partition: member, committed offset, high watermark
        and lag (high watermark - committed offset; from the log start when none). Only
        the topics `visible` keeps are shown (those the caller may describe): the others
        are left out as if they did not exist."""
        group = self._group(name)
        owner = {tp: mid for mid, m in group.members.items() for tp in m.assigned}
        tps = sorted(tp for tp in set(group.target) | set(group.committed) | set(owner)
                     if visible(tp[0]))  # fmt: skip
        in_flight = asyncio.Semaphore(limits.GROUP_DESCRIBE_CONCURRENCY_MAX)

        async def row(tp: tuple[str, int]) -> dict[str, Any]:
            committed = group.committed.get(tp)
            try:
                async with in_flight:
                    found = await offsets_of(tp[0], tp[1], None)
                hw: int | None = found.high_watermark
                base = found.log_start_offset if committed is None else committed
                lag: int | None = max(0, found.high_watermark - base)
            except errors.DmqError:  # a partition without a reachable leader: unknown
                hw = lag = None
            return {
                "topic": tp[0],
                "partition": tp[1],
                "member_id": owner.get(tp),
                "committed_offset": committed,
                "high_watermark": hw,
                "lag": lag,
            }

        rows = await asyncio.gather(*(row(tp) for tp in tps))
        members = [member_json(m, visible) for m in group.members.values()]
        return {**group_summary(group), "members": members, "partitions": list(rows)}

    def groups(self) -> list[Group]:
        return list(self._metadata().state.groups.groups.values())

    def touch_member(self, group: str, member_id: str) -> tuple[Group, Member]:
        found = self._member(group, member_id)
        self._touch(group, member_id)
        return found

    # --- sessions (metadata leader only) --------------------------------------------------

    async def expiry_loop(self) -> None:
        while True:
            await asyncio.sleep(limits.GROUP_EXPIRY_CHECK_MS / 1000)
            try:
                await self.maybe_expire()
                await self.maybe_expire_groups()
                await self.maybe_expire_transactional_ids()
            except errors.DmqError as exc:  # no quorum now, say: the next check retries
                _log.debug("expiring group members: %s", exc)
            except Exception:  # a bug: keep expiring sessions rather than stop for good
                _log.exception("expiring group members failed")

    async def maybe_expire(self) -> bool:
        """On the metadata leader: propose the expiry of members past their session, or
        holding a revocation unacknowledged past the rebalance timeout."""
        leader = self.is_leader()
        if leader and not self._was_leader:
            self._seen.clear()  # a new leader: every member gets a fresh session
            self._revoking.clear()
        self._was_leader = leader
        if not leader:
            return False
        expired = self._overdue(time.monotonic())
        for name, ids in sorted(expired.items()):
            # Proposals take time: drop those heard from since (a heartbeat in between).
            again = self._overdue(time.monotonic()).get(name, [])
            ids = [m for m in ids if m in again]
            if not ids:
                continue
            _log.info("group %s: expiring %s", name, ", ".join(ids))
            with contextlib.suppress(errors.UnknownMember):  # they left meanwhile
                await self._propose(ExpireMembers(name, tuple(ids), wall_ms()))
        return bool(expired)

    async def maybe_expire_groups(self) -> bool:
        """On the metadata leader: propose forgetting empty groups past the offsets
        retention (apply checks again with the stamped time)."""
        if not self.is_leader():
            return False
        now_ms = wall_ms()
        state = self._metadata().state.groups
        if not expired_groups(state, self._offsets_retention_ms, now_ms):
            return False
        await self._propose(ExpireGroups(self._offsets_retention_ms, now_ms))
        return True

    async def maybe_expire_transactional_ids(self) -> bool:
        """On the metadata leader: propose forgetting transactional ids unused for
        transactional_id_expiration_ms, with their transactions (apply checks again with
        the stamped time)."""
        now = time.monotonic()
        if not self.is_leader() or now < self._next_txn_expiry_check:
            return False
        self._next_txn_expiry_check = now + self._txn_expiry_check_s
        now_ms, retention_ms = wall_ms(), self._transactional_id_expiration_ms
        if not transactional_ids_to_expire(self._metadata().state, retention_ms, now_ms):
            return False
        await self._propose(ExpireTransactions(retention_ms, now_ms))
        return True

    def _overdue(self, now: float) -> dict[str, list[str]]:
        """Members silent past their session, or past the rebalance timeout with a
        revocation they have not acknowledged; forgets members that are gone."""
        live: set[tuple[str, str]] = set()
        expired: dict[str, list[str]] = {}
        for group in self._metadata().state.groups.groups.values():
            for member in group.members.values():
                key = (group.name, member.member_id)
                live.add(key)
                seen = self._seen.setdefault(key, now)
                silent = now - seen > member.session_timeout_ms / 1000
                if silent or self._revocation_overdue(key, member, now):
                    expired.setdefault(group.name, []).append(member.member_id)
        for key in set(self._seen) - live:
            del self._seen[key]
        for key in set(self._revoking) - live:
            del self._revoking[key]
        return expired

    def _revocation_overdue(self, key: tuple[str, str], member: Member, now: float) -> bool:
        oldest = min((h.revoked_at for h in member.held if h.revoked_at), default=0)
        if not oldest:
            self._revoking.pop(key, None)
            return False
        known = self._revoking.get(key)
        if known is None or known[0] != oldest:
            known = self._revoking[key] = (oldest, now)
        return now - known[1] > self._rebalance_timeout_s

    # --- the group fetch ------------------------------------------------------------------

    async def fetch(
        self,
        group: str,
        member_id: str,
        wait_ms: int,
        read: Callable[[str, int, int, int], Awaitable[Any]],
        log_start: Callable[[str, int], Awaitable[int]],
        report_skipped: bool = False,
        keep: Callable[[str], bool] = lambda topic: True,
    ) -> tuple[MemberView, list[PartitionFetch]]:
        """Records of the member's assigned partitions from the group's committed offsets.

        `read(topic, partition, offset, wait_ms)` is the Broker's fetch. All partitions are
        read at once without waiting; if none has records, they long-poll together and the
        first to get records answers (the others are cancelled). A partition that cannot be
        read now (no reachable leader) is left out of this answer, not the whole fetch.
        `report_skipped` (a filtered fetch): a partition read past records the filter
        dropped counts as found without records, so its new position can be committed.
        Only partitions of topics `keep` keeps are read: the others (a topic the caller may
        not read, matched by its pattern) are skipped as if not assigned."""
        g, m = self.touch_member(group, member_id)
        if m.revoking:
            # Fetching is acknowledging: the answer names the current generation and serves
            # only the member's assigned partitions, so a curl user who never heartbeats
            # still lets revoked partitions go (its late commits of them are then refused).
            await self._propose(AckGeneration(group, member_id, g.generation, wall_ms()))
            g, m = self._member(group, member_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while not m.assigned and loop.time() < deadline:
            # Nothing assigned yet (partitions still being handed over): wait for some
            # rather than answer at once, so a polling client does not spin.
            await asyncio.sleep(min(EMPTY_ASSIGNMENT_POLL_S, max(0.0, deadline - loop.time())))
            g, m = self._member(group, member_id)
        wait_ms = max(0, int((deadline - loop.time()) * 1000))
        view = self._view(g, m, g.generation)
        positions = []
        for topic, partition in m.assigned:
            if not keep(topic):  # a topic the caller may not read: as if not assigned
                continue
            offset = planted.volatile_view(group, g.committed).get((topic, partition))
            if offset is None:
                try:
                    offset = await log_start(topic, partition)
                except errors.DmqError as exc:  # skipped this time: the others are served
                    _log.debug("group fetch: %s-%d left out: %s", topic, partition, exc)
                    continue
            positions.append((topic, partition, offset))
        return view, await self.read_positions(positions, wait_ms, read, report_skipped)

    async def read_positions(
        self,
        positions: list[tuple[str, int, int]],
        wait_ms: int,
        read: Callable[[str, int, int, int], Awaitable[Any]],
        report_skipped: bool = False,
    ) -> list[PartitionFetch]:
        """Read every (topic, partition, offset) at once; long-poll them together when none
        has records (the group fetch, and dmq/broker/rest_v2.py from its own positions)."""
        found = await self._read_all(positions, 0, read, report_skipped)
        if found or wait_ms == 0 or not positions:
            return found
        return await self._read_all(positions, wait_ms, read, report_skipped)

    async def _read_all(
        self,
        positions: list[tuple[str, int, int]],
        wait_ms: int,
        read: Callable[[str, int, int, int], Awaitable[Any]],
        report_skipped: bool = False,
    ) -> list[PartitionFetch]:
        async def one(topic: str, partition: int, offset: int) -> PartitionFetch | None:
            try:
                result = await read(topic, partition, offset, wait_ms)
            except errors.DmqError as exc:  # left out of this answer; the others are served
                _log.debug("group fetch: %s-%d left out: %s", topic, partition, exc)
                return None
            return PartitionFetch(topic, partition, offset, result)

        def with_records(fetches: Iterable[PartitionFetch | None]) -> list[PartitionFetch]:
            return [
                f
                for f in fetches
                if f is not None
                and (f.result.records or (report_skipped and f.result.next_offset > f.offset))
            ]

        tasks = [asyncio.ensure_future(one(*p)) for p in positions]
        try:
            if wait_ms == 0:
                return with_records(await asyncio.gather(*tasks))
            pending = set(tasks)
            while pending:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                got = with_records(t.result() for t in finished)
                if got:
                    return got
            return []
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def group_state(group: Group) -> str:
    """ "empty" (no members), "reconciling" (a partition is being handed over: some member
    still holds one it must give up, or a target partition has no holder) or "stable"."""
    if not group.members:
        return "empty"
    held = {tp for m in group.members.values() for tp in m.assigned}
    revoking = any(m.revoking for m in group.members.values())
    return "reconciling" if revoking or held != set(group.target) else "stable"


def group_summary(group: Group) -> dict[str, Any]:
    return {
        "group": group.name,
        "state": group_state(group),
        "generation": group.generation,
        "assignor": group.assignor,
        "member_count": len(group.members),
    }


def member_json(m: Member, visible: Callable[[str], bool] = lambda topic: True) -> dict[str, Any]:
    """A member as group descriptions show it: only the topics `visible` keeps."""
    return {
        "member_id": m.member_id,
        "instance_id": m.instance_id or None,
        "topics": [t for t in m.topics if visible(t)],
        "topic_pattern": m.topic_pattern or None,
        "session_timeout_ms": m.session_timeout_ms,
        "assignment": [{"topic": t, "partition": p} for t, p in m.assigned if visible(t)],
        "revoking": [{"topic": t, "partition": p} for t, p in m.revoking if visible(t)],
    }

"""AsyncGroupConsumer: a member of a consumer group (groups/README.md has the protocol).

The broker assigns partitions (server-side assignment); this client follows:

1. `poll` joins the group on first use (`POST /v1/groups/{group}/members`) and starts a
   heartbeat task (every `heartbeat_interval_ms`, a third of the session by default).
2. Each heartbeat sends the generation whose assignment this consumer has applied. Its
   answer (generation, assignment, revoking) is kept; the next `poll` applies it:
   partitions no longer assigned are revoked (their positions committed first with
   auto-commit, then `on_revoke(partitions)`), so the next heartbeat's generation tells the
   broker they are free; new partitions start at the group's committed offset (the
   partition's start when none), then `on_assign(partitions)`.
3. `poll` reads the assigned partitions with an `AsyncConsumer` (binary long-poll fetches).
4. With `auto_commit=True` (the default) each `poll` first commits the positions reached by
   the records the previous `poll` returned: a record is committed only after the
   application had it and came back for more, which is **at-least-once** (a crash between
   processing and the next poll re-delivers). `commit()` commits the same positions now;
   for **at-most-once** call `commit()` right after `poll`, before processing.
5. A 409 `unknown_member` (the session expired) makes the next `poll` revoke everything
   and join again with a new member id. `close()` commits (auto-commit) and leaves.
6. `max_poll_interval_ms` (5 minutes by default, as Kafka's max.poll.interval.ms): if the
   application does not call `poll` for that long, the heartbeat task leaves the group
   (its partitions go to the others; the broker would expire it anyway once a revocation
   stays unacknowledged past its rebalance timeout) and the next `poll` joins again.
7. A fetch answering 404 `topic_not_found` (an assigned topic was deleted) revokes that
   topic's partitions here and `poll` goes on; the group's assignment drops them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote

from dmq.client import _limits
from dmq.client._consumer import AsyncConsumer, Isolation, OffsetReset
from dmq.client._http import Deadline, Transport, group_path
from dmq.client._types import ConsumerRecord, TopicPartition
from dmq.errors import DmqError, TopicNotFound, UnknownMember

_log = logging.getLogger("dmq.client.group")
Callback = Callable[[list[TopicPartition]], Any]


def _tps(items: Iterable[dict[str, Any]]) -> list[TopicPartition]:
    return [TopicPartition(str(i["topic"]), int(i["partition"])) for i in items]


class AsyncGroupConsumer:
    """Consumes the partitions the group gives this member (module docstring)."""

    def __init__(
        self,
        url: str,
        group: str,
        *,
        topics: list[str] | None = None,
        topic_pattern: str | None = None,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int | None = None,
        auto_commit: bool = True,
        assignor: str = "sticky",
        instance_id: str | None = None,
        on_assign: Callback | None = None,
        on_revoke: Callback | None = None,
        request_timeout_ms: int = _limits.REQUEST_TIMEOUT_MS_DEFAULT,
        max_poll_interval_ms: int = _limits.MAX_POLL_INTERVAL_MS_DEFAULT,
        isolation: Isolation = "read_uncommitted",
        default_api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT,
        auto_offset_reset: OffsetReset = "earliest",
    ) -> None:
        if (topics is None) == (topic_pattern is None):
            raise ValueError("give either topics or topic_pattern")
        self._group = group
        self._path = group_path(group)
        join: dict[str, Any] = {"session_timeout_ms": session_timeout_ms, "assignor": assignor}
        join |= {"topics": list(topics)} if topics is not None else {"topic_pattern": topic_pattern}
        if instance_id is not None:
            join["instance_id"] = instance_id
        self._join_body = join
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_s = (heartbeat_interval_ms or session_timeout_ms // 3) / 1000
        self._max_poll_interval_s = max_poll_interval_ms / 1000
        self._last_poll = time.monotonic()
        self._auto_commit = auto_commit
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._transport = Transport(
            url, request_timeout_ms=request_timeout_ms, api_timeout_ms=default_api_timeout_ms
        )
        self._inner = AsyncConsumer(
            url,
            request_timeout_ms=request_timeout_ms,
            isolation=isolation,
            default_api_timeout_ms=default_api_timeout_ms,
            auto_offset_reset=auto_offset_reset,  # a partition the group has no offset for
        )
        self._member_id: str | None = None
        self._generation = 0  # the generation whose assignment is applied
        self._latest: dict[str, Any] | None = None  # the last heartbeat/join answer
        self._assigned: list[TopicPartition] = []
        self._consumed: dict[TopicPartition, int] = {}  # positions reached by returned records
        self._heartbeat: asyncio.Task[None] | None = None
        self._rejoin = False
        self._closed = False

    @property
    def member_id(self) -> str | None:
        return self._member_id

    @property
    def generation(self) -> int:
        return self._generation

    def assignment(self) -> list[TopicPartition]:
        return list(self._assigned)

    def group_metadata(self) -> tuple[str, str, int]:
        """(group, member id, generation): what a transactional offset commit carries."""
        return self._group, self._member_id or "", self._generation

    async def __aenter__(self) -> AsyncGroupConsumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ membership

    async def _join(self) -> None:
        # Our own member id: the transport's retries of this join are the same join.
        prefix = self._join_body.get("instance_id", "member")
        body = {**self._join_body, "member_id": f"{prefix}-{uuid.uuid4().hex[:16]}"}
        answer = (
            await self._transport.request("POST", self._path + "/members", json_body=body)
        ).json()
        self._member_id = answer["member_id"]
        self._latest = answer
        self._rejoin = False
        if self._heartbeat is None:
            self._heartbeat = asyncio.get_running_loop().create_task(self._heartbeats())

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            if self._member_id is None or self._rejoin:
                continue
            if time.monotonic() - self._last_poll > self._max_poll_interval_s:
                await self._leave_for_slow_poll()
                continue
            try:
                answer = await self._transport.request(
                    "POST",
                    f"{self._member_path(self._member_id)}/heartbeat",
                    json_body={"generation": self._generation},
                    # Retried while the session can still be saved, not longer: after
                    # that the answer is unknown_member either way.
                    deadline=Deadline.after(self._session_timeout_ms, "session_timeout_ms"),
                )
                self._latest = answer.json()
            except UnknownMember:
                self._rejoin = True
            except DmqError as exc:
                _log.debug("heartbeat failed: %s", exc)

    async def _apply_assignment(self) -> None:
        """Step 2: revoke what is no longer ours, then take what is new."""
        latest = self._latest
        if latest is None:
            return
        self._latest = None
        wanted = _tps(latest["assignment"])
        revoked = [tp for tp in self._assigned if tp not in wanted]
        if revoked:
            if self._auto_commit:
                await self._commit_quietly([tp for tp in revoked if tp in self._consumed])
            if self._on_revoke is not None:
                self._on_revoke(revoked)
            for tp in revoked:
                self._consumed.pop(tp, None)
        added = [tp for tp in wanted if tp not in self._assigned]
        self._assigned = wanted
        self._inner.assign(wanted)
        if added:
            committed = await self.committed()
            for tp in added:
                if tp in committed:
                    self._inner.seek(tp.topic, tp.partition, committed[tp])
            if self._on_assign is not None:
                self._on_assign(added)
        self._generation = int(latest["generation"])

    async def _revoke_all(self) -> None:
        if self._assigned and self._on_revoke is not None:
            self._on_revoke(list(self._assigned))
        self._assigned, self._consumed = [], {}
        self._inner.assign([])
        self._member_id = None

    async def _leave_for_slow_poll(self) -> None:
        """Step 6: the application stopped polling; let the partitions go."""
        _log.warning(
            "no poll for more than max_poll_interval_ms (%d): leaving group %s",
            int(self._max_poll_interval_s * 1000),
            self._group,
        )
        self._rejoin = True
        await self._leave(self._member_id or "")

    def _drop_deleted_topic(self, topic: str) -> None:
        """Step 7: an assigned topic was deleted. As Kafka's consumers, the member goes on:
        it stops reading the topic's partitions (revoked, their positions forgotten: a
        topic created again under the name starts from its beginning), and the group's
        next assignment, which no longer has them, or has the new topic's, follows."""
        gone = [tp for tp in self._assigned if tp.topic == topic]
        if not gone:
            raise TopicNotFound(f"topic {topic!r} does not exist", field="topic")
        _log.warning("topic %s was deleted: its partitions are no longer read", topic)
        if self._on_revoke is not None:
            self._on_revoke(gone)
        for tp in gone:
            self._consumed.pop(tp, None)
        self._assigned = [tp for tp in self._assigned if tp.topic != topic]
        self._inner.assign(self._assigned)

    def _member_path(self, member_id: str) -> str:
        return f"{self._path}/members/{quote(member_id, safe='')}"

    async def _leave(self, member_id: str) -> None:
        """Leave the group (best effort: the session expires anyway)."""
        with contextlib.suppress(DmqError):
            await self._transport.request("DELETE", self._member_path(member_id))

    # ------------------------------------------------------------------ poll and commit

    async def poll(
        self,
        timeout_ms: int = _limits.POLL_TIMEOUT_MS_DEFAULT,
        max_records: int = _limits.POLL_RECORDS_DEFAULT,
    ) -> list[ConsumerRecord]:
        """Records of this member's partitions, waiting up to timeout_ms (step 3)."""
        if self._closed:
            raise RuntimeError("the consumer is closed")
        self._last_poll = time.monotonic()
        if self._auto_commit and self._consumed:
            await self._commit_quietly(list(self._consumed))
        if self._rejoin:
            await self._revoke_all()
        if self._member_id is None:
            await self._join()
        await self._apply_assignment()
        if not self._assigned:
            await asyncio.sleep(min(timeout_ms / 1000, self._heartbeat_s))
            return []
        # Wake up for an assignment change at least once per heartbeat.
        try:
            records = await self._inner.poll(
                min(timeout_ms, int(self._heartbeat_s * 1000)), max_records
            )
        except TopicNotFound as exc:
            self._drop_deleted_topic(str(exc.details.get("topic", "")))
            return []
        for r in records:
            self._consumed[TopicPartition(r.topic, r.partition)] = r.offset + 1
        return records

    async def commit(self) -> None:
        """Commit the positions reached by the records `poll` returned (step 4)."""
        await self._commit(list(self._consumed))

    async def _commit(self, tps: list[TopicPartition]) -> None:
        if not tps or self._member_id is None:
            return
        sent = {tp: self._consumed[tp] for tp in tps}
        offsets = [{"topic": tp.topic, "partition": tp.partition, "offset": offset}
                   for tp, offset in sent.items()]  # fmt: skip
        body = {"member_id": self._member_id, "generation": self._generation, "offsets": offsets}
        await self._transport.request("POST", self._path + "/offsets", json_body=body)
        for tp, offset in sent.items():  # nothing more to commit until new records come back
            if self._consumed.get(tp) == offset:
                del self._consumed[tp]

    async def _commit_quietly(self, tps: list[TopicPartition]) -> None:
        try:
            await self._commit(tps)
        except UnknownMember:
            self._rejoin = True  # expired: these records will be delivered again (at-least-once)
        except DmqError as exc:
            _log.warning("commit failed (the records will be delivered again): %s", exc)

    async def committed(self) -> dict[TopicPartition, int]:
        """The group's committed offsets (a linearizable read)."""
        doc = (await self._transport.request("GET", self._path + "/offsets")).json()
        return {
            TopicPartition(o["topic"], o["partition"]): int(o["offset"]) for o in doc["offsets"]
        }

    async def close(self) -> None:
        """Commit (with auto-commit), leave the group, release the connections."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._auto_commit and self._consumed:
                await self._commit_quietly(list(self._consumed))
            if self._member_id is not None:
                await self._leave(self._member_id)
        finally:
            if self._heartbeat is not None:
                self._heartbeat.cancel()
                await asyncio.gather(self._heartbeat, return_exceptions=True)
            await self._inner.close()
            await self._transport.close()

"""ShareConsumer: a member of a share group (a queue: groups/README.md, "Share groups").

Every member of a share group may receive records of every partition; each record is
locked to the member that received it until it acknowledges it or the lock runs out.

1. `poll` joins the group on first use (`POST /v1/share-groups/{group}/members`), first
   sends the acknowledgements queued since the last poll (`commit`), then long-polls
   `GET .../members/{member_id}/records`.
2. `accept(record)` (processed), `release(record, delay_ms=0)` (give it back: it is offered
   again, to any member, after `delay_ms`), `reject(record)` (poison: it goes to the
   group's dead-letter topic) queue an acknowledgement; `commit()` sends the queued ones in
   one request. The broker applies all or none: if a lock ran out (or another member now
   holds the record) it answers 409 `lock_not_held` and `commit` raises `LockNotHeld`
   with nothing acknowledged; the queue is then cleared (the records come again).
3. A record neither acknowledged nor released before its lock runs out (`locked_until_ms`)
   is offered again, with `delivery_count` + 1: processing must be idempotent, or finish
   within the group's `lock_duration_ms`.
4. A 409 `unknown_member` (the member was expired after `session_timeout_ms` without a
   call) makes the next `poll` join again. `close()` commits and leaves (the broker
   releases the member's remaining locks at once).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from dmq.client import _limits
from dmq.client._http import Transport
from dmq.client._sync import _LoopThread
from dmq.errors import DmqError, UnknownMember


@dataclass(frozen=True, slots=True)
class ShareRecord:
    """A record delivered to this member, locked to it until `locked_until_ms`."""

    topic: str
    partition: int
    offset: int
    delivery_count: int
    locked_until_ms: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


def share_group_path(group: str) -> str:
    return "/v1/share-groups/" + quote(group, safe="")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _record(doc: dict[str, Any]) -> ShareRecord:
    try:
        return ShareRecord(
            str(doc["topic"]), int(doc["partition"]), int(doc["offset"]),
            int(doc["delivery_count"]), int(doc["locked_until"]), doc["timestamp"],
            _bytes(doc["key"]), _bytes(doc["value"]),
            tuple((h["key"], _bytes(h["value"]) or b"") for h in doc["headers"]),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise DmqError(f"unexpected share-group record from the broker: {exc}") from None


class AsyncShareConsumer:
    """A member of share group `group` over `topics` (module docstring)."""

    def __init__(
        self,
        url: str,
        group: str,
        topics: Iterable[str],
        *,
        max_records: int = 500,
        request_timeout_ms: int = _limits.REQUEST_TIMEOUT_MS_DEFAULT,
        default_api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT,
    ) -> None:
        self._topics = list(topics)
        if not self._topics:
            raise ValueError("topics must name at least one topic")
        self._path = share_group_path(group)
        self._max_records = max_records
        self._transport = Transport(
            url, request_timeout_ms=request_timeout_ms, api_timeout_ms=default_api_timeout_ms
        )
        self._member_id: str | None = None
        self._pending: dict[tuple[str, int, int], tuple[str, int]] = {}  # -> (type, delay_ms)

    @property
    def member_id(self) -> str | None:
        return self._member_id

    async def __aenter__(self) -> AsyncShareConsumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _join(self) -> str:
        if self._member_id is None:
            answer = await self._transport.request(
                "POST", self._path + "/members", json_body={"topics": self._topics}
            )
            self._member_id = str(answer.json()["member_id"])
        return self._member_id

    async def poll(
        self, timeout_ms: int = 1000, max_records: int | None = None
    ) -> list[ShareRecord]:
        """Send the queued acknowledgements, then wait up to `timeout_ms` for records."""
        await self.commit()
        member_id = await self._join()
        params = {
            "max_records": str(max_records or self._max_records),
            "wait_ms": str(timeout_ms),
            "value_encoding": "base64",
        }
        try:
            answer = await self._transport.request(
                "GET", f"{self._path}/members/{quote(member_id, safe='')}/records",
                params=params, wait_ms=timeout_ms,
            )  # fmt: skip
        except UnknownMember:
            self._member_id = None  # expired: the next poll joins again
            raise
        return [_record(r) for r in answer.json()["records"]]

    def accept(self, record: ShareRecord) -> None:
        self._queue(record, "accept", 0)

    def release(self, record: ShareRecord, delay_ms: int = 0) -> None:
        self._queue(record, "release", delay_ms)

    def reject(self, record: ShareRecord) -> None:
        self._queue(record, "reject", 0)

    def _queue(self, record: ShareRecord, kind: str, delay_ms: int) -> None:
        if delay_ms < 0:
            raise ValueError("delay_ms must be >= 0")
        self._pending[(record.topic, record.partition, record.offset)] = (kind, delay_ms)

    async def commit(self) -> int:
        """Send the queued acknowledgements in one request; how many were sent."""
        if not self._pending or self._member_id is None:
            self._pending.clear()
            return 0
        grouped: dict[tuple[str, int, str, int], list[int]] = {}
        for (t, p, o), (kind, delay_ms) in sorted(self._pending.items()):
            grouped.setdefault((t, p, kind, delay_ms), []).append(o)
        acks = [
            {"topic": t, "partition": p, "offsets": offsets, "type": kind}
            | ({"delay_ms": delay_ms} if delay_ms else {})
            for (t, p, kind, delay_ms), offsets in grouped.items()
        ]
        pending, self._pending = self._pending, {}
        try:
            await self._transport.request(
                "POST", f"{self._path}/members/{quote(self._member_id, safe='')}/acks",
                json_body={"acks": acks},
            )  # fmt: skip
        except UnknownMember:
            self._member_id = None
            raise
        return len(pending)

    async def close(self) -> None:
        try:
            if self._member_id is not None:
                try:
                    await self.commit()
                finally:
                    if self._member_id is not None:
                        await self._transport.request(
                            "DELETE", f"{self._path}/members/{quote(self._member_id, safe='')}"
                        )
                        self._member_id = None
        finally:
            await self._transport.close()


class ShareConsumer:
    """The blocking twin of `AsyncShareConsumer` (same methods, same errors)."""

    def __init__(
        self,
        url: str,
        group: str,
        topics: Iterable[str],
        *,
        max_records: int = 500,
        request_timeout_ms: int = _limits.REQUEST_TIMEOUT_MS_DEFAULT,
        default_api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT,
    ) -> None:
        self._inner = AsyncShareConsumer(
            url, group, topics, max_records=max_records, request_timeout_ms=request_timeout_ms,
            default_api_timeout_ms=default_api_timeout_ms,
        )  # fmt: skip
        self._runner = _LoopThread("dmq-share-consumer")

    def __enter__(self) -> ShareConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def member_id(self) -> str | None:
        return self._inner.member_id

    def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[ShareRecord]:
        return self._runner.run(self._inner.poll(timeout_ms, max_records))

    def accept(self, record: ShareRecord) -> None:
        self._runner.call(lambda: self._inner.accept(record))

    def release(self, record: ShareRecord, delay_ms: int = 0) -> None:
        self._runner.call(lambda: self._inner.release(record, delay_ms))

    def reject(self, record: ShareRecord) -> None:
        self._runner.call(lambda: self._inner.reject(record))

    def commit(self) -> int:
        return self._runner.run(self._inner.commit())

    def close(self) -> None:
        if self._runner.stopped:
            return
        try:
            self._runner.run(self._inner.close())
        finally:
            self._runner.stop()


async def configure_share_group(
    url: str,
    group: str,
    *,
    request_timeout_ms: int = _limits.REQUEST_TIMEOUT_MS_DEFAULT,
    default_api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT,
    **settings: Any,
) -> dict[str, Any]:
    """`PUT /v1/share-groups/{group}`: create it or change the `settings` given
    (lock_duration_ms, max_delivery_attempts, dead_letter_topic, max_in_flight_records,
    session_timeout_ms)."""
    transport = Transport(
        url, request_timeout_ms=request_timeout_ms, api_timeout_ms=default_api_timeout_ms
    )
    try:
        answer = await transport.request("PUT", share_group_path(group), json_body=settings)
        doc: dict[str, Any] = answer.json()
        return doc
    finally:
        await transport.close()


async def describe_share_group(
    url: str,
    group: str | None = None,
    *,
    request_timeout_ms: int = _limits.REQUEST_TIMEOUT_MS_DEFAULT,
    default_api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT,
) -> dict[str, Any]:
    """`GET /v1/share-groups/{group}` (or every group's summary when `group` is None)."""
    transport = Transport(
        url, request_timeout_ms=request_timeout_ms, api_timeout_ms=default_api_timeout_ms
    )
    try:
        path = "/v1/share-groups" if group is None else share_group_path(group)
        doc: dict[str, Any] = (await transport.request("GET", path)).json()
        return doc
    finally:
        await transport.close()

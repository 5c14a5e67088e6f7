"""Share-group routes (queues; groups/README.md "Share groups", http_api/README.md).

Thin handlers: parse and bound the input, call the broker's ShareService, encode. Every
route is answered by the metadata group's leader (the request is relayed there, as for
consumer groups).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from dmq import errors, limits
from dmq.broker.share import ACK_KINDS, SHARE_LIMITS, Ack, Delivery, group_json
from dmq.topics import check_topic_name
from http_api import auth, codec
from http_api.filtering import record_filter
from http_api.forward import BROKER
from http_api.groups import _int, _name, _routed

LIMITS = SHARE_LIMITS
CONFIG_FIELDS = {
    "lock_duration_ms": (LIMITS.lock_duration_ms_min, LIMITS.lock_duration_ms_max),
    "max_delivery_attempts": (1, LIMITS.max_delivery_attempts_max),
    "max_in_flight_records": (1, LIMITS.max_in_flight_records_max),
    "session_timeout_ms": (LIMITS.session_timeout_ms_min, LIMITS.session_timeout_ms_max),
}


def _group(request: web.Request) -> str:
    return _name(request.match_info["group"], "group")


def _member(request: web.Request) -> str:
    return _name(request.match_info["member_id"], "member_id")


async def put_group(request: web.Request) -> web.Response:
    group = _group(request)
    doc = codec.parse_json_object(await request.read())
    codec.only_fields(doc, {*CONFIG_FIELDS, "dead_letter_topic"})
    changes: dict[str, Any] = {
        name: _int(doc, name, None, low, high)
        for name, (low, high) in CONFIG_FIELDS.items()
        if name in doc
    }
    if "dead_letter_topic" in doc:
        changes["dead_letter_topic"] = _topic(doc["dead_letter_topic"], "dead_letter_topic")
    lock, session = changes.get("lock_duration_ms"), changes.get("session_timeout_ms")
    if lock is not None and session is not None and session < lock:  # else: the machine's
        raise errors.InvalidRequest(
            f"session_timeout_ms ({session}) must be at least lock_duration_ms ({lock}): a "
            "member's session must outlive its locks", field="session_timeout_ms", limit=lock,
        )  # fmt: skip
    broker = _routed(request)
    # The topic the group will write dead letters to, for this caller (the table's
    # run:dead_letter_topic): the one named, the one it has, or the default.
    dead_letter_topic = broker.share.dead_letter_topic_after(group, changes)
    auth.require(request, "topic", dead_letter_topic, "write")
    if not broker.topics.exists(dead_letter_topic):
        auth.require(request, "topic", dead_letter_topic, "create")
    found = await broker.share.put_group(group, changes, auth.principal_name(request))
    return codec.json_response(group_json(found, 0, partitions=False))


def _topic(value: Any, field: str) -> str:
    """A topic name, by the topics' own rule (not '.' or '..', at most 249 characters)."""
    name = _name(value, field, limits.TOPIC_NAME_CHARS_MAX)
    try:
        check_topic_name(name)
    except errors.InvalidRequest as exc:
        raise errors.InvalidRequest(
            exc.message, field=field, limit=limits.TOPIC_NAME_CHARS_MAX
        ) from None
    return name


async def join(request: web.Request) -> web.Response:
    group = _group(request)
    doc = codec.parse_json_object(await request.read())
    codec.only_fields(doc, {"topics"})
    topics = doc.get("topics")
    topics_max = LIMITS.topics_per_member_max
    if not isinstance(topics, list) or not 1 <= len(topics) <= topics_max:
        raise errors.InvalidRequest(
            f"topics must be a list of 1 to {topics_max} topic names", field="topics",
            limit=topics_max,
        )  # fmt: skip
    names = tuple(_name(t, f"topics[{i}]") for i, t in enumerate(topics))
    member_id = await _routed(request).share.join(group, names, auth.principal_name(request))
    return codec.json_response({"group": group, "member_id": member_id}, status=201)


async def leave(request: web.Request) -> web.Response:
    group, member_id = _group(request), _member(request)
    await _routed(request).share.leave(group, member_id)
    return web.Response(status=204)


async def records(request: web.Request) -> web.Response:
    group, member_id = _group(request), _member(request)
    max_records, max_bytes, wait_ms = codec.fetch_limits(request, request.app[BROKER].config)
    encoding = codec.check_encoding(request.query.get("value_encoding"))
    selected = record_filter(request, request.app[BROKER].config)  # tags= / filter=
    broker = _routed(request)
    for topic in broker.share.member_topics(group, member_id):  # each poll, not only the join
        auth.require(request, "topic", topic, "read")
    found = await broker.share.poll(
        group, member_id, max_records, max_bytes, wait_ms, record_filter=selected
    )
    return codec.json_response(
        {"group": group, "member_id": member_id, "records": [_delivery(d, encoding) for d in found]}
    )


def _delivery(d: Delivery, encoding: str) -> dict[str, Any]:
    a = d.acquired
    head = {
        "topic": a.topic,
        "partition": a.partition,
        "offset": a.offset,
        "delivery_count": a.delivery_count,
        "locked_until": a.locked_until_ms,
    }
    if d.record is None:  # the log no longer holds it (retention, compaction): ack it
        return {**head, "timestamp": None, "key": None, "value": None, "headers": []}
    body = codec.record_to_json(d.record, encoding)
    del body["offset"]
    return {**head, **body}


async def acks(request: web.Request) -> web.Response:
    group, member_id = _group(request), _member(request)
    doc = codec.parse_json_object(await request.read())
    codec.only_fields(doc, {"acks"})
    items = _acks(doc)
    count = await _routed(request).share.ack(group, member_id, items)
    return codec.json_response({"acknowledged": count})


def _acks(doc: dict[str, Any]) -> tuple[Ack, ...]:
    entries = doc.get("acks")
    limit = LIMITS.records_per_command_max
    if not isinstance(entries, list) or not entries:
        raise errors.InvalidRequest(
            "acks must be a non-empty list of {topic, partition, offsets, type, delay_ms}",
            field="acks",
        )
    out: list[Ack] = []
    for i, e in enumerate(entries):
        where = f"acks[{i}]"
        if not isinstance(e, dict) or not {"topic", "partition", "offsets", "type"} <= set(e):
            raise errors.InvalidRequest(
                f"{where} must be {{topic, partition, offsets, type[, delay_ms]}}", field=where
            )
        if set(e) - {"topic", "partition", "offsets", "type", "delay_ms"}:
            raise errors.InvalidRequest(f"{where} has unknown fields", field=where)
        topic = _name(e["topic"], f"{where}.topic")
        partition = _at(e, where, "partition", None, 0, limits.PARTITIONS_PER_TOPIC_MAX - 1)
        kind = e["type"]
        if kind not in ACK_KINDS:
            raise errors.InvalidRequest(
                f"{where}.type must be one of {ACK_KINDS}", field=f"{where}.type"
            )
        delay_ms = _at(e, where, "delay_ms", 0, 0, LIMITS.delay_ms_max)
        if delay_ms and kind != "release":
            raise errors.InvalidRequest(
                f"{where}.delay_ms applies to release only", field=f"{where}.delay_ms"
            )
        offsets = e["offsets"]
        if (
            not isinstance(offsets, list)
            or not offsets
            or any(
                isinstance(o, bool) or not isinstance(o, int) or not 0 <= o < 2**63 for o in offsets
            )
        ):
            raise errors.InvalidRequest(
                f"{where}.offsets must be a non-empty list of offsets", field=f"{where}.offsets"
            )
        out += [(topic, partition, o, kind, delay_ms) for o in offsets]
        if len(out) > limit:
            raise errors.InvalidRequest(
                f"at most {limit} records per acks request", field="acks", limit=limit
            )
    if len({(t, p, o) for t, p, o, _, _ in out}) != len(out):
        raise errors.InvalidRequest("a record is acknowledged twice in one request", field="acks")
    return tuple(out)


def _at(e: dict[str, Any], where: str, name: str, default: int | None, low: int, high: int) -> int:
    """An integer field of acks[i], the error naming it as `acks[i].<name>`."""
    try:
        return _int(e, name, default, low, high)
    except errors.InvalidRequest as exc:
        raise errors.InvalidRequest(
            f"{where}.{exc.message}", **{**exc.details, "field": f"{where}.{name}"}
        ) from None


async def list_groups(request: web.Request) -> web.Response:
    return codec.json_response({"share_groups": _routed(request).share.list_groups()})


async def describe_group(request: web.Request) -> web.Response:
    group = _group(request)
    return codec.json_response(_routed(request).share.describe(group))


async def delete_group(request: web.Request) -> web.Response:
    group = _group(request)
    await _routed(request).share.delete_group(group)
    return web.Response(status=204)


SHARE_ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("GET", "/v1/share-groups", list_groups),
    ("GET", "/v1/share-groups/{group}", describe_group),
    ("PUT", "/v1/share-groups/{group}", put_group),
    ("DELETE", "/v1/share-groups/{group}", delete_group),
    ("POST", "/v1/share-groups/{group}/members", join),
    ("DELETE", "/v1/share-groups/{group}/members/{member_id}", leave),
    ("GET", "/v1/share-groups/{group}/members/{member_id}/records", records),
    ("POST", "/v1/share-groups/{group}/members/{member_id}/acks", acks),
)

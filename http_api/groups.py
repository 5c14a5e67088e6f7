"""Consumer-group routes (groups/README.md has the protocol, http_api/README.md the API).

Thin handlers: parse and bound the input, call the broker's GroupsService, encode. Every
route is answered by the metadata group's leader (`route` relays the request there).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from dmq import errors, limits
from dmq.broker import Broker
from dmq.broker.groups import MemberView, PartitionFetch, group_summary
from http_api import auth, codec
from http_api.filtering import record_filter
from http_api.forward import BROKER, forwarded_hops

ASSIGNOR_NAMES = ("range", "roundrobin", "sticky")


def _routed(request: web.Request) -> Broker:
    """This broker when it leads the metadata group; else ForwardRequest to the leader
    (the group, share-group and REST v2 consumer routes: the leader keeps their state)."""
    broker = request.app[BROKER]
    if not broker.ready:
        raise errors.BrokerUnavailable("the broker is starting or stopping", retry_after_ms=500)
    broker.groups.route(forwarded_hops(request))
    return broker


def _name(value: Any, field: str, chars_max: int = limits.GROUP_NAME_CHARS_MAX) -> str:
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= chars_max
        or not all(c.isascii() and (c.isalnum() or c in "._-") for c in value)
    ):
        raise errors.InvalidRequest(
            f"{field} must be 1-{chars_max} characters of [a-zA-Z0-9._-]",
            field=field, limit=chars_max,
        )  # fmt: skip
    return value


def _int(doc: dict[str, Any], field: str, default: int | None, low: int, high: int) -> int:
    value = doc.get(field, default)
    if value is None:
        raise errors.InvalidRequest(f"{field} is required", field=field)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise errors.InvalidRequest(
            f"{field} must be an integer in [{low}, {high}]", field=field,
            limit=high if isinstance(value, int) and value > high else low,
        )  # fmt: skip
    return value


def _offsets(doc: dict[str, Any], field: str = "offsets") -> tuple[tuple[str, int, int], ...]:
    items = doc.get(field)
    limit = limits.OFFSETS_PER_COMMIT_MAX
    if not isinstance(items, list) or not 1 <= len(items) <= limit:
        raise errors.InvalidRequest(
            f"{field} must be a list of 1 to {limit} {{topic, partition, offset}}",
            field=field, limit=limit,
        )  # fmt: skip
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) != {"topic", "partition", "offset"}:
            raise errors.InvalidRequest(
                f"{field}[{i}] must be {{topic, partition, offset}}", field=f"{field}[{i}]"
            )
        topic = _name(item["topic"], f"{field}[{i}].topic")
        partition = _int(item, "partition", None, 0, limits.PARTITIONS_PER_TOPIC_MAX - 1)
        offset = _int(item, "offset", None, 0, 2**63 - 1)
        out.append((topic, partition, offset))
    return tuple(out)


def _member_view(request: web.Request, v: MemberView) -> dict[str, Any]:
    """A member's view: only the partitions of topics the caller may read (auth.readable)."""
    keep = auth.readable(request)
    return {
        "group": v.group,
        "member_id": v.member_id,
        "generation": v.generation,
        "assignment": [{"topic": t, "partition": p} for t, p in v.assignment if keep(t)],
        "revoking": [{"topic": t, "partition": p} for t, p in v.revoking if keep(t)],
        "assignment_changed": v.assignment_changed,
        "session_timeout_ms": v.session_timeout_ms,
    }


def _subscription(doc: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    topics, pattern = doc.get("topics"), doc.get("topic_pattern")
    if (topics is None) == (pattern is None):
        raise errors.InvalidRequest("give either topics or topic_pattern", field="topics")
    if pattern is not None:
        chars_max = limits.TOPIC_PATTERN_CHARS_MAX
        if not isinstance(pattern, str) or not 1 <= len(pattern) <= chars_max:
            raise errors.InvalidRequest(
                f"topic_pattern must be a regular expression of 1-{chars_max} characters",
                field="topic_pattern", limit=chars_max,
            )  # fmt: skip
        return (), pattern
    topics_max = limits.SUBSCRIPTION_TOPICS_MAX
    if not isinstance(topics, list) or not 1 <= len(topics) <= topics_max:
        raise errors.InvalidRequest(
            f"topics must be a list of 1 to {topics_max} topic names", field="topics",
            limit=topics_max,
        )  # fmt: skip
    return tuple(_name(t, f"topics[{i}]") for i, t in enumerate(topics)), ""


async def join(request: web.Request) -> web.Response:
    group = _name(request.match_info["group"], "group")
    doc = codec.parse_json_object(await request.read())
    codec.only_fields(
        doc,
        {"topics", "topic_pattern", "session_timeout_ms", "assignor", "instance_id", "member_id"},
    )
    topics, pattern = _subscription(doc)
    timeout_ms = _int(
        doc, "session_timeout_ms", limits.SESSION_TIMEOUT_MS_DEFAULT,
        limits.SESSION_TIMEOUT_MS_MIN, limits.SESSION_TIMEOUT_MS_MAX,
    )  # fmt: skip
    assignor = doc.get("assignor", "sticky")
    if assignor not in ASSIGNOR_NAMES:
        raise errors.InvalidRequest(f"assignor must be one of {ASSIGNOR_NAMES}", field="assignor")
    instance = doc.get("instance_id")
    instance_id = (
        "" if instance is None else _name(instance, "instance_id", limits.INSTANCE_ID_CHARS_MAX)
    )
    chosen = doc.get("member_id")  # the client's own id makes a retried join idempotent
    member_id = "" if chosen is None else _name(chosen, "member_id")
    broker = _routed(request)
    view = await broker.groups.join(
        group, topics=topics, topic_pattern=pattern, session_timeout_ms=timeout_ms,
        assignor=assignor, instance_id=instance_id, member_id=member_id,
    )  # fmt: skip
    return codec.json_response(_member_view(request, view), status=201)


async def heartbeat(request: web.Request) -> web.Response:
    group = _name(request.match_info["group"], "group")
    member_id = _name(request.match_info["member_id"], "member_id")
    doc = codec.parse_json_object(await request.read())
    generation = _int(doc, "generation", None, 0, 2**62)
    view = await _routed(request).groups.heartbeat(group, member_id, generation)
    return codec.json_response(_member_view(request, view))


async def leave(request: web.Request) -> web.Response:
    group = _name(request.match_info["group"], "group")
    member_id = _name(request.match_info["member_id"], "member_id")
    await _routed(request).groups.leave(group, member_id)
    return web.Response(status=204)


async def member_records(request: web.Request) -> web.Response:
    group = _name(request.match_info["group"], "group")
    member_id = _name(request.match_info["member_id"], "member_id")
    max_records, max_bytes, wait_ms = codec.fetch_limits(request, request.app[BROKER].config)
    kept = record_filter(request, request.app[BROKER].config)
    encoding = codec.check_encoding(request.query.get("value_encoding"))
    auto_commit = request.query.get("auto_commit", "false")
    if auto_commit not in ("true", "false"):
        raise errors.InvalidRequest("auto_commit must be true or false", field="auto_commit")
    isolation = codec.isolation_param(request)  # read_committed stops at the LSO
    broker = _routed(request)

    async def read(topic: str, partition: int, offset: int, wait: int) -> Any:
        return await broker.fetch.partition_read(
            topic, partition, offset, wait, max_records, max_bytes, kept, isolation
        )

    async def log_start(topic: str, partition: int) -> int:
        return int((await broker.fetch.partition_offsets(topic, partition)).log_start_offset)

    view, found = await broker.groups.fetch(
        group, member_id, wait_ms, read, log_start, report_skipped=kept is not None,
        keep=auth.readable(request),
    )  # fmt: skip
    # A topic it named but may no longer read (an ACL removed since the join) was not
    # read above; the member learns why here, with nothing served. A topic its pattern
    # matches but it may not read is simply not matched (auth.readable).
    for topic in view.topics:
        auth.require(request, "topic", topic, "read")
    parts = []
    for f, records in _within_budget(found, max_records, max_bytes):
        # All of the partition's records taken: its position is where the read stopped
        # (past the records a filter dropped); else just past the last one taken.
        whole = len(records) == len(f.result.records)
        parts.append(
            {
                "topic": f.topic,
                "partition": f.partition,
                "offset": f.offset,
                "next_offset": f.result.next_offset if whole else records[-1].offset + 1,
                "high_watermark": f.result.high_watermark,
                "records": [codec.record_to_json(r, encoding) for r in records],
            }
        )
    if auto_commit == "true" and parts:  # at-most-once: committed before the caller sees them
        offsets = tuple((p["topic"], p["partition"], p["next_offset"]) for p in parts)
        await broker.groups.commit(group, member_id, view.generation, offsets)
    return codec.json_response({**_member_view(request, view), "partitions": parts})


def _within_budget(
    found: list[PartitionFetch], max_records: int, max_bytes: int
) -> list[tuple[PartitionFetch, list[Any]]]:
    """max_records and max_bytes bound the whole answer, not each partition: records are
    taken partition after partition until either runs out (the first record always, so a
    record larger than max_bytes cannot stall the group). What is left out stays at the
    group's position and comes in a later fetch."""
    out: list[tuple[PartitionFetch, list[Any]]] = []
    records_left, bytes_left = max_records, max_bytes
    for f in found:
        taken: list[Any] = []
        for record in f.result.records:
            size = len(record.key or b"") + len(record.value or b"")
            size += sum(len(h.key) + len(h.value or b"") for h in record.headers)
            if records_left <= 0 or (size > bytes_left and (out or taken)):
                break
            taken.append(record)
            records_left -= 1
            bytes_left -= size
        if taken or (not f.result.records and f.result.next_offset > f.offset):
            out.append((f, taken))  # (a filtered read that only skipped records: no taken)
        if records_left <= 0 or bytes_left <= 0:
            break
    return out


async def commit_offsets(request: web.Request) -> web.Response:
    group = _name(request.match_info["group"], "group")
    doc = codec.parse_json_object(await request.read())
    member = doc.get("member_id")
    member_id = "" if member is None else _name(member, "member_id")
    generation = _int(doc, "generation", -1 if member is None else None, -1, 2**62)
    offsets = _offsets(doc)
    await _routed(request).groups.commit(group, member_id, generation, offsets)
    return codec.json_response({"committed": len(offsets)})


async def read_offsets(request: web.Request) -> web.Response:
    group = _name(request.match_info["group"], "group")
    broker = _routed(request)
    broker.transactions.check_stable(group)  # no transaction pending offsets for it
    visible = auth.describable(request)
    offsets = await broker.groups.committed(group)
    return _offsets_response(group, {tp: o for tp, o in offsets.items() if visible(tp[0])})


def _offsets_response(group: str, offsets: dict[tuple[str, int], int]) -> web.Response:
    """A group's offsets, as reading and resetting them answer."""
    rows = [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(offsets.items())]
    return codec.json_response({"group": group, "offsets": rows})


async def reset_offsets(request: web.Request) -> web.Response:
    group = _name(request.match_info["group"], "group")
    doc = codec.parse_json_object(await request.read())
    to = doc.get("to")
    topics: tuple[str, ...] = ()
    explicit: tuple[tuple[str, int, int], ...] = ()
    target: str | int | None = None
    if isinstance(to, dict) and set(to) == {"offsets"}:
        explicit = _offsets(to)
    else:
        if to in ("earliest", "latest"):
            target = to
        elif isinstance(to, dict) and set(to) == {"timestamp"}:
            target = _int(to, "timestamp", None, 0, 2**63 - 1)
        else:
            raise errors.InvalidRequest(
                'to must be "earliest", "latest", {"timestamp": ms} or {"offsets": [...]}',
                field="to",
            )
        raw_topics = doc.get("topics")
        if not isinstance(raw_topics, list) or not 1 <= len(raw_topics) <= 1_000:
            raise errors.InvalidRequest("topics must list 1 to 1000 topics", field="topics")
        topics = tuple(_name(t, f"topics[{i}]") for i, t in enumerate(raw_topics))
    broker = _routed(request)
    done = await broker.groups.reset_to(
        group, topics, target, explicit,
        lambda t: len(broker.topics.describe_topic(t).partitions), broker.fetch.partition_offsets,
    )  # fmt: skip
    return _offsets_response(group, done)


async def list_groups(request: web.Request) -> web.Response:
    groups = _routed(request).groups.groups()
    return codec.json_response(
        {"groups": [group_summary(g) for g in sorted(groups, key=lambda g: g.name)]}
    )


async def delete_group(request: web.Request) -> web.Response:
    group = _name(request.match_info["group"], "group")
    await _routed(request).groups.delete_group(group)
    return web.Response(status=204)


async def describe_group(request: web.Request) -> web.Response:
    group = _name(request.match_info["group"], "group")
    broker = _routed(request)
    found = await broker.groups.describe(
        group, broker.fetch.partition_offsets, auth.describable(request)
    )
    return codec.json_response(found)


GROUP_ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("GET", "/v1/groups", list_groups),
    ("GET", "/v1/groups/{group}", describe_group),
    ("DELETE", "/v1/groups/{group}", delete_group),
    ("POST", "/v1/groups/{group}/members", join),
    ("POST", "/v1/groups/{group}/members/{member_id}/heartbeat", heartbeat),
    ("DELETE", "/v1/groups/{group}/members/{member_id}", leave),
    ("GET", "/v1/groups/{group}/members/{member_id}/records", member_records),
    ("GET", "/v1/groups/{group}/offsets", read_offsets),
    ("POST", "/v1/groups/{group}/offsets", commit_offsets),
    ("POST", "/v1/groups/{group}/offsets/reset", reset_offsets),
)

"""HTTP routes of cluster operations (dmq/broker/operations.py): thin, as every handler here.

Public:

- `POST /v1/cluster/reassignments` `{"topic", "partition", "replicas": [ids, leader first]}`
  -> 202 with the operation (the metadata leader carries it out);
- `GET /v1/cluster/operations` -> `{"reassignments": [...], "decommissions": [...]}`, each
  reassignment with `step` and `progress` (0..1: the slowest new replica's log vs the
  leader's commit index);
- `POST /v1/cluster/brokers/{broker_id}/decommission` -> 202;
- `POST /v1/topics/{topic}/partitions/{partition}/decommission` -> 202 (no new records;
  removed once retention empties it; `partition_decommissions` in the operations);
- `POST /v1/cluster/metadata-voters` `{"voters": [ids]}` -> 202: change the metadata
  group's voters to that set, one broker at a time (`metadata_voters` in the operations;
  409 while another change runs).

Internal (one broker to another, on the partition's leader): `GET .../progress`,
`GET .../log` (the replica's leadership and log offsets, for partition decommission),
`POST .../membership` `{"action": "add"|"remove", "node_id"}`, `POST .../transfer`
`{"target"}` under `/v1/internal/partitions/{topic}/{partition}/`, with `?topic_id=`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from dmq import errors
from http_api import codec
from http_api.forward import broker_of

# A replica list longer than this is refused before it reaches the metadata group (the
# group then checks it against the topic's replication factor).
REASSIGN_REPLICAS_MAX = 16
# Likewise for a voter set (the metadata group checks dmq/metadata/voters.py's METADATA_VOTERS_MAX).
METADATA_VOTERS_LIST_MAX = 16
BROKER_ID_CHARS_MAX = 255


def _broker_id(value: Any, field: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= BROKER_ID_CHARS_MAX:
        raise errors.InvalidRequest(
            f"{field} must be a broker id of 1-{BROKER_ID_CHARS_MAX} characters", field=field
        )
    return value


def _broker_ids(doc: dict[str, Any], field: str, count_max: int) -> list[str]:
    """doc[field]: a list of 1..count_max broker ids."""
    value = doc.get(field)
    if not isinstance(value, list) or not 0 < len(value) <= count_max:
        raise errors.InvalidRequest(
            f"{field} must be a list of 1-{count_max} broker ids", field=field, limit=count_max
        )
    return [_broker_id(v, field) for v in value]


async def reassign(request: web.Request) -> web.Response:
    doc = codec.parse_json_object(await request.read())
    codec.only_fields(doc, {"topic", "partition", "replicas"})
    topic, partition = doc.get("topic"), doc.get("partition")
    if not isinstance(topic, str):
        raise errors.InvalidRequest("topic must be a string", field="topic")
    if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
        raise errors.InvalidRequest("partition must be an integer >= 0", field="partition")
    ids = _broker_ids(doc, "replicas", REASSIGN_REPLICAS_MAX)
    return codec.json_response(
        await broker_of(request).operations.reassign(topic, partition, ids), status=202
    )


async def change_metadata_voters(request: web.Request) -> web.Response:
    doc = codec.parse_json_object(await request.read())
    codec.only_fields(doc, {"voters"})
    ids = _broker_ids(doc, "voters", METADATA_VOTERS_LIST_MAX)
    answer = await broker_of(request).operations.change_metadata_voters(ids)
    return codec.json_response(answer, status=202)


async def operations(request: web.Request) -> web.Response:
    return codec.json_response(await broker_of(request).operations.operations())


async def decommission(request: web.Request) -> web.Response:
    broker_id = _broker_id(request.match_info["broker_id"], "broker_id")
    return codec.json_response(
        await broker_of(request).operations.decommission(broker_id), status=202
    )


async def decommission_partition(request: web.Request) -> web.Response:
    raw = request.match_info["partition"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10:
        raise errors.InvalidRequest("partition must be an integer >= 0", field="partition")
    topic = request.match_info["topic"]
    answer = await broker_of(request).operations.decommission_partition(topic, int(raw))
    return codec.json_response(answer, status=202)


async def _internal_group(request: web.Request, what: str) -> web.Response:
    raw_topic_id = request.query.get("topic_id", "")
    raw_partition = request.match_info["partition"]
    if not (raw_topic_id.isascii() and raw_topic_id.isdigit()):
        raise errors.InvalidRequest("topic_id must be an integer", field="topic_id")
    if not (raw_partition.isascii() and raw_partition.isdigit()):
        raise errors.InvalidRequest("partition must be an integer", field="partition")
    body = codec.parse_json_object(await request.read()) if request.method == "POST" else {}
    answer = await broker_of(request).operations.local_call(
        request.match_info["topic"], int(raw_partition), int(raw_topic_id), what, body
    )
    return codec.json_response(answer)


async def internal_progress(request: web.Request) -> web.Response:
    return await _internal_group(request, "progress")


async def internal_log(request: web.Request) -> web.Response:
    return await _internal_group(request, "log")


async def internal_membership(request: web.Request) -> web.Response:
    return await _internal_group(request, "membership")


async def internal_transfer(request: web.Request) -> web.Response:
    return await _internal_group(request, "transfer")


_GROUP = "/v1/internal/partitions/{topic}/{partition}"
OPERATIONS_ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("POST", "/v1/cluster/reassignments", reassign),
    ("GET", "/v1/cluster/operations", operations),
    ("POST", "/v1/cluster/metadata-voters", change_metadata_voters),
    ("POST", "/v1/cluster/brokers/{broker_id}/decommission", decommission),
    ("POST", "/v1/topics/{topic}/partitions/{partition}/decommission", decommission_partition),
    ("GET", f"{_GROUP}/progress", internal_progress),
    ("GET", f"{_GROUP}/log", internal_log),
    ("POST", f"{_GROUP}/membership", internal_membership),
    ("POST", f"{_GROUP}/transfer", internal_transfer),
)

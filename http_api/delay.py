"""Delayed records over HTTP (dmq/broker/delay.py): produce, count, cancel.

- `POST /v1/topics/{topic}/records` with `deliver_at` (ms since the epoch) or `delay_ms`
  on a record, or `?delay_ms=` / `?deliver_at=` for every record of the request: each
  delayed record is answered `{"partition": 0, "offset": null, "deliver_at": ...,
  "id": "0-1700000030000-4294967296"}` (records already due get their offset);
- `GET /v1/topics/{topic}/scheduled`: `{"count", "next_deliver_at", "partitions"}`;
- `DELETE /v1/topics/{topic}/scheduled/{id}`: cancel (404 once released or cancelled).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from dmq import errors
from dmq.broker.delay import records_of_batch
from dmq.broker.types import Acks, ProduceRecord, ProducerSequence
from http_api import codec
from http_api.forward import broker_of

# The binary path's headers: the same as the query parameters, for a whole batch.
DELAY_HEADERS = {"delay_ms": "X-Dmq-Delay-Ms", "deliver_at": "X-Dmq-Deliver-At"}


def _query_delay(request: web.Request) -> dict[str, int]:
    """The request's delay for every record without its own: ?delay_ms= or
    ?deliver_at=, or the X-Dmq-Delay-Ms / X-Dmq-Deliver-At header."""
    out = {}
    for name, field in (("delay_ms", "delay_ms"), ("deliver_at", "deliver_at_ms")):
        value = codec.int_param(request, name, None, 0, 2**63 - 1)
        header = request.headers.get(DELAY_HEADERS[name])
        if value is None and header is not None:
            if not (header.isascii() and header.isdigit() and len(header) <= 19):
                raise errors.InvalidRequest(
                    f"{DELAY_HEADERS[name]} must be milliseconds", field=DELAY_HEADERS[name]
                )
            value = int(header)
        if value is not None:
            out[field] = value
    if len(out) > 1:
        raise errors.InvalidRequest("give delay_ms or deliver_at, not both", field="delay_ms")
    return out


def delay_requested(request: web.Request, records: list[ProduceRecord]) -> bool:
    return bool(_query_delay(request)) or any(
        r.delay_ms is not None or r.deliver_at_ms is not None for r in records
    )


async def produce_delayed(
    request: web.Request,
    topic: str,
    records: list[ProduceRecord],
    acks: Acks,
    producer: ProducerSequence | None,
) -> web.Response:
    """The produce handler's answer when some record is delayed."""
    default = _query_delay(request)
    if default:
        records = [
            r if r.delay_ms is not None or r.deliver_at_ms is not None
            else dataclasses.replace(r, **default)  # type: ignore[arg-type]
            for r in records
        ]  # fmt: skip
    placed = await broker_of(request).delay.produce(topic, records, acks=acks, producer=producer)
    out: list[dict[str, Any]] = []
    for p in placed:
        entry: dict[str, Any] = {"partition": p.partition, "offset": p.offset}
        if p.schedule_id is not None:
            entry |= {"deliver_at": p.deliver_at_ms, "id": p.schedule_id}
        out.append(entry)
    return codec.json_response({"offsets": out})


async def produce_delayed_batch(
    request: web.Request, topic: str, body: bytes, partition: int | None, acks: Acks
) -> web.Response:
    """A binary produce (one RecordBatch) with X-Dmq-Delay-Ms or ?delay_ms=: each of
    its records scheduled, as the JSON path does."""
    records = records_of_batch(body, partition)
    return await produce_delayed(request, topic, records, acks, None)


async def scheduled(request: web.Request) -> web.Response:
    return codec.json_response(
        await broker_of(request).delay.scheduled(request.match_info["topic"])
    )


async def cancel(request: web.Request) -> web.Response:
    topic, schedule_id = request.match_info["topic"], request.match_info["id"]
    await broker_of(request).delay.cancel(topic, schedule_id)
    return codec.json_response({"cancelled": schedule_id})


def _partition(request: web.Request) -> int:
    raw = request.match_info["partition"]
    if not (raw.isascii() and raw.isdigit()):
        raise errors.InvalidRequest("partition must be a non-negative integer", field="partition")
    return int(raw)


async def internal_propose(request: web.Request) -> web.Response:
    topic_id = codec.int_param(request, "topic_id", None, 1, 2**62)
    if topic_id is None:
        raise errors.InvalidRequest("topic_id is required", field="topic_id")
    try:
        results = await broker_of(request).delay.propose_forwarded(
            request.match_info["topic"], topic_id, _partition(request), await request.read()
        )
    except ValueError as exc:  # DelayCommandError: not a command apply could read
        raise errors.InvalidRequest(str(exc), field="body") from exc
    return codec.json_response({"results": results})


async def internal_summary(request: web.Request) -> web.Response:
    delay = broker_of(request).delay
    replica = delay.local_replica(request.match_info["topic"], _partition(request))
    return codec.json_response(await delay.local_summary(replica))


async def internal_pending(request: web.Request) -> web.StreamResponse:
    """The replica's delay store as it was at (?index, ?k), streamed: for a replica
    installing a snapshot at that position (dmq/partition/delay.py, `export`)."""
    index = codec.int_param(request, "index", None, 0, 2**63 - 1)
    k = codec.int_param(request, "k", None, 0, 2**32 - 1)
    if index is None or k is None:
        raise errors.InvalidRequest("index and k are required", field="index")
    delay = broker_of(request).delay
    replica = delay.local_replica(request.match_info["topic"], _partition(request))
    chunks = replica.export_delay((index, k))
    try:
        first = await anext(chunks)  # refused before the answer starts: a JSON error
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        await response.write(first)
        async for chunk in chunks:
            await response.write(chunk)
        await response.write_eof()
    finally:
        await chunks.aclose()
    return response


DELAY_ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("GET", "/v1/topics/{topic}/scheduled", scheduled),
    ("DELETE", "/v1/topics/{topic}/scheduled/{id}", cancel),
    ("POST", "/v1/internal/delay/{topic}/{partition}", internal_propose),
    ("GET", "/v1/internal/delay/{topic}/{partition}", internal_summary),
    ("GET", "/v1/internal/delay/{topic}/{partition}/pending", internal_pending),
)

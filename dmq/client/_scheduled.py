"""Delayed records waiting for their time (dmq/broker/delay.py), for operators: how many
each partition holds and when the next is due, and cancelling one by its schedule id
(`dmq delay list|cancel`). Producing them is `dmq produce --delay` (dmq/cli/delay.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from dmq.client import _limits
from dmq.client._http import Transport


def _transport(url: str, api_timeout_ms: int) -> Transport:
    return Transport(
        url, request_timeout_ms=_limits.REQUEST_TIMEOUT_MS_DEFAULT, api_timeout_ms=api_timeout_ms
    )


async def scheduled_records(
    url: str, topic: str, *, default_api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT
) -> dict[str, Any]:
    """`GET /v1/topics/{topic}/scheduled`: `{"topic", "count", "next_deliver_at",
    "partitions": [{"partition", "count", "next_deliver_at"}, ...]}`."""
    transport = _transport(url, default_api_timeout_ms)
    try:
        path = f"/v1/topics/{quote(topic, safe='')}/scheduled"
        return dict((await transport.request("GET", path)).json())
    finally:
        await transport.close()


async def cancel_scheduled(
    url: str,
    topic: str,
    schedule_id: str,
    *,
    default_api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT,
) -> None:
    """`DELETE /v1/topics/{topic}/scheduled/{id}`; `NotFound` once it was released or
    cancelled (or never scheduled)."""
    transport = _transport(url, default_api_timeout_ms)
    try:
        path = f"/v1/topics/{quote(topic, safe='')}/scheduled/{quote(schedule_id, safe='')}"
        await transport.request("DELETE", path)
    finally:
        await transport.close()

"""Relaying a request to the broker that can answer it (the partition leader's).

A Broker method raises `ForwardRequest(http_addr)` when another broker must answer
(a fetch or offset lookup for a partition led elsewhere). `relay` (a stage of
http_api/edge.py's middleware) then sends the same request there, marked with the
forwarded header so that it is never relayed a second time, and returns that broker's answer as it is: status, body,
content type, Retry-After and the X-Dmq-* headers. A relay to a named broker is given
up once that broker goes out of reach (no Raft heartbeat within an election timeout):
not_leader for a read, request_timeout (outcome unknown) for anything else.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from dmq import errors
from dmq.broker import Broker, ForwardRequest
from dmq.internal_auth import CLUSTER_ID_HEADER, signed_headers
from dmq.peers import FORWARDED_HEADER, error_from

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BROKER: web.AppKey[Broker] = web.AppKey("broker", Broker)


def broker_of(request: web.Request) -> Broker:
    """The Broker this application serves."""
    return request.app[BROKER]


# Authorization: the broker that answers checks the caller again (http_api/auth.py).
_PASSED_REQUEST_HEADERS = ("Accept", "Authorization", "Content-Type")
_PASSED_RESPONSE_HEADERS = ("Content-Type", "Retry-After")


def is_forwarded(request: web.Request) -> bool:
    return FORWARDED_HEADER in request.headers


async def relay(request: web.Request, forward: ForwardRequest) -> web.Response:
    """Answer with what the broker a handler named (by raising ForwardRequest) answers
    (http_api/edge.py calls this when the handler raised it)."""
    relayed = _relay(request, forward.http_addr, forward.hops)
    if forward.node_id is None:
        return await relayed
    lost = functools.partial(_lost, request.method, forward.node_id)
    return await broker_of(request).unless_out_of_reach(forward.node_id, relayed, lost)


def _lost(method: str, node_id: str) -> errors.DmqError:
    """A relay whose target went out of reach (not heard from within an election
    timeout) before it answered: a read may be asked again anywhere; anything else
    may have been done there."""
    what = f"broker {node_id} went out of reach before it answered"
    if method in ("GET", "HEAD"):
        return errors.NotLeader(what, retry_after_ms=200)
    return errors.RequestTimeout(f"{what}; the outcome is unknown", retry_after_ms=200)


def forwarded_hops(request: web.Request) -> int:
    """How many brokers relayed this request (0: it came from a client)."""
    raw = request.headers.get(FORWARDED_HEADER)
    if raw is None:
        return 0
    # http_api/request_guard.py refused anything but 1-3 digits before any handler ran.
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 3 else 1


async def _relay(request: web.Request, http_addr: str, hops: int = 1) -> web.Response:
    broker = request.app[BROKER]
    headers = {h: request.headers[h] for h in _PASSED_REQUEST_HEADERS if h in request.headers}
    headers[FORWARDED_HEADER] = str(hops)
    if broker.cluster_id:  # the leader refuses a relay from another cluster (identity.py)
        headers[CLUSTER_ID_HEADER] = broker.cluster_id
    # read() returns the body again when the handler already read it (can_read_body is
    # then False): group handlers parse their body before they know where it goes.
    body = await request.read() or None
    url = broker.peers.url(http_addr, request.path_qs)
    receiver = broker.peers.receiver_of(http_addr)
    headers.update(
        signed_headers(broker.cluster_secret, request.method, url.raw_path_qs, body, receiver)
    )
    # A long-poll may wait fetch_wait_ms_max at the leader, then the usual request time.
    timeout_s = broker.config.fetch_wait_ms_max / 1000 + broker.timeout_s
    try:
        async with broker.peers.session.request(
            request.method,
            url,
            headers=headers,
            data=body,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            payload = await resp.read()
            if resp.status == 401:  # the relay's signature, refused for this broker's clock
                # is this broker's fault, not the client's: a retriable 503 (dmq/peers.py)
                refusal = error_from(resp.status, payload)
                if isinstance(refusal, errors.BrokerUnavailable):
                    raise refusal
            out = {
                k: v
                for k, v in resp.headers.items()
                if k in _PASSED_RESPONSE_HEADERS or k.startswith("X-Dmq-")
            }
            return web.Response(status=resp.status, body=payload, headers=out)
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
        raise errors.NotLeader(
            f"the partition leader at {http_addr} did not answer: {exc!r}", retry_after_ms=200
        ) from exc

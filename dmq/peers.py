"""Broker-to-broker HTTP: the calls one broker makes on another.

A broker forwards what it cannot do itself to the broker that can: an append to a
partition it hosts no replica of, a metadata command when it is not a metadata voter,
the metadata state an observer follows, a replica's status for `dmq cluster status`,
and the batches a lagging replica copies from the leader after a snapshot. All of them
use the internal routes of http_api/app.py (`/v1/internal/...`), which answer errors in
the public shape; `error_for_code` turns them back into dmq.errors here.

Every call has a deadline. Connection failures become BrokerUnavailable (retriable):
the caller decides whether to try another broker. With a cluster secret every internal
call is signed (dmq/internal_auth.py).
"""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
from yarl import URL

from dmq import compat, errors
from dmq.internal_auth import (
    CLUSTER_ID_HEADER,
    SIGNATURE_HEADER,
    broker_headers,
    signed_headers,
    target_of,
)

DELAYED_READ_BYTES = 1024 * 1024  # a delay store copy is read in pieces of this size
FORWARDED_HEADER = "X-Dmq-Forwarded"  # set on a forwarded request: it is never forwarded again
# Connections kept to each other broker (forwarded appends run in parallel on them).
CONNECTIONS_PER_PEER_MAX = 32
# How soon a call a peer refused for this broker's clock is worth trying again.
CLOCK_RETRY_MS = 1000


def scheme_of(tls: ssl.SSLContext | None) -> str:
    return "http" if tls is None else "https"


def error_from(status: int, body: bytes) -> errors.DmqError:
    try:
        doc = json.loads(body)["error"]
        error = errors.error_for_code(doc["code"], doc["message"], doc.get("details"))
    except (ValueError, KeyError, TypeError):
        return errors.BrokerUnavailable(f"peer answered {status}: {body[:200]!r}")
    return for_the_clock(error)


def for_the_clock(error: errors.DmqError) -> errors.DmqError:
    """A peer that refused this broker's signature for its time (the two clocks more than
    CLOCK_SKEW_MS_MAX apart: a clock step, NTP not yet converged) is unavailable to it
    until the clocks agree, not proof of a wrong secret: BrokerUnavailable, which every
    internal caller retries. A broker restarted with a stepped clock then waits instead
    of exiting on its relayed registration (jepsen campaign seed 1275855209;
    tests/cluster/test_cluster_clock_step.py). Any other error is returned as it is."""
    if (
        isinstance(error, errors.Unauthenticated)
        and error.details.get("reason") in ("expired", "replayed")
        and error.details.get("field") == SIGNATURE_HEADER
    ):
        # "replayed": the same signature twice, which this broker's own calls never
        # make (each has a nonce) but a tool's may; asking again signs anew.
        return errors.BrokerUnavailable(
            f"a peer refused this broker's call for its clock: {error.message}",
            retry_after_ms=CLOCK_RETRY_MS,
        )
    return error


class PeerClient:
    """Async calls to other brokers; one aiohttp session for all of them."""

    def __init__(
        self, local_host: str = "", secret: bytes | None = None, tls: ssl.SSLContext | None = None
    ) -> None:
        self._session: aiohttp.ClientSession | None = None
        self.secret = secret  # the cluster secret: internal calls are signed with it
        # http_addr -> the node id listening there ("" unknown): a signature names the
        # broker it is for (dmq/internal_auth.py). The Broker sets it (routing.node_at).
        self.receiver_of: Callable[[str], str] = lambda http_addr: ""
        # dmq/tls.py's http_client: with it every call is https, the other broker checked
        # against the cluster's CA and its address; None: plain http (TLS off).
        self.tls = tls
        # This broker's cluster id, named in every call once known (dmq/internal_auth.py).
        self.cluster_id = ""
        # Calls leave from this broker's own HTTP address when it has a specific one, as
        # Raft's do from its Raft address: peers and the fault harness (jepsen/, which cuts
        # links by address) see which broker is calling, not the loopback default.
        wildcard = local_host in ("", "0.0.0.0", "::", "[::]", "localhost")  # noqa: S104 - a check, not a bind
        self._local_addr = None if wildcard else (local_host.strip("[]"), 0)
        # http_addr -> the release its last answer named (dmq/compat.py): GET /v1/cluster.
        self.versions: dict[str, str] = {}
        # http_addr -> the feature levels its last answer named (None: unreadable), and the
        # cluster's finalized level as this broker knows it (dmq/compat.py): from level 1
        # on, every call is signed in the bound form, whoever the peer claims to be.
        self.feature_ranges: dict[str, compat.LevelRange | None] = {}
        self.finalized_level: Callable[[], int] = lambda: 0

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit_per_host=CONNECTIONS_PER_PEER_MAX,
                local_addr=self._local_addr,
                ssl=self.tls if self.tls is not None else True,
            ),
            headers={FORWARDED_HEADER: "1", **compat.CALL_HEADERS},
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def url(self, http_addr: str, path_qs: str) -> URL:
        """Another broker's route, https with TLS on (all brokers of a cluster use it)."""
        return URL(f"{scheme_of(self.tls)}://{http_addr}{path_qs}")

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise errors.BrokerUnavailable("the broker is stopping", retry_after_ms=500)
        return self._session

    async def call(
        self,
        method: str,
        http_addr: str,
        path: str,
        *,
        timeout_s: float,
        params: dict[str, str] | None = None,
        body: bytes | None = None,
        content_type: str = "application/octet-stream",
        retry_safe: bool = True,
    ) -> Any:
        """One request; the decoded JSON answer, or the broker's error raised.

        A failure before the request left (no connection) is BrokerUnavailable: another
        broker may be asked. A failure after it may have arrived (reset, timeout) is too
        when `retry_safe`; otherwise RequestTimeout, because the peer may have acted on it
        and asking again could do it twice (an append would store the batch twice)."""
        url = self.url(http_addr, path)
        if params:
            url = url.update_query(params)
        # Every route, public ones too: a broker's own call (dmq/internal_auth.py).
        receiver = self.receiver_of(http_addr)
        bound = self.finalized_level() >= 1 or compat.verifies_bound_signatures(
            self.versions.get(http_addr)
        )
        headers = broker_headers(self.secret, method, url.raw_path_qs, body, receiver, bound=bound)
        if self.cluster_id:
            headers[CLUSTER_ID_HEADER] = self.cluster_id
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            async with self.session.request(
                method,
                url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                self.versions[http_addr] = compat.release_of(resp.headers)
                self.feature_ranges[http_addr] = compat.feature_range_of(resp.headers)
                raw = await resp.read()
                if resp.status >= 400:
                    raise error_from(resp.status, raw)
                return json.loads(raw) if raw else None
        except aiohttp.ClientConnectorError as exc:
            raise errors.BrokerUnavailable(
                f"broker at {http_addr} could not be reached: {exc!r}", retry_after_ms=200
            ) from exc
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            if not retry_safe:
                raise errors.RequestTimeout(
                    f"broker at {http_addr} did not answer: {exc!r}; the outcome is unknown",
                    retry_after_ms=200,
                ) from exc
            raise errors.BrokerUnavailable(
                f"broker at {http_addr} did not answer: {exc!r}", retry_after_ms=200
            ) from exc

    async def append(
        self,
        http_addr: str,
        topic: str,
        topic_id: int,
        partition: int,
        batch: bytes,
        *,
        acks: str,
        log_append_time_ms: int | None,
        timeout_s: float,
    ) -> int | None:
        """Append a validated batch on a broker hosting the partition; its base offset."""
        params = {"acks": acks, "topic_id": str(topic_id)}
        if log_append_time_ms is not None:
            params["log_append_time_ms"] = str(log_append_time_ms)
        answer = await self.call(
            "POST",
            http_addr,
            f"/v1/internal/partitions/{topic}/{partition}/append",
            params=params,
            body=batch,
            timeout_s=timeout_s,
            retry_safe=False,
        )
        base = answer.get("base_offset")
        return None if base is None else int(base)


def fetch_batches_blocking(
    http_addr: str,
    topic: str,
    partition: int,
    start_offset: int,
    end_offset: int,
    timeout_s: float,
    secret: bytes | None = None,
    cluster_id: str = "",
    tls: ssl.SSLContext | None = None,
) -> Iterator[tuple[bytes, int]]:
    """Raw batches of [start_offset, end_offset) from a broker's replica, in chunks.

    Blocking (urllib): it runs on the Raft tick thread, inside a snapshot's restore, where
    no event loop is available. Yields each response body (whole batches, concatenated)
    with its `X-Dmq-Next-Offset`: the offset the source vouches for up to (past the last
    batch when compaction removed the batches after it).
    """
    offset = start_offset
    while offset < end_offset:
        url = (
            f"{scheme_of(tls)}://{http_addr}/v1/internal/partitions/{topic}/{partition}/batches"
            f"?start_offset={offset}&end_offset={end_offset}"
        )
        with (
            _blocking_errors(http_addr),
            _open_internal(url, secret, cluster_id, timeout_s, tls) as resp,
        ):
            body = resp.read()
            next_offset = int(resp.headers["X-Dmq-Next-Offset"])
        if next_offset <= offset:
            raise errors.BrokerUnavailable(
                f"broker at {http_addr} has nothing from offset {offset} of {topic}-{partition}"
            )
        yield body, next_offset
        offset = next_offset


def fetch_delayed_blocking(
    http_addr: str,
    topic: str,
    partition: int,
    position: tuple[int, int],
    timeout_s: float,
    secret: bytes | None = None,
    cluster_id: str = "",
    tls: ssl.SSLContext | None = None,
) -> Iterator[bytes]:
    """A broker's delay store of a partition as it was at `position`, streamed
    (dmq/partition/delay.py, `export`). Blocking, on the tick thread inside a snapshot's
    restore; the caller checks the stream's end frame and count."""
    url = (
        f"{scheme_of(tls)}://{http_addr}/v1/internal/delay/{topic}/{partition}/pending"
        f"?index={position[0]}&k={position[1]}"
    )
    with (
        _blocking_errors(http_addr),
        _open_internal(url, secret, cluster_id, timeout_s, tls) as resp,
    ):
        while chunk := resp.read(DELAYED_READ_BYTES):
            yield chunk


def _open_internal(
    url: str, secret: bytes | None, cluster_id: str, timeout_s: float, tls: ssl.SSLContext | None
) -> Any:
    """A signed GET of an internal route, blocking (urllib); https checked by `tls`."""
    headers = {FORWARDED_HEADER: "1", **compat.CALL_HEADERS}
    headers.update(signed_headers(secret, "GET", target_of(url)))
    if cluster_id:
        headers[CLUSTER_ID_HEADER] = cluster_id
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - http(s):// only
    # The URL is http(s):// + a broker's address from the catalogue, never a file: one.
    return urllib.request.urlopen(request, timeout=timeout_s, context=tls)  # noqa: S310


@contextlib.contextmanager
def _blocking_errors(http_addr: str) -> Iterator[None]:
    """urllib's errors of a blocking internal call as dmq errors."""
    try:
        yield
    except urllib.error.HTTPError as exc:
        raise error_from(exc.code, exc.read()) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise errors.BrokerUnavailable(f"broker at {http_addr}: {exc!r}") from exc

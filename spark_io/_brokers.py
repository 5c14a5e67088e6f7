"""Several broker URLs, one after the other: metadata through dmq.client, fetches over
one kept-alive HTTP connection.

Any dmq broker answers any request (it relays fetches to the partition leader), so
failover is trying the next URL: a request that fails with a retriable error
(unreachable, 503, 504, 429) moves to the next URL, round the list, up to
`FAILOVER_ROUNDS_MAX` times round it, waiting `FAILOVER_BACKOFF_MS` between rounds.

Fetches do not go through `dmq.client.Consumer`: it turns each record into a Python
object, and the Spark hot path builds Arrow columns from the raw bytes instead
(spark_io/_arrow.py). They use http.client, which is blocking like a Spark task and
keeps one connection per task.

https URLs are checked against the CA of the `ca` option (else DMQ_CA, else the
system's), and the `cert`/`key` options' (else DMQ_CERT/DMQ_KEY) client certificate is
presented when a broker asks for one: metadata, fetches, the sink's producers and its
transactions all read them (dmq/client/_tls.py). The files are paths on every machine
that runs a task, as Kafka's `kafka.ssl.truststore.location`.

Brokers with `--auth on` want a token: the `token` option (else DMQ_TOKEN).

`use_credentials` exports these options (`Credentials`) to DMQ_TOKEN, DMQ_CA, DMQ_CERT
and DMQ_KEY in the process that reads the options (the driver, and each executor task
before it talks to a broker), so the clients spark_io builds use them and the fetches
here carry the token as `Authorization: Bearer`; an option not given falls back to the
variable as the process started with (a reused Python worker forgets an earlier query's).
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from dmq.client import Admin
from dmq.client._http import ENV_TOKEN
from dmq.client._tls import ENV_CA, ENV_CERT, ENV_KEY, tls_from_env
from dmq.errors import BrokerUnavailable, DmqError, RetriableError, error_for_code

T = TypeVar("T")

BATCHES = "application/vnd.dmq.batches"
FAILOVER_ROUNDS_MAX = 3  # times round the URL list before a retriable error is raised
FAILOVER_BACKOFF_MS = 200  # pause between two rounds
REQUEST_TIMEOUT_S = 30.0  # one fetch or metadata request
ADMIN_RETRIES = 2  # the client's own retries on one URL, before the next URL is tried


# The variables as the process started with: what a read or write without the options uses,
# also in a Python worker that an earlier query with other options ran in.
_AT_START = {name: os.environ.get(name) for name in (ENV_TOKEN, ENV_CA, ENV_CERT, ENV_KEY)}


@dataclass(frozen=True, slots=True)
class Credentials:
    """The `token`, `ca`, `cert` and `key` options (module docstring); None: not given."""

    token: str | None = field(default=None, repr=False)  # --auth on: NAME:PASSWORD
    ca: str | None = None  # PEM file of the CA that signs the brokers' certificates
    cert: str | None = None  # PEM client certificate (tls_client_auth on the brokers)
    key: str | None = None  # its private key (else read from the cert file)

    @classmethod
    def from_options(cls, lowered: Mapping[str, str]) -> Credentials:
        """From options whose names are lower-cased already; refused (ValueError) when a
        file option names no readable file, here on the driver rather than in a task."""
        given = {name: lowered.get(name) or None for name in ("token", "ca", "cert", "key")}
        for name in ("ca", "cert", "key"):
            path = given[name]
            if path is not None and not os.access(path, os.R_OK):
                raise ValueError(f"option {name}: {path!r} is not a readable file")
        if given["key"] is not None and given["cert"] is None:
            raise ValueError("option key needs option cert (the certificate it belongs to)")
        return cls(**given)


def use_credentials(credentials: Credentials) -> None:
    """Export the options for every client this process builds (module docstring)."""
    for name, value in (
        (ENV_TOKEN, credentials.token),
        (ENV_CA, credentials.ca),
        (ENV_CERT, credentials.cert),
        (ENV_KEY, credentials.key),
    ):
        value = value or _AT_START[name]
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)


def parse_urls(value: str) -> tuple[str, ...]:
    """`url` or `urls` option: comma-separated http(s) base URLs, at least one."""
    urls = tuple(u.strip().rstrip("/") for u in value.split(",") if u.strip())
    if not urls:
        raise ValueError("option url: give at least one broker URL (http://host:port)")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"option url: {url!r} must start with http:// or https://")
    return urls


@dataclass(frozen=True, slots=True)
class Fetched:
    body: bytes
    next_offset: int | None  # X-Dmq-Next-Offset
    high_watermark: int | None
    log_start_offset: int | None
    # read_committed: (producer_id, first_offset, marker_offset) of the aborted
    # transactions the answer overlaps (X-Dmq-Aborted-Transactions)
    aborted: tuple[tuple[int, int, int], ...] = ()


class Brokers:
    """The broker URLs of one source or sink. Not thread-safe; close() when done."""

    def __init__(self, urls: tuple[str, ...]) -> None:
        self.urls = urls
        self._current = 0
        self._admins: dict[str, Admin] = {}
        self._connection: http.client.HTTPConnection | None = None

    def __enter__(self) -> Brokers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for admin in self._admins.values():
            admin.close()
        self._admins.clear()
        self._drop_connection()

    @property
    def url(self) -> str:
        """The URL in use now (the last one that answered)."""
        return self.urls[self._current]

    def with_failover(self, action: Callable[[str], T]) -> T:
        """action(url) on the current URL, moving on to the next on a retriable error."""
        last: RetriableError | None = None
        for attempt in range(FAILOVER_ROUNDS_MAX * len(self.urls)):
            if attempt and attempt % len(self.urls) == 0:
                time.sleep(FAILOVER_BACKOFF_MS / 1000)
            try:
                return action(self.url)
            except RetriableError as error:
                last = error
                self._current = (self._current + 1) % len(self.urls)
                self._drop_connection()
        assert last is not None
        raise last

    def admin(self, action: Callable[[Admin], T]) -> T:
        """action(admin) with a dmq.client Admin of the current URL, with failover."""

        def call(url: str) -> T:
            admin = self._admins.get(url)
            if admin is None:
                admin = self._admins[url] = Admin(url, retries=ADMIN_RETRIES)
            return action(admin)

        return self.with_failover(call)

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        record_filter: tuple[tuple[str, str], ...] = (),
        isolation: str = "read_uncommitted",
    ) -> Fetched:
        """GET .../records?format=binary from `offset`, without waiting for new records;
        with `record_filter` (tags=, filter=) only the records the broker keeps."""
        query = urllib.parse.urlencode(
            [("offset", offset), ("max_bytes", max_bytes), ("wait_ms", 0), ("format", "binary"),
             ("isolation", isolation), *record_filter]
        )  # fmt: skip
        path = (
            f"/v1/topics/{urllib.parse.quote(topic, safe='')}/partitions/{partition}/records"
            f"?{query}"
        )
        return self.with_failover(lambda url: self._get(url, path))

    def _get(self, url: str, path: str) -> Fetched:
        try:
            connection = self._connect(url)
            headers = {"Accept": BATCHES}
            token = os.environ.get(ENV_TOKEN)
            if token:
                headers["Authorization"] = f"Bearer {token}"
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self._drop_connection()
            raise BrokerUnavailable(f"GET {path}: cannot reach the broker at {url}: {exc}") from exc
        if response.status != 200:
            raise _error(response.status, body)

        def number(name: str) -> int | None:
            value = response.getheader(name)
            return None if value is None else int(value)

        aborted = response.getheader("X-Dmq-Aborted-Transactions")
        return Fetched(
            body,
            number("X-Dmq-Next-Offset"),
            number("X-Dmq-High-Watermark"),
            number("X-Dmq-Log-Start-Offset"),
            ()
            if aborted is None
            else tuple((int(p), int(f), int(m)) for p, f, m in json.loads(aborted)),
        )

    def _connect(self, url: str) -> http.client.HTTPConnection:
        if self._connection is None:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme == "https":
                # The CA and client certificate of DMQ_CA/DMQ_CERT/DMQ_KEY, as dmq.client's.
                self._connection = http.client.HTTPSConnection(
                    parts.netloc, timeout=REQUEST_TIMEOUT_S, context=tls_from_env()
                )
            else:
                self._connection = http.client.HTTPConnection(
                    parts.netloc, timeout=REQUEST_TIMEOUT_S
                )
        return self._connection

    def _drop_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _error(status: int, body: bytes) -> DmqError:
    """The dmq.errors class of a broker's error answer ({"error": {"code", ...}})."""
    try:
        error = json.loads(body)["error"]
        return error_for_code(
            str(error["code"]), str(error.get("message", "")), error.get("details")
        )
    except (ValueError, KeyError, TypeError):
        if status in (429, 502, 503, 504):
            return BrokerUnavailable(f"the broker answered HTTP {status}")
        return DmqError(f"the broker answered HTTP {status}: {body[:200]!r}")

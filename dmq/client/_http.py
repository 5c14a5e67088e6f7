"""The client's one HTTP path: a keep-alive connection pool (dmq/client/_conn.py), error
mapping and retries.

Every request of `AsyncProducer`, `AsyncConsumer` and `AsyncAdmin` (and so of their sync
twins) goes through `Transport.request`, which:

1. sends the request with a total timeout of request_timeout_ms (plus the long-poll wait);
2. answers a 2xx response as is;
3. turns any other response into the `dmq.errors` class its `{"error": {"code", ...}}`
   body names (`error_for_code`), or, when the body is not in that shape (a proxy, an
   unknown route), into the class its status implies;
4. turns connection failures into `BrokerUnavailable` and timeouts into `RequestTimeout`,
   so no socket, TLS or asyncio exception reaches the user; a TLS failure (the broker's
   certificate does not verify against the CA, or the broker refused ours) is a
   `ClientError` naming the CA options, never retried (dmq/client/_tls.py);
5. retries a `RetriableError` until the call's `Deadline` (a producer's record:
   delivery_timeout_ms from `send`; any other call: default_api_timeout_ms from its
   start), waiting as the broker asked (`details.retry_after_ms`, else `Retry-After`) or
   with exponential backoff, and never retries a `ClientError` or a `StorageError`. Each
   attempt waits at most request_timeout_ms, cut to what is left before the deadline; a
   retry whose wait would end past the deadline is not made: the last error is raised,
   its message naming the deadline's setting. `retries`, when not None, also caps the
   count (the last error is then raised as it is).

A retried produce whose first attempt did reach the broker (a timeout, a lost answer) may
be appended twice (at-least-once), unless the producer is idempotent: its retry carries
the same producer id, epoch and sequence, and the partition writes it once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from dmq.client import _limits
from dmq.client._conn import ConnectionLost, Pool, ProtocolError
from dmq.client._tls import tls_from_env
from dmq.errors import (
    BrokerUnavailable,
    ClientError,
    DmqError,
    InvalidRequest,
    RequestTimeout,
    RetriableError,
    error_for_code,
)

_log = logging.getLogger("dmq.client")

# The token clients send when none is given (brokers with --auth on).
ENV_TOKEN = "DMQ_TOKEN"  # noqa: S105 - the name of a variable, not a secret
_CLIENT_CERT_HINT = " give cert_file/key_file, --cert/--key or DMQ_CERT/DMQ_KEY"
USER_AGENT = "dmq-python-client/0.1"
JSON = "application/json"
BATCH = "application/vnd.dmq.batch"  # one RecordBatch, produced
BATCHES = "application/vnd.dmq.batches"  # whole stored batches, fetched

# The code a status implies when the body does not name one (README "Errors" table).
_CODE_FOR_STATUS: dict[int, str] = {
    400: "invalid_request",
    404: "not_found",
    406: "not_acceptable",
    409: "topic_already_exists",
    413: "record_too_large",
    415: "unsupported_media_type",
    416: "offset_out_of_range",
    429: "backpressure",
    500: "internal_error",
    502: "broker_unavailable",
    503: "broker_unavailable",
    504: "request_timeout",
}


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: Mapping[str, str]  # case-insensitive (dmq/client/_conn.py, Headers)
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise DmqError(
                f"the broker answered {self.status} with a body that is not JSON"
            ) from exc

    def header_int(self, name: str) -> int | None:
        raw = header(self.headers, name)
        try:
            return None if raw is None else int(raw)
        except ValueError:
            return None


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A header by name, case-insensitively, whatever mapping holds the headers."""
    value = headers.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lowered), None)


def error_from_response(status: int, headers: Mapping[str, str], body: bytes) -> DmqError:
    """The `dmq.errors` instance an error response stands for.

    A retriable error the broker attached a delay to keeps it in
    `details["retry_after_ms"]`: the body's own value if it has one (milliseconds), else
    the Retry-After header (seconds, RFC 9110).
    """
    code, message, details = _parse_error_body(body)
    if code is None or type(error_for_code(code, "")).code != code:
        # Not our shape, or a code this client does not know (a newer broker): the
        # status decides the class; the broker's code stays visible in the message.
        fallback = _CODE_FOR_STATUS.get(status)
        if fallback is None:
            fallback = "invalid_request" if 400 <= status < 500 else "internal_error"
        if code is not None:
            message = f"{code}: {message}"
        code = fallback
    if not message:
        message = f"the broker answered HTTP {status}"
    error = error_for_code(code, message, details)
    if isinstance(error, RetriableError):
        retry_after_ms = _retry_after_ms(headers, details)
        if retry_after_ms is not None:
            error.details["retry_after_ms"] = retry_after_ms
            error.retry_after_ms = retry_after_ms
    return error


def _parse_error_body(body: bytes) -> tuple[str | None, str, dict[str, Any]]:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None, body[:200].decode("utf-8", "replace").strip(), {}
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("code"), str):
        return None, "", {}
    details = error.get("details")
    return (
        error["code"],
        str(error.get("message") or ""),
        dict(details) if isinstance(details, dict) else {},
    )


def _retry_after_ms(headers: Mapping[str, str], details: Mapping[str, Any]) -> int | None:
    from_body = details.get("retry_after_ms")
    if isinstance(from_body, int | float) and not isinstance(from_body, bool) and from_body >= 0:
        return min(int(from_body), _limits.RETRY_AFTER_MS_MAX)
    raw = header(headers, "Retry-After")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        return None  # an HTTP date: not something a broker sends; fall back to backoff
    return min(max(0, int(seconds * 1000)), _limits.RETRY_AFTER_MS_MAX)


def backoff_ms(attempt: int, retry_backoff_ms: int, error: DmqError) -> int:
    """How long to wait before retry number `attempt + 1` (attempt counts from 0)."""
    asked = error.details.get("retry_after_ms")
    if isinstance(asked, int):
        return asked
    base = min(retry_backoff_ms * 2**attempt, _limits.RETRY_BACKOFF_MS_MAX)
    jitter = 1 + random.uniform(-_limits.RETRY_JITTER_FRACTION, _limits.RETRY_JITTER_FRACTION)  # noqa: S311 - retry jitter, not a secret
    return int(base * jitter)


@dataclass(frozen=True, slots=True)
class Deadline:
    """When a call stops retrying: `at_s` on the running loop's clock. `setting` and
    `timeout_ms` name the limit that set it, for the error raised when it passes."""

    at_s: float
    setting: str
    timeout_ms: int

    @classmethod
    def after(cls, timeout_ms: int, setting: str, now_s: float | None = None) -> Deadline:
        """`timeout_ms` from now (`now_s`, if the caller read the loop's clock already)."""
        if now_s is None:
            now_s = asyncio.get_running_loop().time()
        return cls(now_s + timeout_ms / 1000, setting, timeout_ms)

    def remaining_ms(self) -> float:
        return (self.at_s - asyncio.get_running_loop().time()) * 1000

    def expired(self, what: str) -> RequestTimeout:
        """The error of a call whose deadline passed before it could be sent."""
        return RequestTimeout(
            f"{what}: {self.setting} ({self.timeout_ms} ms) passed before it could be sent",
            **{self.setting: self.timeout_ms},
        )

    def gave_up(self, error: RetriableError, attempts: int) -> RetriableError:
        """`error`, the last of `attempts`, its message saying the deadline ended them."""
        error.message = (
            f"{error.message} (gave up after {attempts} attempt{'s' * (attempts > 1)}: "
            f"{self.setting} {self.timeout_ms} ms)"
        )
        error.args = (error.message,)
        error.details[self.setting] = self.timeout_ms
        return error


def topic_path(topic: str) -> str:
    return "/v1/topics/" + quote(topic, safe="")


def group_path(group: str) -> str:
    return "/v1/groups/" + quote(group, safe="")


def check_timeouts(**values: int | None) -> None:
    """Each of request_timeout_ms, default_api_timeout_ms, delivery_timeout_ms given must
    be >= 1, retries and retry_backoff_ms >= 0 (retries may be None: no cap)."""
    for name, value in values.items():
        least = 0 if name in ("retries", "retry_backoff_ms") else 1
        if value is None and name == "retries":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")


def check_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url must start with http:// or https://, got {url!r}")
    return url.rstrip("/")


class Transport:
    """Keep-alive connections to one broker URL (a `Pool`, created on first use in the
    running loop).

    Not thread-safe: it belongs to the event loop of its first request.
    """

    def __init__(
        self,
        url: str,
        *,
        request_timeout_ms: int,
        retries: int | None = _limits.RETRIES_DEFAULT,
        retry_backoff_ms: int = _limits.RETRY_BACKOFF_MS_DEFAULT,
        api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT,
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        check_timeouts(
            request_timeout_ms=request_timeout_ms,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
            default_api_timeout_ms=api_timeout_ms,
        )
        self.url = check_url(url)
        self._request_timeout_ms = request_timeout_ms
        self._retries = retries
        self._api_timeout_ms = api_timeout_ms
        self._retry_backoff_ms = retry_backoff_ms
        self._pool: Pool | None = None
        self._prefix = ""  # the URL's path, before each request's
        self._unreachable_told = False  # _tell_unreachable said it since the last answer
        self._closed = False
        # dmq/client/_tls.py: the caller's context, else DMQ_CA/DMQ_CERT/DMQ_KEY, else
        # the default context (https checked against the system's CAs).
        self._tls = tls if tls is not None else tls_from_env()
        # A broker with --auth on (dmq/README.md, "Security"): the caller's token
        # ("name:password", or the superuser's), else DMQ_TOKEN; sent as a bearer token.
        token = token if token is not None else os.environ.get(ENV_TOKEN) or None
        if token is not None and (not token.isprintable() or not token.isascii()):
            raise ValueError("token must be printable ASCII (it is sent in a header)")
        self._authorization = None if token is None else f"Bearer {token}"

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
        body: bytes | None = None,
        content_type: str | None = None,
        accept: str = JSON,
        wait_ms: int = 0,
        deadline: Deadline | None = None,
    ) -> Response:
        """Send with retries until `deadline` (default_api_timeout_ms from now when None;
        module docstring, step 5); raise a `DmqError` unless 2xx."""
        if deadline is None:
            deadline = Deadline.after(self._api_timeout_ms, "default_api_timeout_ms")
        if json_body is not None:
            body = json.dumps(json_body).encode()
            content_type = JSON
        attempt = 0
        last: RetriableError | None = None  # the error of the attempt before
        while True:
            left_ms = deadline.remaining_ms()
            if left_ms <= 0:
                if last is None:
                    raise deadline.expired(f"{method} {path}")
                raise deadline.gave_up(last, attempt) from last.__cause__
            timeout_ms = min(self._request_timeout_ms, math.ceil(left_ms)) + wait_ms
            try:
                response = await self._once(
                    method, path, params, body, content_type, accept, timeout_ms
                )
                self._unreachable_told = False
                return response
            except RetriableError as error:
                if self._retries is not None and attempt >= self._retries:
                    raise
                self._tell_unreachable(error, deadline)
                delay_ms = backoff_ms(attempt, self._retry_backoff_ms, error)
                attempt += 1
                if delay_ms >= deadline.remaining_ms():
                    raise deadline.gave_up(error, attempt) from error.__cause__
                last = error
                await asyncio.sleep(delay_ms / 1000)

    async def _once(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: bytes | None,
        content_type: str | None,
        accept: str,
        timeout_ms: int,
    ) -> Response:
        headers = {"Accept": accept, "User-Agent": USER_AGENT}
        if self._authorization is not None:
            headers["Authorization"] = self._authorization
        if content_type is not None:
            headers["Content-Type"] = content_type
        target = self._prefix + path
        if params:
            target += "?" + urlencode(params, quote_via=quote)
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                pool = self._get_pool()
                status, answer_headers, payload = await pool.request(method, target, headers, body)
        except TimeoutError as exc:
            raise RequestTimeout(f"{method} {path}: no answer within {timeout_ms} ms") from exc
        except ssl.SSLError as exc:
            # A certificate that does not verify, or the broker refused ours. Not retried:
            # another try meets the same certificate.
            if "certificate required" in str(exc).lower().replace("_", " "):
                raise ClientError(
                    f"{method} {path}: the broker at {self.url} requires a client "
                    f"certificate: {exc}{_CLIENT_CERT_HINT}"
                ) from exc
            raise ClientError(
                f"{method} {path}: TLS with {self.url} failed: {exc}; give the CA that signs "
                f"the brokers' certificates (tls=tls_context(ca_file=...), --ca or DMQ_CA)"
            ) from exc
        except (ConnectionLost, ProtocolError, OSError) as exc:
            hint = ""
            if not isinstance(exc, ProtocolError) and self.url.startswith("https"):
                # TLS 1.3: a broker with tls_client_auth = required checks the client's
                # certificate after the handshake and closes the connection (the client
                # sees it closed, reset, or the alert above, by timing).
                hint = " (a broker that requires a client certificate closes the connection " + (
                    f"of a client without one:{_CLIENT_CERT_HINT})"
                )
            raise BrokerUnavailable(
                f"{method} {path}: cannot reach the broker at {self.url}: "
                f"{exc or type(exc).__name__}{hint}"
            ) from exc
        if 200 <= status < 300:
            return Response(status, answer_headers, payload)
        raise error_from_response(status, answer_headers, payload)

    def _tell_unreachable(self, error: RetriableError, deadline: Deadline) -> None:
        """Say once (a warning on the `dmq.client` logger; the `dmq` command prints it on
        stderr) that the broker cannot be reached and for how long it will be retried, so
        that a call against a dead broker does not wait out its deadline in silence; said
        again only after a request has gone through."""
        cause = error.__cause__
        unreachable = isinstance(cause, (OSError, ConnectionLost)) and not isinstance(
            cause, TimeoutError
        )  # a slow broker was reached: its timeouts are not said here
        if self._unreachable_told or not unreachable:
            return
        self._unreachable_told = True
        _log.warning(
            "%s; retrying until %s (%d ms) passes",
            error.message,
            deadline.setting,
            deadline.timeout_ms,
        )

    def _get_pool(self) -> Pool:
        if self._closed:
            raise RuntimeError("this client is closed")
        if self._pool is None:
            try:
                parts = urlsplit(self.url)
                port, host = parts.port, parts.hostname
                if host and not host.isascii():
                    host = host.encode("idna").decode("ascii")  # as it goes in Host:
            except (ValueError, UnicodeError) as exc:
                raise InvalidRequest(f"invalid URL {self.url}: {exc}", field="url") from exc
            if not host:
                raise InvalidRequest(f"invalid URL {self.url}: no host", field="url")
            https = parts.scheme == "https"
            tls = (self._tls or ssl.create_default_context()) if https else None
            self._pool = Pool(host, port or (443 if https else 80), tls)
            # Callers' paths come quoted (topic_path); the URL's own path is quoted here.
            self._prefix = quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=-._~")
        return self._pool

    async def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()
            if self.url.startswith("https://"):
                await asyncio.sleep(_limits.TLS_CLOSE_GRACE_MS / 1000)

"""The client's HTTP/1.1 connections to one broker: a keep-alive pool on asyncio streams'
lower layer (a Protocol per connection), without aiohttp's client.

aiohttp's client cost ~150-200 us of CPU per request on the 2-core test machine (a
request object, a URL object, header multidicts, a timer, a response object and a task
per request), as much as the partition leader's whole HTTP handling of a one-record
produce: under one-at-a-time produce the client was a fifth of all CPU spent (#22). The
brokers speak one HTTP (aiohttp's server), so the client needs only this much of it:

- a request is one write: the request line, `Host`, the caller's headers,
  `Content-Length`, the body (HTTP/1.1, no pipelining: one request per connection at a
  time);
- an answer is a status line, headers, and a body framed by `Content-Length`, by
  `Transfer-Encoding: chunked`, or by the end of the connection (no length); `HEAD`,
  1xx, 204 and 304 answers have none. A connection is kept for the next request unless
  the answer or the HTTP version says close, or its body ran to the close;
- idle connections leave the pool when the broker closes them (its keep-alive
  timeout), so a request is not sent on one already known dead; one that dies under a
  request fails it with `ConnectionLost` (a retriable error to `Transport`), as aiohttp's
  ServerDisconnectedError did: the request may have been processed, so it is not
  re-sent here.

Limits: an answer's status line and headers at most ANSWER_HEAD_BYTES_MAX, its body at
most ANSWER_BODY_BYTES_MAX (the broker's answers are bounded far below: a fetch answer is
at most 8 MiB), at most CONNECTIONS_MAX connections per broker at once (aiohttp's default;
a request waits for one past that). Anything else the broker sends (a malformed status
line or chunk, a body past its length) closes the connection with `ProtocolError`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from typing import Any

from dmq.client import _limits

ANSWER_HEAD_BYTES_MAX = 64 * _limits.KiB
# A body up to this size goes out in the request's one write (a copy costs less than a
# second system call); a larger one in its own write.
JOIN_BODY_BYTES_MAX = 64 * _limits.KiB
ANSWER_BODY_BYTES_MAX = 256 * _limits.MiB
CONNECTIONS_MAX = 100


class ConnectionLost(Exception):
    """The connection failed or closed before the whole answer arrived."""


class ProtocolError(Exception):
    """The broker's bytes are not the HTTP/1.1 answer this client reads."""


class Headers(dict[str, str]):
    """An answer's headers, looked up case-insensitively (keys are stored in lower case;
    a header sent twice keeps its values joined with ", ", as RFC 9110 allows)."""

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())

    def get(self, name: str, default: Any = None) -> Any:
        return dict.get(self, name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())


class _Answer:
    __slots__ = ("status", "headers", "body", "keep_alive")

    def __init__(self, status: int, headers: Headers, body: bytes, keep_alive: bool) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive


class _Connection(asyncio.Protocol):
    """One connection: writes a request, parses its answer as bytes arrive."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer = bytearray()
        self._waiter: asyncio.Future[_Answer] | None = None
        self._head: tuple[int, Headers, bool] | None = None  # status, headers, keep-alive
        self._length: int | None = None  # body bytes expected; None: chunked or to close
        self._chunked = False
        self._body = bytearray()
        self._no_body = False

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes while idle: nothing may come unasked
            self._fail(ProtocolError("the broker sent bytes no request asked for"))
            return
        self._buffer += data
        try:
            self._parse()
        except ProtocolError as error:
            self._fail(error)

    def eof_received(self) -> bool:
        framed_by_close = self._head is not None and self._length is None and not self._chunked
        if self._waiter is not None and framed_by_close:
            self._finish(keep_alive=False)  # the body is whole now
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        if self._waiter is not None and not self._waiter.done():
            reason = f": {exc}" if exc else ""
            self._waiter.set_exception(ConnectionLost(f"the connection closed{reason}"))
        self._waiter = None

    # -- a request

    def send(self, head: bytes, body: bytes | None, *, no_body: bool) -> asyncio.Future[_Answer]:
        assert self.transport is not None and self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self._head, self._length, self._chunked, self._no_body = None, None, False, no_body
        self._body = bytearray()
        if body and len(body) > JOIN_BODY_BYTES_MAX:
            self.transport.write(head)  # two writes: no copy of a large body
            self.transport.write(body)
        else:
            self.transport.write(head + body if body else head)
        return self._waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)
        self._waiter = None
        self.close()

    def _finish(self, *, keep_alive: bool) -> None:
        waiter, head = self._waiter, self._head
        assert waiter is not None and head is not None
        self._waiter = None
        status, headers, answer_keep_alive = head
        keep = keep_alive and answer_keep_alive and not self._buffer
        if not waiter.done():
            waiter.set_result(_Answer(status, headers, bytes(self._body), keep))
        self._body = bytearray()
        if not keep:
            self.close()

    # -- parsing

    def _parse(self) -> None:
        while self._head is None:  # more than one head: interim (1xx) answers first
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > ANSWER_HEAD_BYTES_MAX:
                    raise ProtocolError(f"an answer's head is over {ANSWER_HEAD_BYTES_MAX} bytes")
                return
            raw = bytes(self._buffer[:end])
            del self._buffer[: end + 4]
            self._read_head(raw)
        if self._chunked:
            self._read_chunks()
        elif self._length is None:
            self._take_body(len(self._buffer))  # to the close
        else:
            take = min(len(self._buffer), self._length - len(self._body))
            self._take_body(take)
            if len(self._body) == self._length:
                self._finish(keep_alive=True)

    def _take_body(self, count: int) -> None:
        if len(self._body) + count > ANSWER_BODY_BYTES_MAX:
            raise ProtocolError(f"an answer's body is over {ANSWER_BODY_BYTES_MAX} bytes")
        self._body += self._buffer[:count]
        del self._buffer[:count]

    def _read_head(self, raw: bytes) -> None:
        lines = raw.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
        status = int(parts[1])
        headers = Headers()
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip():
                raise ProtocolError(f"a malformed header line: {line[:100]!r}")
            key = name.decode("latin-1").lower()
            text = value.strip().decode("latin-1")
            headers[key] = f"{dict.__getitem__(headers, key)}, {text}" if key in headers else text
        connection = headers.get("connection", "").lower()
        keep_alive = (
            parts[0] == b"HTTP/1.1" and "close" not in connection
        ) or "keep-alive" in connection
        if 100 <= status < 200:  # an interim answer (never sent by the broker): the final follows
            return
        self._head = (status, headers, keep_alive)
        if self._no_body or status in (204, 304):
            self._length = 0
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._chunked = True
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise ProtocolError(f"a malformed Content-Length: {length[:40]!r}")
            self._length = int(length)
            if self._length > ANSWER_BODY_BYTES_MAX:
                raise ProtocolError(f"an answer's body is over {ANSWER_BODY_BYTES_MAX} bytes")

    def _read_chunks(self) -> None:
        while self._waiter is not None:
            end = self._buffer.find(b"\r\n")
            if end < 0:
                if len(self._buffer) > 1024:
                    raise ProtocolError("a chunk size line is over 1024 bytes")
                return
            size_text = bytes(self._buffer[:end]).split(b";", 1)[0].strip()
            if not size_text or size_text.strip(b"0123456789abcdefABCDEF"):
                raise ProtocolError(f"a malformed chunk size: {size_text[:40]!r}")
            size = int(size_text, 16)
            if len(self._body) + size > ANSWER_BODY_BYTES_MAX:
                raise ProtocolError(f"an answer's body is over {ANSWER_BODY_BYTES_MAX} bytes")
            if size == 0:
                # The last chunk, then trailer lines (none from the broker), then CRLF.
                if self._buffer[end + 2 : end + 4] == b"\r\n":
                    done = end + 4
                else:
                    trailers_end = self._buffer.find(b"\r\n\r\n", end + 2)
                    if trailers_end < 0:
                        if len(self._buffer) > ANSWER_HEAD_BYTES_MAX:
                            raise ProtocolError("an answer's trailers are too long")
                        return
                    done = trailers_end + 4
                del self._buffer[:done]
                self._finish(keep_alive=True)
                return
            if len(self._buffer) < end + 2 + size + 2:
                return  # the whole chunk is not here yet
            start = end + 2
            if self._buffer[start + size : start + size + 2] != b"\r\n":
                raise ProtocolError("a chunk does not end with CRLF")
            del self._buffer[:start]
            self._take_body(size)
            del self._buffer[:2]


class Pool:
    """Keep-alive connections to one broker (host, port, TLS or not), for one event loop."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        self._host = host
        self._port = port
        self._tls = tls
        shown = f"[{host}]" if ":" in host else host  # an IPv6 address, in brackets
        self._host_header = f"Host: {shown}:{port}\r\n".encode("latin-1")
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._slots = asyncio.Semaphore(CONNECTIONS_MAX)

    def forget(self, connection: _Connection) -> None:
        """A connection closed (by either side): it is not used again."""
        self._open.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)

    async def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
    ) -> tuple[int, Headers, bytes]:
        """Send one request and return its answer (status, headers, body). Raises
        ConnectionLost, ProtocolError, ssl.SSLError or OSError; the caller bounds the
        time (a cancelled request closes its connection)."""
        head = [f"{method} {target} HTTP/1.1\r\n".encode("latin-1"), self._host_header]
        head += [f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head.append(b"Content-Length: %d\r\n" % (0 if body is None else len(body)))
        head.append(b"\r\n")
        async with self._slots:
            connection = await self._connection()
            try:
                answer = await connection.send(b"".join(head), body, no_body=method == "HEAD")
            except BaseException:
                connection.close()
                raise
        if answer.keep_alive and not connection.closed:
            self._idle.append(connection)
        return answer.status, answer.headers, answer.body

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(
            lambda: _Connection(self),
            self._host,
            self._port,
            ssl=self._tls,
            server_hostname=self._host if self._tls is not None else None,
        )
        self._open.add(connection)
        return connection

    def close(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()

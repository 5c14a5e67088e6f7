"""Proves the client's HTTP/1.1 connections (dmq/client/_conn.py):

- the answer parser, as a property: any status, headers and body, framed by
  Content-Length, by chunks of any sizes or by the close, and delivered in any splits,
  comes back exactly; a connection is kept only when the answer allows it;
- malformed answers (a bad status line, a bad chunk or chunk size, a chunk over the body
  limit, bytes past the answer, a head over its limit) fail the request with ProtocolError
  and close the connection; an interim 1xx answer is skipped for the final one;
- against a real aiohttp server on loopback: a keep-alive connection is reused; one the
  server closed while idle leaves the pool, and the next request opens another without
  an error; a server that dies under a request fails it with ConnectionLost, which
  `Transport` turns into the retriable BrokerUnavailable.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.client import _conn
from dmq.client._conn import ConnectionLost, Pool, ProtocolError
from dmq.client._http import Transport
from dmq.errors import BrokerUnavailable

TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12)


class FakeTransport:
    """What _Connection writes to, and whether it closed it."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


class FakePool:
    def forget(self, connection: Any) -> None:
        pass


def connection() -> tuple[Any, FakeTransport]:
    conn = _conn._Connection(FakePool())  # type: ignore[arg-type]
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def answer_bytes(
    status: int, headers: list[tuple[str, str]], body: bytes, framing: str, chunks: list[int]
) -> bytes:
    head = [f"HTTP/1.1 {status} Whatever", *(f"{k}: {v}" for k, v in headers)]
    if framing == "length":
        head.append(f"Content-Length: {len(body)}")
        payload = body
    elif framing == "chunked":
        head.append("Transfer-Encoding: chunked")
        parts, at = [], 0
        for size in chunks:
            piece = body[at : at + size]
            if piece:
                parts.append(b"%x\r\n%s\r\n" % (len(piece), piece))
            at += size
        if at < len(body):
            parts.append(b"%x\r\n%s\r\n" % (len(body) - at, body[at:]))
        payload = b"".join(parts) + b"0\r\n\r\n"
    else:  # framed by the close
        head.append("Connection: close")
        payload = body
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


@settings(max_examples=300, deadline=None)
@given(
    status=st.sampled_from([200, 201, 400, 404, 409, 413, 429, 503]),
    headers=st.lists(st.tuples(TOKEN, TOKEN), max_size=5, unique_by=lambda kv: kv[0]),
    body=st.binary(max_size=3000),
    framing=st.sampled_from(["length", "chunked", "close"]),
    chunks=st.lists(st.integers(1, 700), max_size=8),
    splits=st.lists(st.integers(1, 400), max_size=30),
)
def test_any_answer_in_any_splits_parses_back_exactly(
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    framing: str,
    chunks: list[int],
    splits: list[int],
) -> None:
    headers = [(k, v) for k, v in headers if k not in ("connection", "content-length")]
    raw = answer_bytes(status, headers, body, framing, chunks)

    async def scenario() -> Any:
        conn, transport = connection()
        waiter = conn.send(b"GET / HTTP/1.1\r\n\r\n", None, no_body=False)
        at = 0
        for size in [*splits, len(raw)]:
            if at >= len(raw):
                break
            conn.data_received(raw[at : at + size])
            at += size
        if framing == "close":
            assert not waiter.done()  # no length: only the close ends it
            conn.eof_received()
        answer = await waiter
        return answer, transport

    answer, transport = asyncio.run(scenario())
    assert (answer.status, answer.body) == (status, body)
    for key, value in headers:
        assert answer.headers[key.upper()] == value
    assert answer.keep_alive == (framing != "close")
    assert transport.closed == (framing == "close")


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTX/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXX0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffff\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"y" * (_conn.ANSWER_HEAD_BYTES_MAX + 10),
    ],
)
def test_a_malformed_answer_fails_the_request_and_closes_the_connection(raw: bytes) -> None:
    async def scenario() -> tuple[BaseException | None, FakeTransport]:
        conn, transport = connection()
        waiter = conn.send(b"GET / HTTP/1.1\r\n\r\n", None, no_body=False)
        conn.data_received(raw)
        await asyncio.sleep(0)
        return (waiter.exception() if waiter.done() else None), transport

    error, transport = asyncio.run(scenario())
    assert isinstance(error, ProtocolError), error
    assert transport.closed


def test_an_interim_answer_is_skipped_for_the_final_one() -> None:
    async def scenario() -> Any:
        conn, _ = connection()
        waiter = conn.send(b"GET / HTTP/1.1\r\n\r\n", None, no_body=False)
        conn.data_received(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\n")
        conn.data_received(b"Content-Length: 2\r\n\r\nok")
        return await waiter

    answer = asyncio.run(scenario())
    assert (answer.status, answer.body, answer.keep_alive) == (201, b"ok", True)


def test_bytes_past_the_answer_close_the_connection() -> None:
    async def scenario() -> tuple[Any, FakeTransport]:
        conn, transport = connection()
        waiter = conn.send(b"GET / HTTP/1.1\r\n\r\n", None, no_body=False)
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
        return await waiter, transport

    answer, transport = asyncio.run(scenario())
    assert answer.body == b"ok" and not answer.keep_alive and transport.closed


def test_a_kept_connection_is_reused_and_one_closed_while_idle_is_replaced() -> None:
    async def scenario() -> None:
        peers: list[Any] = []

        async def echo(request: web.Request) -> web.Response:
            peers.append(
                request.transport.get_extra_info("peername") if request.transport else None
            )
            body = await request.read()
            return web.json_response({"n": len(body), "q": request.query.get("q")})

        app = web.Application()
        app.router.add_post("/echo", echo)
        runner = web.AppRunner(app, keepalive_timeout=0.3)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        pool = Pool("127.0.0.1", port, None)
        try:
            for k in range(3):
                status, headers, body = await pool.request(
                    "POST", "/echo?q=a%20b", {"Content-Type": "x/y"}, b"x" * (k * 100_000)
                )
                assert status == 200 and headers["CONTENT-TYPE"].startswith("application/json")
                assert body == b'{"n": %d, "q": "a b"}' % (k * 100_000)
            assert len(set(peers)) == 1, peers  # one connection, kept
            await asyncio.sleep(0.8)  # the server's keep-alive timeout closes it
            assert pool._idle == []
            status, _, _ = await pool.request("POST", "/echo", {}, b"")
            assert status == 200 and len(set(peers)) == 2
        finally:
            pool.close()
            await runner.cleanup()

    asyncio.run(scenario())


def test_a_server_that_dies_under_a_request_is_broker_unavailable() -> None:
    async def scenario() -> None:
        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")  # 3 of 10
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool("127.0.0.1", port, None)
        try:
            with pytest.raises(ConnectionLost):
                await pool.request("GET", "/", {}, None)
            transport = Transport(f"http://127.0.0.1:{port}", request_timeout_ms=2000, retries=0)
            with pytest.raises(BrokerUnavailable, match="cannot reach the broker"):
                await transport.request("GET", "/v1/topics")
            await transport.close()
        finally:
            pool.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())

"""Broker-to-broker calls say whether asking again is safe.

A forwarded append whose connection breaks after the request was sent may already be in
the partition's log: retrying it on another broker stored the batch twice (found by the
3 -> 5 -> 3 cluster test: one value at two consecutive offsets). These tests run a real
socket server that reads the request and then drops the connection, and one that is not
listening at all.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from bench.loopback import common_free_port
from dmq import errors
from dmq.peers import PeerClient


async def _drop_after_reading(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read(65536)  # the request arrived: the peer may have acted on it
    writer.transport.abort()  # then no answer, a reset connection


async def _append(client: PeerClient, addr: str) -> int | None:
    return await client.append(
        addr, "t", 1, 0, b"batch", acks="all", log_append_time_ms=None, timeout_s=5.0
    )


def test_an_append_cut_off_after_sending_has_an_unknown_outcome() -> None:
    async def main() -> None:
        server = await asyncio.start_server(_drop_after_reading, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = PeerClient()
        await client.start()
        try:
            with pytest.raises(errors.RequestTimeout, match="outcome is unknown"):
                await _append(client, f"127.0.0.1:{port}")
            # A read may be asked again elsewhere: the same failure is BrokerUnavailable.
            with pytest.raises(errors.BrokerUnavailable):
                await client.call("GET", f"127.0.0.1:{port}", "/v1/internal/status", timeout_s=5)
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_an_append_that_never_left_may_go_to_another_broker() -> None:
    port = common_free_port(["127.0.0.1"])
    with socket.socket() as probe:  # nothing listens there
        assert probe.connect_ex(("127.0.0.1", port)) != 0

    async def main() -> None:
        client = PeerClient()
        await client.start()
        try:
            with pytest.raises(errors.BrokerUnavailable, match="could not be reached"):
                await _append(client, f"127.0.0.1:{port}")
        finally:
            await client.close()

    asyncio.run(main())

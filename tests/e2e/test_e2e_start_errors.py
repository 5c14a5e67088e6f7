"""A broker that cannot take one of its addresses says which, on a real `dmq serve`.

Proves: with its HTTP or its Raft port held by another process, `dmq serve` exits 1 with
one line naming the listener (HTTP, Raft), the address, the flag that chose it and what
to do, instead of a bare `[Errno 98] Address already in use`.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tests_support import BrokerProcess


@contextmanager
def _held(port: int) -> Iterator[None]:
    """Another program listening on 127.0.0.1:port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield


@pytest.mark.parametrize(("listener", "flag"), [("HTTP", "--http-addr"), ("Raft", "--raft-addr")])
def test_a_taken_port_is_named_with_its_listener_and_what_to_do(
    broker_factory: Callable[..., BrokerProcess], listener: str, flag: str
) -> None:
    broker = broker_factory()
    port = broker.port if listener == "HTTP" else broker.raft_port
    with _held(port), pytest.raises(RuntimeError, match="exited with 1"):
        broker.start()
    line = next(line for line in broker.log().splitlines() if "cannot start" in line)
    assert (
        f"cannot start: [Errno 98] the {listener} listener cannot bind 127.0.0.1:{port} "
        f"({flag}): Address already in use; another process listens there (`ss -ltnp` "
        f"names it): stop it, or give this broker another port with {flag}"
    ) in line, line

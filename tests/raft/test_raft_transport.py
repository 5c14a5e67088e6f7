"""Proves the properties of raft/transport.py's Network that durability and the fault
harness rely on, with two Networks in this process on their own loopback addresses:

- a held frame (a reply or a vote) does not reach the peer, however long both sides poll,
  until the sender calls release(), the step RaftNode runs only after syncing its journals;
  an unheld frame (append_entries) goes at write_unheld(); both arrive in order, intact;
- the connection to a peer comes from the sender's own address (127.0.0.11, not .1), and
  the peer learns the sender's node id from the hello frame (raft/auth.py's handshake;
  tests/raft/test_raft_auth.py proves what it refuses);
- a peer that goes away is reported down, and up again once it is back;
- a peer the caller's rule refuses (raft/refusals.py) loses both directions of its link
  (reported down on both sides, nothing more delivered) and gets them back, reported up,
  once the rule lets it in again;
- a peer whose send buffer is full gets no more frames (send returns False) rather than
  an unbounded buffer;
- with TLS (raft/tls.py, contexts from dmq/tls.py, certificates from dmq/dev_certs.py),
  small and multi-MiB frames arrive intact and in order, the hello and the frames queued
  behind it included (decrypted bytes the selector cannot see are read without waiting
  for more); a peer whose certificate another CA signed, or that speaks plain TCP, is
  refused at the handshake and never reported up.
"""

from __future__ import annotations

import contextlib
import pickle
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from raft_harness import free_port_on

from dmq.config import BrokerConfig
from dmq.dev_certs import write_dev_certs
from dmq.tls import broker_tls
from raft.config import RaftConfig
from raft.tls import RaftTls
from raft.transport import HELLO_GROUP_ID, Network, encode_frame


class Pair:
    """Networks a (127.0.0.11) and b (127.0.0.12) polled by hand, recording what arrives."""

    def __init__(
        self, config: RaftConfig | None = None, tls: dict[str, RaftTls] | None = None
    ) -> None:
        self.tls = tls or {}
        port = free_port_on(["127.0.0.11", "127.0.0.12"])
        self.peers = {"a": f"127.0.0.11:{port}", "b": f"127.0.0.12:{port}"}
        self.received: dict[str, list[tuple[int, str, Any]]] = {"a": [], "b": []}
        self.events: list[tuple[str, str, str]] = []
        self.config = config or RaftConfig()
        self.a = self.make("a")
        self.b = self.make("b")
        self.b_closed = False

    def make(self, node_id: str) -> Network:
        network = Network(
            node_id,
            self.peers[node_id],
            self.peers,
            self.config,
            on_message=lambda group, peer, message: self.received[node_id].append(
                (group, peer, message)
            ),
            on_peer_up=lambda peer: self.events.append((node_id, "up", peer)),
            on_peer_down=lambda peer: self.events.append((node_id, "down", peer)),
            tls=self.tls.get(node_id),
        )
        network.open()
        return network

    def pump(self, until: Callable[[], bool] = lambda: False, seconds: float = 0.3) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for network in (self.a,) if self.b_closed else (self.a, self.b):
                network.maintain(time.monotonic())
                network.poll(0.005)
            if until():
                return True
        return until()

    def close(self) -> None:
        self.a.close()
        if not self.b_closed:
            self.b.close()


@pytest.fixture
def pair() -> Iterator[Pair]:
    networks = Pair()
    yield networks
    networks.close()


REPLY = {"type": "next_node_idx", "next_node_idx": 1, "reset": False, "success": True}
HEARTBEAT = {
    "type": "append_entries",
    "term": 2,
    "commit_index": 0,
    "prevLogIdx": 0,
    "prevLogTerm": 0,
    "entries": (),
}


def batch_entry(command: bytes, idx: int = 1, term: int = 2) -> tuple[bytes, int, int]:
    """A log entry as raft/node.py writes it: type byte REGULAR, pickled (id, ([cmd],))."""
    return b"\x00" + pickle.dumps((1, ([command],)), pickle.HIGHEST_PROTOCOL), idx, term


def test_held_frames_leave_only_at_release(pair: Pair) -> None:
    assert pair.pump(lambda: pair.a.is_up("b"), seconds=5)
    assert pair.a.send("b", 7, REPLY, hold=True)
    assert pair.a.send("b", 7, HEARTBEAT, hold=False)
    pair.a.write_unheld()
    assert pair.pump(lambda: len(pair.received["b"]) == 1, seconds=2)
    pair.pump(seconds=0.3)  # however long both poll, the held reply stays
    assert [m["type"] for _, _, m in pair.received["b"]] == ["append_entries"]
    pair.a.release()
    assert pair.pump(lambda: len(pair.received["b"]) == 2, seconds=2)
    assert pair.received["b"] == [(7, "a", HEARTBEAT), (7, "a", REPLY)]


def test_connection_comes_from_the_senders_own_address(pair: Pair) -> None:
    assert pair.pump(lambda: pair.a.is_up("b") and pair.b.is_up("a"), seconds=5)
    pair.a.send("b", 1, {"type": "response_vote", "term": 3}, hold=False)
    pair.a.write_unheld()
    assert pair.pump(lambda: bool(pair.received["b"]), seconds=2)
    inbound = list(pair.b._inbound.values())
    assert [conn.peer_id for conn in inbound] == ["a"]
    assert inbound[0].sock.getpeername()[0] == "127.0.0.11"
    assert pair.received["b"] == [(1, "a", {"type": "response_vote", "term": 3})]


def test_peer_going_away_is_reported_down_then_up_again(pair: Pair) -> None:
    assert pair.pump(lambda: ("a", "up", "b") in pair.events, seconds=5)
    pair.b.close()
    pair.b_closed = True
    assert pair.pump(lambda: ("a", "down", "b") in pair.events, seconds=5)
    assert not pair.a.is_up("b")
    assert not pair.a.send("b", 1, REPLY, hold=False)
    pair.b = pair.make("b")
    pair.b_closed = False
    assert pair.pump(lambda: pair.events.count(("a", "up", "b")) == 2, seconds=5)


def test_refused_peer_loses_both_directions_until_let_in(pair: Pair) -> None:
    assert pair.pump(lambda: pair.a.is_up("b") and pair.b.is_up("a"), seconds=5)
    why: dict[str, str | None] = {"b": "runs a release that cannot run at level 1"}
    pair.a.refusals.rule = lambda peer_id: why.get(peer_id)
    assert pair.pump(lambda: not pair.a.is_up("b") and not pair.b.is_up("a"), seconds=5)
    pair.pump(seconds=0.5)  # b keeps trying to reconnect: its hellos are refused
    assert not pair.a.is_up("b") and not pair.b.is_up("a")
    assert not [c for c in pair.a._inbound.values() if c.peer_id == "b"]
    assert not pair.b.send("a", 1, REPLY, hold=False)
    why["b"] = None
    assert pair.pump(lambda: pair.a.is_up("b") and pair.b.is_up("a"), seconds=5)
    pair.b.send("a", 1, REPLY, hold=False)
    pair.b.write_unheld()
    assert pair.pump(lambda: pair.received["a"] == [(1, "b", REPLY)], seconds=2)


def test_full_peer_buffer_refuses_frames() -> None:
    # Bypasses RaftConfig.check() on purpose, to make the bound small enough to hit.
    networks = Pair(replace(RaftConfig(), peer_send_buffer_bytes_max=64 * 1024))
    try:
        assert networks.pump(lambda: networks.a.is_up("b"), seconds=5)
        big = {**HEARTBEAT, "entries": (batch_entry(bytes(10_000)),)}
        accepted = sum(networks.a.send("b", 1, big, hold=True) for _ in range(20))
        assert accepted == 6
        assert networks.a.stats.frames_dropped_full == 14
    finally:
        networks.close()


def _raft_tls(directory: Path) -> RaftTls:
    certs = write_dev_certs(directory, ["127.0.0.11", "127.0.0.12"])
    config = BrokerConfig(
        tls_cert=str(certs.broker_cert), tls_key=str(certs.broker_key), tls_ca=str(certs.ca)
    )
    tls = broker_tls(config)
    assert tls is not None
    return tls.raft


@pytest.fixture(scope="module")
def cluster_tls(tmp_path_factory: pytest.TempPathFactory) -> RaftTls:
    return _raft_tls(tmp_path_factory.mktemp("certs"))


def test_tls_frames_small_and_large_arrive_in_order(cluster_tls: RaftTls) -> None:
    networks = Pair(tls={"a": cluster_tls, "b": cluster_tls})
    try:
        assert networks.pump(lambda: networks.a.is_up("b") and networks.b.is_up("a"), seconds=5)
        big = [
            {**HEARTBEAT, "entries": (batch_entry(bytes([k]) * 3 * 1024 * 1024, idx=k + 1),)}
            for k in range(3)
        ]
        sent = [REPLY, *big, HEARTBEAT]
        for message in sent:
            assert networks.a.send("b", 9, message, hold=False)
        networks.a.write_unheld()
        assert networks.pump(lambda: len(networks.received["b"]) == len(sent), seconds=10)
        assert networks.received["b"] == [(9, "a", m) for m in sent]
        assert networks.a.stats.handshakes_refused + networks.b.stats.handshakes_refused == 0
    finally:
        networks.close()


def test_tls_peer_of_another_ca_or_plain_tcp_is_refused(
    cluster_tls: RaftTls, tmp_path: Path
) -> None:
    networks = Pair(tls={"a": _raft_tls(tmp_path / "other-ca"), "b": cluster_tls})
    try:
        networks.pump(lambda: networks.b.stats.handshakes_refused >= 2, seconds=3)
        assert networks.b.stats.handshakes_refused >= 2  # a's certificate: unknown CA
        assert networks.a.stats.handshakes_refused >= 1  # b's, to a
        assert not networks.a.is_up("b") and not networks.b.is_up("a")
        assert networks.events == [] and networks.received == {"a": [], "b": []}
        # A plain TCP peer's first bytes (a hello frame) are not a TLS ClientHello.
        refused = networks.b.stats.handshakes_refused
        host, port = networks.peers["b"].split(":")
        with socket.create_connection((host, int(port)), timeout=2) as plain:
            plain.sendall(encode_frame(HELLO_GROUP_ID, bytes(64)))
            networks.pump(lambda: networks.b.stats.handshakes_refused > refused, seconds=3)
            assert networks.b.stats.handshakes_refused > refused
            plain.settimeout(2)
            with contextlib.suppress(ConnectionError):
                assert plain.recv(4096) == b""  # closed, no challenge sent
    finally:
        networks.close()

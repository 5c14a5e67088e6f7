"""Proves the Raft connection handshake of raft/auth.py on real sockets (two Networks in
this process, and raw sockets playing a stranger):

- brokers with the same secret connect and exchange messages; with different secrets, or
  one with a secret and one without, every connection is refused by the receiver with one
  warning per attempt, and no message crosses;
- a hello naming a node outside the cluster is refused even with the right secret;
- a hello naming another cluster id is refused (both ids in the one warning line), so no
  message of another cluster crosses; the same id, or none known on either side, connects;
  any hello round-trips its sender and cluster id, and a version-1 hello (no cluster id)
  from an older dmq is still accepted; a hello of a newer version than this node speaks
  is refused with one warning naming the sender's node id, its release and its level;
- a hello recorded from one connection is refused on the next (fresh nonce);
- the hostile pickle sent as the hello, or after a valid hello, is refused: the
  connection is closed, one warning is logged, the marker file never appears, and the
  Network keeps serving its real peer;
- before the hello checks out, at most RECV_BYTES_BEFORE_HELLO bytes are read and a first
  frame over HELLO_FRAME_BYTES_MAX is refused; a connection that sends no hello is closed
  after HANDSHAKE_TIMEOUT_S; at most PENDING_HANDSHAKES_MAX unauthenticated connections
  are held;
- idle connections from one address take at most PENDING_HANDSHAKES_PER_ADDRESS_MAX
  slots: the next from it is closed at once, while another address is still served and
  the real peer still connects; an accepted connection gets ACCEPTED_HANDSHAKE_TIMEOUT_S
  (shorter than HANDSHAKE_TIMEOUT_S) to send its hello.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from raft_harness import free_port_on

from raft import auth, wire
from raft.config import RaftConfig
from raft.transport import (
    HELLO_GROUP_ID,
    RECV_BYTES_BEFORE_HELLO,
    Network,
    encode_frame,
)

SECRET = b"s3cret-of-the-cluster-0123456789"
VOTE = {"type": "response_vote", "term": 4}


class Nodes:
    """Networks a (127.0.0.11) and b (127.0.0.12), each with its own secret."""

    def __init__(self, secret_a: bytes | None, secret_b: bytes | None) -> None:
        port = free_port_on(["127.0.0.11", "127.0.0.12"])
        self.peers = {"a": f"127.0.0.11:{port}", "b": f"127.0.0.12:{port}"}
        self.port = port
        self.received: list[tuple[int, str, Any]] = []
        self.sockets: list[socket.socket] = []  # closed with the nodes, even on failure
        self.a = self._make("a", secret_a)
        self.b = self._make("b", secret_b)

    def _make(self, node_id: str, secret: bytes | None) -> Network:
        network = Network(
            node_id,
            self.peers[node_id],
            self.peers,
            RaftConfig(),
            on_message=lambda group, peer, message: self.received.append((group, peer, message)),
            on_peer_up=lambda peer: None,
            on_peer_down=lambda peer: None,
            secret=secret,
        )
        network.open()
        return network

    def pump(self, until: Callable[[], bool] = lambda: False, seconds: float = 0.3) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for network in (self.a, self.b):
                network.maintain(time.monotonic())
                network.poll(0.005)
            if until():
                return True
        return until()

    def send_a_to_b(self, message: Any = VOTE) -> None:
        if self.a.send("b", 1, message, hold=False):
            self.a.write_unheld()

    def b_still_serves_a(self) -> bool:
        """a's messages reach b (a may be reconnecting: send until one arrives)."""
        marker = {**VOTE, "term": 99}

        def arrived() -> bool:
            self.send_a_to_b(marker)
            return (1, "a", marker) in self.received

        return self.pump(arrived, seconds=10)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.a.close()
        self.b.close()


@pytest.fixture
def make_nodes() -> Iterator[Callable[[bytes | None, bytes | None], Nodes]]:
    made: list[Nodes] = []

    def make(secret_a: bytes | None, secret_b: bytes | None) -> Nodes:
        made.append(Nodes(secret_a, secret_b))
        return made[-1]

    yield make
    for nodes in made:
        nodes.close()


class Stranger:
    """A raw TCP client of b's Raft port, from 127.0.0.13."""

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes
        self.sock = socket.socket()
        nodes.sockets.append(self.sock)
        self.sock.bind(("127.0.0.13", 0))
        self.sock.setblocking(False)
        self.sock.connect_ex(("127.0.0.12", nodes.port))
        self.challenge = self._read(auth.CHALLENGE_BYTES)
        self.nonce = auth.read_challenge(self.challenge)

    def _read(self, size: int) -> bytes:
        data = b""

        def got() -> bool:
            nonlocal data
            with contextlib.suppress(BlockingIOError):
                data += self.sock.recv(size - len(data))
            return len(data) == size

        assert self.nodes.pump(got, seconds=5), "no challenge"
        return data

    def hello(self, sender: str = "a", secret: bytes | None = SECRET) -> bytes:
        return encode_frame(HELLO_GROUP_ID, auth.hello_payload(secret, self.nonce, sender, "b"))

    def send(self, data: bytes) -> None:
        self.sock.setblocking(True)
        with contextlib.suppress(OSError):  # b may have closed already
            self.sock.sendall(data)
        self.sock.setblocking(False)

    def closed_by_b(self, seconds: float = 5) -> bool:
        def eof() -> bool:
            try:
                return self.sock.recv(1) == b""
            except BlockingIOError:
                return False
            except OSError:
                return True

        return self.nodes.pump(eof, seconds=seconds)

    def close(self) -> None:
        self.sock.close()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "raft.transport"
    ]


def test_same_secret_connects_and_messages_flow(make_nodes: Any) -> None:
    nodes = make_nodes(SECRET, SECRET)
    assert nodes.pump(lambda: nodes.a.is_up("b") and nodes.b.is_up("a"), seconds=5)
    nodes.send_a_to_b()
    assert nodes.pump(lambda: nodes.received == [(1, "a", VOTE)], seconds=5)
    assert nodes.b.stats.handshakes_refused == 0


@pytest.mark.parametrize(
    ("secret_a", "secret_b"),
    [(b"another-secret-0123456789abcdef", SECRET), (None, SECRET), (SECRET, None)],
    ids=["wrong secret", "sender has none", "receiver has none"],
)
def test_a_sender_without_the_secret_is_refused(
    make_nodes: Any, secret_a: bytes | None, secret_b: bytes | None, caplog: Any
) -> None:
    nodes = make_nodes(secret_a, secret_b)
    assert nodes.pump(lambda: nodes.b.stats.handshakes_refused >= 2, seconds=5)
    for _ in range(10):
        nodes.send_a_to_b()
        nodes.pump(seconds=0.05)
    assert nodes.received == []
    refused = [w for w in warnings_of(caplog) if "fails its mac" in w]
    attempts = nodes.a.stats.handshakes_refused + nodes.b.stats.handshakes_refused
    assert len(refused) == attempts >= 2  # one line per attempt, either way


def test_a_node_outside_the_cluster_is_refused(make_nodes: Any, caplog: Any) -> None:
    nodes = make_nodes(SECRET, SECRET)
    stranger = Stranger(nodes)
    stranger.send(stranger.hello(sender="n9") + encode_frame(1, wire.encode(VOTE)))
    assert stranger.closed_by_b()
    assert nodes.received == []
    assert any("not a broker of this cluster" in w for w in warnings_of(caplog))
    stranger.close()


def test_a_recorded_hello_is_refused_on_the_next_connection(make_nodes: Any) -> None:
    nodes = make_nodes(SECRET, SECRET)
    first = Stranger(nodes)
    recorded = first.hello()
    first.send(recorded + encode_frame(1, wire.encode(VOTE)))
    assert nodes.pump(lambda: nodes.received == [(1, "a", VOTE)], seconds=5)
    first.close()
    second = Stranger(nodes)
    assert second.nonce != first.nonce
    refused = nodes.b.stats.handshakes_refused
    second.send(recorded + encode_frame(1, wire.encode({**VOTE, "term": 5})))
    assert second.closed_by_b()
    assert nodes.b.stats.handshakes_refused == refused + 1
    assert nodes.received == [(1, "a", VOTE)]
    second.close()


class Hostile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("after_hello", [False, True], ids=["as the hello", "after a hello"])
def test_the_hostile_pickle_is_refused_and_never_runs(
    make_nodes: Any, tmp_path: Path, caplog: Any, after_hello: bool
) -> None:
    marker = tmp_path / "pwned"
    nodes = make_nodes(SECRET, SECRET)
    assert nodes.pump(lambda: nodes.a.is_up("b"), seconds=5)
    stranger = Stranger(nodes)
    frame = encode_frame(HELLO_GROUP_ID if not after_hello else 1, pickle.dumps(Hostile(marker)))
    caplog.clear()
    stranger.send((stranger.hello() if after_hello else b"") + frame)
    assert stranger.closed_by_b()
    assert not marker.exists()
    assert len(warnings_of(caplog)) == 1, warnings_of(caplog)
    assert nodes.b_still_serves_a()
    stranger.close()


@pytest.mark.parametrize("size", [auth.HELLO_FRAME_BYTES_MAX, 1024 * 1024])
def test_before_the_hello_little_is_read_and_big_frames_are_refused(
    make_nodes: Any, size: int
) -> None:
    nodes = make_nodes(SECRET, SECRET)
    stranger = Stranger(nodes)
    before = nodes.b.stats.bytes_received
    stranger.send(encode_frame(HELLO_GROUP_ID, bytes(size)))
    assert stranger.closed_by_b()
    assert nodes.b.stats.handshakes_refused == 1
    # a's hello and heartbeats (8 bytes each) may arrive meanwhile: well under 1 KiB.
    assert nodes.b.stats.bytes_received - before <= RECV_BYTES_BEFORE_HELLO + 1024


def test_a_connection_without_a_hello_is_closed_in_time(
    make_nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth, "HANDSHAKE_TIMEOUT_S", 0.3)
    nodes = make_nodes(SECRET, SECRET)
    stranger = Stranger(nodes)
    started = time.monotonic()
    assert stranger.closed_by_b(seconds=5)
    assert 0.2 <= time.monotonic() - started <= 3
    stranger.close()


def test_unauthenticated_connections_are_bounded(
    make_nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth, "PENDING_HANDSHAKES_MAX", 3)
    nodes = make_nodes(SECRET, SECRET)
    held = [Stranger(nodes) for _ in range(3)]
    extra = socket.create_connection(("127.0.0.12", nodes.port))
    nodes.sockets.append(extra)
    extra.setblocking(False)

    def refused() -> bool:
        try:
            return extra.recv(64) == b""
        except BlockingIOError:
            return False

    assert nodes.pump(refused, seconds=5)
    extra.close()
    for stranger in held:
        stranger.close()


def _raw_from(nodes: Nodes, host: str) -> socket.socket:
    sock = socket.socket()
    nodes.sockets.append(sock)
    sock.bind((host, 0))
    sock.connect(("127.0.0.12", nodes.port))
    sock.setblocking(False)
    return sock


def _answer(nodes: Nodes, sock: socket.socket) -> bytes | None:
    """b's first bytes on `sock` (the challenge), b"" if b closed it, None if neither."""
    got: list[bytes] = []

    def answered() -> bool:
        try:
            got.append(sock.recv(64))
        except BlockingIOError:
            return False
        return True

    return got[0] if nodes.pump(answered, seconds=5) else None


def test_one_address_cannot_take_every_handshake_slot(
    make_nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth, "PENDING_HANDSHAKES_PER_ADDRESS_MAX", 3)
    nodes = make_nodes(SECRET, SECRET)
    held = [Stranger(nodes) for _ in range(3)]  # idle, from 127.0.0.13
    assert _answer(nodes, _raw_from(nodes, "127.0.0.13")) == b""  # closed at once
    other = _answer(nodes, _raw_from(nodes, "127.0.0.14"))
    assert other is not None and len(other) > 0  # another address gets its challenge
    assert nodes.b_still_serves_a()
    assert nodes.b.stats.handshakes_refused >= 1
    for stranger in held:
        stranger.close()


def test_an_accepted_connection_has_a_short_deadline(
    make_nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth, "ACCEPTED_HANDSHAKE_TIMEOUT_S", 0.3)
    assert auth.HANDSHAKE_TIMEOUT_S >= 5  # the outbound side's, unchanged
    nodes = make_nodes(SECRET, SECRET)
    stranger = Stranger(nodes)
    started = time.monotonic()
    assert stranger.closed_by_b(seconds=5)
    assert time.monotonic() - started <= 3
    stranger.close()


# --- the cluster id in the hello ------------------------------------------------------------


@pytest.mark.parametrize(
    ("cluster_a", "cluster_b", "connects"),
    [(b"c1", b"c1", True), (b"", b"c1", True), (b"c1", b"", True), (b"c2", b"c1", False)],
    ids=["same cluster", "sender knows none", "receiver knows none", "another cluster"],
)
def test_a_hello_of_another_cluster_is_refused(
    make_nodes: Any, caplog: Any, cluster_a: bytes, cluster_b: bytes, connects: bool
) -> None:
    nodes = make_nodes(SECRET, SECRET)
    nodes.a.cluster_id, nodes.b.cluster_id = cluster_a, cluster_b
    if connects:
        assert nodes.b_still_serves_a()
        assert nodes.b.stats.handshakes_refused == 0
        return
    assert nodes.pump(lambda: nodes.b.stats.handshakes_refused >= 2, seconds=5)
    for _ in range(10):
        nodes.send_a_to_b()
        nodes.pump(seconds=0.05)
    assert nodes.received == []
    refused = [w for w in warnings_of(caplog) if "of cluster c2, this node is of cluster c1" in w]
    assert len(refused) == nodes.b.stats.handshakes_refused >= 2  # one line per attempt


def test_a_version_1_hello_is_accepted_as_naming_no_cluster(make_nodes: Any) -> None:
    nodes = make_nodes(SECRET, SECRET)
    nodes.b.cluster_id = b"c1"
    stranger = Stranger(nodes)
    mac = auth._mac(SECRET, stranger.nonce, b"a", b"b", None)
    hello = bytes([auth.HELLO_VERSION_NO_CLUSTER, 1]) + b"a" + mac
    stranger.send(encode_frame(HELLO_GROUP_ID, hello) + encode_frame(1, wire.encode(VOTE)))
    assert nodes.pump(lambda: nodes.received == [(1, "a", VOTE)], seconds=5)
    stranger.close()


def test_a_newer_hello_is_refused_naming_sender_release_and_level(
    make_nodes: Any, caplog: Any
) -> None:
    nodes = make_nodes(SECRET, SECRET)
    stranger = Stranger(nodes)
    # The layout every later version keeps (raft/auth.py), then whatever that version adds.
    newer = bytes([auth.HELLO_VERSION + 1, 1]) + b"a" + bytes([5]) + b"0.3.0" + b"\x00" * 40
    stranger.send(encode_frame(HELLO_GROUP_ID, newer) + encode_frame(1, wire.encode(VOTE)))
    assert stranger.closed_by_b()
    assert nodes.received == []
    [warning] = [w for w in warnings_of(caplog) if "hello level" in w]
    assert (
        "hello from 'a' (unverified), dmq 0.3.0, which speaks Raft hello level 3; this node "
        "speaks levels 1 to 2: it runs a newer dmq than this one" in warning
    )
    stranger.close()


node_ids = st.text(min_size=1, max_size=20).filter(lambda t: len(t.encode()) <= 255)


@settings(max_examples=200, deadline=None)
@given(
    sender=node_ids,
    cluster=st.binary(max_size=auth.CLUSTER_ID_BYTES_MAX),
    other=st.binary(max_size=auth.CLUSTER_ID_BYTES_MAX),
    nonce=st.binary(min_size=auth.NONCE_BYTES, max_size=auth.NONCE_BYTES),
)
def test_a_hello_round_trips_its_sender_and_cluster(
    sender: str, cluster: bytes, other: bytes, nonce: bytes
) -> None:
    payload = auth.hello_payload(SECRET, nonce, sender, "b", cluster)
    assert len(payload) <= auth.HELLO_FRAME_BYTES_MAX
    hello = auth.check_hello(SECRET, nonce, payload, "b")
    assert hello == auth.Hello(sender, cluster)
    if cluster and other and other != cluster:
        with pytest.raises(auth.AuthFailed, match="another cluster"):
            auth.check_cluster(other, hello)
    else:
        auth.check_cluster(other, hello)
    at = 2 + len(sender.encode())  # the cluster id's length byte: the mac covers it
    tampered = payload[:at] + bytes([payload[at] ^ 1]) + payload[at + 1 :]
    with pytest.raises(auth.AuthFailed):
        auth.check_hello(SECRET, nonce, tampered, "b")

"""Proves, with real `dmq serve` processes on 127.0.0.11-13 and strangers on 127.0.0.14,
that no code runs from a peer's bytes and that only brokers holding the secret are heard
(issue #26):

- the hostile frame of the issue (a pickle whose `__reduce__` calls os.system), sent to a
  broker's Raft port as the hello, and again after a well-formed hello naming a broker the
  cluster knows: nothing runs (the marker file never appears), the connection is closed,
  exactly one warning is logged per attempt, and the broker goes on serving (produce and
  fetch through it work after); both in an unsecured cluster (where anyone can make a
  well-formed hello, and the one "NO CLUSTER SECRET" warning is logged at start) and in a
  cluster with a secret;
- with a secret, a fourth process holding the wrong one cannot vote, append or call the
  internal routes: a real `dmq serve --join` is refused at its /v1/internal calls (each
  refusal logged), never registers and exits naming the wrong secret; a stranger impersonating
  a member sends a request_vote and an append_entries with a huge term for the metadata
  group and is refused before either is decoded (the group's term does not move); HTTP
  calls to /v1/internal without a signature, with a bad one or an old one answer 401
  naming the reason; meanwhile the cluster keeps working, and signed internal calls are
  served.
"""

from __future__ import annotations

import os
import pickle
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import (
    SIGNATURE_HEADER,
    DmqCluster,
    Node,
    fetch_all,
    produce,
    sign_internal,
    wait_for,
)

from raft import auth, wire
from raft.transport import HELLO_GROUP_ID, encode_frame

SECRET = b"a-test-cluster-secret-0123456789abcdef"
STRANGER_HOST = "127.0.0.14"
REFUSED = "WARNING raft.transport: closing connection from"


class SystemCall:
    """The issue's hostile payload: unpickling it runs a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def log_lines(node: Node, needle: str) -> list[str]:
    return [
        line for line in node.log_path.read_text(errors="replace").splitlines() if needle in line
    ]


class Stranger:
    """A raw TCP connection from STRANGER_HOST to a broker's Raft port; it reads the
    broker's challenge as a broker would."""

    def __init__(self, cluster: DmqCluster, node_id: str) -> None:
        self.sock = socket.socket()
        self.sock.settimeout(10)
        self.sock.bind((STRANGER_HOST, 0))
        self.sock.connect((cluster[node_id].host, cluster.raft_port))
        self.receiver = node_id
        challenge = b""
        while len(challenge) < auth.CHALLENGE_BYTES:
            data = self.sock.recv(auth.CHALLENGE_BYTES - len(challenge))
            assert data, "the broker closed before its challenge"
            challenge += data
        self.nonce = auth.read_challenge(challenge)

    def hello(self, sender: str, secret: bytes | None) -> bytes:
        payload = auth.hello_payload(secret, self.nonce, sender, self.receiver)
        return encode_frame(HELLO_GROUP_ID, payload)

    def send_and_wait_closed(self, data: bytes) -> bool:
        """Send, then True once the broker closes the connection (within 10 s)."""
        try:
            self.sock.sendall(data)
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
        finally:
            self.sock.close()


def wait_one_more_line(node: Node, needle: str, before: int) -> list[str]:
    """The lines with `needle` once there is exactly one more than `before` (and still one
    more half a second later: not two)."""
    wait_for(lambda: len(log_lines(node, needle)) > before or None, 10, f"{needle!r} logged")
    time.sleep(0.5)
    lines = log_lines(node, needle)
    assert len(lines) == before + 1, lines[before:]
    return lines[before:]


def produce_and_fetch_through(cluster: DmqCluster, node: Node, topic: str, value: str) -> None:
    """A new topic (replicated on 3), one record produced with acks=all and read back."""
    cluster.create_topic(topic, partitions=1, replication_factor=3, via=node)
    [(_, offset)] = produce(node, topic, [{"value": value}])
    assert (offset, value) in [(o, v) for o, _, v in fetch_all(node, topic, 0)]


@pytest.mark.parametrize("secret", [None, SECRET], ids=["unsecured", "secured"])
def test_the_hostile_frame_never_runs_and_the_broker_goes_on(
    dmq_cluster: Callable[..., DmqCluster], tmp_path: Path, secret: bytes | None
) -> None:
    cluster = dmq_cluster(3, secret=secret).start_all()
    n1 = cluster["n1"]
    unsecured = log_lines(n1, "NO CLUSTER SECRET")
    assert len(unsecured) == (1 if secret is None else 0)
    produce_and_fetch_through(cluster, n1, "before", "v0")
    marker = tmp_path / "pwned"
    hostile = pickle.dumps(SystemCall(f"touch {marker}"))

    # 1. The hostile pickle as the hello.
    before = len(log_lines(n1, REFUSED))
    stranger = Stranger(cluster, "n1")
    assert stranger.send_and_wait_closed(encode_frame(HELLO_GROUP_ID, hostile))
    [line] = wait_one_more_line(n1, REFUSED, before)
    assert STRANGER_HOST in line and "hello" in line

    # 2. A well-formed hello naming n2 (a broker the cluster knows), then the pickle as a
    #    message of the metadata group.
    before = len(log_lines(n1, REFUSED))
    stranger = Stranger(cluster, "n1")
    frames = stranger.hello("n2", secret) + encode_frame(0, hostile)
    assert stranger.send_and_wait_closed(frames)
    [line] = wait_one_more_line(n1, REFUSED, before)
    assert "n2 (127.0.0.14" in line and "WireError" in line

    time.sleep(0.5)  # had anything run, the shell would have finished by now
    assert not marker.exists()
    assert n1.alive
    produce_and_fetch_through(cluster, n1, "after", "v1")


def metadata_term(node: Node) -> int:
    group = next(g for g in node.json("GET", "/v1/cluster/status")["groups"] if g["topic"] is None)
    return int(group["term"])


def test_a_fourth_process_with_the_wrong_secret_cannot_vote_append_or_call_internal_routes(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(4, secret=SECRET, metadata_voters=["n1", "n2", "n3"])
    rogue = cluster["n4"]
    for node_id in ("n1", "n2", "n3"):
        cluster.limit_peers([node_id], ["n1", "n2", "n3"])
        cluster[node_id].start()
    cluster.wait_ready([cluster["n1"], cluster["n2"], cluster["n3"]])
    n1 = cluster["n1"]
    term = metadata_term(n1)
    produce_and_fetch_through(cluster, n1, "t", "v0")

    # A real broker process with the wrong secret, joining through n1.
    wrong = cluster.tmp_path / "wrong-secret"
    wrong.write_bytes(b"not-the-cluster-secret-0123456789")
    cluster.use_join("n4", n1.url)
    rogue.drop_flags("--cluster-secret-file")
    rogue.args += ["--cluster-secret-file", str(wrong)]
    rogue.start()

    # A stranger impersonating n2, with the wrong secret: a vote request and an append
    # with a huge term for the metadata group (group 0).
    huge = 10**9
    vote = {"type": "request_vote", "term": huge, "last_log_index": huge, "last_log_term": huge}
    append = {"type": "append_entries", "term": huge, "commit_index": 0, "prevLogIdx": 0,
              "prevLogTerm": 0, "entries": ((b"\x01", 1, huge),)}  # fmt: skip
    for message in (vote, append):
        stranger = Stranger(cluster, "n1")
        frames = stranger.hello("n2", b"not-the-cluster-secret-0123456789")
        assert stranger.send_and_wait_closed(frames + encode_frame(0, wire.encode(message)))

    # HTTP to the internal routes: no signature, a bad one, an old one.
    target = "/v1/internal/status"
    stale = sign_internal(SECRET, "GET", target, now_ms=int(time.time() * 1000) - 3_600_000)
    bad = sign_internal(b"not-the-cluster-secret-0123456789", "GET", target)
    for header, reason in ((None, "missing"), (bad, "signature"), (stale, "expired")):
        answer = _raw_get(n1, target, header)
        assert answer[0] == 401, answer
        assert f'"reason": "{reason}"' in answer[1], answer
    body = b'{"records": [{"value": "forged"}]}'
    answer = _raw_post(n1, "/v1/internal/partitions/t/0/append?topic_id=1", body)
    assert answer[0] == 401, answer

    # The rogue broker is refused at every turn and never registers.
    wait_for(
        lambda: log_lines(n1, "refused POST /v1/internal/metadata/propose") or None,
        30,
        "the rogue's registration refused",
    )
    # Refused, the rogue stops with the reason (whether its Raft connections were tried
    # before that is timing: each would be refused at the handshake, as the stranger's).
    wait_for(lambda: not rogue.alive or None, 30, "the rogue to stop")
    assert rogue.proc is not None and rogue.proc.returncode == 1
    assert log_lines(rogue, "exiting: internal route: bad signature (wrong cluster secret?)")
    assert len(log_lines(n1, "from 'n2' fails its mac")) >= 2  # the stranger's two
    brokers = [b["node_id"] for b in n1.json("GET", "/v1/cluster")["brokers"]]
    assert "n4" not in brokers
    assert metadata_term(n1) < huge and metadata_term(n1) - term <= 1

    # The cluster keeps working, and a signed internal call is served.
    produce_and_fetch_through(cluster, cluster["n2"], "t2", "v1")
    assert n1.json("GET", "/v1/internal/status")["node_id"] == "n1"
    assert "n4" not in [b["node_id"] for b in n1.json("GET", "/v1/cluster")["brokers"]]


def _raw_get(node: Node, path: str, signature: str | None) -> tuple[int, str]:
    return _raw(node, "GET", path, b"", signature)


def _raw_post(node: Node, path: str, body: bytes) -> tuple[int, str]:
    return _raw(node, "POST", path, body, None)


def _raw(node: Node, method: str, path: str, body: bytes, signature: str | None) -> tuple[int, str]:
    """A request without the node's own signing (node.request signs internal paths)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(node.url + path, data=body or None, method=method)
    if signature is not None:
        request.add_header(SIGNATURE_HEADER, signature)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()

"""The handshake that opens every Raft connection: the sender proves it holds the secret.

Connections carry frames one way (raft/transport.py): a node sends on the connection it
opened and receives on those it accepted. The receiver is the side that must trust what it
reads, so the receiver (the accepting side) challenges and the sender answers:

1. A connects to B. B accepts and at once writes a challenge on the accepted socket:
   `CHALLENGE_MAGIC | nonce` (CHALLENGE_BYTES), a fresh random nonce per connection.
2. A reads exactly CHALLENGE_BYTES (before that its link is not up: nothing is sent), then
   sends its hello as the connection's first frame (group HELLO_GROUP_ID), payload
   `u8 HELLO_VERSION | u8 n | A's node id (n bytes, UTF-8) | u8 m | A's cluster id (m
   bytes, 0 while A knows none) | mac`, where `mac = HMAC-SHA256(secret, HELLO_CONTEXT |
   nonce | u8 len | A's id | u8 len | B's id | u8 len | A's cluster id)`.
   Then its queued frames follow and the link is up.
3. B reads at most HELLO_FRAME_BYTES_MAX before the hello is checked: the first frame must
   be a hello of that size at most; B recomputes the mac with its own id and the nonce it
   sent and compares with `hmac.compare_digest`; then checks that A's id is a broker of
   the cluster, and that A's cluster id is B's (`check_cluster`: when both know one).
   Any failure: one warning line, the connection is closed, nothing after the hello is
   decoded. A connection that has not sent a valid hello within HANDSHAKE_TIMEOUT_S is
   closed too.
4. Only then are the connection's frames decoded (raft/wire.py) and handed to Raft.

The cluster id (bytes the caller passes in, as it does the secret: raft/ does not know
what a cluster is) keeps a broker of another cluster out even when it shares the secret
and a node id (a copied config, a reused data directory): every frame arrives on a
connection whose hello named the receiver's cluster, so none from another cluster is
ever decoded (etcd stamps each message with its cluster id for the same reason). A node
that knows no id yet (a new cluster whose metadata group has not chosen one) sends and
accepts an empty one. A version-1 hello (dmq before cluster ids) is still accepted, as
carrying no cluster id, so brokers can be upgraded one at a time; an older broker
refuses a version-2 hello, so connections from upgraded brokers to it fail until it is
upgraded too.

Hello versions are the Raft protocol's level: every release from 0.1.0 sends version 2,
which 0.1.0 reads. Every later version must begin with `u8 version | u8 n | sender's node id
(n bytes) | u8 k | sender's dmq release (k bytes, ASCII)`, whatever follows: a node that
does not speak that version then still names, in its refusal (one warning line, the
connection closed), the sender, its release and the level it speaks (`newer_hello`),
instead of a malformed hello from an address. The sender learns only that the connection
closed; a refused peer is told why by the operator's log of the refusing broker.

A recorded hello is worthless: it answers a nonce that B will never send again (32 random
bytes). The mac names both ends, so a hello made for C is refused by B. Without a secret
(an unsecured cluster, `secret=None`) the key is empty: the handshake still runs, so a
node with a secret and one without refuse each other, but it proves nothing; such a
cluster must keep its Raft port private (dmq serve warns).

What it does not do: encrypt, or authenticate each frame. Someone who can inject packets
into an established TCP connection between two brokers can still inject frames; use a
private network (or a WireGuard/TLS tunnel) where that is a threat.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from dataclasses import dataclass

from raft.errors import AuthFailed

CHALLENGE_MAGIC = b"DMQRAUTH"
NONCE_BYTES = 32
CHALLENGE_BYTES = len(CHALLENGE_MAGIC) + NONCE_BYTES
HELLO_VERSION = 2  # with the sender's cluster id
HELLO_VERSION_NO_CLUSTER = 1  # dmq before cluster ids: accepted, as naming none
HELLO_CONTEXT = b"dmq raft hello v2\x00"
HELLO_CONTEXT_V1 = b"dmq raft hello v1\x00"
MAC_BYTES = hashlib.sha256().digest_size
NODE_ID_BYTES_MAX = 255
CLUSTER_ID_BYTES_MAX = 64  # dmq/metadata/identity.py's CLUSTER_ID_CHARS_MAX, in ASCII
# The hello is the only frame read before authentication: its payload is at most
# 3 + NODE_ID_BYTES_MAX + CLUSTER_ID_BYTES_MAX + MAC_BYTES (354) bytes; a larger first
# frame closes the connection.
HELLO_FRAME_BYTES_MAX = 512
# A connection (either side) that has not finished the handshake in this long is closed:
# it bounds how long a silent or slow stranger holds a socket and a buffer.
HANDSHAKE_TIMEOUT_S = 5.0
# Accepted connections that have not authenticated yet, at most; more are closed at once.
PENDING_HANDSHAKES_MAX = 64
# Of those, at most this many from one address: idle connections from one host cannot
# take every slot and lock a restarting peer out. A peer holds one connection to us
# (two while it replaces one), so the cost is only to peers sharing one address (brokers
# of a test on 127.0.0.1): past 8 of them connecting at once, one waits connect_retry_s.
PENDING_HANDSHAKES_PER_ADDRESS_MAX = 8
# An accepted connection must finish TLS and send its hello within this long (or
# HANDSHAKE_TIMEOUT_S if shorter): a peer does it in milliseconds, so an idle stranger
# holds a slot 2 s, not 5. Cost: a peer whose handshake takes longer (a host too loaded
# to run it in 2 s) is cut and reconnects.
ACCEPTED_HANDSHAKE_TIMEOUT_S = 2.0

_U8 = struct.Struct("<B")


def handshake_slot_refusal(pending_hosts: list[str], host: str) -> str | None:
    """Why a connection from `host` gets no handshake slot, given the hosts of the
    accepted connections not authenticated yet; None when it gets one."""
    mine = pending_hosts.count(host)
    if len(pending_hosts) < PENDING_HANDSHAKES_MAX and mine < PENDING_HANDSHAKES_PER_ADDRESS_MAX:
        return None
    return (
        f"{len(pending_hosts)} handshakes pending already, {mine} of them from it (at most "
        f"{PENDING_HANDSHAKES_MAX}, {PENDING_HANDSHAKES_PER_ADDRESS_MAX} per address)"
    )


def new_challenge() -> tuple[bytes, bytes]:
    """(the challenge bytes to write, the nonce to remember) for one accepted connection."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    return CHALLENGE_MAGIC + nonce, nonce


def read_challenge(data: bytes) -> bytes:
    """The nonce of a complete challenge; AuthFailed if it is not one."""
    if len(data) != CHALLENGE_BYTES or not data.startswith(CHALLENGE_MAGIC):
        raise AuthFailed("the peer's challenge is malformed (not a dmq Raft port?)")
    return data[len(CHALLENGE_MAGIC) :]


def _node_id_bytes(node_id: str) -> bytes:
    data = node_id.encode()
    if not 0 < len(data) <= NODE_ID_BYTES_MAX:
        raise AuthFailed(f"node id of {len(data)} bytes (1-{NODE_ID_BYTES_MAX})")
    return data


@dataclass(frozen=True, slots=True)
class Hello:
    """What a hello that checked out says: who sent it, of which cluster (b"": none known)."""

    sender: str
    cluster_id: bytes


def _mac(
    secret: bytes | None, nonce: bytes, sender: bytes, receiver: bytes, cluster_id: bytes | None
) -> bytes:
    parts = [nonce, _U8.pack(len(sender)), sender, _U8.pack(len(receiver)), receiver]
    if cluster_id is None:  # a version-1 hello
        message = b"".join([HELLO_CONTEXT_V1, *parts])
    else:
        message = b"".join([HELLO_CONTEXT, *parts, _U8.pack(len(cluster_id)), cluster_id])
    return hmac.new(secret or b"", message, hashlib.sha256).digest()


def _cluster_id_bytes(cluster_id: bytes) -> bytes:
    if len(cluster_id) > CLUSTER_ID_BYTES_MAX:
        raise AuthFailed(f"cluster id of {len(cluster_id)} bytes (0-{CLUSTER_ID_BYTES_MAX})")
    return cluster_id


def hello_payload(
    secret: bytes | None, nonce: bytes, sender: str, receiver: str, cluster_id: bytes = b""
) -> bytes:
    """Step 2: the hello frame's payload proving `sender` holds the secret, and naming the
    cluster it belongs to (b"": it knows none yet)."""
    sender_bytes = _node_id_bytes(sender)
    cluster = _cluster_id_bytes(cluster_id)
    mac = _mac(secret, nonce, sender_bytes, _node_id_bytes(receiver), cluster)
    return b"".join(
        [_U8.pack(HELLO_VERSION), _U8.pack(len(sender_bytes)), sender_bytes]
        + [_U8.pack(len(cluster)), cluster, mac]
    )


def check_hello(secret: bytes | None, nonce: bytes, payload: bytes, receiver: str) -> Hello:
    """Step 3: the sender and its cluster id if `payload` proves the secret; AuthFailed
    otherwise.

    Whether that id belongs to the cluster is the caller's check (it knows the brokers), and
    so is the cluster id's (`check_cluster`).
    """
    if payload and payload[0] > HELLO_VERSION:
        raise AuthFailed(newer_hello(payload))
    if len(payload) < 2 + MAC_BYTES or payload[0] not in (
        HELLO_VERSION,
        HELLO_VERSION_NO_CLUSTER,
    ):
        raise AuthFailed(f"hello is malformed or not version {HELLO_VERSION}")
    size = payload[1]
    at = 2 + size
    cluster: bytes | None = None
    if payload[0] == HELLO_VERSION:
        if len(payload) < at + 1 + MAC_BYTES:
            raise AuthFailed("hello is malformed (length)")
        cluster_size = payload[at]
        cluster = payload[at + 1 : at + 1 + cluster_size]
        at += 1 + cluster_size
        if cluster_size > CLUSTER_ID_BYTES_MAX:
            raise AuthFailed("hello is malformed (cluster id length)")
    if len(payload) != at + MAC_BYTES or size == 0:
        raise AuthFailed("hello is malformed (length)")
    sender_bytes = payload[2 : 2 + size]
    try:
        sender = sender_bytes.decode()
    except UnicodeDecodeError:
        raise AuthFailed("hello names a node id that is not UTF-8") from None
    expected = _mac(secret, nonce, sender_bytes, _node_id_bytes(receiver), cluster)
    if not hmac.compare_digest(expected, payload[at:]):
        raise AuthFailed(f"hello from {sender!r} fails its mac (wrong or missing cluster secret)")
    return Hello(sender, cluster or b"")


def newer_hello(payload: bytes) -> str:
    """Why a hello of a version above HELLO_VERSION is refused, naming its sender, release
    and level as the layout every later version keeps says (module docstring); what it
    names is unverified (its mac is of a form this code does not know)."""
    level = payload[0]
    size = payload[1] if len(payload) > 1 else 0
    sender = payload[2 : 2 + size].decode(errors="replace")[:NODE_ID_BYTES_MAX]
    at = 2 + size
    release_size = payload[at] if len(payload) > at else 0
    release = payload[at + 1 : at + 1 + release_size].decode("ascii", errors="replace")[:40]
    return (
        f"hello from {sender!r} (unverified), dmq {release or 'unknown'}, which speaks Raft "
        f"hello level {level}; this node speaks levels {HELLO_VERSION_NO_CLUSTER} to "
        f"{HELLO_VERSION}: it runs a newer dmq than this one: upgrade this broker, or roll "
        f"that one back (README.md, 'Releases and upgrading')"
    )


def check_cluster(own_cluster_id: bytes, hello: Hello) -> None:
    """AuthFailed if the hello names another cluster than ours (when both know one)."""
    if own_cluster_id and hello.cluster_id and hello.cluster_id != own_cluster_id:
        theirs = hello.cluster_id.decode(errors="replace")
        raise AuthFailed(
            f"hello from {hello.sender!r} of cluster {theirs}, this node is of cluster "
            f"{own_cluster_id.decode(errors='replace')}: a broker of another cluster, dropped "
            f"(check its --peers and data directory)"
        )

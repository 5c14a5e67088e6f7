"""The handshake that opens every Raft connection: the sender proves it holds the secret.

Connections carry frames one way (raft/transport.py): a node sends on the connection it
opened and receives on those it accepted. The receiver is the side that must trust what it
reads, so the receiver (the accepting side) challenges and the sender answers:

1. A connects to B. B accepts and at once writes a challenge on the accepted socket:
   `CHALLENGE_MAGIC | nonce` (CHALLENGE_BYTES), a fresh random nonce per connection.
2. A reads exactly CHALLENGE_BYTES (before that its link is not up: nothing is sent), then
   sends its hello as the connection's first frame (group HELLO_GROUP_ID), payload
   `u8 HELLO_VERSION | u8 n | A's node id (n bytes, UTF-8) | mac`, where
   `mac = HMAC-SHA256(secret, HELLO_CONTEXT | nonce | u8 len | A's id | u8 len | B's id)`.
   Then its queued frames follow and the link is up.
3. B reads at most HELLO_FRAME_BYTES_MAX before the hello is checked: the first frame must
   be a hello of that size at most; B recomputes the mac with its own id and the nonce it
   sent and compares with `hmac.compare_digest`; then checks that A's id is a broker of
   the cluster. Any failure: one warning line, the connection is closed, nothing after
   the hello is decoded. A connection that has not sent a valid hello within
   HANDSHAKE_TIMEOUT_S is closed too.
4. Only then are the connection's frames decoded (raft/wire.py) and handed to Raft.

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

from raft.errors import AuthFailed

CHALLENGE_MAGIC = b"DMQRAUTH"
NONCE_BYTES = 32
CHALLENGE_BYTES = len(CHALLENGE_MAGIC) + NONCE_BYTES
HELLO_VERSION = 1
HELLO_CONTEXT = b"dmq raft hello v1\x00"
MAC_BYTES = hashlib.sha256().digest_size
NODE_ID_BYTES_MAX = 255
# The hello is the only frame read before authentication: its payload is at most
# 2 + NODE_ID_BYTES_MAX + MAC_BYTES (289) bytes; a larger first frame closes the connection.
HELLO_FRAME_BYTES_MAX = 512
# A connection (either side) that has not finished the handshake in this long is closed:
# it bounds how long a silent or slow stranger holds a socket and a buffer.
HANDSHAKE_TIMEOUT_S = 5.0
# Accepted connections that have not authenticated yet, at most; more are closed at once.
PENDING_HANDSHAKES_MAX = 64

_U8 = struct.Struct("<B")


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


def _mac(secret: bytes | None, nonce: bytes, sender: bytes, receiver: bytes) -> bytes:
    message = b"".join(
        [HELLO_CONTEXT, nonce, _U8.pack(len(sender)), sender, _U8.pack(len(receiver)), receiver]
    )
    return hmac.new(secret or b"", message, hashlib.sha256).digest()


def hello_payload(secret: bytes | None, nonce: bytes, sender: str, receiver: str) -> bytes:
    """Step 2: the hello frame's payload proving `sender` holds the secret."""
    sender_bytes = _node_id_bytes(sender)
    mac = _mac(secret, nonce, sender_bytes, _node_id_bytes(receiver))
    return _U8.pack(HELLO_VERSION) + _U8.pack(len(sender_bytes)) + sender_bytes + mac


def check_hello(secret: bytes | None, nonce: bytes, payload: bytes, receiver: str) -> str:
    """Step 3: the sender's node id if `payload` proves the secret; AuthFailed otherwise.

    Whether that id belongs to the cluster is the caller's check (it knows the brokers).
    """
    if len(payload) < 2 + MAC_BYTES or payload[0] != HELLO_VERSION:
        raise AuthFailed(f"hello is malformed or not version {HELLO_VERSION}")
    size = payload[1]
    if len(payload) != 2 + size + MAC_BYTES or size == 0:
        raise AuthFailed("hello is malformed (length)")
    sender_bytes = payload[2 : 2 + size]
    try:
        sender = sender_bytes.decode()
    except UnicodeDecodeError:
        raise AuthFailed("hello names a node id that is not UTF-8") from None
    expected = _mac(secret, nonce, sender_bytes, _node_id_bytes(receiver))
    if not hmac.compare_digest(expected, payload[2 + size :]):
        raise AuthFailed(f"hello from {sender!r} fails its mac (wrong or missing cluster secret)")
    return sender

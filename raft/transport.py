"""One TCP address per node for all its Raft groups, with replies held until the journal is durable.

Three pieces:

- the frame codec: `u32 length | u32 group_id | payload`, little-endian, where length counts
  group_id and payload; payload is a pysyncobj or dmq message encoded by raft/wire.py
  (plain data, never a pickle; no zlib: pysyncobj's messages are mostly already-compact
  command bytes, and compressing them cost more than it saved here). `FrameDecoder` parses
  a stream with one bytearray and a read position, so a large message costs O(size), not
  O(size^2) as pysyncobj's `bytes +=` buffer did, and hands out each frame as a view of
  its buffer, decoded in place;
- `Network`: the node's listening socket, one outgoing connection per peer (bound to the
  node's own address before connect, so the fault harness can give each node its own
  loopback address), accepted incoming connections, and a selector. Connections carry frames
  one way: a node sends on the connection it opened and receives on those it accepted, so
  there is no race over who connects. Every connection opens with the handshake of
  raft/auth.py: the accepting side writes a challenge, the connecting side answers with a
  hello (its node id and an HMAC of the challenge under the cluster secret) as its first
  frame. Until the hello checks out nothing is decoded; after it, every payload goes
  through raft/wire.py (and its log commands through raft/safe_pickle.py), and anything
  refused closes the connection with one warning. Frames for unknown groups are dropped (the group may not exist here
  yet);
- `GroupTransport`: pysyncobj's Transport for one group, which only forwards to Network.

With a `RaftTls` (raft/tls.py) every connection first runs a non-blocking TLS handshake
on its selector events, then the handshake above inside it; decrypted bytes the selector
cannot see (`SSLSocket.pending()`) are read at the next poll without waiting (`_backlog`).

Node-level liveness (for quiesced groups, raft/node.py): `Network.last_heard[peer]` is when
a frame of any group last arrived from that peer, and a peer that was sent nothing for a
heartbeat_interval_s gets an empty frame of group HELLO_GROUP_ID as a node heartbeat
(`pings_sent`). So a node that is alive is heard from every heartbeat_interval_s whatever
its groups do.

Durability rule: `Network.send` never writes to a socket. It appends the frame to the peer's
*held* buffer; RaftNode calls `release()` after it has synced every journal changed during
the tick, and only then do held frames move to the send buffer. So no message can leave
before the journal writes that preceded it are on disk (raft/README.md, "Durability").

Commit index: with appendEntriesUseBatch off, pysyncobj sends every follower an
append_entries after each commit, only to pass the new commit index on, and the follower
answers it: per record, two frames each way per follower where one carries the record.
`GroupTransport.send` holds back an append_entries with nothing new (no entries, no
snapshot data) when one went to that peer less than `append_gap_s` (half a heartbeat) ago:
the commit index then rides on the next entries, or on the heartbeat pysyncobj sends a
heartbeat_interval_s after its last send, so a follower learns it at most a heartbeat
late. Commits, acknowledgements and the leader's answers do not wait for it (a follower's
commit index is only what it may apply; Kafka's followers likewise learn the high
watermark with their next fetch). Two exceptions: the commit index that covers a command
a follower forwarded goes to it at once (`_commits_forwarded`: it answers that proposal
once it applied it), and a group added with prompt_commit_index (the metadata group,
whose catalogue every broker reads from its own replica) holds nothing back. Sequential
proposals on 3 in-process nodes: the leader sent 4.5-4.6 frames per proposal before,
2.4-2.5 after; 3.2-3.3 ms a proposal before, 2.4-2.8 after (bench/README.md).

Threading: every method except `wake()` runs on RaftNode's tick thread.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pysyncobj import FAIL_REASON
from pysyncobj.node import Node
from pysyncobj.transport import Transport

from raft import auth, wire
from raft.config import FRAME_BYTES_MAX, RaftConfig
from raft.errors import AuthFailed, PeerRefused
from raft.messages import SentMark, carries_nothing_new, trim_outgoing_append_entries
from raft.refusals import PeerRefusals
from raft.tls import RaftTls

logger = logging.getLogger(__name__)

_FRAME_HEADER = struct.Struct("<II")  # length (of group_id + payload), group_id
FRAME_HEADER_BYTES = _FRAME_HEADER.size
GROUP_ID_MAX = 0xFFFFFFFE
# Control frames: the hello (raft/auth.py) first on a connection, then, empty, the node
# heartbeat.
HELLO_GROUP_ID = 0xFFFFFFFF
# Bytes read from one socket per readiness event, so one busy peer cannot starve the others.
RECV_BYTES_PER_EVENT = 4 * 1024 * 1024
RECV_CHUNK_BYTES = 256 * 1024
# Before its hello checks out, a connection is read this much per event at most: a stranger
# cannot make this node buffer more than one hello frame.
RECV_BYTES_BEFORE_HELLO = FRAME_HEADER_BYTES + auth.HELLO_FRAME_BYTES_MAX
# What a non-blocking socket raises when it cannot go on now; a TLS socket (raft/tls.py)
# may want to read to write or write to read.
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class FrameError(PeerRefused):
    """A peer sent bytes that are not a valid frame stream; its connection is closed."""


def encode_frame(group_id: int, payload: bytes) -> bytes:
    """One frame as bytes (for tests and control frames; the hot path uses Network.send)."""
    out = bytearray()
    append_frame(out, group_id, payload)
    return bytes(out)


def append_frame(buffer: bytearray, group_id: int, payload: bytes) -> None:
    if not 0 <= group_id <= HELLO_GROUP_ID:
        raise FrameError(f"group id {group_id} out of range")
    length = 4 + len(payload)
    if length > FRAME_BYTES_MAX:
        raise FrameError(f"frame of {length} bytes is over FRAME_BYTES_MAX")
    buffer += _FRAME_HEADER.pack(length, group_id)
    buffer += payload


class FrameDecoder:
    """Splits a byte stream into (group_id, payload) frames.

    Invariant: bytes before `_read_pos` in `_buffer` are consumed; the buffer is compacted
    once per `frames()` / `views()` pass, which CPython's bytearray does in O(1) for a
    prefix. `frame_bytes_max` may be raised between frames (after a hello checks out).
    """

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX) -> None:
        self._buffer = bytearray()
        self.frame_bytes_max = frame_bytes_max

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def frames(self) -> list[tuple[int, bytes]]:
        """Every complete frame fed so far, in order, as copies (tests and tools)."""
        return [(group_id, view.tobytes()) for group_id, view in self.views()]

    def views(self) -> Iterator[tuple[int, memoryview]]:
        """Each complete frame in order, as a view of the buffer, valid only until the next
        one is asked for: decode it, do not keep it. Partial frames stay buffered."""
        buffer = self._buffer
        position = 0
        try:
            with memoryview(buffer) as view:
                while len(buffer) - position >= FRAME_HEADER_BYTES:
                    length, group_id = _FRAME_HEADER.unpack_from(buffer, position)
                    if length < 4 or length > self.frame_bytes_max:
                        raise FrameError(f"frame length {length} out of range")
                    end = position + 4 + length
                    if end > len(buffer):
                        break
                    with view[position + FRAME_HEADER_BYTES : end] as payload:
                        yield group_id, payload
                    position = end
        finally:
            del buffer[:position]


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {address!r} is not host:port")
    return host, int(port)


MessageHandler = Callable[[int, str, Any], None]  # (group_id, peer_id, message)
PeerHandler = Callable[[str], None]  # (peer_id)


@dataclass(slots=True)
class NetworkStats:
    frames_sent: int = 0
    frames_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    frames_dropped_full: int = 0  # a peer's send buffer was full
    frames_dropped_down: int = 0  # the peer was not connected
    frames_unknown_group: int = 0
    pings_sent: int = 0  # node heartbeats (empty hello-group frames), not in frames_sent
    connects: int = 0
    disconnects: int = 0
    votes_dropped_non_member: int = 0  # request_vote from outside a group's configuration
    appends_held_back: int = 0  # empty append_entries not sent (GroupTransport.send)
    handshakes_refused: int = 0  # a hello that failed raft/auth.py, or none in time
    messages_refused: int = 0  # after the hello: a frame wire.py or safe_pickle.py refused
    messages_unsendable: int = 0  # a message of ours the codec refused (a bug: logged)


@dataclass(slots=True, eq=False)
class _Outbound:
    """Our connection to one peer: we only send on it (after reading its challenge)."""

    peer_id: str
    address: tuple[str, int]
    sock: socket.socket | None = None
    connected: bool = False  # TCP is up; the TLS handshake or the challenge is under way
    handshaking: bool = False  # TLS (raft/tls.py): the handshake is not finished
    tls_error: str = ""  # the last TLS failure, logged once until it changes
    up: bool = False  # the hello is queued: frames may be sent
    challenge: bytearray = field(default_factory=bytearray)
    handshake_deadline: float = 0.0
    held: bytearray = field(default_factory=bytearray)  # queued this tick, not yet durable
    out: bytearray = field(default_factory=bytearray)  # released, not yet written
    next_attempt_at: float = 0.0
    last_sent_at: float = 0.0  # a frame queued (held or not): no node heartbeat needed


@dataclass(slots=True, eq=False)
class _Inbound:
    """A connection a peer opened to us: we only receive on it (after our challenge)."""

    sock: socket.socket
    decoder: FrameDecoder
    nonce: bytes
    address: str
    handshake_deadline: float
    out: bytearray  # the challenge, until written
    peer_id: str | None = None  # set once its hello checks out
    handshaking: bool = False  # TLS (raft/tls.py): the handshake is not finished


class Network:
    """The node's sockets, multiplexing every group (module docstring)."""

    def __init__(
        self,
        node_id: str,
        address: str,
        peers: dict[str, str],
        config: RaftConfig,
        *,
        on_message: MessageHandler,
        on_peer_up: PeerHandler,
        on_peer_down: PeerHandler,
        secret: bytes | None = None,
        cluster_id: bytes = b"",
        tls: RaftTls | None = None,
    ) -> None:
        self.node_id = node_id
        # raft/tls.py: every connection is TLS (mutual, as the contexts say); None: plain.
        self._tls = tls
        # TLS connections holding decrypted bytes not read yet: the selector cannot see
        # them (they left the kernel), so poll() reads them without waiting.
        self._backlog: set[_Inbound] = set()
        self.address = parse_address(address)
        self._config = config
        # GroupTransport: an empty append_entries waits this long after the last one to a
        # peer (half a heartbeat, so a follower still hears its leader every heartbeat).
        self.append_gap_s = config.heartbeat_interval_s / 2
        self._secret = secret
        # raft/auth.py: named in our hellos, and a hello naming another is refused. b"" while
        # the caller knows none; it may set it once it does (one reference assignment).
        self.cluster_id = cluster_id
        self.refusals = PeerRefusals()  # raft/refusals.py: who may not be a peer now
        self._on_message = on_message
        self._on_peer_up = on_peer_up
        self._on_peer_down = on_peer_down
        self._outbound = {
            peer_id: _Outbound(peer_id, parse_address(peer_address))
            for peer_id, peer_address in peers.items()
            if peer_id != node_id
        }
        self._inbound: dict[socket.socket, _Inbound] = {}
        # Accepted connections whose hello has not checked out yet (bounded, timed out).
        self._pending: set[_Inbound] = set()
        self._refusal_logged_at: dict[str, float] = {}  # host -> next refusal to log
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._ping = encode_frame(HELLO_GROUP_ID, b"")
        self.stats = NetworkStats()
        # peer id -> time.monotonic() of the last frame received from it (any group).
        self.last_heard: dict[str, float] = {}

    # --- lifecycle --------------------------------------------------------------------------

    def open(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(self.address)
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, ("accept", None))

    def close(self) -> None:
        for link in self._outbound.values():
            self._close_outbound(link, notify=False)
        for conn in list(self._inbound.values()):
            self._close_inbound(conn)
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def wake(self) -> None:
        """Interrupt poll() from any thread."""
        # BlockingIOError: full, so a wake-up is pending anyway; OSError: closed (stopping).
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"\0")

    def add_peer(self, peer_id: str, address: str) -> None:
        """A peer that joined at run time (or moved): connected to at the next maintain()."""
        old = self._outbound.get(peer_id)
        if old is not None:
            self._close_outbound(old, notify=True)
        if peer_id != self.node_id:
            self._outbound[peer_id] = _Outbound(peer_id, parse_address(address))

    # --- sending ----------------------------------------------------------------------------

    def is_up(self, peer_id: str) -> bool:
        link = self._outbound.get(peer_id)
        return link is not None and link.up

    def up_peers(self) -> list[str]:
        return [peer_id for peer_id, link in self._outbound.items() if link.up]

    def send(self, peer_id: str, group_id: int, message: Any, *, hold: bool) -> bool:
        """Queue a message; False if it was dropped (peer down, or its buffer full).

        hold=True: it leaves at the next release(), after the journals are durable (replies
        and votes). hold=False: it leaves at the next write_unheld() (append_entries: see
        raft/README.md, "Durability", for why the leader's need not wait).
        """
        link = self._outbound.get(peer_id)
        if link is None or not link.up:
            self.stats.frames_dropped_down += 1
            return False
        buffer = link.held if hold else link.out
        start = len(buffer)
        buffer += _FRAME_HEADER.pack(0, group_id)  # length patched below, once known
        try:
            size = wire.encode_into(buffer, message)
        except wire.WireError as error:
            del buffer[start:]
            self.stats.messages_unsendable += 1
            logger.error("message to %s not sent, the codec refuses it: %s", peer_id, error)
            return False
        queued = len(link.held) + len(link.out) - FRAME_HEADER_BYTES - size
        if queued + size > self._config.peer_send_buffer_bytes_max:
            del buffer[start:]
            self.stats.frames_dropped_full += 1
            return False
        _FRAME_HEADER.pack_into(buffer, start, 4 + size, group_id)
        self.stats.frames_sent += 1
        link.last_sent_at = time.monotonic()
        return True

    def write_unheld(self) -> None:
        """Write what send(hold=False) queued (and anything a full socket left behind)."""
        for link in self._outbound.values():
            if link.out:
                self._write(link)

    def has_held(self) -> bool:
        """Whether a frame is held (waiting for RaftNode's sync step to let it go)."""
        return any(link.held for link in self._outbound.values())

    def drop_held(self) -> None:
        """Drop every held frame (a journal failed to sync: see RaftNode._sync_and_release)."""
        for link in self._outbound.values():
            link.held.clear()

    def release(self) -> None:
        """Let every held frame go: the caller has made the journals durable."""
        for link in self._outbound.values():
            if not link.held:
                continue
            link.out += link.held
            link.held.clear()
            self._write(link)

    # --- the poll step ----------------------------------------------------------------------

    def poll(self, timeout_s: float) -> None:
        """Wait up to timeout_s for socket events and handle them; messages go to on_message."""
        for key, mask in self._selector.select(0 if self._backlog else timeout_s):
            kind, obj = key.data
            if kind == "wake":
                self._drain_wake()
            elif kind == "accept":
                self._accept()
            elif kind == "in":
                self._inbound_event(obj, mask)
            elif kind == "out":
                self._outbound_event(obj, mask)
        backlog, self._backlog = self._backlog, set()
        for conn in backlog:
            if conn.sock in self._inbound:
                self._read_inbound(conn)

    def maintain(self, now: float) -> None:
        """Start connections to peers that are down, at most every connect_retry_s; queue a
        node heartbeat to every connected peer sent nothing for a heartbeat_interval_s;
        close connections whose handshake did not finish within HANDSHAKE_TIMEOUT_S."""
        for link in self._outbound.values():
            if self.refusals.check(link.peer_id) is not None:  # both directions cut
                self._close_outbound(link, notify=True)
                for conn in [c for c in self._inbound.values() if c.peer_id == link.peer_id]:
                    self._close_inbound(conn)
            elif link.sock is None and now >= link.next_attempt_at:
                self._connect(link, now)
            elif link.up and now - link.last_sent_at >= self._config.heartbeat_interval_s:
                link.out += self._ping  # leaves at the round's write_unheld()
                link.last_sent_at = now
                self.stats.pings_sent += 1
            elif link.sock is not None and not link.up and now >= link.handshake_deadline:
                logger.info(
                    "no handshake with %s within %.1f s", link.peer_id, auth.HANDSHAKE_TIMEOUT_S
                )
                self._close_outbound(link, notify=False)
        for conn in [c for c in self._pending if now >= c.handshake_deadline]:
            self._refuse(conn, AuthFailed("no valid hello in time"))

    # --- outbound ---------------------------------------------------------------------------

    def _connect(self, link: _Outbound, now: float) -> None:
        link.next_attempt_at = now + self._config.connect_retry_s
        link.handshake_deadline = now + auth.HANDSHAKE_TIMEOUT_S
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            # We never read on this connection after the challenge, so a peer cut off
            # without a reset (a network partition) is noticed only when the kernel gives up
            # on unacknowledged data.
            timeout_ms = int(self._config.peer_unacked_timeout_s * 1000)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, timeout_ms)
        try:
            # Bind to our own address: peers (and the fault harness) see this node's IP.
            sock.bind((self.address[0], 0))
            result = sock.connect_ex(link.address)
        except OSError as error:
            logger.debug("connect to %s failed: %s", link.peer_id, error)
            sock.close()
            return
        if result not in (0, errno.EINPROGRESS):
            sock.close()
            return
        link.sock = sock
        self._selector.register(sock, selectors.EVENT_WRITE, ("out", link))

    def _outbound_event(self, link: _Outbound, mask: int) -> None:
        sock = link.sock
        if sock is None:
            return
        if not link.connected:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                self._close_outbound(link, notify=False)
                return
            # Connected: wait for the peer's challenge before sending anything (step 2 of
            # raft/auth.py), after the TLS handshake if any.
            link.connected = True
            if self._tls is not None:
                self._start_tls_outbound(link, sock)
                return
            self._selector.modify(sock, selectors.EVENT_READ, ("out", link))
            return
        if link.handshaking:
            self._continue_tls_outbound(link)
            return
        if not link.up:
            self._read_challenge(link)
            return
        if mask & selectors.EVENT_READ:
            # The peer never sends after its challenge: readable means closed or reset.
            try:
                data = sock.recv(4096)
            except _WOULD_BLOCK:  # TLS: a record with no data (a session ticket)
                data = b"?"
            except OSError:
                data = b""
            if not data:
                self._close_outbound(link, notify=True)
                return
        if mask & selectors.EVENT_WRITE:
            self._write(link)

    def _start_tls_outbound(self, link: _Outbound, sock: socket.socket) -> None:
        """raft/tls.py: wrap the connected socket; the handshake runs on its events. The
        peer's certificate must name its address as the peers map has it."""
        assert self._tls is not None
        self._selector.unregister(sock)
        try:
            link.sock = self._tls.client.wrap_socket(
                sock, server_hostname=link.address[0], do_handshake_on_connect=False
            )
        except (OSError, ValueError) as error:
            sock.close()
            link.sock = None
            self._tls_failed(link, error)
            return
        link.handshaking = True
        self._selector.register(link.sock, selectors.EVENT_WRITE, ("out", link))
        self._continue_tls_outbound(link)

    def _continue_tls_outbound(self, link: _Outbound) -> None:
        assert isinstance(link.sock, ssl.SSLSocket)
        try:
            wanted = _step_handshake(link.sock)
        except (OSError, ValueError) as error:
            self._close_outbound(link, notify=False)
            self._tls_failed(link, error)
            return
        if wanted is not None:
            self._selector.modify(link.sock, wanted, ("out", link))
            return
        link.handshaking = False
        link.tls_error = ""
        self._selector.modify(link.sock, selectors.EVENT_READ, ("out", link))
        self._read_challenge(link)  # it may have come with the handshake's last flight

    def _tls_failed(self, link: _Outbound, error: Exception) -> None:
        """One warning per kind of failure (a misconfigured peer is retried every
        connect_retry_s), then debug lines until it changes."""
        text = f"{type(error).__name__}: {error}"
        level = logging.DEBUG if text == link.tls_error else logging.WARNING
        link.tls_error = text
        logger.log(level, "TLS handshake with %s failed: %s", link.peer_id, text)

    def _read_challenge(self, link: _Outbound) -> None:
        """Step 2 of raft/auth.py: read the challenge, queue the hello, the link is up."""
        assert link.sock is not None
        try:
            data = link.sock.recv(auth.CHALLENGE_BYTES - len(link.challenge))
        except _WOULD_BLOCK:
            return
        except OSError:
            data = b""
        if not data:
            self._close_outbound(link, notify=False)
            return
        link.challenge += data
        if len(link.challenge) < auth.CHALLENGE_BYTES:
            return
        try:
            nonce = auth.read_challenge(bytes(link.challenge))
        except AuthFailed as error:
            logger.warning("closing connection to %s: %s", link.peer_id, error)
            self._close_outbound(link, notify=False)
            return
        hello = auth.hello_payload(self._secret, nonce, self.node_id, link.peer_id, self.cluster_id)
        link.challenge.clear()
        link.out[:0] = encode_frame(HELLO_GROUP_ID, hello)
        link.up = True
        self.stats.connects += 1
        self._on_peer_up(link.peer_id)
        self._write(link)

    def _write(self, link: _Outbound) -> None:
        sock = link.sock
        if sock is None or not link.up:
            return
        while link.out:
            try:
                sent = sock.send(link.out)
            except _WOULD_BLOCK:
                break
            except OSError:
                self._close_outbound(link, notify=True)
                return
            self.stats.bytes_sent += sent
            del link.out[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if link.out else 0)
        if self._selector.get_key(sock).events != events:
            self._selector.modify(sock, events, ("out", link))

    def _close_outbound(self, link: _Outbound, *, notify: bool) -> None:
        was_up = link.up
        if link.sock is not None:
            self._selector.unregister(link.sock)
            link.sock.close()
            link.sock = None
        link.up = False
        link.connected = False
        link.handshaking = False
        link.challenge.clear()
        link.held.clear()
        link.out.clear()
        if was_up:
            self.stats.disconnects += 1
            if notify:
                self._on_peer_down(link.peer_id)

    # --- inbound ----------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                logger.warning("accept failed: %s", error)
                return
            if self._too_many_pending(address[0]):
                self.stats.handshakes_refused += 1
                sock.close()
                continue
            sock.setblocking(False)
            if self._tls is not None:
                try:
                    sock = self._tls.server.wrap_socket(
                        sock, server_side=True, do_handshake_on_connect=False
                    )
                except (OSError, ValueError) as error:
                    logger.warning("TLS from %s failed: %s", address[0], error)
                    self.stats.handshakes_refused += 1
                    sock.close()
                    continue
            challenge, nonce = auth.new_challenge()
            conn = _Inbound(
                sock,
                FrameDecoder(auth.HELLO_FRAME_BYTES_MAX),
                nonce,
                f"{address[0]}:{address[1]}",
                time.monotonic() + min(auth.HANDSHAKE_TIMEOUT_S, auth.ACCEPTED_HANDSHAKE_TIMEOUT_S),
                bytearray(challenge),
            )
            self._inbound[sock] = conn
            self._pending.add(conn)
            self._selector.register(sock, selectors.EVENT_READ, ("in", conn))
            if self._tls is not None:
                conn.handshaking = True
                self._continue_tls_inbound(conn)
            else:
                self._write_challenge(conn)  # step 1 of raft/auth.py

    def _too_many_pending(self, host: str) -> bool:
        """Whether a connection from `host` finds no handshake slot (raft/auth.py); logged
        once per address per HANDSHAKE_TIMEOUT_S: a flood of refusals is not of lines."""
        hosts = [c.address.rpartition(":")[0] for c in self._pending]
        why = auth.handshake_slot_refusal(hosts, host)
        if why is not None and time.monotonic() >= self._refusal_logged_at.get(host, 0.0):
            if len(self._refusal_logged_at) > auth.PENDING_HANDSHAKES_MAX:
                self._refusal_logged_at.clear()  # bounded: one entry per refused address
            self._refusal_logged_at[host] = time.monotonic() + auth.HANDSHAKE_TIMEOUT_S
            logger.warning("refused connection from %s: %s", host, why)
        return why is not None

    def _continue_tls_inbound(self, conn: _Inbound) -> None:
        """The TLS handshake of an accepted connection, then the challenge. A peer without
        a certificate of the cluster's CA is refused here (one warning)."""
        assert isinstance(conn.sock, ssl.SSLSocket)
        try:
            wanted = _step_handshake(conn.sock)
        except (OSError, ValueError) as error:
            self._refuse(conn, AuthFailed(f"TLS handshake failed: {error}"))
            return
        if wanted is not None:
            self._selector.modify(conn.sock, wanted, ("in", conn))
            return
        conn.handshaking = False
        self._selector.modify(conn.sock, selectors.EVENT_READ, ("in", conn))
        self._write_challenge(conn)  # step 1 of raft/auth.py

    def _write_challenge(self, conn: _Inbound) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except _WOULD_BLOCK:
            sent = 0
        except OSError:
            self._close_inbound(conn)
            return
        del conn.out[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        if self._selector.get_key(conn.sock).events != events:
            self._selector.modify(conn.sock, events, ("in", conn))

    def _inbound_event(self, conn: _Inbound, mask: int) -> None:
        if conn.handshaking:
            self._continue_tls_inbound(conn)
            return
        if mask & selectors.EVENT_WRITE and conn.out:
            self._write_challenge(conn)
        if mask & selectors.EVENT_READ and conn.sock in self._inbound:
            self._read_inbound(conn)

    def _read_inbound(self, conn: _Inbound) -> None:
        received = 0
        tls = isinstance(conn.sock, ssl.SSLSocket)
        while True:
            # Before the hello: one hello's worth of bytes per event, no more.
            budget = RECV_BYTES_PER_EVENT if conn.peer_id else RECV_BYTES_BEFORE_HELLO
            if received >= budget:
                break
            chunk = min(RECV_CHUNK_BYTES, budget - received)
            try:
                data = conn.sock.recv(chunk)
            except _WOULD_BLOCK:
                break
            except OSError:
                data = b""
            if not data:
                self._dispatch(conn)
                self._close_inbound(conn)
                return
            received += len(data)
            conn.decoder.feed(data)
            # A TLS recv returns one record (16 KiB) at most: read on until it would block.
            if (len(data) < chunk and not tls) or conn.peer_id is None:
                break
        self.stats.bytes_received += received
        self._dispatch(conn)
        if tls and conn.sock in self._inbound and conn.sock.pending():  # type: ignore[attr-defined]
            self._backlog.add(conn)

    def _dispatch(self, conn: _Inbound) -> None:
        if conn.sock not in self._inbound:
            return
        if conn.peer_id is not None:
            self.last_heard[conn.peer_id] = time.monotonic()
        try:
            for group_id, payload in conn.decoder.views():
                if conn.peer_id is None:
                    self._on_hello(conn, group_id, payload)
                    continue
                if group_id == HELLO_GROUP_ID:
                    if len(payload):
                        raise FrameError("a second hello on one connection")
                    continue  # a node heartbeat: last_heard is set above
                message = wire.decode_message(payload)
                self.stats.frames_received += 1
                self._on_message(group_id, conn.peer_id, message)
        except PeerRefused as error:
            self._refuse(conn, error)

    def _on_hello(self, conn: _Inbound, group_id: int, payload: memoryview) -> None:
        """Step 3 of raft/auth.py; AuthFailed closes the connection (in _dispatch)."""
        if group_id != HELLO_GROUP_ID:
            raise AuthFailed("the first frame is not a hello")
        hello = auth.check_hello(self._secret, conn.nonce, payload.tobytes(), self.node_id)
        peer_id = hello.sender
        if peer_id not in self._outbound:
            raise AuthFailed(f"hello from {peer_id!r}, which is not a broker of this cluster")
        auth.check_cluster(self.cluster_id, hello)
        if (refusal := self.refusals.check(peer_id)) is not None:
            raise AuthFailed(f"hello from {peer_id!r}: {refusal}")
        for other in list(self._inbound.values()):
            if other is not conn and other.peer_id == peer_id:
                self._close_inbound(other)  # the peer restarted and reconnected
        conn.peer_id = peer_id
        self._pending.discard(conn)
        conn.decoder.frame_bytes_max = FRAME_BYTES_MAX
        self.last_heard[peer_id] = time.monotonic()

    def _refuse(self, conn: _Inbound, error: PeerRefused) -> None:
        """One warning line, and the connection closed (nothing more read from it)."""
        if conn.peer_id is None:
            self.stats.handshakes_refused += 1
        else:
            self.stats.messages_refused += 1
        who = conn.address if conn.peer_id is None else f"{conn.peer_id} ({conn.address})"
        logger.warning("closing connection from %s: %s: %s", who, type(error).__name__, error)
        self._close_inbound(conn)

    def _close_inbound(self, conn: _Inbound) -> None:
        self._pending.discard(conn)
        self._backlog.discard(conn)
        if self._inbound.pop(conn.sock, None) is None:
            return
        self._selector.unregister(conn.sock)
        conn.sock.close()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass


def _step_handshake(sock: ssl.SSLSocket) -> int | None:
    """One step of a non-blocking TLS handshake: None when done, else the selector events
    to wait for. Raises ssl.SSLError (a certificate refused) or OSError."""
    try:
        sock.do_handshake()
    except ssl.SSLWantReadError:
        return selectors.EVENT_READ
    except ssl.SSLWantWriteError:
        return selectors.EVENT_WRITE
    return None


# Messages that acknowledge nothing about the sender's journal may leave before it is synced.
# append_entries: a leader commits an entry only in a tick after the one that appended it,
# and every tick ends with a sync, so its own copy is durable before it counts itself.
UNHELD_MESSAGE_TYPES = frozenset({"append_entries", "apply_command", "apply_command_response"})


def _cap_entries(message: dict[str, Any]) -> dict[str, Any]:
    """At most APPEND_ENTRIES_ENTRIES_MAX entries (what a receiver's codec accepts): the
    follower acknowledges the prefix, and pysyncobj sends the rest from there. pysyncobj
    bounds a message by bytes only, so only a catch-up over many tiny entries hits this."""
    entries = message.get("entries")
    if entries is None or len(entries) <= wire.APPEND_ENTRIES_ENTRIES_MAX:
        return message
    return {**message, "entries": entries[: wire.APPEND_ENTRIES_ENTRIES_MAX]}


class GroupTransport(Transport):  # type: ignore[misc]  # pysyncobj is untyped
    """pysyncobj's Transport for one group: sends through the node's Network.

    SyncObj builds it through `transportClass(syncObj, selfNode, otherNodes)`; RaftNode
    passes a factory that binds `network`, `group_id` and `term_at` (the term of an entry in
    this group's journal). Peers are pysyncobj Nodes whose id is the peer's node id.

    It also trims the leader's append_entries to what each follower has not been sent yet
    (raft/messages.py), remembering per peer the last index sent in the current term.
    """

    def __init__(
        self,
        syncObj: Any,
        selfNode: Any,
        otherNodes: Any,
        *,
        network: Network,
        group_id: int,
        term_at: Callable[[int], int | None],
    ) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self._sync_obj = syncObj
        if not 0 <= group_id <= GROUP_ID_MAX:
            raise ValueError(f"group id {group_id} out of range [0, {GROUP_ID_MAX}]")
        self._network = network
        self.group_id = group_id
        self._term_at = term_at
        self._nodes: dict[str, Any] = {node.id: node for node in otherNodes}
        self._sent: dict[str, SentMark] = {}  # peer id -> (term, last index sent)
        self._last_append: dict[str, float] = {}  # peer id -> when an append_entries left
        # peer id -> the highest log index of a command it forwarded here (apply_command),
        # as told in our apply_command_response: it waits to apply it, so the commit
        # index that covers it is sent at once, never held back.
        self._forwarded: dict[str, int] = {}
        self._append_gap_s = network.append_gap_s
        # False for a group whose followers' state machines are read directly and must
        # trail the leader's by a round at most (RaftNode.add_group, prompt_commit_index).
        self.lazy_commit_index = True
        # Frames taken from a leader this group's configuration does not name (deliver).
        self.frames_from_unnamed_leader = 0

    @property
    def ready(self) -> bool:
        return True

    def tryGetReady(self) -> None:  # noqa: N802 - pysyncobj's name
        pass

    def waitReady(self) -> None:  # noqa: N802
        pass

    def addNode(self, node: Any) -> None:  # noqa: N802
        # A member added at run time (raft/membership.py): pysyncobj sends append_entries
        # only to nodes it was told are connected, so tell it now if the link is up.
        self._nodes[node.id] = node
        if self._network.is_up(node.id):
            self._onNodeConnected(node)

    def dropNode(self, node: Any) -> None:  # noqa: N802
        if self._nodes.pop(node.id, None) is not None:
            self._onNodeDisconnected(node)
        for per_peer in (self._sent, self._last_append, self._forwarded):
            per_peer.pop(node.id, None)

    def send(self, node: Any, message: Any) -> bool:
        peer_id = node.id
        kind = message.get("type") if isinstance(message, dict) else None
        mark = None
        if kind == "append_entries":
            message = _cap_entries(message)
            message, mark = trim_outgoing_append_entries(
                message, self._sent.get(peer_id), self._term_at
            )
            now = time.monotonic()
            if (
                self.lazy_commit_index
                and carries_nothing_new(message)
                and now - self._last_append.get(peer_id, -self._append_gap_s) < self._append_gap_s
                and not self._commits_forwarded(peer_id, message)
            ):
                # The commit index pysyncobj passes on after every commit: it rides on the
                # next append_entries with entries, or on the heartbeat, instead of costing
                # a frame each way per commit (module docstring, "Commit index").
                self._network.stats.appends_held_back += 1
                return True
            self._last_append[peer_id] = now
        sent = self._network.send(
            peer_id, self.group_id, message, hold=kind not in UNHELD_MESSAGE_TYPES
        )
        if kind == "append_entries":
            if sent and mark is not None:
                self._sent[peer_id] = mark
            else:
                self._sent.pop(peer_id, None)
            if sent and self._commits_forwarded(peer_id, message):
                del self._forwarded[peer_id]  # this one tells it: nothing left waiting
        elif kind == "apply_command" and not sent and "request_id" in message:
            self._unsent_command(message["request_id"])
        elif kind == "apply_command_response" and isinstance(message.get("log_idx"), int):
            self._forwarded[peer_id] = max(self._forwarded.get(peer_id, 0), message["log_idx"])
        return sent

    def _commits_forwarded(self, peer_id: str, message: dict[str, Any]) -> bool:
        """Whether this append_entries commits a command `peer_id` forwarded (its proposer
        waits for the follower to apply it: a held-back commit index would add up to a
        heartbeat to every proposal made through a follower)."""
        waiting = self._forwarded.get(peer_id)
        return waiting is not None and message.get("commit_index", 0) >= waiting

    def _unsent_command(self, request_id: int) -> None:
        """A command a follower forwarded to its leader that never left (the link is down:
        a cut, the leader restarting, a reconnect after a heal; or its buffer is full):
        pysyncobj ignores send()'s answer and would wait for a reply that cannot come,
        until the proposer's deadline. It is in no log, so it fails now as NOT_LEADER
        (raft/errors.py NotLeader: not applied) and the facade proposes it again."""
        waiting = self._sync_obj._SyncObj__commandsWaitingReply
        callback = waiting.pop(request_id, None)
        if callback is not None:
            callback(None, FAIL_REASON.NOT_LEADER)

    def destroy(self) -> None:
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)

    # Called by RaftNode on the tick thread.

    def deliver(self, peer_id: str, message: Any) -> None:
        node = self._nodes.get(peer_id)
        if node is None:
            node = self._unnamed_leader(peer_id, message)
            if node is None:
                return  # a non-member that does not lead: nothing it says concerns us
        if (
            isinstance(message, dict)
            and message.get("type") == "next_node_idx"
            and (message.get("reset") or not message.get("success"))
        ):
            # The follower's log is not what we sent it: send in full from where it says.
            self._sent.pop(peer_id, None)
        self._onMessageReceived(node, message)

    def _unnamed_leader(self, peer_id: str, message: Any) -> Any:
        """A peer outside this replica's configuration that leads the group: a Node to
        answer it through (not kept), else None.

        Raft takes a follower's configuration from its log, and a follower obeys whoever
        sends append_entries of its term or a later one, named in its configuration or
        not: the entry that adds the leader may be among those it has yet to receive.
        Dropping such a leader's frames left a follower stranded for good: a broker
        promoting to metadata voter, added by one leader, which died before it sent the
        entry adding the next voter; that voter then led, and the promoting broker never
        heard from it (raft/README.md, "Metadata voter changes"). Its later messages
        (answers to forwarded commands, read confirmations) pass while it is the leader
        this replica follows. Votes from a non-member stay dropped (RaftNode): one cannot
        win, so it never leads, and group ids are never reused, so no leader of another
        incarnation of the group sends here."""
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "append_entries":
            term = message.get("term")
            if not isinstance(term, int) or term < self._sync_obj.raftCurrentTerm:
                return None
        else:
            leader = self._sync_obj._getLeader()
            if leader is None or leader.id != peer_id:
                return None
        self.frames_from_unnamed_leader += 1
        return Node(peer_id)

    def peer_up(self, peer_id: str) -> None:
        node = self._nodes.get(peer_id)
        if node is not None:
            self._onNodeConnected(node)

    def peer_down(self, peer_id: str) -> None:
        self._sent.pop(peer_id, None)  # what was in flight may be lost
        node = self._nodes.get(peer_id)
        if node is not None:
            self._onNodeDisconnected(node)

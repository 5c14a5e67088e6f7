"""One TCP address per node for all its Raft groups, with replies held until the journal is durable.

Three pieces:

- the frame codec: `u32 length | u32 group_id | payload`, little-endian, where length counts
  group_id and payload; payload is a pickled pysyncobj message (no zlib: pysyncobj's
  messages are mostly already-compact command bytes, and compressing them cost more than it
  saved here). `FrameDecoder` parses a stream with one bytearray and a read position, so a
  large message costs O(size), not O(size^2) as pysyncobj's `bytes +=` buffer did;
- `Network`: the node's listening socket, one outgoing connection per peer (bound to the
  node's own address before connect, so the fault harness can give each node its own
  loopback address), accepted incoming connections, and a selector. Connections carry frames
  one way: a node sends on the connection it opened and receives on those it accepted, so
  there is no race over who connects. The first frame on a connection is a hello naming the
  sender. Frames for unknown groups are dropped (the group may not exist here yet);
- `GroupTransport`: pysyncobj's Transport for one group, which only forwards to Network.

Node-level liveness (for quiesced groups, raft/node.py): `Network.last_heard[peer]` is when
a frame of any group last arrived from that peer, and a peer that was sent nothing for a
heartbeat_interval_s gets the hello frame again as a node heartbeat (`pings_sent`). So a
node that is alive is heard from every heartbeat_interval_s whatever its groups do.

Durability rule: `Network.send` never writes to a socket. It appends the frame to the peer's
*held* buffer; RaftNode calls `release()` after it has synced every journal changed during
the tick, and only then do held frames move to the send buffer. So no message can leave
before the journal writes that preceded it are on disk (raft/README.md, "Durability").

Threading: every method except `wake()` runs on RaftNode's tick thread.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import pickle
import selectors
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pysyncobj.transport import Transport

from raft.config import FRAME_BYTES_MAX, RaftConfig
from raft.errors import RaftError
from raft.messages import SentMark, trim_outgoing_append_entries

logger = logging.getLogger(__name__)

_FRAME_HEADER = struct.Struct("<II")  # length (of group_id + payload), group_id
FRAME_HEADER_BYTES = _FRAME_HEADER.size
GROUP_ID_MAX = 0xFFFFFFFE
HELLO_GROUP_ID = 0xFFFFFFFF  # control frame: the sender's node id, first on a connection
PROTOCOL_VERSION = 1
# Bytes read from one socket per readiness event, so one busy peer cannot starve the others.
RECV_BYTES_PER_EVENT = 4 * 1024 * 1024
RECV_CHUNK_BYTES = 256 * 1024


class FrameError(RaftError):
    """A peer sent bytes that are not a valid frame stream; its connection is closed."""


def encode_frame(group_id: int, payload: bytes) -> bytes:
    """One frame as bytes (for tests and hello frames; the hot path uses append_frame)."""
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
    once per `frames()` call, which CPython's bytearray does in O(1) for a prefix.
    """

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX) -> None:
        self._buffer = bytearray()
        self._frame_bytes_max = frame_bytes_max

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def frames(self) -> list[tuple[int, bytes]]:
        """Every complete frame fed so far, in order; partial ones stay buffered."""
        out: list[tuple[int, bytes]] = []
        buffer = self._buffer
        position = 0
        size = len(buffer)
        with memoryview(buffer) as view:
            while size - position >= FRAME_HEADER_BYTES:
                length, group_id = _FRAME_HEADER.unpack_from(buffer, position)
                if length < 4 or length > self._frame_bytes_max:
                    raise FrameError(f"frame length {length} out of range")
                end = position + 4 + length
                if end > size:
                    break
                out.append((group_id, view[position + FRAME_HEADER_BYTES : end].tobytes()))
                position = end
        del buffer[:position]
        return out


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
    pings_sent: int = 0  # node heartbeats (the hello frame again), not counted in frames_sent
    connects: int = 0
    disconnects: int = 0
    votes_dropped_non_member: int = 0  # request_vote from outside a group's configuration


@dataclass(slots=True, eq=False)
class _Outbound:
    """Our connection to one peer: we only send on it."""

    peer_id: str
    address: tuple[str, int]
    sock: socket.socket | None = None
    up: bool = False
    held: bytearray = field(default_factory=bytearray)  # queued this tick, not yet durable
    out: bytearray = field(default_factory=bytearray)  # released, not yet written
    next_attempt_at: float = 0.0
    last_sent_at: float = 0.0  # a frame queued (held or not): no node heartbeat needed


@dataclass(slots=True, eq=False)
class _Inbound:
    """A connection a peer opened to us: we only receive on it."""

    sock: socket.socket
    decoder: FrameDecoder
    peer_id: str | None = None


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
    ) -> None:
        self.node_id = node_id
        self.address = parse_address(address)
        self._config = config
        self._on_message = on_message
        self._on_peer_up = on_peer_up
        self._on_peer_down = on_peer_down
        self._outbound = {
            peer_id: _Outbound(peer_id, parse_address(peer_address))
            for peer_id, peer_address in peers.items()
            if peer_id != node_id
        }
        self._inbound: dict[socket.socket, _Inbound] = {}
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._hello = encode_frame(
            HELLO_GROUP_ID, pickle.dumps({"node_id": node_id, "version": PROTOCOL_VERSION})
        )
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
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        queued = len(link.held) + len(link.out)
        if queued + len(payload) > self._config.peer_send_buffer_bytes_max:
            self.stats.frames_dropped_full += 1
            return False
        append_frame(link.held if hold else link.out, group_id, payload)
        self.stats.frames_sent += 1
        link.last_sent_at = time.monotonic()
        return True

    def write_unheld(self) -> None:
        """Write what send(hold=False) queued (and anything a full socket left behind)."""
        for link in self._outbound.values():
            if link.out:
                self._write(link)

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
        for key, mask in self._selector.select(timeout_s):
            kind, obj = key.data
            if kind == "wake":
                self._drain_wake()
            elif kind == "accept":
                self._accept()
            elif kind == "in":
                self._read_inbound(obj)
            elif kind == "out":
                self._outbound_event(obj, mask)

    def maintain(self, now: float) -> None:
        """Start connections to peers that are down, at most every connect_retry_s; queue a
        node heartbeat to every connected peer sent nothing for a heartbeat_interval_s."""
        for link in self._outbound.values():
            if link.sock is None and now >= link.next_attempt_at:
                self._connect(link, now)
            elif link.up and now - link.last_sent_at >= self._config.heartbeat_interval_s:
                link.out += self._hello  # leaves at the round's write_unheld()
                link.last_sent_at = now
                self.stats.pings_sent += 1

    # --- outbound ---------------------------------------------------------------------------

    def _connect(self, link: _Outbound, now: float) -> None:
        link.next_attempt_at = now + self._config.connect_retry_s
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            # We never read on this connection, so a peer cut off without a reset (a network
            # partition) is noticed only when the kernel gives up on unacknowledged data.
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
        if not link.up:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                self._close_outbound(link, notify=False)
                return
            link.up = True
            link.out[:0] = self._hello
            self.stats.connects += 1
            self._on_peer_up(link.peer_id)
            self._write(link)
            return
        if mask & selectors.EVENT_READ:
            # The peer never sends on this connection: readable means closed or reset.
            try:
                data = sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                data = b"?"
            except OSError:
                data = b""
            if not data:
                self._close_outbound(link, notify=True)
                return
        if mask & selectors.EVENT_WRITE:
            self._write(link)

    def _write(self, link: _Outbound) -> None:
        sock = link.sock
        if sock is None or not link.up:
            return
        while link.out:
            try:
                sent = sock.send(link.out)
            except (BlockingIOError, InterruptedError):
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
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                logger.warning("accept failed: %s", error)
                return
            sock.setblocking(False)
            conn = _Inbound(sock, FrameDecoder())
            self._inbound[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, ("in", conn))

    def _read_inbound(self, conn: _Inbound) -> None:
        received = 0
        while received < RECV_BYTES_PER_EVENT:
            try:
                data = conn.sock.recv(RECV_CHUNK_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                self._dispatch(conn)
                self._close_inbound(conn)
                return
            received += len(data)
            conn.decoder.feed(data)
            if len(data) < RECV_CHUNK_BYTES:
                break
        self.stats.bytes_received += received
        self._dispatch(conn)

    def _dispatch(self, conn: _Inbound) -> None:
        if conn.peer_id is not None:
            self.last_heard[conn.peer_id] = time.monotonic()
        try:
            frames = conn.decoder.frames()
        except FrameError as error:
            logger.warning("closing connection from %s: %s", conn.peer_id, error)
            self._close_inbound(conn)
            return
        for group_id, payload in frames:
            if conn.sock not in self._inbound:
                return  # closed by an earlier frame (a hello from a stranger)
            try:
                message = pickle.loads(payload)
            except Exception as error:  # a peer's bytes must not stop this node
                logger.warning("closing connection from %s: bad payload: %r", conn.peer_id, error)
                self._close_inbound(conn)
                return
            if group_id == HELLO_GROUP_ID:
                self._on_hello(conn, message)
                continue
            if conn.peer_id is None:
                logger.warning("closing connection: data before hello")
                self._close_inbound(conn)
                return
            self.stats.frames_received += 1
            self._on_message(group_id, conn.peer_id, message)

    def _on_hello(self, conn: _Inbound, message: Any) -> None:
        peer_id = message.get("node_id") if isinstance(message, dict) else None
        if peer_id not in self._outbound or message.get("version") != PROTOCOL_VERSION:
            logger.warning("closing connection from unknown node %r", peer_id)
            self._close_inbound(conn)
            return
        for other in list(self._inbound.values()):
            if other is not conn and other.peer_id == peer_id:
                self._close_inbound(other)  # the peer restarted and reconnected
        conn.peer_id = peer_id
        self.last_heard[peer_id] = time.monotonic()

    def _close_inbound(self, conn: _Inbound) -> None:
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


# Messages that acknowledge nothing about the sender's journal may leave before it is synced.
# append_entries: a leader commits an entry only in a tick after the one that appended it,
# and every tick ends with a sync, so its own copy is durable before it counts itself.
UNHELD_MESSAGE_TYPES = frozenset({"append_entries", "apply_command", "apply_command_response"})


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
        if not 0 <= group_id <= GROUP_ID_MAX:
            raise ValueError(f"group id {group_id} out of range [0, {GROUP_ID_MAX}]")
        self._network = network
        self.group_id = group_id
        self._term_at = term_at
        self._nodes: dict[str, Any] = {node.id: node for node in otherNodes}
        self._sent: dict[str, SentMark] = {}  # peer id -> (term, last index sent)

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
        self._sent.pop(node.id, None)

    def send(self, node: Any, message: Any) -> bool:
        peer_id = node.id
        kind = message.get("type") if isinstance(message, dict) else None
        mark = None
        if kind == "append_entries":
            message, mark = trim_outgoing_append_entries(
                message, self._sent.get(peer_id), self._term_at
            )
        sent = self._network.send(
            peer_id, self.group_id, message, hold=kind not in UNHELD_MESSAGE_TYPES
        )
        if kind == "append_entries":
            if sent and mark is not None:
                self._sent[peer_id] = mark
            else:
                self._sent.pop(peer_id, None)
        return sent

    def destroy(self) -> None:
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)

    # Called by RaftNode on the tick thread.

    def deliver(self, peer_id: str, message: Any) -> None:
        node = self._nodes.get(peer_id)
        if node is None:
            return
        if (
            isinstance(message, dict)
            and message.get("type") == "next_node_idx"
            and (message.get("reset") or not message.get("success"))
        ):
            # The follower's log is not what we sent it: send in full from where it says.
            self._sent.pop(peer_id, None)
        self._onMessageReceived(node, message)

    def peer_up(self, peer_id: str) -> None:
        node = self._nodes.get(peer_id)
        if node is not None:
            self._onNodeConnected(node)

    def peer_down(self, peer_id: str) -> None:
        self._sent.pop(peer_id, None)  # what was in flight may be lost
        node = self._nodes.get(peer_id)
        if node is not None:
            self._onNodeDisconnected(node)

"""The codec of Raft frame payloads: a fixed layout per message, so a peer's bytes can never
run code, and nothing but the messages of the protocol can be read.

Frame payloads used to be pickles, and unpickling a peer's bytes runs whatever `__reduce__`
the peer chose (issue #26). A payload is now `u8 WIRE_VERSION | u8 layout | fields`, where
the layout names one of the messages pysyncobj 0.3.17 and dmq send, with exactly the keys
it has, and the fields follow in a fixed order (little-endian; u64 for terms, indexes and
ids, u8 0/1 for booleans, `u8 present | u64` for a value that may be None):

| layout | message | fields, then tail |
|---|---|---|
| 1 | request_vote | term, last_log_index, last_log_term |
| 2 | response_vote | term |
| 3 | timeout_now | term |
| 4 | append_entries | term, commit_index, prevLogIdx, prevLogTerm; entries |
| 5 | append_entries (snapshot) | term, commit_index; serialized |
| 6 | next_node_idx | next_node_idx, reset, success |
| 7 | apply_command | ; command |
| 8 | apply_command | request_id; command |
| 9 | apply_command_response | request_id, log_idx, log_term |
| 10 | apply_command_response | request_id, error |
| 11 | dmq_quiesce | term, last, last_term (or None), round |
| 12 | dmq_quiesced | term, last, round (or None) |
| 13 | dmq_unquiesce | term |
| 14 | dmq_wake | term |
| 15 | dmq_read | term, seq |
| 16 | dmq_read_ack | term, seq |
| 17 | dmq_prevote | term, last_log_index, last_log_term |
| 18 | dmq_prevote_answer | term, granted |
| 19 | dmq_higher_term | term |

Tails: `entries` is `u32 count | count x (u32 length | u64 idx | u64 term | command)` and
decodes to a tuple of `(command, idx, term)`; `command` is `u32 length | bytes`;
`serialized` (a snapshot chunk) is `u8 0` for None or `u8 1 | u8 is_first | u8 is_last |
u32 length | bytes`. Nothing else exists: an unknown version or layout, a field out of
range, a length past the payload's end, bytes after the last field, a message with a key
too many or too few, or of a type not in the table, is refused with WireError (the
connection is closed; on the sending side the message is not sent). Log entries' commands
stay opaque bytes here; `decode_message` then has raft/safe_pickle.py check each one,
because pysyncobj will unpickle them.

Not sent, so not representable: pysyncobj's chunked transfer of one entry larger than
appendEntriesBatchSizeBytes (`transmission`: dmq's entries never are, RaftConfig.check()),
and its VERSION entries (safe_pickle refuses them).

Limits: a payload is at most FRAME_BYTES_MAX (the frame decoder checks the length first);
at most APPEND_ENTRIES_ENTRIES_MAX entries (raft/transport.py trims longer messages); each
length is checked against the bytes left before anything is built, so a payload of n
bytes builds at most n bytes of command data and one small tuple per 20 bytes of it.
There is no nesting beyond entries: depth is fixed by the layouts.

Copies: the encoder writes straight into the peer's send buffer (one copy of each command);
the decoder reads the frame in place, from a view of the receive buffer, and copies each
command out once. Speed, measured with `python -m bench.wire_bench` against pickle, is in
raft/README.md.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from raft import higher_term, prevote, quiesce, read_index
from raft.errors import PeerRefused, UnsafePickle
from raft.safe_pickle import check_command

WIRE_VERSION = 1
# Entries in one append_entries. The transport trims a longer message to this many (the
# follower acknowledges what it got and the leader sends the rest next): pysyncobj bounds
# a message by bytes only, so only a catch-up over many tiny entries reaches it.
APPEND_ENTRIES_ENTRIES_MAX = 65_536

_HEAD = struct.Struct("<BB")  # version, layout
_COUNT = struct.Struct("<I")
_ENTRY = struct.Struct("<IQQ")  # command length, idx, term
_CHUNK = struct.Struct("<BBI")  # is_first, is_last, length
_U8 = struct.Struct("<B")


class WireError(PeerRefused):
    """A payload that is not one of the protocol's messages (or a message that cannot be
    written as one); the connection is closed."""


# --- layouts ----------------------------------------------------------------------------

# Field kinds: "u" a u64, "b" a bool (u8 0/1), "n" a u64 or None (u8 present, u64).
_FORMATS = {"u": "Q", "b": "B", "n": "BQ"}


@dataclass(frozen=True, slots=True)
class Layout:
    code: int
    kind: str  # the message's "type"
    fields: tuple[tuple[str, str], ...]  # (key, field kind), in wire order
    tail: str | None  # "entries", "serialized", "command" or None
    keys: frozenset[str]  # every key of the message, "type" included
    fixed: struct.Struct  # the fields after the 2-byte head
    names: tuple[str, ...]  # the field keys, in wire order
    flags: tuple[str, ...]  # the keys of "b" fields
    nullable: bool  # a field of kind "n": the fixed values do not map one to one

    @classmethod
    def of(cls, code: int, kind: str, spec: str, tail: str | None = None) -> Layout:
        fields = tuple(
            (name, field_kind) for name, field_kind in (item.split(":") for item in spec.split())
        )
        names = tuple(name for name, _ in fields)
        keys = frozenset({"type", *names, *([tail] if tail else [])})
        fixed = struct.Struct("<" + "".join(_FORMATS[k] for _, k in fields))
        flags = tuple(name for name, k in fields if k == "b")
        nullable = any(k == "n" for _, k in fields)
        return cls(code, kind, fields, tail, keys, fixed, names, flags, nullable)


LAYOUTS: tuple[Layout, ...] = (
    Layout.of(1, "request_vote", "term:u last_log_index:u last_log_term:u"),
    Layout.of(2, "response_vote", "term:u"),
    Layout.of(3, "timeout_now", "term:u"),
    Layout.of(4, "append_entries", "term:u commit_index:u prevLogIdx:u prevLogTerm:u", "entries"),
    Layout.of(5, "append_entries", "term:u commit_index:u", "serialized"),
    Layout.of(6, "next_node_idx", "next_node_idx:u reset:b success:b"),
    Layout.of(7, "apply_command", "", "command"),
    Layout.of(8, "apply_command", "request_id:u", "command"),
    Layout.of(9, "apply_command_response", "request_id:u log_idx:u log_term:u"),
    Layout.of(10, "apply_command_response", "request_id:u error:u"),
    Layout.of(11, quiesce.QUIESCE, "term:u last:u last_term:n round:u"),
    Layout.of(12, quiesce.QUIESCED, "term:u last:u round:n"),
    Layout.of(13, quiesce.UNQUIESCE, "term:u"),
    Layout.of(14, quiesce.WAKE, "term:u"),
    Layout.of(15, read_index.READ, "term:u seq:u"),
    Layout.of(16, read_index.READ_ACK, "term:u seq:u"),
    Layout.of(17, prevote.PREVOTE, "term:u last_log_index:u last_log_term:u"),
    Layout.of(18, prevote.PREVOTE_ANSWER, "term:u granted:b"),
    Layout.of(19, higher_term.HIGHER_TERM, "term:u"),
)
_BY_CODE: dict[int, Layout] = {layout.code: layout for layout in LAYOUTS}
_BY_KIND: dict[str, tuple[Layout, ...]] = {}
for _layout in LAYOUTS:
    _BY_KIND[_layout.kind] = (*_BY_KIND.get(_layout.kind, ()), _layout)


# --- encoding ---------------------------------------------------------------------------


def _layout_for(message: Any) -> Layout:
    if type(message) is not dict:
        raise WireError(f"a message is a dict, not {type(message).__name__}")
    kind = message.get("type")
    keys = message.keys()
    for layout in _BY_KIND.get(kind, ()) if type(kind) is str else ():
        if keys == layout.keys:
            return layout
    raise WireError(f"no layout for a {kind!r:.40} message with keys {sorted(map(str, keys))}")


def _fixed_values(layout: Layout, message: dict[str, Any]) -> list[Any]:
    if not layout.nullable:
        values = [message[name] for name in layout.names]
        for (name, field_kind), value in zip(layout.fields, values, strict=True):
            if type(value) is not (int if field_kind == "u" else bool):
                raise WireError(f"{layout.kind}.{name} must be an int or a bool, as its kind")
        return values
    values = []
    for name, field_kind in layout.fields:
        value = message[name]
        if field_kind == "n":
            if value is not None and type(value) is not int:
                raise WireError(f"{layout.kind}.{name} must be an int or None")
            values += (value is not None, value or 0)
        elif type(value) is not int:
            raise WireError(f"{layout.kind}.{name} must be an int")
        else:
            values.append(value)
    return values


def encode_into(buffer: bytearray, message: Any) -> int:
    """Append the payload of `message` to `buffer` and return its size; WireError (the
    buffer unchanged) for a message that has no layout."""
    layout = _layout_for(message)
    start = len(buffer)
    try:
        buffer += _HEAD.pack(WIRE_VERSION, layout.code)
        buffer += layout.fixed.pack(*_fixed_values(layout, message))
        if layout.tail is not None:
            _TAIL_ENCODERS[layout.tail](buffer, message[layout.tail])
    except (struct.error, TypeError, ValueError) as error:
        del buffer[start:]
        raise WireError(f"{layout.kind}: {error}") from None
    except BaseException:
        del buffer[start:]
        raise
    return len(buffer) - start


def encode(message: Any) -> bytes:
    """One payload as bytes (tests, tools); the transport uses encode_into."""
    out = bytearray()
    encode_into(out, message)
    return bytes(out)


def _put_bytes(buffer: bytearray, data: Any) -> None:
    if type(data) not in (bytes, bytearray, memoryview):
        raise WireError(f"expected bytes, not {type(data).__name__}")
    buffer += _COUNT.pack(len(data))
    buffer += data


def _put_entries(buffer: bytearray, entries: Iterable[Any]) -> None:
    at = len(buffer)
    buffer += _COUNT.pack(0)
    count = 0
    for command, idx, term in entries:
        if type(command) is not bytes or type(idx) is not int or type(term) is not int:
            raise WireError("an entry is (command bytes, idx, term)")
        buffer += _ENTRY.pack(len(command), idx, term)
        buffer += command
        count += 1
    if count > APPEND_ENTRIES_ENTRIES_MAX:
        raise WireError(f"{count} entries over APPEND_ENTRIES_ENTRIES_MAX")
    _COUNT.pack_into(buffer, at, count)


def _put_chunk(buffer: bytearray, chunk: Any) -> None:
    if chunk is None:
        buffer += _U8.pack(0)
        return
    data, is_first, is_last = chunk
    if type(is_first) is not bool or type(is_last) is not bool or type(data) is not bytes:
        raise WireError("a snapshot chunk is (bytes, bool, bool) or None")
    buffer += _U8.pack(1)
    buffer += _CHUNK.pack(is_first, is_last, len(data))
    buffer += data


_TAIL_ENCODERS: dict[str, Callable[[bytearray, Any], None]] = {
    "entries": _put_entries,
    "serialized": _put_chunk,
    "command": _put_bytes,
}


# --- decoding ---------------------------------------------------------------------------


class _Reader:
    """A read position in a payload view; every read is checked against its end."""

    __slots__ = ("view", "position", "end")

    def __init__(self, view: memoryview, position: int) -> None:
        self.view = view
        self.position = position
        self.end = len(view)

    def take(self, size: int) -> int:
        start = self.position
        if size > self.end - start:
            raise WireError(f"a field of {size} bytes runs past the payload's end")
        self.position = start + size
        return start

    def unpack(self, layout: struct.Struct) -> tuple[Any, ...]:
        return layout.unpack_from(self.view, self.take(layout.size))

    def data(self, size: int) -> bytes:
        start = self.take(size)
        return self.view[start : start + size].tobytes()


def _get_bytes(reader: _Reader) -> bytes:
    (size,) = reader.unpack(_COUNT)
    return reader.data(size)


def _get_entries(reader: _Reader) -> tuple[tuple[bytes, int, int], ...]:
    (count,) = reader.unpack(_COUNT)
    # Every entry takes at least _ENTRY.size bytes: a count the bytes left cannot hold is
    # refused before anything is built.
    if count > APPEND_ENTRIES_ENTRIES_MAX or count * _ENTRY.size > reader.end - reader.position:
        raise WireError(f"{count} entries: over APPEND_ENTRIES_ENTRIES_MAX or the payload")
    entries = []
    for _ in range(count):
        size, idx, term = reader.unpack(_ENTRY)
        entries.append((reader.data(size), idx, term))
    return tuple(entries)


def _get_chunk(reader: _Reader) -> tuple[bytes, bool, bool] | None:
    (present,) = reader.unpack(_U8)
    if present == 0:
        return None
    is_first, is_last, size = reader.unpack(_CHUNK)
    if present != 1 or is_first > 1 or is_last > 1:
        raise WireError("a snapshot chunk's flags are not 0 or 1")
    return reader.data(size), bool(is_first), bool(is_last)


_TAIL_DECODERS: dict[str, Callable[[_Reader], Any]] = {
    "entries": _get_entries,
    "serialized": _get_chunk,
    "command": _get_bytes,
}


def _fields(layout: Layout, values: tuple[Any, ...]) -> dict[str, Any]:
    if not layout.nullable:
        message = dict(zip(layout.names, values, strict=True))
        for name in layout.flags:
            if message[name] > 1:
                raise WireError(f"{layout.kind}.{name} is not 0 or 1")
            message[name] = message[name] == 1
        message["type"] = layout.kind
        return message
    message = {"type": layout.kind}
    at = 0
    for name, field_kind in layout.fields:  # "u" and "n" only (no layout mixes in "b")
        if field_kind == "n":
            present, value = values[at], values[at + 1]
            if present > 1 or (not present and value):
                raise WireError(f"{layout.kind}.{name}: bad presence byte")
            message[name] = value if present else None
            at += 1
        else:
            message[name] = values[at]
        at += 1
    return message


def decode(payload: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The message of one payload; WireError for anything but one well-formed message.

    `payload` may be a view into the receive buffer: nothing returned refers to it (the
    bytes values are copies), so the caller may release it at once.
    """
    with memoryview(payload) as view:
        if len(view) < _HEAD.size:
            raise WireError("payload too short")
        version, code = _HEAD.unpack_from(view)
        layout = _BY_CODE.get(code)
        if version != WIRE_VERSION or layout is None:
            raise WireError(f"unknown wire version {version} or layout {code}")
        reader = _Reader(view, _HEAD.size)
        message = _fields(layout, reader.unpack(layout.fixed))
        if layout.tail is not None:
            message[layout.tail] = _TAIL_DECODERS[layout.tail](reader)
        if reader.position != reader.end:
            raise WireError(f"{reader.end - reader.position} bytes after the message")
        return message


def decode_message(payload: bytes | bytearray | memoryview) -> dict[str, Any]:
    """`decode`, then every log command in the message checked by raft/safe_pickle.py
    (pysyncobj will unpickle them): what the transport hands to Raft."""
    message = decode(payload)
    try:
        for entry in message.get("entries", ()):
            check_command(entry[0])
        if "command" in message:
            check_command(message["command"])
    except UnsafePickle as error:
        raise WireError(f"{message['type']}: a log command is refused: {error}") from None
    return message

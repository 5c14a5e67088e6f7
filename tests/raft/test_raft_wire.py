"""Proves that a peer's bytes on the Raft port are decoded by a codec that cannot run code,
and that the decoder refuses what it must, within its limits (raft/wire.py):

- round trip: every message pysyncobj 0.3.17 and dmq send (hypothesis builds each layout
  with any field values, entries and commands) comes out of encode/decode equal (entries
  as tuples), and a stream of such frames comes out whole;
- the encoder refuses what has no layout (other types, missing or extra keys, values of
  the wrong type or range), so nothing it sends is refused by a receiver;
- fuzz: random byte strings, random frame streams, and valid frames with random bytes
  changed, inserted or cut, fed through the frame decoder and the codec as the connection
  handler does, raise nothing but PeerRefused (which closes the connection);
- nothing runs: payloads that are pickles, and log entries or forwarded commands holding
  pickles whose `__reduce__` would create a marker file, are refused; the marker never
  appears;
- limits: every length is checked before anything is built: decoding a payload of n bytes
  never allocates more than DECODE_BYTES_PER_INPUT_BYTE_MAX * n + DECODE_BYTES_SLACK
  (measured with tracemalloc), whatever the payload claims.
"""

from __future__ import annotations

import contextlib
import pickle
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raft import wire
from raft.errors import PeerRefused
from raft.transport import HELLO_GROUP_ID, FrameDecoder, encode_frame

# A payload of n bytes builds at most this many bytes of Python objects per input byte (the
# worst case, entries of empty commands, builds about 7: a tuple and two ints per 20 bytes),
# plus a constant.
DECODE_BYTES_PER_INPUT_BYTE_MAX = 16
DECODE_BYTES_SLACK = 64 * 1024


class Hostile:
    """Unpickling this runs code: it creates the file `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def hostile_pickle(marker: Path) -> bytes:
    return pickle.dumps(Hostile(marker))


def regular_command(commands: list[bytes]) -> bytes:
    return b"\x00" + pickle.dumps((1, (commands,)), pickle.HIGHEST_PROTOCOL)


def membership_command(action: str, node_id: str) -> bytes:
    from pysyncobj.node import Node

    return b"\x02" + pickle.dumps([action, node_id, Node(node_id)], 2)


uints = st.integers(0, 2**64 - 1)
node_ids = st.text(min_size=1, max_size=20)
# Generating nested protocol messages is slow on a busy 2-core machine: no time checks.
LENIENT = settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
commands = st.one_of(
    st.lists(st.binary(max_size=300), max_size=5).map(regular_command),
    st.just(b"\x01"),
    st.tuples(st.sampled_from(["add", "rem"]), node_ids).map(lambda t: membership_command(*t)),
)
entries = st.lists(st.tuples(commands, uints, uints), max_size=6).map(tuple)

MESSAGES = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("request_vote"), "term": uints, "last_log_index": uints,
         "last_log_term": uints}
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["response_vote", "timeout_now",
                           "dmq_unquiesce", "dmq_wake", "dmq_higher_term"]),
                           "term": uints}),
    st.fixed_dictionaries(
        {"type": st.just("append_entries"), "term": uints, "commit_index": uints,
         "prevLogIdx": uints, "prevLogTerm": uints, "entries": entries}
    ),
    st.fixed_dictionaries(
        {"type": st.just("append_entries"), "term": uints, "commit_index": uints,
         "serialized": st.one_of(st.none(), st.tuples(st.binary(max_size=500), st.booleans(),
                                                      st.booleans()))}
    ),
    st.fixed_dictionaries(
        {"type": st.just("next_node_idx"), "next_node_idx": uints, "reset": st.booleans(),
         "success": st.booleans()}
    ),
    st.fixed_dictionaries(
        {"type": st.just("apply_command"), "command": commands},
        optional={"request_id": uints},
    ),
    st.fixed_dictionaries(
        {"type": st.just("apply_command_response"), "request_id": uints, "log_idx": uints,
         "log_term": uints}
    ),
    st.fixed_dictionaries(
        {"type": st.just("apply_command_response"), "request_id": uints, "error": uints}
    ),
    st.fixed_dictionaries(
        {"type": st.just("dmq_quiesce"), "term": uints, "last": uints,
         "last_term": st.one_of(st.none(), uints), "round": uints}
    ),
    st.fixed_dictionaries(
        {"type": st.just("dmq_quiesced"), "term": uints, "last": uints,
         "round": st.one_of(st.none(), uints)}
    ),
)  # fmt: skip


def handle(stream: bytes) -> list[tuple[int, Any]]:
    """What Network._dispatch does with an authenticated connection's bytes (minus the
    handing to Raft): frames, then the codec and its command check. PeerRefused closes
    the connection."""
    decoder = FrameDecoder()
    decoder.feed(stream)
    out = []
    for group_id, payload in decoder.views():
        if group_id == HELLO_GROUP_ID:
            continue
        out.append((group_id, wire.decode_message(payload)))
    return out


@LENIENT
@given(message=MESSAGES)
def test_every_protocol_message_round_trips(message: dict[str, Any]) -> None:
    assert wire.decode_message(wire.encode(message)) == message


@LENIENT
@given(messages=st.lists(st.tuples(st.integers(0, HELLO_GROUP_ID - 1), MESSAGES), max_size=5))
def test_frame_streams_of_messages_come_out_whole(messages: list[tuple[int, Any]]) -> None:
    stream = b"".join(encode_frame(group, wire.encode(m)) for group, m in messages)
    assert handle(stream) == messages


def test_entries_from_lists_or_journal_views_come_back_as_tuples() -> None:
    entries = [[b"\x01", 1, 2], (b"\x01", 2, 2)]
    message = {"type": "append_entries", "term": 2, "commit_index": 0, "prevLogIdx": 0,
               "prevLogTerm": 0, "entries": iter(entries)}  # fmt: skip
    assert wire.decode(wire.encode(message))["entries"] == ((b"\x01", 1, 2), (b"\x01", 2, 2))


@pytest.mark.parametrize(
    "message",
    [
        object(),
        "response_vote",
        {"type": "response_vote"},
        {"type": "response_vote", "term": 1, "extra": 0},
        {"type": "response_vote", "term": -1},
        {"type": "response_vote", "term": 2**64},
        {"type": "response_vote", "term": True},
        {"type": "response_vote", "term": "1"},
        {"type": "next_node_idx", "next_node_idx": 1, "reset": 0, "success": True},
        {"type": "dmq_quiesced", "term": 1, "last": 1, "round": "r"},
        {"type": "apply_command", "command": "not bytes"},
        {"type": "append_entries", "term": 1, "commit_index": 0, "prevLogIdx": 0,
         "prevLogTerm": 0, "entries": [(b"x", 1)]},
        {"type": "append_entries", "term": 1, "commit_index": 0, "prevLogIdx": 0,
         "prevLogTerm": 0, "transmission": "start", "data": b"x"},
        {"type": "append_entries", "term": 1, "commit_index": 0, "serialized": False},
        {"type": "pysyncobj_unknown", "term": 1},
    ],
)  # fmt: skip
def test_the_encoder_refuses_what_has_no_layout(message: Any) -> None:
    with pytest.raises(wire.WireError):
        wire.encode(message)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.binary(max_size=2000))
def test_random_bytes_only_ever_close_the_connection(data: bytes) -> None:
    for stream in (data, encode_frame(1, data), encode_frame(1, b"\x01" + data)):
        with contextlib.suppress(PeerRefused):
            handle(stream)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    message=MESSAGES,
    edits=st.lists(
        st.tuples(st.sampled_from(["flip", "insert", "cut"]), st.integers(0, 10_000),
                  st.integers(0, 255)),
        min_size=1, max_size=4,
    ),
)  # fmt: skip
def test_mutated_frames_only_ever_close_the_connection(
    message: dict[str, Any], edits: list[tuple[str, int, int]]
) -> None:
    stream = bytearray(encode_frame(3, wire.encode(message)))
    for kind, at, byte in edits:
        at %= len(stream) + 1
        if kind == "flip" and at < len(stream):
            stream[at] ^= byte or 1
        elif kind == "insert":
            stream[at:at] = bytes([byte])
        elif kind == "cut":
            del stream[at:]
    with contextlib.suppress(PeerRefused):
        handle(bytes(stream))


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "pwned"


def test_pickled_payloads_are_refused_and_never_run(marker: Path) -> None:
    hostile = hostile_pickle(marker)
    head = {"type": "append_entries", "term": 1, "commit_index": 0, "prevLogIdx": 0,
            "prevLogTerm": 0}  # fmt: skip
    payloads = [
        hostile,
        bytes([wire.WIRE_VERSION]) + hostile,
        pickle.dumps({"type": "response_vote", "term": 1}),
        wire.encode({"type": "apply_command", "command": b"\x00" + hostile}),
        wire.encode({**head, "entries": ((b"\x00" + hostile, 1, 1),)}),
        wire.encode({**head, "entries": ((b"\x01", 1, 1), (b"\x02" + hostile, 2, 1))}),
    ]
    for payload in payloads:
        with pytest.raises(PeerRefused):
            handle(encode_frame(5, payload))
    assert not marker.exists()
    pickle.loads(hostile).close()  # the control: this one runs
    assert marker.exists()


def packed(layout: int, body: bytes = b"") -> bytes:
    return bytes([wire.WIRE_VERSION, layout]) + body


U64 = struct.Struct("<Q")
ENTRIES = 4  # layout of append_entries with entries
HEAD4 = U64.pack(1) * 4  # term, commit_index, prevLogIdx, prevLogTerm


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"", "empty"),
        (b"\x01", "no layout"),
        (bytes([2, 2]) + U64.pack(1), "another version"),
        (packed(0), "layout 0"),
        (packed(99), "unknown layout"),
        (packed(2), "a field missing"),
        (packed(2, U64.pack(1) + b"\x00"), "bytes after the message"),
        (packed(6, U64.pack(1) + b"\x02\x01"), "a bool that is 2"),
        (packed(12, U64.pack(1) * 2 + b"\x00" + U64.pack(5)), "absent with a value"),
        (packed(12, U64.pack(1) * 2 + b"\x02" + U64.pack(5)), "presence byte 2"),
        (packed(7, struct.pack("<I", 2**31)), "command past the payload"),
        (packed(ENTRIES, HEAD4 + struct.pack("<I", 2**32 - 1)), "entries count a lie"),
        (packed(ENTRIES, HEAD4 + struct.pack("<I", wire.APPEND_ENTRIES_ENTRIES_MAX + 1)
                + bytes(20 * (wire.APPEND_ENTRIES_ENTRIES_MAX + 1))), "too many entries"),
        (packed(ENTRIES, HEAD4 + struct.pack("<I", 1) + struct.pack("<IQQ", 9, 1, 1)),
         "entry past the end"),
        (packed(5, U64.pack(1) * 2 + b"\x02"), "chunk presence 2"),
        (packed(5, U64.pack(1) * 2 + b"\x01\x03\x00" + struct.pack("<I", 0)), "chunk flag"),
        (packed(ENTRIES, HEAD4 + struct.pack("<I", 1) + struct.pack("<IQQ", 1, 1, 1) + b"\x09"),
         "a command of type 9"),
        (packed(ENTRIES, HEAD4 + struct.pack("<I", 1) + struct.pack("<IQQ", 1, 1, 1) + b"\x03"),
         "a VERSION command"),
    ],
)  # fmt: skip
def test_each_malformed_payload_is_refused(payload: bytes, why: str) -> None:
    with pytest.raises(PeerRefused):
        wire.decode_message(payload)


def peak_decode_bytes(payload: bytes) -> int:
    tracemalloc.start()
    try:
        with contextlib.suppress(PeerRefused):
            wire.decode_message(payload)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def entries_payload(count: int, command: bytes) -> bytes:
    entry = struct.pack("<IQQ", len(command), 2**40, 2**40) + command
    return packed(ENTRIES, HEAD4 + struct.pack("<I", count) + entry * count)


WORST_CASES = {
    "no-op entries": entries_payload(60_000, b"\x01"),
    "empty commands": entries_payload(60_000, b""),
    "claims of many entries": packed(ENTRIES, HEAD4 + struct.pack("<I", 60_000) + bytes(100)),
    "a command claiming 2 GiB": packed(7, struct.pack("<I", 2**31) + bytes(100)),
}


@pytest.mark.parametrize("name", sorted(WORST_CASES))
def test_decoding_allocates_within_a_bound_of_the_payload(name: str) -> None:
    payload = WORST_CASES[name]
    peak = peak_decode_bytes(payload)
    assert peak <= DECODE_BYTES_PER_INPUT_BYTE_MAX * len(payload) + DECODE_BYTES_SLACK


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(layout=st.integers(0, 16), data=st.binary(min_size=1, max_size=3000))
def test_random_payloads_allocate_within_the_bound(layout: int, data: bytes) -> None:
    payload = packed(layout, data)
    assert peak_decode_bytes(payload) <= (
        DECODE_BYTES_PER_INPUT_BYTE_MAX * len(payload) + DECODE_BYTES_SLACK
    )


def test_every_layout_is_documented_and_unique() -> None:
    codes = [layout.code for layout in wire.LAYOUTS]
    assert len(set(codes)) == len(codes)
    assert len({(layout.kind, layout.keys) for layout in wire.LAYOUTS}) == len(codes)
    for layout in wire.LAYOUTS:
        assert f"| {layout.code} | {layout.kind}" in (wire.__doc__ or "")

"""Proves that the pickles pysyncobj insists on are unpickled only by the restricted
unpickler of raft/safe_pickle.py, and that it admits exactly what the protocol carries:

- every command dmq and pysyncobj write (dmq's batches, pysyncobj's no-op, membership
  add/remove with a Node, in protocol 2 and 5) is accepted; pysyncobj's own snapshot
  bookkeeping and dmq's snapshot payload load;
- any other global (os.system, builtins.open/eval, subprocess, functools.partial ...), a
  persistent id, an out-of-band buffer, a `_codecs.encode` with another codec, a malformed
  pickle, and every command of the wrong shape or type (VERSION entries included) raise
  UnsafePickle, and the marker file the hostile pickle would create never appears;
- pysyncobj.syncobj's `pickle.loads` is the restricted one once raft.node is imported
  (so journal replay and apply go through it), while pysyncobj's stock transport keeps
  its own;
- a snapshot file holding a hostile pickle (with a valid CRC) stops the group from opening
  instead of running it.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
from pathlib import Path
from typing import Any

import crc32c
import pysyncobj.pickle
import pysyncobj.syncobj
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pysyncobj.node import Node

import raft.node  # noqa: F401 - installs the guard, as every dmq process does
from raft import safe_pickle
from raft.errors import UnsafePickle


class Reduce:
    """Pickles as a call of `function(*args)`."""

    def __init__(self, function: Any, *args: Any) -> None:
        self.function = function
        self.args = args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.function, self.args)


def regular(commands: list[bytes], protocol: int = pickle.HIGHEST_PROTOCOL) -> bytes:
    return b"\x00" + pickle.dumps((3, (commands,)), protocol)


@given(commands=st.lists(st.binary(max_size=100), max_size=20), protocol=st.sampled_from([2, 5]))
def test_dmq_batches_are_accepted_in_any_protocol(commands: list[bytes], protocol: int) -> None:
    safe_pickle.check_command(regular(commands, protocol))
    # Bytes pickled here by pysyncobj's own encoding, read back by the restricted unpickler.
    assert safe_pickle.loads(regular(commands, protocol)[1:]) == (3, (commands,))


@pytest.mark.parametrize("action", ["add", "rem"])
@pytest.mark.parametrize("protocol", [2, 5])
def test_membership_entries_are_accepted(action: str, protocol: int) -> None:
    body = pickle.dumps([action, "n4", Node("n4")], protocol)
    safe_pickle.check_command(b"\x02" + body)
    request = safe_pickle.load_membership(body)
    assert request[:2] == [action, "n4"] and request[2] == Node("n4")


def test_the_no_op_is_accepted() -> None:
    safe_pickle.check_command(b"\x01")


def test_a_snapshot_payload_loads() -> None:
    data = ((b"\x00x", 9, 2), (b"\x01", 8, 2), {Node("n1"), Node("n2")})
    payload = pickle.dumps((data, b"machine state"), pickle.HIGHEST_PROTOCOL)
    assert safe_pickle.load_snapshot(payload) == (data, b"machine state")


HOSTILE_GLOBALS = [
    (os.system, "true"),
    (eval, "1"),
    (exec, "1"),
    (open, "/dev/null"),
    (getattr, 1, "real"),
    (__import__, "os"),
    (io.FileIO, "/dev/null"),
    (pickle.loads, b"N."),
    (type, "X", (), {}),
]


@pytest.mark.parametrize("call", HOSTILE_GLOBALS, ids=lambda c: getattr(c[0], "__name__", "?"))
def test_any_other_global_is_refused(call: tuple[Any, ...]) -> None:
    for protocol in (0, 2, 5):
        with pytest.raises(UnsafePickle):
            # Hostile on purpose: the restricted unpickler must refuse before any call.
            safe_pickle.loads(pickle.dumps(Reduce(*call), protocol))


def test_a_hostile_command_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = pickle.dumps(Reduce(open, str(marker), "w"))
    for command in (b"\x00" + hostile, b"\x02" + hostile, b"\x03" + hostile):
        with pytest.raises(UnsafePickle):
            safe_pickle.check_command(command)
    with pytest.raises(UnsafePickle):
        pysyncobj.syncobj.pickle.loads(hostile)  # what pysyncobj applies with
    with pytest.raises(UnsafePickle):
        safe_pickle.load_snapshot(pickle.dumps(((None, None, set()), hostile)))
    assert not marker.exists()


@pytest.mark.parametrize(
    "command",
    [
        b"",
        b"\x01\x00",  # a no-op is one byte
        b"\x03" + pickle.dumps(1, 2),  # VERSION: dmq never writes one
        b"\x07" + pickle.dumps(1, 2),
        b"\x00" + pickle.dumps("not a tuple"),
        b"\x00" + pickle.dumps((3, (["str, not bytes"],))),
        b"\x00" + pickle.dumps((3, ([b"x"], {"kw": 1}))),
        b"\x00" + pickle.dumps((-1, ([b"x"],))),
        b"\x02" + pickle.dumps(["add", "n4", Node("n5")]),  # ids disagree
        b"\x02" + pickle.dumps(["del", "n4", Node("n4")]),
        b"\x02" + pickle.dumps(["add", "n4", "n4"]),
        b"\x02" + pickle.dumps(["add", 4, Node(4)]),
        b"\x00garbage",
        b"\x00" + pickle.dumps((3, ([b"x"],)))[:-3],
    ],
)
def test_commands_of_the_wrong_shape_are_refused(command: bytes) -> None:
    with pytest.raises(UnsafePickle):
        safe_pickle.check_command(command)


def test_a_node_with_extra_state_is_refused() -> None:
    node = Node("n4", address="somewhere")
    with pytest.raises(UnsafePickle):
        safe_pickle.check_command(b"\x02" + pickle.dumps(["add", "n4", node]))


def test_persistent_ids_buffers_and_other_codecs_are_refused() -> None:
    class WithPid(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return "pid" if obj == "x" else None

    out = io.BytesIO()
    WithPid(out).dump(["x"])
    with pytest.raises(UnsafePickle, match="persistent"):
        safe_pickle.loads(out.getvalue())
    with pytest.raises(UnsafePickle):
        buffers: list[pickle.PickleBuffer] = []
        safe_pickle.loads(
            pickle.dumps(pickle.PickleBuffer(b"x"), 5, buffer_callback=buffers.append)
        )
    with pytest.raises(UnsafePickle):
        safe_pickle.loads(pickle.dumps(Reduce(__import__("_codecs").encode, "eJw=", "base64")))


@given(data=st.binary(max_size=500))
def test_random_bytes_raise_nothing_but_unsafe_pickle(data: bytes) -> None:
    for blob in (data, b"\x80\x05" + data, b"\x80\x02" + data):
        with contextlib.suppress(UnsafePickle):
            safe_pickle.loads(blob)
        with contextlib.suppress(UnsafePickle):
            safe_pickle.check_command(b"\x00" + blob)


def test_only_pysyncobj_syncobj_is_guarded() -> None:
    guarded = pysyncobj.syncobj.pickle
    assert isinstance(guarded, safe_pickle._GuardedPickle)
    assert guarded.dumps is pysyncobj.pickle.dumps  # pickling is unchanged
    assert pysyncobj.pickle.loads is not guarded.loads  # the stock transport keeps its own
    safe_pickle.guard_pysyncobj()  # idempotent
    assert pysyncobj.syncobj.pickle is guarded


def test_a_hostile_snapshot_file_stops_the_group_instead_of_running(tmp_path: Path) -> None:
    import asyncio

    from raft.node import RaftNode
    from raft.snapshot import _SNAPSHOT_HEADER, _SNAPSHOT_MAGIC, SNAPSHOT_FILE

    marker = tmp_path / "pwned"
    payload = pickle.dumps(((None, None, set()), Reduce(open, str(marker), "w")))
    group_dir = tmp_path / "data" / "groups" / "1"
    group_dir.mkdir(parents=True)
    header = _SNAPSHOT_HEADER.pack(_SNAPSHOT_MAGIC, crc32c.crc32c(payload), len(payload))
    (group_dir / SNAPSHOT_FILE).write_bytes(header + payload)

    class Machine:
        def apply(self, command: bytes) -> Any:
            return None

        def snapshot(self) -> bytes:
            return b""

        def restore(self, snapshot: bytes) -> None:
            pass

    async def open_group() -> None:
        node = RaftNode("n1", {"n1": "127.0.0.1:1"}, tmp_path / "data")
        try:
            with pytest.raises(Exception, match="UnsafePickle|not allowed"):
                await node.add_group(1, Machine())
        finally:
            await node.stop()

    asyncio.run(open_group())
    assert not marker.exists()

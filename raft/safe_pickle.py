"""The only unpickler raft/ lets loose on bytes: restricted to the classes pysyncobj stores.

pysyncobj 0.3.17 insists on pickle in three places dmq cannot change without forking it:
its log commands (`_COMMAND_TYPE` byte + pickle), its membership-change entries, and the
bookkeeping inside snapshots. Unpickling runs code chosen by whoever wrote the bytes, so
raft/ never hands pysyncobj bytes this module has not accepted first, and pysyncobj's own
`pickle.loads` is this module's (`guard_pysyncobj`, installed when raft/node.py loads).

`RestrictedUnpickler` is the Python documentation's "Restricting Globals" recipe:
`find_class` admits only ALLOWED_GLOBALS, a single class, `pysyncobj.node.Node` (the
members named in membership entries and snapshots), plus what pickle protocol 2
(pysyncobj's own) writes bytes with: `_codecs.encode` limited to latin-1 and `bytes()`
without arguments (both stand-ins: the real ones could decompress or allocate at will). Every other global, every
persistent id and every out-of-band buffer is refused. With no function to call, a pickle
can build only containers, numbers, strings, bytes and Node objects whose state is a dict
of those; `check_command` then checks the shape of what it built.

Which bytes are unpickled, from whom (raft/README.md, "What may be unpickled"):

- log entries, in an append_entries from an authenticated peer (raft/wire.py's
  `decode_message` calls `check_command` on each before pysyncobj sees the message), in an apply_command a
  follower forwards (the same), and again when pysyncobj applies them or replays the
  journal (through the guard);
- this node's own proposals (raft/node.py pickles them; applied through the guard);
- snapshots: the file this node wrote, or the one its leader sent in chunks (both read by
  `load_snapshot`, after the CRC check).
"""

from __future__ import annotations

import codecs
import io
import pickle
from typing import Any

import pysyncobj.syncobj as _syncobj_module
from pysyncobj.node import Node
from pysyncobj.syncobj import _COMMAND_TYPE

from raft.errors import UnsafePickle

# The members' ids pysyncobj pickles inside Node objects are dmq node ids.
NODE_ID_CHARS_MAX = 255


def _latin1_encode(text: str, encoding: str) -> bytes:
    """What pickle protocol 2 calls to rebuild bytes: `_codecs.encode(text, "latin1")`.
    Any other codec (some decompress or transform) is refused."""
    if encoding not in ("latin1", "latin-1") or type(text) is not str:
        raise UnsafePickle(f"_codecs.encode with {encoding!r} is not allowed")
    return codecs.encode(text, "latin1")


def _empty_bytes(*args: Any) -> bytes:
    """What pickle protocol 2 calls to rebuild b"": `bytes()`. With an argument, bytes()
    could allocate any size (`bytes(10**10)`): refused."""
    if args:
        raise UnsafePickle("bytes() with arguments is not allowed")
    return b""


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("pysyncobj.node", "Node"): Node,
    ("_codecs", "encode"): _latin1_encode,
    ("builtins", "bytes"): _empty_bytes,
    ("__builtin__", "bytes"): _empty_bytes,  # protocol 2's name for it
}


class RestrictedUnpickler(pickle.Unpickler):
    """pickle.Unpickler that resolves only ALLOWED_GLOBALS (module docstring)."""

    def find_class(self, module: str, name: str) -> Any:
        found = ALLOWED_GLOBALS.get((module, name))
        if found is None:
            raise UnsafePickle(f"global {module}.{name} is not allowed")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickle("persistent ids are not allowed")


def loads(data: bytes | bytearray | memoryview, start: int = 0) -> Any:
    """Unpickle data[start:] with RestrictedUnpickler; UnsafePickle for anything it refuses
    or any malformed pickle (an exception of any kind from the unpickler).

    `start` instead of a slice: BytesIO shares a bytes object's buffer until written, so
    a 1 MiB batch is not copied once more before it is read."""
    try:
        stream = io.BytesIO(data)
        stream.seek(start)
        return RestrictedUnpickler(stream, buffers=()).load()
    except UnsafePickle:
        raise
    except Exception as error:  # a malformed pickle can raise almost any type
        raise UnsafePickle(f"bad pickle: {type(error).__name__}: {error}") from None


def _is_node(value: Any) -> bool:
    return (
        type(value) is Node
        and set(vars(value)) == {"_id"}
        and type(value.id) is str
        and 0 < len(value.id) <= NODE_ID_CHARS_MAX
    )


def _check_membership(request: Any) -> None:
    """pysyncobj's `['add' | 'rem', node_id, Node(node_id)]`."""
    if not (
        type(request) is list
        and len(request) == 3
        and request[0] in ("add", "rem")
        and _is_node(request[2])
        and request[1] == request[2].id
    ):
        raise UnsafePickle("membership entry is not [add|rem, id, Node(id)]")


def _check_regular(command: Any) -> None:
    """dmq's one replicated call: `(method id, ([command bytes, ...],))` (raft/node.py)."""
    if not (
        type(command) is tuple
        and len(command) == 2
        and type(command[0]) is int
        and 0 <= command[0] < 2**16
        and type(command[1]) is tuple
        and len(command[1]) == 1
        and type(command[1][0]) is list
        and all(type(item) is bytes for item in command[1][0])
    ):
        raise UnsafePickle("command is not (method id, ([bytes, ...],))")


def check_command(command: Any) -> None:
    """Accept a pysyncobj log command (`u8 type | body`) or raise UnsafePickle.

    REGULAR: dmq's batch, unpickled and its shape checked; NO_OP: the one byte pysyncobj
    writes; MEMBERSHIP: an add/remove of a Node. VERSION entries (pysyncobj's code-version
    switch) are refused: dmq never writes one, and pysyncobj stops a node whose code is
    older than the version named.
    """
    if type(command) is not bytes or not command:
        raise UnsafePickle("a command is non-empty bytes")
    kind = command[0]
    if kind == _COMMAND_TYPE.NO_OP:
        if len(command) != 1:
            raise UnsafePickle("a no-op entry is one byte")
    elif kind == _COMMAND_TYPE.REGULAR:
        _check_regular(loads(command, 1))
    elif kind == _COMMAND_TYPE.MEMBERSHIP:
        _check_membership(loads(command, 1))
    else:
        raise UnsafePickle(f"command type {kind} is not accepted")


def load_membership(body: bytes) -> list[Any]:
    """The change request of a membership entry's body (after the type byte), checked."""
    request = loads(body)
    _check_membership(request)
    return list(request)


def load_snapshot(payload: bytes) -> tuple[tuple[Any, ...], bytes]:
    """(pysyncobj's bookkeeping, the machine's snapshot bytes) of a snapshot payload.

    The bookkeeping is `(last applied entry, the entry before it, cluster)`: entries are
    `(command, idx, term)` and the cluster a set of Nodes (raft/node.py `_write_snapshot`).
    """
    value = loads(payload)
    try:
        (data, state) = value
        (last, before, cluster) = data
        entries_ok = all(
            type(e) is tuple
            and len(e) == 3
            and type(e[0]) is bytes
            and type(e[1]) is int
            and type(e[2]) is int
            for e in (last, before)
        )
        cluster_ok = type(cluster) in (set, frozenset) and all(_is_node(n) for n in cluster)
    except (TypeError, ValueError):
        entries_ok = cluster_ok = False
    if not (entries_ok and cluster_ok and type(state) is bytes):
        raise UnsafePickle("snapshot is not ((entry, entry, {Node}), bytes)")
    return tuple(data), state


class _GuardedPickle:
    """What pysyncobj.syncobj sees as its `pickle` module: loads restricted, the rest as
    pysyncobj's own module (dumps, to_bytes)."""

    def __init__(self, original: Any) -> None:
        self.original = original

    @staticmethod
    def loads(data: Any) -> Any:
        # pysyncobj passes bytes; its own loads turned a str into UTF-8 first: so do we.
        return loads(data.encode() if isinstance(data, str) else data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


def guard_pysyncobj() -> None:
    """Make pysyncobj.syncobj unpickle through `loads` (idempotent, process-wide).

    pysyncobj.syncobj calls `pickle.loads` on log commands when it applies them (journal
    replay included), on membership entries when it appends them, and on the chunks of a
    large entry. Each of those bytes was checked when it arrived (raft/wire.py) or was
    written by this node; the guard makes sure nothing else slips through, whatever path
    a pysyncobj call takes. Only pysyncobj.syncobj's name `pickle` is rebound: its
    stock TCP transport (`raft.demo --stock`, the benchmark baseline) keeps its own.
    """
    current = _syncobj_module.pickle
    if not isinstance(current, _GuardedPickle):
        _syncobj_module.pickle = _GuardedPickle(current)

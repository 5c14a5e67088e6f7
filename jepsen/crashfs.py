"""What a power cut can leave on disk, rebuilt from a broker's traced file system calls.

`python -m jepsen.crash` (jepsen/crash.py) runs a broker under strace and hands the trace
to `parse_trace`, which keeps the calls that change files under the data directory, in the
order they completed. `Replay` then plays them into an in-memory model of that directory:
for every file (inode) its current bytes, what the page cache holds, and its durable
bytes, what the last fsync or fdatasync of it made durable. At each crash point the model
gives the directory a power cut there could leave (`CrashState`), in three variants:

- `synced`: every file holds what its last sync made durable; names (creations,
  renames, links, unlinks, mkdirs) are as the calls left them, in order. This is ext4's
  ordered mode: metadata reaches the journal in order, file data only when synced.
- `torn`: as `synced`, but each file that has unsynced bytes keeps the first half of them,
  cut at a page boundary (the page cache wrote back part of what was dirty, in order).
- `process`: everything the calls did (a kill -9 of the process: the page cache survives).

The ALICE and CrashMonkey papers (OSDI 2014, OSDI 2018) model more: reordered writes within
a file's unsynced window, and names lost without a directory fsync. This model keeps the
orders ext4 keeps, which is what dmq's files are written for (raft/README.md,
"Durability"); it is a lower bound on what a power cut can do, not an upper one.

Fidelity check: `Replay.final_tree()` (every call applied) must equal the directory the
broker left; `jepsen.crash` compares them before it explores anything, so a call the
model misses (a write through an fd it does not know) fails loudly instead of exploring
directories that never were.
"""

from __future__ import annotations

import hashlib
import heapq
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# The calls traced (jepsen/crash.py passes them to strace -e trace=...).
TRACED_CALLS = (
    "openat,open,creat,close,lseek,write,pwrite64,writev,pwritev,pwritev2,fsync,fdatasync,"
    "rename,renameat,renameat2,link,linkat,unlink,unlinkat,truncate,ftruncate,mkdir,mkdirat,"
    "rmdir,fallocate,dup,dup2,dup3,sendto,sendmsg"
)
SYNC_CALLS = frozenset({"fsync", "fdatasync"})
NAME_CALLS = frozenset(
    {"rename", "renameat", "renameat2", "link", "linkat", "unlink", "unlinkat", "mkdir",
     "mkdirat", "rmdir", "truncate"}
)  # fmt: skip
VARIANTS = ("synced", "torn", "process")
PAGE_BYTES = 4096

_LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(.*)$")
_CALL = re.compile(r"^([a-z0-9_]+)\((.*)$", re.S)
_RESUMED = re.compile(r"^<\.\.\. ([a-z0-9_]+) resumed>(.*)$", re.S)
_STRING = re.compile(r'"((?:\\x[0-9a-f]{2})*)"(\.\.\.)?')
_FD = re.compile(r"(-?\d+|AT_FDCWD)<((?:\\x[0-9a-f]{2})*)>(?:\(deleted\))?")
_RESULT = re.compile(r"\)\s+=\s+(-?\d+)(?:<((?:\\x[0-9a-f]{2})*)>)?[^)]*$")


class TraceError(Exception):
    """The trace cannot be modelled (a call the model does not know, a cut string)."""


def _unhex(text: str) -> bytes:
    return bytes.fromhex(text.replace("\\x", ""))


@dataclass(frozen=True, slots=True)
class Call:
    """One completed system call: its name, arguments (strings decoded, fds as
    (number, path)) and result."""

    seq: int
    time_s: float  # wall clock at the call's start (strace -ttt)
    name: str
    args: tuple[object, ...]
    result: int
    result_path: str | None


def _split_args(text: str) -> tuple[object, ...]:
    """The top-level arguments of a call: bytes for strings, (fd, path) for fds with
    paths, lists of bytes for iovec arrays, int where a number, else the raw token."""
    strings: list[bytes] = []

    def keep_string(match: re.Match[str]) -> str:
        if match.group(2):
            raise TraceError("a string was cut short: raise strace -s")
        strings.append(_unhex(match.group(1)))
        return f"\0S{len(strings) - 1}\0"

    text = _STRING.sub(keep_string, text)
    fds: list[tuple[int, str]] = []

    def keep_fd(match: re.Match[str]) -> str:
        number = -100 if match.group(1) == "AT_FDCWD" else int(match.group(1))
        fds.append((number, _unhex(match.group(2)).decode()))
        return f"\0F{len(fds) - 1}\0"

    text = _FD.sub(keep_fd, text)
    parts: list[str] = []
    depth, start = 0, 0
    for k, char in enumerate(text):
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:k].strip())
            start = k + 1
    parts.append(text[start:].strip())
    out: list[object] = []
    for part in parts:
        if part.startswith(("[", "{")):  # an iovec array or a msghdr: its buffers in order
            out.append([strings[int(s)] for s in re.findall(r"\0S(\d+)\0", part)])
        elif re.fullmatch(r"\0S(\d+)\0", part):
            out.append(strings[int(part[2:-1])])
        elif re.fullmatch(r"\0F(\d+)\0", part):
            out.append(fds[int(part[2:-1])])
        elif re.fullmatch(r"-?\d+", part):
            out.append(int(part))
        else:
            out.append(part)
    return tuple(out)


def parse_trace(path: Path) -> list[Call]:
    """The successful calls of an `strace -f -ttt -y -xx` trace, in the order they
    completed (an unfinished call is placed at its resumption)."""
    pending: dict[tuple[str, str], tuple[float, str]] = {}
    calls: list[Call] = []
    with open(path, encoding="ascii", errors="replace") as file:
        for line in file:
            match = _LINE.match(line.rstrip("\n"))
            if match is None:
                continue
            tid, time_s, rest = match.group(1), float(match.group(2)), match.group(3)
            resumed = _RESUMED.match(rest)
            if resumed is not None:
                name = resumed.group(1)
                start = pending.pop((tid, name), None)
                if start is None:
                    continue
                time_s, head = start
                rest = f"{name}({head}{resumed.group(2)}"
            elif rest.endswith("<unfinished ...>"):
                call = _CALL.match(rest)
                if call is not None:
                    pending[(tid, call.group(1))] = (
                        time_s,
                        call.group(2)[: -len("<unfinished ...>")],
                    )
                continue
            call = _CALL.match(rest)
            if call is None:
                continue
            body = call.group(2)
            tail = _RESULT.search(body)
            if tail is None:
                continue
            result = int(tail.group(1))
            if result < 0:
                continue  # failed calls change nothing
            result_path = _unhex(tail.group(2)).decode() if tail.group(2) is not None else None
            args = _split_args(body[: tail.start()])
            calls.append(Call(len(calls), time_s, call.group(1), args, result, result_path))
    return calls


@dataclass(slots=True)
class Inode:
    current: bytearray = field(default_factory=bytearray)
    durable: bytearray = field(default_factory=bytearray)


@dataclass(slots=True)
class OpenFile:
    inode: Inode
    position: int
    append: bool
    is_dir: bool
    path: str


@dataclass(frozen=True, slots=True)
class CrashState:
    """The directory a crash right after call `seq` leaves, in one variant."""

    seq: int
    time_s: float
    variant: str
    call: str  # what the call was (name and path), for reports
    files: dict[str, bytes]  # path relative to the root -> content
    dirs: frozenset[str]

    def digest(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self.dirs):
            h.update(b"d" + name.encode() + b"\0")
        for name in sorted(self.files):
            h.update(b"f" + name.encode() + b"\0" + hashlib.sha256(self.files[name]).digest())
        return h.hexdigest()

    def materialize(self, target: Path) -> None:
        for name in sorted(self.dirs, key=len):
            (target / name).mkdir(parents=True, exist_ok=True)
        for name, content in self.files.items():
            path = target / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)


class Replay:
    """Plays the calls that touch `root` into a model of its files (module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.names: dict[str, Inode] = {}
        self.dirs: set[str] = set()
        self.fds: dict[int, OpenFile] = {}

    def _inside(self, path: str | None) -> bool:
        return path is not None and (path == self.root or path.startswith(self.root + "/"))

    def _rel(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    def _resolve(self, dirfd: object, name: object) -> str:
        assert isinstance(name, bytes)
        text = name.decode()
        if text.startswith("/"):
            return os.path.normpath(text)
        base = dirfd[1] if isinstance(dirfd, tuple) else os.getcwd()
        return os.path.normpath(os.path.join(str(base), text))

    def apply(self, call: Call) -> bool:
        """Apply one call; whether it touched the root (and so may change a crash state)."""
        handler = getattr(self, "_on_" + call.name, None)
        if handler is None:
            return False
        return bool(handler(call))

    # --- opening and closing ------------------------------------------------------------

    def _open(self, call: Call, flags: str) -> bool:
        path = call.result_path
        if not self._inside(path):
            self.fds.pop(call.result, None)
            return False
        assert path is not None
        if "O_DIRECTORY" in flags or path in self.dirs or path == self.root:
            self.fds[call.result] = OpenFile(Inode(), 0, False, True, path)
            return False
        inode = self.names.get(path)
        created = inode is None
        if inode is None:
            inode = self.names[path] = Inode()
        if "O_TRUNC" in flags and inode.current:
            del inode.current[:]
            created = True
        self.fds[call.result] = OpenFile(inode, 0, "O_APPEND" in flags, False, path)
        return created

    def _on_openat(self, call: Call) -> bool:
        return self._open(call, str(call.args[2]))

    def _on_open(self, call: Call) -> bool:
        return self._open(call, str(call.args[1]))

    def _on_creat(self, call: Call) -> bool:
        return self._open(call, "O_CREAT|O_TRUNC")

    def _on_close(self, call: Call) -> bool:
        fd = call.args[0]
        if isinstance(fd, tuple):
            self.fds.pop(fd[0], None)
        return False

    def _dup(self, call: Call) -> bool:
        fd = call.args[0]
        if isinstance(fd, tuple) and fd[0] in self.fds:
            self.fds[call.result] = self.fds[fd[0]]
        else:
            self.fds.pop(call.result, None)
        return False

    _on_dup = _on_dup2 = _on_dup3 = _dup

    def _file(self, call: Call) -> OpenFile | None:
        fd = call.args[0]
        if not isinstance(fd, tuple):
            return None
        open_file = self.fds.get(fd[0])
        if open_file is None and self._inside(fd[1]):
            # strace may print another thread's use of an fd before the line of the open
            # that returned it: the fd's path (-y) names the file then.
            path = fd[1]
            if path in self.dirs or path == self.root:
                open_file = OpenFile(Inode(), 0, False, True, path)
            elif path in self.names:
                open_file = OpenFile(self.names[path], 0, False, False, path)
            else:
                raise TraceError(f"call {call.seq} {call.name} on {path}: an fd not seen opened")
            self.fds[fd[0]] = open_file
        return open_file

    # --- data -----------------------------------------------------------------------------

    @staticmethod
    def _write_at(inode: Inode, data: bytes, offset: int) -> None:
        current = inode.current
        if offset > len(current):
            current.extend(bytes(offset - len(current)))
        current[offset : offset + len(data)] = data

    def _write(self, call: Call, data: bytes, offset: int | None) -> bool:
        open_file = self._file(call)
        if open_file is None or open_file.is_dir:
            return False
        data = data[: call.result]  # a short write wrote its first bytes
        if offset is None:
            offset = len(open_file.inode.current) if open_file.append else open_file.position
            open_file.position = offset + len(data)
        self._write_at(open_file.inode, data, offset)
        return True

    def _on_write(self, call: Call) -> bool:
        data = call.args[1]
        return self._write(call, data if isinstance(data, bytes) else b"", None)

    def _on_pwrite64(self, call: Call) -> bool:
        data, offset = call.args[1], call.args[3]
        assert isinstance(data, bytes) and isinstance(offset, int)
        return self._write(call, data, offset)

    def _on_writev(self, call: Call) -> bool:
        buffers = call.args[1]
        return self._write(call, b"".join(buffers) if isinstance(buffers, list) else b"", None)

    def _on_pwritev(self, call: Call) -> bool:
        buffers, offset = call.args[1], call.args[3]
        assert isinstance(buffers, list) and isinstance(offset, int)
        return self._write(call, b"".join(buffers), offset)

    _on_pwritev2 = _on_pwritev

    def _on_lseek(self, call: Call) -> bool:
        open_file = self._file(call)
        if open_file is not None:
            open_file.position = call.result
        return False

    def _on_ftruncate(self, call: Call) -> bool:
        open_file = self._file(call)
        length = call.args[1]
        if open_file is None or open_file.is_dir or not isinstance(length, int):
            return False
        _resize(open_file.inode.current, length)
        return True

    def _on_truncate(self, call: Call) -> bool:
        path = self._resolve(None, call.args[0])
        inode = self.names.get(path)
        length = call.args[1]
        if inode is None or not isinstance(length, int):
            return False
        _resize(inode.current, length)
        return True

    def _on_fallocate(self, call: Call) -> bool:
        open_file = self._file(call)
        mode, offset, length = call.args[1], call.args[2], call.args[3]
        if open_file is None or not isinstance(offset, int) or not isinstance(length, int):
            return False
        if "KEEP_SIZE" not in str(mode) and offset + length > len(open_file.inode.current):
            _resize(open_file.inode.current, offset + length)
            return True
        return False

    def _sync(self, call: Call) -> bool:
        open_file = self._file(call)
        if open_file is None or open_file.is_dir:
            return open_file is not None
        inode = open_file.inode
        inode.durable = bytearray(inode.current)
        return True

    _on_fsync = _on_fdatasync = _sync

    # --- names ----------------------------------------------------------------------------

    def _rename(self, old: str, new: str) -> bool:
        if not (self._inside(old) or self._inside(new)):
            return False
        if old in self.dirs:
            moved = {d for d in self.dirs if d == old or d.startswith(old + "/")}
            self.dirs -= moved
            self.dirs |= {new + d[len(old) :] for d in moved}
            for name in [n for n in self.names if n.startswith(old + "/")]:
                self.names[new + name[len(old) :]] = self.names.pop(name)
            return True
        inode = self.names.pop(old, None)
        if inode is not None and self._inside(new):
            self.names[new] = inode
        return True

    def _on_rename(self, call: Call) -> bool:
        return self._rename(self._resolve(None, call.args[0]), self._resolve(None, call.args[1]))

    def _on_renameat(self, call: Call) -> bool:
        old = self._resolve(call.args[0], call.args[1])
        return self._rename(old, self._resolve(call.args[2], call.args[3]))

    _on_renameat2 = _on_renameat

    def _link(self, old: str, new: str) -> bool:
        inode = self.names.get(old)
        if inode is None or not self._inside(new):
            return False
        self.names[new] = inode
        return True

    def _on_link(self, call: Call) -> bool:
        return self._link(self._resolve(None, call.args[0]), self._resolve(None, call.args[1]))

    def _on_linkat(self, call: Call) -> bool:
        old = self._resolve(call.args[0], call.args[1])
        return self._link(old, self._resolve(call.args[2], call.args[3]))

    def _unlink(self, path: str, is_dir: bool) -> bool:
        if not self._inside(path):
            return False
        if is_dir:
            self.dirs.discard(path)
        else:
            self.names.pop(path, None)
        return True

    def _on_unlink(self, call: Call) -> bool:
        return self._unlink(self._resolve(None, call.args[0]), False)

    def _on_unlinkat(self, call: Call) -> bool:
        return self._unlink(
            self._resolve(call.args[0], call.args[1]), "AT_REMOVEDIR" in str(call.args[2])
        )

    def _on_rmdir(self, call: Call) -> bool:
        return self._unlink(self._resolve(None, call.args[0]), True)

    def _mkdir(self, path: str) -> bool:
        if not self._inside(path):
            return False
        self.dirs.add(path)
        return True

    def _on_mkdir(self, call: Call) -> bool:
        return self._mkdir(self._resolve(None, call.args[0]))

    def _on_mkdirat(self, call: Call) -> bool:
        return self._mkdir(self._resolve(call.args[0], call.args[1]))

    # --- crash states ---------------------------------------------------------------------

    def state(self, call: Call, variant: str) -> CrashState:
        files: dict[str, bytes] = {}
        for path, inode in self.names.items():
            if variant == "process":
                content = bytes(inode.current)
            elif variant == "synced":
                content = bytes(inode.durable)
            else:
                content = _torn(inode)
            files[self._rel(path)] = content
        dirs = frozenset(self._rel(d) for d in self.dirs if d != self.root)
        target = next((a[1] for a in call.args if isinstance(a, tuple)), None)
        if target is None:
            target = next((a.decode() for a in call.args if isinstance(a, bytes)), "")
        label = f"{call.name} {self._rel(str(target)) if self._inside(str(target)) else target}"
        return CrashState(call.seq, call.time_s, variant, label, files, dirs)

    def final_tree(self) -> dict[str, bytes]:
        return {self._rel(p): bytes(i.current) for p, i in self.names.items()}


def _resize(data: bytearray, length: int) -> None:
    if length < len(data):
        del data[length:]
    else:
        data.extend(bytes(length - len(data)))


def _torn(inode: Inode) -> bytes:
    """The durable bytes with the first half of what differs written back, in order, cut
    at a page boundary."""
    current, durable = inode.current, inode.durable
    if current == durable:
        return bytes(current)
    shorter = min(len(current), len(durable))
    first = next((k for k in range(shorter) if current[k] != durable[k]), shorter)
    cut = max(first, (first + len(current)) // 2 // PAGE_BYTES * PAGE_BYTES)
    return bytes(current[:cut]) + bytes(durable[cut:])


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """A moment a power cut may strike: after call `seq`, in one variant, leaving the
    state whose digest is `digest`."""

    seq: int
    time_s: float
    call: str
    variant: str
    digest: str


def crash_points(
    calls: list[Call],
    root: Path,
    variants: tuple[str, ...] = VARIANTS,
    after_s: float = 0.0,
    marker: bytes | None = None,
) -> tuple[list[CrashPoint], dict[str, CrashState]]:
    """Every crash point from `after_s` on, and the distinct states they leave.

    The points are the calls after which what a power cut leaves changes (each sync and
    name change under `root`), and the moments an acknowledgement left (a socket write
    holding `marker`): there the state is the last one, but more is promised."""
    replay = Replay(root)
    points: list[CrashPoint] = []
    states: dict[str, CrashState] = {}
    for call in calls:
        touched = replay.apply(call)
        if call.time_s < after_s:
            continue
        barrier = touched and (call.name in SYNC_CALLS or call.name in NAME_CALLS)
        if not barrier and not (marker is not None and _sent(call, marker)):
            continue
        for variant in variants:
            state = replay.state(call, variant)
            digest = state.digest()
            states.setdefault(digest, state)
            points.append(CrashPoint(call.seq, call.time_s, state.call, variant, digest))
    return points, states


@dataclass(frozen=True, slots=True)
class ClusterCrash:
    """A whole-cluster power cut: after `call` of node `node`, at `time_s`, every node
    left in the state its own calls so far give, all in one variant."""

    time_s: float
    node: str
    call: str
    variant: str
    states: dict[str, CrashState]  # node id -> its directory

    def digest(self) -> str:
        return hashlib.sha256(
            "".join(f"{n}:{self.states[n].digest()}" for n in sorted(self.states)).encode()
        ).hexdigest()


def cluster_crashes(
    traces: dict[str, tuple[list[Call], Path]],
    variants: tuple[str, ...] = VARIANTS,
    after_s: float = 0.0,
    marker: bytes | None = None,
) -> Iterator[ClusterCrash]:
    """Every whole-cluster crash point, in time order: each node's calls are played in
    their order and the nodes' interleaved by the time each call started (strace's
    clock, one machine); a point is each sync, name change or acknowledgement sent by
    any node. Lazily: a cluster's states are large, the explorer checks one at a time."""
    replays = {node: Replay(root) for node, (_, root) in traces.items()}
    merged = heapq.merge(*(_timed(node, calls) for node, (calls, _) in traces.items()))
    for time_s, node, _, call in merged:
        touched = replays[node].apply(call)
        if time_s < after_s:
            continue
        barrier = touched and (call.name in SYNC_CALLS or call.name in NAME_CALLS)
        if not barrier and not (marker is not None and _sent(call, marker)):
            continue
        for variant in variants:
            states = {n: r.state(call, variant) for n, r in replays.items()}
            label = f"{node}: {states[node].call}"
            yield ClusterCrash(time_s, node, label, variant, states)


def _timed(node: str, calls: list[Call]) -> Iterator[tuple[float, str, int, Call]]:
    return ((call.time_s, node, call.seq, call) for call in calls)


def _sent(call: Call, marker: bytes) -> bool:
    """Whether `call` wrote data holding `marker` to a socket."""
    if call.name not in ("write", "writev", "sendto", "sendmsg") or not call.args:
        return False
    fd = call.args[0]
    if not (isinstance(fd, tuple) and fd[1].startswith("socket:")) or len(call.args) < 2:
        return False
    return marker in _payload(call)


def _payload(call: Call) -> bytes:
    data = call.args[1]
    payload = b"".join(data) if isinstance(data, list) else data
    return payload if isinstance(payload, bytes) else b""


def socket_sends(calls: list[Call], marker: bytes) -> list[tuple[float, bytes]]:
    """When the traced process wrote data holding `marker` to a socket (an answer left
    it), and that data, in order: the moments acknowledgements went out."""
    return [(call.time_s, _payload(call)) for call in calls if _sent(call, marker)]


def tree_of(root: Path) -> dict[str, bytes]:
    """The files under `root`, relative path -> content (the fidelity check's other side)."""
    return {
        os.path.relpath(path, root): path.read_bytes() for path in root.rglob("*") if path.is_file()
    }

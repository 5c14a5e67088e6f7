"""The remote manifest: which closed segments of a partition sit in the object store.

Tiered storage (dmq/tiered/README.md) uploads a partition's closed segments to an object
store; the manifest says which ones, and it is replicated state of the partition's Raft
group, so that every replica agrees on what is safe to delete locally. Pure: no I/O, no
clock (time comes in the command), the same commands give the same manifest everywhere.

Commands (`RemoteCommand`, magic b"R", appended to the partition group's command set):

- `add`: the leader uploaded these segments (log, indexes) and records them. Each must
  start at or before the manifest's end (`base_offset <= end_offset`: no gap) and end
  after it (else it is a retry of an upload already recorded: ignored, not an error).
  Segments may overlap the previous one (a new leader's segment boundaries need not
  match the old leader's: rolls depend on each replica's history); a reader of offset o
  takes the last segment whose base_offset <= o.
- `trim`: total retention removed everything below `start_offset`: segments ending at or
  below it leave the manifest. The leader deletes their objects after the trim applied
  (manifest first, then objects: a reader never finds a manifest entry without objects,
  except for the moment of a read racing a trim, answered as out of range).

Invariants (checked by `check_manifest`, and by tests/partition/test_remote_manifest.py):
  start_offset <= end_offset; segments' end offsets strictly increase; each segment's
  base_offset <= the previous one's end_offset (contiguous); the first segment holds
  start_offset (base <= start < end) unless the manifest is empty; end_offset is the last
  segment's end. A replica deletes a local segment only if the manifest holds it whole
  (start_offset <= base, next_offset <= end_offset: `local_deletable`), that is only
  what a committed `add` recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

REMOTE_MAGIC = b"R"
REMOTE_COMMAND_VERSION = 1
# Segments one add carries, and aborted ranges one segment carries, at most: bounds the
# decode work and the manifest a snapshot holds (raft/ bounds the bytes of a command).
REMOTE_ADD_SEGMENTS_MAX = 1_024
REMOTE_ABORTED_PER_SEGMENT_MAX = 10_000

# (producer_id, first_offset, marker_offset) of an aborted transaction overlapping the
# segment, as dmq/partition/transactions.py keeps them: a read_committed read of remote
# data needs them after the local state forgot ranges below the local log start.
Aborted = tuple[int, int, int]


class RemoteCommandError(ValueError):
    """A remote command this code cannot read, or a manifest that breaks an invariant."""


@dataclass(frozen=True, slots=True)
class RemoteSegment:
    """One uploaded segment: [base_offset, end_offset), its objects under `key`."""

    base_offset: int
    end_offset: int  # the segment's next_offset: half-open
    size_bytes: int  # of the .log object
    index_bytes: int  # of the .index object
    first_timestamp_ms: int
    max_timestamp_ms: int
    key: str  # object key prefix: <key>.log, <key>.index, <key>.timeindex
    aborted: tuple[Aborted, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "base_offset": self.base_offset,
            "end_offset": self.end_offset,
            "size_bytes": self.size_bytes,
            "index_bytes": self.index_bytes,
            "first_timestamp_ms": self.first_timestamp_ms,
            "max_timestamp_ms": self.max_timestamp_ms,
            "key": self.key,
        }
        if self.aborted:
            doc["aborted"] = [list(a) for a in self.aborted]
        return doc

    @classmethod
    def from_doc(cls, doc: Any) -> RemoteSegment:
        if not isinstance(doc, dict):
            raise RemoteCommandError("a remote segment is a JSON object")
        try:
            ints = [
                doc[k]
                for k in (
                    "base_offset", "end_offset", "size_bytes", "index_bytes",
                    "first_timestamp_ms", "max_timestamp_ms",
                )
            ]  # fmt: skip
            key = doc["key"]
            aborted = doc.get("aborted", [])
        except KeyError as exc:
            raise RemoteCommandError(f"remote segment without {exc}") from None
        if not all(type(v) is int for v in ints) or not isinstance(key, str) or not key:
            raise RemoteCommandError("remote segment fields: ints and a non-empty key")
        if not isinstance(aborted, list) or len(aborted) > REMOTE_ABORTED_PER_SEGMENT_MAX:
            raise RemoteCommandError("remote segment aborted: a bounded list")
        ranges: list[Aborted] = []
        for a in aborted:
            if not (isinstance(a, list) and len(a) == 3 and all(type(v) is int for v in a)):
                raise RemoteCommandError("an aborted range is [producer_id, first, marker]")
            ranges.append((a[0], a[1], a[2]))
        base, end, size, index_bytes, first_ts, max_ts = ints
        segment = cls(base, end, size, index_bytes, first_ts, max_ts, key, tuple(ranges))
        if not 0 <= segment.base_offset < segment.end_offset or segment.size_bytes < 0:
            raise RemoteCommandError(
                f"remote segment [{segment.base_offset}, {segment.end_offset}) is empty or negative"
            )
        return segment


@dataclass(frozen=True, slots=True)
class RemoteManifest:
    """What the object store holds of one partition (module docstring)."""

    segments: tuple[RemoteSegment, ...] = ()
    start_offset: int = 0  # the first offset readable remotely
    end_offset: int = 0  # uploaded up to here, [start_offset, end_offset)
    # False until the first add: the first segment may start anywhere (the local log may
    # have lost its beginning to retention before remote storage was enabled).
    started: bool = False

    @property
    def remote_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    def first_offset(self, local_log_start_offset: int) -> int:
        """The partition's log start: the remote start when the remote part reaches the
        local log (else local total retention removed segments never uploaded)."""
        if self.segments and self.end_offset >= local_log_start_offset:
            return min(self.start_offset, local_log_start_offset)
        return local_log_start_offset

    def segment_for(self, offset: int) -> RemoteSegment | None:
        """The segment to read `offset` from: the last one with base_offset <= offset."""
        if not self.start_offset <= offset < self.end_offset:
            return None
        for segment in reversed(self.segments):
            if segment.base_offset <= offset:
                return segment if offset < segment.end_offset else None
        return None

    def to_doc(self) -> dict[str, Any]:
        return {
            "segments": [s.to_doc() for s in self.segments],
            "start_offset": self.start_offset,
            "end_offset": self.end_offset,
            "started": self.started,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_doc(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_doc(cls, doc: Any) -> RemoteManifest:
        if not isinstance(doc, dict) or not isinstance(doc.get("segments"), list):
            raise RemoteCommandError("a remote manifest is an object with segments")
        start, end, started = doc.get("start_offset"), doc.get("end_offset"), doc.get("started")
        if type(start) is not int or type(end) is not int or type(started) is not bool:
            raise RemoteCommandError("remote manifest offsets are ints, started a bool")
        manifest = cls(
            tuple(RemoteSegment.from_doc(s) for s in doc["segments"]), start, end, started
        )
        check_manifest(manifest)
        return manifest

    @classmethod
    def from_json(cls, text: str | None) -> RemoteManifest:
        return cls() if text is None else cls.from_doc(json.loads(text))


def check_manifest(m: RemoteManifest) -> None:
    """The invariants of the module docstring; RemoteCommandError names the broken one."""
    if not 0 <= m.start_offset <= m.end_offset:
        raise RemoteCommandError(f"start {m.start_offset} > end {m.end_offset}")
    if not m.segments:
        return
    if m.segments[-1].end_offset != m.end_offset:
        raise RemoteCommandError("the manifest's end is not its last segment's end")
    if not m.segments[0].base_offset <= m.start_offset < m.segments[0].end_offset:
        raise RemoteCommandError("the first segment does not hold the start offset")
    for before, after in zip(m.segments, m.segments[1:], strict=False):
        if not (after.base_offset <= before.end_offset < after.end_offset):
            raise RemoteCommandError(
                f"segments [{before.base_offset}, {before.end_offset}) and "
                f"[{after.base_offset}, {after.end_offset}) leave a gap or go backwards"
            )


@dataclass(frozen=True, slots=True)
class RemoteCommand:
    """`add` (segments) or `trim` (start_offset): module docstring."""

    op: str
    segments: tuple[RemoteSegment, ...] = ()
    start_offset: int = 0
    version: int = REMOTE_COMMAND_VERSION

    def encode(self) -> bytes:
        """`u8 'R' | u8 version | JSON {op, segments | start_offset}`."""
        body: dict[str, Any] = {"op": self.op}
        if self.op == "add":
            body["segments"] = [s.to_doc() for s in self.segments]
        else:
            body["start_offset"] = self.start_offset
        text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        return REMOTE_MAGIC + bytes([self.version]) + text

    @classmethod
    def decode(cls, data: bytes) -> RemoteCommand:
        if data[:1] != REMOTE_MAGIC or len(data) < 2:
            raise RemoteCommandError("not a remote command")
        if data[1] != REMOTE_COMMAND_VERSION:
            raise RemoteCommandError(f"unknown remote command version {data[1]}")
        try:
            body = json.loads(data[2:])
        except ValueError as exc:
            raise RemoteCommandError(f"remote command body: {exc}") from None
        if not isinstance(body, dict):
            raise RemoteCommandError("a remote command body is an object")
        op = body.get("op")
        if op == "add":
            raw = body.get("segments")
            if not isinstance(raw, list) or not 1 <= len(raw) <= REMOTE_ADD_SEGMENTS_MAX:
                raise RemoteCommandError(f"an add carries 1 to {REMOTE_ADD_SEGMENTS_MAX}")
            return cls("add", tuple(RemoteSegment.from_doc(s) for s in raw))
        if op == "trim":
            start = body.get("start_offset")
            if type(start) is not int or start < 0:
                raise RemoteCommandError("a trim's start_offset is an int >= 0")
            return cls("trim", start_offset=start)
        raise RemoteCommandError(f"unknown remote command op {op!r}")


def is_remote_command(command: bytes) -> bool:
    return command[:1] == REMOTE_MAGIC


@dataclass(frozen=True, slots=True)
class Applied:
    """What a command did: the new manifest, the segments a trim removed (their objects
    to delete), and why an add was refused (None: accepted or a recorded retry)."""

    manifest: RemoteManifest
    removed: tuple[RemoteSegment, ...] = field(default=())
    refused: str | None = None


def apply(m: RemoteManifest, command: RemoteCommand) -> Applied:
    """The one transition: deterministic, the same on every replica."""
    if command.op == "trim":
        start = min(max(m.start_offset, command.start_offset), m.end_offset)
        keep = tuple(s for s in m.segments if s.end_offset > start)
        removed = tuple(s for s in m.segments if s.end_offset <= start)
        return Applied(replace(m, segments=keep, start_offset=start), removed)
    segments = list(m.segments)
    start, end, started = m.start_offset, m.end_offset, m.started
    for segment in command.segments:
        if started and segment.end_offset <= end:
            continue  # a retried upload already recorded
        if started and segment.base_offset > end:
            return Applied(m, refused=f"segment at {segment.base_offset} leaves a gap after {end}")
        if not started or not segments:
            start = max(start, segment.base_offset) if started else segment.base_offset
        segments.append(segment)
        end, started = segment.end_offset, True
    return Applied(RemoteManifest(tuple(segments), start, end, started))


def local_deletable(
    segments: list[tuple[int, int, int, int]],
    manifest: RemoteManifest,
    *,
    now_ms: int,
    local_retention_ms: int | None,
    local_retention_bytes: int | None,
) -> int:
    """How many of the oldest local segments (base, next_offset, size_bytes,
    max_timestamp_ms), oldest first, may go: each held remotely, whole (start_offset <=
    base and next_offset <= end_offset, recorded by a committed add), and past local
    retention. A segment starting below the remote start (a leader whose log began later
    uploaded first) stays until total retention removes it."""
    if not manifest.started:
        return 0
    total = sum(s[2] for s in segments)
    count = 0
    for base, next_offset, size, max_ts in segments:
        if next_offset > manifest.end_offset or base < manifest.start_offset:
            break
        expired = local_retention_ms is not None and max_ts < now_ms - local_retention_ms
        oversize = local_retention_bytes is not None and total - size >= local_retention_bytes
        if not (expired or oversize):
            break
        total -= size
        count += 1
    return count

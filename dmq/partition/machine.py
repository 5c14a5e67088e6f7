"""PartitionStateMachine: a partition's PartitionLog as the state of its Raft group.

The replicated command is a `ProduceCommand`: the batches of one or more produce requests,
coalesced by the leader (group commit), and the log-append time the leader stamped. Every
replica applies it the same way: each batch is appended at the log end offset
(`assign_offsets=True`), then the high watermark moves to the log end (what is applied is
committed). Apply reads no clock: time is in the command.

**Applying exactly once across restarts.** The log is persistent, but pysyncobj re-applies
every journal entry after its last snapshot when the node restarts; appending those batches
again would duplicate them. Each command has a position in the Raft log, `(index, k)`: the
entry's index and the command's place among the entry's commands (raft/replica.py coalesces
proposals into one entry). RaftNode hands it to `apply_at`. The machine keeps an **applied
checkpoint** next to the log (`raft-applied`): one record `(index, k, log_end_offset)` per
applied command, written (not synced) after its batches. Replay skips every position at or
below the checkpoint. The two files reach the disk independently, so `open` reconciles them:

1. drop a torn or corrupt tail of the checkpoint (each record has a CRC-32C);
2. take the last record whose log_end_offset <= the log's end (records past it describe
   data the log lost: those commands will be replayed);
3. cut the log back to that record's log_end_offset (data past it belongs to commands the
   checkpoint lost: they will be replayed and give the same bytes, offsets being assigned
   at apply);
4. rewrite the checkpoint as that one record, durably.

A checkpoint that says RESTORING (a restore() was interrupted) keeps the log as it is and
serves nothing: pysyncobj loads the installed snapshot again at start, and restore() ends
the job. A record lost below a durable one means flushed data is gone: the node stops.

Replay needs the journal to still hold every entry after the chosen record. `snapshot()`
guarantees it: pysyncobj drops journal entries only after a snapshot, and `snapshot()`
flushes the log and rewrites the checkpoint durably before returning. So the chosen record
is never older than the snapshot, whose position pysyncobj replays from.

**Snapshots hold no partition data**, only `PartitionSnapshot`: the partition, its
log_start_offset and log_end_offset, the last applied position and the delay store's
pending count (the store is streamed from another replica at restore, as of that
position: `_restore_delay`, dmq/partition/delay.py). `restore` keeps a local
log that already covers the snapshot; copies what is missing from the leader through the
owner's `fetch_missing(from_offset, to_offset)` (raw batches with their offsets, appended
with `assign_offsets=False`; the broker implements it over HTTP); and restarts a log that
contradicts the snapshot at its log_start_offset (see `restore`). A copy from a compacted
source may end short of the snapshot's end (whole batches removed); it is accepted only up
to the offset the source vouches for (`CopiedChunk.covered_end_offset`), and the log then
rolls to the snapshot's end, so offsets assigned after it match the leader's.

**Idempotent producers.** Before a batch with a producer id is appended, its producer's
epoch and sequence are checked (dmq/partition/producers.py): a retry is answered with its original
base offset and not written, a gap or an old epoch is refused. That state is replicated
state, never read back from the local log (compaction and retention change each replica's
log on its own clock). It travels in the snapshot (`PartitionSnapshot.producers`) and is
stored next to the checkpoint (`raft-producers`: position, log_end_offset, state), written
durably by `checkpoint()` before the checkpoint itself, so it is a durable checkpoint
record too. Each checkpoint record also says whether its command carried a batch with a
producer id (bit 63 of the index). At open, if a record after the stored state's position
says so (or the checkpoint no longer shows what came between), the log is cut back to the
stored state's log_end_offset and the journal replays the commands after it: the state
is then rebuilt by apply itself, the same on every replica whatever its compaction or
retention did. Commands without producer ids are still skipped on replay.

**Transactions.** A transactional batch opens its producer's transaction in the
partition; a control batch (a marker the coordinator writes) closes it, commit or abort,
and moves the producer to the marker's epoch, which fences the ended transaction's late
batches; a bumped marker (epoch + 1 per transaction) of an epoch the producer already
has here is a duplicate, refused, nothing written (dmq/partition/transactions.py). The open
transactions and aborted ranges are replicated state like the producer states: stored
in the same `raft-producers` file (its head's `transactions` key) and in the snapshot
(`PartitionSnapshot.transactions`, left out while empty); every batch of either kind has
a producer id, so the replay rule above rebuilds them too. `last_stable_offset` (the
first offset of the oldest open transaction, else the log end) is recomputed after each
command and read by other threads as one int. A `TrimCommand` (the leader's, after its
retention or compaction) shortens the aborted list the same on every replica; each
replica keeps locally the trimmed ranges its own log still holds (`clean_below`,
dmq/partition/transactions.py "Forgetting aborted ranges"); its checkpoint record says
the transaction state changed, so a restart replays it like a transactional batch.

Threading: every method runs on the RaftNode's tick thread, the one writer of the log.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import crc32c

from dmq.compat import too_new_message
from dmq.errors import DmqError, FormatTooNew
from dmq.partition.delay import DelayCommand, DelayCopyError, DelayStore, is_delay_command
from dmq.partition.producers import ProducerStates
from dmq.partition.remote_manifest import (
    RemoteCommand,
    RemoteCommandError,
    RemoteManifest,
    RemoteSegment,
    is_remote_command,
)
from dmq.partition.remote_manifest import apply as apply_remote
from dmq.partition.transactions import SavedTransactions, TransactionStates, read_marker
from log import InvalidOffsetError, InvalidRecordError, LogError, PartitionLog, StorageError
from log.errors import CorruptRecordError, StorageWriteError
from log.records import BatchHeader, read_header
from log.segment import NO_SPACE_ERRNOS, fsync_directory, write_durably
from raft.errors import ApplyDeferred

PRODUCE_COMMAND_VERSION = 1
# Batches one command carries, at most: bounds decode work (raft/ bounds the bytes).
PRODUCE_COMMAND_BATCHES_MAX = 65_536
_COMMAND_MAGIC = b"P"
# magic, version, flags (bit 0: log_append_time_ms present), log_append_time_ms, batch count
_COMMAND_HEADER = struct.Struct("<cBBqI")
_BATCH_LENGTH = struct.Struct("<I")
_FLAG_LOG_APPEND_TIME = 0x01

APPLIED_CHECKPOINT = "raft-applied"
# Tiered storage's manifest (dmq/partition/remote_manifest.py), written durably at each
# apply of a remote command (its apply is idempotent: a replay changes nothing).
REMOTE_MANIFEST = "remote-manifest"
PRODUCER_STATE = "raft-producers"
# The formats of those two files, in their JSON's `format` key (absent in 0.1.0's files:
# format 1, which 0.1.0 reads, ignoring the key). A newer one is refused as newer
# (here, and before the broker opens anything: dmq/data_formats.py).
PRODUCER_STATE_FORMAT: Final = 1
REMOTE_MANIFEST_FORMAT: Final = 1
# Set in a checkpoint record's index when its command carried a batch with a producer id.
_PRODUCERS_TOUCHED = 1 << 63
# index, k (command within the entry), log_end_offset after it, crc32c of the first 20 bytes
_CHECKPOINT_RECORD = struct.Struct("<QIQI")
_CHECKPOINT_BODY = struct.Struct("<QIQ")
SNAPSHOT_VERSION = 2  # 2 adds producers; 1 is still read (producers rebuilt from the log)

# (index, k): a command's place in the Raft log. (0, 0) is before every command: pysyncobj
# numbers entries from 1.
Position = tuple[int, int]
POSITION_NONE: Position = (0, 0)
# The checkpoint while restore() changes the log: its data is vouched for by no position.
# Above (0, 0) and below every real position, so it makes replay skip nothing.
POSITION_RESTORING: Position = (0, 0xFFFF_FFFF)
# What `raft-producers` holds: position, log_end_offset, producer and transaction states.
StoredState = tuple[Position, int, ProducerStates, TransactionStates]


@dataclass(frozen=True, slots=True)
class CopiedChunk:
    """One part of a copy from another replica (`fetch_missing`).

    `batches`: whole raw batches in offset order, each starting at or after the previous
    chunk's `covered_end_offset`. `covered_end_offset`: the source vouches that its
    committed log holds nothing more below it than these batches and the earlier chunks'.
    Any offset below it that no batch holds is a gap the source's compaction left (a
    batch whose records were all removed); the source never vouches past its own high
    watermark, so a source that lacks data cannot make a copy look complete.
    """

    batches: tuple[bytes, ...]
    covered_end_offset: int


FetchMissing = Callable[[int, int], Iterable[CopiedChunk]]
"""fetch_missing(from_offset, to_offset): another replica's batches covering [from, to)."""
FetchDelayed = Callable[[Position], Iterable[Iterable[bytes]]]
"""fetch_delayed(position): other replicas' delay stores as they were at `position`
(DelayStore.export streams), one per replica, the leader first; each is read lazily and
the first that arrives whole is kept (a failure while reading one moves to the next)."""


class CommandDecodeError(ValueError):
    """A command this code cannot read: malformed, or from a newer version."""


@dataclass(frozen=True, slots=True)
class ProduceCommand:
    """One Raft command: batches appended in order, with the leader's log-append time."""

    version: int
    batches: tuple[bytes, ...]
    log_append_time_ms: int | None

    def encode(self) -> bytes:
        """`u8 'P' | u8 version | u8 flags | i64 time | u32 count | (u32 len | batch)*`."""
        if self.version != PRODUCE_COMMAND_VERSION:
            raise ValueError(f"cannot encode produce command version {self.version}")
        if not 1 <= len(self.batches) <= PRODUCE_COMMAND_BATCHES_MAX:
            raise ValueError(f"a produce command carries 1 to {PRODUCE_COMMAND_BATCHES_MAX}")
        flags = 0 if self.log_append_time_ms is None else _FLAG_LOG_APPEND_TIME
        time_ms = self.log_append_time_ms or 0
        parts = [
            _COMMAND_HEADER.pack(_COMMAND_MAGIC, self.version, flags, time_ms, len(self.batches))
        ]
        for batch in self.batches:
            parts.append(_BATCH_LENGTH.pack(len(batch)))
            parts.append(batch)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> ProduceCommand:
        """The inverse of encode; refuses unknown versions, flags and any malformed frame."""
        view = memoryview(data)
        if len(view) < _COMMAND_HEADER.size:
            raise CommandDecodeError(f"produce command of {len(view)} bytes is too short")
        magic, version, flags, time_ms, count = _COMMAND_HEADER.unpack_from(view)
        if magic != _COMMAND_MAGIC:
            raise CommandDecodeError(f"not a produce command (magic {magic!r})")
        if version != PRODUCE_COMMAND_VERSION:
            raise CommandDecodeError(f"unknown produce command version {version}")
        if flags & ~_FLAG_LOG_APPEND_TIME:
            raise CommandDecodeError(f"unknown produce command flags {flags:#x}")
        if not 1 <= count <= PRODUCE_COMMAND_BATCHES_MAX:
            raise CommandDecodeError(f"produce command with {count} batches")
        batches: list[bytes] = []
        pos = _COMMAND_HEADER.size
        for _ in range(count):
            if pos + _BATCH_LENGTH.size > len(view):
                raise CommandDecodeError("produce command cut short in a batch length")
            (length,) = _BATCH_LENGTH.unpack_from(view, pos)
            pos += _BATCH_LENGTH.size
            if pos + length > len(view):
                raise CommandDecodeError("produce command cut short in a batch")
            batches.append(bytes(view[pos : pos + length]))
            pos += length
        if pos != len(view):
            raise CommandDecodeError(f"{len(view) - pos} bytes after the last batch")
        log_append_time_ms = time_ms if flags & _FLAG_LOG_APPEND_TIME else None
        return cls(version, tuple(batches), log_append_time_ms)


_TRIM_MAGIC = b"T"
TRIM_COMMAND_VERSION: Final = 1
# magic, version, horizon
_TRIM_COMMAND = struct.Struct("<cBq")


@dataclass(frozen=True, slots=True)
class TrimCommand:
    """Forget the aborted ranges whose marker lies below `horizon` (replicated: the
    partition leader proposes it; dmq/partition/transactions.py, "Forgetting aborted
    ranges"). `u8 'T' | u8 version | i64 horizon`."""

    horizon: int

    def encode(self) -> bytes:
        if self.horizon < 0:
            raise ValueError("a trim horizon is an offset")
        return _TRIM_COMMAND.pack(_TRIM_MAGIC, TRIM_COMMAND_VERSION, self.horizon)

    @classmethod
    def decode(cls, data: bytes) -> TrimCommand:
        if len(data) != _TRIM_COMMAND.size:
            raise CommandDecodeError(f"trim command of {len(data)} bytes")
        magic, version, horizon = _TRIM_COMMAND.unpack(data)
        if magic != _TRIM_MAGIC or version != TRIM_COMMAND_VERSION or horizon < 0:
            raise CommandDecodeError(f"unknown trim command {magic!r} {version} {horizon}")
        return cls(horizon)


def is_trim_command(command: bytes) -> bool:
    return command[:1] == _TRIM_MAGIC


@dataclass(frozen=True, slots=True)
class PartitionSnapshot:
    """What a partition group's snapshot holds: metadata only, never segment data."""

    partition: str
    log_start_offset: int
    log_end_offset: int
    applied: Position
    producers: str | None = None  # ProducerStates.to_json() at `applied`; None from version 1
    delayed: str | None = None  # pending delayed records as JSON: read, no longer written
    # json of TransactionStates.to_doc() at `applied`; None when written before transactions
    transactions: str | None = None
    # Delayed records pending at `applied`: a restore copies the store (delay.py) and
    # checks the count. Left out when 0 (older nodes read the snapshot).
    delay_pending: int = 0
    # RemoteManifest.to_json() at `applied` (tiered storage); left out while never used.
    remote: str | None = None

    def encode(self) -> bytes:
        fields: dict[str, object] = {
            "version": SNAPSHOT_VERSION,
            "partition": self.partition,
            "log_start_offset": self.log_start_offset,
            "log_end_offset": self.log_end_offset,
            "applied_index": self.applied[0],
            "applied_k": self.applied[1],
            "producers": self.producers,
        }
        if self.delayed is not None:  # absent when none are pending: older nodes read it
            fields["delayed"] = self.delayed
        if self.transactions is not None:
            fields["transactions"] = self.transactions
        if self.delay_pending:
            fields["delay_pending"] = self.delay_pending
        if self.remote is not None:
            fields["remote"] = self.remote
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> PartitionSnapshot:
        fields = json.loads(data)
        found = fields.get("version")
        if isinstance(found, int) and found > SNAPSHOT_VERSION:
            raise CommandDecodeError(too_new_message("partition snapshot", found, SNAPSHOT_VERSION))
        if found not in (1, SNAPSHOT_VERSION):
            raise CommandDecodeError(f"unknown partition snapshot version {fields.get('version')}")
        return cls(
            str(fields["partition"]),
            int(fields["log_start_offset"]),
            int(fields["log_end_offset"]),
            (int(fields["applied_index"]), int(fields["applied_k"])),
            None if fields.get("producers") is None else str(fields["producers"]),
            None if fields.get("delayed") is None else str(fields["delayed"]),
            None if fields.get("transactions") is None else str(fields["transactions"]),
            int(fields.get("delay_pending", 0)),
            None if fields.get("remote") is None else str(fields["remote"]),
        )


def _invariant(condition: bool, message: str) -> None:
    """Survives python -O: a broken invariant stops the node (StorageError)."""
    if not condition:
        raise StorageError(message)


class PartitionStateMachine:
    """raft's StateMachine over one PartitionLog (module docstring). Not thread-safe."""

    def __init__(
        self,
        partition: str,
        log: PartitionLog,
        fetch_missing: FetchMissing | None = None,
        fetch_delayed: FetchDelayed | None = None,
    ) -> None:
        self.partition = partition
        self.log = log
        self.fetch_missing = fetch_missing
        self.fetch_delayed = fetch_delayed
        self.checkpoint_path = log.directory / APPLIED_CHECKPOINT
        self.producers_path = log.directory / PRODUCER_STATE
        self.producers = ProducerStates()  # set by _reconcile (dmq/partition/producers.py)
        # Open and aborted transactions (dmq/partition/transactions.py), stored with the
        # producer states; last_stable_offset is read by other threads (an int).
        self.transactions = TransactionStates()
        self.last_stable_offset = 0
        # A compaction pass covered [log start, this): no aborted record is left there
        # (log/compaction.py). Local, not stored: 0 after a restart keeps ranges longer.
        self.compacted_below = 0
        self.applied: Position = POSITION_NONE
        self.replayed_commands = 0  # skipped as already applied (a metric, and for tests)
        self._checkpoint_fd = -1  # appends one record per applied command
        self.remote_path = log.directory / REMOTE_MANIFEST
        # Tiered storage: replaced whole at each remote command, so other threads read
        # it without the lock (one attribute read).
        self.remote = _read_remote_manifest(self.remote_path)
        # Segments a trim removed from the manifest, for the leader to delete the objects
        # of (taken by the broker's tiered service; bounded by what trims remove).
        self.remote_removed: list[RemoteSegment] = []
        self._reconcile()
        self.delay = DelayStore.open(log.directory, self.applied)  # dmq/partition/delay.py

    def close(self) -> None:
        """Flush the log and the checkpoint; the log itself stays open (its owner closes it)."""
        try:
            self.checkpoint()
        finally:
            os.close(self._checkpoint_fd)
            self._checkpoint_fd = -1

    # --- apply ------------------------------------------------------------------------------

    def apply(self, command: bytes) -> list[int | LogError] | None:
        raise TypeError("PartitionStateMachine needs its Raft position: call apply_at")

    def apply_at(self, index: int, k: int, command: bytes) -> list[int | LogError] | None:
        """Append the command's batches at the log end; None if applied before a restart.

        Returns each batch's base offset, or the InvalidRecordError that refused it (the
        same on every replica: size and CRC). A write the disk refused (StorageWriteError,
        undone) raises ApplyDeferred: the replica retries this command later. Any other
        StorageError propagates and stops the node. An unknown command version raises
        too: this replica cannot follow the log.
        """
        position = (index, k)
        if position <= self.applied:
            self.replayed_commands += 1
            return None
        if is_delay_command(command):  # schedule, release, cancel: dmq/partition/delay.py
            return self._apply_delay(position, DelayCommand.decode(command))
        if is_remote_command(command):  # tiered storage: dmq/partition/remote_manifest.py
            return self._apply_remote(position, command)
        if is_trim_command(command):
            return self._apply_trim(position, TrimCommand.decode(command))
        produce = ProduceCommand.decode(command)
        start_offset = self.log.log_end_offset
        undo = self.producers.save_for(produce.batches)
        transactions_before = self._transactions_before(produce.batches)
        try:
            return self._append_command(position, produce)
        except StorageWriteError as error:
            # A full disk (or an I/O error) mid-command: put the log, the producer and
            # the transaction state back as they were before it, so the retry applies it
            # whole, the same as every other replica did (raft/README.md, "A full disk").
            if self.log.log_end_offset > start_offset:
                self.log.truncate_to(start_offset)
            self.producers.restore_saved(undo)
            if transactions_before is not None:
                self.transactions.restore_saved(transactions_before)
            raise ApplyDeferred(
                f"partition {self.partition}: {error}", no_space=error.no_space
            ) from error

    def _apply_delay(self, position: Position, command: DelayCommand) -> list[int | LogError]:
        """A delay command, undone like a produce if the disk refuses any of its writes
        (the store's entries, the released batch, the checkpoint record): ApplyDeferred.
        A schedule with an idempotent producer that repeats one of its last schedules is
        answered with that one's schedule ids and not scheduled again."""
        start_offset = self.log.log_end_offset
        producer, saved = command.producer, None
        if producer is not None:
            try:
                first = self.producers.check_schedule(producer, len(command.scheduled))
            except InvalidRecordError as error:
                return self._delay_answer(position, [error], touched=False)
            if first is not None:  # a retry: the sids of the same place in that command
                return self._delay_answer(
                    position, [first + i for i in range(len(command.scheduled))], touched=False
                )
            saved = self.producers.save_schedule(producer[0])
        try:
            applied = self.delay.apply(position, command, self.log)
            if producer is not None:
                self.producers.record_schedule(producer, len(command.scheduled), applied[0])
            self._append_checkpoint(
                _checkpoint_record(position, self.log.log_end_offset, producer is not None)
            )
        except StorageWriteError as error:
            self.delay.undo()
            if producer is not None:
                self.producers.restore_schedule(producer[0], saved)
            if self.log.log_end_offset > start_offset:
                self.log.truncate_to(start_offset)
            raise ApplyDeferred(
                f"partition {self.partition}: {error}", no_space=error.no_space
            ) from error
        self.log.set_high_watermark(self.log.log_end_offset)
        self.applied = position
        return list(applied)

    def _apply_remote(self, position: Position, command: bytes) -> list[int | LogError]:
        """Record uploaded segments or a remote trim. The manifest is written durably
        before the checkpoint record: a replay (of a command the checkpoint lost) applies
        it again to the same manifest, which changes nothing."""
        try:
            applied = apply_remote(self.remote, RemoteCommand.decode(command))
        except RemoteCommandError as error:
            raise CommandDecodeError(f"partition {self.partition}: {error}") from error
        if applied.manifest != self.remote:
            try:
                _write_remote_manifest(self.remote_path, applied.manifest)
            except OSError as error:
                raise ApplyDeferred(
                    f"partition {self.partition}: remote manifest not written: {error}",
                    no_space=error.errno in NO_SPACE_ERRNOS,
                ) from error
            self.remote = applied.manifest
            self.remote_removed.extend(applied.removed)
        answer: list[int | LogError] = [self.remote.end_offset]
        if applied.refused is not None:
            answer = [InvalidOffsetError(applied.refused, field="segments")]
        return self._delay_answer(position, answer, touched=False)

    def _delay_answer(
        self, position: Position, answer: list[int | LogError], *, touched: bool
    ) -> list[int | LogError]:
        """A delay command that changed nothing: only its checkpoint record."""
        try:
            self._append_checkpoint(_checkpoint_record(position, self.log.log_end_offset, touched))
        except StorageWriteError as error:
            raise ApplyDeferred(
                f"partition {self.partition}: {error}", no_space=error.no_space
            ) from error
        self.applied = position
        return answer

    def _apply_trim(self, position: Position, command: TrimCommand) -> list[int | LogError]:
        """Trim the replicated aborted list (its checkpoint record says the transaction
        state changed, so a restart replays it from the stored state)."""
        record = _checkpoint_record(position, self.log.log_end_offset, True)
        try:
            self._append_checkpoint(record)
        except StorageWriteError as error:
            raise ApplyDeferred(
                f"partition {self.partition}: {error}", no_space=error.no_space
            ) from error
        self.transactions.trim(command.horizon, self.clean_below)
        self.applied = position
        return []

    @property
    def clean_below(self) -> int:
        """This replica's log holds no record of an aborted range whose marker is below
        it: its log start offset, or the end of its last compaction pass (local). With
        tiered storage, segments below the local log start carry their own aborted ranges
        in the remote manifest (taken at upload, which waits for the LSO to pass them)."""
        return max(self.log.log_start_offset, self.compacted_below)

    def after_cleaning(self, compacted_below: int | None = None) -> None:
        """After retention (and a compaction pass that covered [start, compacted_below)):
        forget the locally kept aborted ranges whose records are gone here."""
        if compacted_below is not None:
            self.compacted_below = max(self.compacted_below, compacted_below)
        self.transactions.forget_local(self.clean_below)

    def _append_command(
        self, position: Position, produce: ProduceCommand
    ) -> list[int | LogError] | None:
        results: list[int | LogError] = []
        touched = False  # a batch with a producer id: the checkpoint record says so
        for batch in produce.batches:
            end_before = self.log.log_end_offset
            try:
                header = read_header(batch, 0)
                touched = touched or header.producer_id >= 0
                if header.is_control:  # a transaction marker (dmq/partition/transactions.py)
                    results.append(self._apply_marker(batch, header, produce))
                    continue
                self.transactions.check_data(header)
                duplicate = self.producers.check(header, end_before)
                if duplicate is not None:  # a producer's retry: answered, not written again
                    results.append(duplicate)
                    continue
                appended = self.log.append(
                    batch, assign_offsets=True, log_append_time_ms=produce.log_append_time_ms
                )
            except InvalidRecordError as error:
                results.append(error)
                continue
            self.producers.record(header, appended.base_offset, end_before)
            self.transactions.on_data(header, appended.base_offset)
            results.append(appended.base_offset)
        log_end_offset = self.log.log_end_offset
        self._append_checkpoint(_checkpoint_record(position, log_end_offset, touched))
        self.log.set_high_watermark(log_end_offset)
        self.transactions.forget_local(self.clean_below)
        self.last_stable_offset = self.transactions.last_stable_offset(log_end_offset)
        self.applied = position
        return results

    def _append_checkpoint(self, record: bytes) -> None:
        """One checkpoint record; a failed or short write is cut back and raised as a
        StorageWriteError (the caller undoes the command's appends)."""
        fd = self._checkpoint_fd
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, record)
        except OSError as exc:
            written = -1
            reason = str(exc)
            no_space = exc.errno in NO_SPACE_ERRNOS
        else:
            reason, no_space = f"short write: {written} of {len(record)} bytes", True
        if written != len(record):
            os.ftruncate(fd, size)
            raise StorageWriteError(f"checkpoint record not written: {reason}", no_space=no_space)

    def _apply_marker(self, batch: bytes, header: BatchHeader, produce: ProduceCommand) -> int:
        """Append a marker and close its producer's open transaction; raises the
        InvalidRecordError that refuses it (fenced, malformed), the same on every replica."""
        end_before = self.log.log_end_offset
        kind, transaction_epoch = read_marker(batch)
        if header.producer_id < 0 or not header.is_transactional:
            raise CorruptRecordError("a marker names its producer", field="producer_id")
        self.producers.check_marker(header, end_before, bumped=transaction_epoch is not None)
        self.transactions.check_marker(header, transaction_epoch)
        appended = self.log.append(
            batch, assign_offsets=True, log_append_time_ms=produce.log_append_time_ms
        )
        self.producers.record_marker(header, appended.base_offset, end_before)
        self.transactions.on_marker(header.producer_id, kind, appended.base_offset)
        return appended.base_offset

    def _transactions_before(self, batches: tuple[bytes, ...]) -> SavedTransactions | None:
        """What to put back in the transaction state if the disk refuses this command
        (apply_at; TransactionStates.save: the open transactions, not every aborted
        range); None when no batch is transactional (the usual case: free)."""
        for batch in batches:
            try:
                transactional = read_header(batch, 0).is_transactional
            except InvalidRecordError:  # refused at apply: it changes nothing
                continue
            if transactional:
                return self.transactions.save()
        return None

    # --- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Metadata only; first makes the log and the checkpoint durable (the journal
        entries this snapshot replaces are dropped right after it returns)."""
        self.checkpoint()
        self.delay.maybe_compact(self.applied)
        return PartitionSnapshot(
            self.partition,
            self.log.log_start_offset,
            self.log.log_end_offset,
            self.applied,
            self.producers.to_json(),
            None,
            self._transactions_text(),
            self.delay.pending_count,
            None if not self.remote.started else self.remote.to_json(),
        ).encode()

    def export_delay(self, position: Position) -> Generator[bytes, None, None]:
        """The delay store as it was at `position`, for a replica installing a snapshot
        (DelayStore.export); DelayCopyError if this replica has not applied it yet."""
        if self.applied == POSITION_RESTORING or self.applied < position:
            raise DelayCopyError(f"{self.partition}: applied {self.applied}, not {position}")
        return self.delay.export(position)

    def _transactions_text(self) -> str | None:
        """The transaction state for a snapshot; None (left out) when there is none."""
        t = self.transactions
        if not t.open_transactions and not t.aborted and not t.trim_horizon:
            return None
        return json.dumps(t.to_doc(), separators=(",", ":"))

    def checkpoint(self) -> None:
        """fdatasync the log, then durably store the producer state and rewrite the
        checkpoint as one record, both at the applied position."""
        self.log.flush()
        self._save(self.applied, self.log.log_end_offset)
        self.delay.after_checkpoint()

    def _save(self, position: Position, log_end_offset: int) -> None:
        """The producer state first: once durable it vouches for `position` on its own."""
        body = json.dumps(
            {
                "format": PRODUCER_STATE_FORMAT,
                "index": position[0],
                "k": position[1],
                "log_end_offset": log_end_offset,
                "transactions": self.transactions.to_doc(),
            }
        ).encode()
        state = self.producers.to_json().encode()
        payload = body + b"\n" + state
        write_durably(self.producers_path, struct.pack("<I", crc32c.crc32c(payload)) + payload)
        fsync_directory(self.producers_path.parent)
        self._rewrite_checkpoint(position, log_end_offset)

    def restore(self, snapshot: bytes) -> None:
        """Bring the local log to the snapshot: keep it, cut it back, or copy from the leader.

        Applied positions and log end offsets grow together, and applied data is committed
        data, the same on every replica. So a log consistent with the snapshot is either
        covering it (position and end both at or past it: nothing to do) or behind it (both
        before it: copy [log_end_offset, snapshot end) from the leader). Anything else
        contradicts the snapshot: none of the local data can be trusted, the log restarts
        at the snapshot's log_start_offset and everything is copied. A restore that a crash
        interrupted left data no position vouches for: past the snapshot's end it is cut.
        """
        wanted = PartitionSnapshot.decode(snapshot)
        _invariant(wanted.partition == self.partition, f"snapshot of {wanted.partition}")
        log = self.log
        applied, end_offset = self.applied, log.log_end_offset
        if (applied > wanted.applied and end_offset >= wanted.log_end_offset) or (
            applied == wanted.applied and end_offset == wanted.log_end_offset
        ):
            return  # the local log covers the snapshot (a restart on its own snapshot)
        behind = applied < wanted.applied and end_offset <= wanted.log_end_offset
        # From here the log holds data no applied position vouches for: say so durably,
        # so that a crash before the end reopens without cutting and restore runs again.
        self.applied = POSITION_RESTORING
        self._rewrite_checkpoint(POSITION_RESTORING, end_offset)
        start = _restore_start(wanted)
        if applied == POSITION_RESTORING and end_offset > wanted.log_end_offset:
            self._cut_to(wanted)
        elif not behind or end_offset < start:
            log.truncate_fully_and_start_at(start)
            self.transactions = TransactionStates()  # no local data kept: none of its ranges
        self._copy_missing(wanted.log_end_offset)
        log.flush()
        log.set_high_watermark(log.log_end_offset)
        if wanted.producers is None:  # a version-1 snapshot: read back from the log
            self.producers = ProducerStates()
            self.producers.rebuild(log)
        else:
            self.producers = ProducerStates.from_json(wanted.producers)
        self._restore_delay(wanted)
        kept_data = self.transactions.aborted  # ranges the local data it kept may need
        self.transactions = TransactionStates.from_doc(
            None if wanted.transactions is None else json.loads(wanted.transactions)
        )
        self.transactions.keep_local(kept_data)
        self.transactions.forget_local(self.clean_below)
        self.last_stable_offset = self.transactions.last_stable_offset(log.log_end_offset)
        remote = RemoteManifest.from_json(wanted.remote)
        if remote != self.remote:
            _write_remote_manifest(self.remote_path, remote)
            self.remote = remote
        self.applied = wanted.applied
        self._save(wanted.applied, log.log_end_offset)

    def _restore_delay(self, wanted: PartitionSnapshot) -> None:
        """The delay store as at the snapshot: carried by an older snapshot, empty, or
        copied from the first replica whose copy arrives whole (dmq/partition/delay.py)."""
        if wanted.delayed is not None or wanted.delay_pending == 0:
            self.delay.restore(wanted.delayed, wanted.applied)
            return
        if self.fetch_delayed is None:
            raise StorageError(f"{self.partition}: no fetch_delayed to copy the delay store")
        failures: list[str] = []
        for stream in self.fetch_delayed(wanted.applied):
            try:
                self.delay.restore_stream(stream, wanted.applied, wanted.delay_pending)
                return
            except (DelayCopyError, OSError, DmqError) as exc:
                failures.append(str(exc))
        raise StorageError(
            f"{self.partition}: no replica copied its delay store at {wanted.applied}: "
            + "; ".join(failures)
        )

    def _cut_to(self, wanted: PartitionSnapshot) -> None:
        log = self.log
        if log.log_start_offset <= wanted.log_end_offset:
            try:
                log.truncate_to(wanted.log_end_offset)
                return
            except InvalidOffsetError:  # inside a local batch: nothing here can be kept
                pass
        log.truncate_fully_and_start_at(wanted.log_start_offset)

    def _copy_missing(self, end_offset: int) -> None:
        """Copy [log_end_offset, end_offset) from another replica; end exactly there.

        The source's compaction may have removed whole batches, the last ones before
        end_offset too (and a log written before compaction kept batch ends may have lost
        a thinned batch's last offsets): then the copy ends short. That is accepted only
        when the source vouched for the range up to end_offset (`covered_end_offset`):
        the log rolls to end_offset, as `_reconcile` does after a cut in such a gap.
        A copy the source did not vouch for up to the end is a loss: the node stops.
        """
        log = self.log
        if log.log_end_offset >= end_offset:
            return
        if self.fetch_missing is None:
            raise StorageError(
                f"{self.partition}: log ends at {log.log_end_offset}, the snapshot at "
                f"{end_offset}, and no fetch_missing to copy the rest from the leader"
            )
        covered = log.log_end_offset
        for chunk in self.fetch_missing(log.log_end_offset, end_offset):
            for batch in chunk.batches:
                header = read_header(batch)
                _invariant(
                    covered <= header.base_offset and header.last_offset < end_offset,
                    f"{self.partition}: fetched batch {header.base_offset}..{header.last_offset}"
                    f" is outside [{covered}, {end_offset}), the range left to copy",
                )
                log.append(batch, assign_offsets=False)
            _invariant(
                log.log_end_offset <= chunk.covered_end_offset <= end_offset,
                f"{self.partition}: the source vouches up to {chunk.covered_end_offset}, "
                f"outside [{log.log_end_offset}, {end_offset}]",
            )
            covered = chunk.covered_end_offset
        if log.log_end_offset < end_offset and covered == end_offset:
            log.roll(end_offset)  # the source's last batches before the end were compacted
        _invariant(
            log.log_end_offset == end_offset,
            f"{self.partition}: copied up to {log.log_end_offset} (the source vouched up "
            f"to {covered}), snapshot ends at {end_offset}",
        )

    # --- the applied checkpoint -------------------------------------------------------------

    def _reconcile(self) -> None:
        """Open-time steps 1-4 of the module docstring, and the producer state."""
        log = self.log
        records = _read_checkpoint(self.checkpoint_path)
        stored = _read_producer_state(self.producers_path)
        if records and records[0][0] == POSITION_RESTORING:  # restore() runs again
            self.applied = POSITION_RESTORING
            self._rewrite_checkpoint(POSITION_RESTORING, log.log_end_offset)
            log.set_high_watermark(log.log_start_offset)  # nothing served meanwhile
            return
        if not records and stored is None:  # a new replica: nothing applied
            position, end_offset = POSITION_NONE, log.log_end_offset
        else:
            position, end_offset = self._choose_record(records, stored)
        if end_offset < max(log.log_start_offset, log.segments[0].base_offset):
            # Retention or compaction removed everything from there on: replay it all.
            log.truncate_fully_and_start_at(end_offset)
        elif end_offset < log.log_end_offset:
            log.truncate_to(end_offset)  # replay re-applies the commands past it
            if log.log_end_offset < end_offset:  # cut in a gap compaction left: keep the end
                log.roll(end_offset)
        if stored is not None:
            self.producers, self.transactions = stored[2], stored[3]
        elif position != POSITION_NONE:  # written before the state was stored
            self.producers.rebuild(log)
        self.last_stable_offset = self.transactions.last_stable_offset(end_offset)
        self.applied = position
        self._save(position, end_offset)
        log.set_high_watermark(log.log_end_offset)

    def _choose_record(
        self,
        records: list[tuple[Position, int, bool]],
        stored: StoredState | None,
    ) -> tuple[Position, int]:
        """The applied position to reopen at: the last one the log holds, or the stored
        producer state's if a command after it changed producer state."""
        log = self.log
        candidates = [(position, end) for position, end, _ in records]
        if stored is not None:
            candidates.append((stored[0], stored[1]))
        usable = [c for c in candidates if c[1] <= log.log_end_offset]
        _invariant(
            bool(usable),
            f"{self.partition}: the log ends at {log.log_end_offset}, below its applied "
            f"checkpoint at {min(c[1] for c in candidates)}: flushed data is lost",
        )
        position, end_offset = max(usable)
        if stored is None or stored[0] >= position:
            _invariant(
                end_offset >= log.log_start_offset,
                f"{self.partition}: checkpoint end {end_offset} is below the log start "
                f"{log.log_start_offset}",
            )
            return position, end_offset
        unknown_gap = not records or stored[0] < records[0][0]
        touched = any(t for p, _, t in records if stored[0] < p <= position)
        if unknown_gap or touched:
            return stored[0], stored[1]
        return position, end_offset

    def _rewrite_checkpoint(self, position: Position, log_end_offset: int) -> None:
        path = self.checkpoint_path
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as file:
            file.write(_checkpoint_record(position, log_end_offset))
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
        fsync_directory(path.parent)
        old_fd = self._checkpoint_fd
        self._checkpoint_fd = os.open(path, os.O_WRONLY | os.O_APPEND)  # the new file
        if old_fd >= 0:
            os.close(old_fd)


def _checkpoint_record(position: Position, log_end_offset: int, touched: bool = False) -> bytes:
    index = position[0] | (_PRODUCERS_TOUCHED if touched else 0)
    body = _CHECKPOINT_BODY.pack(index, position[1], log_end_offset)
    return body + struct.pack("<I", crc32c.crc32c(body))


def _read_checkpoint(path: Path) -> list[tuple[Position, int, bool]]:
    """Records up to the first torn or corrupt one: [((index, k), log_end_offset,
    touched producers), ...]."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    records: list[tuple[Position, int, bool]] = []
    size = _CHECKPOINT_RECORD.size
    for pos in range(0, len(raw) - size + 1, size):
        index, k, end_offset, crc = _CHECKPOINT_RECORD.unpack_from(raw, pos)
        if crc32c.crc32c(raw[pos : pos + _CHECKPOINT_BODY.size]) != crc:
            break
        touched = bool(index & _PRODUCERS_TOUCHED)
        records.append(((index & ~_PRODUCERS_TOUCHED, k), end_offset, touched))
    return records


def _read_producer_state(path: Path) -> StoredState | None:
    """The stored producer state: (position, log_end_offset, producers, transactions);
    None if absent. A
    file that fails its CRC stops the node: it is written durably, so it cannot be torn."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    payload = raw[4:]
    _invariant(
        len(raw) >= 4 and struct.unpack_from("<I", raw)[0] == crc32c.crc32c(payload),
        f"{path}: producer state fails its CRC",
    )
    head, _, state = payload.partition(b"\n")
    doc = json.loads(head)
    _refuse_newer(f"{path}: producer and transaction state", doc, PRODUCER_STATE_FORMAT)
    position = (int(doc["index"]), int(doc["k"]))
    return (
        position,
        int(doc["log_end_offset"]),
        ProducerStates.from_json(state.decode()),
        TransactionStates.from_doc(doc.get("transactions")),
    )


def _restore_start(wanted: PartitionSnapshot) -> int:
    """Where a log restarted by restore begins: the snapshot's log start, or, with tiered
    storage, the end of what the object store holds (the replica needs only the local
    tail from another replica: below it, reads go to the store)."""
    remote = RemoteManifest.from_json(wanted.remote)
    if not remote.started or not remote.segments:
        return wanted.log_start_offset
    return max(wanted.log_start_offset, min(remote.end_offset, wanted.log_end_offset))


def _read_remote_manifest(path: Path) -> RemoteManifest:
    """The durable manifest (CRC-checked); empty if never written."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return RemoteManifest()
    _invariant(len(raw) >= 4, f"{path}: torn remote manifest")
    (crc,) = struct.unpack_from("<I", raw)
    _invariant(crc32c.crc32c(raw[4:]) == crc, f"{path}: remote manifest CRC mismatch")
    try:
        doc = json.loads(raw[4:])
        _refuse_newer(f"{path}: tiered-storage manifest", doc, REMOTE_MANIFEST_FORMAT)
        return RemoteManifest.from_doc(doc)
    except (RemoteCommandError, ValueError) as exc:
        raise StorageError(f"{path}: {exc}") from exc


def _refuse_newer(what: str, doc: object, readable_max: int) -> None:
    found = doc.get("format", 1) if isinstance(doc, dict) else 1
    if isinstance(found, int) and found > readable_max:
        raise FormatTooNew(too_new_message(what, found, readable_max))


def _write_remote_manifest(path: Path, manifest: RemoteManifest) -> None:
    doc = {**manifest.to_doc(), "format": REMOTE_MANIFEST_FORMAT}
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    write_durably(path, struct.pack("<I", crc32c.crc32c(body)) + body)
    fsync_directory(path.parent)

"""Idempotent producers: per-partition producer state, checked when a batch is applied.

A batch carrying a producer id (>= 0) also carries the producer's epoch and the sequence
number of its first record; the records are numbered on. Applied on every replica, in log
order, so every replica accepts and refuses the same batches:

1. an epoch older than the producer's known epoch is refused (`ProducerFencedError`: a
   newer instance with the same transactional id has written here);
2. a batch whose sequences equal one of the producer's last `PRODUCER_BATCHES_KEPT` batches
   is a retry: it is not written again, its original base offset is the answer;
3. otherwise, with the known epoch, its first sequence must follow the last one
   (`OutOfOrderSequenceError` if not: a batch in between was lost, and writing this one
   would leave a gap); a newer epoch starts over at any sequence;
4. a producer not known here (new, or forgotten, below) is accepted at any sequence.

The state is part of the replicated state, never derived from the local log: compaction
and retention run on each replica's own clock, so two replicas' logs may hold different
batch headers for the same offsets (a thinned batch, a deleted prefix), and a state read
back from them would differ. The partition machine (dmq/partition/machine.py) stores it with its
applied checkpoint (`raft-producers`) and in its snapshots (`to_json` / `from_json`), and
a replica that restarts replays the commands after it from the Raft journal. A producer
is known while its last batch ends within `PRODUCER_WINDOW_OFFSETS` of the log end offset,
and at most `PRODUCERS_PER_PARTITION_MAX` producers are known (the one whose last batch is
oldest is forgotten first): both depend on offsets only, the same on every replica. The
window is the limit of the guarantee: a retry arriving after more than
PRODUCER_WINDOW_OFFSETS newer records, or after the producer was forgotten, may be written
twice. `rebuild` (from the log's batch headers) only serves data directories written
before the state was stored.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from log import InvalidRecordError, PartitionLog
from log.records import BatchHeader, read_header

PRODUCER_BATCHES_KEPT: Final = 5  # as Kafka: a producer has at most 5 batches in flight
PRODUCER_WINDOW_OFFSETS: Final = 10_000_000  # how far back a retry is still recognised
PRODUCERS_PER_PARTITION_MAX: Final = 10_000  # bounds memory: ~1 KiB each


class ProducerFencedError(InvalidRecordError):
    """The batch's producer epoch is older than one already written here."""


class DuplicateMarkerError(ProducerFencedError):
    """A bumped transaction marker (dmq/partition/transactions.py) of an epoch the producer
    already has here: its transaction ended before; nothing is written."""


class OutOfOrderSequenceError(InvalidRecordError):
    """The batch's first sequence does not follow the producer's last one."""


@dataclass(slots=True)
class _Producer:
    epoch: int
    # (base_sequence, last_sequence, base_offset) of the last batches, oldest first
    batches: deque[tuple[int, int, int]] = field(default_factory=deque)
    last_offset: int = -1


class ProducerStates:
    """The producers of one partition. Not thread-safe: the tick thread owns it."""

    def __init__(self) -> None:
        self._producers: dict[int, _Producer] = {}
        # Delayed produces of idempotent producers (dmq/partition/delay.py): their own
        # table, batches as (base_sequence, last_sequence, first schedule id). A retry
        # of one of the last PRODUCER_BATCHES_KEPT is answered with its schedule ids.
        self._schedules: dict[int, _Producer] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def check(self, header: BatchHeader, log_end_offset: int) -> int | None:
        """Before appending: the original base offset of a duplicate, None to append, or
        raise the refusal. Changes nothing."""
        if header.producer_id < 0:
            return None
        known = self._known(header.producer_id, log_end_offset)
        if known is None:
            return None
        if header.producer_epoch < known.epoch:
            raise ProducerFencedError(
                f"producer {header.producer_id} epoch {header.producer_epoch} is fenced by "
                f"epoch {known.epoch}",
                field="producer_epoch",
            )
        if header.producer_epoch > known.epoch:
            return None
        last_sequence = header.base_sequence + header.last_offset_delta  # as Kafka's
        for base_seq, last_seq, base_offset in known.batches:
            if (base_seq, last_seq) == (header.base_sequence, last_sequence):
                return base_offset
        expected = known.batches[-1][1] + 1 if known.batches else header.base_sequence
        if header.base_sequence != expected:
            raise OutOfOrderSequenceError(
                f"producer {header.producer_id} sent sequence {header.base_sequence}; "
                f"expected {expected}",
                field="base_sequence",
            )
        return None

    def record(self, header: BatchHeader, base_offset: int, log_end_offset: int) -> None:
        """After appending a batch at `base_offset`."""
        if header.producer_id < 0:
            return
        known = self._known(header.producer_id, log_end_offset)
        if known is None or header.producer_epoch > known.epoch:
            known = self._producers[header.producer_id] = _Producer(header.producer_epoch)
        # Not record_count: a batch compaction thinned (rebuild reads those) keeps its
        # last_offset_delta, so this still names the producer's last sequence.
        last_sequence = header.base_sequence + header.last_offset_delta
        known.batches.append((header.base_sequence, last_sequence, base_offset))
        if len(known.batches) > PRODUCER_BATCHES_KEPT:
            known.batches.popleft()
        known.last_offset = base_offset + header.last_offset_delta
        if len(self._producers) > PRODUCERS_PER_PARTITION_MAX:
            oldest = min(self._producers, key=lambda p: (self._producers[p].last_offset, p))
            del self._producers[oldest]

    def save_for(self, batches: Iterable[bytes]) -> dict[int, _Producer | None] | None:
        """What `record` may change for these batches, to undo a command the disk refused
        (restore_saved). None when no batch has a producer id (the usual case: free)."""
        ids: set[int] = set()
        for batch in batches:
            try:
                header = read_header(batch, 0)
            except InvalidRecordError:  # refused at apply: it records nothing
                continue
            if header.producer_id >= 0:
                ids.add(header.producer_id)
        if not ids:
            return None
        saved: dict[int, _Producer | None] = {}
        for producer_id in ids:
            known = self._producers.get(producer_id)
            saved[producer_id] = (
                None
                if known is None
                else _Producer(known.epoch, deque(known.batches), known.last_offset)
            )
        return saved

    def restore_saved(self, saved: dict[int, _Producer | None] | None) -> None:
        """Undo `record` calls made since `save_for` returned `saved`. (A producer evicted
        meanwhile by PRODUCERS_PER_PARTITION_MAX stays evicted, as a restart would leave it
        had the window moved on: its next batch starts a new sequence history.)"""
        for producer_id, state in (saved or {}).items():
            if state is None:
                self._producers.pop(producer_id, None)
            else:
                self._producers[producer_id] = state

    def check_marker(self, header: BatchHeader, log_end_offset: int, *, bumped: bool) -> None:
        """Before appending a transaction marker (dmq/partition/transactions.py): one
        older than the producer's known epoch is refused; a `bumped` one (its epoch is
        its transaction's + 1) of the known epoch is a duplicate: that epoch came here
        with the marker that ended the transaction, or with the next transaction's
        batches, which follow it. Changes nothing."""
        known = self._known(header.producer_id, log_end_offset)
        if known is not None and header.producer_epoch < known.epoch:
            raise ProducerFencedError(
                f"marker of producer {header.producer_id} epoch {header.producer_epoch} is "
                f"fenced by epoch {known.epoch}",
                field="producer_epoch",
            )
        if bumped and known is not None and header.producer_epoch == known.epoch:
            raise DuplicateMarkerError(
                f"marker of producer {header.producer_id} epoch {header.producer_epoch}: "
                "that epoch is here already, its transaction ended before",
                field="producer_epoch",
            )

    def record_marker(self, header: BatchHeader, offset: int, log_end_offset: int) -> None:
        """After appending a marker at `offset`: a newer epoch becomes the producer's (its
        older batches are refused from now on), starting its sequences afresh."""
        known = self._known(header.producer_id, log_end_offset)
        if known is None or header.producer_epoch > known.epoch:
            self._producers[header.producer_id] = _Producer(header.producer_epoch)
            known = self._producers[header.producer_id]
        known.last_offset = offset
        if len(self._producers) > PRODUCERS_PER_PARTITION_MAX:
            oldest = min(self._producers, key=lambda p: (self._producers[p].last_offset, p))
            del self._producers[oldest]

    def check_schedule(self, producer: tuple[int, int, int], count: int) -> int | None:
        """Before a schedule of `count` records by (id, epoch, base_sequence): the first
        schedule id of the same schedule applied before (a retry), else None; an epoch
        older than the known one is refused. Sequences are not required to follow on:
        the table only recognises retries. Changes nothing."""
        producer_id, epoch, base_sequence = producer
        known = self._schedules.get(producer_id)
        if known is None or epoch > known.epoch:
            return None
        if epoch < known.epoch:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {epoch} is fenced by epoch {known.epoch}",
                field="producer_epoch",
            )
        for base_seq, last_seq, first_sid in known.batches:
            if (base_seq, last_seq) == (base_sequence, base_sequence + count - 1):
                return first_sid
        return None

    def record_schedule(self, producer: tuple[int, int, int], count: int, first_sid: int) -> None:
        """After a schedule: remember it (the oldest producer is forgotten past
        PRODUCERS_PER_PARTITION_MAX; schedule ids grow with the Raft position)."""
        producer_id, epoch, base_sequence = producer
        known = self._schedules.get(producer_id)
        if known is None or epoch > known.epoch:
            known = self._schedules[producer_id] = _Producer(epoch)
        known.batches.append((base_sequence, base_sequence + count - 1, first_sid))
        if len(known.batches) > PRODUCER_BATCHES_KEPT:
            known.batches.popleft()
        known.last_offset = first_sid
        if len(self._schedules) > PRODUCERS_PER_PARTITION_MAX:
            oldest = min(self._schedules, key=lambda p: (self._schedules[p].last_offset, p))
            del self._schedules[oldest]

    def save_schedule(self, producer_id: int) -> _Producer | None:
        """A copy of one producer's schedule state, to undo a refused command."""
        known = self._schedules.get(producer_id)
        return (
            None
            if known is None
            else _Producer(known.epoch, deque(known.batches), known.last_offset)
        )

    def restore_schedule(self, producer_id: int, saved: _Producer | None) -> None:
        if saved is None:
            self._schedules.pop(producer_id, None)
        else:
            self._schedules[producer_id] = saved

    def _known(self, producer_id: int, log_end_offset: int) -> _Producer | None:
        known = self._producers.get(producer_id)
        if known is not None and known.last_offset < log_end_offset - PRODUCER_WINDOW_OFFSETS:
            del self._producers[producer_id]  # out of the window: forgotten, as on a restart
            return None
        return known

    def to_json(self) -> str:
        """The whole state, canonical (sorted producers): equal states give equal text."""
        doc: dict[str, object] = {
            str(pid): [p.epoch, p.last_offset, [list(b) for b in p.batches]]
            for pid, p in sorted(self._producers.items())
        }
        if self._schedules:  # left out when empty: the text of older states is unchanged
            doc["schedules"] = {
                str(pid): [p.epoch, p.last_offset, [list(b) for b in p.batches]]
                for pid, p in sorted(self._schedules.items())
            }
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ProducerStates:
        """The inverse of to_json; a malformed document raises ValueError."""
        states = cls()
        try:
            doc = json.loads(text)
            schedules = doc.pop("schedules", {})
            for table, entries in ((states._producers, doc), (states._schedules, schedules)):
                for pid, (epoch, last_offset, batches) in entries.items():
                    producer = _Producer(int(epoch), last_offset=int(last_offset))
                    for base_seq, last_seq, base_offset in batches:
                        producer.batches.append((int(base_seq), int(last_seq), int(base_offset)))
                    table[int(pid)] = producer
        except (TypeError, AttributeError, KeyError) as error:
            raise ValueError(f"malformed producer state: {error}") from error
        return states

    def rebuild(self, log: PartitionLog) -> None:
        """Legacy (a data directory without stored producer state): from the batch headers of the log's last PRODUCER_WINDOW_OFFSETS offsets."""
        self._producers.clear()
        start = log.log_end_offset - PRODUCER_WINDOW_OFFSETS
        for segment in log.segments:
            if segment.next_offset <= start:
                continue
            for entry in segment.scan(0):
                header = entry.header
                if header.base_offset + header.last_offset_delta >= start:
                    self.record(header, header.base_offset, header.base_offset)
        # Apply the window as apply would at this log end.
        for producer_id in list(self._producers):
            self._known(producer_id, log.log_end_offset)

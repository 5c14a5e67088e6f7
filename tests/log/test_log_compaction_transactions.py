"""Proves compaction with transactions (log/compaction.py, log/README.md "Compaction and
transactions"), with hypothesis over logs of plain and transactional batches of two
producers, commit and abort markers old and young, and segments of any size:

- the read_committed view by key (each key's last committed record) is the same before
  and after compaction, and after a second pass: an aborted record never shadows an
  older committed one, and never comes back;
- every record of an aborted transaction in the compacted segments is gone;
- nothing at or past the LSO (the first offset of an open transaction) changes;
- a marker stays while a record of its transaction is left, and then while younger
  than delete_retention_ms.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from log import FlushPolicy, LogConfig, PartitionLog, Record, compaction, encode_batch
from log.config import CleanupPolicy

DELETE_RETENTION_MS = 1_000
NOW_MS = 10_000
OLD_MS, YOUNG_MS = NOW_MS - 5 * DELETE_RETENTION_MS, NOW_MS

# ("plain", key) | ("txn", producer, key) | ("end", producer, commit, young)
STEP = st.one_of(
    st.tuples(st.just("plain"), st.integers(0, 2)),
    st.tuples(st.just("txn"), st.integers(1, 2), st.integers(0, 2)),
    st.tuples(st.just("txn"), st.integers(1, 2), st.integers(0, 2)),
    st.tuples(st.just("end"), st.integers(1, 2), st.booleans(), st.booleans()),
)

Kind = str  # "plain", "commit", "abort" or "open": how a data record ended


def build(directory: Path, steps: list[tuple], segment_bytes: int):  # type: ignore[no-untyped-def,type-arg]
    """The log of `steps`, and per data offset (key, kind, producer), per marker offset (producer,
    young), the aborted ranges and the LSO, as the partition would know them."""
    config = LogConfig(
        segment_bytes=segment_bytes,
        cleanup_policy=CleanupPolicy.COMPACT,
        delete_retention_ms=DELETE_RETENTION_MS,
        flush=FlushPolicy(interval_records=None),
    )
    log = PartitionLog.open(directory, config)
    data: dict[int, tuple[bytes, Kind, int]] = {}  # offset -> key, kind, producer (0: none)
    markers: dict[int, tuple[int, bool]] = {}
    open_txn: dict[int, list[int]] = {}  # producer -> offsets of its open transaction
    aborted: list[tuple[int, int, int]] = []
    for step in steps:
        offset = log.log_end_offset
        if step[0] == "plain":
            key = b"k%d" % step[1]
            log.append(encode_batch([Record(key, b"v%d" % offset, (), OLD_MS)]))
            data[offset] = (key, "plain", 0)
        elif step[0] == "txn":
            _, producer, k = step
            key = b"k%d" % k
            batch = encode_batch(
                [Record(key, b"v%d" % offset, (), OLD_MS)], producer_id=producer,
                producer_epoch=0, base_sequence=offset, is_transactional=True,
            )  # fmt: skip
            log.append(batch)
            data[offset] = (key, "open", producer)
            open_txn.setdefault(producer, []).append(offset)
        else:
            _, producer, commit, young = step
            offsets = open_txn.pop(producer, None)
            if offsets is None:
                continue  # markers close a transaction: none is open
            marker = encode_batch(
                [Record(b"\x00\x00\x00\x01" if commit else b"\x00\x00\x00\x00", b"", (),
                        YOUNG_MS if young else OLD_MS)],
                producer_id=producer, producer_epoch=0, is_transactional=True, is_control=True,
            )  # fmt: skip
            log.append(marker)
            markers[offset] = (producer, young)
            for o in offsets:
                data[o] = (data[o][0], "commit" if commit else "abort", producer)
            if not commit:
                aborted.append((producer, offsets[0], offset))
    log.set_high_watermark(log.log_end_offset)
    firsts = [offsets[0] for offsets in open_txn.values()]
    lso = min(firsts) if firsts else log.log_end_offset
    return log, data, markers, aborted, lso


def committed_view(
    data: dict[int, tuple[bytes, Kind, int]], present: set[int], lso: int
) -> dict[bytes, int]:
    """Each key's last committed record below the LSO among `present` offsets."""
    view: dict[bytes, int] = {}
    for offset in sorted(present):
        key, kind, _ = data[offset]
        if offset < lso and kind in ("plain", "commit"):
            view[key] = offset
    return view


def stored(log: PartitionLog) -> tuple[set[int], set[int]]:
    """(data record offsets, control batch base offsets) in the log."""
    records: set[int] = set()
    controls: set[int] = set()
    for batch in log.read_batches(log.log_start_offset, 1 << 30):
        if batch.header.is_control:
            controls.add(batch.header.base_offset)
        else:
            records.update(r.offset for r in batch.records)
    return records, controls


@settings(max_examples=80, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=40), st.sampled_from([64, 150, 400]))
def test_compaction_keeps_the_committed_view_and_drops_aborted_records(
    steps: list[tuple],
    segment_bytes: int,  # type: ignore[type-arg]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log, data, markers, aborted, lso = build(Path(tmp), steps, segment_bytes)
        records_before, _ = stored(log)
        view_before = committed_view(data, records_before, lso)
        # The plan's end: the closed segments wholly below the LSO (a prefix).
        end = 0
        for segment in log.segments[:-1]:
            if segment.next_offset > lso:
                break
            end = segment.next_offset
        for _ in range(2):  # a second pass changes nothing the view depends on
            plan = compaction.plan_compaction(log, stable_offset=lso, aborted=aborted)
            if plan is not None:
                assert compaction.install_compaction(log, compaction.build_compaction(plan, NOW_MS))
            records, controls = stored(log)
            assert committed_view(data, records, lso) == view_before
            for offset in records_before:
                kind = data[offset][1]
                if offset >= end:
                    assert offset in records, ("past the compacted segments", offset)
                elif kind == "abort":
                    assert offset not in records, ("aborted record kept", offset)
                if offset >= lso:
                    assert offset in records, ("at or past the LSO", offset)
            for offset, (producer, young) in markers.items():
                if offset >= end:
                    assert offset in controls
                    continue
                # Its transaction: the producer's records since its previous marker.
                previous = max((m for m, (p, _) in markers.items() if p == producer and m < offset),
                               default=-1)  # fmt: skip
                alive = any(
                    previous < o < offset and o in records and data[o][2] == producer for o in data
                )
                assert (offset in controls) == (alive or young), (offset, alive, young)

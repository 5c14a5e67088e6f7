"""The producer's batching puts records where the broker would, and in batches that keep order.

Proves, with no network and no clock (time is passed in), that `RecordAccumulator`:
- sends an explicit partition as given and a keyed record to Kafka's murmur2 partition
  (`dmq.partitioner.partition_for_key`), whatever the sticky partition is; with some
  partitions decommissioned, keyed and unkeyed records go to the active ones only, keys
  mapped as the broker maps them;
- keeps unkeyed records on one sticky partition until that batch closes, then moves
  round-robin, so N batches of unkeyed records spread evenly over N partitions;
- closes a batch before the record that would take it past batch_bytes, puts a record
  larger than batch_bytes alone in its own batch, and keeps each partition's records in
  send order across batches;
- closes open batches once they lingered linger_ms (or all at once on flush) and reports
  the next linger deadline;
- hands out at most one batch per partition at a time, skipping partitions with a request
  in flight, oldest first;
and that `record_size_bytes` is an upper bound of what a record adds to a real batch.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from dmq.client._accumulator import RecordAccumulator, record_size_bytes
from dmq.client._types import TopicPartition
from dmq.partitioner import partition_for_key
from log.records import HEADER_BYTES, Header, Record, encode_batch


def rec(value: bytes = b"v", key: bytes | None = None) -> Record:
    return Record(key=key, value=value, timestamp_ms=1_700_000_000_000)


def test_explicit_partition_and_keyed_records_go_where_the_broker_would_put_them() -> None:
    acc: RecordAccumulator[int] = RecordAccumulator(batch_bytes=1 << 20, linger_ms=5)
    tp, _ = acc.append("t", rec(key=b"k"), 0, partition_count=7, partition=3, now_s=0.0)
    assert tp == TopicPartition("t", 3)
    for i in range(50):
        key = f"key-{i}".encode()
        tp, _ = acc.append("t", rec(key=key), i, partition_count=7, partition=None, now_s=0.0)
        assert tp.partition == partition_for_key(key, 7)


def test_with_decommissioned_partitions_records_go_to_the_active_ones_only() -> None:
    acc: RecordAccumulator[int] = RecordAccumulator(batch_bytes=64, linger_ms=5)
    active = (0, 2, 5)  # of 6: partitions 1, 3 and 4 take no new records
    unkeyed = []
    for i in range(60):
        key = f"key-{i}".encode()
        tp, _ = acc.append(
            "t", rec(key=key), i, partition_count=6, partition=None, now_s=0.0, active=active
        )
        assert tp.partition == active[partition_for_key(key, 3)]  # as the broker maps it
        tp, _ = acc.append(
            "t", rec(b"x" * 40), i, partition_count=6, partition=None, now_s=0.0, active=active
        )
        unkeyed.append(tp.partition)
    assert set(unkeyed) == set(active)  # the sticky partition moves over the active ones


def test_unkeyed_records_stick_to_one_partition_per_batch_then_move_round_robin() -> None:
    acc: RecordAccumulator[int] = RecordAccumulator(batch_bytes=1 << 20, linger_ms=5)
    chosen = []
    for batch in range(12):
        partitions = {
            acc.append("t", rec(), i, partition_count=4, partition=None, now_s=float(batch))[0]
            for i in range(10)
        }
        assert len(partitions) == 1  # one batch, one partition
        chosen.append(partitions.pop().partition)
        assert acc.close_expired(float(batch) + 1.0)  # linger over: the batch closes
    assert Counter(chosen) == {0: 3, 1: 3, 2: 3, 3: 3}
    assert all((b - a) % 4 == 1 for a, b in zip(chosen, chosen[1:], strict=False))


def test_keyed_records_do_not_move_the_sticky_partition() -> None:
    acc: RecordAccumulator[int] = RecordAccumulator(batch_bytes=1 << 20, linger_ms=5)
    first, _ = acc.append("t", rec(), 0, partition_count=3, partition=None, now_s=0.0)
    acc.append("t", rec(key=b"a"), 1, partition_count=3, partition=None, now_s=0.0)
    acc.close_expired(0.0, force=True)
    # A closed batch of only keyed records leaves the sticky choice where it was...
    acc.append("t", rec(key=b"a"), 2, partition_count=3, partition=None, now_s=1.0)
    acc.close_expired(1.0, force=True)
    again, _ = acc.append("t", rec(), 3, partition_count=3, partition=None, now_s=2.0)
    # ...but the batch that took the first unkeyed record moved it on by one.
    assert again.partition == (first.partition + 1) % 3


def test_a_batch_closes_before_it_would_exceed_batch_bytes_and_order_is_kept() -> None:
    one = record_size_bytes(rec(b"x" * 100))
    acc: RecordAccumulator[int] = RecordAccumulator(
        batch_bytes=HEADER_BYTES + 3 * one, linger_ms=1000
    )
    for i in range(10):
        acc.append("t", rec(b"x" * 100), i, partition_count=1, partition=0, now_s=0.0)
    acc.close_expired(0.0, force=True)
    batches = []
    while sendable := acc.take_sendable(set()):
        batches.extend(sendable)
    assert [len(b.records) for b in batches] == [3, 3, 3, 1]
    assert [w for b in batches for w in b.waiters] == list(range(10))
    assert all(b.size_bytes <= HEADER_BYTES + 3 * one for b in batches)
    assert acc.is_empty()


def test_a_record_larger_than_batch_bytes_travels_alone() -> None:
    acc: RecordAccumulator[str] = RecordAccumulator(batch_bytes=1000, linger_ms=1000)
    acc.append("t", rec(b"small"), "a", partition_count=1, partition=0, now_s=0.0)
    acc.append("t", rec(b"x" * 5000), "big", partition_count=1, partition=0, now_s=0.0)
    acc.append("t", rec(b"small"), "c", partition_count=1, partition=0, now_s=0.0)
    acc.close_expired(0.0, force=True)
    order: list[list[str]] = []
    while sendable := acc.take_sendable(set()):
        order.extend(b.waiters for b in sendable)
    assert order == [["a"], ["big"], ["c"]]


def test_unkeyed_records_follow_the_sticky_partition_when_their_batch_fills() -> None:
    size = record_size_bytes(rec(b"x" * 100))
    acc: RecordAccumulator[int] = RecordAccumulator(
        batch_bytes=HEADER_BYTES + 2 * size, linger_ms=1000
    )
    seen = [
        acc.append("t", rec(b"x" * 100), i, partition_count=3, partition=None, now_s=0.0)[0]
        for i in range(6)
    ]
    # Two records fill a batch; the third starts a batch on the next partition.
    assert [tp.partition for tp in seen[::2]] == [(seen[0].partition + i) % 3 for i in range(3)]
    assert seen[0] == seen[1] and seen[2] == seen[3] and seen[4] == seen[5]


def test_batches_close_after_linger_and_report_the_next_deadline() -> None:
    # Times are binary fractions so that float arithmetic is exact.
    acc: RecordAccumulator[int] = RecordAccumulator(batch_bytes=1 << 20, linger_ms=500)
    assert acc.next_deadline_s() is None
    _, changed = acc.append("t", rec(), 0, partition_count=2, partition=0, now_s=10.0)
    assert changed  # a new batch: a new deadline the sender must learn
    _, changed = acc.append("t", rec(), 1, partition_count=2, partition=0, now_s=10.125)
    assert not changed
    acc.append("t", rec(), 2, partition_count=2, partition=1, now_s=10.25)
    assert acc.next_deadline_s() == 10.5
    assert not acc.close_expired(10.375)
    assert acc.close_expired(10.5)  # the first batch only
    assert [b.topic_partition.partition for b in acc.take_sendable(set())] == [0]
    assert acc.next_deadline_s() == 10.75
    assert acc.close_expired(10.75)
    assert [b.topic_partition.partition for b in acc.take_sendable(set())] == [1]


def test_one_batch_per_partition_at_a_time_and_none_for_a_busy_partition() -> None:
    acc: RecordAccumulator[int] = RecordAccumulator(batch_bytes=HEADER_BYTES + 1, linger_ms=5)
    for i in range(3):  # each record fills a batch on its own
        acc.append("t", rec(), i, partition_count=2, partition=0, now_s=0.0)
    acc.append("t", rec(), 9, partition_count=2, partition=1, now_s=0.0)
    busy = {TopicPartition("t", 1)}
    first = acc.take_sendable(busy)
    assert [(b.topic_partition.partition, b.waiters) for b in first] == [(0, [0])]
    second = acc.take_sendable(set())
    assert sorted((b.topic_partition.partition, b.waiters[0]) for b in second) == [(0, 1), (1, 9)]


@given(
    key=st.none() | st.binary(max_size=300),
    value=st.none() | st.binary(max_size=3000),
    headers=st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=50)), max_size=5),
    timestamp_ms=st.integers(min_value=0, max_value=2**41),
)
def test_record_size_is_an_upper_bound_of_its_encoded_size(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]], timestamp_ms: int
) -> None:
    first = Record(key=None, value=b"", timestamp_ms=0)
    record = Record(key, value, tuple(Header(k, v) for k, v in headers), timestamp_ms)
    alone = len(encode_batch([first]))
    both = len(encode_batch([first, record]))
    assert both - alone <= record_size_bytes(record)

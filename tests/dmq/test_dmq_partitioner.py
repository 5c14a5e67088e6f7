"""Proves that dmq picks partitions as Kafka does, so keys land on the same partition in both.

- ``murmur2`` reproduces Kafka's ``UtilsTest.testMurmur2`` vectors exactly, and agrees on
  random inputs (every tail length 0-3) with a line-by-line model of the Java code written
  with Java ``int`` overflow, independent of the implementation under test.
- ``murmur2`` always returns a signed 32-bit value; ``to_positive`` clears the sign bit.
- ``partition_for_key`` gives the partitions computed by hand from those vectors, is
  deterministic, always lands in range, and refuses a partition count below 1.
- ``StickyPartitioner`` keeps one partition until ``next_batch``, then moves round-robin, so
  N*k requests over N partitions give each partition exactly k; a changed partition count
  still yields a partition in range.

(The file's basename carries the package name because pytest, without ``__init__.py``
files, cannot collect two test modules with the same basename.)
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dmq.partitioner import StickyPartitioner, murmur2, partition_for_key, to_positive

# From apache/kafka clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java,
# testMurmur2. The keys are ASCII, so Java's String.getBytes() gives these bytes.
KAFKA_MURMUR2_VECTORS: list[tuple[bytes, int]] = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


def java_int(n: int) -> int:
    """``n`` wrapped to a Java int, as Java's int arithmetic does on overflow."""
    return (n + 2**31) % 2**32 - 2**31


def java_unsigned_shift_right(n: int, shift: int) -> int:
    """Java's ``n >>> shift`` on an int."""
    return (n % 2**32) >> shift


def java_model_murmur2(data: bytes) -> int:
    """A direct model of Kafka's Java murmur2 on signed ints, to cross-check the real one."""
    m = java_int(0x5BD1E995)
    h = java_int(java_int(0x9747B28C) ^ len(data))
    length4 = len(data) // 4
    for i in range(length4):
        i4 = i * 4
        k = java_int(data[i4] + (data[i4 + 1] << 8) + (data[i4 + 2] << 16) + (data[i4 + 3] << 24))
        k = java_int(k * m)
        k ^= java_unsigned_shift_right(k, 24)
        k = java_int(java_int(k) * m)
        h = java_int(java_int(h * m) ^ k)
    rest = len(data) % 4
    base = len(data) & ~3
    if rest >= 3:
        h = java_int(h ^ (data[base + 2] << 16))
    if rest >= 2:
        h = java_int(h ^ (data[base + 1] << 8))
    if rest >= 1:
        h = java_int(h ^ data[base])
        h = java_int(h * m)
    h = java_int(h ^ java_unsigned_shift_right(h, 13))
    h = java_int(h * m)
    h = java_int(h ^ java_unsigned_shift_right(h, 15))
    return h


@pytest.mark.parametrize(("key", "expected"), KAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_kafka_test_vectors(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@pytest.mark.parametrize(("key", "expected"), KAFKA_MURMUR2_VECTORS)
def test_java_model_matches_kafka_test_vectors(key: bytes, expected: int) -> None:
    # The model must itself be right before it can check murmur2 on other inputs.
    assert java_model_murmur2(key) == expected


@given(st.binary(max_size=200))
def test_murmur2_agrees_with_java_model(data: bytes) -> None:
    assert murmur2(data) == java_model_murmur2(data)


@pytest.mark.parametrize("length", range(9))
def test_murmur2_agrees_with_java_model_for_every_tail_length(length: int) -> None:
    # Kafka's vectors have tails of 0, 2 and 3 bytes only; this covers 1 as well.
    data = bytes(range(0xF8, 0xF8 + length))
    assert murmur2(data) == java_model_murmur2(data)


@given(st.binary(max_size=1000))
def test_murmur2_is_a_signed_32_bit_int(data: bytes) -> None:
    assert INT32_MIN <= murmur2(data) <= INT32_MAX


@given(st.binary(max_size=1000))
def test_murmur2_is_deterministic(data: bytes) -> None:
    assert murmur2(data) == murmur2(bytes(bytearray(data)))


def test_to_positive_clears_the_sign_bit_rather_than_taking_abs() -> None:
    assert to_positive(0) == 0
    assert to_positive(5) == 5
    assert to_positive(INT32_MAX) == INT32_MAX
    assert to_positive(-1) == INT32_MAX
    assert to_positive(INT32_MIN) == 0
    assert to_positive(-973932308) == 1173551340  # 2**31 - 973932308, not 973932308


# partition = toPositive(h) % n, with toPositive(h) = h + 2**31 for negative h, e.g.
# "21": -973932308 + 2147483648 = 1173551340; 1173551340 % 7 = 3 (7 * 167650191 = 1173551337).
@pytest.mark.parametrize(
    ("key", "positive_hash", "partitions_by_count"),
    [
        (b"21", 1173551340, {1: 0, 3: 0, 7: 3, 10: 0, 12: 0, 100: 40}),
        (b"foobar", 1357151166, {1: 0, 3: 0, 7: 0, 10: 6, 12: 6, 100: 66}),
        (b"a-little-bit-long-string", 1161502112, {1: 0, 3: 2, 7: 1, 10: 2, 12: 8, 100: 12}),
        (b"a-little-bit-longer-string", 661178819, {1: 0, 3: 2, 7: 0, 10: 9, 12: 11, 100: 19}),
        (
            b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
            2088585677,
            {1: 0, 3: 2, 7: 3, 10: 7, 12: 5, 100: 77},
        ),
        (b"abc", 479470107, {1: 0, 3: 0, 7: 4, 10: 7, 12: 3, 100: 7}),
    ],
)
def test_partition_for_key_matches_hand_computed_partitions(
    key: bytes, positive_hash: int, partitions_by_count: dict[int, int]
) -> None:
    assert to_positive(murmur2(key)) == positive_hash
    for partition_count, partition in partitions_by_count.items():
        assert partition_for_key(key, partition_count) == partition


@given(st.binary(max_size=300), st.integers(min_value=1, max_value=100_000))
def test_partition_for_key_is_in_range_and_deterministic(key: bytes, partition_count: int) -> None:
    partition = partition_for_key(key, partition_count)
    assert 0 <= partition < partition_count
    assert partition_for_key(bytes(bytearray(key)), partition_count) == partition


@pytest.mark.parametrize("partition_count", [0, -1, -100])
def test_partition_count_below_one_is_refused(partition_count: int) -> None:
    with pytest.raises(ValueError, match="partition_count"):
        partition_for_key(b"key", partition_count)
    with pytest.raises(ValueError, match="partition_count"):
        StickyPartitioner().partition(partition_count)


def test_sticky_partitioner_refuses_negative_start() -> None:
    with pytest.raises(ValueError, match="start"):
        StickyPartitioner(start=-1)


@given(
    partition_count=st.integers(min_value=1, max_value=50),
    start=st.integers(min_value=0, max_value=1000),
    records_per_request=st.integers(min_value=1, max_value=5),
)
def test_sticky_partitioner_keeps_one_partition_until_next_batch(
    partition_count: int, start: int, records_per_request: int
) -> None:
    sticky = StickyPartitioner(start=start)
    first = sticky.partition(partition_count)
    assert first == start % partition_count
    for _ in range(records_per_request):
        assert sticky.partition(partition_count) == first
    sticky.next_batch()
    assert sticky.partition(partition_count) == (first + 1) % partition_count


@given(
    partition_count=st.integers(min_value=1, max_value=50),
    rounds=st.integers(min_value=1, max_value=20),
    start=st.integers(min_value=0, max_value=1000),
)
def test_sticky_partitioner_spreads_requests_evenly(
    partition_count: int, rounds: int, start: int
) -> None:
    sticky = StickyPartitioner(start=start)
    requests_per_partition: Counter[int] = Counter()
    for _ in range(partition_count * rounds):
        requests_per_partition[sticky.partition(partition_count)] += 1
        sticky.next_batch()
    assert requests_per_partition == {p: rounds for p in range(partition_count)}


@given(
    partition_counts=st.lists(st.integers(min_value=1, max_value=20), min_size=1, max_size=50),
    start=st.integers(min_value=0, max_value=1000),
)
def test_sticky_partitioner_stays_in_range_when_partition_count_changes(
    partition_counts: list[int], start: int
) -> None:
    sticky = StickyPartitioner(start=start)
    for partition_count in partition_counts:
        assert 0 <= sticky.partition(partition_count) < partition_count
        sticky.next_batch()

"""Choosing a partition for a produced record when the client did not name one.

A produce request names its partition explicitly, or carries a key, or neither:

1. Explicit partition: used as given (checked elsewhere against the topic).
2. Keyed record: goes to ``toPositive(murmur2(key_bytes)) % partitions``, the same as Kafka's
   default partitioner, so a key maps to the same partition in dmq and Kafka for the same
   partition count. Records with one key therefore stay in order on one partition for as long
   as the partition count does not change.
3. No key: ``StickyPartitioner`` keeps one partition for a whole produce request and moves
   round-robin to the next partition for the next request.

The hash, exactly, so that clients in other languages can reproduce it
(``org.apache.kafka.common.utils.Utils.murmur2`` and ``Utils.toPositive``):

- Arithmetic is on unsigned 32-bit words, every product reduced modulo 2**32; ``>>`` is a
  logical shift. Constants: seed = 0x9747b28c, m = 0x5bd1e995, r = 24.
- ``h = seed ^ len(data)``.
- For each whole 4-byte block ``k`` of ``data``, read little-endian:
  ``k *= m; k ^= k >> r; k *= m; h *= m; h ^= k``.
- If 1 to 3 bytes remain, read them as a little-endian integer ``t`` (the first remaining byte
  is the lowest): ``h ^= t; h *= m``.
- Finalise: ``h ^= h >> 13; h *= m; h ^= h >> 15``.
- ``murmur2`` returns ``h`` as a signed 32-bit (Java ``int``) value.
- ``toPositive(n) = n & 0x7fffffff``: it clears the sign bit; it is not ``abs``.

Test vectors, from Kafka's own ``UtilsTest.testMurmur2`` (keys are ASCII bytes)::

    "21"                                                 -> -973932308
    "foobar"                                             -> -790332482
    "a-little-bit-long-string"                           -> -985981536
    "a-little-bit-longer-string"                         -> -1486304829
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"   -> -58897971
    "abc"                                                -> 479470107

So, for example, key "21" over 7 partitions goes to partition
``toPositive(-973932308) % 7 = 1173551340 % 7 = 3``.

Everything here is pure: no I/O, clock or randomness.
"""

from __future__ import annotations

import struct

__all__ = ["StickyPartitioner", "murmur2", "partition_for_key", "to_positive"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK_32 = 0xFFFFFFFF
_SIGN_BIT_32 = 0x80000000
_INT32_MAX = 0x7FFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 of ``data``, as a signed Java ``int`` in [-2**31, 2**31)."""
    length = len(data)
    # Java computes seed ^ length in an int; Java arrays are shorter than 2**31 bytes, so
    # masking to 32 bits gives the same bits for every input Kafka could hash.
    h = (_SEED ^ length) & _MASK_32
    body_end = length & ~3
    for (k,) in struct.iter_unpack("<I", memoryview(data)[:body_end]):
        k = (k * _M) & _MASK_32
        k ^= k >> _R
        k = (k * _M) & _MASK_32
        h = ((h * _M) & _MASK_32) ^ k
    tail = data[body_end:]
    if tail:
        # Kafka's fall-through switch XORs byte i of the tail shifted left by 8*i: that is the
        # tail read as a little-endian integer.
        h ^= int.from_bytes(tail, "little")
        h = (h * _M) & _MASK_32
    h ^= h >> 13
    h = (h * _M) & _MASK_32
    h ^= h >> 15
    return h - (1 << 32) if h & _SIGN_BIT_32 else h


def to_positive(n: int) -> int:
    """Kafka's ``Utils.toPositive``: ``n`` with its 32-bit sign bit cleared (not ``abs(n)``)."""
    return n & _INT32_MAX


def partition_for_key(key: bytes, partition_count: int) -> int:
    """The partition in [0, partition_count) for a keyed record, as Kafka's default partitioner.

    Raises ValueError if ``partition_count`` is less than 1.
    """
    _check_partition_count(partition_count)
    return to_positive(murmur2(key)) % partition_count


class StickyPartitioner:
    """Chooses partitions for records with neither a key nor an explicit partition.

    Like Kafka's sticky partitioner, it returns the same partition until ``next_batch`` is
    called, so one produce request fills one batch on one partition instead of many tiny ones.
    Unlike Kafka, which picks the next partition at random, it moves round-robin from
    ``start``: over ``N * k`` requests each of ``N`` partitions gets exactly ``k``, and the
    choice is reproducible. Brokers can pass different ``start`` values so they do not all
    begin on partition 0.

    The broker calls ``next_batch`` once per produce request. Not thread-safe: its one owner
    (the broker's event loop) serialises calls.
    """

    __slots__ = ("_batch_position",)

    def __init__(self, start: int = 0) -> None:
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        # Invariant: _batch_position == start + number of next_batch() calls. It is reduced
        # modulo the partition count only when read, so a change in partition count moves
        # the choice to a valid partition without losing the round-robin position. A Python
        # int cannot overflow, and one increment per request never makes it large.
        self._batch_position = start

    def partition(self, partition_count: int) -> int:
        """The partition in [0, partition_count) for the current batch.

        Raises ValueError if ``partition_count`` is less than 1.
        """
        _check_partition_count(partition_count)
        return self._batch_position % partition_count

    def next_batch(self) -> None:
        """Move to the next partition, round-robin, for the next produce request."""
        self._batch_position += 1

    def __repr__(self) -> str:
        return f"StickyPartitioner(batch_position={self._batch_position})"


def _check_partition_count(partition_count: int) -> None:
    if partition_count < 1:
        raise ValueError(f"partition_count must be >= 1, got {partition_count}")

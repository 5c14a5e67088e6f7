"""Limits of the storage engine, in one place.

Every limit is a named constant with the cost it bounds. The broker exposes the
user-tunable ones as topic or broker settings (see dmq/limits.py); these are the
defaults and the hard ceilings of the format itself.
"""

from __future__ import annotations

from typing import Final

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB

# One record's encoded size (key + value + headers + framing). Bounds the memory a
# single decode allocates and the latency of one record on the wire. Kafka: 1 MiB.
RECORD_BYTES_MAX: Final = 1 * MiB

# One batch on disk (header + records section as stored, compressed or not). A batch
# is the unit of append, replication and fetch, so this bounds one Raft entry and the
# smallest fetch that makes progress.
BATCH_BYTES_MAX: Final = 8 * MiB

# A compressed batch's records section once inflated: bounds decompression memory
# (a zstd frame of a few KiB can claim gigabytes).
BATCH_UNCOMPRESSED_BYTES_MAX: Final = 32 * MiB

# Records in one batch: bounds the decode loop and the offsets one append claims.
RECORDS_PER_BATCH_MAX: Final = 100_000

# A record's key: keys live in the compaction map and in hashes on every produce.
KEY_BYTES_MAX: Final = 64 * KiB

# Headers per record, and the size of one header key (header keys are UTF-8 text).
HEADER_COUNT_MAX: Final = 64
HEADER_KEY_BYTES_MAX: Final = 1 * KiB

# Format ceilings (not tunable): offsets are signed 64-bit, relative offsets in an
# index entry are unsigned 32-bit, file positions in an index entry unsigned 32-bit.
OFFSET_MAX: Final = 2**63 - 1
SEGMENT_BYTES_CEILING: Final = 2**31 - 1
RELATIVE_OFFSET_MAX: Final = 2**32 - 1

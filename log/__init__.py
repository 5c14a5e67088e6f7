"""log/: the segmented partition log, dmq's storage engine.

Synchronous, single-writer, no networking: see log/README.md for the format, the
glossary, the invariants and the limits.
"""

from log.compaction import (
    CompactionPlan,
    CompactionResult,
    build_compaction,
    compact,
    install_compaction,
    plan_compaction,
)
from log.config import CleanupPolicy, FlushPolicy, LogConfig
from log.errors import (
    CorruptRecordError,
    CorruptSegmentError,
    InvalidOffsetError,
    InvalidRecordError,
    LogError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
)
from log.partition_log import AppendResult, FileRange, PartitionLog, ReadResult, Retained
from log.records import (
    BatchHeader,
    Codec,
    DecodedBatch,
    Header,
    Record,
    RecordLimits,
    TimestampType,
    decode_batch,
    encode_batch,
    iter_batches,
    validate_batch,
)

__all__ = [
    "AppendResult",
    "BatchHeader",
    "CleanupPolicy",
    "Codec",
    "CompactionPlan",
    "CompactionResult",
    "CorruptRecordError",
    "CorruptSegmentError",
    "DecodedBatch",
    "FileRange",
    "FlushPolicy",
    "Header",
    "InvalidOffsetError",
    "InvalidRecordError",
    "LogConfig",
    "LogError",
    "OffsetOutOfRangeError",
    "PartitionLog",
    "ReadResult",
    "Record",
    "RecordLimits",
    "RecordTooLargeError",
    "Retained",
    "StorageError",
    "TimestampType",
    "build_compaction",
    "compact",
    "decode_batch",
    "encode_batch",
    "install_compaction",
    "iter_batches",
    "plan_compaction",
    "validate_batch",
]

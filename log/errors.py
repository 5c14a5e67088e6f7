"""Errors raised by the storage engine.

log/ may import nothing above it, so its branch of dmq's error tree lives here and
dmq/errors.py re-exports it (the whole tree is drawn in dmq/errors.py)::

    LogError
    ├── InvalidRecordError          the input is malformed or over a limit (client's fault)
    │   ├── RecordTooLargeError     a record, key or batch over its byte limit
    │   ├── CorruptRecordError      bad framing or CRC in a batch handed to append/decode
    │   └── InvalidOffsetError      an offset argument outside what the call allows
    ├── OffsetOutOfRangeError       a read below log_start_offset or past log_end_offset
    └── StorageError                the data on disk is wrong or the disk failed
        ├── CorruptSegmentError     a stored batch fails its checks (names file + position)
        └── StorageWriteError       a write failed (ENOSPC, EIO) and was undone: retry later
"""

from __future__ import annotations


class LogError(Exception):
    """Base of every error the storage engine raises."""


class InvalidRecordError(LogError):
    """A batch or record handed to the log is malformed or breaks a limit.

    `field` names what is wrong and `limit` the bound it broke, if any, so the
    HTTP layer can tell the user exactly which value to change.
    """

    def __init__(self, message: str, *, field: str, limit: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.limit = limit


class RecordTooLargeError(InvalidRecordError):
    """A record, key, header or batch exceeds its byte or count limit."""


class CorruptRecordError(InvalidRecordError):
    """An incoming batch has bad framing, a bad CRC or inconsistent counts."""


class InvalidOffsetError(InvalidRecordError):
    """An offset argument is outside the range the operation accepts."""


class OffsetOutOfRangeError(LogError):
    """A read asked for an offset outside [log_start_offset, log_end_offset]."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(f"offset {offset} is out of range [{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class StorageError(LogError):
    """The data on disk is inconsistent or an I/O operation failed."""


class CorruptSegmentError(StorageError):
    """A stored batch fails its framing or CRC check; never served as data."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"corrupt batch in {path} at position {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason


class StorageWriteError(StorageError):
    """A write failed (no space, an I/O error) and was undone: the log holds exactly what
    it held before the call (a partial batch was cut back to the last good one), so the
    same append may be tried again once the disk has room. `no_space` tells ENOSPC (and
    EDQUOT, EFBIG) from other I/O errors."""

    def __init__(self, message: str, *, no_space: bool) -> None:
        super().__init__(message)
        self.no_space = no_space

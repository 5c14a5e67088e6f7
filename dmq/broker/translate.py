"""Storage errors at the broker's border: log/ and partition types never reach the user.

Every service that reads or appends through a replica turns a `log.errors.LogError` into
the matching `dmq.errors` type here, so the one error tree (dmq/errors.py) is all that
http_api and clients ever see.
"""

from __future__ import annotations

from dmq import errors
from dmq.metadata.service import storage_refusal
from dmq.partition.producers import OutOfOrderSequenceError, ProducerFencedError
from log import errors as log_errors


def translate(exc: log_errors.LogError) -> errors.DmqError:
    """Storage errors at the Broker's border: log/ types never reach the user."""
    if isinstance(exc, ProducerFencedError):
        return errors.ProducerFenced(str(exc), field=exc.field)
    if isinstance(exc, OutOfOrderSequenceError):
        return errors.OutOfOrderSequence(str(exc), field=exc.field)
    if isinstance(exc, log_errors.RecordTooLargeError):
        return errors.RecordTooLarge(str(exc), field=exc.field, limit=exc.limit)
    if isinstance(exc, log_errors.InvalidRecordError):
        return errors.InvalidRequest(str(exc), field=exc.field, limit=exc.limit)
    if isinstance(exc, log_errors.OffsetOutOfRangeError):
        return errors.OffsetOutOfRange(
            str(exc),
            offset=exc.offset,
            log_start_offset=exc.log_start_offset,
            log_end_offset=exc.log_end_offset,
        )
    if isinstance(exc, log_errors.StorageWriteError):  # undone: the broker goes on
        return storage_refusal(exc, "append", no_space=exc.no_space)
    return errors.StorageError(str(exc))

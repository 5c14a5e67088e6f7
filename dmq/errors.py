"""The one error tree of dmq. Every error a user can see is one of these.

::

    DmqError
    ├── ClientError                  the request is wrong: retrying it unchanged fails again
    │   ├── InvalidRequest           400  malformed input; `field` and `limit` say what
    │   ├── Unauthenticated          401  an internal route without a valid broker signature,
    │   │                                 or (--auth on) a public one without valid credentials
    │   ├── Forbidden                403  authenticated, but no ACL allows it; details name the
    │   │                                 operation and the resource (dmq/broker/security.py)
    │   │   └── InvalidConfig        400  an unknown or out-of-range topic/broker setting
    │   ├── NotFound                 404
    │   │   ├── TopicNotFound
    │   │   ├── PartitionNotFound
    │   │   │   └── PartitionGone    410  decommissioned and removed (the number stays taken)
    │   │   ├── GroupNotFound
    │   │   ├── TransactionNotFound  unknown transactional id
    │   │   └── ConsumerInstanceNotFound  a REST v2 consumer instance (code not_found)
    │   ├── TopicAlreadyExists       409
    │   ├── GroupConflict            409  consumer groups: the member must act first
    │   │   ├── UnknownMember        409  not (or no longer) a member: join again
    │   │   ├── StaleGeneration      409  the partition is not this member's at that generation
    │   │   ├── GroupNotEmpty        409  offsets reset and group delete need an empty group
    │   │   ├── InconsistentAssignor 409  the group's members use another assignor
    │   │   ├── ConsumerInstanceExists 409  a REST v2 consumer instance name (group_conflict)
    │   │   └── LockNotHeld          409  share groups: the record is not locked to this member
    │   ├── PartitionDecommissioned  409  the partition takes no new records (still readable)
    │   ├── OperationConflict        409  another cluster operation of that kind is running
    │   │   └── FeatureLevelUnsupported 409  a feature level some broker does not support
    │   │                                 (details name each laggard and its release)
    │   ├── ClusterIdMismatch        409  a broker, data directory or message of another cluster
    │   ├── ProducerFenced           409  a newer instance of this transactional id wrote
    │   ├── InvalidTxnState          409  (under OperationConflict) commit/abort in another state
    │   ├── OutOfOrderSequence       409  an idempotent producer's batch skips a sequence
    │   ├── RecordTooLarge           413  a record, batch or body over its limit
    │   ├── UnsupportedMediaType     415
    │   ├── OffsetOutOfRange         416  body carries the valid range
    │   └── NotAcceptable            406  e.g. a non-UTF-8 value asked for as a string
    ├── RetriableError               the same request may succeed later (Retry-After)
    │   ├── NotLeader                503  this broker does not lead the partition now
    │   ├── BrokerUnavailable        503  shutting down, or no leader could be found
    │   ├── Backpressure             429  a bounded queue is full
    │   │   └── QuotaExceeded        429  the principal's quota (bytes/s, requests/s) is spent
    │   ├── InsufficientStorage      507  the disk is below its free-space floor: produce is
    │   │                                 refused before anything is written (reads go on);
    │   │                                 `free_bytes` and `floor_bytes` say how far
    │   ├── RequestTimeout           504  the operation did not complete in time
    │   └── ConcurrentTransactions   503  the previous transaction is writing its markers
    └── StorageError                 500  the broker's data or disk is broken (node stops)
        ├── MetaFileCorrupt               the data directory's meta.properties is not valid
        ├── DataDirMismatch               the data directory is another broker's (start refused)
        └── FormatTooNew                  a file of the data directory is in a format newer
                                          than this release reads (start refused, nothing
                                          changed: dmq/data_formats.py)

The storage engine (log/) cannot import this module; its errors (log/errors.py) are
translated into these at the Broker's border (`dmq.broker`), so they never reach a
user as themselves. Each class has a stable `code` used on the wire; the client
maps codes back to classes with `error_for_code`.
"""

from __future__ import annotations

from typing import Any, ClassVar


class DmqError(Exception):
    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = {k: v for k, v in details.items() if v is not None}


class ClientError(DmqError):
    code = "client_error"


class InvalidRequest(ClientError):
    code = "invalid_request"

    def __init__(
        self, message: str, *, field: str | None = None, limit: int | None = None, **details: Any
    ) -> None:
        super().__init__(message, field=field, limit=limit, **details)
        self.field = field
        self.limit = limit


class InvalidConfig(InvalidRequest):
    code = "invalid_config"


class Unauthenticated(ClientError):
    """A /v1/internal call that does not prove the cluster secret (dmq/internal_auth.py);
    `reason` says what failed: missing, malformed, expired or signature."""

    code = "unauthenticated"


class Forbidden(ClientError):
    """Authenticated, but no ACL allows the operation on the resource (or one denies it);
    details name `operation`, `resource_type` and `resource_name`."""

    code = "forbidden"


class NotFound(ClientError):
    code = "not_found"


class TopicNotFound(NotFound):
    code = "topic_not_found"


class PartitionNotFound(NotFound):
    code = "partition_not_found"


class PartitionGone(PartitionNotFound):
    code = "partition_gone"


class GroupNotFound(NotFound):
    code = "group_not_found"


class ConsumerInstanceNotFound(NotFound):
    """A Confluent REST v2 consumer instance (dmq/broker/rest_v2.py): its v2 error_code
    is 40403; on dmq's own wire it keeps NotFound's code."""


class TopicAlreadyExists(ClientError):
    code = "topic_already_exists"


class GroupConflict(ClientError):
    code = "group_conflict"


class UnknownMember(GroupConflict):
    code = "unknown_member"


class StaleGeneration(GroupConflict):
    code = "stale_generation"


class GroupNotEmpty(GroupConflict):
    code = "group_not_empty"


class InconsistentAssignor(GroupConflict):
    code = "inconsistent_assignor"


class LockNotHeld(GroupConflict):
    """A share-group ack of a record whose lock expired or that another member holds."""

    code = "lock_not_held"


class ConsumerInstanceExists(GroupConflict):
    """A Confluent REST v2 consumer instance name already taken in its group (v2
    error_code 40902); on dmq's own wire it keeps GroupConflict's code."""


class PartitionDecommissioned(ClientError):
    code = "partition_decommissioned"


class OperationConflict(ClientError):
    """A cluster operation that conflicts with one running (e.g. a second metadata voter
    change): wait for it to finish (`GET /v1/cluster/operations`) or roll it back."""

    code = "operation_conflict"


class FeatureLevelUnsupported(OperationConflict):
    """Finalizing a feature level that a registered broker does not support, or that
    could not be asked (dmq/broker/features.py): `details.laggards` names each one."""

    code = "feature_level_unsupported"


class ClusterIdMismatch(ClientError):
    """A broker, a data directory or a broker-to-broker call of another cluster than this
    one (dmq/README.md, "Cluster identity"); details name both ids."""

    code = "cluster_id_mismatch"


class ProducerFenced(ClientError):
    code = "producer_fenced"


class TransactionNotFound(NotFound):
    code = "transaction_not_found"


class InvalidTxnState(OperationConflict):
    """A commit, abort or add that the transaction's state does not allow now."""

    code = "invalid_txn_state"


class OutOfOrderSequence(ClientError):
    code = "out_of_order_sequence"


class RecordTooLarge(InvalidRequest):
    code = "record_too_large"


class UnsupportedMediaType(InvalidRequest):
    code = "unsupported_media_type"


class NotAcceptable(InvalidRequest):
    code = "not_acceptable"


class OffsetOutOfRange(ClientError):
    code = "offset_out_of_range"

    def __init__(self, message: str, *, offset: int, log_start_offset: int, log_end_offset: int):
        super().__init__(
            message, offset=offset, log_start_offset=log_start_offset, log_end_offset=log_end_offset
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class RetriableError(DmqError):
    code = "retriable"
    retry_after_ms: int = 100


class NotLeader(RetriableError):
    code = "not_leader"


class BrokerUnavailable(RetriableError):
    code = "broker_unavailable"


class Backpressure(RetriableError):
    code = "backpressure"


class QuotaExceeded(Backpressure):
    """The principal spent its quota on this broker; nothing was done: retry after
    `retry_after_ms` (dmq/broker/security.py)."""

    code = "quota_exceeded"


class RequestTimeout(RetriableError):
    code = "request_timeout"


class InsufficientStorage(RetriableError):
    """A full disk (log/space.py): nothing of the request was written. Retry once
    retention, a deleted topic or more disk freed space; every other request goes on."""

    code = "insufficient_storage"
    retry_after_ms = 1000


class ConcurrentTransactions(RetriableError):
    """The transactional id's previous transaction is still writing its markers."""

    code = "concurrent_transactions"
    retry_after_ms = 50


class StorageError(DmqError):
    code = "storage_error"


class MetaFileCorrupt(StorageError):
    """<data-dir>/meta.properties exists but is not valid (dmq/meta_file.py)."""

    code = "meta_file_corrupt"


class DataDirMismatch(StorageError):
    """The data directory belongs to another broker than --node-id (dmq/meta_file.py)."""

    code = "data_dir_mismatch"


class FormatTooNew(StorageError):
    """A file written by a newer dmq than this one (dmq/data_formats.py, dmq/compat.py)."""

    code = "format_too_new"


_ALL: tuple[type[DmqError], ...] = (
    DmqError,
    ClientError,
    InvalidRequest,
    InvalidConfig,
    Unauthenticated,
    Forbidden,
    NotFound,
    TopicNotFound,
    PartitionNotFound,
    GroupNotFound,
    TopicAlreadyExists,
    GroupConflict,
    UnknownMember,
    StaleGeneration,
    GroupNotEmpty,
    InconsistentAssignor,
    LockNotHeld,
    ProducerFenced,
    OutOfOrderSequence,
    TransactionNotFound,
    InvalidTxnState,
    ConcurrentTransactions,
    RecordTooLarge,
    UnsupportedMediaType,
    NotAcceptable,
    OffsetOutOfRange,
    PartitionGone,
    PartitionDecommissioned,
    OperationConflict,
    FeatureLevelUnsupported,
    ClusterIdMismatch,
    RetriableError,
    NotLeader,
    BrokerUnavailable,
    Backpressure,
    QuotaExceeded,
    RequestTimeout,
    InsufficientStorage,
    StorageError,
    MetaFileCorrupt,
    DataDirMismatch,
    FormatTooNew,
)
_BY_CODE: dict[str, type[DmqError]] = {cls.code: cls for cls in _ALL}


def error_for_code(code: str, message: str, details: dict[str, Any] | None = None) -> DmqError:
    """Rebuild the error a broker sent ({"error": {"code", "message", "details"}})."""
    cls = _BY_CODE.get(code, DmqError)
    details = dict(details or {})
    if cls is OffsetOutOfRange:
        return OffsetOutOfRange(
            message,
            offset=int(details.get("offset", -1)),
            log_start_offset=int(details.get("log_start_offset", -1)),
            log_end_offset=int(details.get("log_end_offset", -1)),
        )
    error = DmqError.__new__(cls)
    DmqError.__init__(error, message, **details)
    if isinstance(error, InvalidRequest):
        error.field = details.get("field")
        error.limit = details.get("limit")
    return error

"""dmq: a distributed message queue and event-streaming broker.

The public Python API: the client classes and value types, and the error tree.
Everything else (the broker, the HTTP application, the storage engine) is used
through `dmq serve` and the HTTP API.
"""

from dmq.client import (
    Admin,
    AsyncAdmin,
    AsyncConsumer,
    AsyncProducer,
    BrokerInfo,
    ClusterInfo,
    Consumer,
    ConsumerRecord,
    PartitionInfo,
    PartitionOffsets,
    Producer,
    RecordMetadata,
    TopicDescription,
    TopicPartition,
    TopicSummary,
)
from dmq.errors import (
    Backpressure,
    BrokerUnavailable,
    ClientError,
    DmqError,
    InvalidConfig,
    InvalidRequest,
    NotAcceptable,
    NotFound,
    NotLeader,
    OffsetOutOfRange,
    PartitionNotFound,
    RecordTooLarge,
    RequestTimeout,
    RetriableError,
    StorageError,
    TopicAlreadyExists,
    TopicNotFound,
    UnsupportedMediaType,
)

__version__ = "0.1.0"

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "Backpressure",
    "BrokerInfo",
    "BrokerUnavailable",
    "ClientError",
    "ClusterInfo",
    "Consumer",
    "ConsumerRecord",
    "DmqError",
    "InvalidConfig",
    "InvalidRequest",
    "NotAcceptable",
    "NotFound",
    "NotLeader",
    "OffsetOutOfRange",
    "PartitionInfo",
    "PartitionNotFound",
    "PartitionOffsets",
    "Producer",
    "RecordMetadata",
    "RecordTooLarge",
    "RequestTimeout",
    "RetriableError",
    "StorageError",
    "TopicAlreadyExists",
    "TopicDescription",
    "TopicNotFound",
    "TopicPartition",
    "TopicSummary",
    "UnsupportedMediaType",
]

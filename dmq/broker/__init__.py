"""The broker: a thin `Broker` that composes the services http_api calls (dmq/README.md)."""

from dmq.broker.broker import Broker
from dmq.broker.types import (
    CONSISTENCIES,
    Acks,
    Consistency,
    FetchResult,
    ForwardRequest,
    ProduceRecord,
    ProducerSequence,
    TopicDescription,
)

__all__ = [
    "CONSISTENCIES",
    "Acks",
    "Broker",
    "Consistency",
    "FetchResult",
    "ForwardRequest",
    "ProduceRecord",
    "ProducerSequence",
    "TopicDescription",
]

"""Value types shared by the broker, the HTTP API and the client.

Records and headers are the storage engine's own frozen dataclasses (log/records.py),
re-exported here so that layers above the Broker never import log/ directly.
"""

from log.records import Codec, Header, Record, TimestampType

# On every produce answer: the topic's partition count as the answering broker knows it.
# A client that maps keys to partitions itself re-reads the topic when it changes (added
# partitions move keys, as in Kafka; see dmq/README.md).
PARTITION_COUNT_HEADER = "X-Dmq-Partition-Count"

__all__ = ["PARTITION_COUNT_HEADER", "Codec", "Header", "Record", "TimestampType"]

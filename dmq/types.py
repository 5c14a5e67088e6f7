"""Value types shared by the broker, the HTTP API and the client.

Records and headers are the storage engine's own frozen dataclasses (log/records.py),
re-exported here so that layers above the Broker never import log/ directly.
"""

from log.records import Codec, Header, Record, TimestampType

__all__ = ["Codec", "Header", "Record", "TimestampType"]

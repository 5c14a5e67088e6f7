"""dmq's Python client: produce, consume and administer topics over the HTTP API.

Two APIs with the same names, arguments and behaviour:

- asyncio, over keep-alive HTTP/1.1 connections of its own (dmq/client/_conn.py):
  `AsyncProducer`, `AsyncConsumer`, `AsyncAdmin`;
- blocking: `Producer`, `Consumer`, `Admin`, which run the asyncio ones on a private event
  loop in a background thread, so the protocol logic exists once.

::

    from dmq.client import Admin, Consumer, Producer

    with Admin("http://127.0.0.1:8080") as admin:
        admin.create_topic("orders", partitions=3)
    with Producer("http://127.0.0.1:8080", compression="zstd") as producer:
        producer.send("orders", b"42 apples", key=b"customer-7")
    with Consumer("http://127.0.0.1:8080", topic="orders") as consumer:
        for record in consumer.poll(timeout_ms=1000):
            print(record.partition, record.offset, record.key, record.value)

Every error is a `dmq.errors.DmqError`: the broker's `{"error": {"code"}}` becomes its
class (`error_for_code`), connection failures become `BrokerUnavailable` and timeouts
`RequestTimeout`. `RetriableError`s are retried with backoff (honouring Retry-After)
until a deadline: a record's `delivery_timeout_ms` (120 s) from `send`, any other call's
`default_api_timeout_ms` (60 s); then the last error is raised, naming the setting.
`ClientError`s are never retried. A produce retried after a lost answer may be appended twice
unless the producer is idempotent (`Producer(url, idempotent=True)` or a
`transactional_id`): then the partition writes a retried batch once.

`Producer(url, transactional_id="t1")` writes transactions across partitions
(`begin_transaction`, `send`, `send_offsets_to_transaction`, `commit_transaction`,
`abort_transaction`; a newer instance raises `ProducerFenced`), and
`Consumer(url, isolation="read_committed")` reads only committed transactions
(`_transactions.py`).

`Consumer(url, group="g", topics=[...])` (`AsyncGroupConsumer`) is a member of a consumer
group: the broker assigns its partitions, it heartbeats in the background and commits
after each poll (at-least-once); see `_group.py` and groups/README.md.

`ShareConsumer(url, group="g", topics=[...])` is a member of a share group (a queue): any
number of members read the same partitions, each record is locked to one member until it
is accepted, released (optionally with a delay) or rejected (to the dead-letter topic);
see `_share.py` and groups/README.md, "Share groups".

`https://` URLs are checked against the system's CAs, or the CA given as
`tls=tls_context(ca_file=..., cert_file=..., key_file=...)` to `Producer`, `Consumer` and
`Admin` (sync and async), or in the environment (`DMQ_CA`, `DMQ_CERT`, `DMQ_KEY`), which
every client class reads when given no `tls=` (`_tls.py`).

The producer batches records per partition and sends each batch as one binary
RecordBatch (zstd-compressed end to end if asked); the consumer fetches stored batches
as they are and checks their CRC. The modules `_producer.py`, `_consumer.py`,
`_accumulator.py` and `_http.py` describe each step.
"""

from dmq.client._admin import AsyncAdmin
from dmq.client._consumer import AsyncConsumer, OffsetReset, SeekTo
from dmq.client._group import AsyncGroupConsumer
from dmq.client._producer import Acks, AsyncProducer, Compression
from dmq.client._share import (
    AsyncShareConsumer,
    ShareConsumer,
    ShareRecord,
    configure_share_group,
    describe_share_group,
)
from dmq.client._sync import Admin, Consumer, Producer
from dmq.client._tls import tls_context
from dmq.client._types import (
    BrokerInfo,
    ClusterInfo,
    ConsumerRecord,
    PartitionInfo,
    PartitionOffsets,
    RecordMetadata,
    TopicDescription,
    TopicPartition,
    TopicSummary,
)

__all__ = [
    "Acks",
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncGroupConsumer",
    "AsyncProducer",
    "AsyncShareConsumer",
    "BrokerInfo",
    "ClusterInfo",
    "Compression",
    "Consumer",
    "ConsumerRecord",
    "OffsetReset",
    "PartitionInfo",
    "PartitionOffsets",
    "Producer",
    "RecordMetadata",
    "SeekTo",
    "ShareConsumer",
    "ShareRecord",
    "TopicDescription",
    "TopicPartition",
    "TopicSummary",
    "configure_share_group",
    "describe_share_group",
    "tls_context",
]

"""Records and bytes produced and fetched, per partition: the only metrics counted on the
request path (everything else is read from live state at scrape time: metrics.py).

Counted where the work is done, so that a record is counted once in the cluster:

- produced: by the broker whose replica appended the batch (the leader: produce.py's
  local append, or the append another broker forwarded to it), after the append
  succeeded (acks=0 too: when the fire-and-forget append completes). Every appended
  batch counts, transaction markers (one control record each) included, so the produced
  records of a partition follow its log end offset. Bytes are the stored batch bytes
  (compressed as written).
- fetched: by the broker whose replica served the read (fetch.py; group fetches too).
  Binary fetches count the stored batch bytes sent and the offsets covered; JSON fetches
  the records returned and their key, value and header bytes.

Two integer additions and a dict lookup per request: no lock (the event loop is the only
writer of the counts; the scrape's worker thread only copies them and forgets deleted
topics) and no metrics library on this path.
"""

from __future__ import annotations

from dataclasses import dataclass

from dmq.broker.types import FetchResult
from log.records import read_header

PartitionKey = tuple[str, int]  # (topic, partition)


@dataclass(slots=True)
class Traffic:
    """One partition's counters since this broker started (monotonic)."""

    produced_records: int = 0
    produced_bytes: int = 0
    fetched_records: int = 0
    fetched_bytes: int = 0


class TrafficCounters:
    """Per-partition counters; a topic deleted is forgotten at the next scrape (`forget`)."""

    def __init__(self) -> None:
        self.partitions: dict[PartitionKey, Traffic] = {}

    def _of(self, topic: str, partition: int) -> Traffic:
        traffic = self.partitions.get((topic, partition))
        if traffic is None:
            traffic = self.partitions[(topic, partition)] = Traffic()
        return traffic

    def produced(self, topic: str, partition: int, batch: bytes) -> None:
        traffic = self._of(topic, partition)
        traffic.produced_records += read_header(batch).record_count
        traffic.produced_bytes += len(batch)

    def fetched(self, result: FetchResult) -> FetchResult:
        """Count a fetch's answer; returns it, so that a return statement can wrap it."""
        if result.raw is not None:
            records, size = result.next_offset - result.offset, result.raw.size_bytes
        else:
            records = len(result.records)
            size = sum(
                len(r.key or b"")
                + len(r.value or b"")
                + sum(len(h.key.encode()) + len(h.value) for h in r.headers)
                for r in result.records
            )
        if records or size:
            traffic = self._of(result.topic, result.partition)
            traffic.fetched_records += max(0, records)
            traffic.fetched_bytes += size
        return result

    def forget(self, topics: set[str] | dict[str, object]) -> None:
        """Drop the counters of topics that no longer exist (bounded memory and series)."""
        # list() copies in one C call: the scrape runs this on a worker thread while the
        # event loop may add a partition (metrics.py); a count that races a deletion of
        # its topic is lost with the topic.
        for key in [k for k in list(self.partitions) if k[0] not in topics]:
            self.partitions.pop(key, None)

"""Planning (on the driver): which partitions, which offset ranges, how many tasks.

1. The topics are the `topic` list, or every topic matching `topicPattern` now.
2. Each partition's log_start_offset and high_watermark come from the offsets endpoint
   (relayed to the partition leader by whichever broker answers).
3. A boundary resolves per partition: -2 to log_start_offset, -1 to the high watermark, a
   timestamp to the first offset at or after it (the high watermark if none is).
4. Each range [start, end) becomes one task, or several with minPartitions: a range
   gets a share of minPartitions proportional to its size (Spark's Kafka source does
   the same), rounded up, so at least minPartitions tasks read a large topic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

from pyspark.sql.datasource import InputPartition

from dmq.client import Admin, PartitionOffsets, TopicDescription
from spark_io._brokers import Brokers
from spark_io._options import (
    EARLIEST,
    LATEST,
    Boundary,
    OffsetMap,
    OptionError,
    ReadOptions,
    matching_topics,
)


@dataclass(frozen=True, slots=True)
class PartitionState:
    topic: str
    partition: int
    log_start_offset: int
    high_watermark: int


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark task: the records of topic/partition with offsets in [start, end).

    `from_earliest`: a partition that appeared after the query started is read from its
    first record, and records retention removed there are not data loss.
    """

    topic: str
    partition: int
    start: int
    end: int
    from_earliest: bool = False


def partition_states(brokers: Brokers, options: ReadOptions) -> list[PartitionState]:
    """Steps 1-2; a topic that does not exist fails with TopicNotFound."""
    states: list[PartitionState] = []
    for topic in brokers.admin(lambda admin: matching_topics(admin, options)):
        count = brokers.admin(partial(_describe, topic=topic)).partition_count
        for partition in range(count):
            offsets = brokers.admin(partial(_offsets, topic=topic, partition=partition))
            end = offsets.high_watermark  # read_committed reads up to the LSO only
            if options.isolation == "read_committed" and offsets.last_stable_offset is not None:
                end = min(end, offsets.last_stable_offset)
            states.append(PartitionState(topic, partition, offsets.log_start_offset, end))
    return states


def _describe(admin: Admin, topic: str) -> TopicDescription:
    return admin.describe_topic(topic)


def _offsets(admin: Admin, topic: str, partition: int) -> PartitionOffsets:
    return admin.offsets(topic, partition)


def resolve(brokers: Brokers, boundary: Boundary, state: PartitionState, name: str) -> int:
    """Step 3 for one partition."""
    if boundary.timestamp_ms is not None:
        ts = boundary.timestamp_ms
        answer = brokers.admin(lambda admin: admin.offsets(state.topic, state.partition, ts))
        return answer.high_watermark if answer.offset is None else answer.offset
    offset = boundary.default
    if boundary.offsets is not None:
        offset = boundary.offsets.get(state.topic, {}).get(str(state.partition), offset)
    if offset == EARLIEST:
        return state.log_start_offset
    if offset == LATEST:
        return state.high_watermark
    if offset > state.high_watermark:
        raise OptionError(
            f"option {name}: {state.topic}/{state.partition} offset {offset} is beyond the "
            f"high watermark {state.high_watermark}"
        )
    return offset


def batch_ranges(brokers: Brokers, options: ReadOptions) -> list[OffsetRange]:
    """Steps 1-4 for a batch query."""
    ranges: list[OffsetRange] = []
    for state in partition_states(brokers, options):
        start = resolve(brokers, options.starting, state, "startingOffsets")
        end = resolve(brokers, options.ending, state, "endingOffsets")
        if start > end:
            raise OptionError(
                f"{state.topic}/{state.partition}: starting offset {start} is after the "
                f"ending offset {end}"
            )
        ranges.append(OffsetRange(state.topic, state.partition, start, end))
    return split(ranges, options.min_partitions)


def split(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Step 4. Empty ranges are dropped (they would be empty tasks)."""
    ranges = [r for r in ranges if r.end > r.start]
    total = sum(r.end - r.start for r in ranges)
    if not min_partitions or min_partitions <= len(ranges) or total == 0:
        return ranges
    result: list[OffsetRange] = []
    for r in ranges:
        size = r.end - r.start
        parts = min(size, math.ceil(size * min_partitions / total))
        for i in range(parts):
            lo, hi = r.start + size * i // parts, r.start + size * (i + 1) // parts
            result.append(OffsetRange(r.topic, r.partition, lo, hi, r.from_earliest))
    return result


def offset_map(states: list[PartitionState], offsets: list[int]) -> OffsetMap:
    result: OffsetMap = {}
    for state, offset in zip(states, offsets, strict=True):
        result.setdefault(state.topic, {})[str(state.partition)] = offset
    return result

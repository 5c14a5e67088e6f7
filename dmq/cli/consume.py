"""`dmq consume TOPIC`: print a topic's records, alone or as a member of a consumer group
(registered by dmq/cli/__init__.py).

Alone (`consume_records`), it reads the partitions it is given from where --from or
--from-time says, up to the high watermarks they had at the start unless --follow; with
--group (`consume_group`), it reads the partitions the group assigns it from the group's
committed offsets and commits as it goes. Both print with `format_record`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import signal
import sys
from collections.abc import Coroutine
from typing import IO, Any

from dmq.cli._common import (
    DURATION_HELP,
    Subparsers,
    UsageError,
    _non_negative_int,
    _offset_spec,
    _positive_int,
    _separator,
    admin_for,
    parse_time_ms,
)
from dmq.client import (
    AsyncAdmin,
    AsyncConsumer,
    AsyncGroupConsumer,
    ConsumerRecord,
    PartitionOffsets,
)
from dmq.errors import OffsetOutOfRange, TopicNotFound

_POLL_TIMEOUT_MS = 1_000
_POLL_RECORDS_MAX = 500
# With --group and without --follow, the command stops after this many empty polls in a
# row: the group's partitions have nothing more.
_IDLE_POLLS_TO_STOP = 2


def add_consume(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    consume = commands.add_parser(
        "consume",
        parents=[url],
        help="print records of a topic",
        description="Print the records of a topic, one per line, up to the end it had when "
        "the command started (or forever with --follow).",
    )
    consume.add_argument("topic")
    consume.add_argument("--partition", type=_non_negative_int, help="default: all partitions")
    start = consume.add_mutually_exclusive_group()
    start.add_argument(
        "--from",
        dest="start",
        type=_offset_spec,
        metavar="earliest|latest|OFFSET",
        help="where to start in each partition (earliest); with --group, earliest or "
        "latest: where to start a partition the group has no committed offset for",
    )
    start.add_argument(
        "--from-time",
        dest="start_time_ms",
        type=parse_time_ms,
        metavar="TIME",
        help="start at the first record at or after TIME: milliseconds since "
        f"the epoch, ISO 8601 (UTC unless an offset is given), or a duration ago ({DURATION_HELP})",
    )
    consume.add_argument("--follow", action="store_true", help="keep waiting for new records")
    consume.add_argument(
        "--group",
        help="consume as a member of this consumer group: its partitions, from its committed "
        "offsets, committing as it goes; it leaves the group on Ctrl-C or SIGTERM "
        "(--partition and --from-time do not apply; `dmq group reset` moves its offsets)",
    )
    consume.add_argument(
        "--isolation",
        choices=("read_committed", "read_uncommitted"),
        default="read_committed",
        help="read_committed (the default): only records of committed transactions, and "
        "none past the first open one; read_uncommitted: every record, aborted and open "
        "transactions' too",
    )
    consume.add_argument("--max-records", type=_positive_int, help="stop after this many")
    consume.add_argument(
        "--output",
        choices=("lines", "json"),
        default="lines",
        help="lines: the value (raw bytes); json: one object per record",
    )
    consume.add_argument(
        "--key-separator", type=_separator, metavar="SEP", help="lines: print KEY SEP VALUE"
    )
    consume.set_defaults(handler=_cmd_consume)


def _cmd_consume(args: argparse.Namespace) -> int:
    if args.group is not None:
        if args.partition is not None or args.start_time_ms is not None:
            flag = "--partition" if args.partition is not None else "--from-time"
            raise UsageError(
                f"{flag} does not apply with --group: the group assigns the partitions and "
                "starts them at its committed offsets (move them with `dmq group reset`)"
            )
        if args.start is not None and args.start not in ("earliest", "latest"):
            raise UsageError(
                "with --group, --from is earliest or latest (where a partition without a "
                f"committed offset starts), not {args.start}: move the group's offsets with "
                "`dmq group reset`"
            )
        run = consume_group(args, sys.stdout.buffer)
    else:
        run = consume_records(args, sys.stdout.buffer)
    try:
        asyncio.run(_until_sigterm(run))
    except asyncio.CancelledError:  # SIGTERM: stopped as Ctrl-C stops it, after cleanup
        return 128 + signal.SIGTERM
    except TopicNotFound as exc:  # a group member waits for its topics instead
        raise TopicNotFound(
            f"{exc.message}: create it with `dmq topic create {args.topic}` (or produce to "
            "it), or consume with --group, which waits for it to exist",
            field="topic",
        ) from None
    return 0


async def _until_sigterm(run: Coroutine[Any, Any, int]) -> int:
    """`run`, cancelled by SIGTERM as Ctrl-C cancels it, so that its cleanup runs (a group
    member commits and leaves the group at once instead of holding its partitions until
    its session expires)."""
    task = asyncio.current_task()
    assert task is not None, "runs inside asyncio.run"
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await run
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


async def consume_records(args: argparse.Namespace, out: IO[bytes]) -> int:
    """Write the topic's records to `out` (`dmq consume`); returns how many."""
    topic = args.topic
    written = 0
    async with (
        admin_for(args) as admin,
        AsyncConsumer(
            args.url, default_api_timeout_ms=args.api_timeout_ms, isolation=args.isolation
        ) as consumer,
    ):
        if args.partition is not None:
            partitions = [args.partition]
        else:
            partitions = [p.partition for p in (await admin.describe_topic(topic)).partitions]
        consumer.assign([(topic, p) for p in partitions])
        for p in partitions:
            if isinstance(args.start, int):
                await _check_start(admin, topic, p, args.start)
            if args.start_time_ms is not None:
                consumer.seek_to_timestamp(topic, p, args.start_time_ms)
            else:
                consumer.seek(topic, p, args.start if args.start is not None else "earliest")
        # Without --follow, stop at the ends the partitions had at the start: the high
        # watermark, or read_committed the last stable offset (no further is readable
        # while a transaction there is open).
        ends = None
        if not args.follow:
            ends = {p: _end(await admin.offsets(topic, p), args.isolation) for p in partitions}
        active = list(partitions)
        while args.max_records is None or written < args.max_records:
            if ends is not None:  # drop the partitions that reached their end
                active = [p for p in active if await consumer.position((topic, p)) < ends[p]]
                if not active:
                    break
                if len(active) < len(consumer.assignment()):
                    consumer.assign([(topic, p) for p in active])
            limit = _POLL_RECORDS_MAX
            if args.max_records is not None:
                limit = min(limit, args.max_records - written)
            for record in await consumer.poll(timeout_ms=_POLL_TIMEOUT_MS, max_records=limit):
                if ends is None or record.offset < ends[record.partition]:
                    out.write(format_record(record, args.output, args.key_separator))
                    written += 1
            out.flush()
    return written


async def _check_start(admin: AsyncAdmin, topic: str, partition: int, offset: int) -> None:
    """--from OFFSET outside a partition's records is refused, naming its range: past the
    end the command would print nothing and exit 0, or, with --follow, the broker's 416
    would move it to the earliest record without a word."""
    offsets = await admin.offsets(topic, partition)
    if not offsets.log_start_offset <= offset <= offsets.high_watermark:
        raise OffsetOutOfRange(
            f"offset {offset} is outside {topic}-{partition}'s [{offsets.log_start_offset}, "
            f"{offsets.high_watermark}]: --from earliest, latest or an offset in that range",
            offset=offset,
            log_start_offset=offsets.log_start_offset,
            log_end_offset=offsets.high_watermark,
        )


def _end(offsets: PartitionOffsets, isolation: str) -> int:
    stable = offsets.last_stable_offset
    return (
        stable if isolation == "read_committed" and stable is not None else offsets.high_watermark
    )


async def consume_group(args: argparse.Namespace, out: IO[bytes]) -> int:
    """`dmq consume TOPIC --group G`: a member of G (auto-commit, at-least-once); without
    --follow it stops once its partitions have nothing more (two empty polls)."""
    written = idle = 0
    async with AsyncGroupConsumer(
        args.url,
        args.group,
        topics=[args.topic],
        default_api_timeout_ms=args.api_timeout_ms,
        isolation=args.isolation,
        auto_offset_reset=args.start or "earliest",
    ) as consumer:
        while args.max_records is None or written < args.max_records:
            limit = _POLL_RECORDS_MAX
            if args.max_records is not None:
                limit = min(limit, args.max_records - written)
            records = await consumer.poll(timeout_ms=_POLL_TIMEOUT_MS, max_records=limit)
            for record in records:
                out.write(format_record(record, args.output, args.key_separator))
            out.flush()
            written += len(records)
            idle = 0 if records or not consumer.assignment() else idle + 1
            if not args.follow and idle >= _IDLE_POLLS_TO_STOP:
                break
        await consumer.commit()
    return written


def format_record(record: ConsumerRecord, output: str, separator: bytes | None = None) -> bytes:
    """One output line: the raw value (`lines`, with KEY SEP first if asked) or a JSON
    object with string fields, all base64 (`"value_encoding": "base64"`) if any is not
    UTF-8, as the HTTP API's JSON fetch."""
    if output == "lines":
        value = record.value or b""
        if separator is not None:
            value = (record.key or b"") + separator + value
        return value + b"\n"
    obj = record_json(
        record.topic, record.partition, record.offset, record.timestamp_ms,
        record.key, record.value, record.headers,
    )  # fmt: skip
    return json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n"


def record_json(
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    key: bytes | None,
    value: bytes | None,
    headers: tuple[tuple[str, bytes], ...],
) -> dict[str, Any]:
    """The one JSON shape of a record every command prints (`dmq consume`, `dmq share
    consume`): strings, all base64 with `"value_encoding": "base64"` if any is not UTF-8."""
    blobs = [key, value, *(v for _, v in headers)]
    try:
        for blob in blobs:
            if blob is not None:
                blob.decode("utf-8")
        encoding = "string"
    except UnicodeDecodeError:
        encoding = "base64"

    def text(blob: bytes | None) -> str | None:
        if blob is None:
            return None
        return blob.decode("utf-8") if encoding == "string" else base64.b64encode(blob).decode()

    obj: dict[str, Any] = {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "timestamp": timestamp_ms,
        "key": text(key),
        "value": text(value),
        "headers": [{"key": k, "value": text(v)} for k, v in headers],
    }
    if encoding == "base64":
        obj["value_encoding"] = "base64"
    return obj

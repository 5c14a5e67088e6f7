"""`dmq produce TOPIC`: lines of stdin or a file as records (registered by dmq/cli/__init__.py).

A reader thread does the blocking reads in bounded chunks (`read_lines`); each line is
split into key and value (`split_key`) and handed to an `AsyncProducer`, which batches
and lingers; `produce_lines` stops at the first error the broker answers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO, TextIO

from dmq.cli import delay
from dmq.cli._common import (
    DURATION_HELP,
    Subparsers,
    UsageError,
    _non_negative_int,
    _positive_int,
    _separator,
    duration_ms,
    plural,
)
from dmq.client import AsyncProducer, RecordMetadata
from dmq.client._limits import DELIVERY_TIMEOUT_MS_DEFAULT, LINGER_MS_DEFAULT
from dmq.errors import DmqError, InvalidRequest
from log import limits as log_limits

# produce: stdin or the file is read in chunks of this size by a reader thread, with at
# most _READ_AHEAD_CHUNKS waiting, so the memory it holds is bounded; a line (one record)
# may not exceed the largest batch.
_READ_CHUNK_BYTES = 64 * 1024
_READ_AHEAD_CHUNKS = 4
_LINE_BYTES_MAX = log_limits.BATCH_BYTES_MAX


def add_produce(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    produce = commands.add_parser(
        "produce",
        parents=[url],
        help="send lines of stdin or a file as records",
        description="Send each line (without its line ending) as one record. A topic that "
        "does not exist is created by the broker if its auto_create_topics is on.",
    )
    produce.add_argument("topic")
    produce.add_argument("--file", type=Path, help="read this file instead of stdin")
    produce.add_argument(
        "--key-separator",
        type=_separator,
        metavar="SEP",
        help="split each line at the first SEP into key and value",
    )
    produce.add_argument(
        "--acks",
        choices=("all", "1", "0"),
        default="all",
        help="all: answered once a majority of the replicas has the records (the default); "
        "1: once the leader has them; 0: not waited for (fire and forget)",
    )
    produce.add_argument(
        "--partition", type=_non_negative_int, help="send every record to this partition"
    )
    produce.add_argument(
        "--compression",
        choices=("none", "zstd"),
        default="none",
        help="how batches are compressed on the way and on disk (none)",
    )
    produce.add_argument(
        "--linger-ms",
        type=_non_negative_int,
        default=LINGER_MS_DEFAULT,
        help=f"how long a batch waits for more lines ({LINGER_MS_DEFAULT})",
    )
    produce.add_argument(
        "--delivery-timeout-ms",
        type=_positive_int,
        default=DELIVERY_TIMEOUT_MS_DEFAULT,
        metavar="MS",
        help="how long a record may take from being read to being acknowledged, retries "
        "included: a broker down or a leader election shorter than this loses nothing "
        f"({DELIVERY_TIMEOUT_MS_DEFAULT}, Kafka's delivery.timeout.ms)",
    )
    produce.add_argument(
        "--retries",
        type=_non_negative_int,
        metavar="N",
        help="also stop retrying a request after N retries (default: no cap)",
    )
    produce.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: with --file on a terminal)",
    )
    produce.add_argument(
        "--delay",
        type=duration_ms,
        metavar="DURATION",
        help=f"deliver each record this long from now ({DURATION_HELP}); prints each "
        "record's schedule id",
    )
    produce.set_defaults(handler=_cmd_produce)


def _cmd_produce(args: argparse.Namespace) -> int:
    if args.file is not None:
        try:
            stream: BinaryIO = args.file.open("rb")
        except OSError as exc:
            raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
        total = os.fstat(stream.fileno()).st_size
    else:
        stream, total = sys.stdin.buffer, 0
    if args.delay is not None:  # delayed records: the JSON route (dmq/cli/delay.py)
        with stream if stream is not sys.stdin.buffer else contextlib.nullcontext(stream):
            return delay.run(args, stream)
    show = args.progress if args.progress is not None else bool(args.file and sys.stderr.isatty())
    bar = ProgressBar(total, sys.stderr) if show and total > 0 else None
    try:
        stats = asyncio.run(produce_lines(args, stream, bar))
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    print(f"produced {plural(stats.acknowledged, 'record')} to {args.topic}", file=sys.stderr)
    if stats.first_error is not None:
        raise stats.first_error
    return 0


@dataclass(slots=True)
class ProduceStats:
    sent: int = 0
    acknowledged: int = 0
    first_error: DmqError | None = None

    def on_done(self, future: asyncio.Future[RecordMetadata]) -> None:
        error = None if future.cancelled() else future.exception()
        if error is None:
            self.acknowledged += 1
        elif self.first_error is None:
            self.first_error = error if isinstance(error, DmqError) else DmqError(f"{error!r}")


async def produce_lines(
    args: argparse.Namespace, stream: IO[bytes], bar: ProgressBar | None
) -> ProduceStats:
    """Send every line of `stream` as a record (`dmq produce`); stop at the first error."""
    stats = ProduceStats()
    separator: bytes | None = args.key_separator
    consumed = 0
    try:
        producer = AsyncProducer(
            args.url,
            acks=args.acks,
            compression=args.compression,
            linger_ms=args.linger_ms,
            delivery_timeout_ms=args.delivery_timeout_ms,
            retries=args.retries,
            default_api_timeout_ms=args.api_timeout_ms,
        )
    except ValueError as exc:  # e.g. --delivery-timeout-ms below --linger-ms + 30 s
        raise UsageError(str(exc)) from None
    async with producer:
        async for lines, consumed in read_lines(stream):
            for line in lines:
                try:
                    key, value = split_key(line, separator, stats.sent + 1)
                except InvalidRequest as exc:  # the lines before it still go (flush below)
                    stats.first_error = exc
                    break
                stats.sent += 1
                future = await producer.send(args.topic, value, key=key, partition=args.partition)
                future.add_done_callback(stats.on_done)
            if bar is not None:
                bar.update(consumed, stats.sent)
            if stats.first_error is not None:
                break
        await producer.flush()
    if bar is not None:
        bar.finish(consumed, stats.sent)
    return stats


def split_key(line: bytes, separator: bytes | None, line_number: int) -> tuple[bytes | None, bytes]:
    """(key, value) of one input line: no key without a separator."""
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator)
    if not sep:
        before = line_number - 1
        raise InvalidRequest(
            f"line {line_number} has no key separator "
            f"{separator.decode('utf-8', 'backslashreplace')!r} (--key-separator): produce "
            f"stopped there; the {plural(before, 'line')} before it {'was' if before == 1 else 'were'} "
            f"sent, nothing from line {line_number} on",
            field=f"line {line_number}",
        )
    return key, value


async def read_lines(stream: IO[bytes]) -> AsyncIterator[tuple[list[bytes], int]]:
    """Lines of `stream` without their ending (\\n or \\r\\n), a chunk's worth at a time,
    with the bytes consumed so far. A reader thread does the blocking reads, so records
    keep flowing (linger, acknowledgements) while stdin waits for a human."""
    pending = b""
    consumed = 0
    async for chunk in _read_chunks(stream):
        consumed += len(chunk)
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        if len(pending) > _LINE_BYTES_MAX:
            raise InvalidRequest(
                f"a line is longer than {_LINE_BYTES_MAX} bytes",
                field="line",
                limit=_LINE_BYTES_MAX,
            )
        yield [line.removesuffix(b"\r") for line in lines], consumed
    if pending:
        yield [pending.removesuffix(b"\r")], consumed


async def _read_chunks(stream: IO[bytes]) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | BaseException] = asyncio.Queue(_READ_AHEAD_CHUNKS)
    stop = threading.Event()
    read: Callable[[int], bytes] = getattr(stream, "read1", stream.read)

    def pump() -> None:
        item: bytes | BaseException = b""
        while not stop.is_set():
            try:
                item = read(_READ_CHUNK_BYTES)
            except BaseException as exc:  # handed to the loop, raised there
                item = exc
            try:
                asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()
            except RuntimeError:  # the loop is gone
                return
            if not isinstance(item, bytes) or not item:
                return

    threading.Thread(target=pump, name="dmq-produce-reader", daemon=True).start()
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if not item:
                return
            yield item
    finally:
        stop.set()
        while not queue.empty():  # unblock a pending put so the thread sees `stop`
            queue.get_nowait()


@dataclass(slots=True)
class ProgressBar:
    """A one-line text progress bar, redrawn at most every interval_s."""

    total_bytes: int
    out: TextIO
    width: int = 30
    interval_s: float = 0.2
    clock: Callable[[], float] = time.monotonic
    _last_draw_s: float = field(default=float("-inf"))

    def render(self, done_bytes: int, records: int) -> str:
        fraction = min(1.0, done_bytes / self.total_bytes) if self.total_bytes else 1.0
        filled = int(fraction * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        mib = 1024 * 1024
        return (
            f"[{bar}] {fraction * 100:5.1f}% {done_bytes / mib:.1f}/"
            f"{self.total_bytes / mib:.1f} MiB {records:,} records"
        )

    def update(self, done_bytes: int, records: int) -> None:
        now = self.clock()
        if now - self._last_draw_s >= self.interval_s:
            self._last_draw_s = now
            self.out.write("\r" + self.render(done_bytes, records))
            self.out.flush()

    def finish(self, done_bytes: int, records: int) -> None:
        self.out.write("\r" + self.render(done_bytes, records) + "\n")
        self.out.flush()

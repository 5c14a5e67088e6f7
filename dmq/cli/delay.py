"""Delayed records (dmq/broker/delay.py): `dmq produce TOPIC --delay 30s` schedules lines,
`dmq delay list TOPIC` shows what waits per partition, `dmq delay cancel TOPIC ID` cancels
one record by the schedule id produce printed.

Delayed records go through the JSON produce route with `?delay_ms=` (the binary path the
plain `dmq produce` uses carries no schedule): lines are sent in requests of at most
`DELAYED_LINES_PER_REQUEST`, values base64-encoded, and each record's schedule id and
deliver_at are printed on stdout (one JSON object a line) so that it can be cancelled
with `dmq delay cancel TOPIC ID`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import IO, Any

from dmq.cli._common import Subparsers, add_output, plural, print_json, print_table
from dmq.client._scheduled import cancel_scheduled, scheduled_records
from dmq.errors import DmqError, InvalidRequest, error_for_code

DELAYED_LINES_PER_REQUEST = 1_000


def add_delay(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    delay = commands.add_parser(
        "delay", help="delayed records (dmq produce --delay): list what waits, cancel one"
    )
    actions = delay.add_subparsers(dest="delay_command", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list", parents=[url], help="per partition: records waiting for their time, the next due"
    )
    listing.add_argument("topic", help="the topic the records were produced to")
    add_output(listing)
    listing.set_defaults(handler=_cmd_delay_list)
    cancel = actions.add_parser(
        "cancel", parents=[url], help="cancel one delayed record before it is delivered"
    )
    cancel.add_argument("topic", help="the topic the record was produced to")
    cancel.add_argument(
        "id", help="its schedule id, as `dmq produce --delay` printed it (e.g. 0-1700000030000-1)"
    )
    cancel.set_defaults(handler=_cmd_delay_cancel)


def _cmd_delay_list(args: argparse.Namespace) -> int:
    doc = asyncio.run(
        scheduled_records(args.url, args.topic, default_api_timeout_ms=args.api_timeout_ms)
    )
    if args.output == "json":
        print_json(doc)
        return 0
    rows = [("PARTITION", "SCHEDULED", "NEXT-DELIVER-AT")]
    rows += [
        (str(p["partition"]), str(p["count"]), _when(p["next_deliver_at"]))
        for p in doc["partitions"]
    ]
    print_table(rows)
    print(f"{plural(doc['count'], 'record')} scheduled in {doc['topic']}", file=sys.stderr)
    return 0


def _when(ms: int | None) -> str:
    """A due time as UTC ISO 8601 with milliseconds; "-" when nothing waits."""
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _cmd_delay_cancel(args: argparse.Namespace) -> int:
    asyncio.run(
        cancel_scheduled(args.url, args.topic, args.id, default_api_timeout_ms=args.api_timeout_ms)
    )
    print(f"cancelled {args.id} in {args.topic}", file=sys.stderr)
    return 0


def produce_delayed(args: argparse.Namespace, stream: IO[bytes], out: IO[str]) -> int:
    """Send every line of `stream` delayed by args.delay; the count of records scheduled."""
    url = args.url.split(",")[0].rstrip("/")
    query = {"delay_ms": str(args.delay), "acks": "all"}
    if args.partition is not None:
        query["partition"] = str(args.partition)
    path = (
        f"{url}/v1/topics/{urllib.parse.quote(args.topic)}/records?{urllib.parse.urlencode(query)}"
    )
    sent = 0
    lines: list[bytes] = []
    for raw in stream:
        lines.append(raw.rstrip(b"\n").rstrip(b"\r"))
        if len(lines) == DELAYED_LINES_PER_REQUEST:
            sent += _send(path, lines, args.key_separator, out, sent)
            lines = []
    if lines:
        sent += _send(path, lines, args.key_separator, out, sent)
    return sent


def _send(path: str, lines: list[bytes], separator: bytes | None, out: IO[str], sent: int) -> int:
    """Schedule `lines` in one request (all or none); `sent` lines went before them."""
    records = []
    for number, line in enumerate(lines, start=sent + 1):
        key, value = None, line
        if separator is not None:
            k, sep, v = line.partition(separator)
            if not sep:
                shown = separator.decode("utf-8", "backslashreplace")
                raise InvalidRequest(
                    f"line {number} has no key separator {shown!r} (--key-separator): "
                    f"produce stopped; the {plural(sent, 'line')} before line {sent + 1} "
                    f"{'was' if sent == 1 else 'were'} scheduled, nothing from line "
                    f"{sent + 1} on",
                    field=f"line {number}",
                )
            key, value = k, v
        record: dict[str, Any] = {"value": base64.b64encode(value).decode()}
        if key is not None:
            record["key"] = base64.b64encode(key).decode()
        records.append(record)
    body = json.dumps({"records": records, "value_encoding": "base64"}).encode()
    request = urllib.request.Request(  # noqa: S310 - the broker URL the user gave
        path, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:  # noqa: S310
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise _error(exc) from None
    for answer in doc["offsets"]:
        print(json.dumps(answer, separators=(",", ":")), file=out)
    return len(records)


def _error(exc: urllib.error.HTTPError) -> DmqError:
    try:
        error = json.loads(exc.read())["error"]
        return error_for_code(str(error["code"]), str(error["message"]), error.get("details"))
    except (ValueError, KeyError, TypeError):
        return DmqError(f"HTTP {exc.code}")


def run(args: argparse.Namespace, stream: IO[bytes]) -> int:
    sent = produce_delayed(args, stream, sys.stdout)
    print(f"scheduled {plural(sent, 'record')} to {args.topic} in {args.delay} ms", file=sys.stderr)
    return 0

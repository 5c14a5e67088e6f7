"""`dmq produce TOPIC --delay 30s`: lines as delayed records (dmq/broker/delay.py).

Delayed records go through the JSON produce route with `?delay_ms=` (the binary path the
plain `dmq produce` uses carries no schedule): lines are sent in requests of at most
`DELAYED_LINES_PER_REQUEST`, values base64-encoded, and each record's schedule id and
deliver_at are printed on stdout (one JSON object a line) so that it can be cancelled
with `curl -X DELETE .../scheduled/<id>`.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import IO, Any

from dmq.errors import DmqError, InvalidRequest, error_for_code

DELAYED_LINES_PER_REQUEST = 1_000
_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)?")


def duration_ms(text: str) -> int:
    """`30s`, `500ms`, `2m`, `1h`, `7d`, or a number of milliseconds."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 500ms, 2m, 1h")
    return int(m.group(1)) * _UNITS_MS[m.group(2) or "ms"]


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
            sent += _send(path, lines, args.key_separator, out)
            lines = []
    if lines:
        sent += _send(path, lines, args.key_separator, out)
    return sent


def _send(path: str, lines: list[bytes], separator: bytes | None, out: IO[str]) -> int:
    records = []
    for line in lines:
        key, value = None, line
        if separator is not None:
            k, sep, v = line.partition(separator)
            if not sep:
                raise InvalidRequest(f"a line has no key separator {separator!r}", field="line")
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
    print(f"scheduled {sent} records to {args.topic} in {args.delay} ms", file=sys.stderr)
    return 0

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
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import IO, Any

from dmq.cli._common import plural
from dmq.errors import DmqError, InvalidRequest, error_for_code

DELAYED_LINES_PER_REQUEST = 1_000


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

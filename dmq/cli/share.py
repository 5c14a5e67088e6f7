"""`dmq share consume|configure|describe|list`: share groups (queues) from a shell (registered by
dmq/cli/__init__.py).

`dmq share consume GROUP TOPIC` joins the share group, prints each record it receives
(one per line, or JSON) and then acknowledges it (`--ack accept` by default, so a record
is acknowledged only once printed: at-least-once; `--ack release` only looks). Without
--follow it stops after two empty polls; it leaves the group on exit, releasing what it
still holds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from dmq.cli._common import (
    Subparsers,
    _positive_int,
    add_output,
    plural,
    print_fields,
    print_json,
    print_table,
)
from dmq.cli.consume import record_json
from dmq.client import (
    AsyncShareConsumer,
    ShareRecord,
    configure_share_group,
    describe_share_group,
)

_POLL_TIMEOUT_MS = 1_000
_IDLE_POLLS_TO_STOP = 2


def add_share(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    share = commands.add_parser("share", help="consume from and describe share groups (queues)")
    actions = share.add_subparsers(dest="share_command", metavar="ACTION", required=True)
    consume = actions.add_parser(
        "consume", parents=[url], help="receive, print and acknowledge records of a share group"
    )
    consume.add_argument("group")
    consume.add_argument("topic", nargs="+")
    consume.add_argument("--ack", choices=("accept", "release", "reject"), default="accept",
                         help="how each printed record is acknowledged (accept)")  # fmt: skip
    consume.add_argument("--max-records", type=_positive_int, help="stop after this many")
    consume.add_argument("--follow", action="store_true", help="wait for records forever")
    consume.add_argument("--output", choices=("lines", "json"), default="lines",
                         help="lines: the value (raw bytes); json: one object per record")  # fmt: skip
    consume.set_defaults(handler=cmd_share_consume)
    configure = actions.add_parser(
        "configure", parents=[url], help="create a share group or change its settings"
    )
    configure.add_argument("group")
    configure.add_argument(
        "--lock-duration-ms",
        type=_positive_int,
        help="how long a polled record stays locked to its member (30000)",
    )
    configure.add_argument(
        "--max-delivery-attempts",
        type=_positive_int,
        help="deliveries of a record before it is dead-lettered (5)",
    )
    configure.add_argument(
        "--dead-letter-topic", help="where rejected and exhausted records go (<group>.dlq)"
    )
    configure.add_argument(
        "--max-in-flight-records",
        type=_positive_int,
        help="records locked or awaiting acks at once per partition (2000)",
    )
    configure.add_argument("--session-timeout-ms", type=_positive_int,
                           help="a member silent this long leaves; its locks are released "
                           "(45000)")  # fmt: skip
    add_output(configure)
    configure.set_defaults(handler=cmd_share_configure)
    describe = actions.add_parser("describe", parents=[url], help="members and partitions")
    describe.add_argument("group")
    add_output(describe)
    describe.set_defaults(handler=cmd_share_describe)
    listing = actions.add_parser("list", parents=[url], help="share groups and their config")
    add_output(listing)
    listing.set_defaults(handler=cmd_share_list)


def _line(r: ShareRecord, output: str) -> str:
    if output == "json":  # `dmq consume`'s shape, and how many times it was delivered
        obj = record_json(r.topic, r.partition, r.offset, r.timestamp_ms, r.key, r.value,
                          r.headers)  # fmt: skip
        return json.dumps(obj | {"delivery_count": r.delivery_count}, ensure_ascii=False)
    return (r.value or b"").decode("utf-8", errors="replace")


def cmd_share_consume(args: argparse.Namespace) -> int:
    async def go() -> None:
        printed, idle = 0, 0
        async with AsyncShareConsumer(
            args.url, args.group, args.topic, default_api_timeout_ms=args.api_timeout_ms
        ) as consumer:
            while args.follow or idle < _IDLE_POLLS_TO_STOP:
                left = None if args.max_records is None else args.max_records - printed
                if left is not None and left <= 0:
                    break
                records = await consumer.poll(_POLL_TIMEOUT_MS, max_records=left)
                idle = 0 if records else idle + 1
                for r in records:
                    print(_line(r, args.output), flush=True)
                    getattr(consumer, args.ack)(r)
                    printed += 1

    asyncio.run(go())
    return 0


def cmd_share_configure(args: argparse.Namespace) -> int:
    names = ("lock_duration_ms", "max_delivery_attempts", "dead_letter_topic",
             "max_in_flight_records", "session_timeout_ms")  # fmt: skip
    settings = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    timeout_ms = args.api_timeout_ms
    doc = asyncio.run(
        configure_share_group(args.url, args.group, default_api_timeout_ms=timeout_ms, **settings)
    )
    if args.output == "json":
        print_json(doc)
    else:
        print_fields(doc)
    return 0


def cmd_share_describe(args: argparse.Namespace) -> int:
    doc = asyncio.run(
        describe_share_group(args.url, args.group, default_api_timeout_ms=args.api_timeout_ms)
    )
    if args.output == "json":
        print(json.dumps(doc, indent=2))
        return 0
    print(f"share group {doc['group']}: {plural(doc['member_count'], 'member')}, lock "
          f"{doc['lock_duration_ms']} ms, {doc['max_delivery_attempts']} attempts, "
          f"dead letters to {doc['dead_letter_topic']}")  # fmt: skip
    keys = ("topic", "partition", "start_offset", "end_offset", "in_flight", "acquired",
            "available", "accepted", "archived", "dead_lettered")  # fmt: skip
    rows: list[Any] = [tuple(k.upper().replace("_", "-") for k in keys)]
    rows += [tuple(str(p[k]) for k in keys) for p in doc["partitions"]]
    print_table(rows)
    return 0


def cmd_share_list(args: argparse.Namespace) -> int:
    doc = asyncio.run(describe_share_group(args.url, default_api_timeout_ms=args.api_timeout_ms))
    if args.output == "json":
        print(json.dumps(doc, indent=2))
        return 0
    rows: list[Any] = [("GROUP", "MEMBERS", "LOCK-MS", "ATTEMPTS", "DEAD-LETTER-TOPIC")]
    rows += [(g["group"], str(g["member_count"]), str(g["lock_duration_ms"]),
              str(g["max_delivery_attempts"]), g["dead_letter_topic"])
             for g in doc["share_groups"]]  # fmt: skip
    print_table(rows, sys.stdout)
    return 0

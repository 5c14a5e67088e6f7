"""`dmq group list|describe|reset` and `dmq consume --group` (wired in dmq/cli/__init__.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable, Sequence
from typing import IO, Any

from dmq.client import AsyncAdmin, AsyncGroupConsumer

POLL_TIMEOUT_MS = 1_000
IDLE_POLLS_TO_STOP = 2  # without --follow: stop after this many empty polls in a row


def add_group(
    commands: Any, url: argparse.ArgumentParser, parse_time: Callable[[str], int]
) -> None:
    group = commands.add_parser("group", help="list, describe, reset, delete consumer groups")
    actions = group.add_subparsers(dest="group_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", parents=[url], help="consumer groups and their state")
    listing.add_argument("--json", action="store_true", help="print the answer as JSON")
    listing.set_defaults(handler=cmd_group_list)
    describe = actions.add_parser(
        "describe", parents=[url], help="members; per partition committed offset and lag"
    )
    describe.add_argument("name")
    describe.add_argument("--json", action="store_true", help="print the answer as JSON")
    describe.set_defaults(handler=cmd_group_describe)
    reset = actions.add_parser(
        "reset", parents=[url], help="set an empty group's offsets",
        description="Set the committed offsets of a group that has no members.",
    )  # fmt: skip
    reset.add_argument("name")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to", choices=("earliest", "latest"), help="every partition of --topic")
    to.add_argument("--to-time", type=parse_time, metavar="TIME",
                    help="the first offset at or after TIME (ms or ISO 8601)")  # fmt: skip
    to.add_argument("--offsets", metavar="TOPIC:PARTITION:OFFSET,...", help="exact offsets")
    reset.add_argument("--topic", action="append", default=[], help="a topic (repeatable)")
    reset.set_defaults(handler=cmd_group_reset)
    delete = actions.add_parser(
        "delete", parents=[url], help="delete an empty group and its committed offsets"
    )
    delete.add_argument("name")
    delete.set_defaults(handler=cmd_group_delete)


def _table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _run(call: Callable[[AsyncAdmin], Any], url: str) -> Any:
    async def go() -> Any:
        async with AsyncAdmin(url) as admin:
            return await call(admin)

    return asyncio.run(go())


def cmd_group_list(args: argparse.Namespace) -> int:
    groups = _run(lambda a: a.list_groups(), args.url)
    if args.json:
        print(json.dumps({"groups": groups}, indent=2))
        return 0
    rows = [("GROUP", "STATE", "GENERATION", "MEMBERS", "ASSIGNOR")]
    rows += [(g["group"], g["state"], str(g["generation"]), str(g["member_count"]), g["assignor"])
             for g in groups]  # fmt: skip
    _table(rows)
    return 0


def cmd_group_describe(args: argparse.Namespace) -> int:
    doc = _run(lambda a: a.describe_group(args.name), args.url)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"group {doc['group']}: {doc['state']}, generation {doc['generation']}, "
          f"assignor {doc['assignor']}, {doc['member_count']} member(s)")  # fmt: skip

    def dash(value: Any) -> str:
        return "-" if value is None else str(value)

    rows = [("TOPIC", "PARTITION", "MEMBER", "COMMITTED", "HIGH-WATERMARK", "LAG")]
    rows += [(p["topic"], str(p["partition"]), dash(p["member_id"]), dash(p["committed_offset"]),
              dash(p["high_watermark"]), dash(p["lag"])) for p in doc["partitions"]]  # fmt: skip
    _table(rows)
    return 0


def cmd_group_reset(args: argparse.Namespace) -> int:
    to: Any
    if args.offsets:
        to = []
        for item in args.offsets.split(","):
            topic, partition, offset = item.rsplit(":", 2)
            to.append((topic, int(partition), int(offset)))
    else:
        to = args.to if args.to is not None else args.to_time
        if not args.topic:
            raise SystemExit("dmq: error: --to and --to-time need --topic")
    done = _run(lambda a: a.reset_group_offsets(args.name, to, args.topic), args.url)
    _table([("TOPIC", "PARTITION", "OFFSET"), *[(t, str(p), str(o)) for t, p, o in done]])
    return 0


def cmd_group_delete(args: argparse.Namespace) -> int:
    _run(lambda a: a.delete_group(args.name), args.url)
    return 0


async def consume_group(
    args: argparse.Namespace, out: IO[bytes], format_record: Callable[..., bytes]
) -> int:
    """`dmq consume TOPIC --group G`: a member of G (auto-commit, at-least-once); without
    --follow it stops once its partitions have nothing more (two empty polls)."""
    written = idle = 0
    async with AsyncGroupConsumer(args.url, args.group, topics=[args.topic]) as consumer:
        while args.max_records is None or written < args.max_records:
            limit = 500 if args.max_records is None else min(500, args.max_records - written)
            records = await consumer.poll(timeout_ms=POLL_TIMEOUT_MS, max_records=limit)
            for record in records:
                out.write(format_record(record, args.output, args.key_separator))
            out.flush()
            written += len(records)
            idle = 0 if records or not consumer.assignment() else idle + 1
            if not args.follow and idle >= IDLE_POLLS_TO_STOP:
                break
        await consumer.commit()
    return written

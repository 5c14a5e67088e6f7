"""`dmq group list|describe|reset|delete` (registered by dmq/cli/__init__.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from typing import Any

from dmq.cli._common import (
    Subparsers,
    add_output,
    admin_for,
    parse_time_ms,
    plural,
    print_json,
    print_table,
)
from dmq.client import AsyncAdmin


def add_group(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    group = commands.add_parser("group", help="list, describe, reset, delete consumer groups")
    actions = group.add_subparsers(dest="group_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", parents=[url], help="consumer groups and their state")
    add_output(listing)
    listing.set_defaults(handler=cmd_group_list)
    describe = actions.add_parser(
        "describe", parents=[url], help="members; per partition committed offset and lag"
    )
    describe.add_argument("name")
    add_output(describe)
    describe.set_defaults(handler=cmd_group_describe)
    reset = actions.add_parser(
        "reset", parents=[url], help="set an empty group's offsets",
        description="Set the committed offsets of a group that has no members.",
    )  # fmt: skip
    reset.add_argument("name")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to", choices=("earliest", "latest"), help="every partition of --topic")
    to.add_argument("--to-time", type=parse_time_ms, metavar="TIME",
                    help="the first offset at or after TIME (ms or ISO 8601)")  # fmt: skip
    to.add_argument("--offsets", metavar="TOPIC:PARTITION:OFFSET,...", help="exact offsets")
    reset.add_argument("--topic", action="append", default=[], help="a topic (repeatable)")
    add_output(reset)
    reset.set_defaults(handler=cmd_group_reset)
    delete = actions.add_parser(
        "delete", parents=[url], help="delete an empty group and its committed offsets"
    )
    delete.add_argument("name")
    delete.set_defaults(handler=cmd_group_delete)


def _run(call: Callable[[AsyncAdmin], Any], args: argparse.Namespace) -> Any:
    async def go() -> Any:
        async with admin_for(args) as admin:
            return await call(admin)

    return asyncio.run(go())


def cmd_group_list(args: argparse.Namespace) -> int:
    groups = _run(lambda a: a.list_groups(), args)
    if args.output == "json":
        print(json.dumps({"groups": groups}, indent=2))
        return 0
    rows = [("GROUP", "STATE", "GENERATION", "MEMBERS", "ASSIGNOR")]
    rows += [(g["group"], g["state"], str(g["generation"]), str(g["member_count"]), g["assignor"])
             for g in groups]  # fmt: skip
    print_table(rows)
    return 0


def cmd_group_describe(args: argparse.Namespace) -> int:
    doc = _run(lambda a: a.describe_group(args.name), args)
    if args.output == "json":
        print(json.dumps(doc, indent=2))
        return 0
    print(f"group {doc['group']}: {doc['state']}, generation {doc['generation']}, "
          f"assignor {doc['assignor']}, {plural(doc['member_count'], 'member')}")  # fmt: skip

    def dash(value: Any) -> str:
        return "-" if value is None else str(value)

    rows = [("TOPIC", "PARTITION", "MEMBER", "COMMITTED", "HIGH-WATERMARK", "LAG")]
    rows += [(p["topic"], str(p["partition"]), dash(p["member_id"]), dash(p["committed_offset"]),
              dash(p["high_watermark"]), dash(p["lag"])) for p in doc["partitions"]]  # fmt: skip
    print_table(rows)
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
    done = _run(lambda a: a.reset_group_offsets(args.name, to, args.topic), args)
    if args.output == "json":
        offsets = [{"topic": t, "partition": p, "offset": o} for t, p, o in done]
        print_json({"group": args.name, "offsets": offsets})
        return 0
    print_table([("TOPIC", "PARTITION", "OFFSET"), *[(t, str(p), str(o)) for t, p, o in done]])
    return 0


def cmd_group_delete(args: argparse.Namespace) -> int:
    _run(lambda a: a.delete_group(args.name), args)
    return 0

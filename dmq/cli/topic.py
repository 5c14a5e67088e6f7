"""`dmq topic create|list|describe|alter|delete` (registered by dmq/cli/__init__.py)."""

from __future__ import annotations

import argparse
import asyncio

from dmq.cli._common import (
    Subparsers,
    UsageError,
    _config_item,
    _positive_int,
    add_output,
    admin_for,
    as_dict,
    plural,
    print_json,
    print_table,
)
from dmq.client import TopicDescription, TopicSummary


def add_topic(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    topic = commands.add_parser("topic", help="create, list, describe, alter, delete topics")
    actions = topic.add_subparsers(dest="topic_command", metavar="ACTION", required=True)
    config_help = (
        "a topic setting, e.g. retention_ms=86400000 or Kafka's retention.ms=86400000 (repeatable)"
    )

    create = actions.add_parser("create", parents=[url], help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=_positive_int, help="default: the broker's")
    create.add_argument("--replication-factor", type=_positive_int, help="default: the broker's")
    create.add_argument(
        "--config",
        type=_config_item,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=config_help,
    )
    add_output(create)
    create.set_defaults(handler=_cmd_topic_create)

    listing = actions.add_parser("list", parents=[url], help="list topics")
    add_output(listing)
    listing.set_defaults(handler=_cmd_topic_list)

    describe = actions.add_parser("describe", parents=[url], help="config and partitions")
    describe.add_argument("name")
    add_output(describe)
    describe.set_defaults(handler=_cmd_topic_describe)

    alter = actions.add_parser("alter", parents=[url], help="change config or add partitions")
    alter.add_argument("name")
    alter.add_argument(
        "--config",
        type=_config_item,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=config_help,
    )
    alter.add_argument("--partitions", type=_positive_int, help="the new total partition count")
    add_output(alter)
    alter.set_defaults(handler=_cmd_topic_alter)

    delete = actions.add_parser("delete", parents=[url], help="delete a topic and its data")
    delete.add_argument("name")
    delete.set_defaults(handler=_cmd_topic_delete)


def _cmd_topic_create(args: argparse.Namespace) -> int:
    async def create() -> TopicDescription:
        async with admin_for(args) as admin:
            return await admin.create_topic(
                args.name, args.partitions, args.replication_factor, dict(args.config) or None
            )

    description = asyncio.run(create())
    if args.output == "json":
        print_json(as_dict(description))
        return 0
    print(
        f"created topic {description.name} ({plural(description.partition_count, 'partition')}, "
        f"replication factor {description.replication_factor})"
    )
    return 0


def _cmd_topic_list(args: argparse.Namespace) -> int:
    async def listing() -> list[TopicSummary]:
        async with admin_for(args) as admin:
            return await admin.list_topics()

    topics = asyncio.run(listing())
    if args.output == "json":
        print_json({"topics": [as_dict(t) for t in topics]})
        return 0
    rows = [("TOPIC", "PARTITIONS", "REPLICATION")]
    rows += [(t.name, str(t.partitions), str(t.replication_factor)) for t in topics]
    print_table(rows)
    return 0


def _cmd_topic_describe(args: argparse.Namespace) -> int:
    async def describe() -> TopicDescription:
        async with admin_for(args) as admin:
            return await admin.describe_topic(args.name)

    description = asyncio.run(describe())
    if args.output == "json":
        print_json(as_dict(description))
    else:
        _print_description(description)
    return 0


def _cmd_topic_alter(args: argparse.Namespace) -> int:
    if not args.config and args.partitions is None:
        raise UsageError("topic alter needs --config KEY=VALUE or --partitions N")

    async def alter() -> TopicDescription:
        async with admin_for(args) as admin:
            description = None
            if args.config:
                description = await admin.alter_config(args.name, dict(args.config))
            if args.partitions is not None:
                description = await admin.add_partitions(args.name, args.partitions)
            return description or await admin.describe_topic(args.name)

    description = asyncio.run(alter())
    if args.output == "json":
        print_json(as_dict(description))
    else:
        _print_description(description)
    return 0


def _cmd_topic_delete(args: argparse.Namespace) -> int:
    async def delete() -> None:
        async with admin_for(args) as admin:
            await admin.delete_topic(args.name)

    asyncio.run(delete())
    print(f"deleted topic {args.name}")
    return 0


def _config_text(value: object) -> str:
    """A config value as it is typed on the command line (`true`, not Python's `True`)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _print_description(description: TopicDescription) -> None:
    print(
        f"topic {description.name}: {plural(description.partition_count, 'partition')}, "
        f"replication factor {description.replication_factor}"
    )
    for key in sorted(description.config):
        print(f"  {key} = {_config_text(description.config[key])}")
    # A JSON boolean since 0.2.0; a 0.1.0 broker still answers the string "true".
    tiered = description.config.get("remote_storage_enable") in (True, "true")
    head = ("PARTITION", "LEADER", "REPLICAS", "LOG-START", "HIGH-WATERMARK", "LOG-END")
    rows = [head + (("REMOTE-END", "LOCAL-BYTES", "REMOTE-BYTES") if tiered else ())]
    rows += [
        (
            str(p.partition),
            p.leader or "-",
            ",".join(p.replicas),
            "-" if p.log_start_offset is None else str(p.log_start_offset),
            "-" if p.high_watermark is None else str(p.high_watermark),
            "-" if p.log_end_offset is None else str(p.log_end_offset),
        )
        + (
            tuple(
                "-" if v is None else str(v)
                for v in (p.remote_end_offset, p.local_bytes, p.remote_bytes)
            )
            if tiered
            else ()
        )
        for p in description.partitions
    ]
    print_table(rows)

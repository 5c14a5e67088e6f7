"""`dmq cluster status|operations|reassign|...` (registered by dmq/cli/__init__.py).

- `dmq cluster status [--output table|json]`: brokers; per Raft group its leader, term, commit index and
  each replica's lag; then the running operations;
- `dmq cluster operations [--watch]`: running reassignments with a progress bar each, and
  decommissions with the replicas they still hold;
- `dmq cluster reassign TOPIC PARTITION BROKER,BROKER,... [--wait]`;
- `dmq cluster decommission-broker ID [--wait]`;
- `dmq cluster metadata-voters ID,ID,... [--wait]`: change the metadata group's voters
  (one broker at a time, added ones first);
- `dmq cluster decommission-partition TOPIC PARTITION`;
- `dmq cluster features [--output table|json]`: each broker's release and supported feature levels, and
  the cluster's finalized level;
- `dmq cluster upgrade --finalize [--level N]`: raise the finalized level (default: the
  highest this release supports); refused naming the brokers that do not support it.

`dmq serve --join` is in dmq/cli/serve.py.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any, TextIO

from dmq.cli._common import Subparsers, add_output, admin_for, comma_items, print_json, print_table
from dmq.client import AsyncAdmin

BAR_WIDTH = 30
WATCH_INTERVAL_S = 1.0


def add_cluster(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    cluster = commands.add_parser("cluster", help="the cluster's brokers and Raft groups")
    actions = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    status = actions.add_parser(
        "status",
        parents=[url],
        help="brokers; per group its leader, term, commit index, lag",
        description="The brokers, then every Raft group: its leader, term, commit index and "
        "REPLICAS as node:applied:lag (the index each replica applied, and how far it is "
        "behind the commit index), then the running operations.",
    )
    add_output(status)
    status.set_defaults(handler=_cmd_cluster_status)
    _add_operations(actions, url)
    _add_features(actions, url)


def _add_features(actions: Subparsers, url: argparse.ArgumentParser) -> None:
    features = actions.add_parser(
        "features", parents=[url], help="supported and finalized feature levels"
    )
    add_output(features)
    features.set_defaults(handler=cmd_features)
    upgrade = actions.add_parser(
        "upgrade", parents=[url], help="finish a rolling upgrade (README: Releases and upgrading)"
    )
    upgrade.add_argument(
        "--finalize",
        action="store_true",
        required=True,
        help="raise the finalized feature level: no rollback to an older release after it",
    )
    upgrade.add_argument(
        "--level",
        type=int,
        default=None,
        help="the level (default: the highest this release supports)",
    )
    upgrade.set_defaults(handler=cmd_upgrade)


def _add_operations(actions: Subparsers, url: argparse.ArgumentParser) -> None:
    ops = actions.add_parser(
        "operations", parents=[url], help="running reassignments and decommissions"
    )
    add_output(ops)
    ops.add_argument("--watch", action="store_true", help="redraw until none is running")
    ops.set_defaults(handler=cmd_operations)
    reassign = actions.add_parser(
        "reassign", parents=[url], help="move a partition's replicas to other brokers"
    )
    reassign.add_argument("topic")
    reassign.add_argument("partition", type=int)
    reassign.add_argument("replicas", help="broker ids, comma-separated, preferred leader first")
    reassign.add_argument("--wait", action="store_true", help="show progress until done")
    reassign.set_defaults(handler=cmd_reassign)
    decommission = actions.add_parser(
        "decommission-broker",
        parents=[url],
        help="move a broker's replicas away, then remove it from the cluster",
    )
    decommission.add_argument("broker_id")
    decommission.add_argument("--wait", action="store_true", help="show progress until done")
    decommission.set_defaults(handler=cmd_decommission)
    voters = actions.add_parser(
        "metadata-voters",
        parents=[url],
        help="change the metadata group's voters (one broker at a time)",
    )
    voters.add_argument("voters", help="the voter set wanted: broker ids, comma-separated")
    voters.add_argument("--wait", action="store_true", help="show progress until done")
    voters.set_defaults(handler=cmd_metadata_voters)
    retire = actions.add_parser(
        "decommission-partition",
        parents=[url],
        help="stop a partition taking records; it goes once retention empties it",
    )
    retire.add_argument("topic")
    retire.add_argument("partition", type=int)
    retire.set_defaults(handler=cmd_decommission_partition)


def _cmd_cluster_status(args: argparse.Namespace) -> int:
    async def status() -> dict[str, Any]:
        async with admin_for(args) as admin:
            return await admin.cluster_status()

    doc = asyncio.run(status())
    if args.output == "json":
        print_json(doc)
        return 0
    print(f"cluster {doc['cluster_id']}, metadata voters {','.join(doc['metadata_voters'])}")
    rows: list[tuple[str, ...]] = [
        ("BROKER", "VERSION", "HTTP", "RAFT", "LIVE", "REACHABLE", "STORAGE", "FREE")
    ]
    rows += [
        (
            b["node_id"],
            b.get("version") or "?",
            b["http_addr"],
            b["raft_addr"],
            "yes" if b["live"] else "no",
            "yes" if b.get("reachable") else "no",
            *storage_columns(b),
        )
        for b in doc["brokers"]
    ]
    print_table(rows)
    print()
    rows = [("GROUP", "PARTITION", "LEADER", "TERM", "COMMIT", "REPLICAS")]
    for g in doc["groups"]:
        where = "metadata" if g["topic"] is None else f"{g['topic']}-{g['partition']}"
        replicas = " ".join(
            f"{r['node_id']}:{r['last_applied']}:{'-' if r['lag'] is None else r['lag']}"
            for r in g["replicas"]
        )
        rows.append(
            (
                str(g["group_id"]),
                where,
                g["leader"] or "-",
                str(g["term"]),
                str(g["commit_index"]),
                replicas,
            )
        )
    print_table(rows)
    print()  # every running operation (or "no operation running"), as `cluster operations`
    render_operations(asyncio.run(operations_of(args.url, args.api_timeout_ms)), sys.stdout)
    return 0


def storage_columns(broker: dict[str, Any]) -> tuple[str, str]:
    """Storage level and free space: the broker's own answer, else its last heartbeat."""
    own = broker.get("storage_status") or {}
    level = own.get("level") or broker.get("storage") or "-"
    free = own.get("free_bytes", broker.get("free_bytes", -1))
    if not isinstance(free, int) or free < 0:
        return level, "-"
    floor = own.get("floor_bytes")
    shown = f"{free / 2**20:.1f} MiB"
    return level, shown if floor is None else f"{shown} (floor {floor / 2**20:.1f} MiB)"


def progress_bar(fraction: float, width: int = BAR_WIDTH) -> str:
    filled = int(max(0.0, min(1.0, fraction)) * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {fraction * 100:5.1f}%"


def render_operations(doc: dict[str, Any], out: TextIO) -> int:
    """Print one line per operation; returns how many are still running."""
    running = 0
    for op in doc["reassignments"]:
        running += 1
        where = f"{op['topic']}-{op['partition']}"
        moves = f"{','.join(op['replicas'])} -> {','.join(op['target'] or op['replicas'])}"
        out.write(f"{where:<24} {progress_bar(op['progress'])} {moves}  {op['step']}\n")
    for d in doc["decommissions"]:
        running += 1
        out.write(f"broker {d['broker_id']:<17} decommissioning, {d['replicas_left']} left\n")
    for d in doc.get("partition_decommissions", []):
        running += 1
        where = f"{d['topic']}-{d['partition']}"
        left = "?" if d["offsets_left"] is None else d["offsets_left"]
        out.write(f"{where:<24} decommissioned, {left} offsets until retention empties it\n")
    change = doc.get("metadata_voters")
    if change is not None and change.get("target"):
        running += 1
        moves = f"{','.join(change['voters'])} -> {','.join(change['target'])}"
        out.write(
            f"{'metadata voters':<24} {progress_bar(change['progress'])} {moves}  "
            f"{change['step']}\n"
        )
    if not running:
        out.write("no operation running\n")
    return running


async def operations_of(url: str, api_timeout_ms: int) -> dict[str, Any]:
    async with AsyncAdmin(url, default_api_timeout_ms=api_timeout_ms) as admin:
        return await admin.operations()


def _watch(url: str, out: TextIO, api_timeout_ms: int) -> None:
    while True:
        doc = asyncio.run(operations_of(url, api_timeout_ms))
        out.write(f"--- {time.strftime('%H:%M:%S')}\n")
        if not render_operations(doc, out):
            return
        out.flush()
        time.sleep(WATCH_INTERVAL_S)


def cmd_operations(args: argparse.Namespace) -> int:
    if args.watch:
        _watch(args.url, sys.stdout, args.api_timeout_ms)
        return 0
    doc = asyncio.run(operations_of(args.url, args.api_timeout_ms))
    if args.output == "json":
        print_json(doc)
    else:
        render_operations(doc, sys.stdout)
    return 0


def cmd_reassign(args: argparse.Namespace) -> int:
    replicas = comma_items(args.replicas)

    async def reassign() -> dict[str, Any]:
        async with admin_for(args) as admin:
            return await admin.reassign(args.topic, args.partition, replicas)

    doc = asyncio.run(reassign())
    print(f"reassigning {args.topic}-{args.partition}: {doc['replicas']} -> {doc['target']}")
    if args.wait:
        _watch(args.url, sys.stdout, args.api_timeout_ms)
    return 0


def cmd_decommission(args: argparse.Namespace) -> int:
    async def decommission() -> dict[str, Any]:
        async with admin_for(args) as admin:
            return await admin.decommission_broker(args.broker_id)

    asyncio.run(decommission())
    print(f"decommissioning {args.broker_id}: its replicas move to the other brokers")
    if args.wait:
        _watch(args.url, sys.stdout, args.api_timeout_ms)
    return 0


def cmd_metadata_voters(args: argparse.Namespace) -> int:
    voters = comma_items(args.voters)

    async def change() -> dict[str, Any]:
        async with admin_for(args) as admin:
            return await admin.change_metadata_voters(voters)

    doc = asyncio.run(change())
    target = doc.get("target") or doc.get("voters") or voters
    print(f"metadata voters: {','.join(doc.get('voters', []))} -> {','.join(target)}")
    if args.wait:
        _watch(args.url, sys.stdout, args.api_timeout_ms)
    return 0


def cmd_decommission_partition(args: argparse.Namespace) -> int:
    async def retire() -> dict[str, Any]:
        async with admin_for(args) as admin:
            return await admin.decommission_partition(args.topic, args.partition)

    asyncio.run(retire())
    print(
        f"{args.topic}-{args.partition} decommissioned: no new records; readable until "
        "retention empties it, then removed"
    )
    return 0


def cmd_features(args: argparse.Namespace) -> int:
    async def features() -> dict[str, Any]:
        async with admin_for(args) as admin:
            return await admin.features()

    doc = asyncio.run(features())
    if args.output == "json":
        print_json(doc)
        return 0
    print(f"finalized feature level {doc['finalized_level']}: {doc['finalized_meaning']}")
    finalizable = doc["finalizable_level"]
    print(f"finalizable now: {'-' if finalizable is None else finalizable}")
    rows: list[tuple[str, ...]] = [("BROKER", "VERSION", "MIN LEVEL", "MAX LEVEL")]
    rows += [
        (
            b["node_id"],
            b["version"] or "?",
            "?" if b["min_level"] is None else str(b["min_level"]),
            "?" if b["max_level"] is None else str(b["max_level"]),
        )
        for b in doc["brokers"]
    ]
    print_table(rows)
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    async def finalize() -> dict[str, Any]:
        async with admin_for(args) as admin:
            return await admin.finalize_features(args.level)

    doc = asyncio.run(finalize())
    print(
        f"finalized feature level {doc['finalized_level']}: brokers of a release that does "
        f"not support it can no longer join"
    )
    return 0

"""`dmq cluster ...` operations commands and `dmq serve --join` (dmq/cli.py registers them).

- `dmq cluster operations [--watch]`: running reassignments with a progress bar each, and
  decommissions with the replicas they still hold;
- `dmq cluster reassign TOPIC PARTITION BROKER,BROKER,... [--wait]`;
- `dmq cluster decommission-broker ID [--wait]`;
- `dmq cluster metadata-voters ID,ID,... [--wait]`: change the metadata group's voters
  (one broker at a time, added ones first);
- `dmq serve --join URL[,URL...]`: ask running brokers for the cluster (its brokers' Raft
  addresses and the metadata voters) and start as a new, non-voting broker of it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
import urllib.request
from typing import Any, TextIO

from dmq.client import AsyncAdmin
from dmq.config import BrokerConfig
from dmq.errors import DmqError
from log.segment import write_durably

BAR_WIDTH = 30
WATCH_INTERVAL_S = 1.0
JOIN_ASK_TIMEOUT_S = 5.0  # one GET /v1/cluster of a --join broker
JOIN_RETRY_FIRST_S = 0.5  # pause after a round of --join brokers none answered; doubles
JOIN_RETRY_MAX_S = 4.0


def add_cluster_operations(actions: Any, url: argparse.ArgumentParser) -> None:
    ops = actions.add_parser(
        "operations", parents=[url], help="running reassignments and decommissions"
    )
    ops.add_argument("--json", action="store_true", help="print the answer as JSON")
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


async def operations_of(url: str) -> dict[str, Any]:
    async with AsyncAdmin(url) as admin:
        return await admin.operations()


def _items(text: str) -> list[str]:
    """The non-empty items of a comma-separated argument, stripped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def _watch(url: str, out: TextIO) -> None:
    while True:
        doc = asyncio.run(operations_of(url))
        out.write(f"--- {time.strftime('%H:%M:%S')}\n")
        if not render_operations(doc, out):
            return
        out.flush()
        time.sleep(WATCH_INTERVAL_S)


def cmd_operations(args: argparse.Namespace) -> int:
    if args.watch:
        _watch(args.url, sys.stdout)
        return 0
    doc = asyncio.run(operations_of(args.url))
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        render_operations(doc, sys.stdout)
    return 0


def cmd_reassign(args: argparse.Namespace) -> int:
    replicas = _items(args.replicas)

    async def reassign() -> dict[str, Any]:
        async with AsyncAdmin(args.url) as admin:
            return await admin.reassign(args.topic, args.partition, replicas)

    doc = asyncio.run(reassign())
    print(f"reassigning {args.topic}-{args.partition}: {doc['replicas']} -> {doc['target']}")
    if args.wait:
        _watch(args.url, sys.stdout)
    return 0


def cmd_decommission(args: argparse.Namespace) -> int:
    async def decommission() -> dict[str, Any]:
        async with AsyncAdmin(args.url) as admin:
            return await admin.decommission_broker(args.broker_id)

    asyncio.run(decommission())
    print(f"decommissioning {args.broker_id}: its replicas move to the other brokers")
    if args.wait:
        _watch(args.url, sys.stdout)
    return 0


def cmd_metadata_voters(args: argparse.Namespace) -> int:
    voters = _items(args.voters)

    async def change() -> dict[str, Any]:
        async with AsyncAdmin(args.url) as admin:
            return await admin.change_metadata_voters(voters)

    doc = asyncio.run(change())
    target = doc.get("target") or doc.get("voters") or voters
    print(f"metadata voters: {','.join(doc.get('voters', []))} -> {','.join(target)}")
    if args.wait:
        _watch(args.url, sys.stdout)
    return 0


def cmd_decommission_partition(args: argparse.Namespace) -> int:
    async def retire() -> dict[str, Any]:
        async with AsyncAdmin(args.url) as admin:
            return await admin.decommission_partition(args.topic, args.partition)

    asyncio.run(retire())
    print(
        f"{args.topic}-{args.partition} decommissioned: no new records; readable until "
        "retention empties it, then removed"
    )
    return 0


JOINED_FILE = "joined_cluster.json"  # in <data dir>/meta/: what the last --join read


def _ask_cluster(urls: list[str], patience_s: float) -> tuple[dict[str, str], list[str]]:
    """Peers (id -> Raft address) and metadata voters from the first broker of urls that
    answers with every voter registered (a cluster still starting names voters it has no
    address for yet); rounds of every url go on until patience_s has passed. DmqError
    names each url with its last error."""
    deadline = time.monotonic() + patience_s
    pause = JOIN_RETRY_FIRST_S
    while True:
        failures = []
        for url in urls:
            try:
                with urllib.request.urlopen(  # noqa: S310 - the operator's --join http(s) URLs
                    f"{url}/v1/cluster", timeout=JOIN_ASK_TIMEOUT_S
                ) as resp:
                    doc = json.loads(resp.read())
                peers = {b["node_id"]: b["raft_addr"] for b in doc["brokers"]}
                voters = list(doc["metadata_voters"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                failures.append(f"{url}: {exc}")
                continue
            unknown = sorted(set(voters) - set(peers))
            if not unknown:
                return peers, voters
            failures.append(f"{url}: still starting (voters {','.join(unknown)} unregistered)")
        left = deadline - time.monotonic()
        tried = "; ".join(failures)
        if left <= 0:
            raise DmqError(f"--join: no broker answered with the cluster ({tried})")
        print(f"--join: no broker answered yet ({tried}); asking again", file=sys.stderr)
        time.sleep(min(pause, left))
        pause = min(2 * pause, JOIN_RETRY_MAX_S)


def resolve_join(config: BrokerConfig) -> BrokerConfig:
    """`--join URL,URL,...`: the running cluster's peers and voters, with this broker added.

    The brokers are asked in turn (`GET /v1/cluster`) until one answers; a first join
    keeps asking until `join_timeout_ms` (a broker down for a restart, or cut off by a
    partition, is waited for), then fails naming every URL and its error. What it read
    is kept in `<data dir>/meta/joined_cluster.json`: a restarted broker asks each URL
    once and, when none answers, starts from the copy (its own catalogue then brings it
    up to date) instead of failing to start."""
    if not config.join:
        return config
    urls = [u.rstrip("/") for u in _items(config.join)]
    urls = [u if "://" in u else f"http://{u}" for u in urls]
    if not urls:
        raise DmqError(f"--join {config.join!r}: name at least one broker URL")
    saved = config.data_path / "meta" / JOINED_FILE
    patience_s = 0.0 if saved.exists() else config.join_timeout_ms / 1000
    try:
        peers, voters = _ask_cluster(urls, patience_s)
    except DmqError as exc:
        if not saved.exists():
            raise
        print(f"{exc}; starting from what the last join read ({saved})", file=sys.stderr)
        kept = json.loads(saved.read_text())
        peers, voters = dict(kept["peers"]), list(kept["metadata_voters"])
        fresh = False
    else:
        fresh = True
    if config.node_id in peers and peers[config.node_id] != config.raft_addr:
        raise DmqError(f"--join: broker id {config.node_id} is taken by {peers[config.node_id]}")
    peers[config.node_id] = config.raft_addr
    if fresh:  # kept for the next start (a copy read back is not written again)
        saved.parent.mkdir(parents=True, exist_ok=True)
        write_durably(saved, json.dumps({"peers": peers, "metadata_voters": voters}).encode())
    return dataclasses.replace(
        config,
        peers=",".join(f"{k}={v}" for k, v in sorted(peers.items())),
        metadata_voters=",".join(voters),
    )

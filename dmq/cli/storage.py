"""`dmq storage show|reset|set-aside`: a broker's data directory and its identity
(registered by dmq/cli/__init__.py).

::

    dmq storage show --data-dir DIR           which broker of which cluster owns DIR
    dmq storage reset --data-dir DIR --yes    empty DIR so that it can join another cluster
    dmq storage set-aside [--url URL]         partition data a broker set aside (stray)

`reset` is the one way to move a data directory to another cluster (a broker never changes
cluster as a side effect of `--join`: dmq/README.md, "Cluster identity"). It deletes
everything in the directory, records included, so it wants `--yes`, and it refuses while a
broker runs on the directory: it takes the directory's lock (`<DIR>/.lock`, the flock a
running broker holds) for the whole deletion, so no broker can start on it meanwhile.
`meta.properties` is deleted last, once the deletion of everything else is durable: a reset
interrupted halfway (a crash, a full disk, a permission error) leaves data that still names
its cluster, so it is never joined to another one by mistake; run the reset again.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import shutil
from pathlib import Path
from typing import Any

from dmq import meta_file
from dmq.cli._common import Subparsers, UsageError, add_output, admin_for, print_json
from dmq.errors import BrokerUnavailable, DmqError
from log.segment import fsync_directory

LOCK_FILE = ".lock"  # dmq/broker/broker.py's data-directory lock


def add_storage(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    storage = commands.add_parser(
        "storage", help="a data directory: its identity, reset, set-aside data"
    )
    actions = storage.add_subparsers(dest="storage_command", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="the cluster and broker a data directory belongs to")
    show.add_argument("--data-dir", required=True, help="the broker's data directory")
    add_output(show)
    show.set_defaults(handler=cmd_storage_show)
    reset = actions.add_parser(
        "reset",
        help="delete everything in a data directory (to move it to another cluster)",
        description="Delete every file of a stopped broker's data directory (records, Raft "
        "journals, its cluster identity), so that it can join another cluster. Refused "
        "while a broker runs on it.",
    )
    reset.add_argument("--data-dir", required=True, help="the broker's data directory")
    reset.add_argument("--yes", action="store_true", help="really delete its data")
    reset.set_defaults(handler=cmd_storage_reset)
    stray = actions.add_parser(
        "set-aside", parents=[url], help="partition data a broker set aside instead of using"
    )
    add_output(stray)
    stray.set_defaults(handler=cmd_storage_set_aside)


def cmd_storage_show(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    meta = meta_file.read(data_dir)
    if args.output == "json":
        ids = {"cluster_id": meta.cluster_id, "node_id": meta.node_id} if meta else {}
        print_json({"data_dir": str(data_dir), "cluster_id": None, "node_id": None} | ids)
        return 0
    if meta is None:
        print(f"{data_dir}: no identity (a new directory, or one from before cluster ids)")
    else:
        print(f"{data_dir}: cluster {meta.cluster_id}, broker {meta.node_id}")
    return 0


def cmd_storage_reset(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        raise UsageError(f"{data_dir} is not a directory")
    entries = sorted(p for p in data_dir.iterdir() if p.name != LOCK_FILE)
    try:
        meta = meta_file.read(data_dir)
        owner = f"broker {meta.node_id} of cluster {meta.cluster_id}" if meta else "no identity"
    except DmqError:  # a corrupt identity: resetting is one way out
        owner = "an unreadable identity"
    if not args.yes:
        raise UsageError(
            f"this deletes the {len(entries)} entries of {data_dir} ({owner}), every record "
            f"in it included; add --yes to do it"
        )
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise BrokerUnavailable(
                f"a broker (pid {pid or '?'}) runs on {data_dir}: stop it first; nothing "
                f"was deleted"
            ) from None
        # The identity goes last, after the rest is deleted and that deletion is durable:
        # a reset interrupted halfway leaves records that still name their cluster (the
        # broker then refuses to join another one with them), never records without one.
        keep = (LOCK_FILE, meta_file.META_FILE)
        for path in sorted(p for p in data_dir.iterdir() if p.name not in keep):
            _delete(path)
        fsync_directory(data_dir)
        _delete(data_dir / meta_file.META_FILE)
        fsync_directory(data_dir)
    finally:
        os.close(fd)  # releases the lock
    print(f"reset {data_dir} ({owner}): it is empty, and joins a cluster as a new broker")
    return 0


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def cmd_storage_set_aside(args: argparse.Namespace) -> int:
    async def ask() -> dict[str, Any]:
        async with admin_for(args) as admin:
            return await admin.set_aside()

    doc = asyncio.run(ask())
    if args.output == "json":
        print_json(doc)
        return 0
    entries = doc["set_aside"]
    if not entries:
        print(f"nothing set aside in {doc.get('data_dir')}")
    for entry in entries:
        print(f"{entry['path']}  {entry['bytes']} bytes  from {entry['original']}:")
        print(f"    {entry['reason']}")
    return 0

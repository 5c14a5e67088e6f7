"""`dmq txn list` (registered by dmq/cli/__init__.py): the transaction coordinator's view."""

from __future__ import annotations

import argparse
import asyncio
import json

from dmq.cli._common import Subparsers, print_table
from dmq.client._transactions import list_transactions


def add_txn(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    txn = commands.add_parser("txn", help="transactions: state, age, partitions")
    actions = txn.add_subparsers(dest="txn_command", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list", parents=[url], help="every transactional id's current or last transaction"
    )
    listing.add_argument("--json", action="store_true", help="print the answer as JSON")
    listing.set_defaults(handler=cmd_txn_list)


# A transaction has an age while it is open (its batches wait for a marker); a finished
# one's age_ms is 0 in the API, shown as "-" rather than as a transaction 0 ms old.
_OPEN_STATES = ("ongoing", "prepare_commit", "prepare_abort")


def cmd_txn_list(args: argparse.Namespace) -> int:
    transactions = asyncio.run(
        list_transactions(args.url, default_api_timeout_ms=args.api_timeout_ms)
    )
    if args.json:
        print(json.dumps({"transactions": transactions}, indent=2))
        return 0
    rows = [("TRANSACTIONAL-ID", "STATE", "PRODUCER", "EPOCH", "AGE-MS", "PARTITIONS", "OFFSETS")]
    rows += [
        (
            t["transactional_id"],
            t["state"],
            str(t["producer_id"]),
            str(t["producer_epoch"]),
            str(t["age_ms"]) if t["state"] in _OPEN_STATES else "-",
            ",".join(t["partitions"]) or "-",
            str(len(t["offsets"])),
        )  # fmt: skip
        for t in transactions
    ]
    print_table(rows)
    return 0

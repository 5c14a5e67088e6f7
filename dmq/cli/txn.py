"""`dmq txn list|describe|abort` (registered by dmq/cli/__init__.py): the transaction
coordinator's view, and an operator's abort of a transaction its producer left open."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from dmq.cli._common import Subparsers, add_output, print_json, print_table
from dmq.client._transactions import describe_transaction, end_transaction, list_transactions
from dmq.errors import InvalidRequest


def add_txn(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    txn = commands.add_parser("txn", help="transactions: list, describe, abort")
    actions = txn.add_subparsers(dest="txn_command", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list", parents=[url], help="every transactional id's current or last transaction"
    )
    add_output(listing)
    listing.set_defaults(handler=cmd_txn_list)
    describe = actions.add_parser(
        "describe", parents=[url], help="one transactional id's transaction: state, partitions"
    )
    describe.add_argument("transactional_id", help="the producer's transactional id")
    add_output(describe)
    describe.set_defaults(handler=cmd_txn_describe)
    abort = actions.add_parser(
        "abort",
        parents=[url],
        help="abort an open transaction (as Kafka's kafka-transactions.sh abort): its records "
        "are never read by read_committed consumers, and its producer is fenced",
    )
    abort.add_argument("transactional_id", help="the producer's transactional id")
    add_output(abort)
    abort.set_defaults(handler=cmd_txn_abort)


# A transaction has an age while it is open (its batches wait for a marker); a finished
# one's age_ms is 0 in the API, shown as "-" rather than as a transaction 0 ms old.
_OPEN_STATES = ("ongoing", "prepare_commit", "prepare_abort")
_HEAD = ("TRANSACTIONAL-ID", "STATE", "PRODUCER", "EPOCH", "AGE-MS", "PARTITIONS", "OFFSETS")


def _row(t: dict[str, Any]) -> tuple[str, ...]:
    return (
        t["transactional_id"],
        t["state"],
        str(t["producer_id"]),
        str(t["producer_epoch"]),
        str(t["age_ms"]) if t["state"] in _OPEN_STATES else "-",
        ",".join(t["partitions"]) or "-",
        str(len(t["offsets"])),
    )


def cmd_txn_list(args: argparse.Namespace) -> int:
    transactions = asyncio.run(
        list_transactions(args.url, default_api_timeout_ms=args.api_timeout_ms)
    )
    if args.output == "json":
        print_json({"transactions": transactions})
        return 0
    print_table([_HEAD, *(_row(t) for t in transactions)])
    return 0


def cmd_txn_describe(args: argparse.Namespace) -> int:
    txn = asyncio.run(
        describe_transaction(
            args.url, args.transactional_id, default_api_timeout_ms=args.api_timeout_ms
        )
    )
    _print(txn, args.output)
    return 0


def cmd_txn_abort(args: argparse.Namespace) -> int:
    """Abort with the transaction's own producer id and epoch, read just before: the
    coordinator refuses a stale pair, so a transaction that ended meanwhile stays as it is."""
    tid = args.transactional_id
    txn = asyncio.run(
        describe_transaction(args.url, tid, default_api_timeout_ms=args.api_timeout_ms)
    )
    if txn["state"] != "ongoing":
        raise InvalidRequest(
            f"transaction {tid!r} is {txn['state']}, not ongoing: nothing to abort "
            "(see `dmq txn describe`)",
            field="transactional_id",
        )
    ended = asyncio.run(
        end_transaction(args.url, tid, (txn["producer_id"], txn["producer_epoch"]), commit=False)
    )
    _print(ended, args.output)
    return 0


def _print(txn: dict[str, Any], output: str) -> None:
    if output == "json":
        print_json(txn)
        return
    print_table([_HEAD, _row(txn)])

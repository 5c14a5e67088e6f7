"""The transactional workload's checker (jepsen/txn.py's history): what read_committed
readers may and may not see of multi-partition transactions.

Each transaction `T` wrote one record (its name) to each of its partitions. Its outcome:
committed (ok: the commit was answered), never committed (fail: refused or aborted), or
unknown (info). Anomalies:

- `aborted-read`: a read saw a record of a transaction that was never committed;
- `dirty-read`: a read that completed before T's decision was even asked for saw T's
  record: read_committed served an open transaction (past the last stable offset);
- `non-atomic-commit`: a read that began after T's commit was answered saw T in some of
  its partitions but not all; or the final read shows an unknown T in part of them;
- `lost-committed-write`: the final read (after heal, once no transaction is open) lacks
  a committed T in one of its partitions;
- `duplicate`: one read saw the same record twice in one partition.

A read reads its partitions one after the other, so a read that overlaps T's commit may
see T in some partitions only: that is not flagged (only reads that began after the
commit was answered must see all of it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jepsen.checker import UNKNOWN, Verdict
from jepsen.history import Op, Pair, pairs


def check_txn(ops: Iterable[Op]) -> Verdict:
    verdict = Verdict()
    txns: dict[str, Pair] = {}
    reads: list[Pair] = []
    for pair in pairs(ops):
        if pair.invoke.f == "txn":
            txns[pair.invoke.value["txn"]] = pair
        elif pair.invoke.f == "txn-read" and pair.type == "ok":
            reads.append(pair)
    committed = {t for t, p in txns.items() if p.type == "ok"}
    # Never committed: refused, or the worker decided to abort (an abort cannot commit).
    never = {
        t for t, p in txns.items()
        if p.type == "fail" or (p.complete is not None and p.complete.value.get("decided") == "abort")
    }  # fmt: skip
    finals = [r for r in reads if r.complete is not None and r.complete.value.get("final")]
    verdict.stats = {
        "transactions": len(txns),
        "committed": len(committed),
        "never_committed": len(never),
        "unknown": len(txns) - len(committed | never),
        "reads_ok": len(reads),
        "final_reads": len(finals),
    }
    for read in reads:
        _check_read(verdict, read, txns, never)
    if not finals:
        verdict.valid = UNKNOWN if verdict.valid != "invalid" else verdict.valid
        return verdict
    _check_final(verdict, finals[-1], txns, committed)
    return verdict


def _seen(read: Pair) -> dict[str, set[int]]:
    """Transaction -> the partitions where this read saw its record."""
    assert read.complete is not None
    out: dict[str, set[int]] = {}
    for part, values in read.complete.value["partitions"].items():
        for value in values:
            out.setdefault(value, set()).add(int(part))
    return out


def _check_read(verdict: Verdict, read: Pair, txns: dict[str, Pair], never: set[str]) -> None:
    assert read.complete is not None
    for part, values in read.complete.value["partitions"].items():
        if len(values) != len(set(values)):
            dup = sorted({v for v in values if values.count(v) > 1})
            verdict.flag(
                "duplicate", {"read": read.invoke.index, "partition": part, "values": dup[:5]}
            )
    for name, parts in _seen(read).items():
        txn = txns.get(name)
        if txn is None:
            verdict.flag("aborted-read", {"read": read.invoke.index, "txn": name, "why": "unknown"})
            continue
        example = _example(read, txn, parts)
        if name in never:
            verdict.flag("aborted-read", example)
            continue
        done = txn.complete.value if txn.complete is not None else {}
        decide_at = done.get("decide_at")
        if decide_at is not None and read.end < decide_at:
            verdict.flag("dirty-read", example)
        if (
            txn.type == "ok"
            and read.invoke.time > txn.end
            and parts != set(txn.invoke.value["partitions"])
        ):
            verdict.flag("non-atomic-commit", example)


def _check_final(verdict: Verdict, final: Pair, txns: dict[str, Pair], committed: set[str]) -> None:
    seen = _seen(final)
    for name, txn in txns.items():
        wanted = set(txn.invoke.value["partitions"])
        parts = seen.get(name, set())
        if name in committed and parts != wanted:
            kind = "lost-committed-write" if not parts else "non-atomic-commit"
            verdict.flag(kind, {**_example(final, txn, parts), "final": True})
        elif txn.type == "info" and parts and parts != wanted:
            verdict.flag("non-atomic-commit", {**_example(final, txn, parts), "final": True})


def _example(read: Pair, txn: Pair, parts: set[int]) -> dict[str, Any]:
    return {
        "read": read.invoke.index,
        "txn_op": txn.invoke.index,
        "txn": txn.invoke.value["txn"],
        "partitions": txn.invoke.value["partitions"],
        "seen_in": sorted(parts),
        "outcome": txn.type,
    }

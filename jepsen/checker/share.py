"""The share-group checker, from a history of the share workload (jepsen/share.py) and
the log workload's sends:

- double-accept: a record accepted (ack answered 200) twice;
- overlapping-delivery: a record delivered twice with the same delivery_count, or
  delivered by a poll that began after another poll delivering it ended without a higher
  delivery_count: two members held its lock at once (each acquisition takes the next
  count, so counts order the locks without trusting any clock);
- lock-cut-short: a record delivered again (a higher delivery_count) by a poll that ended
  before the previous delivery's `locked_until`, while its holder neither acknowledged it
  (in any way, whatever the answer) nor left in between: the lock ended early. Compares
  the client's wall clock (the poll's end) with the lock the server gave; the brokers run
  on the client's host, so it is skipped when the clock nemesis moved their clocks;
- accepted-redelivered: a record delivered by a poll that began after an accept of it
  was answered;
- lost: an acknowledged send neither accepted (an ack answered 200, or unknown) nor in the
  dead-letter topic once the final drain settled the group;
- dead-letter-duplicate: a record in the dead-letter topic more than once;
  accepted-and-dead-lettered: accepted (200) and also dead-lettered;
- unexpected: a delivered value that is not the value sent at that offset.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from jepsen.checker import Verdict
from jepsen.history import NEMESIS, Op, Pair, pairs

SHARE_FS = ("share-join", "share-poll", "share-ack", "share-leave", "share-dlq")
Key = tuple[int, int]  # (partition, offset)


def check_share(ops: Iterable[Op]) -> dict[str, Verdict]:
    sent: dict[Key, str] = {}  # acknowledged sends
    deliveries: dict[Key, list[tuple[Pair, int, str]]] = defaultdict(list)
    accepted_ok: Counter[Key] = Counter()
    accepted_at: dict[Key, float] = {}  # first accept answered 200: its completion time
    accepted_maybe: set[Key] = set()
    dead: Counter[Key] = Counter()
    drained = False
    stats: Counter[str] = Counter()
    # Locks: (member, partition, offset) -> [(poll end wall ms, locked_until)], and when the
    # member let it go (an ack of it, or a leave: invoke time on the history's clock).
    locks: list[tuple[str, Key, int, Pair, int]] = []  # member, key, count, poll, until
    let_go: dict[tuple[str, Key | None], list[float]] = defaultdict(list)
    ops = list(ops)
    clocks_moved = any(  # the clock nemesis records start-clock / stop-clock
        op.process == NEMESIS and op.f in ("start-clock", "stop-clock") for op in ops
    )
    for pair in pairs(ops):
        f, done = pair.invoke.f, pair.complete
        if f == "share-leave":
            let_go[(pair.invoke.value["member_id"], None)].append(pair.invoke.time)
        if f == "share-ack":
            for p, o, _ in pair.invoke.value["acks"]:
                let_go[(pair.invoke.value["member_id"], (p, o))].append(pair.invoke.time)
        if f == "send" and pair.type == "ok" and done is not None and "offset" in done.value:
            sent[(done.value["partition"], done.value["offset"])] = done.value["value"]
        elif f == "share-poll" and pair.type == "ok" and done is not None:
            for p, o, value, count, *until in done.value["records"]:
                deliveries[(p, o)].append((pair, count, value))
                if until and "wall_ms" in done.value:
                    locks.append((pair.invoke.value["member_id"], (p, o), count, pair, until[0]))
                stats["deliveries"] += 1
                stats["redeliveries"] += count > 1
        elif f == "share-ack":
            stats[f"acks_{pair.type}"] += 1
            for p, o, kind in pair.invoke.value["acks"]:
                if kind != "accept":
                    continue
                if pair.type == "ok":
                    accepted_ok[(p, o)] += 1
                    accepted_at.setdefault((p, o), pair.end)
                elif pair.type == "info":
                    accepted_maybe.add((p, o))
        elif f == "share-dlq" and pair.type == "ok" and done is not None:
            drained = True
            for p, o, _, _ in done.value["records"]:
                dead[(p, o)] += 1
    verdict = Verdict()
    _check_deliveries(verdict, deliveries, accepted_at, sent)
    if not clocks_moved:
        _check_locks(verdict, locks, let_go)
    for key, n in sorted(accepted_ok.items()):
        if n > 1:
            verdict.flag("double-accept", {"partition": key[0], "offset": key[1], "accepts": n})
        if dead[key]:
            verdict.flag("accepted-and-dead-lettered", {"partition": key[0], "offset": key[1]})
    for key, n in sorted(dead.items()):
        if n > 1:
            verdict.flag(
                "dead-letter-duplicate", {"partition": key[0], "offset": key[1], "copies": n}
            )
    if drained:
        for key in sorted(sent):
            if key not in accepted_ok and key not in accepted_maybe and not dead[key]:
                verdict.flag("lost", {"partition": key[0], "offset": key[1], "value": sent[key]})
    verdict.stats.update(
        stats, acknowledged_sends=len(sent), accepted=len(accepted_ok),
        dead_lettered=len(dead), drained=drained,
    )  # fmt: skip
    return {"share": verdict}


def _check_locks(
    verdict: Verdict,
    locks: list[tuple[str, Key, int, Pair, int]],
    let_go: dict[tuple[str, Key | None], list[float]],
) -> None:
    """lock-cut-short: each delivery against the one before it (delivery_count order)."""
    by_key: dict[Key, list[tuple[int, str, Pair, int]]] = defaultdict(list)
    for member, key, count, poll, until in locks:
        by_key[key].append((count, member, poll, until))
    for key, found in sorted(by_key.items()):
        found.sort(key=lambda d: d[0])
        for (count, member, poll, until), (later_count, _, later, _) in zip(
            found, found[1:], strict=False
        ):
            assert later.complete is not None
            if later_count <= count or later.complete.value["wall_ms"] >= until:
                continue  # a later lock, or the poll may have acquired after the lock ended
            start, end = poll.invoke.time, later.end
            gone = let_go[(member, key)] + let_go[(member, None)]
            if any(start < t < end for t in gone):
                continue  # acknowledged (released) or left in between
            verdict.flag("lock-cut-short", {
                "partition": key[0], "offset": key[1], "earlier": poll.invoke.index,
                "later": later.invoke.index, "locked_until": until,
                "later_poll_ended_wall_ms": later.complete.value["wall_ms"],
                "counts": [count, later_count]})  # fmt: skip


def _check_deliveries(
    verdict: Verdict,
    deliveries: dict[Key, list[tuple[Pair, int, str]]],
    accepted_at: dict[Key, float],
    sent: dict[Key, str],
) -> None:
    for key, found in sorted(deliveries.items()):
        where: dict[str, Any] = {"partition": key[0], "offset": key[1]}
        counts = Counter(count for _, count, _ in found)
        for count, n in sorted(counts.items()):
            if n > 1:
                verdict.flag("overlapping-delivery", {**where, "delivery_count": count, "times": n})
        ordered = sorted(found, key=lambda d: d[0].invoke.time)
        for i, (later, count, _) in enumerate(ordered):
            for earlier, earlier_count, _ in ordered[:i]:
                if earlier.end < later.invoke.time and count <= earlier_count:
                    verdict.flag("overlapping-delivery", {
                        **where, "earlier": earlier.invoke.index, "later": later.invoke.index,
                        "counts": [earlier_count, count]})  # fmt: skip
            if key in accepted_at and later.invoke.time > accepted_at[key]:
                verdict.flag("accepted-redelivered", {**where, "poll": later.invoke.index})
        for _, _, value in found:
            if key in sent and value != sent[key]:
                verdict.flag("unexpected", {**where, "value": value, "sent": sent[key]})

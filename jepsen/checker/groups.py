"""The group checkers, from a history of the group workload (jepsen/groups.py):

- `offsets`: committed offsets per partition are a register (commit writes, read-committed
  reads; a partition never committed reads None), checked with the WGL checker per key.
  A read that returns an offset older than an acknowledged commit (committed offsets
  going backwards) is not linearizable. A commit whose outcome is unknown (info) may take
  effect any time after its call, or never; a failed commit (409: fenced) never does.
- `queue`: every acknowledged send must be dequeued by some group poll (the members' and
  the final drain's): lost, unexpected, duplicated (counted, at-least-once), recovered.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from jepsen.checker import Verdict
from jepsen.checker.queue import check_total_queue
from jepsen.checker.wgl import LinOp, check_linearizable
from jepsen.history import Op, pairs

GROUP_FS = ("subscribe", "group-poll", "commit", "read-committed", "heartbeat")


def offset_ops(ops: Iterable[Op]) -> list[LinOp]:
    """Commits (ok or info) and ok reads as register operations keyed by partition."""
    writes: list[LinOp] = []
    reads: list[tuple[Op, Op]] = []
    keys: set[int] = set()
    for pair in pairs(ops):
        if pair.invoke.f == "commit" and pair.type in ("ok", "info"):
            index = pair.invoke.index if pair.complete is None else pair.complete.index
            end = math.inf if pair.type == "info" else pair.end  # may land any time later
            for partition, offset in pair.invoke.value["offsets"]:
                keys.add(partition)
                writes.append(LinOp(partition, "write", offset, None, pair.invoke.time, end, index))
        elif pair.invoke.f == "read-committed" and pair.type == "ok":
            assert pair.complete is not None
            reads.append((pair.invoke, pair.complete))
            keys.update(p for p, _ in pair.complete.value["offsets"])
    out = list(writes)
    for invoke, complete in reads:
        found = dict((p, o) for p, o in complete.value["offsets"])
        out.extend(
            LinOp(key, "read", None, found.get(key), invoke.time, complete.time, complete.index)
            for key in sorted(keys)
        )
    return out


def backwards(lin_ops: list[LinOp], key: object) -> dict[str, object] | None:
    """A witness for a report (the verdict is WGL's): the first read of `key` that
    returned less than (or no) offset than an acknowledged commit finished before it began."""
    commits = sorted(
        (op.end, op.input, op.index) for op in lin_ops if op.key == key and op.f == "write"
    )
    for read in sorted(
        (op for op in lin_ops if op.key == key and op.f == "read"), key=lambda o: o.start
    ):
        done = [c for c in commits if c[0] < read.start]
        if done and (read.output is None or read.output < max(c[1] for c in done)):
            top = max(done, key=lambda c: c[1])
            return {
                "read": read.index,
                "returned": read.output,
                "commit": top[2],
                "committed": top[1],
            }
    return None


def check_groups(ops: list[Op], timeout_s: float = 10.0) -> dict[str, Verdict]:
    """{"group-offsets": WGL per partition, "group-queue": total queue}; both empty
    (valid, with zero counts) for a history without group operations."""
    lin_ops = offset_ops(ops)
    offsets = check_linearizable(lin_ops, timeout_s=timeout_s)
    for example in offsets.anomalies.get("nonlinearizable", []):
        key = int(example["key"])
        example["partition"] = key
        example["witness"] = backwards(lin_ops, key)
    group_ops = [p for p in pairs(ops) if p.invoke.f in GROUP_FS]
    offsets.stats.update(
        commits=sum(p.invoke.f == "commit" for p in group_ops),
        commits_ok=sum(p.invoke.f == "commit" and p.type == "ok" for p in group_ops),
        reads_ok=sum(p.invoke.f == "read-committed" and p.type == "ok" for p in group_ops),
        joins=sum(p.invoke.f == "subscribe" for p in group_ops),
        rejoins_after_409=sum(
            p.type == "fail" and (p.complete.value.get("status") == 409 if p.complete else False)
            for p in group_ops
        ),
    )
    return {"group-offsets": offsets, "group-queue": check_total_queue(ops)}

"""The log checker: what a history of sends and polls on partitioned logs may not show.

Modelled on Jepsen's Kafka workload checker (jepsen.tests.kafka). Every anomaly names the
operations involved by their history index. dmq's offsets are dense (no transactions,
no compaction in the workload), so a gap between offsets read in order is a skip.

| anomaly | meaning |
|---|---|
| inconsistent-offsets | one (partition, offset) read or acknowledged with two values |
| duplicate | one value at two (partition, offset)s |
| lost-write | an acknowledged send never read although reads got past its offset or a final poll read the whole log (up to the high watermark) |
| unseen | an acknowledged send never read, and no read reached its offset nor the end of the log |
| unexpected | a value read that no send ever wrote |
| G1a | a value read whose send certainly failed (an aborted read) |
| poll-skip | a process's poll began past the offset after its previous poll's last record |
| nonmonotonic-poll | ... began at or before its previous poll's last record |
| int-poll-skip | offsets inside one poll jump by more than 1 |
| int-nonmonotonic-poll | offsets inside one poll do not increase |
| nonmonotonic-send | one process's acknowledged sends to a partition got decreasing offsets |
| realtime-send-inversion | a send acknowledged before another began got the larger offset |
| stale-read | a poll that began after the ack of offset o started at or before o, did not return o, and answered a high watermark <= o (claiming o unwritten) |
| replica-divergence | two nodes' own replicas hold different bytes over the offsets both hold |
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from jepsen.checker import Verdict
from jepsen.history import Op, Pair, pairs

READ_FS = ("poll", "final-poll")
ANOMALIES: tuple[str, ...] = (
    "G1a",
    "duplicate",
    "inconsistent-offsets",
    "int-nonmonotonic-poll",
    "int-poll-skip",
    "lost-write",
    "nonmonotonic-poll",
    "nonmonotonic-send",
    "poll-skip",
    "realtime-send-inversion",
    "replica-divergence",
    "stale-read",
    "unexpected",
    "unseen",
)

Where = tuple[int, int]  # (partition, offset)


def _records(pair: Pair) -> list[tuple[int, str]]:
    assert pair.complete is not None
    return [(int(o), v) for o, v in pair.complete.value.get("records", [])]


def check_log(ops: Iterable[Op]) -> Verdict:
    """Check a log workload history; see the module docstring for each anomaly."""
    all_pairs = list(pairs(ops))
    verdict = Verdict()
    sends = [p for p in all_pairs if p.invoke.f == "send"]
    reads = [p for p in all_pairs if p.invoke.f in READ_FS and p.type == "ok"]
    acked = [p for p in sends if p.type == "ok"]
    _check_values(verdict, sends, acked, reads)
    _check_polls(verdict, [p for p in all_pairs if p.type == "ok"])
    _check_send_order(verdict, acked)
    _check_stale_reads(verdict, acked, reads)
    _check_replicas(verdict, [p for p in all_pairs if p.invoke.f == "replica-read"])
    verdict.stats.update(
        sends=len(sends),
        sends_ok=len(acked),
        sends_info=sum(p.type == "info" for p in sends),
        sends_retried=sum(
            p.complete is not None and p.complete.value.get("attempts", 1) > 1 for p in sends
        ),
        sends_fail=sum(p.type == "fail" for p in sends),
        polls=sum(p.invoke.f == "poll" for p in all_pairs),
        polls_ok=sum(p.invoke.f == "poll" for p in reads),
        records_read=sum(len(_records(p)) for p in reads),
    )
    return verdict


def _check_values(
    verdict: Verdict, sends: list[Pair], acked: list[Pair], reads: list[Pair]
) -> None:
    """inconsistent-offsets, duplicate, unexpected, G1a, lost-write, unseen."""
    at: dict[Where, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    read_at: dict[str, set[Where]] = defaultdict(set)
    read_end: dict[int, int] = defaultdict(int)  # partition -> first offset no read reached
    finished: set[int] = set()  # partitions a final poll read up to its high watermark
    for pair in reads:
        assert pair.complete is not None
        part = int(pair.invoke.value["partition"])
        for offset, value in _records(pair):
            at[(part, offset)][value].append(pair.complete.index)
            read_at[value].add((part, offset))
            read_end[part] = max(read_end[part], offset + 1)
        done = pair.complete.value
        if pair.invoke.f == "final-poll" and done["next_offset"] >= done["high_watermark"]:
            finished.add(part)
    for pair in acked:
        assert pair.complete is not None
        if pair.complete.value.get("offset") is not None:
            where = (int(pair.complete.value["partition"]), int(pair.complete.value["offset"]))
            at[where][pair.invoke.value["value"]].append(pair.complete.index)
    for (part, offset), values in sorted(at.items()):
        if len(values) > 1:
            verdict.flag(
                "inconsistent-offsets",
                {"partition": part, "offset": offset, "values": dict(values)},
            )
    placed: dict[str, set[Where]] = defaultdict(set)
    for where, values in at.items():
        for value in values:
            placed[value].add(where)
    for value, wheres in sorted(placed.items()):
        if len(wheres) > 1:
            verdict.flag("duplicate", {"value": value, "at": sorted(wheres)})
    by_value = {p.invoke.value["value"]: p for p in sends}
    for value, wheres in sorted(read_at.items()):
        send = by_value.get(value)
        if send is None:
            verdict.flag("unexpected", {"value": value, "at": sorted(wheres)})
        elif send.type == "fail":
            assert send.complete is not None
            example = {"value": value, "send": send.complete.index, "at": sorted(wheres)}
            verdict.flag("G1a", example)
    for pair in acked:
        assert pair.complete is not None
        value = pair.invoke.value["value"]
        if value in read_at:
            continue
        part, offset = int(pair.invoke.value["partition"]), pair.complete.value.get("offset")
        # Covered: a read got past its offset, or a final poll reached the end of the log.
        covered = part in finished or (offset is not None and int(offset) < read_end[part])
        example = {"value": value, "send": pair.complete.index, "partition": part, "offset": offset}
        verdict.flag("lost-write" if covered else "unseen", example)
    verdict.stats["recovered"] = sum(
        p.invoke.value["value"] in read_at for p in sends if p.type == "info"
    )


def _check_polls(verdict: Verdict, done: list[Pair]) -> None:
    """poll-skip and nonmonotonic-poll between one process's polls of a partition (an
    assign resets its position), and the internal kinds inside each poll."""
    last: dict[tuple[int | str, int], tuple[int, int]] = {}  # -> (last offset, op index)
    for pair in done:
        assert pair.complete is not None
        f, proc = pair.invoke.f, pair.invoke.process
        if f == "assign":
            part, offset = int(pair.invoke.value["partition"]), int(pair.invoke.value["offset"])
            last[(proc, part)] = (offset - 1, pair.complete.index)
            continue
        if f not in READ_FS:
            continue
        part = int(pair.invoke.value["partition"])
        offsets = [offset for offset, _ in _records(pair)]
        index = pair.complete.index
        for a, b in zip(offsets, offsets[1:], strict=False):
            if b <= a:
                verdict.flag(
                    "int-nonmonotonic-poll", {"op": index, "partition": part, "offsets": [a, b]}
                )
            elif b > a + 1:
                verdict.flag("int-poll-skip", {"op": index, "partition": part, "offsets": [a, b]})
        if not offsets:
            continue
        previous = last.get((proc, part))
        if previous is not None:
            before, before_op = previous
            example = {
                "ops": [before_op, index],
                "partition": part,
                "offsets": [before, offsets[0]],
            }
            if offsets[0] > before + 1:
                verdict.flag("poll-skip", example)
            elif offsets[0] <= before:
                verdict.flag("nonmonotonic-poll", example)
        last[(proc, part)] = (offsets[-1], index)


def _check_send_order(verdict: Verdict, acked: list[Pair]) -> None:
    """nonmonotonic-send within a process; realtime-send-inversion across processes."""
    with_offset = [
        p for p in acked if p.complete is not None and p.complete.value.get("offset") is not None
    ]
    by_part: dict[int, list[Pair]] = defaultdict(list)
    for pair in with_offset:
        by_part[int(pair.invoke.value["partition"])].append(pair)
    for part, group in by_part.items():
        previous: dict[int | str, Pair] = {}
        for pair in group:  # invocation order, so each process's sends in its own order
            before = previous.get(pair.invoke.process)
            if before is not None and _offset(pair) <= _offset(before):
                verdict.flag("nonmonotonic-send", _pair_example(part, before, pair))
            previous[pair.invoke.process] = pair
        _check_realtime(verdict, part, group)


def _offset(pair: Pair) -> int:
    assert pair.complete is not None
    return int(pair.complete.value["offset"])


def _pair_example(part: int, first: Pair, second: Pair) -> dict[str, Any]:
    assert first.complete is not None and second.complete is not None
    return {
        "partition": part,
        "ops": [first.complete.index, second.complete.index],
        "offsets": [_offset(first), _offset(second)],
    }


def _check_realtime(verdict: Verdict, part: int, group: list[Pair]) -> None:
    """A send completed before another was invoked must hold the smaller offset. Sweep in
    invocation order, keeping the two largest-offset completed sends of distinct
    processes (the same process's case is nonmonotonic-send)."""
    completed = sorted(group, key=lambda p: p.end)
    k = 0
    best: list[Pair] = []  # at most two, distinct processes, largest offset first
    for pair in sorted(group, key=lambda p: p.invoke.time):
        while k < len(completed) and completed[k].end < pair.invoke.time:
            done = completed[k]
            k += 1
            rest = [b for b in best if b.invoke.process != done.invoke.process]
            best = sorted([done, *rest], key=_offset, reverse=True)[:2]
        for earlier in best:
            if earlier.invoke.process != pair.invoke.process:
                if _offset(earlier) > _offset(pair):
                    verdict.flag("realtime-send-inversion", _pair_example(part, earlier, pair))
                break


def _check_stale_reads(verdict: Verdict, acked: list[Pair], reads: list[Pair]) -> None:
    """A read that began after offset o was acknowledged, asked from <= o, and answered
    without o and with a high watermark <= o."""
    by_part: dict[int, list[tuple[float, int, int]]] = defaultdict(list)
    for pair in acked:
        assert pair.complete is not None
        if pair.complete.value.get("offset") is not None:
            part = int(pair.invoke.value["partition"])
            by_part[part].append((pair.complete.time, _offset(pair), pair.complete.index))
    prefix: dict[int, tuple[list[float], list[tuple[int, int]]]] = {}
    for part, acks in by_part.items():
        acks.sort()
        highest: list[tuple[int, int]] = []
        for _, offset, index in acks:
            top = highest[-1] if highest else (-1, -1)
            highest.append(max(top, (offset, index)))
        prefix[part] = ([t for t, _, _ in acks], highest)
    for pair in reads:
        assert pair.complete is not None
        part = int(pair.invoke.value["partition"])
        if part not in prefix:
            continue
        times, highest = prefix[part]
        k = bisect.bisect_left(times, pair.invoke.time) - 1
        if k < 0:
            continue
        acked_offset, ack_index = highest[k]
        answer = pair.complete.value
        returned = [offset for offset, _ in _records(pair)]
        if (
            int(pair.invoke.value["offset"]) <= acked_offset
            and acked_offset not in returned
            and int(answer["high_watermark"]) <= acked_offset
        ):
            verdict.flag(
                "stale-read",
                {
                    "partition": part,
                    "ops": [ack_index, pair.complete.index],
                    "acked_offset": acked_offset,
                    "high_watermark": answer["high_watermark"],
                    "node": pair.invoke.node,
                },
            )


def _check_replicas(verdict: Verdict, replica_reads: list[Pair]) -> None:
    """Every node's own replica must hold the same bytes over the range all of them hold
    (the same end_offset): one SHA-256 per partition and end."""
    digests: dict[tuple[int, int], dict[str, tuple[str, int]]] = defaultdict(dict)
    for pair in replica_reads:
        if pair.complete is None or pair.type != "ok":
            continue
        done = pair.complete.value
        key = (int(done["partition"]), int(done["end_offset"]))
        digests[key][str(pair.invoke.node)] = (str(done["sha256"]), pair.complete.index)
    for (part, end), by_node in sorted(digests.items()):
        if len({digest for digest, _ in by_node.values()}) > 1:
            verdict.flag(
                "replica-divergence",
                {
                    "partition": part,
                    "end_offset": end,
                    "sha256": {node: digest[:16] for node, (digest, _) in by_node.items()},
                    "ops": sorted(index for _, index in by_node.values()),
                },
            )

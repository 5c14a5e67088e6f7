"""The delayed-delivery checker: each scheduled record delivered exactly once, never
before its deliver_at, a cancelled one never (jepsen/delay.py writes the history).

Operations: `send-delayed` ok `{value, deliver_at, id}` (the broker scheduled it);
`cancel` ok `{value}` (it was pending and is not any more); `poll` and `final-poll` ok
`{records: [[offset, value]], wall_ms}` where `wall_ms` is the harness's wall clock
when the answer arrived (the same clock as deliver_at: one machine). Anomalies:

- `early`: a record in a poll that completed before its deliver_at;
- `duplicated`: one value at two offsets;
- `lost`: a scheduled (ok), not cancelled value missing from the final read;
- `cancelled-delivered`: a value whose cancel was ok, in the log;
- `unexpected`: a value in the log that no send-delayed invoked.
"""

from __future__ import annotations

from typing import Any

from jepsen.checker import Verdict
from jepsen.history import Op


def check_delay(ops: list[Op]) -> Verdict:
    verdict = Verdict()
    invoked: set[str] = set()
    scheduled: dict[str, int] = {}  # value -> deliver_at
    cancelled: set[str] = set()
    offsets: dict[str, int] = {}
    final: set[str] | None = None
    early = 0
    for op in ops:
        if op.f == "send-delayed" and op.type == "invoke":
            invoked.add(op.value["value"])
        elif op.f == "send-delayed" and op.type == "ok":
            scheduled[op.value["value"]] = int(op.value["deliver_at"])
        elif op.f == "cancel" and op.type == "ok":
            cancelled.add(op.value["value"])
    for op in ops:
        if op.f not in ("poll", "final-poll") or op.type != "ok":
            continue
        seen_here: set[str] = set()
        for offset, value in op.value["records"]:
            _check_record(verdict, op, offset, value, offsets, invoked)
            seen_here.add(value)
            at = scheduled.get(value)
            if at is not None and op.value["wall_ms"] < at:
                early += 1
                verdict.flag("early", {"op": op.index, "value": value,
                                       "ms_early": at - op.value["wall_ms"]})  # fmt: skip
        if op.f == "final-poll":
            final = seen_here
    if final is None:
        verdict.flag("no-final-read", {})
        final = set()
    for value in sorted(set(scheduled) - cancelled - final):
        verdict.flag("lost", {"value": value, "deliver_at": scheduled[value]})
    for value in sorted(cancelled & set(offsets)):
        verdict.flag("cancelled-delivered", {"value": value, "offset": offsets[value]})
    verdict.stats = {
        "scheduled": len(scheduled),
        "cancelled": len(cancelled),
        "delivered": len(offsets),
        "early": early,
    }
    return verdict


def _check_record(
    verdict: Verdict, op: Op, offset: int, value: str, offsets: dict[str, int], invoked: set[str]
) -> None:
    known = offsets.setdefault(value, offset)
    if known != offset:
        verdict.flag("duplicated", {"op": op.index, "value": value, "offsets": [known, offset]})
    if value not in invoked:
        verdict.flag("unexpected", {"op": op.index, "value": value, "offset": offset})


def summary(verdict: Verdict) -> dict[str, Any]:
    return {
        "valid": verdict.valid,
        "anomalies": {k: len(v) for k, v in verdict.anomalies.items()},
        "stats": verdict.stats,
    }

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

A cancel whose outcome is unknown (info: a timeout under a fault) may or may not have
cancelled its record: that value is neither `lost` when missing nor `cancelled-delivered`
when present. `NAMES` are the operation names of the standalone `python -m jepsen.delay`;
`RUN_NAMES` those of the delayed workload inside `python -m jepsen.run --delay-workers`
(prefixed, so that the log workload's `poll` and `final-poll` are not taken for them).
"""

from __future__ import annotations

from typing import Any

from jepsen.checker import Verdict
from jepsen.history import Op

NAMES = {"send": "send-delayed", "cancel": "cancel", "poll": "poll", "final": "final-poll"}
RUN_NAMES = {k: f"delay-{v}" for k, v in NAMES.items()}


def check_delay(ops: list[Op], names: dict[str, str] = NAMES) -> Verdict:
    verdict = Verdict()
    invoked: set[str] = set()
    scheduled: dict[str, int] = {}  # value -> deliver_at
    cancelled: set[str] = set()
    cancel_tried: set[str] = set()  # every cancel invoked: ok, fail or unknown
    offsets: dict[str, int] = {}
    final: set[str] | None = None
    early = 0
    send, cancel, poll, final_f = names["send"], names["cancel"], names["poll"], names["final"]
    for op in ops:
        if op.f == send and op.type == "invoke":
            invoked.add(op.value["value"])
        elif op.f == send and op.type == "ok":
            scheduled[op.value["value"]] = int(op.value["deliver_at"])
        elif op.f == cancel and op.type == "invoke":
            cancel_tried.add(op.value["value"])
        elif op.f == cancel and op.type == "ok":
            cancelled.add(op.value["value"])
    uncertain = (
        cancel_tried
        - cancelled
        - {op.value["value"] for op in ops if op.f == cancel and op.type == "fail"}
    )
    for op in ops:
        if op.f not in (poll, final_f) or op.type != "ok":
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
        if op.f == final_f:
            final = seen_here
    if final is None:
        verdict.flag("no-final-read", {})
        final = set()
    for value in sorted(set(scheduled) - cancelled - uncertain - final):
        verdict.flag("lost", {"value": value, "deliver_at": scheduled[value]})
    for value in sorted(cancelled & set(offsets)):
        verdict.flag("cancelled-delivered", {"value": value, "offset": offsets[value]})
    verdict.stats = {
        "scheduled": len(scheduled),
        "cancelled": len(cancelled),
        "cancel_unknown": len(uncertain),
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

"""Proves the delayed-delivery workload and checker (jepsen/delay.py,
jepsen/checker/delay.py):

- on golden histories, a valid one passes and each anomaly is flagged with exactly its
  type: a record polled before its deliver_at (early), one value at two offsets
  (duplicated), a scheduled record missing from the final read (lost), a cancelled one
  delivered, a value nobody sent;
- a cancel whose outcome is unknown makes its record neither lost when missing nor
  cancelled-delivered when present; a refused cancel (fail) leaves it due (lost if
  missing);
- with jepsen.run's names (RUN_NAMES, `delay-` prefixed) the same history is checked the
  same, and the log workload's own `poll` / `final-poll` operations are not read;
- live, on three real brokers with the partition leader killed (kill -9) and restarted
  mid-run: `python -m jepsen.delay` is valid (exit 0) with records scheduled, cancelled
  and delivered; with the planted bug `delay-early` (the release duty runs 2 s ahead)
  it is invalid (exit 1) and the checker names `early`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from jepsen.checker import INVALID, VALID
from jepsen.checker.delay import NAMES, RUN_NAMES, check_delay
from jepsen.history import Op

ROOT = Path(__file__).resolve().parents[2]


class H:
    def __init__(self) -> None:
        self.ops: list[Op] = []

    def extend(self, other: H) -> H:
        self.ops += other.ops
        return self

    def add(self, type_: str, f: str, value: Any) -> H:
        self.ops.append(Op(len(self.ops), float(len(self.ops)), 0, type_, f, "n1", value))
        return self

    def send(self, value: str, deliver_at: int, ok: bool = True) -> H:
        self.add("invoke", "send-delayed", {"value": value, "delay_ms": 1})
        if ok:
            self.add("ok", "send-delayed", {"value": value, "deliver_at": deliver_at, "id": "x"})
        return self

    def poll(self, records: list[list[Any]], wall_ms: int, f: str = "poll") -> H:
        self.add("invoke", f, {"partition": 0, "offset": 0})
        return self.add("ok", f, {"partition": 0, "records": records, "wall_ms": wall_ms})


def base() -> H:
    h = H().send("a", 1_000).send("b", 2_000).send("c", 3_000, ok=False).send("d", 4_000)
    h.add("invoke", "cancel", {"value": "d"}).add("ok", "cancel", {"value": "d"})
    return h.poll([[0, "a"]], 1_500).poll([[1, "b"], [2, "c"]], 3_100)


def test_a_valid_history_passes() -> None:
    v = check_delay(base().poll([[0, "a"], [1, "b"], [2, "c"]], 9_000, "final-poll").ops)
    assert v.valid == VALID, v.anomalies
    assert v.stats == {
        "scheduled": 3, "cancelled": 1, "cancel_unknown": 0, "delivered": 3, "early": 0,
    }  # fmt: skip


def test_an_unknown_cancel_is_neither_lost_nor_cancelled_delivered() -> None:
    final = [[0, "a"], [1, "b"], [2, "c"]]
    h = base().send("e", 5_000).add("invoke", "cancel", {"value": "e"})
    h.add("info", "cancel", {"value": "e", "error": "timeout"})
    for records in (final, [*final, [3, "e"]]):
        v = check_delay(H().extend(h).poll(records, 9_000, "final-poll").ops)
        assert v.valid == VALID and v.stats["cancel_unknown"] == 1, v.anomalies
    refused = base().send("e", 5_000).add("invoke", "cancel", {"value": "e"})
    refused.add("fail", "cancel", {"value": "e", "status": 404})
    v = check_delay(refused.poll(final, 9_000, "final-poll").ops)
    assert v.valid == INVALID and v.anomalies["lost"] == [{"value": "e", "deliver_at": 5_000}]


def test_run_names_check_the_same_and_leave_the_log_workloads_polls_alone() -> None:
    final = [[0, "a"], [1, "b"], [2, "c"]]
    for records, valid in ((final, VALID), ([[0, "a"], [2, "c"]], INVALID)):
        h = base().poll(records, 9_000, "final-poll")
        renamed = [
            Op(o.index, o.time, o.process, o.type, RUN_NAMES[k], o.node, o.value)
            for o in h.ops
            for k, name in NAMES.items()
            if o.f == name
        ]
        # the log workload's operations of the same names, with values nobody scheduled
        log = H().poll([[0, "x"], [0, "y"]], 1).poll([], 2, "final-poll").ops
        v = check_delay([*renamed, *log], RUN_NAMES)
        assert v.valid == valid and v.stats["scheduled"] == 3, v.anomalies


def test_each_anomaly_is_flagged_with_its_type() -> None:
    final = [[0, "a"], [1, "b"], [2, "c"]]
    cases = {
        "early": base().poll([[3, "e"]], 10).send("e", 5_000).poll(final + [[3, "e"]], 9_000, "final-poll"),
        "duplicated": base().poll(final + [[3, "a"]], 9_000, "final-poll"),
        "lost": base().poll([[0, "a"], [2, "c"]], 9_000, "final-poll"),
        "cancelled-delivered": base().poll(final + [[3, "d"]], 9_000, "final-poll"),
        "unexpected": base().poll(final + [[3, "zz"]], 9_000, "final-poll"),
    }  # fmt: skip
    for kind, h in cases.items():
        v = check_delay(h.ops)
        assert v.valid == INVALID and set(v.anomalies) == {kind}, (kind, v.anomalies)


def run(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "jepsen.delay", "--dir", str(tmp_path), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    return proc.returncode, json.loads((tmp_path / "results.json").read_text())


def test_live_run_is_valid_and_the_planted_early_release_is_caught(tmp_path: Path) -> None:
    short = ["--delay-max-ms", "1500", "--kill-at-s", "1.0"]
    code, result = run(tmp_path / "ok", "--records", "50", *short)
    assert code == 0 and result["valid"] == VALID, result
    assert result["stats"]["delivered"] >= 30 and result["stats"]["cancelled"] >= 3
    code, result = run(tmp_path / "bug", "--records", "20", "--planted-bug", "delay-early", *short)
    assert code == 1 and result["valid"] == INVALID and "early" in result["anomalies"], result

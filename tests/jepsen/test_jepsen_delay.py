"""Proves the delayed-delivery workload and checker (jepsen/delay.py,
jepsen/checker/delay.py):

- on golden histories, a valid one passes and each anomaly is flagged with exactly its
  type: a record polled before its deliver_at (early), one value at two offsets
  (duplicated), a scheduled record missing from the final read (lost), a cancelled one
  delivered, a value nobody sent;
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
from jepsen.checker.delay import check_delay
from jepsen.history import Op

ROOT = Path(__file__).resolve().parents[2]


class H:
    def __init__(self) -> None:
        self.ops: list[Op] = []

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
    assert v.stats == {"scheduled": 3, "cancelled": 1, "delivered": 3, "early": 0}


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

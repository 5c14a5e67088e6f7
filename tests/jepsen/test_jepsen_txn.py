"""Proves the transactional workload's checker (jepsen/checker/txn.py) and the harness with
it on real brokers:

- golden histories: a valid one (commits, an abort, an unknown commit seen whole) passes,
  and so does a read that saw part of a committed transaction before the end; each
  anomaly is flagged with exactly its type: aborted read, dirty read, non-atomic commit
  (in the final read), lost committed write, duplicate;
- the consume-transform-produce checker: exactly one output per input below the group's
  committed offset, none above (duplicate, lost, beyond-offset flagged);
- `python -m jepsen.run --txn-workers 3 --ctp` on 3 real brokers: valid under kill -9 of
  brokers (transactions and consume-transform-produce); invalid with each planted bug: `txn-partial-markers` (non-atomic commit / lost
  committed write) and `read-committed-leak` (dirty / aborted read).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jepsen.checker import INVALID, VALID
from jepsen.checker.txn import check_ctp, check_txn
from jepsen.history import Op

ROOT = Path(__file__).resolve().parents[2]


class H:
    """A transactional history builder: each call appends an invoke and its completion."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.t = 0.0

    def _op(self, proc: int, f: str, value: Any, type_: str, done: Any) -> H:
        for kind, v in (("invoke", value), (type_, done)):
            self.t += 1.0
            self.ops.append(Op(len(self.ops), self.t, proc, kind, f, "n1", v))
        return self

    def txn(self, name: str, parts: list[int], type_: str = "ok", decided: str = "commit") -> H:
        value = {"txn": name, "partitions": parts, "decision": decided}
        done = {**value, "decided": decided, "decide_at": self.t + 1.5}
        return self._op(1, "txn", value, type_, done)

    def read(self, seen: dict[int, list[str]], final: bool = False) -> H:
        done = {"partitions": {str(p): v for p, v in seen.items()}}
        return self._op(2, "txn-read", {}, "ok", {**done, **({"final": True} if final else {})})


def kinds(h: H) -> tuple[str, set[str]]:
    verdict = check_txn(h.ops)
    return verdict.valid, set(verdict.anomalies)


def valid_base() -> H:
    h = H().txn("T1", [0, 1]).txn("T2", [1, 2], "fail", "abort").txn("T3", [0, 2], "info")
    h.read({0: ["T1", "T3"], 1: ["T1"], 2: ["T3"]})
    return h


def test_a_valid_history_passes() -> None:
    h = valid_base().read({0: ["T1", "T3"], 1: ["T1"], 2: ["T3"]}, final=True)
    verdict = check_txn(h.ops)
    assert verdict.valid == VALID, verdict.anomalies
    assert verdict.stats["committed"] == 1 and verdict.stats["never_committed"] == 1


def test_each_anomaly_is_flagged_with_its_type() -> None:
    final = {0: ["T1"], 1: ["T1"], 2: []}
    assert kinds(valid_base().read({0: [], 1: ["T2"], 2: []}).read(final, final=True)) == (
        INVALID, {"aborted-read"},
    )  # fmt: skip
    dirty = H()
    dirty.ops.append(Op(0, 0.5, 1, "invoke", "txn", "n1", {"txn": "T9", "partitions": [0, 1]}))
    dirty.t = 1.0
    dirty.read({0: ["T9"], 1: []})  # completes at 3.0, before T9's decision at 9.5
    dirty.t = 8.0
    dirty.ops.append(
        Op(3, 10.0, 1, "ok", "txn", "n1", {"txn": "T9", "partitions": [0, 1], "decide_at": 9.5})
    )
    dirty.t = 11.0
    assert kinds(dirty.read({0: ["T9"], 1: ["T9"]}, final=True)) == (INVALID, {"dirty-read"})
    # Part of T1 before the end is allowed (an older open transaction may hold the LSO
    # back in one partition); in the final read it is not.
    partial = valid_base().read({0: ["T1"], 1: [], 2: []})
    assert kinds(partial.read({0: ["T1"], 1: ["T1"]}, final=True))[0] == VALID
    assert kinds(valid_base().read({0: ["T1"], 1: []}, final=True)) == (
        INVALID, {"non-atomic-commit"},
    )  # fmt: skip
    assert kinds(valid_base().read({0: [], 1: [], 2: []}, final=True)) == (
        INVALID, {"lost-committed-write"},
    )  # fmt: skip
    assert kinds(valid_base().read({0: ["T1", "T1"], 1: ["T1"]}, final=True)) == (
        INVALID, {"duplicate"},
    )  # fmt: skip


def ctp_final(committed: int, outputs: list[int]) -> list[Op]:
    value = {"committed": committed, "outputs": [f"o:i{n}" for n in outputs]}
    return [
        Op(0, 1.0, 5, "invoke", "ctp-final", "n1", {}),
        Op(1, 2.0, 5, "ok", "ctp-final", "n1", value),
    ]


def test_consume_transform_produce_checker() -> None:
    assert check_ctp(ctp_final(3, [0, 2, 1])).valid == VALID
    for outputs, kind in (
        ([0, 1, 1, 2], "ctp-duplicate-output"),
        ([0, 2], "ctp-lost-output"),
        ([0, 1, 2, 3], "ctp-output-beyond-offset"),
    ):
        verdict = check_ctp(ctp_final(3, outputs))
        assert (verdict.valid, set(verdict.anomalies)) == (INVALID, {kind})
    assert check_ctp([]).valid == "unknown"


def run_harness(tmp_path: Path, *args: str, timeout_s: float) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "jepsen.run", "--dir", str(tmp_path), "--nodes", "3",
         "--group-workers", "0", "--workers-per-node", "1", "--txn-workers", "3", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.returncode, json.loads((tmp_path / "results.json").read_text()), proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_transactions_under_kills_are_valid(tmp_path: Path) -> None:
    code, doc, out = run_harness(
        tmp_path, "--nemesis", "kill", "--time-limit-s", "20", "--seed", "4",
        "--fault-interval-s", "4", "6", "--ctp", timeout_s=280,
    )  # fmt: skip
    assert code == 0, out
    stats = doc["checkers"]["txn"]["stats"]
    assert stats["committed"] > 10 and stats["reads_ok"] > 5 and stats["final_reads"] == 1, stats
    ctp = doc["checkers"]["ctp"]["stats"]  # consume-transform-produce: exactly once
    assert ctp["steps_ok"] > 5 and ctp["committed_offset"] == ctp["outputs"] > 0, ctp
    assert len(doc["unavailability"]) >= 1, "faults must have happened"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("bug", "expected"),
    [
        ("txn-partial-markers", {"txn:non-atomic-commit", "txn:lost-committed-write"}),
        ("read-committed-leak", {"txn:dirty-read", "txn:aborted-read"}),
    ],
)
def test_each_planted_transaction_bug_is_caught(
    tmp_path: Path, bug: str, expected: set[str]
) -> None:
    # 5 s: alone, 4 s of either bug give 19 or more anomalies (8 s: 36 or more).
    code, doc, out = run_harness(
        tmp_path, "--nemesis", "none", "--time-limit-s", "5", "--seed", "3",
        "--planted-bug", bug, timeout_s=280,
    )  # fmt: skip
    assert code == 1, out
    assert set(doc["anomalies"]) & expected, doc["anomalies"]

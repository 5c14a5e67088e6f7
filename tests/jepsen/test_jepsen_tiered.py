"""Proves `python -m jepsen.run --tiered` (jepsen/tiered.py) on 3 real brokers sharing a
file:// object store, the run's topic with 4 KiB segments and a local retention of 0 bytes,
under kill -9 of brokers:

- the correct build is valid, and the run did go through tiered storage: segments were
  uploaded and deleted locally (the leader's log starts above 0 at the end), the remote
  part reaches the local log, and the final reads from offset 0 read the store;
- the planted `tiered-delete-before-upload` (local retention deletes segments before the
  committed remote add records them) is caught: invalid, with acknowledged records lost
  (`log:lost-write`), the final read going on past the gap from the log's new start.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_harness(
    tmp_path: Path, *args: str, time_limit_s: int = 20
) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "jepsen.run", "--dir", str(tmp_path), "--nodes", "3", "--tiered",
         "--nemesis", "kill", "--time-limit-s", str(time_limit_s), "--fault-interval-s", "4", "6",
         "--group-workers", "0", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.returncode, json.loads((tmp_path / "results.json").read_text()), proc.stdout


def tiered_status(tmp_path: Path) -> dict[str, Any]:
    for line in (tmp_path / "history.jsonl").read_text().splitlines():
        op = json.loads(line)
        if op.get("f") == "tiered-status":
            return dict(op["value"])
    raise AssertionError("no tiered-status in the history")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_tiered_run_under_kills_is_valid_and_reads_through_the_store(tmp_path: Path) -> None:
    code, doc, out = run_harness(tmp_path, "--seed", "2")
    assert code == 0, out
    assert doc["valid"] == "valid" and doc["anomalies"] == {}
    stats = doc["checkers"]["log"]["stats"]
    assert stats["sends_ok"] > 100 and stats["records_read"] > 100, stats
    assert len(doc["unavailability"]) >= 1, "faults must have happened"
    status = tiered_status(tmp_path)
    for part in status["partitions"]:  # uploaded, deleted locally, and reaching the local log
        assert part["remote_end_offset"] and part["remote_end_offset"] > 0, part
        assert part["remote_bytes"] > 0 and part["local_bytes"] < 8 * 4096, part
    reads = sum(c.get("dmq_tiered_remote_reads_total", 0) for c in status["brokers"].values())
    assert reads > 0, status["brokers"]
    assert any((tmp_path / "remote").rglob("*.log")), "nothing in the object store"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_deleting_before_the_upload_is_recorded_is_caught(tmp_path: Path) -> None:
    # 10 s: the bug loses hundreds of acknowledged records in that time, faults or none.
    code, doc, out = run_harness(
        tmp_path, "--seed", "2", "--planted-bug", "tiered-delete-before-upload", time_limit_s=10
    )
    assert code == 1, out
    assert doc["anomalies"].get("log:lost-write", {}).get("count", 0) > 0, doc["anomalies"]
    assert "reproduce with --seed 2" in out

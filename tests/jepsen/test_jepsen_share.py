"""Proves the share-group checker (jepsen/checker/share.py) and workload (jepsen/share.py):

- on golden histories: a valid history (a redelivery after a lock ran out, a 409 ack, an
  unknown accept, a dead letter) passes; each anomaly is flagged with exactly its type: a
  record accepted twice, two deliveries holding one lock at once (same delivery_count,
  or a later poll with no higher count), an accepted record delivered again, an
  acknowledged send neither accepted nor dead-lettered, a dead letter written twice;
- live, on real brokers: a run with kill -9 of the metadata leader and share members is
  valid with something at stake; the same pipeline on a build with the planted bug
  share-double-delivery fails (exit 1) with overlapping-delivery.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jepsen.checker import INVALID, VALID
from jepsen.checker.share import check_share
from jepsen.history import Op

ROOT = Path(__file__).resolve().parents[2]


class S:
    """A share-history builder: each call appends an invoke and its completion."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.t = 0.0

    def op(self, proc: int, f: str, value: Any, type_: str = "ok", done: Any = None) -> S:
        for kind, v in (("invoke", value), (type_, value if done is None else done)):
            self.t += 1.0
            self.ops.append(Op(len(self.ops), self.t, proc, kind, f, "n1", v))
        return self

    def send(self, offset: int, value: str) -> S:
        return self.op(0, "send", {"partition": 0, "value": value},
                       done={"partition": 0, "value": value, "offset": offset})  # fmt: skip

    def poll(self, proc: int, records: list[tuple[int, str, int]]) -> S:
        done = {"member_id": f"m{proc}", "records": [[0, o, v, c] for o, v, c in records]}
        return self.op(proc, "share-poll", {"member_id": f"m{proc}"}, done=done)

    def ack(self, proc: int, offsets: list[int], kind: str = "accept", type_: str = "ok") -> S:
        value = {"member_id": f"m{proc}", "acks": [[0, o, kind] for o in offsets]}
        return self.op(proc, "share-ack", value, type_)

    def dlq(self, offsets: list[int]) -> S:
        return self.op(
            9, "share-dlq", {}, done={"records": [[0, o, "v", "rejected"] for o in offsets]}
        )


def valid_base() -> S:
    s = S().send(0, "a").send(1, "b").send(2, "c").send(3, "d")
    s.poll(1, [(0, "a", 1), (1, "b", 1)]).poll(2, [(2, "c", 1), (3, "d", 1)])
    s.ack(1, [0]).ack(2, [3], "reject")  # member 1 dies holding "b"
    s.ack(2, [2], type_="info")  # unknown: it may have been accepted
    s.poll(2, [(1, "b", 2)]).ack(1, [1], type_="fail").ack(2, [1])  # 1's lock ran out: 409
    return s


def kinds(s: S) -> tuple[str, set[str]]:
    verdict = check_share(s.ops)["share"]
    return verdict.valid, set(verdict.anomalies)


def test_a_valid_history_passes() -> None:
    verdict = check_share(valid_base().dlq([3]).ops)["share"]
    assert verdict.valid == VALID, verdict.anomalies
    assert verdict.stats["redeliveries"] == 1 and verdict.stats["drained"] is True


def test_each_anomaly_is_flagged_with_its_type() -> None:
    assert kinds(valid_base().ack(1, [0]).dlq([3])) == (INVALID, {"double-accept"})
    same_count = valid_base().poll(3, [(1, "b", 2)]).dlq([3])
    assert kinds(same_count) == (INVALID, {"overlapping-delivery", "accepted-redelivered"})
    stale = S().send(0, "a").poll(1, [(0, "a", 2)]).poll(2, [(0, "a", 1)])
    assert kinds(stale) == (INVALID, {"overlapping-delivery"})
    again = valid_base().poll(3, [(0, "a", 2)]).dlq([3])
    assert kinds(again) == (INVALID, {"accepted-redelivered"})
    assert kinds(valid_base().dlq([])) == (INVALID, {"lost"})  # "d" was never dead-lettered
    assert kinds(valid_base().dlq([3, 3])) == (INVALID, {"dead-letter-duplicate"})
    assert kinds(valid_base().dlq([3, 0])) == (INVALID, {"accepted-and-dead-lettered"})
    wrong = S().send(0, "a").poll(1, [(0, "z", 1)])
    assert kinds(wrong) == (INVALID, {"unexpected"})


def locked(s: S, proc: int, offset: int, count: int, until: int, wall_ms: int) -> S:
    """A poll whose record carries its lock (locked_until) and the poll's end (wall_ms)."""
    done = {"member_id": f"m{proc}", "records": [[0, offset, "a", count, until]],
            "wall_ms": wall_ms}  # fmt: skip
    return s.op(proc, "share-poll", {"member_id": f"m{proc}"}, done=done)


def test_a_lock_cut_short_is_flagged_unless_its_holder_let_go() -> None:
    def history(between: Any = None) -> S:
        s = locked(S().send(0, "a"), 1, 0, 1, until=10_000, wall_ms=5_000)
        if between is not None:
            between(s)
        return locked(s, 2, 0, 2, until=18_000, wall_ms=8_000).ack(2, [0]).dlq([])

    assert kinds(history()) == (INVALID, {"lock-cut-short"})  # m1's lock ran to 10_000
    assert kinds(history(lambda s: s.ack(1, [0], "release"))) == (VALID, set())
    assert kinds(history(lambda s: s.ack(1, [0], "release", type_="info"))) == (VALID, set())
    assert kinds(history(lambda s: s.op(1, "share-leave", {"member_id": "m1"}))) == (VALID, set())
    assert kinds(history(lambda s: s.op(1, "share-ack", {"member_id": "m1", "acks": [
        [0, 5, "release"]]}))) == (INVALID, {"lock-cut-short"})  # fmt: skip  # another record
    late = locked(locked(S().send(0, "a"), 1, 0, 1, 10_000, 5_000), 2, 0, 2, 18_000, 10_001)
    assert kinds(late.ack(2, [0]).dlq([])) == (VALID, set())  # after the lock ran out
    clocks = history(lambda s: s.ops.append(Op(len(s.ops), s.t, "nemesis", "info", "start-clock",
                                              None, {})))  # fmt: skip
    assert kinds(clocks) == (VALID, set())  # the brokers' clocks were moved: not checked


def test_nothing_is_lost_before_the_drain_proves_it() -> None:
    assert kinds(valid_base()) == (VALID, set())  # no share-dlq: the run did not settle


def run_harness(tmp_path: Path, *args: str, timeout_s: float) -> tuple[int, dict[str, Any], str]:
    cmd = [sys.executable, "-m", "jepsen.run", "--dir", str(tmp_path), "--nodes", "3",
           "--group-workers", "0", "--share-workers", "3", "--workers-per-node", "1", *args]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    print(done.stdout[-3000:], done.stderr[-3000:])
    return done.returncode, json.loads((tmp_path / "results.json").read_text()), done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_share_run_with_kills_is_valid(tmp_path: Path) -> None:
    code, doc, out = run_harness(
        tmp_path, "--nemesis", "kill", "--time-limit-s", "20", "--seed", "3",
        "--fault-interval-s", "5", "7", timeout_s=280,
    )  # fmt: skip
    assert code == 0, out
    share = doc["checkers"]["share"]
    assert share["valid"] == "valid" and share["stats"]["drained"] is True, share
    stats = share["stats"]
    assert stats["acknowledged_sends"] > 100 and stats["accepted"] > 100, stats
    assert stats["redeliveries"] > 0 and stats["dead_lettered"] > 0, stats
    assert any(u["fault"].startswith("kill") for u in doc["unavailability"]), doc["unavailability"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_planted_share_double_delivery_fails_the_run(tmp_path: Path) -> None:
    # 5 s: alone, 4 s give 24 overlapping deliveries (8 s: 54).
    code, doc, out = run_harness(
        tmp_path, "--nemesis", "none", "--time-limit-s", "5", "--seed", "5",
        "--planted-bug", "share-double-delivery", timeout_s=280,
    )  # fmt: skip
    assert code == 1, out
    assert "share:overlapping-delivery" in doc["anomalies"], doc["anomalies"]

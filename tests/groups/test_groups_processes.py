"""Consumer groups with real consumer processes (tests/groups/group_consumer_proc.py, the
Python client's `Consumer(group=...)`) against a real broker process. Proves that:

- 3 consumers in one group over 6 partitions each get 2, and together receive every
  record exactly once in a clean run (no member dies, records produced once stable);
- after kill -9 of one consumer its partitions move to the others within the session
  timeout (plus the expiry check and a heartbeat), and nothing is lost: every record
  produced before and after the kill is received (at-least-once: the dead member's
  uncommitted records may come twice, never zero times);
- two groups on one topic each receive everything (pub-sub).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dmq.client import Consumer, Producer
from tests_support import BrokerProcess

PROC = Path(__file__).with_name("group_consumer_proc.py")
SESSION_MS = 2_000


def start_consumer(url: str, group: str, topic: str, out: Path) -> subprocess.Popen[bytes]:
    with open(out.with_suffix(".err"), "ab") as err:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, str(PROC), url, group, topic, str(out), str(SESSION_MS)],
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip


def received(out: Path) -> list[tuple[int, int]]:
    if not out.exists():
        return []
    lines = out.read_text().splitlines()
    return [(int(a), int(b)) for a, b, *_ in (line.split(" ", 2) for line in lines)
            if a.isdigit()]  # fmt: skip


def wait_until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def stable_with(broker: BrokerProcess, group: str, members: int) -> dict[str, Any] | None:
    status, doc = broker.json("GET", f"/v1/groups/{group}")
    if status != 200 or doc["state"] != "stable" or doc["member_count"] != members:
        return None
    return doc


def produce(url: str, topic: str, start: int, count: int) -> None:
    with Producer(url, linger_ms=2) as producer:
        futures = [
            producer.send(topic, f"r{i}", partition=i % 6) for i in range(start, start + count)
        ]
        for f in futures:
            f.result()


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_three_consumers_share_six_partitions_exactly_once(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    assert broker.json("POST", "/v1/topics", {"name": "q", "partitions": 6})[0] == 201
    outs = [tmp_path / f"c{i}.txt" for i in range(3)]
    procs = [start_consumer(broker.url, "g", "q", out) for out in outs]
    try:
        doc = wait_until(lambda: stable_with(broker, "g", 3), 30, "3 members, stable")
        assert sorted(len(m["assignment"]) for m in doc["members"]) == [2, 2, 2]
        produce(broker.url, "q", 0, 600)
        wait_until(lambda: sum(len(received(o)) for o in outs) >= 600, 30, "600 records")
        time.sleep(0.5)  # anything extra (a duplicate) would arrive now
        got = [r for o in outs for r in received(o)]
        assert len(got) == 600 and len(set(got)) == 600  # every record exactly once
        for o in outs:
            assert len({p for p, _ in received(o)}) == 2  # each consumer read its 2 partitions
    finally:
        stop_all(procs)
    status, doc = broker.json("GET", "/v1/groups/g")
    assert doc["state"] == "empty" and all(p["lag"] == 0 for p in doc["partitions"]), doc


def test_kill9_moves_partitions_within_the_session_and_loses_nothing(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    assert broker.json("POST", "/v1/topics", {"name": "k", "partitions": 6})[0] == 201
    outs = [tmp_path / f"c{i}.txt" for i in range(3)]
    procs = [start_consumer(broker.url, "g", "k", out) for out in outs]
    try:
        wait_until(lambda: stable_with(broker, "g", 3), 30, "3 members, stable")
        produce(broker.url, "k", 0, 300)
        wait_until(lambda: sum(len(received(o)) for o in outs) >= 300, 30, "300 records")
        procs[0].kill()
        procs[0].wait()
        killed_at = time.monotonic()
        doc = wait_until(lambda: stable_with(broker, "g", 2), 30, "2 members, stable")
        moved_s = time.monotonic() - killed_at
        assert sorted(len(m["assignment"]) for m in doc["members"]) == [3, 3]
        # Expiry lands within session + check period; the survivors' next heartbeat
        # (a third of the session) picks the partitions up.
        assert moved_s < SESSION_MS / 1000 * 2 + 1, moved_s
        produce(broker.url, "k", 300, 300)
        expected = {(i % 6, i // 6) for i in range(600)}

        def all_received() -> bool:
            return {r for o in outs for r in received(o)} >= expected

        wait_until(all_received, 30, "every record, before and after the kill")
        counts = Counter(r for o in outs for r in received(o))
        assert set(counts) == expected  # nothing lost, nothing invented
    finally:
        stop_all(procs)


def test_two_groups_on_one_topic_each_receive_everything(broker: BrokerProcess) -> None:
    assert broker.json("POST", "/v1/topics", {"name": "ps", "partitions": 6})[0] == 201
    produce(broker.url, "ps", 0, 120)
    for group in ("billing", "audit"):
        got: list[str] = []
        with Consumer(broker.url, group=group, topics=["ps"]) as consumer:
            deadline = time.monotonic() + 20
            while len(got) < 120 and time.monotonic() < deadline:
                got += [r.value.decode() for r in consumer.poll(timeout_ms=500) if r.value]
        assert sorted(got) == sorted(f"r{i}" for i in range(120)), group
    for group in ("billing", "audit"):
        status, doc = broker.json("GET", f"/v1/groups/{group}/offsets")
        assert sum(o["offset"] for o in doc["offsets"]) == 120

"""Share groups (queues) end to end on one real broker process, over HTTP and the client.

Proves that:
- four members polling one partition at once get disjoint records that together are
  every record, each accepted once; the group then has nothing in flight;
- a member process killed with SIGKILL without acknowledging has its records redelivered
  to another member once its lock runs out (not before), with delivery_count 2;
- a rejected record and one released max_delivery_attempts times each end in the group's
  dead-letter topic exactly once, with headers naming source topic, partition, offset,
  delivery count and reason; describe counts them;
- an ack of a record whose lock expired, or that another member holds, is refused with
  409 lock_not_held and changes nothing (the valid part of the same request is not
  applied either); release with delay_ms is not offered before the delay;
- bad input gets a 400 naming the field and its limit (a session shorter than the lock,
  a dead-letter topic no topic may be named, a group whose "<group>.dlq" is too long);
- a dead letter too large, or with too many headers, for the dead-letter topic is
  truncated (dmq.dlq.truncated) rather than stopping the dead letters of every group;
- a long-poll on a full window (more records in the log) sleeps rather than spins: the
  broker's CPU time over the poll stays well below its wait;
- a redelivery the poll could not read (past max_bytes) is left out of the reply, never
  handed over with no value, and comes again whole once its lock runs out; DELETE of a member releases its
  locks at once;
- accepted records are never offered again after the broker is killed with SIGKILL and
  restarted (the state is in the metadata group's journal);
- a filtered poll (`tags=`, `filter=`) acquires only matching records; the others are
  skipped for the group as consumed (an unfiltered poll afterwards gets none of them),
  a long-poll waits through non-matching records for the next match, and a bad filter
  is a 400 naming the parameter and the column.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

from bench.cpu import process_cpu_s
from dmq.client import ShareConsumer
from tests_support import ROOT, BrokerProcess


def call(broker: BrokerProcess, method: str, path: str, body: dict[str, Any] | None = None,
         expect: int = 200) -> Any:  # fmt: skip
    status, doc = broker.json(method, path, body)
    assert status == expect, (method, path, status, doc)
    return doc


def setup(broker: BrokerProcess, group: str, count: int, **config: Any) -> None:
    call(broker, "POST", "/v1/topics", {"name": "jobs", "partitions": 1}, expect=201)
    records = [{"value": f"job-{i}"} for i in range(count)]
    call(broker, "POST", "/v1/topics/jobs/records", {"records": records})
    call(broker, "PUT", f"/v1/share-groups/{group}", config)


def join(broker: BrokerProcess, group: str, topic: str = "jobs") -> str:
    doc = call(broker, "POST", f"/v1/share-groups/{group}/members", {"topics": [topic]}, 201)
    return str(doc["member_id"])


def poll(broker: BrokerProcess, group: str, member: str, max_records: int = 100,
         wait_ms: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    path = f"/v1/share-groups/{group}/members/{member}/records"
    doc = call(broker, "GET", f"{path}?max_records={max_records}&wait_ms={wait_ms}")
    return list(doc["records"])


def ack(broker: BrokerProcess, group: str, member: str, offsets: list[int], kind: str,
        expect: int = 200, delay_ms: int = 0) -> Any:  # fmt: skip
    body = {"acks": [{"topic": "jobs", "partition": 0, "offsets": offsets, "type": kind,
                      "delay_ms": delay_ms}]}  # fmt: skip
    return call(broker, "POST", f"/v1/share-groups/{group}/members/{member}/acks", body, expect)


def test_four_members_on_one_partition_get_disjoint_records(broker: BrokerProcess) -> None:
    setup(broker, "workers", 200)
    got: dict[int, list[int]] = {i: [] for i in range(4)}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with ShareConsumer(broker.url, "workers", ["jobs"], max_records=5) as consumer:
                idle = 0
                while idle < 3:
                    records = consumer.poll(timeout_ms=300)
                    idle = 0 if records else idle + 1
                    for r in records:
                        assert r.delivery_count == 1
                        got[i].append(r.offset)
                        time.sleep(0.002)  # "processing"
                        consumer.accept(r)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    every = [o for offsets in got.values() for o in offsets]
    assert sorted(every) == list(range(200)), "each record exactly once, none missing"
    assert all(got[i] for i in range(4)), {i: len(v) for i, v in got.items()}
    (row,) = call(broker, "GET", "/v1/share-groups/workers")["partitions"]
    assert (row["start_offset"], row["in_flight"], row["accepted"]) == (200, 0, 200), row


def test_a_killed_member_s_records_go_to_another_after_the_lock(broker: BrokerProcess) -> None:
    setup(broker, "g", 3, lock_duration_ms=2_000)
    script = (
        "import sys, time\n"
        "from dmq.client import ShareConsumer\n"
        "c = ShareConsumer(sys.argv[1], 'g', ['jobs'])\n"
        "print(','.join(str(r.offset) for r in c.poll(timeout_ms=5000)), flush=True)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen([sys.executable, "-c", script, broker.url], cwd=ROOT,
                          stdout=subprocess.PIPE, text=True) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            taken = [int(o) for o in proc.stdout.readline().strip().split(",")]
            killed = time.monotonic()
        finally:
            proc.kill()
            proc.wait()
    assert taken == [0, 1, 2]
    other = join(broker, "g")
    assert poll(broker, "g", other) == []  # still locked to the dead member
    again = poll(broker, "g", other, wait_ms=5_000)
    waited = time.monotonic() - killed
    assert [(r["offset"], r["delivery_count"]) for r in again] == [(0, 2), (1, 2), (2, 2)]
    assert 1.0 < waited < 5.0, waited  # about the 2 s lock, no sooner
    ack(broker, "g", other, [0, 1, 2], "accept")


def test_poison_records_reach_the_dead_letter_topic_once(broker: BrokerProcess) -> None:
    setup(broker, "p", 3, lock_duration_ms=1_000, max_delivery_attempts=3)
    m = join(broker, "p")
    assert [r["offset"] for r in poll(broker, "p", m)] == [0, 1, 2]
    ack(broker, "p", m, [0], "reject")
    ack(broker, "p", m, [2], "accept")
    for attempt in (2, 3):  # released twice, then its third delivery runs out of attempts
        ack(broker, "p", m, [1], "release")
        (r,) = poll(broker, "p", m, wait_ms=2_000)
        assert (r["offset"], r["delivery_count"]) == (1, attempt)
    ack(broker, "p", m, [1], "release")
    assert poll(broker, "p", m, wait_ms=500) == []

    def dead_letters() -> list[dict[str, Any]]:
        doc = call(broker, "GET", "/v1/topics/p.dlq/partitions/0/records?wait_ms=0", expect=200)
        return list(doc["records"])

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status, _ = broker.json("GET", "/v1/topics/p.dlq")
        if status == 200 and len(dead_letters()) >= 2:
            break
        time.sleep(0.1)
    time.sleep(0.6)  # a few more dead-letter passes: nothing is written twice
    found = dead_letters()
    assert len(found) == 2, found
    headers = [{h["key"]: h["value"] for h in r["headers"]} for r in found]
    assert [r["value"] for r in found] == ["job-0", "job-1"]
    assert headers[0] == {"dmq.dlq.group": "p", "dmq.dlq.topic": "jobs",
                          "dmq.dlq.partition": "0", "dmq.dlq.offset": "0",
                          "dmq.dlq.delivery_count": "1", "dmq.dlq.reason": "rejected"}  # fmt: skip
    assert headers[1]["dmq.dlq.reason"] == "max_delivery_attempts"
    assert headers[1]["dmq.dlq.delivery_count"] == "3"
    (row,) = call(broker, "GET", "/v1/share-groups/p")["partitions"]
    assert (row["dead_lettered"], row["accepted"], row["start_offset"]) == (2, 1, 3), row


def test_acks_of_locks_not_held_are_refused_and_change_nothing(broker: BrokerProcess) -> None:
    setup(broker, "c", 4, lock_duration_ms=1_000)
    a, b = join(broker, "c"), join(broker, "c")
    assert [r["offset"] for r in poll(broker, "c", a, max_records=2)] == [0, 1]
    assert [r["offset"] for r in poll(broker, "c", b, max_records=1)] == [2]
    body = {
        "acks": [
            {"topic": "jobs", "partition": 0, "offsets": [0], "type": "accept"},
            {"topic": "jobs", "partition": 0, "offsets": [2], "type": "accept"},
        ]
    }
    status, doc = broker.json("POST", f"/v1/share-groups/c/members/{a}/acks", body)
    assert (status, doc["error"]["code"]) == (409, "lock_not_held"), doc
    ack(broker, "c", a, [0], "accept")  # offset 0 was still a's: nothing had changed
    released = time.monotonic()
    ack(broker, "c", a, [1], "release", delay_ms=1_500)
    assert [r["offset"] for r in poll(broker, "c", b)] == [3]  # 1 waits out its delay
    ack(broker, "c", b, [3], "accept")
    time.sleep(1.1)  # b's lock on 2 runs out
    status, doc = broker.json(
        "POST", f"/v1/share-groups/c/members/{b}/acks",
        {"acks": [{"topic": "jobs", "partition": 0, "offsets": [2], "type": "accept"}]},
    )  # fmt: skip
    assert (status, doc["error"]["code"]) == (409, "lock_not_held"), doc
    offered: dict[int, tuple[int, float]] = {}
    deadline = time.monotonic() + 5
    while len(offered) < 2 and time.monotonic() < deadline:
        for r in poll(broker, "c", b, wait_ms=300):
            offered[r["offset"]] = (r["delivery_count"], time.monotonic() - released)
    assert sorted(offered) == [1, 2], offered
    assert offered[2][0] == 2 and offered[1][0] == 2, offered
    assert offered[1][1] >= 1.4, offered  # not before its release delay
    call(broker, "DELETE", f"/v1/share-groups/c/members/{b}", expect=204)
    again = poll(broker, "c", a)  # b's locks were released when it left
    assert sorted(r["offset"] for r in again) == [1, 2], again


def test_bad_input_gets_a_400_naming_the_field(broker: BrokerProcess) -> None:
    status, doc = broker.json("PUT", "/v1/share-groups/g", {"lock_duration_ms": 5})
    assert status == 400 and doc["error"]["details"]["field"] == "lock_duration_ms", doc
    assert doc["error"]["details"]["limit"] == 1_000
    status, doc = broker.json("PUT", "/v1/share-groups/g", {"max_in_flight_records": 10**6})
    assert status == 400 and doc["error"]["details"]["limit"] == 10_000, doc
    status, doc = broker.json("PUT", "/v1/share-groups/g", {"colour": "red"})
    assert status == 400, doc
    status, doc = broker.json("POST", "/v1/share-groups/g/members", {"topics": []})
    assert status == 400 and doc["error"]["details"]["field"] == "topics", doc
    status, doc = broker.json("POST", "/v1/share-groups/g/members", {"topics": ["nope"]})
    assert status == 404, doc
    status, doc = broker.json("GET", "/v1/share-groups/g/members/x/records")
    assert status == 409 and doc["error"]["code"] == "unknown_member", doc
    status, doc = broker.json(  # an expired session would end its locks early
        "PUT", "/v1/share-groups/g", {"lock_duration_ms": 30_000, "session_timeout_ms": 20_000}
    )
    assert status == 400 and doc["error"]["details"]["field"] == "session_timeout_ms", doc
    assert "lock_duration_ms" in doc["error"]["message"], doc
    status, doc = broker.json("PUT", "/v1/share-groups/g", {"lock_duration_ms": 60_000})
    assert status == 400 and doc["error"]["details"]["field"] == "session_timeout_ms", doc
    status, doc = broker.json("PUT", "/v1/share-groups/g", {"dead_letter_topic": ".."})
    assert status == 400 and doc["error"]["details"]["field"] == "dead_letter_topic", doc
    status, doc = broker.json("PUT", "/v1/share-groups/" + "g" * 246, {})
    assert status == 400 and doc["error"]["details"]["field"] == "group", doc
    call(broker, "POST", "/v1/topics", {"name": "t", "partitions": 1}, expect=201)
    m = join(broker, "g", "t")
    status, doc = broker.json(
        "POST", f"/v1/share-groups/g/members/{m}/acks",
        {"acks": [{"topic": "t", "partition": -1, "offsets": [0], "type": "accept"}]},
    )  # fmt: skip
    assert status == 400 and doc["error"]["details"]["field"] == "acks[0].partition", doc


def dead_letters_of(broker: BrokerProcess, topic: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline and len(found) < count:
        status, doc = broker.json("GET", f"/v1/topics/{topic}/partitions/0/records?wait_ms=0")
        found = list(doc["records"]) if status == 200 else []
        time.sleep(0.1)
    return found


def test_dead_letters_that_cannot_be_written_whole_are_truncated(broker: BrokerProcess) -> None:
    """A record near its topic's max_record_bytes, and one with HEADER_COUNT_MAX headers:
    their dead letters (plus six dmq.dlq.* headers) cannot be written whole. Each is
    truncated (dmq.dlq.truncated), and the group after them gets its dead letters too."""
    topic = {"name": "big", "partitions": 1, "config": {"max_record_bytes": 2_000}}
    call(broker, "POST", "/v1/topics", topic, expect=201)
    headers = [{"key": f"h{i}", "value": "x"} for i in range(64)]
    records = [{"key": "k", "value": "v" * 1_990}, {"value": "w", "headers": headers}]
    call(broker, "POST", "/v1/topics/big/records", {"records": records})
    call(broker, "POST", "/v1/topics", {"name": "jobs", "partitions": 1}, expect=201)
    call(broker, "POST", "/v1/topics/jobs/records", {"records": [{"value": "job-0"}]})
    a = join(broker, "a", "big")  # groups go in name order: "a" before "b"
    assert [r["offset"] for r in poll(broker, "a", a)] == [0, 1]
    body = {"acks": [{"topic": "big", "partition": 0, "offsets": [0, 1], "type": "reject"}]}
    call(broker, "POST", f"/v1/share-groups/a/members/{a}/acks", body)
    b = join(broker, "b")
    assert [r["offset"] for r in poll(broker, "b", b)] == [0]
    ack(broker, "b", b, [0], "reject")
    assert [r["value"] for r in dead_letters_of(broker, "b.dlq", 1)] == ["job-0"]
    found = dead_letters_of(broker, "a.dlq", 2)
    assert len(found) == 2, found
    first = {h["key"]: h["value"] for h in found[0]["headers"]}
    assert (found[0]["key"], found[0]["value"]) == ("k", None), found[0]
    assert "max_record_bytes" in first["dmq.dlq.truncated"], first
    assert first["dmq.dlq.offset"] == "0" and first["dmq.dlq.reason"] == "rejected"
    second = found[1]
    keys = [h["key"] for h in second["headers"]]
    assert second["value"] == "w" and len(keys) == 64, keys  # 57 of its own, 7 of ours
    assert keys[:57] == [f"h{i}" for i in range(57)] and "dmq.dlq.truncated" in keys
    assert call(broker, "GET", "/v1/topics/a.dlq")["config"]["max_record_bytes"] == 2_000


def test_accepts_survive_a_kill_9_and_restart(broker: BrokerProcess) -> None:
    setup(broker, "d", 6)
    m = join(broker, "d")
    assert [r["offset"] for r in poll(broker, "d", m, max_records=4)] == [0, 1, 2, 3]
    ack(broker, "d", m, [0, 2], "accept")
    broker.kill9()
    broker.start()
    m2 = join(broker, "d")
    seen: list[int] = []
    deadline = time.monotonic() + 60  # the dead member's locks (30 s) or its expiry
    call(broker, "DELETE", f"/v1/share-groups/d/members/{m}", expect=204)
    while time.monotonic() < deadline and len(seen) < 4:
        got = poll(broker, "d", m2, wait_ms=1_000)
        seen += [r["offset"] for r in got]
        if got:
            ack(broker, "d", m2, [r["offset"] for r in got], "accept")
    assert sorted(seen) == [1, 3, 4, 5], seen  # 0 and 2 were accepted: never again


def test_the_cli_consumes_and_acknowledges(broker: BrokerProcess) -> None:
    setup(broker, "cli", 5)

    def dmq(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "dmq", *args, "--url", broker.url],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    configured = dmq(
        "share", "configure", "cli", "--max-delivery-attempts", "2", "--output", "json"
    )
    assert json.loads(configured)["max_delivery_attempts"] == 2, configured
    assert dmq("share", "consume", "cli", "jobs", "--max-records", "3").split() == [
        "job-0",
        "job-1",
        "job-2",
    ]
    assert dmq("share", "consume", "cli", "jobs").split() == ["job-3", "job-4"]
    described = dmq("share", "describe", "cli")
    assert "ACCEPTED" in described and " 5 " in described.splitlines()[-1], described
    assert "cli" in dmq("share", "list")


def test_the_client_releases_with_a_delay_and_rejects(broker: BrokerProcess) -> None:
    setup(broker, "rc", 3, lock_duration_ms=5_000)
    with ShareConsumer(broker.url, "rc", ["jobs"]) as consumer:
        a, b, c = consumer.poll(timeout_ms=2_000)
        consumer.release(a, delay_ms=800)
        consumer.reject(b)
        consumer.accept(c)
        assert consumer.commit() == 3
        released = time.monotonic()
        again = consumer.poll(timeout_ms=3_000)
        assert [(r.offset, r.delivery_count, r.value) for r in again] == [(0, 2, b"job-0")]
        assert time.monotonic() - released >= 0.7  # not before its delay
        consumer.accept(again[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the dead letter is written in the background
        (row,) = call(broker, "GET", "/v1/share-groups/rc")["partitions"]
        if row["dead_lettered"]:
            break
        time.sleep(0.1)
    assert (row["accepted"], row["dead_lettered"], row["start_offset"]) == (2, 1, 3), row


def cpu_s(broker: BrokerProcess) -> float:
    """The broker process's CPU time (user + system) so far."""
    assert broker.proc is not None
    return process_cpu_s(broker.proc.pid)


def test_a_poll_on_a_full_window_waits_without_spinning(broker: BrokerProcess) -> None:
    """The window is full (max_in_flight_records 1, its record locked) and the log has
    more records: a long-poll must sleep until a lock runs out or an ack comes, not read
    the log in a loop for its whole wait. Before the fix such a poll burnt a core."""
    setup(broker, "full", 5, max_in_flight_records=1, lock_duration_ms=10_000)
    m = join(broker, "full")
    assert [r["offset"] for r in poll(broker, "full", m)] == [0]
    before, started = cpu_s(broker), time.monotonic()
    assert poll(broker, "full", m, wait_ms=2_000) == []
    used, waited = cpu_s(broker) - before, time.monotonic() - started
    assert waited >= 1.9 and used < 0.5 * waited, (used, waited)


def test_a_filtered_poll_takes_matches_and_skips_the_rest_as_consumed(
    broker: BrokerProcess,
) -> None:
    call(broker, "POST", "/v1/topics", {"name": "jobs", "partitions": 1}, expect=201)
    records = [{"value": f"job-{i}", "headers": {"tag": "red" if i % 10 == 0 else "blue",
                                                 "n": str(i)}} for i in range(100)]  # fmt: skip
    call(broker, "POST", "/v1/topics/jobs/records", {"records": records})
    call(broker, "PUT", "/v1/share-groups/f", {})
    member = join(broker, "f")
    path = f"/v1/share-groups/f/members/{member}/records"
    got: list[int] = []
    for _ in range(20):
        doc = call(broker, "GET", f"{path}?max_records=4&tags=red")
        got += [r["offset"] for r in doc["records"]]
        if not doc["records"] and len(got) >= 10:
            break
    assert got == list(range(0, 100, 10)), got
    ack(broker, "f", member, got, "accept")
    assert poll(broker, "f", member) == [], "skipped records are consumed for the group"
    (row,) = call(broker, "GET", "/v1/share-groups/f")["partitions"]
    assert (row["start_offset"], row["in_flight"], row["accepted"]) == (100, 0, 10), row

    # A long-poll waits through non-matching records for the next match (a selector).
    def later() -> None:
        time.sleep(0.3)
        more = [{"value": "x", "headers": {"n": "5"}}] * 5 + [
            {"value": "y", "headers": {"n": "500"}}
        ]
        call(broker, "POST", "/v1/topics/jobs/records", {"records": more})

    producer = threading.Thread(target=later)
    producer.start()
    selector = "filter=n%20%3E%20100"  # n > 100
    doc = call(broker, "GET", f"{path}?max_records=10&wait_ms=5000&{selector}")
    producer.join()
    assert [(r["offset"], r["value"]) for r in doc["records"]] == [(105, "y")]
    status, doc = broker.json("GET", f"{path}?filter=n%20%3E%3E%201")
    assert status == 400 and doc["error"]["details"]["field"] == "filter", doc
    assert doc["error"]["details"]["column"] > 0

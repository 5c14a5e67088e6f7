"""Consumer groups end to end on one real broker process, over raw HTTP (what curl sends).

Proves that:
- two members consuming a 4-partition topic with fetch + commit only (no heartbeat calls)
  split the partitions 2/2 and together receive every record exactly once in a clean run;
  a join does not stop the first member: it keeps the partitions that do not move;
- a stale generation cannot commit a partition that moved (409 stale_generation), a
  stranger cannot commit (409 unknown_member), while the member's kept partitions commit;
- a member silent past its session timeout is expired by the broker and its partitions
  go to the others; partitions added to a subscribed topic and topics created that match
  a pattern subscription are assigned without a restart;
- offsets reset only when the group is empty (409 otherwise), to earliest, latest, a
  timestamp or given offsets; describe reports committed offset, high watermark and lag;
- committed offsets and group state survive a broker restart;
- a join that carries the client's own member_id is idempotent: its retry is answered
  with the same member and adds no second one;
- a member that heartbeats but never acknowledges a revocation is expired once the
  broker's rebalance timeout passes (well inside its session), so its partitions move; a
  client that stops calling poll for max_poll_interval_ms leaves, and rejoins on poll;
- a group fetch's max_bytes bounds the whole answer over all partitions, and what it
  leaves out comes in the next fetches;
- a committed offset past a partition's log end is never moved back: the group fetch
  serves nothing below it (no records again, no commit backwards) until the log reaches it;
- DELETE /v1/groups/{group} is refused (409 group_not_empty) while it has members and
  forgets it with its offsets once empty; an empty group is forgotten by itself once
  unchanged for the broker's offsets retention.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

from dmq.client import AsyncGroupConsumer
from tests_support import BrokerProcess


def call(broker: BrokerProcess, method: str, path: str, body: dict[str, Any] | None = None,
         expect: int = 200) -> Any:  # fmt: skip
    status, doc = broker.json(method, path, body)
    assert status == expect, (method, path, status, doc)
    return doc


def produce(broker: BrokerProcess, topic: str, partition: int, values: list[str]) -> None:
    records = [{"value": v, "partition": partition, "timestamp": 1_000 + i}
               for i, v in enumerate(values)]  # fmt: skip
    call(broker, "POST", f"/v1/topics/{topic}/records", {"records": records})


def join(broker: BrokerProcess, group: str, **body: Any) -> dict[str, Any]:
    doc: dict[str, Any] = call(broker, "POST", f"/v1/groups/{group}/members", body, expect=201)
    return doc


def poll_and_commit(broker: BrokerProcess, group: str, member: dict[str, Any]) -> list[str]:
    """One curl-style step: fetch from the group's positions, then commit next_offset."""
    path = f"/v1/groups/{group}/members/{member['member_id']}/records?wait_ms=200"
    doc = call(broker, "GET", path)
    member["generation"] = doc["generation"]
    member["assignment"] = doc["assignment"]
    if doc["partitions"]:
        offsets = [{"topic": p["topic"], "partition": p["partition"], "offset": p["next_offset"]}
                   for p in doc["partitions"]]  # fmt: skip
        body = {"member_id": member["member_id"], "generation": doc["generation"],
                "offsets": offsets}  # fmt: skip
        call(broker, "POST", f"/v1/groups/{group}/offsets", body)
    return [r["value"] for p in doc["partitions"] for r in p["records"]]


def test_two_members_share_a_queue_exactly_once_with_fetch_and_commit_only(
    broker: BrokerProcess,
) -> None:
    call(broker, "POST", "/v1/topics", {"name": "jobs", "partitions": 4}, expect=201)
    sent = [f"job-{p}-{i}" for p in range(4) for i in range(25)]
    for p in range(4):
        produce(broker, "jobs", p, [v for v in sent if v.startswith(f"job-{p}-")])
    a = join(broker, "workers", topics=["jobs"])
    assert len(a["assignment"]) == 4
    got_a = poll_and_commit(broker, "workers", a)  # a consumes everything it can see once
    b = join(broker, "workers", topics=["jobs"])
    assert b["assignment"] == []  # its partitions are still a's until a lets go
    produce(broker, "jobs", 0, ["late-0"])
    produce(broker, "jobs", 3, ["late-3"])
    got_b: list[str] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(got_a) + len(got_b) < len(sent) + 2:
        got_a += poll_and_commit(broker, "workers", a)
        got_b += poll_and_commit(broker, "workers", b)
    assert sorted(got_a + got_b) == sorted([*sent, "late-0", "late-3"])  # each exactly once
    assert len(a["assignment"]) == len(b["assignment"]) == 2
    assert {(x["topic"], x["partition"]) for x in a["assignment"]}.isdisjoint(
        {(x["topic"], x["partition"]) for x in b["assignment"]}
    )
    desc = call(broker, "GET", "/v1/groups/workers")
    assert desc["state"] == "stable" and desc["member_count"] == 2
    assert all(p["lag"] == 0 and p["committed_offset"] == p["high_watermark"]
               for p in desc["partitions"]), desc  # fmt: skip


def test_stale_generation_and_strangers_cannot_commit(broker: BrokerProcess) -> None:
    call(broker, "POST", "/v1/topics", {"name": "t", "partitions": 2}, expect=201)
    a = join(broker, "g", topics=["t"], assignor="range")
    b = join(broker, "g", topics=["t"], assignor="range")
    hb = call(broker, "POST", f"/v1/groups/g/members/{a['member_id']}/heartbeat",
              {"generation": b["generation"]})  # fmt: skip
    kept = hb["assignment"][0]["partition"]
    moved = 1 - kept
    stale = {"member_id": a["member_id"], "generation": a["generation"]}
    doc = call(broker, "POST", "/v1/groups/g/offsets",
               {**stale, "offsets": [{"topic": "t", "partition": moved, "offset": 1}]},
               expect=409)  # fmt: skip
    assert doc["error"]["code"] == "stale_generation"
    # The partition a kept commits even at a's old generation (KIP-848 member epochs).
    call(broker, "POST", "/v1/groups/g/offsets",
         {**stale, "offsets": [{"topic": "t", "partition": kept, "offset": 0}]})  # fmt: skip
    doc = call(broker, "POST", "/v1/groups/g/offsets",
               {"member_id": "nobody", "generation": 1,
                "offsets": [{"topic": "t", "partition": 0, "offset": 1}]}, expect=409)  # fmt: skip
    assert doc["error"]["code"] == "unknown_member"
    doc = call(broker, "POST", "/v1/groups/g/members", {"topics": ["t"], "assignor": "sticky"},
               expect=409)  # fmt: skip
    assert doc["error"]["code"] == "inconsistent_assignor"
    doc = call(broker, "POST", "/v1/groups/g/members", {"topics": ["t"], "session_timeout_ms": 5},
               expect=400)  # fmt: skip
    assert doc["error"]["details"]["field"] == "session_timeout_ms"
    doc = call(broker, "POST", f"/v1/groups/g/members/{a['member_id']}/heartbeat",
               {"generation": 999}, expect=409)  # fmt: skip
    assert doc["error"]["code"] == "stale_generation"


def test_expiry_new_partitions_patterns_reset_and_restart(broker_factory: Any) -> None:
    broker = broker_factory().start()
    call(broker, "POST", "/v1/topics", {"name": "ev.a", "partitions": 2}, expect=201)
    produce(broker, "ev.a", 0, ["x", "y", "z"])
    silent = join(broker, "p", topic_pattern=r"ev\..*", session_timeout_ms=1_000)
    live = join(broker, "p", topic_pattern=r"ev\..*", session_timeout_ms=30_000)
    assert len(silent["assignment"]) == 2
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # only `live` heartbeats; `silent` must expire
        live = call(broker, "POST", f"/v1/groups/p/members/{live['member_id']}/heartbeat",
                    {"generation": live["generation"]})  # fmt: skip
        if len(live["assignment"]) == 2:
            break
        time.sleep(0.2)
    assert len(live["assignment"]) == 2, live
    doc = call(broker, "POST", f"/v1/groups/p/members/{silent['member_id']}/heartbeat",
               {"generation": 1}, expect=409)  # fmt: skip
    assert doc["error"]["code"] == "unknown_member"
    call(broker, "POST", "/v1/topics/ev.a/partitions", {"count": 3})
    call(broker, "POST", "/v1/topics", {"name": "ev.b", "partitions": 1}, expect=201)
    call(broker, "POST", "/v1/topics", {"name": "other", "partitions": 1}, expect=201)
    live = call(broker, "POST", f"/v1/groups/p/members/{live['member_id']}/heartbeat",
                {"generation": live["generation"]})  # fmt: skip
    assert sorted((x["topic"], x["partition"]) for x in live["assignment"]) == [
        ("ev.a", 0), ("ev.a", 1), ("ev.a", 2), ("ev.b", 0)]  # fmt: skip
    reset = {"to": "earliest", "topics": ["ev.a"]}
    doc = call(broker, "POST", "/v1/groups/p/offsets/reset", reset, expect=409)
    assert doc["error"]["code"] == "group_not_empty"
    call(broker, "DELETE", f"/v1/groups/p/members/{live['member_id']}", expect=204)
    doc = call(broker, "POST", "/v1/groups/p/offsets/reset", {"to": "latest", "topics": ["ev.a"]})
    assert [o["offset"] for o in doc["offsets"]] == [3, 0, 0]
    doc = call(broker, "POST", "/v1/groups/p/offsets/reset",
               {"to": {"timestamp": 1_001}, "topics": ["ev.a"]})  # fmt: skip
    assert [o["offset"] for o in doc["offsets"]] == [1, 0, 0]
    doc = call(broker, "POST", "/v1/groups/p/offsets/reset",
               {"to": {"offsets": [{"topic": "ev.b", "partition": 0, "offset": 0}]}})  # fmt: skip
    desc = call(broker, "GET", "/v1/groups/p")
    assert desc["state"] == "empty"
    lag = {(r["topic"], r["partition"]): r["lag"] for r in desc["partitions"]}
    assert lag == {("ev.a", 0): 2, ("ev.a", 1): 0, ("ev.a", 2): 0, ("ev.b", 0): 0}
    before = call(broker, "GET", "/v1/groups/p/offsets")
    broker.stop()
    broker.start()
    assert call(broker, "GET", "/v1/groups/p/offsets") == before
    assert [g["group"] for g in call(broker, "GET", "/v1/groups")["groups"]] == ["p"]


def test_static_members_and_bad_inputs_name_the_field_and_limit(broker: BrokerProcess) -> None:
    call(broker, "POST", "/v1/topics", {"name": "s", "partitions": 2}, expect=201)
    first = join(broker, "st", topics=["s"], instance_id="pod-1")
    other = join(broker, "st", topics=["s"])
    call(broker, "POST", f"/v1/groups/st/members/{first['member_id']}/heartbeat",
         {"generation": other["generation"]})  # fmt: skip
    before = call(broker, "GET", "/v1/groups/st")
    again = join(broker, "st", topics=["s"], instance_id="pod-1")  # the pod restarted
    after = call(broker, "GET", "/v1/groups/st")
    assert again["generation"] == before["generation"] + 1 == after["generation"]  # bumped
    held = {m["member_id"]: m["assignment"] for m in after["members"]}
    old = {m["member_id"]: m["assignment"] for m in before["members"]}
    assert held[again["member_id"]] == old[first["member_id"]] and first["member_id"] not in held
    doc = call(broker, "POST", f"/v1/groups/st/members/{first['member_id']}/heartbeat",
               {"generation": 1}, expect=409)  # fmt: skip
    assert doc["error"]["code"] == "unknown_member"  # the old incarnation is fenced
    too_many = [{"topic": "s", "partition": 0, "offset": i} for i in range(10_001)]
    doc = call(broker, "POST", "/v1/groups/st/offsets",
               {"member_id": again["member_id"], "generation": 1, "offsets": too_many},
               expect=400)  # fmt: skip
    assert doc["error"]["details"] == {"field": "offsets", "limit": 10_000}
    members = len(call(broker, "GET", "/v1/groups/st")["members"])
    mine = join(broker, "st", topics=["s"], member_id="mine-1")  # the client's own id
    retried = join(broker, "st", topics=["s"], member_id="mine-1")  # a retry of that join
    assert mine["member_id"] == retried["member_id"] == "mine-1"
    assert len(call(broker, "GET", "/v1/groups/st")["members"]) == members + 1  # no ghost
    taken = call(broker, "POST", "/v1/groups/st/members",
                 {"topic_pattern": "s.*", "member_id": "mine-1"}, expect=400)  # fmt: skip
    assert taken["error"]["details"]["field"] == "member_id"
    longest = join(broker, "st", topics=["s"], instance_id="i" * 232)  # its member id fits
    assert len(longest["member_id"]) == 249
    doc = call(broker, "POST", "/v1/groups/st/members", {"topics": ["s"], "instance_id": "i" * 233},
               expect=400)  # fmt: skip
    assert doc["error"]["details"] == {"field": "instance_id", "limit": 232}
    doc = call(broker, "POST", "/v1/groups/bad%20name/members", {"topics": ["s"]}, expect=400)
    assert doc["error"]["details"]["field"] == "group"
    doc = call(broker, "POST", "/v1/groups/st/members", {"topic_pattern": "("}, expect=400)
    assert doc["error"]["details"]["field"] == "topic_pattern"
    doc = call(broker, "POST", "/v1/groups/st/offsets/reset", {"to": "yesterday"}, expect=400)
    assert doc["error"]["details"]["field"] == "to"
    assert call(broker, "GET", "/v1/groups/nope", expect=404)["error"]["code"] == "group_not_found"


def test_unacknowledged_revocations_expire_and_a_client_that_stops_polling_leaves(
    broker_factory: Any,
) -> None:
    broker = broker_factory(extra_args=["--group-rebalance-timeout-ms", "1500"]).start()
    call(broker, "POST", "/v1/topics", {"name": "held", "partitions": 2}, expect=201)
    stuck = join(broker, "r", topics=["held"], session_timeout_ms=60_000)
    assert len(stuck["assignment"]) == 2
    other = join(broker, "r", topics=["held"], session_timeout_ms=60_000)
    start = time.monotonic()
    stuck_status = 200
    while time.monotonic() - start < 20 and len(other["assignment"]) < 2:
        # `stuck` keeps its session alive with its first generation: it never acks.
        stuck_status, _ = broker.json(
            "POST", f"/v1/groups/r/members/{stuck['member_id']}/heartbeat",
            {"generation": stuck["generation"]},
        )  # fmt: skip
        other = call(broker, "POST", f"/v1/groups/r/members/{other['member_id']}/heartbeat",
                     {"generation": other["generation"]})  # fmt: skip
        time.sleep(0.2)
    assert len(other["assignment"]) == 2, other  # within the timeout, not the 60 s session
    assert stuck_status == 409
    assert time.monotonic() - start < 15

    async def slow_poller() -> tuple[int, int]:
        consumer = AsyncGroupConsumer(broker.url, "q", topics=["held"], session_timeout_ms=5_000,
                                      heartbeat_interval_ms=200, max_poll_interval_ms=1_000)  # fmt: skip
        async with consumer:
            await consumer.poll(100)
            first = consumer.member_id
            members_before = len(call(broker, "GET", "/v1/groups/q")["members"])
            await asyncio.sleep(2.5)  # processing longer than max_poll_interval_ms
            status, doc = broker.json("GET", "/v1/groups/q")  # 404: empty, nothing committed
            members_after = len(doc["members"]) if status == 200 else 0
            await consumer.poll(100)
            assert consumer.member_id not in (None, first)  # joined again as a new member
            return members_before, members_after

    assert asyncio.run(asyncio.wait_for(slow_poller(), 30)) == (1, 0)


def test_delete_an_empty_group_and_expire_idle_ones(broker_factory: Any) -> None:
    broker = broker_factory(extra_args=["--group-offsets-retention-ms", "1500"]).start()
    call(broker, "POST", "/v1/topics", {"name": "gone", "partitions": 1}, expect=201)
    member = join(broker, "d", topics=["gone"])
    offsets = [{"topic": "gone", "partition": 0, "offset": 0}]
    body = {"member_id": member["member_id"], "generation": member["generation"],
            "offsets": offsets}  # fmt: skip
    call(broker, "POST", "/v1/groups/d/offsets", body)
    doc = call(broker, "DELETE", "/v1/groups/d", expect=409)
    assert doc["error"]["code"] == "group_not_empty"
    broker.request("DELETE", f"/v1/groups/d/members/{member['member_id']}")
    status, _, _ = broker.request("DELETE", "/v1/groups/d")
    assert status == 204
    call(broker, "GET", "/v1/groups/d/offsets")  # reads as no offsets
    assert call(broker, "DELETE", "/v1/groups/d", expect=404)["error"]["code"] == "group_not_found"
    # Standalone commits make an empty group with offsets: it goes after the retention.
    call(broker, "POST", "/v1/groups/idle/offsets", {"offsets": offsets})
    assert [g["group"] for g in call(broker, "GET", "/v1/groups")["groups"]] == ["idle"]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and call(broker, "GET", "/v1/groups")["groups"]:
        time.sleep(0.2)
    assert call(broker, "GET", "/v1/groups")["groups"] == []
    call(broker, "GET", "/v1/groups/idle", expect=404)


def test_group_fetch_max_bytes_bounds_the_whole_answer(broker: BrokerProcess) -> None:
    call(broker, "POST", "/v1/topics", {"name": "big", "partitions": 4}, expect=201)
    for p in range(4):
        produce(broker, "big", p, [f"{p}-{i}-" + "x" * 1_000 for i in range(10)])
    member = join(broker, "bytes", topics=["big"])
    got: list[str] = []
    for _ in range(40):
        path = f"/v1/groups/bytes/members/{member['member_id']}/records?max_bytes=5000"
        doc = call(broker, "GET", path)
        values = [r["value"] for p in doc["partitions"] for r in p["records"]]
        assert sum(len(v) for v in values) <= 5_000, len(values)  # not 5000 per partition
        got += values
        offsets = [{"topic": p["topic"], "partition": p["partition"], "offset": p["next_offset"]}
                   for p in doc["partitions"]]  # fmt: skip
        if offsets:
            call(broker, "POST", "/v1/groups/bytes/offsets", {"member_id": member["member_id"],
                 "generation": doc["generation"], "offsets": offsets})  # fmt: skip
        if len(got) == 40:
            break
    assert sorted(got) == sorted(f"{p}-{i}-" + "x" * 1_000 for p in range(4) for i in range(10))


def test_a_position_past_the_log_end_is_not_moved_back(broker: BrokerProcess) -> None:
    call(broker, "POST", "/v1/topics", {"name": "ahead", "partitions": 1}, expect=201)
    produce(broker, "ahead", 0, [f"a{i}" for i in range(10)])
    offsets = [{"topic": "ahead", "partition": 0, "offset": 20}]  # as a lagging leader sees it
    call(broker, "POST", "/v1/groups/late/offsets", {"offsets": offsets})
    member = join(broker, "late", topics=["ahead"])
    produce(broker, "ahead", 0, [f"b{i}" for i in range(5)])  # offsets 10-14: below 20
    assert poll_and_commit(broker, "late", member) == []
    # A long-poll from a position past the end must not be answered from the end.
    path = f"/v1/groups/late/members/{member['member_id']}/records?wait_ms=3000"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(call, broker, "GET", path)
        time.sleep(0.3)
        produce(broker, "ahead", 0, ["d0", "d1"])  # offsets 15-16: still below 20
        answer = waiting.result(30)
    assert [r["value"] for p in answer["partitions"] for r in p["records"]] == []
    committed = call(broker, "GET", "/v1/groups/late/offsets")["offsets"]
    assert committed == [{"topic": "ahead", "partition": 0, "offset": 20}]
    produce(broker, "ahead", 0, [f"c{i}" for i in range(6)])  # offsets 17-22
    assert poll_and_commit(broker, "late", member) == ["c3", "c4", "c5"]  # from 20 on

"""Share groups on a 3-node cluster of real processes (cluster_harness.py). Proves that a
kill -9 of the metadata group's leader (which holds the share-group state and answers
every share-group request) and then of the partition's leader loses no accept: an accepted
record is never offered again, every record not accepted is offered again (those locked
when the leader died after their lock runs out, with delivery_count 2), and the group's
counters agree once everything is accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cluster_harness import DmqCluster, Node, produce, retry


def ok(resp: Any, *statuses: int) -> Any:
    assert resp.status in (statuses or (200,)), resp
    return resp.json() if resp.body else None


def consume(
    node: Node, member: str, wanted: int, accepted: set[int], timeout_s: float,
    counts: dict[int, int] | None = None,
) -> None:  # fmt: skip
    """Poll through `node` and accept everything until `wanted` records are settled. An
    ack whose answer was lost in the failover and whose retry got 409 is uncertain: such a
    record is either accepted (never offered again) or offered again (then retried).
    `counts`: each offset's delivery_count the first time it is offered here."""
    deadline = time.monotonic() + timeout_s
    path = f"/v1/share-groups/q/members/{member}"
    uncertain: set[int] = set()
    while len(accepted | uncertain) < wanted and time.monotonic() < deadline:
        got = ok(retry(lambda: node.request("GET", f"{path}/records?wait_ms=500&max_records=20"),
                       20))["records"]  # fmt: skip
        offsets = [r["offset"] for r in got]
        for r in got:
            if counts is not None:
                counts.setdefault(r["offset"], r["delivery_count"])
        assert not set(offsets) & accepted, f"accepted records offered again: {offsets}"
        uncertain -= set(offsets)
        if offsets:
            body = {"acks": [{"topic": "jobs", "partition": 0, "offsets": offsets,
                              "type": "accept"}]}  # fmt: skip
            resp = retry(lambda b=body: node.request("POST", f"{path}/acks", b), 20)
            assert resp.status in (200, 409), resp
            (accepted if resp.status == 200 else uncertain).update(offsets)
    accepted |= uncertain  # checked by the group's own count at the end


def test_accepts_survive_kill_9_of_the_metadata_and_partition_leaders(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(3).start_all()
    cluster.create_topic("jobs", 1, 3)
    node = cluster.any_live()
    produce(node, "jobs", [{"value": f"j{i}"} for i in range(40)])
    ok(retry(lambda: node.request("PUT", "/v1/share-groups/q", {"lock_duration_ms": 3_000}), 20))
    leader = cluster.metadata_leader()
    via = cluster.any_live(exclude=[leader])
    member = ok(retry(lambda: via.request("POST", "/v1/share-groups/q/members",
                                          {"topics": ["jobs"]}), 20), 201)["member_id"]  # fmt: skip
    path = f"/v1/share-groups/q/members/{member}"
    first = ok(via.request("GET", f"{path}/records?max_records=20"))["records"]
    assert [r["offset"] for r in first] == list(range(20))
    body = {"acks": [{"topic": "jobs", "partition": 0, "offsets": list(range(10)),
                      "type": "accept"}]}  # fmt: skip
    ok(via.request("POST", f"{path}/acks", body))  # 10-19 stay locked, unacknowledged
    accepted = set(range(10))

    cluster.kill9(leader)
    assert cluster.metadata_leader() != leader
    counts: dict[int, int] = {}
    consume(via, member, 40, accepted, timeout_s=30, counts=counts)
    assert accepted == set(range(40))
    # 10-19 were locked when the leader died: offered again once the lock ran out, as the
    # second delivery; 20-39 had never been delivered.
    assert {o: counts[o] for o in range(10, 40)} == {
        **{o: 2 for o in range(10, 20)},
        **{o: 1 for o in range(20, 40)},
    }, counts

    cluster.restart(leader)
    produce(via, "jobs", [{"value": f"k{i}"} for i in range(10)])
    part_leader = cluster.leader_of("jobs", 0)
    cluster.kill9(part_leader)
    survivor = cluster.any_live(exclude=[part_leader])
    consume(survivor, member, 50, accepted, timeout_s=30)
    assert accepted == set(range(50))
    (row,) = ok(retry(lambda: survivor.request("GET", "/v1/share-groups/q"), 20))["partitions"]
    assert (row["start_offset"], row["in_flight"], row["accepted"]) == (50, 0, 50), row


def test_dead_letters_are_written_once_across_a_metadata_leader_crash(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    """100 records rejected at once: the metadata leader writes them to the dead-letter
    topic 5 at a time, marking each 5 done; it is killed with SIGKILL while it does. The
    next leader writes what was not marked again, with the same producer sequences: the
    dead-letter topic holds each record exactly once."""
    cluster = dmq_cluster(3).start_all()
    cluster.create_topic("jobs", 1, 3)
    leader = cluster.metadata_leader()
    via = cluster.any_live(exclude=[leader])
    produce(via, "jobs", [{"value": f"poison-{i}"} for i in range(100)])
    member = ok(retry(lambda: via.request("POST", "/v1/share-groups/d/members",
                                          {"topics": ["jobs"]}), 20), 201)["member_id"]  # fmt: skip
    got = ok(via.request("GET", f"/v1/share-groups/d/members/{member}/records?max_records=100"))
    assert len(got["records"]) == 100
    body = {"acks": [{"topic": "jobs", "partition": 0, "offsets": list(range(100)),
                      "type": "reject"}]}  # fmt: skip
    ok(via.request("POST", f"/v1/share-groups/d/members/{member}/acks", body))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # kill it once some, not all, are written
        row = ok(retry(lambda: via.request("GET", "/v1/share-groups/d"), 20))["partitions"][0]
        if row["dead_lettered"] >= 10:
            break
        time.sleep(0.02)
    assert 10 <= row["dead_lettered"] < 100, row
    cluster.kill9(leader)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        resp = retry(lambda: via.request("GET", "/v1/share-groups/d"), 20)
        if resp.status == 200 and resp.json()["partitions"][0]["dead_lettered"] == 100:
            break
        time.sleep(0.2)
    dead = ok(retry(lambda: via.request(
        "GET", "/v1/topics/d.dlq/partitions/0/records?max_records=1000"), 20))["records"]  # fmt: skip
    sources = [int({h["key"]: h["value"] for h in r["headers"]}["dmq.dlq.offset"]) for r in dead]
    assert sorted(sources) == list(range(100)), sources  # each once, none missing
    assert [r["value"] for r in dead] == [f"poison-{o}" for o in sources]

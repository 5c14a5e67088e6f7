"""Proves, on real `dmq serve` processes, the life of a decommissioned partition
(dmq/broker/operations.py, dmq/metadata/reassignment.py):

- once decommissioned (`dmq cluster decommission-partition`, then the same over HTTP again,
  through a broker that does not lead the metadata group) it takes no new record: an explicit produce to it answers 409 partition_decommissioned
  naming the field, and keyed and keyless records all land on the active partitions, those
  the broker places and those the Python client (which maps keys itself) places;
- it stays readable: every record acknowledged before is fetched back, and a consumer
  group keeps it assigned and commits offsets on it; /v1/cluster/operations and
  `dmq cluster operations` show it;
- once retention empties its log, it goes: the catalogue marks it gone, every broker
  deletes its replica directory (one that was killed -9 meanwhile, once restarted), a fetch answers 410 partition_gone, the group stops
  assigning it and forgets its offset, a reset of the group's offsets skips it; a later
  partition added takes a new number.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import urllib.parse
from collections.abc import Callable
from typing import Any

from cluster_harness import (
    DmqCluster,
    Node,
    Response,
    fetch_all,
    operations,
    produce,
    retry,
    wait_for,
)

from dmq.client import Producer

GONE_TIMEOUT_S = 120.0  # retention check every 0.5 s, then the driver's round, loaded VM


def dmq(*args: str, timeout_s: float = 60.0) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "dmq", *args], capture_output=True, text=True, timeout=timeout_s
    )
    assert proc.returncode == 0, f"dmq {' '.join(args)}: {proc.returncode}\n{proc.stderr}"
    return proc.stdout


def ok(resp: Any, *statuses: int) -> Any:
    assert resp.status in (statuses or (200,)), resp
    return resp.json() if resp.body else None


def test_a_decommissioned_partition_stays_readable_then_goes(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(3, extra_args=["--retention-check-interval-ms", "500"]).start_all()
    cluster.create_topic("t", 3, 3)
    leader = cluster.metadata_leader()
    via = cluster.any_live(exclude=[leader])
    before = produce(via, "t", [{"value": f"old-{i}", "partition": 1} for i in range(20)])
    member = ok(retry(lambda: via.request("POST", "/v1/groups/g/members",
                                          {"topics": ["t"], "session_timeout_ms": 60_000}),
                      20), 201)  # fmt: skip
    assert sorted(a["partition"] for a in member["assignment"]) == [0, 1, 2]

    url = via.url
    assert "t-1 decommissioned" in dmq("cluster", "decommission-partition", "t", "1", "--url", url)
    path = "/v1/topics/t/partitions/1/decommission"
    assert ok(via.request("POST", path), 202)["status"] == "decommissioned"  # repeatable

    def refusal(node: Node) -> Response | None:
        body = {"records": [{"value": "x", "partition": 1}]}
        resp = node.request("POST", "/v1/topics/t/records", body)
        return resp if resp.status == 409 else None

    for node in cluster.live():  # every broker refuses it once its catalogue has it
        refused = wait_for(functools.partial(refusal, node), 20.0, f"{node.node_id} refusing it")
        error = refused.json()["error"]
        assert error["code"] == "partition_decommissioned", error
        assert error["details"]["field"] == "records[0].partition", error
    keyed = produce(via, "t", [{"key": f"k{i}", "value": f"v{i}"} for i in range(60)])
    keyless = produce(via, "t", [{"value": f"n{i}"} for i in range(30)])
    assert {p for p, _ in keyed + keyless} == {0, 2}, "records went to partition 1"
    with Producer(url, linger_ms=5) as client:  # the Python client maps keys itself
        sent = [client.send("t", b"c", key=b"key-%d" % i) for i in range(40)]
        sent += [client.send("t", b"c") for _ in range(10)]
        assert {f.result(30).partition for f in sent} == {0, 2}

    assert [v for _, _, v in fetch_all(via, "t", 1)] == [f"old-{i}" for i in range(20)]
    assert [o for _, o in before] == list(range(20))
    body = {"member_id": member["member_id"], "generation": member["generation"],
            "offsets": [{"topic": "t", "partition": 1, "offset": 20}]}  # fmt: skip
    ok(retry(lambda: via.request("POST", "/v1/groups/g/offsets", body), 20))
    draining = operations(via)["partition_decommissions"]
    assert [(d["topic"], d["partition"]) for d in draining] == [("t", 1)], draining
    assert draining[0]["offsets_left"] == 20, draining
    assert "t-1" in dmq("cluster", "operations", "--url", url)
    describe = ok(via.request("GET", "/v1/topics/t"))
    assert [p["status"] for p in describe["partitions"]] == ["active", "decommissioned", "active"]
    dirs = [n.partition_dir("t", 1) for n in cluster.live()]
    assert all(d.exists() for d in dirs)
    # A broker down while the partition goes deletes its copy once it is back.
    victim = next(n.node_id for n in cluster.live() if n.node_id not in (leader, via.node_id))
    cluster.kill9(victim)

    # Retention empties the log (the active segment too, once all of it expired).
    ok(via.request("PATCH", "/v1/topics/t/config", {"config": {"retention_ms": 1000}}))

    def gone() -> bool:
        partitions = ok(via.request("GET", "/v1/topics/t"))["partitions"]
        return bool(partitions[1]["status"] == "gone" and partitions[1]["replicas"] == [])

    try:
        wait_for(gone, GONE_TIMEOUT_S, "partition 1 gone after retention emptied it")
    except AssertionError as error:
        raise AssertionError(f"{error}; operations: {operations(via)}") from None
    left = cluster[victim].partition_dir("t", 1)
    assert left.exists()
    wait_for(lambda: not any(d.exists() for d in dirs if d != left), 30.0, "replicas deleted")
    cluster.restart(victim)
    wait_for(lambda: not left.exists(), 30.0, f"{victim}'s replica deleted after its restart")
    query = urllib.parse.urlencode({"offset": 0})
    fetched = via.request("GET", f"/v1/topics/t/partitions/1/records?{query}")
    assert fetched.status == 410 and fetched.json()["error"]["code"] == "partition_gone", fetched
    assert operations(via)["partition_decommissions"] == []

    group = ok(via.request("GET", "/v1/groups/g"))
    [m] = group["members"]
    assert sorted(a["partition"] for a in m["assignment"]) == [0, 2], group
    assert 1 not in {p["partition"] for p in group["partitions"]}, group
    offsets = ok(retry(lambda: via.request("GET", "/v1/groups/g/offsets"), 20))["offsets"]
    assert offsets == [], offsets

    grown = ok(retry(lambda: via.request("POST", "/v1/topics/t/partitions", {"count": 4}), 30))
    assert [p["status"] for p in grown["partitions"]] == ["active", "gone", "active", "active"]
    spread = produce(via, "t", [{"key": f"k{i}", "value": f"w{i}"} for i in range(80)])
    assert {p for p, _ in spread} == {0, 2, 3}
    ok(retry(lambda: via.request("DELETE", f"/v1/groups/g/members/{m['member_id']}"), 20), 204)
    reset = {"to": "earliest", "topics": ["t"]}
    reset_to = ok(retry(lambda: via.request("POST", "/v1/groups/g/offsets/reset", reset), 20))
    assert [o["partition"] for o in reset_to["offsets"]] == [0, 2, 3], reset_to
    again = via.request("POST", path)
    assert again.status == 410 and again.json()["error"]["code"] == "partition_gone", again

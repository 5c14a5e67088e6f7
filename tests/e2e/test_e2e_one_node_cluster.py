"""A single `dmq serve` is a one-node cluster on the cluster's code path.

Proves, against a real broker process: acks=1 answers once the leader's journal has the
records (offsets null: they are assigned at commit) and the records then become readable;
the cluster status shows the metadata group and every partition group with its leader
and replica lag; `dmq cluster status` prints them; a linearizable metadata read works
and a bad consistency is a 400 naming the field; the internal append route validates a
batch again rather than letting garbage reach a Raft log; the topics survive a restart
(the catalogue is the metadata group's journal and snapshot, no side file).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from tests_support import ROOT, BrokerProcess


def test_acks_1_answers_without_offsets_and_the_records_commit(broker: BrokerProcess) -> None:
    status, _ = broker.json("POST", "/v1/topics", {"name": "a1", "partitions": 1})
    assert status == 201
    records = {"records": [{"value": f"v{i}"} for i in range(5)]}
    status, body = broker.json("POST", "/v1/topics/a1/records?acks=1", records)
    assert status == 200
    assert body["offsets"] == [{"partition": 0, "offset": None}] * 5
    # acks=all after it: a later entry of the same log, so the acks=1 records are
    # committed before it and sit at offsets 0-4.
    status, body = broker.json("POST", "/v1/topics/a1/records", {"records": [{"value": "last"}]})
    assert status == 200 and body["offsets"] == [{"partition": 0, "offset": 5}]
    status, body = broker.json("GET", "/v1/topics/a1/partitions/0/records?offset=0")
    assert [r["value"] for r in body["records"]] == [f"v{i}" for i in range(5)] + ["last"]


def test_cluster_status_lists_every_group_with_its_leader(broker: BrokerProcess) -> None:
    assert broker.json("POST", "/v1/topics", {"name": "s", "partitions": 3})[0] == 201
    assert broker.json("POST", "/v1/topics/s/records", {"records": [{"value": "x"}]})[0] == 200
    status, doc = broker.json("GET", "/v1/cluster/status")
    assert status == 200
    assert [b["node_id"] for b in doc["brokers"]] == ["n1"]
    assert doc["brokers"][0]["live"] and doc["brokers"][0]["reachable"]
    groups = {(g["topic"], g["partition"]): g for g in doc["groups"]}
    assert set(groups) == {(None, None), ("s", 0), ("s", 1), ("s", 2)}
    for group in groups.values():
        assert group["leader"] == "n1" and group["term"] >= 1
        (replica,) = group["replicas"]
        assert replica["node_id"] == "n1" and replica["lag"] == 0
        assert replica["last_applied"] == group["commit_index"] >= 1
    printed = subprocess.run(
        [sys.executable, "-m", "dmq", "cluster", "status", "--url", broker.url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "metadata" in printed and "s-2" in printed and "n1" in printed


def test_linearizable_reads_and_a_bad_consistency(broker: BrokerProcess) -> None:
    assert broker.json("POST", "/v1/topics", {"name": "lin"})[0] == 201
    status, body = broker.json("GET", "/v1/topics?consistency=linearizable")
    assert status == 200 and [t["name"] for t in body["topics"]] == ["lin"]
    status, body = broker.json("GET", "/v1/topics/lin?consistency=linearizable")
    assert status == 200 and body["partitions"][0]["leader"] == "n1"
    status, body = broker.json("GET", "/v1/topics?consistency=eventual")
    assert status == 400 and body["error"]["details"]["field"] == "consistency"


def test_internal_append_refuses_a_garbage_batch(broker: BrokerProcess) -> None:
    status, body = broker.json("POST", "/v1/topics", {"name": "g"})
    assert status == 201
    topic_id = 1  # the first topic of a fresh cluster
    status, _, raw = broker.request(
        "POST",
        f"/v1/internal/partitions/g/0/append?topic_id={topic_id}",
        b"\x00" * 100,
        content_type="application/octet-stream",
    )
    assert 400 <= status < 500, raw
    # The partition still works: the garbage never reached its log.
    status, body = broker.json("POST", "/v1/topics/g/records", {"records": [{"value": "ok"}]})
    assert status == 200 and body["offsets"][0]["offset"] == 0


def test_topics_and_records_survive_a_restart(broker: BrokerProcess) -> None:
    assert broker.json("POST", "/v1/topics", {"name": "keep", "partitions": 2})[0] == 201
    records = {"records": [{"value": "a", "partition": 1}, {"value": "b", "partition": 1}]}
    assert broker.json("POST", "/v1/topics/keep/records", records)[0] == 200
    broker.stop()
    broker.start()
    status, body = broker.json("GET", "/v1/topics/keep")
    assert status == 200 and len(body["partitions"]) == 2
    status, body = broker.json("GET", "/v1/topics/keep/partitions/1/records?offset=0")
    assert [r["value"] for r in body["records"]] == ["a", "b"]
    status, body = broker.json(
        "POST", "/v1/topics/keep/records", {"records": [records["records"][0]]}
    )
    assert status == 200 and body["offsets"][0]["offset"] == 2


def test_a_replica_whose_flushed_data_is_gone_stops_the_broker(broker: BrokerProcess) -> None:
    """A broken invariant stops the node rather than serving (STYLE rule 13)."""
    assert broker.json("POST", "/v1/topics", {"name": "lost", "partitions": 1})[0] == 201
    records = {"records": [{"value": f"v{i}"} for i in range(10)]}
    assert broker.json("POST", "/v1/topics/lost/records", records)[0] == 200
    broker.stop()  # a clean stop flushes the log and checkpoints the applied position
    for segment in (broker.data_dir / "partitions" / "lost-0").glob("*.log"):
        segment.write_bytes(b"")  # the disk lost what was flushed
    try:
        broker.start(timeout_s=20)
    except RuntimeError as exc:
        assert "exited with 1" in str(exc), exc
    else:
        raise AssertionError("the broker started on a replica that lost flushed data")
    assert "flushed data is lost" in broker.log()


def test_replicas_per_broker_max_bounds_create_and_add(broker_factory: Any) -> None:
    broker = broker_factory(extra_args=["--replicas-per-broker-max", "5"]).start()
    assert broker.json("POST", "/v1/topics", {"name": "a", "partitions": 3})[0] == 201
    status, body = broker.json("POST", "/v1/topics", {"name": "b", "partitions": 3})
    assert status == 400
    assert body["error"]["details"] == {"field": "partitions", "limit": 5}
    status, body = broker.json("POST", "/v1/topics/a/partitions", {"count": 6})
    assert status == 400 and body["error"]["details"]["field"] == "count"
    status, body = broker.json("POST", "/v1/topics/a/partitions", {"count": 5})
    assert status == 200 and len(body["partitions"]) == 5
    assert broker.json("GET", "/v1/topics/b")[0] == 404

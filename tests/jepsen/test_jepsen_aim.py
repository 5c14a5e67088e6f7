"""Proves the aimed faults and the pinned clients (jepsen/nemesis.py, focus.py,
workload.py), without brokers (the cluster's status answer is scripted):

- a leader variant strikes the reported leader: kill/pause `leader` the leader of a data
  partition, `metadata-leader` the metadata group's, `minority-leader` a minority that
  holds a partition leader (5 nodes); a partition `leader` cuts that node off from
  every other one, `minority-leader` cuts a minority holding it from the majority;
- with no leader reported the variant still strikes a node (the first candidate);
- a partition's cut-off side is where the pinned workers go, recorded in the fault with
  the partitions it led: every other worker talks only to that node (a third of them
  sending to those partitions, the others polling them); the others send to those
  partitions through the leader the majority side reports, never through the cut-off
  node; a second fault in the window (a kill, a pause) spares that node; healing unpins
  them all;
- the schedule's variant is kept when it fits the brokers there are, redrawn when not.
"""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from jepsen import nemesis as nemesis_module
from jepsen.cluster import Cluster
from jepsen.focus import Aim, Focus
from jepsen.history import History
from jepsen.nemesis import Nemesis
from jepsen.workload import Client, Worker

TOPIC = "t"


def status(leaders: dict[int, str], metadata: str | None) -> dict[str, Any]:
    groups = [{"topic": None, "partition": None, "leader": metadata}]
    groups += [{"topic": TOPIC, "partition": p, "leader": n} for p, n in leaders.items()]
    return {"groups": groups}


def make(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    nodes: int,
    leaders: dict[int, str],
    metadata: str | None,
    kinds: list[str] | None = None,
) -> Nemesis:
    cluster = Cluster(tmp_path, nodes, planted_bug=None, durable_trace=False)
    monkeypatch.setattr(cluster, "status", lambda: status(leaders, metadata))
    monkeypatch.setattr(nemesis_module, "PIN_LEAD_S", 0.0)
    return Nemesis(cluster, History(), kinds or ["kill"], 1, TOPIC, len(leaders), Focus())


def test_leader_variants_strike_the_reported_leaders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nem = make(tmp_path, monkeypatch, 3, {0: "n2", 1: "n2"}, "n3")
    free = ["n1", "n2", "n3"]
    for _ in range(20):  # whichever partition the draw takes, n2 leads it
        assert nem._pick("leader", free) == ["n2"]
        assert nem._pick("metadata-leader", free) == ["n3"]
    cuts, about = nem._grudge("leader")
    assert about == ["n2"]
    assert sorted(map(sorted, cuts)) == [["n1", "n2"], ["n2", "n3"]]
    cuts, about = nem._grudge("metadata-leader")
    assert about == ["n3"] and all("n3" in cut for cut in cuts)


def test_a_minority_with_a_leader_holds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nem = make(tmp_path, monkeypatch, 5, {0: "n4", 1: "n4"}, "n1")
    free = [f"n{k}" for k in range(1, 6)]
    for _ in range(20):
        picked = nem._pick("minority-leader", free)
        assert len(picked) == 2 and "n4" in picked and len(set(picked)) == 2
        cuts, minority = nem._grudge("minority-leader")
        assert len(minority) == 2 and "n4" in minority
        assert len(cuts) == 2 * 3  # each of the two from each of the three others
        assert all((a in minority) != (b in minority) for a, b in cuts)


def test_no_reported_leader_still_strikes_a_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nem = make(tmp_path, monkeypatch, 3, {}, None)
    nem.partitions = 2
    assert nem._pick("leader", ["n3", "n1"]) == ["n3"]
    assert len(nem._grudge("leader")[1]) == 1


def test_the_schedules_variant_is_kept_when_it_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nem = make(tmp_path, monkeypatch, 3, {0: "n1"}, "n1")
    assert nem._variant("kill", "metadata-leader") == "metadata-leader"
    assert nem._variant("partition", "ring") != "ring"  # 3 brokers: no ring
    assert nem._variant("kill", "minority-leader") != "minority-leader"


def test_a_cut_off_leader_gets_the_pinned_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nem = make(tmp_path, monkeypatch, 3, {0: "n2", 1: "n3"}, "n1", kinds=["partition"])
    monkeypatch.setattr(nem, "_leader", lambda: "n2")  # the draw took partition 0
    history = History()
    stop = threading.Event()
    workers = [
        Worker(Client(nem.cluster, history, TOPIC, k), itertools.count(), 2, k, stop, nem.focus)
        for k in range(6)
    ]
    try:
        nem.setup()
        nem.start((("partition", "leader"),))
        [fault] = nem.active
        assert fault.variant == "leader" and fault.targets == ["n2"]
        assert fault.detail["pinned"] == ["n2"] and fault.detail["pinned_partitions"] == [0]
        assert nem.focus.aim == Aim(("n2",), (0,)) and nem.focus.faulty
        rotating = {w.client.node_ix: w.client.node for w in workers if w.pin_slot is None}
        roles = {None: "majority", 0: "writer", 1: "reader", 2: "reader"}
        for worker in workers:
            assert worker._follow_aim() == ((0,), roles[worker.pin_slot])
        assert [w.client.node for w in workers if w.pin_slot is not None] == ["n2"] * 3
        assert {w.client.node_ix: w.client.node for w in workers if w.pin_slot is None} == (
            rotating
        )
        # The majority side's writers send where n1 and n3 say the leader is now.
        monkeypatch.setattr(nem.cluster, "local_leader", lambda t, p, among: "n3")
        majority = [w for w in workers if w.pin_slot is None]
        assert {w._majority_node(0) for w in majority} == {"n3"}
        monkeypatch.setattr(nem.cluster, "local_leader", lambda t, p, among: None)
        for worker in majority:
            worker.leaders.clear()
            assert worker._majority_node(0) in ("n1", "n3"), "never the cut-off node"
        monkeypatch.setattr(type(nem.cluster.brokers["n1"]), "alive", property(lambda b: True))
        assert "n2" not in nem._free(), "this window's second fault spares the aimed node"
        nem.heal_all()
        assert nem.focus.aim is None and not nem.focus.faulty
        for worker in workers:
            worker._follow_aim()
        assert all(w.client.pinned is None for w in workers)
    finally:
        nem.close()


def test_local_leader_asks_the_brokers_own_views(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker that says it leads wins; else the leader one names among those asked;
    else one holding a replica; a broker that does not answer is skipped."""
    from jepsen import cluster as cluster_module
    from jepsen.cluster import Answer

    cluster = Cluster(tmp_path, 3, planted_bug=None, durable_trace=False)
    views: dict[str, list[dict[str, Any]] | None] = {}

    def fake_http(url: str, *args: Any, **kwargs: Any) -> Answer:
        node = next(n for n, b in cluster.brokers.items() if url.startswith(b.url))
        if views[node] is None:
            raise ConnectionRefusedError(node)
        return Answer(200, json.dumps({"replicas": views[node]}).encode())

    monkeypatch.setattr(cluster_module, "http", fake_http)
    follower = {"topic": TOPIC, "partition": 0, "is_leader": False, "leader": "n2"}
    views.update(n1=[follower], n2=None, n3=[{**follower, "leader": "n3", "is_leader": True}])
    assert cluster.local_leader(TOPIC, 0, ["n1", "n2", "n3"]) == "n3"
    assert cluster.local_leader(TOPIC, 0, ["n1", "n2"]) == "n2"  # n1 names it
    assert cluster.local_leader(TOPIC, 0, ["n1"]) == "n1"  # n2 not asked: a replica holder
    assert cluster.local_leader(TOPIC, 1, ["n1", "n3"]) is None

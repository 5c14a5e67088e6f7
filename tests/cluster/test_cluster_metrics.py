"""GET /metrics on a 3-node cluster of real processes (dmq/README.md, "Metrics").

Proves that:
- records produced through every node are counted once in the cluster: the sum over
  brokers of dmq_produced_records_total is the number produced (the appending leader
  counts them), and the leader alone reports dmq_partition_leader 1;
- a killed follower shows: the partition's leader reports
  dmq_partitions_under_replicated 1 within seconds, and 0 again once the follower is back;
- catalogue counts come from the metadata leader only (one dmq_cluster_topics series).
"""

from __future__ import annotations

from collections.abc import Callable

from cluster_harness import DmqCluster, Node, produce, wait_for
from prometheus_client.parser import text_string_to_metric_families


def samples(node: Node, name: str) -> list[tuple[dict[str, str], float]]:
    resp = node.request("GET", "/metrics")
    assert resp.status == 200, resp
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(resp.body.decode())
        for s in family.samples
        if s.name == name
    ]


def total(nodes: list[Node], name: str, **labels: str) -> float:
    return sum(v for n in nodes for got, v in samples(n, name) if labels.items() <= got.items())


def test_counters_count_once_and_a_killed_follower_shows_under_replication(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(3).start_all()
    cluster.create_topic("m", partitions=1, replication_factor=3)
    for node in cluster.nodes.values():
        produce(node, "m", [{"value": f"{node.node_id}-{k}"} for k in range(4)])
    nodes = list(cluster.nodes.values())
    p0 = {"topic": "m", "partition": "0"}
    assert total(nodes, "dmq_produced_records_total", **p0) == 12
    leader_id = cluster.leader_of("m", 0)
    assert total(nodes, "dmq_partition_leader", **p0) == 1
    assert sum(len(samples(n, "dmq_cluster_topics")) for n in nodes) == 1

    leader = cluster[leader_id]
    wait_for(lambda: total([leader], "dmq_partitions_under_replicated") == 0, 10, "in sync")
    follower = next(n for n in nodes if n.node_id != leader_id)
    follower.kill9()
    wait_for(
        lambda: total([leader], "dmq_partitions_under_replicated") == 1,
        10,
        f"{leader_id} reports m-0 under-replicated with {follower.node_id} down",
    )
    cluster.restart(follower.node_id)
    wait_for(
        lambda: total([cluster[leader_id]], "dmq_partitions_under_replicated") == 0,
        20,
        "in sync again",
    )

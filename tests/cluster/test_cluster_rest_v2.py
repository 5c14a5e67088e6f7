"""The Confluent REST Proxy v2 routes on a 3-node cluster of real processes. Proves that:

- any broker produces (to partitions led elsewhere) and lists topics;
- a consumer instance created through a broker that does not lead the metadata group
  lives on the leader: its base_uri names the leader, and every call on it through any
  broker is relayed there (subscribe, fetch, commit, read offsets);
- when the metadata leader is killed, the instance is gone (40403, as when a REST proxy
  restarts) and the group's committed offsets are not: once the dead instance's member
  expires, a new instance of the group starts at them.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from cluster_harness import DmqCluster, Node, retry, wait_for


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def ok(node: Node, method: str, path: str, body: Any = None, status: int = 200) -> Any:
    resp = retry(lambda: node.request(method, path, body), 20)
    assert resp.status == status, (node.node_id, method, path, resp)
    return resp.json()


def fetch_values(node: Node, path: str, count: int) -> list[bytes]:
    """Fetch from a consumer instance until `count` records came."""
    got: list[bytes] = []

    def more() -> bool:
        got.extend(base64.b64decode(r["value"]) for r in ok(node, "GET", path))
        return len(got) >= count

    wait_for(more, 20, f"{count} records at {path}")
    return got


def test_instances_live_on_the_metadata_leader(dmq_cluster: Callable[..., DmqCluster]) -> None:
    # A short instance timeout: the killed leader's instance leaves its member behind,
    # which expires after that long (the default is Confluent's 5 minutes).
    cluster = dmq_cluster(3, extra_args=["--rest-v2-instance-timeout-ms", "3000"]).start_all()
    cluster.create_topic("orders", 3, 3)
    leader = cluster.metadata_leader()
    via = cluster.any_live(exclude=[leader])
    for node in cluster.live():  # any broker produces: application/json means binary
        records = [{"value": b64(f"{node.node_id}-{p}".encode()), "partition": p}
                   for p in range(3)]  # fmt: skip
        answer = ok(node, "POST", "/topics/orders", {"records": records})
        assert [o["partition"] for o in answer["offsets"]] == [0, 1, 2]
        assert "orders" in ok(node, "GET", "/topics")
    body = {"name": "c1", "auto.offset.reset": "earliest"}
    created = ok(via, "POST", "/consumers/g", body)
    assert created["base_uri"] == f"{cluster[leader].url}/consumers/g/instances/c1"
    instance = "/consumers/g/instances/c1"
    ok(via, "POST", instance + "/subscription", {"topics": ["orders"]}, 204)
    values = fetch_values(via, instance + "/records?timeout=1000", 9)
    assert sorted(values) == sorted(f"{n.node_id}-{p}".encode()
                                    for n in cluster.live() for p in range(3))  # fmt: skip
    ok(via, "POST", instance + "/offsets", None)  # empty body: everything fetched
    ask = {"partitions": [{"topic": "orders", "partition": p} for p in range(3)]}
    committed = ok(via, "GET", instance + "/offsets", ask)["offsets"]
    assert [o["offset"] for o in committed] == [3, 3, 3]

    cluster.kill9(leader)
    new_leader = cluster.metadata_leader()
    assert new_leader != leader
    survivor = cluster.any_live()
    gone = retry(lambda: survivor.request("GET", instance + "/records"), 20)
    assert gone.status == 404 and gone.json()["error_code"] == 40403, gone
    again = "/consumers/g/instances/c2"

    def create_c2() -> None:
        ok(survivor, "POST", "/consumers/g", {"name": "c2", "auto.offset.reset": "earliest"})
        ok(survivor, "POST", again + "/subscription", {"topics": ["orders"]}, 204)

    create_c2()
    answer = ok(survivor, "POST", "/topics/orders/partitions/0", {"records": [{"value": "bmV3"}]})
    assert answer["offsets"][0]["offset"] == 3
    # Once the dead instance's member expires (its session is the instance timeout), the
    # new instance holds every partition and starts at the committed offsets: only the
    # record produced after the commit comes.
    got: list[bytes] = []

    def more() -> bool:
        resp = retry(lambda: survivor.request("GET", again + "/records?timeout=1000"), 20)
        if resp.status == 404 and resp.json()["error_code"] == 40403:
            create_c2()  # one more leader change (a loaded box) lost it too: as documented
            return False
        assert resp.status == 200, resp
        got.extend(base64.b64decode(r["value"]) for r in resp.json())
        return bool(got)

    wait_for(more, 30, "the record produced after the commit")
    assert got == [b"new"]

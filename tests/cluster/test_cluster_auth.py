"""Proves that users and ACLs are replicated and durable (dmq/metadata/security.py) on a
3-node cluster of real `dmq serve --auth on` processes with a cluster secret:

- a user and its ACLs added through one broker authenticate and authorise on the two
  others (they applied the same metadata commands);
- a produce sent to a broker that does not lead the partition is relayed with the
  caller's Authorization and checked again where it lands: it succeeds for the user
  allowed to write, and a topic outside its ACLs stays 403 (or 404) on every broker;
- a group member's fetch on a broker that does not lead the partition reads at the leader
  as the broker (its call signed with the cluster secret), and gets the records;
- after kill -9 of every broker and a restart, the users and ACLs are still there
  (journal and snapshot of the metadata group), and a deleted user stays refused.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from cluster_harness import DmqCluster, Node, wait_for

SUPERUSER = "cluster-superuser-token-0123456"
SU = f"Bearer {SUPERUSER}"


def call(
    node: Node, method: str, path: str, body: dict[str, Any] | None = None, auth: str = SU
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(node.url + path, data=data, method=method)
    req.add_header("Authorization", auth)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def test_users_and_acls_replicate_and_survive_kill9(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(
        3,
        secret=b"s" * 32,
        extra_args=["--auth", "on"],
        env={"DMQ_SUPERUSER_TOKEN": SUPERUSER},
    ).start_all()
    n1, n2, n3 = cluster["n1"], cluster["n2"], cluster["n3"]
    assert call(n1, "POST", "/v1/topics", {"name": "t-1", "replication_factor": 3})[0] == 201
    assert call(n1, "POST", "/v1/topics", {"name": "other"})[0] == 201
    status, _ = call(n1, "POST", "/v1/auth/users", {"name": "alice", "password": "alice-pass"})
    assert status == 201
    for op in ("write", "read"):
        acl = {"principal": "User:alice", "resource_type": "topic", "pattern": "prefixed",
               "resource_name": "t-", "operation": op}  # fmt: skip
        assert call(n1, "POST", "/v1/acls", acl)[0] == 201
    alice = "Basic " + base64.b64encode(b"alice:alice-pass").decode()

    def authorised_everywhere() -> bool:
        return all(call(n, "GET", "/v1/topics/t-1", auth=alice)[0] == 200 for n in (n2, n3))

    wait_for(authorised_everywhere, 20, "alice known on n2 and n3")
    for node in (n1, n2, n3):  # some relay to the leader, which checks again
        status, body = call(
            node, "POST", "/v1/topics/t-1/records", {"records": [{"value": node.node_id}]}, alice
        )
        assert status == 200, (node, body)
        status, body = call(node, "POST", "/v1/topics/other/records", {"records": [{"value": "x"}]},
                            alice)  # fmt: skip
        assert status == 404, (node, body)  # may not even describe it
    # A group member's fetch on a broker that does not lead t-1 goes to the leader as the
    # broker itself (signed with the cluster secret), not as alice: it must pass there.
    group_acl = {"principal": "User:alice", "resource_type": "group", "pattern": "prefixed",
                 "resource_name": "g-", "operation": "read"}  # fmt: skip
    assert call(n1, "POST", "/v1/acls", group_acl)[0] == 201
    wait_for(lambda: all(_acl_count(n) == 3 for n in (n1, n2, n3)), 20, "group ACL everywhere")
    for node in (n1, n2, n3):
        group = f"/v1/groups/g-{node.node_id}"
        status, member = call(node, "POST", f"{group}/members", {"topics": ["t-1"]}, alice)
        assert status == 201, member
        records = f"{group}/members/{member['member_id']}/records?wait_ms=200"

        def polled(node: Node = node, records: str = records) -> list[str] | None:
            status, body = call(node, "GET", records, auth=alice)
            assert status == 200, body
            values = sorted(r["value"] for p in body["partitions"] for r in p["records"])
            return values if len(values) == 3 else None

        assert wait_for(polled, 20, f"group fetch on {node.node_id}") == ["n1", "n2", "n3"]
    status, body = call(n2, "POST", "/v1/auth/users", {"name": "bob", "password": "bob-pass-1"})
    assert status == 201, body
    wait_for(lambda: "bob" in _names(n3), 20, "bob known on n3")
    assert call(n3, "DELETE", "/v1/auth/users/bob")[0] == 200  # added on n2, deleted on n3
    wait_for(lambda: _names(n1) == ["alice"], 20, "bob deleted, seen on n1")

    for node in (n1, n2, n3):
        node.kill9()
    cluster.start_all()

    def alice_after_restart() -> bool:
        return all(call(n, "GET", "/v1/topics/t-1", auth=alice)[0] == 200 for n in (n1, n2, n3))

    wait_for(alice_after_restart, 30, "alice authenticated after kill -9 of all")
    for node in (n1, n2, n3):
        assert call(node, "GET", "/v1/topics/other", auth=alice)[0] == 404
        assert call(node, "GET", "/v1/auth/whoami", auth="Bearer bob:bob-pass-1")[0] == 401
    _, acls = call(n2, "GET", "/v1/acls?principal=User:alice&resource_type=topic")
    assert sorted(a["operation"] for a in acls["acls"]) == ["read", "write"]


def _acl_count(node: Node) -> int:
    return len(call(node, "GET", "/v1/acls")[1]["acls"])


def _names(node: Node) -> list[str]:
    return [u["name"] for u in call(node, "GET", "/v1/auth/users")[1]["users"]]

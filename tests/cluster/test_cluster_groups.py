"""Consumer groups and idempotent producers on a 3-node cluster of real processes
(cluster_harness.py). Proves that:

- committed offsets survive a kill -9 of the metadata group's leader: after the election
  they read back (linearizably) through every live node, the member keeps its session
  (the new leader starts it afresh) and commits again at its generation;
- group requests reach the metadata leader from any broker, observers included
  (observer -> voter -> leader);
- an idempotent producer (the Python client) that keeps sending while the partition
  leader is killed with SIGKILL, through a proxy that loses one answer in eight after the
  broker has acted on the request, leaves every acknowledged record in the log exactly
  once and no record twice, though its retries resend batches that were written. (The
  same run without idempotence writes duplicates: the proxy makes lost answers certain.)
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from cluster_harness import DmqCluster, fetch_all, retry, wait_for

from dmq.client import Producer


def ok(resp: Any, *statuses: int) -> Any:
    assert resp.status in (statuses or (200,)), resp
    return resp.json() if resp.body else None


def test_commits_survive_the_metadata_leaders_crash(dmq_cluster: Callable[..., DmqCluster]) -> None:
    cluster = dmq_cluster(3).start_all()
    cluster.create_topic("orders", 4, 3)
    leader = cluster.metadata_leader()
    via = cluster.any_live(exclude=[leader])  # relayed to the leader
    member = ok(retry(lambda: via.request("POST", "/v1/groups/g/members",
                                          {"topics": ["orders"], "session_timeout_ms": 60_000}),
                      20), 201)  # fmt: skip
    assert len(member["assignment"]) == 4
    offsets = [{"topic": "orders", "partition": p, "offset": 10 + p} for p in range(4)]
    body = {"member_id": member["member_id"], "generation": member["generation"],
            "offsets": offsets}  # fmt: skip
    ok(via.request("POST", "/v1/groups/g/offsets", body))
    cluster.kill9(leader)
    new_leader = cluster.metadata_leader()
    assert new_leader != leader
    for node in cluster.live():
        read = ok(retry(lambda n=node: n.request("GET", "/v1/groups/g/offsets"), 20))
        assert read["offsets"] == offsets, (node.node_id, read)
    hb = ok(retry(lambda: via.request(
        "POST", f"/v1/groups/g/members/{member['member_id']}/heartbeat",
        {"generation": member["generation"]}), 20))  # fmt: skip
    assert hb["generation"] == member["generation"]  # still a member: nothing rebalanced
    body["offsets"] = [{"topic": "orders", "partition": 0, "offset": 20}]
    ok(retry(lambda: via.request("POST", "/v1/groups/g/offsets", body), 20))
    cluster.restart(leader)
    read = ok(retry(lambda: cluster[leader].request("GET", "/v1/groups/g/offsets"), 30))
    assert read["offsets"][0]["offset"] == 20


def test_group_requests_from_observers_reach_the_metadata_leader(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(3, metadata_voters=["n1"]).start_all()
    cluster.create_topic("t", 2, 1)
    a = ok(retry(lambda: cluster["n3"].request("POST", "/v1/groups/g/members", {"topics": ["t"]}),
                 20), 201)  # fmt: skip
    body = {"member_id": a["member_id"], "generation": a["generation"],
            "offsets": [{"topic": "t", "partition": 1, "offset": 0}]}  # fmt: skip
    ok(cluster["n2"].request("POST", "/v1/groups/g/offsets", body))
    desc = ok(cluster["n3"].request("GET", "/v1/groups/g"))
    assert desc["member_count"] == 1 and len(desc["partitions"]) == 2
    producer = ok(cluster["n2"].request("POST", "/v1/producers", {"transactional_id": "x"}), 201)
    again = ok(cluster["n3"].request("POST", "/v1/producers", {"transactional_id": "x"}), 201)
    assert again == {**producer, "producer_epoch": producer["producer_epoch"] + 1}


class AnswerLosingProxy:
    """A TCP proxy to `target` that drops the connection instead of relaying one answer in
    `every` (seeded): the broker did the work, the client never hears of it."""

    def __init__(self, target: tuple[str, int], every: int = 8) -> None:
        self.target = target
        self.every = every
        self.random = random.Random(7)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.dropped = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target, timeout=30)
        except OSError:
            client.close()
            return
        threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()
        try:
            while chunk := server.recv(65536):
                if self.random.randrange(self.every) == 0:
                    self.dropped += 1
                    break  # the answer is lost
                client.sendall(chunk)
        except OSError:
            pass
        finally:
            # shutdown, not only close: the _pipe thread is blocked in client.recv, and a
            # close() alone sends no FIN until that call returns, so the client waited out
            # its 5-s request timeout for every lost answer (83 s in CI) instead of seeing
            # the connection drop at once.
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass

    def close(self) -> None:
        self.closed = True
        self.listener.close()


def test_idempotent_producer_through_a_leader_crash_writes_each_record_once(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(3).start_all()
    cluster.create_topic("idem", 1, 3)
    leader = cluster.leader_of("idem", 0)
    via = cluster.any_live(exclude=[leader])
    # One answer in 4 lost: a loaded machine makes bigger batches, so fewer answers (a full
    # run saw 4 lost of ~35 at one in 8, below the 5 this test needs to mean much).
    proxy = AnswerLosingProxy((via.host, via.http_port), every=4)
    sent: dict[str, Any] = {}
    done = threading.Event()

    def produce() -> None:
        with Producer(proxy.url, idempotent=True, linger_ms=5, retries=200,
                      retry_backoff_ms=50, request_timeout_ms=5_000) as producer:  # fmt: skip
            for i in range(1_500):
                sent[f"v{i}"] = producer.send("idem", f"v{i}", partition=0)
                if i % 100 == 0:
                    time.sleep(0.02)  # spread the sends over the crash
            producer.flush()
        done.set()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    wait_for(lambda: len(sent) > 300, 30, "sends under way")
    cluster.kill9(leader)
    assert done.wait(120), "the producer did not finish"
    thread.join(10)
    proxy.close()
    assert proxy.dropped >= 5, proxy.dropped
    acked = set()
    for value, future in sent.items():
        try:
            future.result(timeout=0)
            acked.add(value)
        except Exception:  # noqa: BLE001 - a failed batch is allowed, a duplicate is not
            pass
    assert len(acked) > 1_000, len(acked)
    node = cluster.any_live()
    values = Counter(v for _, _, v in fetch_all(node, "idem", 0))
    assert [v for v, n in values.items() if n > 1] == []  # nothing written twice
    assert acked <= set(values)  # every acknowledged record is in the log

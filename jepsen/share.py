"""The share-group workload: members of one share group (a queue) that poll the log
workload's topic and acknowledge each record (mostly accept; sometimes release, with or
without a delay; sometimes reject; sometimes nothing, so the lock runs out), then the
final share drain and the read of the dead-letter topic.

Operations (history values):
- share-join: join SHARE_GROUP; ok {member_id}.
- share-leave: {member_id}; its locks are released.
- share-poll: a long-poll; ok {member_id, wall_ms (the client's clock at the end),
  records: [[partition, offset, value, delivery_count, locked_until]]}.
- share-ack: {member_id, acks: [[partition, offset, type]]}; ok on 200; fail on 409 (the
  broker proves nothing changed: a lock not held, or the member is gone); else info.
- share-dlq: the final read of the dead-letter topic; ok {records: [[partition, offset,
  value, reason]]} (the source partition and offset from the dead letter's headers).

checker/share.py checks the history (no record accepted twice, none lost, no two
deliveries of a record at once).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
import traceback
from typing import Any

from jepsen.cluster import Answer, Cluster, HarnessError, http
from jepsen.history import History
from jepsen.workload import DEFINITE_FAILURES, THINK_S

SHARE_GROUP = "jepsen-share"
DLQ_TOPIC = f"{SHARE_GROUP}.dlq"
LOCK_MS = 2_000  # short: records whose member died come again within seconds
ATTEMPTS = 4
SHARE_POLL_WAIT_MS = 500
SHARE_POLL_RECORDS = 20
SHARE_TIMEOUT_S = 10.0
FINAL_DRAIN_S = 90.0
# What a worker does with each record it gets (the rest: accept).
RELEASE_P, REJECT_P, FORGET_P = 0.06, 0.02, 0.03


class ShareClient:
    """One share-group member's requests, each logged as invoke + completion."""

    def __init__(self, cluster: Cluster, history: History, topic: str, node_ix: int) -> None:
        self.cluster = cluster
        self.history = history
        self.topic = topic
        self.node_ix = node_ix
        self.process = -1
        self.member_id: str | None = None
        self.last_type = "ok"

    @property
    def node(self) -> str:
        ids = list(self.cluster.brokers)
        return ids[self.node_ix % len(ids)]

    def _url(self, path: str) -> str:
        return self.cluster.every[self.node].url + f"/v1/share-groups/{SHARE_GROUP}" + path

    def _call(self, f: str, value: dict[str, Any], method: str, path: str,
              body: Any) -> Answer | None:  # fmt: skip
        node = self.node
        self.history.add(self.process, "invoke", f, node, value)
        try:
            answer = http(self._url(path), method, body, timeout_s=SHARE_TIMEOUT_S)
        except ConnectionRefusedError as error:
            self._done("fail", f, node, {**value, "error": repr(error)})
            return None
        except OSError as error:
            self._done("info", f, node, {**value, "error": repr(error)})
            return None
        if 200 <= answer.status < 300:
            return answer
        type_ = "fail" if answer.status in DEFINITE_FAILURES else "info"
        if answer.error_code() == "unknown_member":
            self.member_id = None
        self._done(type_, f, node, {**value, "status": answer.status, "error": answer.error_code()})
        return None

    def _done(self, type_: str, f: str, node: str, value: dict[str, Any]) -> None:
        self.history.add(self.process, type_, f, node, value)
        self.last_type = type_
        if type_ != "ok":
            self.node_ix += 1

    def join(self) -> None:
        answer = self._call("share-join", {}, "POST", "/members", {"topics": [self.topic]})
        if answer is not None:
            self.member_id = answer.json()["member_id"]
            self._done("ok", "share-join", self.node, {"member_id": self.member_id})

    def poll(self) -> list[list[Any]]:
        value = {"member_id": self.member_id}
        path = (f"/members/{self.member_id}/records?wait_ms={SHARE_POLL_WAIT_MS}"
                f"&max_records={SHARE_POLL_RECORDS}")  # fmt: skip
        answer = self._call("share-poll", value, "GET", path, None)
        if answer is None:
            return []
        wall_ms = int(time.time() * 1000)  # the poll's end (lock-cut-short: the checker)
        records = [[r["partition"], r["offset"], r["value"], r["delivery_count"],
                    r["locked_until"]]
                   for r in answer.json()["records"] if r["topic"] == self.topic]  # fmt: skip
        self._done("ok", "share-poll", self.node,
                   {**value, "records": records, "wall_ms": wall_ms})  # fmt: skip
        return records

    def ack(self, acks: list[list[Any]], delay_ms: int = 0) -> str:
        value = {"member_id": self.member_id, "acks": acks}
        body = {"acks": [{"topic": self.topic, "partition": p, "offsets": [o], "type": kind,
                          "delay_ms": delay_ms if kind == "release" else 0}
                         for p, o, kind in acks]}  # fmt: skip
        answer = self._call("share-ack", value, "POST", f"/members/{self.member_id}/acks", body)
        if answer is None:
            return self.last_type
        self._done("ok", "share-ack", self.node, value)
        return "ok"

    def leave(self) -> None:
        """Best effort: the drain's member gets the records sooner. Logged (share-leave):
        a leave releases the member's locks, which the checker must know."""
        if self.member_id is not None:
            value = {"member_id": self.member_id}
            self.history.add(self.process, "invoke", "share-leave", self.node, value)
            type_ = "info"
            with contextlib.suppress(OSError):
                answer = http(self._url(f"/members/{self.member_id}"), "DELETE", timeout_s=5.0)
                type_ = "ok" if 200 <= answer.status < 300 else "info"
            self.history.add(self.process, type_, "share-leave", self.node, value)
            self.member_id = None


def configure(cluster: Cluster, timeout_s: float = 60.0) -> None:
    """Create the share group with a short lock (retrying while there is no leader)."""
    body = {"lock_duration_ms": LOCK_MS, "max_delivery_attempts": ATTEMPTS,
            "session_timeout_ms": 5_000}  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            url = cluster.brokers["n1"].url + f"/v1/share-groups/{SHARE_GROUP}"
            if http(url, "PUT", body, timeout_s=10.0).status == 200:
                return
        time.sleep(0.5)
    raise HarnessError(f"configure share group: not within {timeout_s} s")


class ShareWorker(threading.Thread):
    """Join, then poll and acknowledge until stopped."""

    def __init__(self, client: ShareClient, processes: itertools.count[int], seed: int,
                 stop: threading.Event) -> None:  # fmt: skip
        super().__init__(name=f"share-worker-{client.node_ix}", daemon=True)
        self.client = client
        self.processes = processes
        self.rng = random.Random(seed)
        self.stop = stop
        self.error: BaseException | None = None

    def step(self) -> None:
        c = self.client
        if c.member_id is None:
            c.join()
            return
        records = c.poll()
        acks: list[list[Any]] = []
        released: list[list[Any]] = []
        for p, o, *_ in records:
            draw = self.rng.random()
            if draw < FORGET_P:
                continue
            kind = ("release" if draw < FORGET_P + RELEASE_P else
                    "reject" if draw < FORGET_P + RELEASE_P + REJECT_P else "accept")  # fmt: skip
            (released if kind == "release" else acks).append([p, o, kind])
        if acks:
            c.ack(acks)
        if released and c.member_id is not None:
            c.ack(released, delay_ms=self.rng.choice([0, 300]))

    def run(self) -> None:
        try:
            self.client.process = next(self.processes)
            while not self.stop.is_set():
                self.step()
                if self.client.last_type == "info":  # outcome unknown: a new process
                    self.client.process = next(self.processes)
                time.sleep(THINK_S if self.client.last_type == "ok" else 0.1)
            self.client.leave()
        except BaseException as error:  # reported by the runner: a harness error
            traceback.print_exc()
            self.error = error


def _settled(cluster: Cluster, ends: dict[int, int], topic: str) -> bool:
    """Every partition's share start offset at its log end, nothing waiting for the DLQ."""
    for broker in cluster.live():
        with contextlib.suppress(OSError, ValueError, KeyError):
            answer = http(broker.url + f"/v1/share-groups/{SHARE_GROUP}", timeout_s=5.0)
            if answer.status != 200:
                continue
            rows = {r["partition"]: r for r in answer.json()["partitions"] if r["topic"] == topic}
            return all(
                (rows[p]["start_offset"] >= end and rows[p]["dead_lettering"] == 0)
                if p in rows else end == 0
                for p, end in ends.items()
            )  # fmt: skip
    return False


def final_drain(cluster: Cluster, history: History, topic: str, ends: dict[int, int],
                processes: itertools.count[int]) -> None:  # fmt: skip
    """One member polls and accepts until every record up to `ends` is finished (accepted
    or dead-lettered), then the dead-letter topic is read whole (share-dlq)."""
    client = ShareClient(cluster, history, topic, 0)
    client.process = next(processes)
    deadline = time.monotonic() + FINAL_DRAIN_S
    while time.monotonic() < deadline:
        if _settled(cluster, ends, topic):
            client.leave()
            read_dead_letters(cluster, history, next(processes))
            return
        if client.member_id is None:
            client.join()
        else:
            records = client.poll()
            if records:
                client.ack([[p, o, "accept"] for p, o, *_ in records])
        if client.last_type == "info":
            client.process = next(processes)
            time.sleep(0.2)
    raise HarnessError(f"final share drain: not settled up to {ends} in {FINAL_DRAIN_S} s")


def read_dead_letters(cluster: Cluster, history: History, process: int) -> None:
    """The whole dead-letter topic (one partition), read from offset 0 through any broker."""
    found: list[list[Any]] = []
    offset = 0
    node = next(iter(cluster.brokers))
    history.add(process, "invoke", "share-dlq", node, {})
    for _ in range(1000):
        answer = None
        for broker in cluster.live():
            with contextlib.suppress(OSError):
                path = (
                    f"/v1/topics/{DLQ_TOPIC}/partitions/0/records?offset={offset}&max_records=1000"
                )
                answer = http(broker.url + path, timeout_s=10.0)
                if answer.status in (200, 404):
                    break
        if answer is None or answer.status == 404:  # no dead letter was ever written
            break
        if answer.status != 200:
            raise HarnessError(f"read {DLQ_TOPIC}: {answer.status} {answer.body[:200]!r}")
        doc = answer.json()
        for r in doc["records"]:
            h = {x["key"]: x["value"] for x in r["headers"]}
            found.append([int(h["dmq.dlq.partition"]), int(h["dmq.dlq.offset"]), r["value"],
                          h["dmq.dlq.reason"]])  # fmt: skip
        offset = doc["next_offset"]
        if offset >= doc["high_watermark"]:
            break
    history.add(process, "ok", "share-dlq", node, {"records": found})

"""The consumer-group workload: group members that join, poll, commit and read committed
offsets while the log workload sends, and the final group drain.

Operations (history values, jepsen/history.py has the log workload's):
- subscribe: join group GROUP on the topic; ok {member_id, generation, assignment}.
- group-poll: a member fetch (long-poll) from the group's committed offsets; ok
  {records: [[offset, value]], positions: [[partition, offset, next_offset]]}.
- commit: the polled partitions' next offsets, with the member's generation;
  {offsets: [[partition, offset]]}. 409 (fenced, unknown member) is fail.
- read-committed: the committed offsets (linearizable read); ok {offsets: [[p, o]]}.
- heartbeat: keeps the session (every HEARTBEAT_S); a 409 makes the member join again.

A 409 proves the request had no effect (fail); a timeout or a 5xx is info, and the worker
goes on as a new process that joins again. checker/groups.py turns commits and reads into
a per-partition register for the WGL checker, and group polls into dequeues.
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

GROUP = "jepsen-group"
SESSION_TIMEOUT_MS = 4000  # short: a killed member's partitions move on within seconds
HEARTBEAT_S = 1.0
GROUP_POLL_WAIT_MS = 500
GROUP_TIMEOUT_S = 10.0
FINAL_DRAIN_S = 60.0


class GroupClient:
    """One group member's requests, each logged as invoke + completion."""

    def __init__(self, cluster: Cluster, history: History, topic: str, node_ix: int) -> None:
        self.cluster = cluster
        self.history = history
        self.topic = topic
        self.node_ix = node_ix
        self.process = -1
        self.member_id: str | None = None
        self.generation = -1
        self.last_type = "ok"  # of the last completed operation

    @property
    def node(self) -> str:
        ids = list(self.cluster.brokers)
        return ids[self.node_ix % len(ids)]

    def _call(
        self, f: str, value: dict[str, Any], method: str, path: str, body: Any
    ) -> Answer | None:
        """Invoke, request, complete: the Answer if 2xx, else None (logged fail/info)."""
        node = self.node
        self.history.add(self.process, "invoke", f, node, value)
        try:
            answer = http(
                self.cluster.every[node].url + path, method, body, timeout_s=GROUP_TIMEOUT_S
            )
        except ConnectionRefusedError as error:
            self._done("fail", f, node, {**value, "error": repr(error)})
            return None
        except OSError as error:
            self._done("info", f, node, {**value, "error": repr(error)})
            return None
        if 200 <= answer.status < 300:
            return answer
        type_ = "fail" if answer.status in DEFINITE_FAILURES else "info"
        if answer.status == 409:
            self.member_id = None  # fenced or expired: join again
        self._done(type_, f, node, {**value, "status": answer.status, "error": answer.error_code()})
        return None

    def _done(self, type_: str, f: str, node: str, value: dict[str, Any]) -> None:
        self.history.add(self.process, type_, f, node, value)
        self.last_type = type_
        if type_ != "ok":
            self.node_ix += 1

    def subscribe(self) -> str:
        value = {"group": GROUP}
        body = {"topics": [self.topic], "session_timeout_ms": SESSION_TIMEOUT_MS}
        answer = self._call("subscribe", value, "POST", f"/v1/groups/{GROUP}/members", body)
        if answer is None:
            return "fail"
        doc = answer.json()
        self.member_id, self.generation = doc["member_id"], doc["generation"]
        assignment = sorted(a["partition"] for a in doc["assignment"])
        self._done(
            "ok",
            "subscribe",
            self.node,
            {
                **value,
                "member_id": self.member_id,
                "generation": self.generation,
                "assignment": assignment,
            },
        )
        return "ok"

    def poll(self) -> list[list[int]] | None:
        """One group fetch; the positions [[partition, offset, next_offset]] or None."""
        value = {"member_id": self.member_id}
        path = f"/v1/groups/{GROUP}/members/{self.member_id}/records?wait_ms={GROUP_POLL_WAIT_MS}"
        answer = self._call("group-poll", value, "GET", path, None)
        if answer is None:
            return None
        doc = answer.json()
        self.generation = doc["generation"]
        parts = [p for p in doc["partitions"] if p["topic"] == self.topic]
        records = [[r["offset"], r["value"]] for p in parts for r in p["records"]]
        positions = [[p["partition"], p["offset"], p["next_offset"]] for p in parts]
        self._done(
            "ok", "group-poll", self.node, {**value, "records": records, "positions": positions}
        )
        return positions

    def commit(self, offsets: list[list[int]]) -> str:
        value = {"member_id": self.member_id, "generation": self.generation, "offsets": offsets}
        body = {
            "member_id": self.member_id,
            "generation": self.generation,
            "offsets": [{"topic": self.topic, "partition": p, "offset": o} for p, o in offsets],
        }
        answer = self._call("commit", value, "POST", f"/v1/groups/{GROUP}/offsets", body)
        if answer is None:
            return "fail"
        self._done("ok", "commit", self.node, value)
        return "ok"

    def read_committed(self) -> dict[int, int] | None:
        answer = self._call("read-committed", {}, "GET", f"/v1/groups/{GROUP}/offsets", None)
        if answer is None:
            return None
        found = {
            o["partition"]: o["offset"]
            for o in answer.json()["offsets"]
            if o["topic"] == self.topic
        }
        self._done("ok", "read-committed", self.node, {"offsets": sorted(found.items())})
        return found

    def heartbeat(self) -> None:
        value = {"member_id": self.member_id, "generation": self.generation}
        path = f"/v1/groups/{GROUP}/members/{self.member_id}/heartbeat"
        answer = self._call("heartbeat", value, "POST", path, {"generation": self.generation})
        if answer is not None:
            self.generation = answer.json()["generation"]
            self._done("ok", "heartbeat", self.node, {**value, "generation": self.generation})

    def leave(self) -> None:
        """Best effort, not logged: it only lets the final drain's member take over sooner."""
        if self.member_id is not None:
            path = f"{self.cluster.every[self.node].url}/v1/groups/{GROUP}/members/{self.member_id}"
            with contextlib.suppress(OSError):
                http(path, "DELETE", timeout_s=5.0)
            self.member_id = None


class GroupWorker(threading.Thread):
    """Join, then poll / commit / read committed offsets / heartbeat until stopped."""

    def __init__(
        self,
        client: GroupClient,
        processes: itertools.count[int],
        seed: int,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=f"group-worker-{client.node_ix}", daemon=True)
        self.client = client
        self.processes = processes
        self.rng = random.Random(seed)
        self.stop = stop
        self.last_beat = time.monotonic()
        self.error: BaseException | None = None

    def step(self) -> None:
        """One operation: join if not a member, a heartbeat when due, else mostly a poll
        and a commit of what it returned, sometimes a read of the committed offsets."""
        c = self.client
        if c.member_id is None:
            c.subscribe()
        elif time.monotonic() - self.last_beat > HEARTBEAT_S:
            c.heartbeat()
            self.last_beat = time.monotonic()
        elif self.rng.random() < 0.15:
            c.read_committed()
        else:
            positions = c.poll()
            if positions and self.rng.random() < 0.9:  # sometimes not: records come again
                c.commit([[p, nxt] for p, _, nxt in positions])

    def run(self) -> None:
        try:
            self.client.process = next(self.processes)
            while not self.stop.is_set():
                self.step()
                if self.client.last_type == "info":  # outcome unknown: a new process
                    self.client.process = next(self.processes)
                    self.client.member_id = None
                time.sleep(THINK_S if self.client.last_type == "ok" else 0.1)
            self.client.leave()
        except BaseException as error:  # reported by the runner: a harness error
            traceback.print_exc()
            self.error = error


def final_drain(
    cluster: Cluster,
    history: History,
    topic: str,
    ends: dict[int, int],
    processes: itertools.count[int],
) -> None:
    """One member joins and polls + commits until the committed offset of every partition
    reaches `ends` (the final reads' log ends); FINAL_DRAIN_S at most, else a harness
    error (the queue checker would otherwise call unread values lost)."""
    client = GroupClient(cluster, history, topic, 0)
    client.process = next(processes)
    deadline = time.monotonic() + FINAL_DRAIN_S
    committed: dict[int, int] = {}
    while time.monotonic() < deadline:
        if all(committed.get(p, 0) >= end for p, end in ends.items()):
            client.leave()
            return
        if client.member_id is None:
            if client.subscribe() != "ok":
                client.process = next(processes)
                time.sleep(0.5)
            continue
        positions = client.poll()
        if positions:
            client.commit([[p, nxt] for p, _, nxt in positions])
        found = client.read_committed()
        if found is not None:
            committed = found
        if client.last_type == "info":
            client.process = next(processes)
            client.member_id = None
            time.sleep(0.2)
    raise HarnessError(
        f"final group drain: committed {committed}, log ends {ends} after {FINAL_DRAIN_S} s"
    )

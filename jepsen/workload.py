"""The log workload: client processes sending unique values and polling partitions, then
the final phase (heal, wait for leaders, read everything, read each replica).

Operations and their outcomes (jepsen/history.py has the value shapes):
- send: one record, acks=all, to a chosen partition. ok on 200 (with its offset); fail only
  when it certainly had no effect (connection refused, a 4xx, 429 backpressure); else info
  (timeout, reset, 5xx: the proposal may still commit).
- poll: a long-poll (wait_ms) from the process's position; the position moves to the
  answer's next_offset. assign: the process seeks a partition (back to 0, or anywhere it
  has been). Reads have no effect, so an error is fail, a timeout info.

Group operations (subscribe, group-poll, commit, read-committed) will be further
`Client` methods and `OPS` entries; their checkers exist (checker/wgl.py, checker/queue.py).

A worker is bound to a node and moves to the next one after a fail or info, so a dead
node does not starve it, and every ROTATE_S, so every broker keeps seeing clients (a
joined broker too, though its start was refused); after an info it continues as a new
process. While the nemesis aims a fault (focus.py), every other worker is pinned: it
talks only to the aimed nodes (the cut-off or paused side), whatever its outcomes; a
third of the pinned workers (`writer`) only send, to the partitions those nodes led (a
cut-off leader acknowledging what it cannot commit), the others (`reader`) only poll
those partitions there, without waiting (PINNED_READ_WAIT_MS: as many reads as they can
while the node's answers may be stale; a send there would hang until the request times
out and stop the reads). The workers not pinned become the majority side's writers
(`majority`): they send to the same partitions through the broker the other side
reports as leader (`Cluster.local_leader`, asked again every LEADER_REFRESH_S and after
each failure), so that the new leader acknowledges writes while the old one may still
answer reads (the window the planted bug lease-read opens: about one election timeout).
While any fault lasts no worker thinks between operations.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import traceback
from typing import Any, Literal

from jepsen.cluster import Answer, Cluster, HarnessError, http
from jepsen.focus import Focus
from jepsen.history import History

SEND_TIMEOUT_S = 10.0  # above the broker's request_timeout: most outcomes are known
POLL_WAIT_MS = 500
POLL_RECORDS_MAX = 100
THINK_S = 0.01  # between a worker's operations: keeps a shared 2-core machine usable
# 507: a full disk refused the produce before anything was written (dmq/README.md).
DEFINITE_FAILURES = frozenset({400, 404, 409, 413, 415, 416, 422, 429, 507})
IDEMPOTENT_ATTEMPTS = 4  # an idempotent send is retried (same sequence) while unknown
RETRY_PAUSE_S = 0.3
ROTATE_S = 2.0  # a worker moves to the next node after this long on one
PINNED_READ_WAIT_MS = 0  # a pinned reader's polls answer at once: many reads per window
LEADER_REFRESH_S = 0.3  # a majority writer asks where the leader is at most this stale
PINNED_WRITER_EVERY = 3  # pinned slots 0, 3, 6...: writers; the others: readers

Role = Literal["free", "writer", "reader", "majority"]


class Client:
    """One worker's operations against the brokers, each logged as invoke + completion."""

    def __init__(
        self,
        cluster: Cluster,
        history: History,
        topic: str,
        node_ix: int,
        idempotent: bool = False,
    ) -> None:
        self.cluster = cluster
        self.history = history
        self.topic = topic
        self.node_ix = node_ix
        self.process = -1
        self.idempotent = idempotent
        self.producer: tuple[int, int] | None = None  # (producer_id, epoch)
        self.sequences: dict[int, int] = {}  # partition -> next sequence
        self.bound_at = time.monotonic()  # when it moved to its node
        self.pinned: str | None = None  # while set (and a broker), the only node it talks to

    @property
    def node(self) -> str:
        brokers = self.cluster.brokers
        if self.pinned is not None and self.pinned in brokers:
            return self.pinned
        ids = list(brokers)
        return ids[self.node_ix % len(ids)]

    def _call(self, f: str, value: dict[str, Any], request: Any) -> tuple[str, Any]:
        """Invoke, run request() -> (type, result), complete; move on after fail/info
        and every ROTATE_S."""
        node = self.node
        self.history.add(self.process, "invoke", f, node, value)
        try:
            type_, result = request(self.cluster.every[node].url)
        except ConnectionRefusedError as error:
            type_, result = "fail", {**value, "error": repr(error)}
        except OSError as error:
            type_, result = "info", {**value, "error": repr(error)}
        self.history.add(self.process, type_, f, node, result)
        if type_ != "ok" or time.monotonic() - self.bound_at > ROTATE_S:
            self.node_ix += 1
            self.bound_at = time.monotonic()
        return type_, result

    @staticmethod
    def _outcome(answer: Answer, value: dict[str, Any], definite: bool) -> tuple[str, Any]:
        error = {**value, "status": answer.status, "error": answer.error_code()}
        return ("fail" if definite else "info"), error

    def _attempt(self, url: str, partition: int, payload: str) -> tuple[str, Any]:
        """One produce request: ("ok", offset) or (fail/info, the error)."""
        body: dict[str, Any] = {"records": [{"value": payload, "partition": partition}]}
        if self.producer is not None:
            body.update(
                producer_id=self.producer[0],
                producer_epoch=self.producer[1],
                base_sequence=self.sequences.get(partition, 0),
            )
        path = f"/v1/topics/{self.topic}/records?acks=all"
        answer = http(url + path, "POST", body, timeout_s=SEND_TIMEOUT_S)
        if answer.status == 200:
            [placed] = answer.json()["offsets"]
            if placed["partition"] != partition:
                raise HarnessError(f"sent to {partition}, placed in {placed}")
            return "ok", placed["offset"]
        return self._outcome(answer, {}, answer.status in DEFINITE_FAILURES)

    def _init_producer(self, url: str) -> None:
        """POST /v1/producers (relayed to the metadata leader); OSError or a non-201 is a
        failed send that sent nothing."""
        answer = http(url + "/v1/producers", "POST", {}, timeout_s=SEND_TIMEOUT_S)
        if answer.status != 201:
            raise ConnectionRefusedError(f"producer id: {answer.status} {answer.error_code()}")
        doc = answer.json()
        self.producer, self.sequences = (doc["producer_id"], doc["producer_epoch"]), {}

    def send(self, partition: int, payload: str) -> tuple[str, Any]:
        """acks=all. Idempotent: the same record and sequence are retried (rotating
        nodes) while the outcome is unknown; still unknown after IDEMPOTENT_ATTEMPTS, or
        refused after an unknown attempt, is info and the producer is dropped (a new id
        next time, as the process after an info is new)."""
        value = {"partition": partition, "value": payload}

        def request(url: str) -> tuple[str, Any]:
            if not self.idempotent:
                type_, got = self._attempt(url, partition, payload)
                return (
                    (type_, {**value, "offset": got})
                    if type_ == "ok"
                    else (type_, {**value, **got})
                )
            if self.producer is None:
                self._init_producer(url)
            return self._send_idempotent(value, partition, payload)

        return self._call("send", value, request)

    def _send_idempotent(
        self, value: dict[str, Any], partition: int, payload: str
    ) -> tuple[str, Any]:
        unknown, attempts = False, 0
        got: Any = {}
        while attempts < IDEMPOTENT_ATTEMPTS:
            url = self.cluster.every[self.node_at(attempts)].url
            attempts += 1
            try:
                outcome, got = self._attempt(url, partition, payload)
            except ConnectionRefusedError as error:  # this attempt sent nothing: go on
                outcome, got = "refused", {"error": repr(error)}
            except OSError as error:
                outcome, got = "info", {"error": repr(error)}
            if outcome == "ok":
                self.sequences[partition] = self.sequences.get(partition, 0) + 1
                return "ok", {**value, "offset": got, "attempts": attempts}
            unknown = unknown or outcome == "info"
            if outcome == "fail":
                break  # a definite refusal (4xx) of this attempt
            time.sleep(RETRY_PAUSE_S)
        if unknown:
            self.producer = None  # its sequence may be used or not: start afresh
        return ("info" if unknown else "fail"), {**value, **got, "attempts": attempts}

    def node_at(self, shift: int) -> str:
        if not shift:
            return self.node
        ids = list(self.cluster.brokers)
        return ids[(self.node_ix + shift) % len(ids)]

    def read(
        self,
        f: str,
        partition: int,
        offset: int,
        wait_ms: int,
        headers: dict[str, str] | None = None,
    ) -> tuple[str, Any]:
        value = {"partition": partition, "offset": offset}

        def request(url: str) -> tuple[str, Any]:
            path = (
                f"/v1/topics/{self.topic}/partitions/{partition}/records"
                f"?offset={offset}&max_records={POLL_RECORDS_MAX}&wait_ms={wait_ms}"
            )
            answer = http(url + path, timeout_s=wait_ms / 1000 + 5.0)
            if answer.status != 200:
                type_, error = self._outcome(answer, value, True)
                if error["error"] == "offset_out_of_range":  # where the log starts now
                    error["log_start_offset"] = answer.json()["error"]["details"].get(
                        "log_start_offset"
                    )
                return type_, error
            doc = answer.json()
            return "ok", {
                **value,
                "records": [[r["offset"], r["value"]] for r in doc["records"]],
                "next_offset": doc["next_offset"],
                "high_watermark": doc["high_watermark"],
            }

        return self._call(f, value, request)

    def assign(self, partition: int, offset: int) -> None:
        """Seek: local to the client, logged so the checker knows where polls resume."""
        value = {"partition": partition, "offset": offset}
        self.history.add(self.process, "invoke", "assign", None, value)
        self.history.add(self.process, "ok", "assign", None, value)


class Worker(threading.Thread):
    """Random sends, polls and seeks until stopped."""

    def __init__(
        self,
        client: Client,
        processes: itertools.count[int],
        partitions: int,
        seed: int,
        stop: threading.Event,
        focus: Focus | None = None,
    ) -> None:
        super().__init__(name=f"worker-{client.node_ix}", daemon=True)
        self.client = client
        self.processes = processes
        self.partitions = partitions
        self.rng = random.Random(seed)
        self.stop = stop
        self.focus = focus or Focus()
        # Every other worker follows the nemesis's aim; the others keep rotating.
        self.pin_slot: int | None = client.node_ix // 2 if client.node_ix % 2 == 0 else None
        self.positions = dict.fromkeys(range(partitions), 0)
        self.seen: dict[int, int] = dict.fromkeys(range(partitions), 0)  # furthest position
        # A majority writer's partition -> (the leader it found, when it asked).
        self.leaders: dict[int, tuple[str, float]] = {}
        self.error: BaseException | None = None

    def _new_process(self) -> None:
        self.client.process = next(self.processes)
        for partition, offset in self.positions.items():
            self.client.assign(partition, offset)

    def run(self) -> None:
        try:
            self._new_process()
            sent = 0
            while not self.stop.is_set():
                led, role = self._follow_aim()
                partition = self.rng.choice(led) if led else self.rng.randrange(self.partitions)
                if role in ("writer", "majority"):
                    roll = 0.0
                elif role == "reader":
                    roll = 0.6
                else:
                    roll = self.rng.random()
                if roll < 0.55:
                    if role == "majority":
                        self.client.pinned = self._majority_node(partition)
                    type_, _ = self.client.send(partition, f"{self.client.process}-{sent}")
                    sent += 1
                    if type_ != "ok":
                        self.leaders.pop(partition, None)  # ask again where it leads
                elif roll < 0.97:
                    at = self.positions[partition]
                    wait_ms = PINNED_READ_WAIT_MS if role == "reader" else POLL_WAIT_MS
                    type_, result = self.client.read("poll", partition, at, wait_ms)
                    if type_ == "ok":
                        self.positions[partition] = result["next_offset"]
                        self.seen[partition] = max(self.seen[partition], result["next_offset"])
                else:
                    type_ = "ok"
                    target = self.rng.choice([0, self.rng.randrange(self.seen[partition] + 1)])
                    self.positions[partition] = target
                    self.client.assign(partition, target)
                if type_ == "info":
                    self._new_process()
                think_s = 0.0 if self.focus.faulty else THINK_S
                time.sleep(think_s if type_ == "ok" else 0.1 if role != "reader" else 0.02)
        except BaseException as error:  # reported by the runner: a harness error
            traceback.print_exc()
            self.error = error

    def _follow_aim(self) -> tuple[tuple[int, ...], Role]:
        """Pin the client to the aimed node of its slot (or unpin it): the partitions to
        work on while a fault is aimed, and the worker's role (module docstring): a
        pinned `writer` or `reader`, a `majority` writer (not pinned, while an aim names
        partitions), or `free` (its usual mix over every broker)."""
        aim = self.focus.aim
        if aim is None:
            self.client.pinned = None
            self.leaders.clear()
            return (), "free"
        if self.pin_slot is None:
            if not aim.partitions or len(aim.nodes) >= len(self.client.cluster.brokers):
                self.client.pinned = None
                return (), "free"
            return aim.partitions, "majority"  # pinned per send: _majority_node
        self.client.pinned = aim.nodes[self.pin_slot % len(aim.nodes)]
        writer = self.pin_slot % PINNED_WRITER_EVERY == 0
        return aim.partitions, "writer" if writer else "reader"

    def _majority_node(self, partition: int) -> str:
        """Where a majority writer sends: the broker the side not aimed at reports as
        the partition's leader (asked at most every LEADER_REFRESH_S), else one of
        that side's brokers (it relays to the leader once one is elected)."""
        aim = self.focus.aim
        aimed = aim.nodes if aim is not None else ()
        now = time.monotonic()
        cached = self.leaders.get(partition)
        if cached is not None and now - cached[1] < LEADER_REFRESH_S and cached[0] not in aimed:
            return cached[0]
        others = [n for n in self.client.cluster.brokers if n not in aimed]
        self.rng.shuffle(others)
        found = self.client.cluster.local_leader(self.client.topic, partition, others)
        node = found if found is not None else self.rng.choice(others)
        self.leaders[partition] = (node, now)
        return node

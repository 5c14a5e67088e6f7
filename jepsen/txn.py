"""The transactional workload: multi-partition transactions and read_committed reads,
while the log workload sends and faults run; and the final transactional read.

Each worker owns a transactional id (`jepsen-tx{k}`). Operations (history values):

- txn: one transaction: a record `T{k}.{n}` to each of 2 or 3 partitions of TXN_TOPIC
  (produce with `?transactional_id=`, the producer's id, epoch and per-partition
  sequences), then commit (or, with probability ABORT_P, abort). Invoke value
  {txn, partitions, decision}. ok: the decision's answer was 200 (the transaction is
  decided; the commit is asked with `"wait": "decision"`, so it answers once the decision is durable and the markers follow); fail: it was
  certainly not committed (a send or the commit refused with a 4xx, then aborted, or the
  abort itself succeeded); info: unknown (a timeout or a 5xx on the decision). After a
  decision the worker goes on with the producer id and epoch the answer names (the
  coordinator bumps the epoch with each decision), its sequences starting over. After a
  fail or info the worker starts its producer again (`POST /v1/producers`): the new epoch
  fences the old one and makes the coordinator abort whatever it left open.
- txn-read: read_committed fetch of every partition from offset 0 (wait 0); ok
  {partitions: {p: [values]}}; any failure is fail (reads change nothing).
- final txn-read (after heal): once the coordinator has no open transaction (or after
  FINAL_WAIT_S), every partition read to its end with read_committed.

checker/txn.py turns these into the anomalies of a transactional system.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import traceback
from typing import Any

from jepsen.cluster import Cluster, HarnessError, http
from jepsen.history import History
from jepsen.workload import DEFINITE_FAILURES, THINK_S

TXN_TOPIC = "jepsen-txn"
TXN_PARTITIONS = 3
ABORT_P = 0.25  # of transactions, those the worker aborts itself
READ_P = 0.3  # of steps, read_committed reads
TXN_TIMEOUT_MS = 5_000  # short: a transaction a killed worker left is aborted soon
REQUEST_TIMEOUT_S = 10.0
FINAL_WAIT_S = 60.0
READ_RECORDS_MAX = 100_000


class TxnClient:
    """One transactional producer and reader; every request logged as invoke + completion."""

    def __init__(self, cluster: Cluster, history: History, k: int) -> None:
        self.cluster = cluster
        self.history = history
        self.k = k
        self.node_ix = k
        self.process = -1
        self.tid = f"jepsen-tx{k}"
        self.producer: dict[str, int] | None = None
        self.sequences: dict[int, int] = {}
        self.count = itertools.count()

    @property
    def url(self) -> str:
        ids = list(self.cluster.brokers)
        return self.cluster.every[ids[self.node_ix % len(ids)]].url

    def _post(self, path: str, body: Any) -> tuple[str, int, Any]:
        """("ok" | "fail" | "info", status, answer JSON)."""
        try:
            answer = http(self.url + path, "POST", body, timeout_s=REQUEST_TIMEOUT_S)
        except ConnectionRefusedError:
            self.node_ix += 1
            return "fail", 0, None
        except OSError:
            self.node_ix += 1
            return "info", 0, None
        if 200 <= answer.status < 300:
            return "ok", answer.status, answer.json()
        if answer.status not in DEFINITE_FAILURES:
            self.node_ix += 1
        return ("fail" if answer.status in DEFINITE_FAILURES else "info"), answer.status, None

    def init(self) -> bool:
        kind, _, doc = self._post("/v1/producers", {"transactional_id": self.tid})
        if kind != "ok":
            self.producer = None
            return False
        self.producer = {"producer_id": doc["producer_id"], "producer_epoch": doc["producer_epoch"]}
        self.sequences = {}
        return True

    def adopt(self, answer: dict[str, Any] | None) -> None:
        """The producer id and epoch a decision's answer names for the next transaction
        (the coordinator bumps the epoch with each decision); sequences start over."""
        if self.producer is None or answer is None or "next_producer_id" not in answer:
            return
        following = {
            "producer_id": answer["next_producer_id"],
            "producer_epoch": answer["next_producer_epoch"],
        }
        if following != self.producer:
            self.producer = following
            self.sequences = {}

    def transaction(self, partitions: list[int], commit: bool) -> None:
        txn = f"T{self.k}.{next(self.count)}"
        decision = "commit" if commit else "abort"
        value = {"txn": txn, "partitions": partitions, "decision": decision}
        node = self.url
        self.history.add(self.process, "invoke", "txn", node, value)
        if self.producer is None and not self.init():
            self.history.add(self.process, "fail", "txn", node, {**value, "error": "init"})
            return
        assert self.producer is not None
        sent_all = True
        for p in partitions:
            seq = self.sequences.get(p, 0)
            body = {**self.producer, "base_sequence": seq, "records": [{"value": txn}]}
            path = (
                f"/v1/topics/{TXN_TOPIC}/records?partition={p}&transactional_id={self.tid}"
                f"&transaction_timeout_ms={TXN_TIMEOUT_MS}"
            )
            kind, status, _ = self._post(path, body)
            if kind != "ok":
                sent_all = False
                break
            self.sequences[p] = seq + 1
        if not sent_all:
            decision = "abort"  # a send failed or is unknown: this one must not commit
        end = f"/v1/transactions/{self.tid}/{decision}"
        decide_at = self.history.now()
        # "decision": answered once the decision is durable (the markers follow); the
        # next transaction's first add then waits on the broker for them (queued).
        kind, status, doc = self._post(end, {**self.producer, "wait": "decision"})
        self.adopt(doc)
        if kind == "ok" and decision == "commit":
            done = "ok"
        elif kind == "ok" or (decision == "abort" and kind == "fail" and status != 0):
            done = "fail"  # aborted (or refused: nothing was added): never committed
        else:
            done = "info" if decision == "commit" or not sent_all else "fail"
        if not sent_all or kind != "ok":
            self.producer = None  # sequences unknown, or fenced: a new epoch next time
        result = {
            **value, "decided": decision, "decide_at": decide_at,
            "state": (doc or {}).get("state"),
        }  # fmt: skip
        self.history.add(self.process, done, "txn", node, result)

    def read(self, final: bool = False) -> bool:
        node = self.url
        self.history.add(self.process, "invoke", "txn-read", node, {})
        found: dict[str, list[str]] = {}
        for p in range(TXN_PARTITIONS):
            values = self._read_partition(p)
            if values is None:
                self.node_ix += 1
                self.history.add(self.process, "fail", "txn-read", node, {"partition": p})
                return False
            found[str(p)] = values
        done = {"partitions": found, **({"final": True} if final else {})}
        self.history.add(self.process, "ok", "txn-read", node, done)
        return True

    def _read_partition(self, p: int) -> list[str] | None:
        values: list[str] = []
        offset = 0
        while True:
            path = (
                f"/v1/topics/{TXN_TOPIC}/partitions/{p}/records?offset={offset}"
                f"&isolation=read_committed&max_records=1000"
            )
            try:
                answer = http(self.url + path, timeout_s=REQUEST_TIMEOUT_S)
            except OSError:
                return None
            if answer.status != 200:
                return None
            doc = answer.json()
            values += [r["value"] for r in doc["records"]]
            if doc["next_offset"] <= offset or len(values) > READ_RECORDS_MAX:
                return values
            offset = doc["next_offset"]


class TxnWorker(threading.Thread):
    """Transactions and read_committed reads until stopped."""

    def __init__(
        self,
        client: TxnClient,
        processes: itertools.count[int],
        seed: int,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=f"txn-worker-{client.k}", daemon=True)
        self.client = client
        self.processes = processes
        self.rng = random.Random(seed)
        self.stop = stop
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.client.process = next(self.processes)
            while not self.stop.is_set():
                if self.rng.random() < READ_P:
                    self.client.read()
                else:
                    count = self.rng.choice((2, 3))
                    partitions = sorted(self.rng.sample(range(TXN_PARTITIONS), count))
                    self.client.transaction(partitions, self.rng.random() >= ABORT_P)
                time.sleep(THINK_S)
        except BaseException as error:  # noqa: BLE001 - the run reports it
            traceback.print_exc()
            self.error = error


def create_txn_topic(
    cluster: Cluster, rf: int, timeout_s: float = 60.0, *, name: str = TXN_TOPIC,
    partitions: int = TXN_PARTITIONS,
) -> None:  # fmt: skip
    body = {"name": name, "partitions": partitions, "replication_factor": rf}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for broker in cluster.brokers.values():
            try:
                answer = http(broker.url + "/v1/topics", "POST", body, timeout_s=10.0)
            except OSError:
                continue
            if answer.status in (201, 409):
                return
        time.sleep(0.5)
    raise HarnessError(f"create {name}: not within {timeout_s} s")


def final_txn_read(cluster: Cluster, history: History, processes: itertools.count[int]) -> None:
    """Wait until no transaction is open (the coordinator aborts abandoned ones after
    TXN_TIMEOUT_MS), then read every partition with read_committed, until one read works."""
    client = TxnClient(cluster, history, 10_000)
    deadline = time.monotonic() + FINAL_WAIT_S
    while time.monotonic() < deadline:
        try:
            answer = http(client.url + "/v1/transactions", timeout_s=REQUEST_TIMEOUT_S)
        except OSError:
            client.node_ix += 1
            time.sleep(0.5)
            continue
        if answer.status == 200 and not any(
            t["state"] in ("ongoing", "prepare_commit", "prepare_abort")
            for t in answer.json()["transactions"]
        ):
            break
        time.sleep(0.5)
    while time.monotonic() < deadline + 30:
        client.process = next(processes)
        if client.read(final=True):
            return
        time.sleep(0.5)
    raise HarnessError("final txn read: no broker answered")


# --- consume-transform-produce -----------------------------------------------------------

CTP_IN = "jepsen-ctp-in"  # 1 partition, CTP_INPUTS records written before the run
CTP_OUT = "jepsen-ctp-out"  # 2 partitions
CTP_GROUP = "jepsen-ctp"
CTP_INPUTS = 2_000
CTP_BATCH = 5  # input records per transaction


class CtpClient(TxnClient):
    """Reads the input from the group's committed offset, writes one output record per
    input (`o:<input>`) and the group's next offset in one transaction (the group has no
    members: member "" and generation -1). Operation `ctp`: invoke {from}; ok {from,
    to, inputs} once committed, fail / info as for `txn`."""

    def __init__(self, cluster: Cluster, history: History, k: int) -> None:
        super().__init__(cluster, history, k)
        self.tid = f"jepsen-ctp{k}"

    def step(self) -> None:
        node = self.url
        try:
            answer = http(f"{node}/v1/groups/{CTP_GROUP}/offsets", timeout_s=REQUEST_TIMEOUT_S)
        except OSError:
            self.node_ix += 1
            return
        if answer.status not in (200, 404):
            self.node_ix += 1
            return
        start = 0
        if answer.status == 200:
            start = next((o["offset"] for o in answer.json()["offsets"]), 0)
        try:
            got = http(
                f"{node}/v1/topics/{CTP_IN}/partitions/0/records?offset={start}"
                f"&max_records={CTP_BATCH}", timeout_s=REQUEST_TIMEOUT_S,
            )  # fmt: skip
        except OSError:
            self.node_ix += 1
            return
        if got.status != 200 or not got.json()["records"]:
            self.node_ix += 1 if got.status != 200 else 0
            return
        records = got.json()["records"]
        inputs = [r["value"] for r in records]
        end = records[-1]["offset"] + 1
        value = {"from": start, "to": end, "inputs": inputs}
        self.history.add(self.process, "invoke", "ctp", node, value)
        done = self._transform(inputs, start, end)
        self.history.add(self.process, done, "ctp", node, value)
        if done != "ok":
            self.producer = None

    def _transform(self, inputs: list[str], start: int, end: int) -> str:
        if self.producer is None and not self.init():
            return "fail"
        assert self.producer is not None
        params = f"transactional_id={self.tid}&transaction_timeout_ms={TXN_TIMEOUT_MS}"
        for i, value in enumerate(inputs):
            p = (start + i) % 2
            seq = self.sequences.get(p, 0)
            body = {**self.producer, "base_sequence": seq, "records": [{"value": f"o:{value}"}]}
            kind, _, _ = self._post(f"/v1/topics/{CTP_OUT}/records?partition={p}&{params}", body)
            if kind != "ok":
                self._post(f"/v1/transactions/{self.tid}/abort", self.producer)
                return "fail" if kind == "fail" else "info"
            self.sequences[p] = seq + 1
        offsets = {
            **self.producer, "group": CTP_GROUP, "member_id": "", "generation": -1,
            "offsets": [{"topic": CTP_IN, "partition": 0, "offset": end}],
            "transaction_timeout_ms": TXN_TIMEOUT_MS,
        }  # fmt: skip
        kind, _, _ = self._post(f"/v1/transactions/{self.tid}/offsets", offsets)
        if kind != "ok":
            self._post(f"/v1/transactions/{self.tid}/abort", self.producer)
            return "fail" if kind == "fail" else "info"
        kind, _, doc = self._post(f"/v1/transactions/{self.tid}/commit", self.producer)
        self.adopt(doc)
        return kind


class CtpWorker(TxnWorker):
    """Consume-transform-produce steps until stopped."""

    def run(self) -> None:
        assert isinstance(self.client, CtpClient)
        try:
            self.client.process = next(self.processes)
            while not self.stop.is_set():
                self.client.step()
                time.sleep(THINK_S)
        except BaseException as error:  # noqa: BLE001 - the run reports it
            traceback.print_exc()
            self.error = error


def setup_ctp(cluster: Cluster, rf: int) -> None:
    """The input topic, filled with CTP_INPUTS records `i<n>`, and the output topic."""
    for name, partitions in ((CTP_IN, 1), (CTP_OUT, 2)):
        create_txn_topic(cluster, rf, name=name, partitions=partitions)
    url = next(iter(cluster.brokers.values())).url
    for first in range(0, CTP_INPUTS, 500):
        body = {"records": [{"value": f"i{n}"} for n in range(first, first + 500)]}
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = http(f"{url}/v1/topics/{CTP_IN}/records?partition=0", "POST", body, 10.0)
                if answer.status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise HarnessError("could not fill the consume-transform-produce input")
            time.sleep(0.5)


def final_ctp_read(cluster: Cluster, history: History, processes: itertools.count[int]) -> None:
    """After final_txn_read: the group's committed offset and the whole output, read
    with read_committed, as one `ctp-final` operation."""
    client = TxnClient(cluster, history, 10_001)
    client.process = next(processes)
    node = client.url
    history.add(client.process, "invoke", "ctp-final", node, {})
    try:
        committed, refused = _final_committed_offset(node)
        if committed is None:
            error = {"error": "offsets unread", "refused": refused}
            history.add(client.process, "fail", "ctp-final", node, error)
            return
        outputs: list[str] = []
        for p in range(2):
            offset = 0
            while True:
                got = http(
                    f"{node}/v1/topics/{CTP_OUT}/partitions/{p}/records?offset={offset}"
                    "&isolation=read_committed&max_records=1000", timeout_s=REQUEST_TIMEOUT_S,
                ).json()  # fmt: skip
                outputs += [r["value"] for r in got["records"]]
                if got["next_offset"] <= offset:
                    break
                offset = got["next_offset"]
    except (OSError, TypeError, KeyError) as error:
        history.add(client.process, "fail", "ctp-final", node, {"error": repr(error)})
        return
    history.add(
        client.process, "ok", "ctp-final", node,
        {"committed": committed, "outputs": outputs, "refused": refused},
    )  # fmt: skip


def _final_committed_offset(node: str) -> tuple[int | None, list[str]]:
    """The ctp group's committed input offset (0 when the group has none: 404, or no
    row), asked until the broker answers it (None past FINAL_WAIT_S), and the refusals
    met before (`<status> <code>`, kept in the history). Any other answer
    is no answer: a 409 while a transaction still carries offsets for the group
    (KIP-447's unstable offsets), a 503 while group 0 elects after the power loss. Taking
    it for 0 made the checker see every committed output as beyond the offset (a correct
    build's run, seed 3 with every workload, ctp-output-beyond-offset 50)."""
    refused: list[str] = []
    deadline = time.monotonic() + FINAL_WAIT_S
    while time.monotonic() < deadline:
        try:
            answer = http(f"{node}/v1/groups/{CTP_GROUP}/offsets", timeout_s=REQUEST_TIMEOUT_S)
        except OSError as error:
            refused.append(repr(error))
        else:
            if answer.status == 404:
                return 0, refused
            if answer.status == 200:
                return int(next((o["offset"] for o in answer.json()["offsets"]), 0)), refused
            refused.append(f"{answer.status} {answer.error_code()}")
        time.sleep(0.5)
    return None, refused

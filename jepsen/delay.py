"""`python -m jepsen.delay`: the delayed-delivery workload under a partition leader kill.

Three brokers (jepsen/cluster.py, planted bug optional), one topic of one partition,
replication factor 3. While a writer schedules records with delays of `--delay-min-ms`
to `--delay-max-ms` through every broker in turn (a few of them cancelled at once), a
poller reads the partition from its position through a live broker, and the nemesis
kills the partition leader (kill -9) once and restarts it (with `--snapshot-entries 16`
the leader compacts past it meanwhile, so it installs a snapshot and streams the delay
store from a peer). Then, once everything is due,
a final read from offset 0. The history (jepsen/history.py) goes to history.jsonl, the
verdict of jepsen/checker/delay.py to results.json; the exit code is 1 if it is invalid.

`DelayWorker` and `final_delay_read` are the same workload inside `python -m jepsen.run
--delay-workers N` (under its nemesis, beside the log workload): each worker schedules
records on RUN_TOPIC (one partition), cancels some, and polls the partition from its own
position between sends; after the heal, once everything is due, the final read pages the
partition from offset 0 until every scheduled, not cancelled record is there (or
FINAL_WAIT_S). Their operations are named `delay-send-delayed`, `delay-cancel`,
`delay-poll`, `delay-final-poll` (checker/delay.py RUN_NAMES).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from jepsen.checker.delay import RUN_NAMES, check_delay, summary
from jepsen.cluster import Cluster, HarnessError, http
from jepsen.history import NEMESIS, History
from jepsen.txn import create_txn_topic

TOPIC = "jepsen-delay"
POLL_WAIT_MS = 100
RETRIABLE = (429, 500, 502, 503, 504)
RUN_TOPIC = "jepsen-delayed"  # jepsen.run's delayed topic (one partition)
RUN_TIMEOUT_S = 10.0
CANCEL_EVERY = 10  # the run's workers cancel one scheduled record in this many
DUE_SLACK_S = 2.0  # the final read starts this long after the last deliver_at
FINAL_WAIT_S = 30.0  # ... and reads again until every due record is there, this long


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, required=True, help="work directory")
    parser.add_argument("--planted-bug", help="a dmq/planted.py bug to switch on")
    parser.add_argument("--records", type=int, default=120, help="records scheduled (120)")
    parser.add_argument("--delay-min-ms", type=int, default=300)
    parser.add_argument("--delay-max-ms", type=int, default=2_500)
    parser.add_argument("--kill-at-s", type=float, default=1.5, help="kill the leader then")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--snapshot-entries",
        type=int,
        default=0,
        help="--raft-snapshot-entries of the brokers (0: their default); a small value makes "
        "the restarted broker install a snapshot and copy the delay store from a peer",
    )


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _create_topic(cluster: Cluster) -> None:
    body = {"name": TOPIC, "partitions": 1, "replication_factor": 3}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            answer = http(cluster.brokers["n1"].url + "/v1/topics", "POST", body, timeout_s=10)
            if answer.status in (201, 409) and cluster.leader_of(TOPIC, 0):
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise HarnessError("create topic: no leader within 60 s")


class Workload:
    def __init__(self, cluster: Cluster, history: History, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.history = history
        self.args = args
        self.rng = random.Random(args.seed)
        self.stop = threading.Event()
        self.last_deliver_at = 0

    def _url(self, k: int) -> tuple[str, str]:
        live = self.cluster.live()
        broker = live[k % len(live)]
        return broker.node_id, broker.url

    def writer(self) -> None:
        for k in range(self.args.records):
            value = f"d{k}"
            delay = self.rng.randint(self.args.delay_min_ms, self.args.delay_max_ms)
            node, url = self._url(k)
            self.history.add(0, "invoke", "send-delayed", node, {"value": value, "delay_ms": delay})
            body = {"records": [{"value": value, "delay_ms": delay}]}
            try:
                answer = http(f"{url}/v1/topics/{TOPIC}/records", "POST", body, timeout_s=10)
            except OSError as exc:
                self.history.add(
                    0, "info", "send-delayed", node, {"value": value, "error": repr(exc)}
                )
                continue
            if answer.status != 200:
                kind = "info" if answer.status in RETRIABLE else "fail"
                self.history.add(0, kind, "send-delayed", node,
                                 {"value": value, "status": answer.status})  # fmt: skip
                continue
            placed = answer.json()["offsets"][0]
            self.last_deliver_at = max(self.last_deliver_at, placed["deliver_at"])
            self.history.add(0, "ok", "send-delayed", node,
                             {"value": value, "deliver_at": placed["deliver_at"],
                              "id": placed["id"]})  # fmt: skip
            if k % 10 == 5:
                self.cancel(value, placed["id"], url, node)
            time.sleep(0.01)

    def cancel(self, value: str, schedule_id: str, url: str, node: str) -> None:
        self.history.add(0, "invoke", "cancel", node, {"value": value, "id": schedule_id})
        try:
            answer = http(
                f"{url}/v1/topics/{TOPIC}/scheduled/{schedule_id}", "DELETE", timeout_s=10
            )
        except OSError:
            self.history.add(0, "info", "cancel", node, {"value": value})
            return
        kind = "ok" if answer.status == 200 else "fail" if answer.status == 404 else "info"
        self.history.add(0, kind, "cancel", node, {"value": value, "status": answer.status})

    def poll(self, process: int, offset: int, f: str = "poll") -> int:
        node, url = self._url(self.rng.randrange(1 << 30))
        self.history.add(process, "invoke", f, node, {"partition": 0, "offset": offset})
        query = f"offset={offset}&max_records=1000&wait_ms={POLL_WAIT_MS}"
        try:
            answer = http(f"{url}/v1/topics/{TOPIC}/partitions/0/records?{query}", timeout_s=10)
        except OSError as exc:
            self.history.add(process, "info", f, node, {"error": repr(exc)})
            return offset
        wall = _wall_ms()
        if answer.status != 200:
            self.history.add(process, "info", f, node, {"status": answer.status})
            return offset
        doc = answer.json()
        records = [[r["offset"], r["value"]] for r in doc["records"]]
        self.history.add(process, "ok", f, node,
                         {"partition": 0, "records": records, "next_offset": doc["next_offset"],
                          "high_watermark": doc["high_watermark"], "wall_ms": wall})  # fmt: skip
        return int(doc["next_offset"])

    def poller(self) -> None:
        offset = 0
        while not self.stop.is_set():
            offset = self.poll(1, offset)

    def nemesis(self, start: float) -> None:
        while time.monotonic() - start < self.args.kill_at_s:
            time.sleep(0.05)
        leader = self.cluster.leader_of(TOPIC, 0)
        if leader is None:
            return
        self.history.add(NEMESIS, "invoke", "kill", leader, None)
        self.cluster.brokers[leader].kill9()
        self.history.add(NEMESIS, "ok", "kill", leader, None)
        time.sleep(1.5)
        self.cluster.brokers[leader].start()
        self.history.add(NEMESIS, "ok", "restart", leader, None)

    def final_read(self) -> None:
        """Everything from offset 0, page after page, as one final-poll."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            records: list[list[Any]] = []
            offset, hw, ok = 0, 1, True
            node, url = self._url(0)
            self.history.add(2, "invoke", "final-poll", node, {"partition": 0, "offset": 0})
            while offset < hw:
                try:
                    answer = http(f"{url}/v1/topics/{TOPIC}/partitions/0/records"
                                  f"?offset={offset}&max_records=1000", timeout_s=10)  # fmt: skip
                except OSError:
                    ok = False
                    break
                if answer.status != 200:
                    ok = False
                    break
                doc = answer.json()
                records += [[r["offset"], r["value"]] for r in doc["records"]]
                offset, hw = doc["next_offset"], doc["high_watermark"]
                if not doc["records"]:
                    break
            if ok:
                self.history.add(2, "ok", "final-poll", node,
                                 {"partition": 0, "records": records, "wall_ms": _wall_ms()})  # fmt: skip
                return
            self.history.add(2, "info", "final-poll", node, None)
            time.sleep(0.5)


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(args.dir / "cluster", 3, planted_bug=args.planted_bug, durable_trace=False)
    if args.snapshot_entries:
        for broker in cluster.brokers.values():
            broker.args = [*broker.args, "--raft-snapshot-entries", str(args.snapshot_entries)]
    history = History(args.dir / "history.jsonl")
    try:
        cluster.start_all()
        _create_topic(cluster)
        work = Workload(cluster, history, args)
        start = time.monotonic()
        threads = [threading.Thread(target=work.writer), threading.Thread(target=work.poller),
                   threading.Thread(target=work.nemesis, args=(start,))]  # fmt: skip
        for t in threads:
            t.start()
        threads[0].join()
        threads[2].join()
        cluster.wait_ready(list(cluster.brokers.values()), 60)
        while _wall_ms() < work.last_deliver_at + 2_000:
            time.sleep(0.1)
        work.stop.set()
        threads[1].join()
        work.final_read()
    finally:
        history.close()
        cluster.close()
    verdict = check_delay(history.ops())
    result = {"planted_bug": args.planted_bug, **summary(verdict)}
    (args.dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def create_run_topic(cluster: Cluster, rf: int) -> None:
    create_txn_topic(cluster, rf, name=RUN_TOPIC, partitions=1)


class DelayWorker(threading.Thread):
    """jepsen.run's delayed-delivery client: schedules a record (delay `delay_ms`
    drawn in a range), cancels one in CANCEL_EVERY at once, polls between sends. It talks
    to each broker in turn; every request is one invoke and one completion."""

    def __init__(
        self,
        cluster: Cluster,
        history: History,
        k: int,
        processes: itertools.count[int],
        seed: int,
        stop: threading.Event,
        delay_ms: tuple[int, int] = (300, 2_500),
    ) -> None:
        super().__init__(name=f"delay-worker-{k}", daemon=True)
        self.cluster = cluster
        self.history = history
        self.k = k
        self.processes = processes
        self.rng = random.Random(seed)
        self.stop = stop
        self.delay_ms = delay_ms
        self.process = -1
        self.offset = 0
        self.turn = k
        self.last_deliver_at = 0
        self.error: BaseException | None = None

    def _broker(self) -> tuple[str, str]:
        ids = list(self.cluster.brokers)
        self.turn += 1
        node = ids[self.turn % len(ids)]
        return node, self.cluster.brokers[node].url

    def _call(self, f: str, value: dict[str, Any], method: str, path: str,
              body: Any = None) -> tuple[str, Any, str]:  # fmt: skip
        """One request logged as invoke + completion: ok (the answer's JSON), fail (a
        definite refusal) or info (unknown)."""
        node, url = self._broker()
        self.history.add(self.process, "invoke", f, node, value)
        try:
            answer = http(url + path, method, body, timeout_s=RUN_TIMEOUT_S)
        except ConnectionRefusedError as error:
            self.history.add(self.process, "fail", f, node, {**value, "error": repr(error)})
            return "fail", None, node
        except OSError as error:
            self.history.add(self.process, "info", f, node, {**value, "error": repr(error)})
            return "info", None, node
        if answer.status == 200:
            return "ok", answer.json(), node
        type_ = "info" if answer.status in RETRIABLE else "fail"
        self.history.add(self.process, type_, f, node, {**value, "status": answer.status})
        return type_, None, node

    def send(self, n: int) -> None:
        value = f"d{self.k}-{n}"
        delay = self.rng.randint(*self.delay_ms)
        body = {"records": [{"value": value, "delay_ms": delay}]}
        type_, doc, node = self._call(RUN_NAMES["send"], {"value": value, "delay_ms": delay},
                                "POST", f"/v1/topics/{RUN_TOPIC}/records", body)  # fmt: skip
        if type_ != "ok":
            return
        placed = doc["offsets"][0]
        self.last_deliver_at = max(self.last_deliver_at, int(placed["deliver_at"]))
        self.history.add(self.process, "ok", RUN_NAMES["send"], node,
                         {"value": value, "deliver_at": placed["deliver_at"],
                          "id": placed["id"]})  # fmt: skip
        if n % CANCEL_EVERY == CANCEL_EVERY // 2:
            path = f"/v1/topics/{RUN_TOPIC}/scheduled/{placed['id']}"
            type_, _, node = self._call(RUN_NAMES["cancel"], {"value": value, "id": placed["id"]},
                                  "DELETE", path)  # fmt: skip
            if type_ == "ok":
                self.history.add(self.process, "ok", RUN_NAMES["cancel"], node, {"value": value})

    def poll(self) -> None:
        path = (f"/v1/topics/{RUN_TOPIC}/partitions/0/records?offset={self.offset}"
                f"&max_records=1000&wait_ms={POLL_WAIT_MS}")  # fmt: skip
        type_, doc, node = self._call(RUN_NAMES["poll"], {"partition": 0, "offset": self.offset},
                                "GET", path)  # fmt: skip
        if type_ != "ok":
            return
        records = [[r["offset"], r["value"]] for r in doc["records"]]
        self.history.add(self.process, "ok", RUN_NAMES["poll"], node,
                         {"partition": 0, "records": records, "next_offset": doc["next_offset"],
                          "high_watermark": doc["high_watermark"], "wall_ms": _wall_ms()})  # fmt: skip
        self.offset = int(doc["next_offset"])

    def run(self) -> None:
        try:
            self.process = next(self.processes)
            for n in itertools.count():
                if self.stop.is_set():
                    return
                self.send(n)
                self.poll()
        except BaseException as error:  # noqa: BLE001 - the run reports it
            traceback.print_exc()
            self.error = error


def final_delay_read(
    cluster: Cluster, history: History, workers: list[DelayWorker], process: int
) -> None:
    """Once every scheduled record is due (DUE_SLACK_S after the last deliver_at), page
    the partition from offset 0 through each broker in turn, as one final-poll, until
    every scheduled record not cancelled (nor its cancel unknown) is there or
    FINAL_WAIT_S passed; the last complete read is the final one."""
    due_ms = max((w.last_deliver_at for w in workers), default=0) + DUE_SLACK_S * 1000
    while _wall_ms() < due_ms:
        time.sleep(0.1)
    expected = _expected(history)
    f = RUN_NAMES["final"]
    deadline = time.monotonic() + FINAL_WAIT_S
    for turn in itertools.count():
        ids = list(cluster.brokers)
        node = ids[turn % len(ids)]
        history.add(process, "invoke", f, node, {"partition": 0, "offset": 0})
        records = _read_all(cluster.brokers[node].url)
        if records is None:
            history.add(process, "info", f, node, None)
        else:
            last = time.monotonic() >= deadline
            if expected <= {v for _, v in records} or last:
                history.add(process, "ok", f, node, {"partition": 0, "records": records,
                                                     "wall_ms": _wall_ms()})  # fmt: skip
                return
            history.add(process, "info", f, node, {"missing": len(expected)})
        if time.monotonic() >= deadline + RUN_TIMEOUT_S:
            return  # no read worked: the checker says no-final-read
        time.sleep(0.5)


def _expected(history: History) -> set[str]:
    """Values scheduled (ok) whose cancel was never tried."""
    scheduled: set[str] = set()
    cancel_tried: set[str] = set()
    for op in history.ops():
        if op.f == RUN_NAMES["send"] and op.type == "ok":
            scheduled.add(op.value["value"])
        elif op.f == RUN_NAMES["cancel"] and op.type == "invoke":
            cancel_tried.add(op.value["value"])
    return scheduled - cancel_tried


def _read_all(url: str) -> list[list[Any]] | None:
    records: list[list[Any]] = []
    offset, hw = 0, 1
    while offset < hw:
        try:
            answer = http(f"{url}/v1/topics/{RUN_TOPIC}/partitions/0/records"
                          f"?offset={offset}&max_records=1000", timeout_s=RUN_TIMEOUT_S)  # fmt: skip
        except OSError:
            return None
        if answer.status != 200:
            return None
        doc = answer.json()
        records += [[r["offset"], r["value"]] for r in doc["records"]]
        offset, hw = doc["next_offset"], doc["high_watermark"]
        if not doc["records"]:
            break
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    result = run(parser.parse_args(argv))
    print(json.dumps(result, indent=2))
    return 0 if result["valid"] == "valid" else 1


if __name__ == "__main__":
    sys.exit(main())

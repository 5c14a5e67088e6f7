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
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from jepsen.checker.delay import check_delay, summary
from jepsen.cluster import Cluster, HarnessError, http
from jepsen.history import NEMESIS, History

TOPIC = "jepsen-delay"
POLL_WAIT_MS = 100
RETRIABLE = (429, 500, 502, 503, 504)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    result = run(parser.parse_args(argv))
    print(json.dumps(result, indent=2))
    return 0 if result["valid"] == "valid" else 1


if __name__ == "__main__":
    sys.exit(main())

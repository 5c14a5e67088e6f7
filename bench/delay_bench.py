"""`dmq bench delay`: how late delayed records arrive, and what pending ones cost in memory.

One real `dmq serve` (one node, loopback), one partition:

- lateness: each run schedules `--records` records with delays spread over 1-4 s (in
  requests of 100, while a consumer long-polls the partition) and measures, per record,
  the time the consumer first saw it minus its deliver_at. p50 and p99 per run; the
  medians over `--runs` are printed. The consumer's own fetch round trip is included (the
  figure is what an application sees), and so is the release duty's 50 ms tick;
- memory: the broker's RSS (VmRSS from /proc) with nothing pending, then after
  scheduling `--pending` records of ~100 B due in an hour (requests of 10,000), with its
  peak (VmHWM), then after a restart with them still pending (the store reopens its
  bucket files without reading the records into memory). The broker snapshots its
  partition every `SNAPSHOT_ENTRIES` Raft entries (`--raft-snapshot-entries`), so
  several snapshots run while the records are scheduled: a snapshot names the delay
  store, it does not carry the records (dmq/partition/delay.py). The ratio is against
  the RSS with none pending, in the same run.

The machine has 2 cores shared by the broker and this client: the lateness includes
their contention, not only the broker's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import main_of
from bench.broker_bench import Server

PENDING_REQUEST_RECORDS = 10_000
SNAPSHOT_ENTRIES = 16  # the memory run snapshots often: each would once have held them all


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", help="data directory (default: a temp dir here, removed after)")
    parser.add_argument("--records", type=int, default=2_000, help="records per lateness run")
    parser.add_argument("--pending", type=int, default=200_000, help="records left pending")
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    parser.add_argument("--quick", action="store_true", help="one small run (CI)")


def _call(url: str, method: str = "GET", doc: Any = None, timeout_s: float = 120) -> Any:
    data = None if doc is None else json.dumps(doc).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    req = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - 127.0.0.1
        return json.loads(resp.read())


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    """VmRSS (resident now) or VmHWM (peak resident) of a process, MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field}")


def _lateness_run(url: str, topic: str, records: int) -> list[float]:
    _call(f"{url}/v1/topics", "POST", {"name": topic, "partitions": 1})
    deliver_at: dict[str, int] = {}
    seen: dict[str, float] = {}
    done = threading.Event()

    def consume() -> None:
        offset = 0
        while not done.is_set():
            doc = _call(
                f"{url}/v1/topics/{topic}/partitions/0/records"
                f"?offset={offset}&max_records=10000&wait_ms=500"
            )
            now = time.time() * 1000
            for r in doc["records"]:
                seen.setdefault(r["value"], now)
            offset = doc["next_offset"]

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        for first in range(0, records, 100):
            batch: list[dict[str, Any]] = [
                {"value": f"v{i}", "partition": 0, "delay_ms": 1000 + (i * 7919) % 3000}
                for i in range(first, min(records, first + 100))
            ]
            answer = _call(f"{url}/v1/topics/{topic}/records", "POST", {"records": batch})
            for record, placed in zip(batch, answer["offsets"], strict=True):
                deliver_at[str(record["value"])] = placed["deliver_at"]
        deadline = time.monotonic() + 30
        while len(seen) < records and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        done.set()
        consumer.join()
    if len(seen) < records:
        raise RuntimeError(f"only {len(seen)} of {records} delayed records arrived")
    return sorted(seen[v] - at for v, at in deliver_at.items())


def _schedule_pending(url: str, topic: str, pending: int) -> float:
    _call(f"{url}/v1/topics", "POST", {"name": topic, "partitions": 1})
    value = "p" * 100
    start = time.perf_counter()
    for first in range(0, pending, PENDING_REQUEST_RECORDS):
        n = min(PENDING_REQUEST_RECORDS, pending - first)
        batch = [{"value": value, "partition": 0, "delay_ms": 3_600_000 + i} for i in range(n)]
        _call(f"{url}/v1/topics/{topic}/records", "POST", {"records": batch})
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(getattr(args, "quick", False))
    runs = 1 if quick else int(args.runs)
    records = 300 if quick else int(args.records)
    pending = 5_000 if quick else int(args.pending)
    base = Path(getattr(args, "dir", None) or tempfile.mkdtemp(prefix="dmq-bench-", dir="."))
    base.mkdir(parents=True, exist_ok=True)
    print("dmq bench delay: one broker over HTTP on loopback, one partition")
    print(f"  python {platform.python_version()}, {os.cpu_count()} cores shared by broker and")
    print(f"  client; lateness: {records} records with delays of 1-4 s, {runs} runs;")
    print(f"  memory: {pending} records of ~100 B pending (due in an hour)")
    samples: dict[str, list[float]] = {}
    try:
        for run_index in range(runs):
            with Server(base / f"lateness-{run_index}") as server:
                late = _lateness_run(server.url, "late", records)
            samples.setdefault("lateness_p50_ms", []).append(statistics.median(late))
            samples.setdefault("lateness_p99_ms", []).append(late[int(len(late) * 0.99) - 1])
            samples.setdefault("lateness_max_ms", []).append(late[-1])
            samples.setdefault("early_records", []).append(sum(1 for x in late if x < 0))
        data_dir = base / "memory"
        snapshots = ("--raft-snapshot-entries", str(SNAPSHOT_ENTRIES))
        with Server(data_dir, snapshots) as server:
            assert server.proc is not None
            _call(f"{server.url}/v1/topics", "POST", {"name": "warm", "partitions": 1})
            time.sleep(1)
            samples["rss_none_mb"] = [_rss_mb(server.proc.pid)]
            samples["schedule_s"] = [_schedule_pending(server.url, "pending", pending)]
            samples["rss_pending_mb"] = [_rss_mb(server.proc.pid)]
            samples["rss_peak_mb"] = [_rss_mb(server.proc.pid, "VmHWM")]
            count = _call(f"{server.url}/v1/topics/pending/scheduled")["count"]
        with Server(data_dir, snapshots) as server:
            assert server.proc is not None
            time.sleep(1)
            samples["rss_pending_after_restart_mb"] = [_rss_mb(server.proc.pid)]
            count_after = _call(f"{server.url}/v1/topics/pending/scheduled")["count"]
        store_bytes = sum(f.stat().st_size for f in data_dir.rglob("*.bucket"))
    finally:
        if getattr(args, "dir", None) is None:
            shutil.rmtree(base, ignore_errors=True)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    medians["rss_pending_ratio"] = medians["rss_pending_mb"] / medians["rss_none_mb"]
    medians["rss_after_restart_ratio"] = (
        medians["rss_pending_after_restart_mb"] / medians["rss_none_mb"]
    )
    print(f"\n  lateness seen by a consumer: p50 {medians['lateness_p50_ms']:.0f} ms, "
          f"p99 {medians['lateness_p99_ms']:.0f} ms, max {medians['lateness_max_ms']:.0f} ms; "
          f"early records: {medians['early_records']:.0f}")  # fmt: skip
    print(f"  RSS with none pending      {medians['rss_none_mb']:8.1f} MB")
    print(f"  RSS with {pending} pending  {medians['rss_pending_mb']:8.1f} MB "
          f"({medians['rss_pending_ratio']:.2f}x; scheduled in {medians['schedule_s']:.1f} s)")  # fmt: skip
    print(f"  ... its peak (VmHWM)       {medians['rss_peak_mb']:8.1f} MB "
          f"(snapshots every {SNAPSHOT_ENTRIES} Raft entries)")  # fmt: skip
    print(f"  ... after a restart        {medians['rss_pending_after_restart_mb']:8.1f} MB "
          f"({medians['rss_after_restart_ratio']:.2f}x); delay store on disk "
          f"{store_bytes / 1e6:.1f} MB")  # fmt: skip
    return {"medians": medians, "pending_counted": [count, count_after]}


main = main_of(__doc__, add_arguments, run)

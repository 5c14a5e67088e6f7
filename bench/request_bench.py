"""Broker CPU per one-record produce request through the whole HTTP path (#22).

    python -m bench.request_bench [--requests N] [--rounds R] [--against OLD_TREE]

Starts a 1-node `dmq serve` (fsync durability, its defaults) on loopback, creates a
topic of one partition and sends N sequential one-record binary produces (100-byte value)
on one keep-alive connection, after a 200-request warm-up. The figure is the broker's
CPU time (utime + stime from /proc, every thread) over those requests, less its idle CPU
rate (measured for 2 s after) times their duration, per request: run-queue waits on a
loaded machine do not count, the CPU the request path burns does. With `--against`, a
tree of another build (e.g. `git archive main | tar -x -C /tmp/base`) is started beside
this one with the same interpreter and the rounds alternate between the two; medians
and the ratio are printed. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.loopback import common_free_port
from log.records import Record, encode_batch

ROOT = Path(__file__).resolve().parent.parent
BATCH_CONTENT_TYPE = "application/vnd.dmq.batch"
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _start(root: Path, data_dir: str) -> tuple[subprocess.Popen[bytes], int]:
    port, raft_port = common_free_port(["127.0.0.1"]), common_free_port(["127.0.0.1"])
    with open(data_dir + ".log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dmq", "serve", "--data-dir", data_dir]
            + ["--http-addr", f"127.0.0.1:{port}", "--raft-addr", f"127.0.0.1:{raft_port}"],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            stdout=log,
            stderr=log,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise SystemExit(f"the broker of {root} did not become ready")


def _produce(conn: http.client.HTTPConnection, body: bytes) -> None:
    conn.request(
        "POST", "/v1/topics/t/records?partition=0", body, {"Content-Type": BATCH_CONTENT_TYPE}
    )
    resp = conn.getresponse()
    resp.read()
    if resp.status != 200:
        raise SystemExit(f"produce answered {resp.status}")


def _round(proc: subprocess.Popen[bytes], port: int, requests: int, body: bytes) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(200):
        _produce(conn, body)
    cpu0, wall0 = _cpu_s(proc.pid), time.monotonic()
    for _ in range(requests):
        _produce(conn, body)
    cpu1, wall1 = _cpu_s(proc.pid), time.monotonic()
    conn.close()
    time.sleep(2)
    idle_rate = (_cpu_s(proc.pid) - cpu1) / (time.monotonic() - wall1)
    return (cpu1 - cpu0 - idle_rate * (wall1 - wall0)) / requests * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per round")
    parser.add_argument("--rounds", type=int, default=5, help="medians of this many")
    parser.add_argument("--against", type=Path, help="tree of another build to alternate with")
    args = parser.parse_args(argv)
    roots = [ROOT] + ([args.against.resolve()] if args.against else [])
    body = encode_batch([Record(key=None, value=b"x" * 100, timestamp_ms=1)])
    print(f"load average at start: {os.getloadavg()}")
    samples: dict[Path, list[float]] = {root: [] for root in roots}
    with tempfile.TemporaryDirectory() as tmp:
        brokers = {}
        try:
            for i, root in enumerate(roots):
                brokers[root] = _start(root, f"{tmp}/broker{i}")
                conn = http.client.HTTPConnection("127.0.0.1", brokers[root][1])
                topic = json.dumps({"name": "t", "partitions": 1})
                conn.request("POST", "/v1/topics", topic, {"Content-Type": "application/json"})
                conn.getresponse().read()
                conn.close()
            for n in range(args.rounds):
                for root in roots:
                    samples[root].append(_round(*brokers[root], args.requests, body))
                print(f"round {n}: " + ", ".join(f"{s[-1]:.0f}" for s in samples.values()))
        finally:
            for proc, _ in brokers.values():
                proc.terminate()
                proc.wait(15)
    print("broker CPU us per one-record produce, median (rounds):")
    medians = {root: statistics.median(s) for root, s in samples.items()}
    for root, s in samples.items():
        print(f"  {str(root):40} {medians[root]:8.0f}  ({', '.join(f'{x:.0f}' for x in s)})")
    if args.against:
        print(f"  this / --against: {medians[ROOT] / medians[args.against.resolve()]:.3f}")
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

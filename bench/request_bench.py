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

    python -m bench.request_bench --chain [--against OLD_TREE]

In process instead: the CPU microseconds (`time.process_time`) aiohttp's dispatch of one
request through the application `make_app` builds takes (its middlewares, routing, the
response) around a handler that only answers "ok", less the handler alone; a stub stands
for the broker (no cluster secret, auth off, one metrics call). With `--against`, the same
is measured in a process importing the other tree, alternately.
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

from bench.cpu import process_cpu_s
from bench.loopback import common_free_port
from log.records import Record, encode_batch

ROOT = Path(__file__).resolve().parent.parent
BATCH_CONTENT_TYPE = "application/vnd.dmq.batch"


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
    cpu0, wall0 = process_cpu_s(proc.pid), time.monotonic()
    for _ in range(requests):
        _produce(conn, body)
    cpu1, wall1 = process_cpu_s(proc.pid), time.monotonic()
    conn.close()
    time.sleep(2)
    idle_rate = (process_cpu_s(proc.pid) - cpu1) / (time.monotonic() - wall1)
    return (cpu1 - cpu0 - idle_rate * (wall1 - wall0)) / requests * 1e6


def _chain_us(rounds: int) -> list[float]:
    import asyncio
    import types

    from aiohttp import web
    from aiohttp.test_utils import make_mocked_request

    from http_api.app import make_app

    stub = types.SimpleNamespace(
        config=types.SimpleNamespace(request_bytes_max=1 << 20, signature_replay_entries_max=1024),
        metrics=types.SimpleNamespace(observe_request=lambda *args: None),
        cluster_secret=None,
        security=types.SimpleNamespace(enabled=False),
        cluster_id="c1",
    )
    app = make_app(stub)  # type: ignore[arg-type]

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_route("POST", "/bench/{topic}", ok)
    app.freeze()

    async def measure() -> list[float]:
        request = make_mocked_request("POST", "/bench/t", app=app)
        match_info = await app.router.resolve(request)
        match_info.add_app(app)
        request._match_info = match_info
        out = []
        for _ in range(rounds):
            started = time.process_time()
            for _ in range(20000):
                await app._handle(request)
            whole = time.process_time() - started
            started = time.process_time()
            for _ in range(20000):
                await ok(request)
            out.append((whole - (time.process_time() - started)) / 20000 * 1e6)
        return out

    return asyncio.run(measure())


def _chain(rounds: int, against: Path | None) -> None:
    samples: dict[str, list[float]] = {"this": [], "--against": []}
    for _ in range(rounds):
        samples["this"] += _chain_us(1)
        if against is not None:
            out = subprocess.run(
                [sys.executable, __file__, "--chain-once"],
                env={**os.environ, "PYTHONPATH": f"{against}{os.pathsep}{ROOT}"},
                cwd=against,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            samples["--against"].append(float(out))
    print("CPU us per request of dispatch and middlewares, median (rounds):")
    for name, s in samples.items():
        if s:
            print(f"  {name:10} {statistics.median(s):7.2f}  ({', '.join(f'{x:.2f}' for x in s)})")
    if against is not None:
        ratio = statistics.median(samples["this"]) / statistics.median(samples["--against"])
        print(f"  this / --against: {ratio:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per round")
    parser.add_argument("--rounds", type=int, default=5, help="medians of this many")
    parser.add_argument("--against", type=Path, help="tree of another build to alternate with")
    parser.add_argument("--chain", action="store_true", help="in process, the middlewares")
    parser.add_argument("--chain-once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.chain_once:
        print(_chain_us(1)[0])
        return 0
    if args.chain:
        print(f"load average at start: {os.getloadavg()}")
        _chain(args.rounds, args.against.resolve() if args.against else None)
        print(f"load average at end: {os.getloadavg()}")
        return 0
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

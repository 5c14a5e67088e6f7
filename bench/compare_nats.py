"""`python -m bench.compare_nats`: a 3-node dmq cluster against a 3-node NATS JetStream
cluster (stream replicas=3), same machine, same workload, same run.

Prerequisites (nothing is downloaded at run time): the Debian package `nats-server`
(`apt-get install -y nats-server`) and the `nats-py` client (`pip install nats-py`, in
dmq's dev dependencies).

Workload, 1 KiB messages, for each system:

1. **throughput**: `--messages` messages with `--in-flight` (256) unacknowledged at once
   (a sliding window: a new publish leaves as soon as one is acknowledged); messages/s.
   NATS: `js.publish` per message (each waits for its PubAck). dmq: `AsyncProducer.send`
   with its batching (one request per partition in flight), acks=all, once for each
   `--linger-ms` (5, the client's default, and 0). In this closed loop a linger only
   delays: the window's records gather behind the request in flight anyway, and once it
   is answered nothing more comes until the next batch is acknowledged, so linger 5 spends
   5 ms of every round trip waiting (bench/README.md, "Linger in a closed loop");
2. **latency**: one message at a time, each waiting for its acknowledgement, p50 and p99.
   NATS: `js.publish`; dmq: `AsyncProducer(linger_ms=0).send_and_wait`, one record per
   request.

Each client talks to the node that leads the stream (NATS) or the partition (dmq), so
neither pays a forwarding hop. NATS runs as shipped: its file store does not fsync before
acknowledging (it syncs every 2 minutes by default), so dmq is shown with Raft durability
fsync (an fdatasync before any reply, its default) and none (the same promise as NATS).
Every process started here is killed before `run` returns, errors included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cluster_bench import (
    ClusterError,
    complete_options,
    create_topic,
    dmq_cluster,
    log_tail,
    percentile,
    urlopen_status,
    wait_leader,
)
from bench.loopback import common_free_port
from bench.memory import memory_state
from dmq.errors import DmqError

MESSAGE_BYTES = 1024
NATS_HOST_FIRST = 21  # NATS nodes listen on 127.0.0.21, .22, .23
NODES = 3
STREAM = "BENCH"
SUBJECT = "bench.m"
START_TIMEOUT_S = 30.0
NATS_SERVER = "nats-server"

TARGET_RECORDS_RATIO_MIN = 1.0  # dmq records/s over NATS R3 msgs/s
TARGET_P99_RATIO_MAX = 2.0  # dmq single-record p99 over NATS's


def nats_server_path() -> str | None:
    """The nats-server binary (Debian installs it in /usr/sbin, often not on a user's PATH)."""
    found = shutil.which(NATS_SERVER)
    if found is None and os.access("/usr/sbin/nats-server", os.X_OK):
        found = "/usr/sbin/nats-server"
    return found


def nats_py_installed() -> bool:
    try:
        import nats  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- NATS cluster


@dataclass
class NatsNode:
    name: str
    host: str
    client_port: int
    monitor_port: int
    log_path: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.client_port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _nats_config(
    name: str, host: str, ports: tuple[int, int, int], hosts: list[str], store: Path
) -> str:
    client, route, monitor = ports
    routes = ", ".join(f'"nats-route://{h}:{route}"' for h in hosts if h != host)
    return (
        f'server_name: "{name}"\n'
        f'listen: "{host}:{client}"\n'
        f'http: "{host}:{monitor}"\n'
        f'jetstream {{ store_dir: "{store}" }}\n'
        f'cluster {{ name: "bench", listen: "{host}:{route}", routes: [{routes}] }}\n'
    )


@contextlib.contextmanager
def nats_cluster(work_dir: Path) -> Iterator[list[NatsNode]]:
    """Three JetStream nodes with file storage in `work_dir`; all stopped at exit."""
    binary = nats_server_path()
    if binary is None:
        raise ClusterError("nats-server is not installed (apt-get install -y nats-server)")
    hosts = [f"127.0.0.{NATS_HOST_FIRST + k}" for k in range(NODES)]
    client = common_free_port(hosts)
    route = common_free_port(hosts, avoid=[client])
    monitor = common_free_port(hosts, avoid=[client, route])
    work_dir.mkdir(parents=True, exist_ok=True)
    nodes: list[NatsNode] = []
    try:
        for k, host in enumerate(hosts):
            name = f"n{k + 1}"
            conf = work_dir / f"{name}.conf"
            conf.write_text(
                _nats_config(name, host, (client, route, monitor), hosts, work_dir / name)
            )
            log_path = work_dir / f"{name}.log"
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    [binary, "-c", str(conf)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
                )
            nodes.append(NatsNode(name, host, client, monitor, log_path, proc))
        yield nodes
    finally:
        for node in nodes:
            node.stop()


async def _nats_connect(url: str) -> Any:
    import nats

    return await nats.connect(
        url, connect_timeout=2, max_reconnect_attempts=0, allow_reconnect=False
    )


async def _nats_healthy(nodes: list[NatsNode], deadline: float) -> None:
    """Every node's monitoring /healthz answers 200 (JetStream up and current)."""
    for node in nodes:
        while True:
            if node.proc.poll() is not None:
                raise ClusterError(f"nats {node.name} exited:\n" + log_tail(node.log_path))
            url = f"http://{node.host}:{node.monitor_port}/healthz"
            with contextlib.suppress(OSError), urlopen_status(url) as status:
                if status == 200:
                    break
            if time.monotonic() > deadline:
                raise ClusterError(f"nats {node.name} not healthy:\n" + log_tail(node.log_path))
            await asyncio.sleep(0.05)


async def nats_stream_leader(nodes: list[NatsNode]) -> str:
    """Create the R3 file stream (retrying until JetStream's cluster is up); the URL of
    the node leading it."""
    from nats.js.api import StorageType, StreamConfig

    deadline = time.monotonic() + START_TIMEOUT_S
    await _nats_healthy(nodes, deadline)
    last: Exception | None = None
    while time.monotonic() < deadline:
        for node in nodes:
            if node.proc.poll() is not None:
                raise ClusterError(f"nats {node.name} exited:\n" + log_tail(node.log_path))
        try:
            nc = await _nats_connect(nodes[0].url)
            try:
                js = nc.jetstream(timeout=2)
                config = StreamConfig(
                    name=STREAM, subjects=[SUBJECT], num_replicas=NODES, storage=StorageType.FILE
                )
                with contextlib.suppress(Exception):
                    await js.add_stream(config)
                info = await js.stream_info(STREAM)
                leader = info.cluster.leader if info.cluster else None
                if leader and len(info.cluster.replicas or []) == NODES - 1:
                    await js.publish(SUBJECT, b"warm-up")
                    return next(n.url for n in nodes if n.name == leader)
            finally:
                await nc.close()
        except Exception as exc:  # noqa: BLE001 - anything NATS says while it forms
            last = exc
        await asyncio.sleep(0.2)
    raise ClusterError(f"NATS JetStream stream not ready after {START_TIMEOUT_S:.0f} s: {last!r}")


# --------------------------------------------------------------------------- workload


async def sliding_window(
    publish: Callable[[], Awaitable[Any]], total: int, in_flight: int
) -> float:
    """`total` publishes, `in_flight` unacknowledged at once; messages/s."""
    remaining = [total]

    async def worker() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            await publish()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return total / (time.perf_counter() - start)


async def one_at_a_time(publish: Callable[[], Awaitable[Any]], count: int) -> dict[str, float]:
    """p50/p99 of `count` publishes, each waiting for its acknowledgement, after a
    warm-up of count / 10 that is not counted."""
    for _ in range(max(1, count // 10)):
        await publish()
    latencies = []
    for _ in range(count):
        sent = time.perf_counter()
        await publish()
        latencies.append(time.perf_counter() - sent)
    latencies.sort()
    return {
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


async def measure_nats(url: str, args: argparse.Namespace) -> dict[str, float]:
    nc = await _nats_connect(url)
    try:
        js = nc.jetstream(timeout=30)
        payload = os.urandom(MESSAGE_BYTES)

        async def publish() -> None:
            await js.publish(SUBJECT, payload, stream=STREAM)

        await sliding_window(publish, max(args.in_flight, args.messages // 10), args.in_flight)
        msgs_s = await sliding_window(publish, args.messages, args.in_flight)
        latency = await one_at_a_time(publish, args.latency_count)
    finally:
        await nc.close()
    return {"msgs_s": msgs_s, **latency}


async def measure_dmq(url: str, topic: str, args: argparse.Namespace) -> dict[str, float]:
    from dmq.client import AsyncProducer

    payload = os.urandom(MESSAGE_BYTES)
    out: dict[str, float] = {}
    for linger_ms in args.linger_ms:
        async with AsyncProducer(url, acks="all", linger_ms=linger_ms) as producer:

            async def send_batched() -> None:
                await (await producer.send(topic, payload, partition=0))

            warm_up = max(args.in_flight, args.messages // 10)
            await sliding_window(send_batched, warm_up, args.in_flight)
            out[f"msgs_s_linger{linger_ms}"] = await sliding_window(
                send_batched, args.messages, args.in_flight
            )
    async with AsyncProducer(url, acks="all", linger_ms=0) as producer:

        async def send_one() -> None:
            await producer.send_and_wait(topic, payload, partition=0)

        latency = await one_at_a_time(send_one, args.latency_count)
    return {**out, **latency}


async def _dmq_leader_url(brokers: Any, topic: str) -> str:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await create_topic(session, brokers[0].url, topic, 1, len(brokers))
        return str((await wait_leader(session, brokers, topic)).url)


def measure_run(base: Path, run_index: int, args: argparse.Namespace) -> dict[str, float]:
    """One run: NATS, then dmq with each durability, each on a fresh cluster."""
    out: dict[str, float] = {}
    work = base / f"run{run_index}-nats"
    with nats_cluster(work) as nodes:
        url = asyncio.run(nats_stream_leader(nodes))
        out.update({f"nats_{k}": v for k, v in asyncio.run(measure_nats(url, args)).items()})
    shutil.rmtree(work, ignore_errors=True)
    for durability in args.durability:
        work = base / f"run{run_index}-dmq-{durability}"
        topic = f"bench-nats-{run_index}"
        with dmq_cluster(work, NODES, durability) as brokers:
            url = asyncio.run(_dmq_leader_url(brokers, topic))
            figures = asyncio.run(measure_dmq(url, topic, args))
        shutil.rmtree(work, ignore_errors=True)
        out.update({f"dmq_{durability}_{k}": v for k, v in figures.items()})
    return out


# --------------------------------------------------------------------------- run


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the comparison as `args` say; print and return every figure."""
    args = _complete(args)
    if nats_server_path() is None or not nats_py_installed():
        raise ClusterError(
            "needs nats-server (apt-get install -y nats-server) and nats-py (pip install nats-py)"
        )
    base = Path(tempfile.mkdtemp(prefix="dmq-nats-bench-", dir=args.dir or ".")).resolve()
    _print_setup(args, base)
    samples: dict[str, list[float]] = {}
    try:
        for run_index in range(args.runs):
            for key, value in measure_run(base, run_index, args).items():
                samples.setdefault(key, []).append(value)
            print(f"  run {run_index + 1}/{args.runs} done", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    checks = _print_result(medians, args)
    result = {"setup": _setup(args), "medians": medians, "samples": samples, "checks": checks}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


def _complete(args: argparse.Namespace) -> argparse.Namespace:
    done = complete_options(add_arguments, args)
    if done.quick:
        done.runs, done.messages, done.latency_count = 1, 3000, 300
    return done


def _setup(args: argparse.Namespace) -> dict[str, Any]:
    version = subprocess.run(
        [nats_server_path() or NATS_SERVER, "--version"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "nats_server": version,
        "message_bytes": MESSAGE_BYTES,
        "messages": args.messages,
        "in_flight": args.in_flight,
        "latency_count": args.latency_count,
        "runs": args.runs,
        "durability": list(args.durability),
        "linger_ms": list(args.linger_ms),
    }


def _print_setup(args: argparse.Namespace, base: Path) -> None:
    setup = _setup(args)
    print("dmq vs NATS JetStream: 3 nodes each, loopback, replicas 3, acks from a majority")
    print(
        f"  python {setup['python']}, {setup['nats_server']}, {setup['cpus']} cores shared by "
        f"all 3 nodes and the client (one machine), load {os.getloadavg()[0]:.2f}; data in {base}"
    )
    print(f"  {memory_state()}")
    print(
        f"  {MESSAGE_BYTES} B messages; throughput: {args.messages} with {args.in_flight} in "
        f"flight; latency: {args.latency_count} one at a time; {args.runs} runs, medians"
    )
    print(
        "  NATS: file storage as shipped (no fsync before the ack; synced every 2 min); "
        f"dmq: raft durability {' and '.join(args.durability)}, acks=all, Python client",
        flush=True,
    )


def _print_result(medians: dict[str, float], args: argparse.Namespace) -> dict[str, bool]:
    print(
        f"\n{'system':28} {'msgs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'x NATS msgs/s':>14} {'x NATS p99':>11}"
    )
    nats_rate, nats_p99 = medians["nats_msgs_s"], medians["nats_p99_ms"]
    print(
        f"{'NATS JetStream R3 (no fsync)':28} {nats_rate:9.0f} {medians['nats_p50_ms']:8.2f} {nats_p99:8.2f}"
    )
    checks: dict[str, bool] = {}
    for d in args.durability:
        p50, p99 = medians[f"dmq_{d}_p50_ms"], medians[f"dmq_{d}_p99_ms"]
        for k, linger_ms in enumerate(args.linger_ms):
            rate = medians[f"dmq_{d}_msgs_s_linger{linger_ms}"]
            label = f"dmq 3 nodes, {d}, linger {linger_ms}"
            latency = f"{p50:8.2f} {p99:8.2f}" if k == 0 else f"{'':8} {'':8}"
            ratio = f"{p99 / nats_p99:11.2f}" if k == 0 else ""
            print(f"{label:28} {rate:9.0f} {latency} {rate / nats_rate:14.2f} {ratio}")
            checks[
                f"dmq ({d}, linger {linger_ms}) records/s >= {TARGET_RECORDS_RATIO_MIN:g}x NATS R3"
            ] = rate / nats_rate >= TARGET_RECORDS_RATIO_MIN
        checks[f"dmq ({d}) single-record p99 <= {TARGET_P99_RATIO_MAX:g}x NATS's"] = (
            p99 / nats_p99 <= TARGET_P99_RATIO_MAX
        )
    print("\nnote: nats-server does not fsync before acknowledging by default; dmq fsync does.")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print("targets:")
    for name, ok in checks.items():
        print(f"  {'met  ' if ok else 'UNMET'}  {name}")
    return checks


def _linger_list(text: str) -> list[int]:
    """--linger-ms: distinct integers from 0 to 1000, comma-separated."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--linger-ms: integers, not {text!r}") from None
    if not values or len(set(values)) != len(values) or not all(0 <= v <= 1000 for v in values):
        raise argparse.ArgumentTypeError(
            f"--linger-ms: distinct values from 0 to 1000, not {text!r}"
        )
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="one short run (CI)")
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are shown")
    parser.add_argument("--messages", type=int, default=50_000, help="throughput messages")
    parser.add_argument("--in-flight", type=int, default=256, help="unacknowledged at once")
    parser.add_argument("--latency-count", type=int, default=2000, help="one-at-a-time sends")
    parser.add_argument("--durability", default="fsync,none", help="dmq --raft-durability values")
    parser.add_argument(
        "--linger-ms",
        type=_linger_list,
        default=[5, 0],
        help="comma-separated linger_ms values of dmq's throughput phase (default 5,0)",
    )
    parser.add_argument("--dir", help="make the work directory inside DIR (default: here)")
    parser.add_argument("--json", help="also write the result here")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare_nats", description=__doc__.split("\n\n")[0]
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run(args)
    except ValueError as exc:
        parser.error(str(exc))
    except (ClusterError, DmqError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench.cluster_bench`: a replicated dmq cluster against one node, end to end.

Starts `--nodes` (3) `dmq serve` processes on loopback (127.0.0.11, .12, ...; one Raft
group per partition), all on this machine, and measures with 1 KiB records, acks=all:

a. **batched**: ready binary RecordBatches of `--batch-records` (128) records POSTed to
   the partition leader, `--in-flight` (8) requests at once: MB/s and records/s;
b. **single**: one record per request, `--single-in-flight` (64) requests at once:
   records/s;
c. **latency**: one record per request at a fixed `--rate` (500/s, open loop): p50, p99;
d. **failover**: one record at a time through a follower; kill -9 of the partition
   leader; seconds from the kill until a produce succeeds again;
e. the same (a)-(c) against a single-node `dmq serve` (a one-node cluster on the same
   code path) in the same run: the baseline, and the ratios;
f. **partitions**: on a fresh cluster, a topic of `--partitions` (1000) partitions,
   replication factor 3: seconds from the create request until every group has a leader
   (GET /v1/cluster/status), then each broker's CPU over `--idle-seconds` (10) idle
   seconds, % of one core (/proc/<pid>/stat utime + stime).

(a)-(c) run with each `--durability` (fsync, the default, and none: the
`--raft-durability` of `dmq serve`). Every figure is the median of `--runs` runs; the
brokers and this client share the machine's cores. Every process started here is killed
before `run` returns, errors included.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import platform
import secrets
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.cpu import process_cpu_s
from bench.loopback import common_free_port
from bench.memory import memory_state
from bench.tree import start_python
from log.records import Record, encode_batch

RECORD_BYTES = 1024
BATCH_CONTENT_TYPE = "application/vnd.dmq.batch"
HOST_FIRST = 11  # nodes listen on 127.0.0.11, .12, ...
READY_TIMEOUT_S = 60.0
LEADER_TIMEOUT_S = 60.0
FAILOVER_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
# Answers that mean "not now" (backpressure, no leader yet): retried after a pause.
RETRY_STATUSES = frozenset({429, 503})
RETRY_PAUSE_S = 0.01

TARGET_BATCHED_MB_S_MIN = 60.0
TARGET_LATENCY_P99_MS_MAX = 10.0
TARGET_PARTITIONS_START_S_MAX = 60.0
TARGET_IDLE_CPU_PERCENT_MAX = 10.0
BALANCE_WAIT_S_MAX = 180.0  # (f): the wait for the leaders to stop moving, at most

DURABILITIES = ("fsync", "none")


class ClusterError(RuntimeError):
    """The cluster under test misbehaved (did not start, errors, no leader)."""


# --------------------------------------------------------------------------- processes


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class RawBody(aiohttp.payload.BytesPayload):
    """A request body of bytes already in memory, of any size, without aiohttp's
    "large body" ResourceWarning: a body is at most one batch, sent in one write."""

    def __init__(self, value: bytes, content_type: str | None) -> None:
        aiohttp.payload.Payload.__init__(
            self, value, content_type=content_type or "application/octet-stream"
        )
        self._size = len(value)


@dataclass
class Broker:
    node_id: str
    host: str
    http_port: int
    log_path: Path
    proc: subprocess.Popen[bytes]
    tls: ssl.SSLContext | None = None  # https, checked against this CA context
    args: list[str] = field(default_factory=list)  # its `dmq serve` arguments

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.http_port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def restart(self) -> None:
        """Start it again with the same arguments (after kill or stop), not waiting."""
        self.proc = _spawn(self.args, self.log_path)

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _spawn(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """`dmq serve ARGS` of this tree (bench/tree.py), its output appended to `log_path`."""
    with open(log_path, "ab") as log:
        return start_python(
            ["-m", "dmq", "serve", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@contextlib.contextmanager
def dmq_cluster(
    work_dir: Path,
    nodes: int,
    durability: str,
    *,
    secret: bool = True,
    extra_args: Sequence[str] = (),
    tls: ssl.SSLContext | None = None,
) -> Iterator[list[Broker]]:
    """`nodes` brokers (1: a plain `dmq serve`, no --peers), ready; all killed at exit.
    A cluster of several shares a fresh secret (`--cluster-secret-file`) unless
    `secret=False`: that is how a cluster should run. `extra_args` go to every broker;
    `tls`: they serve https (given the --tls-* flags), checked with this context. Paths
    in `extra_args` must be absolute: the brokers run in the tree's root (bench/tree.py)."""
    work_dir = work_dir.resolve()  # absolute: the brokers run in another directory
    hosts = [f"127.0.0.{HOST_FIRST + k}" for k in range(nodes)]
    http_port = common_free_port(hosts)
    raft_port = common_free_port(hosts, avoid=[http_port])
    peers = ",".join(f"n{k + 1}={h}:{raft_port}" for k, h in enumerate(hosts))
    work_dir.mkdir(parents=True, exist_ok=True)
    secret_args: list[str] = []
    if nodes > 1 and secret:
        secret_file = work_dir / "cluster-secret"
        secret_file.write_text(secrets.token_hex(32))
        secret_args = ["--cluster-secret-file", str(secret_file)]
    brokers: list[Broker] = []
    try:
        for k, host in enumerate(hosts):
            node_id = f"n{k + 1}"
            args = ["--node-id", node_id, "--data-dir", str(work_dir / node_id),
                    "--http-addr", f"{host}:{http_port}", "--raft-addr", f"{host}:{raft_port}",
                    "--log-level", "warning", "--raft-durability", durability]  # fmt: skip
            if nodes > 1:
                args += ["--peers", peers, *secret_args]
            args += extra_args
            log_path = work_dir / f"{node_id}.log"
            proc = _spawn(args, log_path)
            brokers.append(Broker(node_id, host, http_port, log_path, proc, tls, args))
        _wait_ready(brokers)
        yield brokers
    except BaseException:
        _report_brokers(brokers)
        raise
    finally:
        for broker in brokers:
            broker.stop()


def _report_brokers(brokers: list[Broker]) -> None:
    """On a failure, say on stderr what each broker was doing (exit status, log tail)."""
    for b in brokers:
        state = "running" if b.alive() else f"exited with {b.proc.returncode}"
        print(f"[cluster_bench] {b.node_id} ({b.url}) {state}; log tail:", file=sys.stderr)
        print(log_tail(b.log_path, 8), file=sys.stderr)


def _wait_ready(brokers: list[Broker]) -> None:
    """Every broker answers GET /readyz with 200 (they join once a majority is up)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    pending = list(brokers)
    while pending:
        broker = pending[0]
        if not broker.alive():
            raise ClusterError(
                f"{broker.node_id} exited with {broker.proc.returncode} while starting:\n"
                + log_tail(broker.log_path)
            )
        try:
            with urlopen_status(broker.url + "/readyz", broker.tls) as status:
                if status == 200:
                    pending.pop(0)
                    continue
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{broker.node_id} not ready after {READY_TIMEOUT_S:.0f} s:\n"
                + log_tail(broker.log_path)
            )
        time.sleep(0.05)


@contextlib.contextmanager
def urlopen_status(url: str, tls: ssl.SSLContext | None = None) -> Iterator[int]:
    """The HTTP status of a GET (urllib raises on non-2xx; this does not)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1.0, context=tls) as response:  # noqa: S310 - a broker's http(s) URL
            yield int(response.status)
    except urllib.error.HTTPError as error:
        yield int(error.code)


# --------------------------------------------------------------------------- HTTP helpers


def one_record_batch() -> bytes:
    return encode_batch(records(1, 0))


def records(n: int, seed: int) -> list[Record]:
    now = int(time.time() * 1000)
    payload = os.urandom(RECORD_BYTES)
    return [Record(b"key-%012d" % (seed + i), payload, (), now) for i in range(n)]


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


async def create_topic(
    session: aiohttp.ClientSession, url: str, name: str, partitions: int, replication: int
) -> None:
    body = {"name": name, "partitions": partitions, "replication_factor": replication}
    async with session.post(f"{url}/v1/topics", json=body) as r:
        if r.status not in (200, 201):
            raise ClusterError(f"create topic {name}: {r.status} {await r.text()}")


async def json_request(
    session: aiohttp.ClientSession, method: str, url: str, doc: Any = None
) -> Any:
    """A JSON request's decoded answer; RuntimeError naming it on a status >= 300."""
    async with session.request(method, url, json=doc) as r:
        body = await r.json()
        if r.status >= 300:
            raise RuntimeError(f"{method} {url}: {r.status} {body}")
        return body


async def led_partitions(session: aiohttp.ClientSession, url: str, topic: str) -> dict[int, str]:
    """partition -> leader id of `topic`'s groups that have a leader now."""
    async with session.get(f"{url}/v1/cluster/status") as r:
        if r.status != 200:
            raise ClusterError(f"GET /v1/cluster/status: {r.status} {await r.text()}")
        status = await r.json()
    return {
        int(g["partition"]): str(g["leader"])
        for g in status.get("groups", [])
        if g.get("topic") == topic and g.get("leader") not in (None, "")
    }


async def wait_leader(
    session: aiohttp.ClientSession, brokers: list[Broker], topic: str, exclude: str = ""
) -> Broker:
    """The broker leading partition 0 of `topic` (asked of any live broker)."""
    deadline = time.monotonic() + LEADER_TIMEOUT_S
    if len(brokers) == 1 and not await _has_cluster_status(session, brokers[0].url):
        return brokers[0]  # a broker from before GET /v1/cluster/status: it leads everything
    while time.monotonic() < deadline:
        for asked in (b for b in brokers if b.alive()):
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ClusterError):
                leader_id = (await led_partitions(session, asked.url, topic)).get(0)
                leader = next((b for b in brokers if _is(b, leader_id)), None)
                if leader is not None and leader.alive() and leader.node_id != exclude:
                    return leader
        await asyncio.sleep(0.05)
    raise ClusterError(f"no leader for {topic}/0 after {LEADER_TIMEOUT_S:.0f} s")


async def _has_cluster_status(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.get(f"{url}/v1/cluster/status") as r:
        await r.read()
        return r.status != 404


def _is(broker: Broker, leader: str | None) -> bool:
    """Whether a leader field names this broker (by id, or by an address of it)."""
    return leader is not None and (leader == broker.node_id or leader.startswith(broker.host + ":"))


async def post_batch(session: aiohttp.ClientSession, url: str, topic: str, batch: bytes) -> int:
    """POST one binary batch with acks=all; the number of retried "not now" answers."""
    retried = 0
    while True:
        try:
            async with session.post(
                f"{url}/v1/topics/{topic}/records?partition=0&acks=all",
                data=RawBody(batch, BATCH_CONTENT_TYPE),
            ) as r:
                body = await r.read()
                status = r.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ClusterError(f"produce to {url} {topic}: {exc!r}") from exc
        if status == 200:
            return retried
        if status not in RETRY_STATUSES:
            raise ClusterError(f"produce to {url} {topic}: {status} {body[:300]!r}")
        retried += 1
        await asyncio.sleep(RETRY_PAUSE_S)


# --------------------------------------------------------------------------- (a) (b) (c)


async def closed_loop(
    session: aiohttp.ClientSession,
    url: str,
    topic: str,
    batches: list[bytes],
    in_flight: int,
    seconds: float,
) -> tuple[float, int, int, int]:
    """`in_flight` workers posting `batches` in turn for `seconds`: (elapsed, requests,
    bytes, retries). Elapsed runs to the last answer."""
    deadline = time.perf_counter() + seconds
    counts = [0, 0, 0]  # requests, bytes, retries
    next_batch = [0]

    async def worker() -> None:
        while time.perf_counter() < deadline:
            batch = batches[next_batch[0] % len(batches)]
            next_batch[0] += 1
            counts[2] += await post_batch(session, url, topic, batch)
            counts[0] += 1
            counts[1] += len(batch)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return time.perf_counter() - start, counts[0], counts[1], counts[2]


async def open_loop_latency(
    session: aiohttp.ClientSession, url: str, topic: str, rate: int, seconds: float
) -> tuple[list[float], int]:
    """One-record requests, request i sent at start + i / rate whatever came back before
    (a slow answer does not hide the queue behind it). (sorted latencies in s, errors)."""
    batch = one_record_batch()
    latencies: list[float] = []
    errors = [0]
    start = time.perf_counter()

    async def one(i: int) -> None:
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = time.perf_counter()
        try:
            async with session.post(
                f"{url}/v1/topics/{topic}/records?partition=0&acks=all",
                data=RawBody(batch, BATCH_CONTENT_TYPE),
            ) as r:
                await r.read()
                ok = r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        if ok:
            latencies.append(time.perf_counter() - sent)
        else:
            errors[0] += 1

    await asyncio.gather(*(one(i) for i in range(int(rate * seconds))))
    return sorted(latencies), errors[0]


async def produce_figures(
    brokers: list[Broker], run_index: int, args: argparse.Namespace
) -> dict[str, float]:
    """(a), (b) and (c) on a running cluster, each on its own one-partition topic."""
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=max(100, args.single_in_flight * 2))
    batches = [encode_batch(records(args.batch_records, i * args.batch_records)) for i in range(32)]
    single = [one_record_batch()]
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        leaders = {}
        for kind in ("batched", "single", "latency"):
            topic = f"bench-{kind}-{run_index}"
            await create_topic(session, brokers[0].url, topic, 1, len(brokers))
            leaders[kind] = (topic, (await wait_leader(session, brokers, topic)).url)
        topic, url = leaders["batched"]
        await closed_loop(session, url, topic, batches, args.in_flight, args.warmup_seconds)
        elapsed, requests, nbytes, retries_a = await closed_loop(
            session, url, topic, batches, args.in_flight, args.phase_seconds
        )
        out = {
            "batched_mb_s": nbytes / elapsed / 1e6,
            "batched_records_s": requests * args.batch_records / elapsed,
        }
        topic, url = leaders["single"]
        await closed_loop(session, url, topic, single, args.single_in_flight, args.warmup_seconds)
        elapsed, requests, _, retries_b = await closed_loop(
            session, url, topic, single, args.single_in_flight, args.phase_seconds
        )
        out["single_records_s"] = requests / elapsed
        topic, url = leaders["latency"]
        await open_loop_latency(session, url, topic, args.rate, args.warmup_seconds)
        lat, errors = await open_loop_latency(session, url, topic, args.rate, args.phase_seconds)
    if not lat:
        raise ClusterError(f"every latency request failed ({errors})")
    out["latency_p50_ms"] = percentile(lat, 0.50) * 1000
    out["latency_p99_ms"] = percentile(lat, 0.99) * 1000
    out["retried_answers"] = float(retries_a + retries_b)
    out["latency_errors"] = float(errors)
    return out


# --------------------------------------------------------------------------- (d) failover


async def failover(brokers: list[Broker], run_index: int) -> dict[str, float]:
    """kill -9 of a partition leader while producing one record at a time through a
    follower: seconds from the kill until a produce sent after it succeeds."""
    topic = f"bench-failover-{run_index}"
    batch = one_record_batch()
    timeout = aiohttp.ClientTimeout(total=2.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await create_topic(session, brokers[0].url, topic, 1, len(brokers))
        leader = await wait_leader(session, brokers, topic)
        entry = next(b for b in brokers if b is not leader)
        warm_until = time.perf_counter() + 1.0
        while time.perf_counter() < warm_until:
            await post_batch(session, entry.url, topic, batch)
        killed_at = time.perf_counter()
        leader.kill()
        attempts = 0
        while True:
            attempts += 1
            try:
                async with session.post(
                    f"{entry.url}/v1/topics/{topic}/records?partition=0&acks=all",
                    data=RawBody(batch, BATCH_CONTENT_TYPE),
                ) as r:
                    await r.read()
                    if r.status == 200:
                        break
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.perf_counter() - killed_at > FAILOVER_TIMEOUT_S:
                raise ClusterError(
                    f"no produce succeeded within {FAILOVER_TIMEOUT_S:.0f} s of killing "
                    f"{leader.node_id}:\n" + log_tail(entry.log_path)
                )
            await asyncio.sleep(RETRY_PAUSE_S)
        unavailable_s = time.perf_counter() - killed_at
    return {"failover_unavailable_s": unavailable_s, "failover_attempts": float(attempts)}


# --------------------------------------------------------------------------- (f) partitions


async def many_partitions(brokers: list[Broker], args: argparse.Namespace) -> dict[str, float]:
    """Create `--partitions` partitions (one topic), wait until each has a leader and the
    leader balancer has stopped moving them; then each broker's idle CPU, % of one core."""
    topic = "bench-partitions"
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        start = time.perf_counter()
        await create_topic(session, brokers[0].url, topic, args.partitions, len(brokers))
        created_s = time.perf_counter() - start
        deadline = start + max(3 * TARGET_PARTITIONS_START_S_MAX, 60.0)
        led = 0
        while True:
            for broker in brokers:
                if not broker.alive():
                    raise ClusterError(f"{broker.node_id} died:\n" + log_tail(broker.log_path))
            led = len(await led_partitions(session, brokers[0].url, topic))
            if led >= args.partitions:
                break
            if time.perf_counter() > deadline:
                raise ClusterError(
                    f"{led} of {args.partitions} partitions led after {deadline - start:.0f} s"
                )
            await asyncio.sleep(0.25)
        all_led_s = time.perf_counter() - start
        # Idle is measured once the leader balancer has stopped moving leaders: while it
        # moves them, each move is an election, a leader report to the metadata group
        # and a reconcile on every broker, which is work, not idleness.
        leaders = await led_partitions(session, brokers[0].url, topic)
        moved_at = time.perf_counter()
        balance_deadline = moved_at + BALANCE_WAIT_S_MAX
        while (
            time.perf_counter() - moved_at < args.balance_seconds
            and time.perf_counter() < balance_deadline
        ):
            await asyncio.sleep(1.0)
            now_leaders = await led_partitions(session, brokers[0].url, topic)
            if now_leaders != leaders:
                moved_at = time.perf_counter()
            leaders = now_leaders
        balanced_s = moved_at - start
        settled = time.perf_counter() - moved_at >= args.balance_seconds
        counts = collections.Counter(leaders.values())
    await asyncio.sleep(args.settle_seconds)
    before = [process_cpu_s(b.proc.pid) for b in brokers]
    wall_start = time.perf_counter()
    await asyncio.sleep(args.idle_seconds)
    wall = time.perf_counter() - wall_start
    idle = [
        100 * (process_cpu_s(b.proc.pid) - c) / wall for b, c in zip(brokers, before, strict=True)
    ]
    out = {"partitions_created_s": created_s, "partitions_all_led_s": all_led_s}
    out["leaders_balanced_s"] = balanced_s
    out["leaders_settled"] = 1.0 if settled else 0.0  # 0: still moving at the wait's end
    out["leaders_most_per_broker"] = float(max(counts.values(), default=0))
    out["leaders_fewest_per_broker"] = float(
        min((counts.get(b.node_id, 0) for b in brokers), default=0)
    )
    out["idle_cpu_percent_max"] = max(idle)
    out.update({f"idle_cpu_percent_{b.node_id}": v for b, v in zip(brokers, idle, strict=True)})
    return out


# --------------------------------------------------------------------------- run


FIGURES = (  # (key, label, unit, higher is better)
    ("batched_mb_s", "(a) batched produce", "MB/s", True),
    ("batched_records_s", "(a) batched produce", "records/s", True),
    ("single_records_s", "(b) single-record produce", "records/s", True),
    ("latency_p50_ms", "(c) single-record latency p50", "ms", False),
    ("latency_p99_ms", "(c) single-record latency p99", "ms", False),
)


def measure_run(base: Path, run_index: int, args: argparse.Namespace) -> dict[str, float]:
    """One run: (a)-(c) on the cluster and the single node per durability, (d), (f)."""
    out: dict[str, float] = {}
    for durability in args.durability:
        systems = [("cluster", args.nodes), ("single", 1)]
        if run_index % 2:  # alternate which goes first
            systems.reverse()
        for system, nodes in systems:
            work = base / f"run{run_index}-{system}-{durability}"
            with dmq_cluster(work, nodes, durability, secret=args.cluster_secret) as brokers:
                figures = asyncio.run(produce_figures(brokers, run_index, args))
                if system == "cluster" and durability == args.durability[0] and nodes > 1:
                    figures.update(asyncio.run(failover(brokers, run_index)))
            shutil.rmtree(work, ignore_errors=True)
            for key, value in figures.items():
                prefix = "" if key.startswith("failover") else f"{system}_{durability}_"
                out[prefix + key] = value
    if args.partitions > 0 and args.nodes > 1:
        work = base / f"run{run_index}-partitions"
        with dmq_cluster(
            work, args.nodes, args.durability[0], secret=args.cluster_secret
        ) as brokers:
            out.update(asyncio.run(many_partitions(brokers, args)))
        shutil.rmtree(work, ignore_errors=True)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark as `args` say; print and return every figure."""
    args = _complete(args)
    base = Path(tempfile.mkdtemp(prefix="dmq-cluster-bench-", dir=args.dir or ".")).resolve()
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
    checks = _checks(medians, args)
    _print_result(medians, checks, args)
    result: dict[str, Any] = {"setup": _setup(args), "medians": medians}
    result.update(samples=samples, checks=checks)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


def complete_options(
    add: Callable[[argparse.ArgumentParser], None], args: argparse.Namespace
) -> argparse.Namespace:
    """A caller's namespace with the parser's defaults for what it lacks, and
    `--durability` as a checked list (shared with bench/compare_nats.py)."""
    parser = argparse.ArgumentParser()
    add(parser)
    full = vars(parser.parse_args([]))
    full.update({k: v for k, v in vars(args).items() if v is not None})
    done = argparse.Namespace(**full)
    if isinstance(done.durability, str):
        done.durability = [d.strip() for d in done.durability.split(",") if d.strip()]
    if not done.durability or any(d not in DURABILITIES for d in done.durability):
        raise ValueError(f"--durability: a comma-separated list of {', '.join(DURABILITIES)}")
    return done


def _complete(args: argparse.Namespace) -> argparse.Namespace:
    """Defaults for options a caller's namespace lacks, and the --quick sizes."""
    done = complete_options(add_arguments, args)
    if done.quick:
        done.runs, done.phase_seconds, done.warmup_seconds = 1, 0.7, 0.2
        done.partitions = min(done.partitions, 100)
        done.idle_seconds, done.settle_seconds, done.balance_seconds = 2.0, 0.5, 2.0
    if done.nodes < 1 or done.runs < 1:
        raise ValueError("--nodes and --runs must be >= 1")
    return done


def _setup(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "nodes": args.nodes,
        "cluster_secret": args.cluster_secret,
        "durability": list(args.durability),
        "runs": args.runs,
        "record_bytes": RECORD_BYTES,
        "batch_records": args.batch_records,
        "in_flight": args.in_flight,
        "single_in_flight": args.single_in_flight,
        "rate": args.rate,
        "phase_seconds": args.phase_seconds,
        "partitions": args.partitions,
        "idle_seconds": args.idle_seconds,
    }


def _print_setup(args: argparse.Namespace, base: Path) -> None:
    print(f"dmq cluster bench: {args.nodes} dmq serve nodes vs 1, loopback, acks=all", flush=True)
    print(
        f"  python {platform.python_version()}, {os.cpu_count()} cores shared by every broker "
        f"and the client (all on this machine), load {os.getloadavg()[0]:.2f}; data in {base}"
    )
    print(f"  {memory_state()}")
    print(
        f"  records {RECORD_BYTES} B; (a) {args.batch_records} per batch, {args.in_flight} in "
        f"flight; (b) 1 per request, {args.single_in_flight} in flight; (c) {args.rate} req/s "
        f"open loop; {args.phase_seconds:g} s per phase after {args.warmup_seconds:g} s warm-up"
    )
    print(
        f"  raft durability {' and '.join(args.durability)} (fsync: fdatasync before any "
        f"reply, the default); cluster secret {'on' if args.cluster_secret else 'off'}; "
        f"{args.runs} runs, medians; (f) {args.partitions} partitions, "
        f"idle CPU over {args.idle_seconds:g} s",
        flush=True,
    )


def _checks(medians: dict[str, float], args: argparse.Namespace) -> dict[str, bool]:
    d = args.durability[0]
    checks: dict[str, bool] = {}

    def check(name: str, key: str, ok: Any) -> None:
        if key in medians:
            checks[name] = bool(ok(medians[key]))

    check(f"batched >= {TARGET_BATCHED_MB_S_MIN:g} MB/s ({d})", f"cluster_{d}_batched_mb_s",
          lambda v: v >= TARGET_BATCHED_MB_S_MIN)  # fmt: skip
    check(f"single-record p99 < {TARGET_LATENCY_P99_MS_MAX:g} ms at {args.rate} req/s ({d})",
          f"cluster_{d}_latency_p99_ms", lambda v: v < TARGET_LATENCY_P99_MS_MAX)  # fmt: skip
    check(f"{args.partitions} partitions led < {TARGET_PARTITIONS_START_S_MAX:g} s",
          "partitions_all_led_s", lambda v: v < TARGET_PARTITIONS_START_S_MAX)  # fmt: skip
    check(f"idle < {TARGET_IDLE_CPU_PERCENT_MAX:g}% of one core per broker",
          "idle_cpu_percent_max", lambda v: v < TARGET_IDLE_CPU_PERCENT_MAX)  # fmt: skip
    return checks


def _print_result(
    medians: dict[str, float], checks: dict[str, bool], args: argparse.Namespace
) -> None:
    print(f"\n{'figure (median)':34} {'unit':>9}", end="")
    for d in args.durability:
        print(f" {args.nodes}-node {d:>5} {'1-node':>8} {'ratio':>6}", end="")
    print()
    for key, label, unit, _ in FIGURES:
        print(f"{label:34} {unit:>9}", end="")
        for d in args.durability:
            cluster, single = medians.get(f"cluster_{d}_{key}"), medians.get(f"single_{d}_{key}")
            if cluster is None or single is None:
                continue
            print(f" {cluster:13.1f} {single:8.1f} {cluster / single:6.2f}", end="")
        print()
    extra = [
        ("failover_unavailable_s", "(d) failover unavailability", "s"),
        ("partitions_created_s", f"(f) create {args.partitions} partitions (answer)", "s"),
        ("partitions_all_led_s", f"(f) {args.partitions} partitions all led", "s"),
        ("leaders_balanced_s", "(f) leaders last moved", "s"),
        ("leaders_settled", "(f) then still for --balance-seconds", "1 = yes"),
        ("leaders_most_per_broker", "(f) then: most led by a broker", "leaders"),
        ("leaders_fewest_per_broker", "(f) then: fewest led by a broker", "leaders"),
        ("idle_cpu_percent_max", "(f) idle CPU, busiest broker", "% core"),
    ]
    for key, label, unit in extra:
        if key in medians:
            print(f"{label:34} {unit:>9} {medians[key]:13.2f}")
    per_node = [k for k in medians if k.startswith("idle_cpu_percent_n")]
    if per_node:
        text = ", ".join(f"{k.rsplit('_', 1)[1]} {medians[k]:.1f}%" for k in sorted(per_node))
        print(f"{'(f) idle CPU per broker':34} {'% core':>9} {text}")
    print(
        f"\nload average at the end: {os.getloadavg()[0]:.2f} (other processes on these cores "
        "move every figure)"
    )
    print("targets (issue 4; all nodes and the client on one machine):")
    for name, ok in checks.items():
        print(f"  {'met  ' if ok else 'UNMET'}  {name}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="one short run (CI), ~40 s")
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are shown")
    parser.add_argument("--nodes", type=int, default=3, help="brokers in the cluster")
    parser.add_argument("--durability", default="fsync,none",
                        help="--raft-durability values for (a)-(c), first is the default")  # fmt: skip
    parser.add_argument("--dir", help="make the work directory inside DIR (default: here)")
    parser.add_argument("--batch-records", type=int, default=128, help="(a) records per batch")
    parser.add_argument("--in-flight", type=int, default=8, help="(a) requests in flight")
    parser.add_argument("--single-in-flight", type=int, default=64, help="(b) in flight")
    parser.add_argument("--rate", type=int, default=500, help="(c) single-record requests/s")
    parser.add_argument("--phase-seconds", type=float, default=5.0, help="(a)-(c) each")
    parser.add_argument("--warmup-seconds", type=float, default=1.0, help="before each phase")
    parser.add_argument("--partitions", type=int, default=1000, help="(f); 0 to skip")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="(f) CPU sample")
    parser.add_argument("--settle-seconds", type=float, default=2.0, help="(f) before it")
    # More than two periods of the brokers' leader balancer (LEADER_BALANCE_INTERVAL_S, 5 s).
    parser.add_argument("--balance-seconds", type=float, default=12.0,
                        help="(f) no leader moved for this long before the settle; 0: no wait")  # fmt: skip
    parser.add_argument("--json", help="also write the result (medians, samples) here")
    parser.add_argument(
        "--cluster-secret",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="brokers of the cluster share a --cluster-secret-file (authenticated Raft and "
        "internal calls), as they should",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster_bench", description=__doc__.split("\n\n")[0]
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run(args)
    except ValueError as exc:
        parser.error(str(exc))
    except ClusterError as exc:
        print(f"error: the cluster misbehaved: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

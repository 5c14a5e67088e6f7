"""`python -m bench.raft_bench`: raft/'s replication against stock pysyncobj, in the same run.

Three node processes (`python -m raft.demo`) on loopback, each on its own address
(127.0.0.11-13), all on this machine (2 cores: the three nodes and their clients share
them). Each node hosts one group whose state machine appends every command to a list; the
load runs inside the leader's process (as a broker's produce path would) and a proposal
counts when it is committed by a majority and applied by the leader. Measured per run:

- `1 KiB x 256`: commands of 1 KiB, 256 proposals in flight (closed loop): commands/s
  and MB/s. raft/ coalesces concurrent proposals into one Raft entry per tick (group
  commit); stock pysyncobj appends one entry per command and batches them per message;
- `64 KiB x 8`: proposals of 64 KiB (a batch of 64 records of 1 KiB, as a producer's
  batch would be), 8 in flight: MB/s and records/s of 1 KiB;
- `latency`: 1 KiB proposals one at a time: p50 and p99 of the commit latency in ms;
- the CPU time of the three node processes during the two throughput phases (% of one core).

The baseline is stock pysyncobj 0.3.17 in the same harness (`raft.demo --stock`): its
TCPTransport, a default SyncObjConf plus its file journal, its own tick thread. raft/ runs
with its defaults: durability "fsync" (an fdatasync before any reply leaves a node); the
stock journal never syncs. Every figure is the median of --runs runs; a fresh cluster and
data directory per run and system.

`--idle --groups N --idle-seconds S [--timing HB,EMIN,EMAX,FTICK ...]` measures instead, per
timing setting (heartbeat, election timeout min/max, follower tick, in seconds; "default"
= RaftConfig's): the start-up of 3 nodes hosting N groups each (processes ready, then every
group led by one node that all nodes follow), each node's CPU over S idle seconds (% of one
core, from /proc/<pid>/stat), and --failovers times: kill -9 of group 0's leader, seconds
until a proposal to group 0 through a survivor succeeds, and until every group has a live
leader again (the killed node is restarted between failovers).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from queue import Queue
from typing import Any, TextIO

from bench.cpu import process_cpu_s
from bench.loopback import common_free_port
from bench.tree import start_python

KIB = 1024
TARGETS = {"dmq_batched_mb_s_min": 60.0, "dmq_latency_p99_ms_max": 10.0}


class Node:
    """One demo node process, driven through its stdin/stdout JSON protocol."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.args, self.log_path = args, log_path
        with open(log_path, "a") as log:
            self.proc: subprocess.Popen[str] = start_python(  # this tree's (bench/tree.py)
                ["-m", "raft.demo", *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                bufsize=1,
            )
        self._ids = itertools.count(1)
        self._answers: Queue[dict[str, Any]] = Queue()
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"node did not start; see {log_path}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            if message.get("event") == "ready":
                self._ready.set()
            elif "id" in message:
                self._answers.put(message)

    def request(self, op: str, timeout_s: float = 120.0, **fields: Any) -> dict[str, Any]:
        """One request at a time per node (the bench never overlaps them)."""
        assert self.proc.stdin is not None
        request_id = next(self._ids)
        self.proc.stdin.write(json.dumps({"id": request_id, "op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        answer = self._answers.get(timeout=timeout_s)
        if answer.get("id") != request_id or not answer.get("ok"):
            raise RuntimeError(f"{op} failed: {answer}")
        return answer

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._reader.join(5)

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stop()


@contextlib.contextmanager
def cluster(work_dir: Path, stock: bool, extra_args: Sequence[str] = ()) -> Iterator[list[Node]]:
    hosts = [f"127.0.0.{11 + k}" for k in range(3)]
    port = common_free_port(hosts)
    peers = ",".join(f"n{k + 1}={host}:{port}" for k, host in enumerate(hosts))
    nodes: list[Node] = []
    work_dir = work_dir.resolve()  # absolute: the nodes run in the tree's root
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        for k in range(3):
            args = ["--node-id", f"n{k + 1}", "--peers", peers, "--data-dir",
                    str(work_dir / f"n{k + 1}"), "--no-values"]  # fmt: skip
            args += ["--stock"] if stock else list(extra_args)
            nodes.append(Node(args, work_dir / f"n{k + 1}.log"))
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def _leader(nodes: list[Node], timeout_s: float = 30.0) -> Node:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        leaders = [n for n in nodes if n.request("state", values=False)["is_leader"]]
        if len(leaders) == 1:
            leader = leaders[0]
            leader.request("propose", value="warm-up", timeout=10)
            return leader
        time.sleep(0.1)
    raise RuntimeError("no leader elected")


def _throughput(
    nodes: list[Node], leader: Node, size: int, concurrency: int, seconds: float
) -> dict[str, float]:
    cpu_before = sum(node.cpu_s() for node in nodes)
    answer = leader.request(
        "load", size=size, concurrency=concurrency, seconds=seconds, timeout_s=seconds + 120
    )
    cpu = sum(node.cpu_s() for node in nodes) - cpu_before
    elapsed = answer["seconds"]
    return {
        "commands_s": answer["commands"] / elapsed,
        "mb_s": answer["bytes"] / elapsed / 1e6,
        "records_s": answer["bytes"] / KIB / elapsed,
        "cpu_percent": 100.0 * cpu / elapsed,
    }


def _latency(leader: Node, count: int, seconds: float) -> dict[str, float]:
    samples: list[float] = []
    deadline = time.monotonic() + seconds
    while len(samples) < count and time.monotonic() < deadline:
        batch = min(50, count - len(samples))
        samples += leader.request("latency", size=KIB, count=batch)["latencies_ms"]
    samples.sort()
    return {
        "p50_ms": samples[len(samples) // 2],
        "p99_ms": samples[min(len(samples) - 1, int(len(samples) * 0.99))],
        "samples": float(len(samples)),
    }


def measure(work_dir: Path, stock: bool, args: argparse.Namespace) -> dict[str, Any]:
    with cluster(work_dir, stock) as nodes:
        leader = _leader(nodes)
        # Latency first, on an idle cluster: no replication backlog left by a load phase.
        latency = _latency(leader, args.latency_count, args.seconds * 2)
        single = _throughput(nodes, leader, KIB, 256, args.seconds)
        batched = _throughput(nodes, leader, 64 * KIB, 8, args.seconds)
    return {"single": single, "batched": batched, "latency": latency}


def _all_led(nodes: list[Node], groups: int) -> bool:
    """Every group has a leader that is live and that every live node names."""
    live = [n for n in nodes if n.proc.poll() is None]
    states = [n.request("states")["groups"] for n in live]
    for group in range(groups):
        leader_ids = {state[str(group)]["leader_id"] for state in states}
        leaders = [s[str(group)]["is_leader"] for s in states]
        if len(leader_ids) != 1 or None in leader_ids or sum(leaders) != 1:
            return False
    return True


def _wait_all_led(nodes: list[Node], groups: int, timeout_s: float) -> float:
    started = time.monotonic()
    while not _all_led(nodes, groups):
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"not every group led within {timeout_s:g} s")
        time.sleep(0.1)
    return time.monotonic() - started


def _failover(nodes: list[Node], groups: int) -> dict[str, float]:
    """kill -9 group 0's leader: seconds until group 0 commits again through a survivor,
    and until every group is led again; then restart the killed node."""
    live = [n for n in nodes if n.proc.poll() is None]
    leader = next(n for n in live if n.request("state", group=0, values=False)["is_leader"])
    survivor = next(n for n in live if n is not leader)
    leader.kill()
    killed_at = time.monotonic()
    resumed = None
    attempt = 0
    while resumed is None:
        if time.monotonic() - killed_at > 30:
            raise RuntimeError("group 0 did not resume within 30 s")
        attempt += 1
        try:
            survivor.request("propose", group=0, value=f"failover-{attempt}", timeout=0.5)
        except RuntimeError:
            continue
        resumed = time.monotonic() - killed_at
    all_led = resumed + _wait_all_led(nodes, groups, 60)
    nodes[nodes.index(leader)] = Node(leader.args, leader.log_path)
    _wait_all_led(nodes, groups, 60)
    return {"resumed_s": resumed, "all_led_s": all_led}


def measure_idle(work_dir: Path, timing: str, args: argparse.Namespace) -> dict[str, Any]:
    extra = ["--groups", str(args.groups)]
    if timing != "default":
        hb, emin, emax, ftick = (float(x) for x in timing.split(","))
        extra += ["--heartbeat-s", str(hb), "--election-min-s", str(emin),
                  "--election-max-s", str(emax), "--follower-tick-s", str(ftick)]  # fmt: skip
    started = time.monotonic()
    with cluster(work_dir, False, extra) as nodes:
        processes_up_s = time.monotonic() - started
        all_led_s = processes_up_s + _wait_all_led(nodes, args.groups, 120)
        time.sleep(args.settle_seconds)  # elections and start-up work are over
        before = [n.cpu_s() for n in nodes]
        wall = time.monotonic()
        time.sleep(args.idle_seconds)
        wall = time.monotonic() - wall
        idle = [100.0 * (n.cpu_s() - b) / wall for n, b in zip(nodes, before, strict=True)]
        leads = [sum(g["is_leader"] for g in n.request("states")["groups"].values()) for n in nodes]
        failovers = [_failover(nodes, args.groups) for _ in range(args.failovers)]
    return {
        "timing": timing,
        "processes_up_s": processes_up_s,
        "all_led_s": all_led_s,
        "idle_cpu_percent": idle,
        "leads": leads,
        "failovers": failovers,
    }


def run_idle(args: argparse.Namespace, out: TextIO | None = None) -> list[dict[str, Any]]:
    out = out or sys.stdout
    work = Path(tempfile.mkdtemp(prefix="dmq-raft-idle-", dir=_work_parent(args.dir)))
    results = []
    print(
        f"idle: 3 nodes x {args.groups} groups, {args.idle_seconds:g} s idle sample, "
        f"{args.failovers} failover(s) per run; timing = heartbeat,election min,max,"
        "follower tick (s)",
        file=out,
    )
    try:
        for run_number in range(args.runs):
            for k, timing in enumerate(args.timing or ["default"]):
                directory = work / f"idle-{run_number}-{k}"
                result = measure_idle(directory, timing, args)
                shutil.rmtree(directory, ignore_errors=True)
                results.append(result)
                idle = " ".join(f"{x:5.1f}" for x in result["idle_cpu_percent"])
                fail = " ".join(
                    f"{f['resumed_s']:.2f}/{f['all_led_s']:.2f}" for f in result["failovers"]
                )
                print(
                    f"{timing:24} up {result['processes_up_s']:5.1f} s, all led "
                    f"{result['all_led_s']:5.1f} s; idle % per node {idle} (leads "
                    f"{result['leads']}); failover resumed/all led s: {fail}",
                    file=out,
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=3, help="runs per system (medians)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per throughput phase")
    parser.add_argument("--latency-count", type=int, default=500, help="latency samples max")
    parser.add_argument("--dir", type=Path, default=None, help="work directory parent")
    parser.add_argument("--quick", action="store_true", help="1 run of 1 s phases")
    parser.add_argument("--json", type=Path, default=None, help="also write the result")
    parser.add_argument("--idle", action="store_true", help="idle CPU / start-up / failover")
    parser.add_argument("--groups", type=int, default=1000, help="--idle: groups per node")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="--idle: CPU sample")
    parser.add_argument("--settle-seconds", type=float, default=2.0, help="--idle: before it")
    parser.add_argument("--failovers", type=int, default=3, help="--idle: per run")
    parser.add_argument(
        "--timing",
        action="append",
        help='--idle: "HB,EMIN,EMAX,FTICK" seconds or "default"; repeatable',
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.raft_bench", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.seconds, args.latency_count = 1, 1.0, 100
    return args


def _work_parent(requested: Path | None) -> Path:
    if requested is not None:
        return requested
    # The data must be on the disk the broker would use, not a tmpfs /tmp.
    temp = Path(tempfile.gettempdir())
    return temp if os.stat(temp).st_dev == os.stat(Path.cwd()).st_dev else Path.cwd()


def _median(runs: list[dict[str, Any]], phase: str, key: str) -> float:
    return float(statistics.median(run[phase][key] for run in runs))


def run(args: argparse.Namespace, out: TextIO | None = None) -> dict[str, Any]:
    out = out or sys.stdout
    work = Path(tempfile.mkdtemp(prefix="dmq-raft-bench-", dir=_work_parent(args.dir)))
    raw: dict[str, list[dict[str, Any]]] = {"dmq": [], "stock": []}
    try:
        for run_number in range(args.runs):
            for system in ("dmq", "stock"):
                directory = work / f"{system}-{run_number}"
                raw[system].append(measure(directory, system == "stock", args))
                shutil.rmtree(directory, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures = {
        system: {
            "single_commands_s": _median(runs, "single", "commands_s"),
            "single_mb_s": _median(runs, "single", "mb_s"),
            "single_cpu_percent": _median(runs, "single", "cpu_percent"),
            "batched_mb_s": _median(runs, "batched", "mb_s"),
            "batched_records_s": _median(runs, "batched", "records_s"),
            "batched_cpu_percent": _median(runs, "batched", "cpu_percent"),
            "latency_p50_ms": _median(runs, "latency", "p50_ms"),
            "latency_p99_ms": _median(runs, "latency", "p99_ms"),
            "latency_samples": _median(runs, "latency", "samples"),
        }
        for system, runs in raw.items()
    }
    result = {"setup": _setup(args), "figures": figures, "targets": TARGETS, "runs": raw}
    _print(result, out)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return result


def _setup(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "nodes": 3,
        "cpus": os.cpu_count(),
        "runs": args.runs,
        "seconds_per_phase": args.seconds,
        "python": sys.version.split()[0],
    }


def _print(result: dict[str, Any], out: TextIO) -> None:
    setup, dmq, stock = result["setup"], result["figures"]["dmq"], result["figures"]["stock"]
    print(
        f"raft bench: 3 nodes on loopback (127.0.0.11-13), one process each, all on this "
        f"{setup['cpus']}-core machine; medians of {setup['runs']} runs, "
        f"{setup['seconds_per_phase']:g} s per throughput phase",
        file=out,
    )
    print(
        "dmq = raft/ defaults (fsync before replies); stock = pysyncobj 0.3.17 defaults", file=out
    )
    rows = [
        ("1 KiB x 256 in flight: commands/s", "single_commands_s", "{:,.0f}"),
        ("1 KiB x 256 in flight: MB/s", "single_mb_s", "{:.1f}"),
        ("1 KiB x 256 in flight: CPU % (3 nodes)", "single_cpu_percent", "{:.0f}"),
        ("64 KiB x 8 in flight: MB/s", "batched_mb_s", "{:.1f}"),
        ("64 KiB x 8 in flight: 1 KiB records/s", "batched_records_s", "{:,.0f}"),
        ("64 KiB x 8 in flight: CPU % (3 nodes)", "batched_cpu_percent", "{:.0f}"),
        ("1 KiB one at a time: p50 ms", "latency_p50_ms", "{:.2f}"),
        ("1 KiB one at a time: p99 ms", "latency_p99_ms", "{:.2f}"),
    ]
    print(f"{'':42} {'dmq':>12} {'stock':>12} {'dmq/stock':>10}", file=out)
    for label, key, fmt in rows:
        ratio = dmq[key] / stock[key] if stock[key] else float("inf")
        print(
            f"{label:42} {fmt.format(dmq[key]):>12} {fmt.format(stock[key]):>12} {ratio:>9.2f}x",
            file=out,
        )
    print(
        f"latency samples per run: dmq {dmq['latency_samples']:.0f}, "
        f"stock {stock['latency_samples']:.0f}",
        file=out,
    )
    ok_mb = dmq["batched_mb_s"] >= TARGETS["dmq_batched_mb_s_min"]
    ok_p99 = dmq["latency_p99_ms"] <= TARGETS["dmq_latency_p99_ms_max"]
    print(
        f"targets: batched >= {TARGETS['dmq_batched_mb_s_min']:g} MB/s: "
        f"{'met' if ok_mb else 'MISSED'}; p99 < {TARGETS['dmq_latency_p99_ms_max']:g} ms: "
        f"{'met' if ok_p99 else 'MISSED'}",
        file=out,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.idle:
        run_idle(args)
    else:
        run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

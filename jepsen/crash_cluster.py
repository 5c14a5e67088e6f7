"""`python -m jepsen.crash_cluster`: every whole-cluster crash point of a short workload.

    python -m jepsen.crash_cluster                      # 3 brokers, 12 records
    python -m jepsen.crash_cluster --records 40 --snapshot-entries 8

jepsen/crash.py's method on a 3-broker cluster (jepsen/README.md, "The crash-point
explorer"): every broker runs under strace, the workload produces with acks=all through
every broker in turn (a partition of replication factor 3, so followers acknowledge
entries to the leader), then every broker is killed. A crash point is each sync, name
change or acknowledgement sent by any broker (crashfs.cluster_crashes); at each one,
every broker's directory is what its own calls so far leave (the same variant on all:
a power cut of the whole cluster at one moment). Each distinct cluster state is started
as three real brokers on the traced run's addresses, one state at a time, and must
become ready and serve every record acknowledged before the crash point
(unlike one broker's, not held to what an earlier point served: `_explore_points`).

Slower than the one-broker explorer (three brokers per state, one state at a time): a
command for longer looks, not a test of the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from jepsen.cluster import http, listen_ports
from jepsen.crash import (
    ACK_MARKER,
    ROOT,
    TOPIC,
    Ack,
    Records,
    check_acks,
    produce_one,
    read_all,
    serve_args,
    server_times,
    stop,
    stop_traced,
    traced,
    wait_ready,
)
from jepsen.crashfs import (
    VARIANTS,
    Call,
    ClusterCrash,
    Replay,
    TraceError,
    cluster_crashes,
    parse_trace,
    socket_sends,
    tree_of,
)

READY_TIMEOUT_S = 45.0  # three brokers and their elections, on a loaded machine


class Nodes:
    """The cluster's fixed addresses: the traced run's, reused by every check (a broker's
    peers and the catalogue name them)."""

    def __init__(self, count: int, broker_args: list[str]) -> None:
        ports = listen_ports(["127.0.0.1"], 2 * count, os.getpid())
        self.ids = [f"n{k + 1}" for k in range(count)]
        self.ports = {n: ports[2 * k : 2 * k + 2] for k, n in enumerate(self.ids)}
        peers = ",".join(f"{n}=127.0.0.1:{self.ports[n][1]}" for n in self.ids)
        self.args = ["--peers", peers, *broker_args]

    def url(self, node: str) -> str:
        return f"http://127.0.0.1:{self.ports[node][0]}"

    def command(self, node: str, data_dir: Path) -> list[str]:
        own = serve_args(data_dir, "127.0.0.1", self.ports[node], self.args)
        return [*own, "--node-id", node]

    def start(
        self, dirs: dict[str, Path], logs: Path, trace: bool
    ) -> dict[str, subprocess.Popen[bytes]]:
        procs: dict[str, subprocess.Popen[bytes]] = {}
        for node in self.ids:
            command = self.command(node, dirs[node])
            if trace:
                command = traced(logs / f"{node}.trace", command)
            log = open(logs / f"{node}.log", "ab")  # noqa: SIM115 - closed below
            procs[node] = subprocess.Popen(
                command, cwd=ROOT, stdout=log, stderr=log, start_new_session=True
            )
            log.close()
        return procs

    def ready(self, procs: dict[str, subprocess.Popen[bytes]], timeout_s: float) -> bool:
        return all(wait_ready(self.url(n), procs[n], timeout_s) for n in self.ids)


def record_workload(
    work: Path, nodes: Nodes, records: int, partitions: int, producers: int
) -> tuple[list[Ack], float]:
    """Every broker under strace; produce `records` with acks=all through each broker in
    turn; kill them all. The acknowledgements, and when the first produce was sent."""
    dirs = {n: work / n for n in nodes.ids}
    procs = nodes.start(dirs, work, trace=True)
    try:
        if not nodes.ready(procs, 90.0):
            raise SystemExit(f"the traced cluster did not start; logs in {work}")
        body = {"name": TOPIC, "partitions": partitions, "replication_factor": len(nodes.ids)}
        created = http(nodes.url(nodes.ids[0]) + "/v1/topics", "POST", body, timeout_s=20.0)
        if created.status != 201:
            raise SystemExit(f"topic not created: {created.status} {created.body!r}")
        started_s = time.time()

        def send(i: int) -> Ack | None:
            url = nodes.url(nodes.ids[i % len(nodes.ids)])
            return produce_one(url, i % partitions, f"r{i}", timeout_s=20.0)

        with ThreadPoolExecutor(max_workers=producers) as pool:
            acks = [a for a in pool.map(send, range(records)) if a is not None]
    finally:
        for proc in procs.values():
            stop_traced(proc)
    return acks, started_s


def check_cluster(
    crash: ClusterCrash, nodes: Nodes, work: Path, partitions: set[int]
) -> tuple[str | None, Records]:
    """Start the three brokers on a crash's directories; read every record."""
    home = Path(tempfile.mkdtemp(prefix="state-", dir=work))
    dirs = {n: home / n for n in nodes.ids}
    for node, state in crash.states.items():
        dirs[node].mkdir()
        state.materialize(dirs[node])
    procs = nodes.start(dirs, home, trace=False)
    found: Records = {}
    try:
        if not nodes.ready(procs, READY_TIMEOUT_S):
            problem: str | None = f"the cluster did not become ready (logs in {home})"
        else:
            problem = read_all(nodes.url(nodes.ids[0]), partitions, found)
    finally:
        for proc in procs.values():
            stop(proc)
    if problem is None:
        shutil.rmtree(home, ignore_errors=True)
    return problem, found


def explore(args: argparse.Namespace) -> int:
    broker_args = ["--raft-snapshot-entries", str(args.snapshot_entries), *args.broker_arg]
    work = Path(tempfile.mkdtemp(prefix="dmq-crash-cluster-"))
    nodes = Nodes(args.nodes, broker_args)
    failures: list[str] = []
    try:
        acks, started_s = record_workload(
            work, nodes, args.records, args.partitions, args.producers
        )
        traces = {n: (parse_trace(work / f"{n}.trace"), work / n) for n in nodes.ids}
        for node, (calls, root) in traces.items():
            replay = Replay(root)
            for call in calls:
                replay.apply(call)
            if replay.final_tree() != tree_of(root):
                raise TraceError(f"{node}: the model's final directory differs from the broker's")
        sent = [s for calls, _ in traces.values() for s in socket_sends(calls, ACK_MARKER)]
        acks = server_times(acks, sent)
        (work / "acks.json").write_text(json.dumps([a.__repr__() for a in acks]))
        variants = tuple(v for v in args.variants.split(",") if v)
        failures, points, states = _explore_points(traces, variants, started_s, acks, nodes, work)
        print(json.dumps({"points": points, "states": states, "acks": len(acks),
                          "failed": len(failures), "failures": failures}, indent=1))  # fmt: skip
    finally:
        if not (args.keep and failures):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    return 1 if failures else 0


def _explore_points(
    traces: dict[str, tuple[list[Call], Path]],
    variants: tuple[str, ...],
    after_s: float,
    acks: list[Ack],
    nodes: Nodes,
    work: Path,
) -> tuple[list[str], int, int]:
    """Check each distinct cluster state once, in time order; judge every point.

    Unlike one broker's, a cluster's crash points are not held to serving what an earlier
    point served: an entry durable on a minority only (the leader's, not yet on a
    follower) may win or lose the election after the restart, and either is correct
    while it was not acknowledged (seen in a run: `r2` at offset 3 served after one
    crash point, not after later ones, acknowledged after both). Acknowledged records
    are what must survive."""
    partitions = {a.partition for a in acks}
    results: dict[str, tuple[str | None, Records]] = {}
    failures: list[str] = []
    points = 0
    for crash in cluster_crashes(traces, variants, after_s, ACK_MARKER):
        points += 1
        digest = crash.digest()
        if digest not in results:
            results[digest] = check_cluster(crash, nodes, work, partitions)
            print(f"state {len(results)}: {crash.call} ({crash.variant})", flush=True)
        problem, found = results[digest]
        if problem is None:
            problem = check_acks(found, [a for a in acks if a.time_s <= crash.time_s])
        if problem is None:
            continue
        failures.append(f"crash after {crash.call} ({crash.variant}): {problem}")
        print("FAIL", failures[-1], flush=True)
    return failures, points, len(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jepsen.crash_cluster", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--nodes", type=int, default=3, help="brokers")
    parser.add_argument("--records", type=int, default=12, help="records produced, acks=all")
    parser.add_argument("--partitions", type=int, default=1, help="partitions of the topic")
    parser.add_argument("--producers", type=int, default=3, help="producer threads at once")
    parser.add_argument(
        "--snapshot-entries", type=int, default=4, help="the brokers' --raft-snapshot-entries"
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="crash variants, comma-separated"
    )
    parser.add_argument("--keep", action="store_true", help="keep the failing states' directories")
    parser.add_argument(
        "--broker-arg", action="append", default=[], help="one more `dmq serve` argument"
    )
    return explore(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

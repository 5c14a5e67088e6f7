"""`python -m jepsen.run`: start a cluster, run the log workload under faults, heal, read
everything back, check the history, write results.

    python -m jepsen.run --nodes 5 --nemesis partition,kill,pause --time-limit-s 120 --seed 7

Exit status: 0 valid, 1 invalid, 2 unknown or a harness error. The run's directory holds
history.jsonl, results.json, latency.png and each broker's log and data; the last line
printed is the summary, with the seed that reproduces the run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from dmq.planted import PLANTED_BUGS
from jepsen import final
from jepsen.checker import UNKNOWN, Verdict, merge
from jepsen.checker.delay import RUN_NAMES as DELAY_NAMES
from jepsen.checker.delay import check_delay
from jepsen.checker.groups import check_groups
from jepsen.checker.log import check_log
from jepsen.checker.share import check_share
from jepsen.checker.txn import check_ctp, check_txn
from jepsen.cluster import RETRIABLE, Cluster, HarnessError, http
from jepsen.delay import DelayWorker, create_run_topic, final_delay_read
from jepsen.focus import Focus
from jepsen.groups import GroupClient, GroupWorker, final_drain
from jepsen.history import NEMESIS, History
from jepsen.nemesis import BACKGROUND, FAULTS, MEMBERSHIP, VOTERS_SMALL, Nemesis
from jepsen.report import plot, results, summary_line
from jepsen.schedule import VARIANTS, Window, describe, draw
from jepsen.share import ShareClient, ShareWorker, configure
from jepsen.share import final_drain as share_drain
from jepsen.tiered import broker_args as tiered_broker_args
from jepsen.tiered import status as tiered_status
from jepsen.tiered import topic_config as tiered_topic_config
from jepsen.txn import (
    CtpClient,
    CtpWorker,
    TxnClient,
    TxnWorker,
    create_txn_topic,
    final_ctp_read,
    final_txn_read,
    setup_ctp,
)
from jepsen.workload import Client, Worker

TOPIC = "jepsen"
EXIT = {"valid": 0, "invalid": 1, "unknown": 2}
STORE = Path("jepsen") / "store"
RECOVERY_WAIT_S = 10.0  # before a window, for every group to have a leader again


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jepsen.run", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=3, choices=range(3, 8), metavar="{3..7}")
    p.add_argument(
        "--nemesis",
        default="partition,kill",
        help=f"comma list of {', '.join(FAULTS)}, or none; kind:variant strikes only with "
        "that variant (partition:bridge)",
    )
    p.add_argument("--time-limit-s", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    p.add_argument("--planted-bug", choices=PLANTED_BUGS, default=None)
    p.add_argument(
        "--fault-interval-s",
        type=float,
        nargs=2,
        default=(10.0, 15.0),
        metavar=("MIN", "MAX"),
        help="each fault and quiet period, before the schedule shrinks them so that every "
        "kind fits in the time limit (jepsen/schedule.py)",
    )
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--replication-factor", type=int, default=3)
    p.add_argument("--workers-per-node", type=int, default=2)
    p.add_argument(
        "--idempotent",
        action="store_true",
        help="sends carry a producer id and per-partition sequences; unknown outcomes are retried",
    )
    p.add_argument(
        "--group-workers",
        type=int,
        default=None,
        help="consumer-group members (default: --nodes; 0: none)",
    )
    p.add_argument("--share-workers", type=int, default=0,
                   help="share-group members (jepsen/share.py; default 0: none)")  # fmt: skip
    p.add_argument(
        "--txn-workers",
        type=int,
        default=0,
        help="transactional workers on their own topic (jepsen/txn.py; default 0: none)",
    )
    p.add_argument(
        "--ctp",
        action="store_true",
        help="one consume-transform-produce worker (jepsen/txn.py CtpWorker)",
    )
    p.add_argument(
        "--auth",
        action="store_true",
        help="brokers with --auth on; the harness sends a superuser token drawn per run",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="brokers with TLS (https, Raft over mutual TLS) on certificates drawn per run",
    )
    p.add_argument(
        "--delay-workers",
        type=int,
        default=0,
        help="delayed-delivery clients on their own topic (jepsen/delay.py DelayWorker; "
        "default 0: none)",
    )
    p.add_argument(
        "--tiered",
        action="store_true",
        help="the log topic on tiered storage: brokers with a file:// object store in the "
        "run directory, 4 KiB segments, local retention 0 bytes (jepsen/tiered.py)",
    )
    p.add_argument(
        "--snapshot-entries",
        type=int,
        default=0,
        help="--raft-snapshot-entries of the brokers (0: their default); a small value "
        "compacts the journals often, each compaction recycling the file the one before "
        "retired (raft/journal.py), under the power-loss cuts too",
    )
    p.add_argument("--dir", type=Path, default=None, help="default: jepsen/store/<time>-seed<seed>")
    args = p.parse_args(argv)
    items = [] if args.nemesis in ("", "none") else args.nemesis.split(",")
    args.nemesis = [item.partition(":")[0] for item in items]
    args.nemesis_variants = {
        kind: variant for kind, _, variant in (i.partition(":") for i in items) if variant
    }
    for kind, variant in args.nemesis_variants.items():
        if variant not in VARIANTS.get(kind, ()):
            p.error(f"--nemesis {kind}:{variant}: {kind} has variants {VARIANTS.get(kind)}")
    if args.group_workers is None:
        args.group_workers = args.nodes
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    if args.dir is None:
        args.dir = STORE / f"{time.strftime('%Y%m%dT%H%M%S')}-seed{args.seed}"
    return args


def create_topic(
    cluster: Cluster,
    partitions: int,
    rf: int,
    timeout_s: float = 60.0,
    config: dict[str, Any] | None = None,
) -> None:
    body: dict[str, Any] = {"name": TOPIC, "partitions": partitions, "replication_factor": rf}
    if config:
        body["config"] = config
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            answer = http(cluster.brokers["n1"].url + "/v1/topics", "POST", body, timeout_s=10.0)
            if answer.status in (201, 409):
                return
            if answer.status not in RETRIABLE:
                raise HarnessError(f"create topic: {answer.status} {answer.body[:200]!r}")
        except OSError:
            pass
        time.sleep(0.5)
    raise HarnessError(f"create topic: not within {timeout_s} s")


def run_phases(
    args: argparse.Namespace, cluster: Cluster, history: History, nemesis: Nemesis
) -> None:
    """Start, workload under faults, heal, wait for leaders, final reads."""
    nemesis.setup()
    cluster.start_all()
    create_topic(
        cluster,
        args.partitions,
        min(args.replication_factor, args.nodes),
        config=tiered_topic_config() if args.tiered else None,
    )
    final.wait_for_leaders(cluster)
    processes = itertools.count()
    stop = threading.Event()
    if args.share_workers:
        configure(cluster)
    if args.txn_workers:
        create_txn_topic(cluster, min(args.replication_factor, args.nodes))
    if args.ctp:
        setup_ctp(cluster, min(args.replication_factor, args.nodes))
    if args.delay_workers:
        create_run_topic(cluster, min(args.replication_factor, args.nodes))
    workers: list[Worker | GroupWorker | ShareWorker | TxnWorker | DelayWorker] = [
        Worker(
            Client(cluster, history, TOPIC, k, idempotent=args.idempotent),
            processes,
            args.partitions,
            args.seed * 1000 + k,
            stop,
            nemesis.focus,
        )
        for k in range(args.nodes * args.workers_per_node)
    ]
    workers += [
        GroupWorker(
            GroupClient(cluster, history, TOPIC, k), processes, args.seed * 1000 + 500 + k, stop
        )
        for k in range(args.group_workers)
    ]
    workers += [
        ShareWorker(
            ShareClient(cluster, history, TOPIC, k), processes, args.seed * 1000 + 700 + k, stop
        )
        for k in range(args.share_workers)
    ]
    workers += [
        TxnWorker(TxnClient(cluster, history, k), processes, args.seed * 1000 + 700 + k, stop)
        for k in range(args.txn_workers)
    ]
    if args.ctp:
        ctp = CtpClient(cluster, history, 0)
        workers.append(CtpWorker(ctp, processes, args.seed * 1000 + 900, stop))
    delayers = [
        DelayWorker(cluster, history, k, processes, args.seed * 1000 + 950 + k, stop)
        for k in range(args.delay_workers)
    ]
    workers += delayers
    for worker in workers:
        worker.start()
    began = time.monotonic()
    try:
        shift = follow_schedule(nemesis, args.schedule, began, args.time_limit_s)
        history.add(NEMESIS, "info", "schedule-shift", None, round(shift, 2))
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
    nemesis.heal_all()
    errors = [w.error for w in workers if w.error is not None]
    if errors:
        raise HarnessError(f"a worker failed: {errors[0]!r}")
    nemesis.settle()  # joins and leaves in flight end (a leaving broker stops) first
    final.wait_for_leaders(cluster)
    if any(kind in BACKGROUND for kind in args.nemesis):
        final.wait_operations(cluster)
        final.wait_for_leaders(cluster)
    if any(kind in MEMBERSHIP for kind in args.nemesis):
        final.check_placement(cluster, TOPIC, min(args.replication_factor, args.nodes))
    if "voters" in args.nemesis:
        history.add(NEMESIS, "info", "final-voters", None, final.check_voters(cluster))
    final.final_reads(cluster, history, TOPIC, args.partitions, processes)
    if args.tiered:  # what the final reads went through (jepsen/tiered.py)
        history.add(NEMESIS, "info", "tiered-status", None, tiered_status(cluster, TOPIC))
    if args.group_workers:
        final_drain(cluster, history, TOPIC, final.read_ends(history, args.partitions), processes)
    if args.share_workers:
        share_drain(cluster, history, TOPIC, final.read_ends(history, args.partitions), processes)
    if args.txn_workers or args.ctp:
        final_txn_read(cluster, history, processes)
    if args.ctp:
        final_ctp_read(cluster, history, processes)
    if delayers:
        final_delay_read(cluster, history, delayers, next(processes))
    final.wait_caught_up(cluster)
    final.replica_reads(cluster, history, TOPIC, args.partitions, processes)


def follow_schedule(
    nemesis: Nemesis, schedule: list[Window], began: float, time_limit_s: float
) -> float:
    """Start and heal each window's faults at its times (monotonic, from `began`).
    Before each window the nemesis waits for every group to have a leader
    (RECOVERY_WAIT_S at most): that wait shifts this window and the later ones, so every
    window runs whole and the run may overrun its time limit by those waits. The
    seconds the schedule was shifted."""
    shift = 0.0
    for window in schedule:
        _sleep_until(began + shift + window.start_s)
        shift += nemesis.wait_leaders(RECOVERY_WAIT_S)
        nemesis.start(window.faults)
        _sleep_until(began + shift + window.stop_s)
        nemesis.heal_all()
    _sleep_until(began + shift + time_limit_s)
    return shift


def _sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.monotonic()))


def run(args: argparse.Namespace) -> int:
    args.dir.mkdir(parents=True, exist_ok=True)
    history = History(args.dir / "history.jsonl")
    membership = any(kind in MEMBERSHIP for kind in args.nemesis)
    broker_args = tiered_broker_args(args.dir) if args.tiered else []
    if args.snapshot_entries:
        broker_args += ["--raft-snapshot-entries", str(args.snapshot_entries)]
    cluster = Cluster(
        args.dir,
        args.nodes,
        planted_bug=args.planted_bug,
        durable_trace="power" in args.nemesis or "disk" in args.nemesis,
        seed=args.seed,
        # With joins, leaves or voter changes the metadata voters start as the first
        # VOTERS_SMALL ids, so the other brokers are non-voters a voter change can add
        # (and, without the voters nemesis, the only ones a leave decommissions).
        metadata_voters=[f"n{k + 1}" for k in range(VOTERS_SMALL)] if membership else None,
        auth=args.auth,
        tls=args.tls,
        broker_args=broker_args,
    )
    nemesis = Nemesis(cluster, history, args.nemesis, args.seed, TOPIC, args.partitions, Focus())
    args.schedule = draw(
        args.nemesis,
        args.nodes,
        args.time_limit_s,
        tuple(args.fault_interval_s),
        args.seed,
        args.nemesis_variants,
    )
    print(f"jepsen: seed {args.seed}, fault schedule:\n{describe(args.schedule)}", flush=True)
    history.add(
        NEMESIS, "info", "schedule", None, [[w.start_s, w.stop_s, w.faults] for w in args.schedule]
    )
    harness_error: str | None = None
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        run_phases(args, cluster, history, nemesis)
    except (Exception, KeyboardInterrupt) as error:
        harness_error = f"{type(error).__name__}: {error}"
        traceback.print_exc()
    finally:
        try:
            nemesis.close()
        finally:
            cluster.close()
            history.close()
            signal.signal(signal.SIGTERM, previous)
    return report(args, history, nemesis, harness_error)


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


def report(
    args: argparse.Namespace, history: History, nemesis: Nemesis, harness_error: str | None
) -> int:
    ops = history.ops()
    verdicts: dict[str, Verdict] = {"log": check_log(ops)}
    if args.group_workers:
        verdicts.update(check_groups(ops))
    if args.share_workers:
        verdicts.update(check_share(ops))
    if args.txn_workers:
        verdicts["txn"] = check_txn(ops)
    if args.ctp:
        verdicts["ctp"] = check_ctp(ops)
    if args.delay_workers:
        verdicts["delay"] = check_delay(ops, DELAY_NAMES)
    valid = merge(verdicts)
    if harness_error is not None:
        # An interrupted run proves nothing valid, and without its final reads and group
        # drain an unread ack proves nothing lost (log "unseen", group-queue "lost"): only
        # the other anomalies make it invalid.
        unproven = {
            ("log", "unseen"), ("group-queue", "lost"), ("share", "lost"),
            ("txn", "lost-committed-write"), ("delay", "lost"), ("delay", "no-final-read"),
        }  # fmt: skip
        proven = [
            k for name, v in verdicts.items() for k in v.anomalies if (name, k) not in unproven
        ]
        valid = "invalid" if proven else UNKNOWN
    setup = {
        "seed": args.seed,
        "nodes": args.nodes,
        "nemesis": args.nemesis,
        "time_limit_s": args.time_limit_s,
        "planted_bug": args.planted_bug,
        "partitions": args.partitions,
        "group_workers": args.group_workers,
        "share_workers": args.share_workers,
        "idempotent": args.idempotent,
        "txn_workers": args.txn_workers,
        "ctp": args.ctp,
        "delay_workers": args.delay_workers,
        "tiered": args.tiered,
        "schedule": [
            {"start_s": w.start_s, "stop_s": w.stop_s, "faults": [f"{k}/{v}" for k, v in w.faults]}
            for w in args.schedule
        ],
        "harness_error": harness_error,
    }
    doc = results(verdicts, valid, ops, nemesis.windows, setup)
    (args.dir / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    try:
        plot(ops, nemesis.windows, args.dir / "latency.png")
    except Exception as error:  # a plot is a help, never the verdict
        print(f"jepsen: no plot: {error!r}", file=sys.stderr)
    print(summary_line(doc, args.dir), flush=True)
    if valid != "valid":
        print(f"jepsen: reproduce with --seed {args.seed}", flush=True)
    return EXIT[valid]


def main(argv: list[str] | None = None) -> int:
    return run(parse(argv))


if __name__ == "__main__":
    sys.exit(main())

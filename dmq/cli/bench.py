"""`dmq bench ...`: the benchmarks of bench/ (registered by dmq/cli/__init__.py).

Each benchmark's options are repeated here rather than taken from its module, so that
`dmq` imports a benchmark (and what it needs: a cluster, Spark) only when it runs; the
tests of tests/bench/ keep the two lists equal.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dmq.cli._common import Subparsers, UsageError

# How long each benchmark runs, measured one at a time on 2026-11-29 (2 cores shared with
# other test suites and a jepsen run, load average ~10: upper figures): every `--quick`
# run, and every full run but spark's; the cluster's, log's and delay's full runs as
# bench/README.md records them. Shown in `dmq bench --help`.
QUICK_S = {
    "cluster": 54, "log": 16, "broker": 26, "groups": 24, "share": 27, "txn": 33,
    "reads": 22, "metrics": 11, "spark": 143, "filter": 8, "delay": 22, "tls": 12,
    "auth": 18, "tiered": 8,
}  # fmt: skip
FULL = {
    "cluster": "~6 min", "log": "~30 s", "delay": "~3 min with --pending 1000000",
    "broker": "~1.4 min", "filter": "~1.7 min", "tiered": "~19 s", "tls": "~10 s",
    "metrics": "~10 s", "auth": "~34 s", "reads": "~56 s", "groups": "~2 min",
    "share": "~1.8 min", "txn": "~3.6 min",
}  # fmt: skip


def _duration(name: str) -> str:
    quick = QUICK_S[name]
    quick_text = f"~{quick} s" if quick < 100 else f"~{quick / 60:.1f} min"
    full = FULL.get(name, "not timed yet")
    return f"--quick {quick_text}; full {full}"


def _timed(name: str, text: str) -> str:
    return f"{text} ({_duration(name)})"


def add_bench(commands: Subparsers) -> None:
    bench = commands.add_parser(
        "bench",
        help="benchmarks (how long each runs: `dmq bench --help`)",
        description="`dmq bench --nodes 3`: a cluster of real brokers on this machine "
        f"(bench/cluster_bench.py; {_duration('cluster')}); or one of the benchmarks "
        "below. Durations are of one run at a time on a 2-core machine shared with other "
        "work; a quiet machine is faster.",
    )
    bench.add_argument("--nodes", type=int, help="cluster benchmark with this many brokers")
    bench.add_argument("--quick", action="store_true", help="CI-sized run")
    bench.add_argument("--runs", type=int, help="runs; medians are shown")
    bench.set_defaults(handler=_cmd_bench_cluster)
    kinds = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    # The options of bench/log_bench.py's add_arguments, repeated here so that `dmq` does
    # not import the benchmark unless it runs (a test keeps the two lists equal).
    log = kinds.add_parser(
        "log", help=_timed("log", "the storage engine (log/) against raw file I/O")
    )
    log.add_argument("--dir", type=Path, help="create the work directory inside DIR")
    log.add_argument("--total-mb", type=float, help="MiB per case (256)")
    log.add_argument("--fsync-mb", type=float, help="MiB per fsync case (32)")
    log.add_argument(
        "--fsync-appends-max", type=int, help="at most this many appends per fsync case (5000)"
    )
    log.add_argument("--runs", type=int, help="runs; medians are shown (3)")
    log.add_argument("--quick", action="store_true", help="CI-sized run")
    log.add_argument("--json", type=Path, help="also write the result here")
    log.set_defaults(handler=_cmd_bench_log)
    # Likewise bench/broker_bench.py's add_arguments.
    broker = kinds.add_parser(
        "broker", help=_timed("broker", "a single-node broker over HTTP, against log/ appends")
    )
    broker.add_argument("--dir", help="data directory (default: a temp dir here, removed after)")
    broker.add_argument("--runs", type=int, default=3, help="runs; medians are shown")
    broker.add_argument("--total-mb", type=int, default=128, help="MB produced per run")
    broker.add_argument("--rate", type=int, default=500, help="single-record requests/s")
    broker.add_argument("--latency-seconds", type=float, default=5.0,
                        help="how long the latency phase runs, s (5; 1 with --quick)")  # fmt: skip
    broker.add_argument("--quick", action="store_true", help="one small run (CI)")
    broker.set_defaults(handler=_cmd_bench_broker)
    # Likewise bench/groups_bench.py's add_arguments.
    groups = kinds.add_parser(
        "groups", help=_timed("groups", "consumer groups: commit latency and rate, member death")
    )
    groups.add_argument("--nodes", type=int, default=3, help="brokers of the cluster (3)")
    groups.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    groups.add_argument("--commits", type=int, default=300, help="sequential commits (300)")
    groups.add_argument("--seconds", type=float, default=4.0, help="per rate measure (4)")
    groups.add_argument("--in-flight", type=int, default=32, help="concurrent commits (32)")
    groups.add_argument("--session-ms", type=int, default=1_000, help="session timeout (1000)")
    groups.add_argument("--quick", action="store_true", help="one small run (CI)")
    groups.set_defaults(handler=_cmd_bench_groups)
    # Likewise bench/share_bench.py's add_arguments.
    share = kinds.add_parser(
        "share", help=_timed("share", "share groups: members on one partition, acks, redelivery")
    )
    share.add_argument("--nodes", type=int, default=3, help="brokers of the cluster (3)")
    share.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    share.add_argument("--records", type=int, default=1200, help="records per scale run (1200)")
    share.add_argument("--work-ms", type=int, default=10, help="processing per record (10)")
    share.add_argument("--members", type=int, default=4, help="members against 1 (4)")
    share.add_argument("--batch", type=int, default=20, help="max_records per poll (20)")
    share.add_argument("--in-flight", type=int, default=16, help="concurrent acks (16)")
    share.add_argument("--quick", action="store_true", help="one small run (CI)")
    share.set_defaults(handler=_cmd_bench_share)
    # Likewise bench/txn_bench.py's add_arguments.
    txn = kinds.add_parser(
        "txn", help=_timed("txn", "transactions over 3 partitions against idempotent produce")
    )
    txn.add_argument("--nodes", type=int, default=3, help="brokers of the cluster (3)")
    txn.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    txn.add_argument("--seconds", type=float, default=5.0, help="per measure (5)")
    txn.add_argument(
        "--producers",
        default="4,16,64",
        help="concurrent producers: each count of this list in turn (4,16,64)",
    )
    txn.add_argument("--records", type=int, default=100, help="records per transaction (100)")
    txn.add_argument("--record-bytes", type=int, default=1024, help="value size (1024)")
    txn.add_argument("--quick", action="store_true", help="one small run (CI)")
    txn.set_defaults(handler=_cmd_bench_txn)
    # Likewise bench/reads_bench.py's add_arguments.
    reads = kinds.add_parser(
        "reads", help=_timed("reads", "linearizable (ReadIndex) reads against leader reads")
    )
    reads.add_argument("--nodes", type=int, default=3, help="brokers of the cluster (3)")
    reads.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    reads.add_argument("--seconds", type=float, default=4.0, help="per measure (4)")
    reads.add_argument("--readers", type=int, default=32, help="concurrent readers (32)")
    reads.add_argument("--records", type=int, default=1000, help="records in the topic (1000)")
    reads.add_argument("--quick", action="store_true", help="one small run (CI)")
    reads.set_defaults(handler=_cmd_bench_reads)
    # Likewise bench/metrics_bench.py's add_arguments.
    metrics = kinds.add_parser(
        "metrics", help=_timed("metrics", "produce MB/s with and without a /metrics scraper")
    )
    metrics.add_argument("--dir", help="create the data directory inside DIR")
    metrics.add_argument("--runs", type=int, default=3, help="runs of each mode (3)")
    metrics.add_argument("--total-mb", type=int, default=64, help="MB produced per run (64)")
    metrics.add_argument("--partitions", type=int, default=1, help="of the topic (1)")
    metrics.add_argument("--interval", type=float, default=1.0, help="between scrapes, s (1)")
    metrics.add_argument(
        "--cpu-scrapes", type=int, default=200, help="back-to-back scrapes priced (200)"
    )
    metrics.add_argument("--quick", action="store_true", help="one small run of each (CI)")
    metrics.set_defaults(handler=_cmd_bench_metrics)
    # Likewise bench/spark_bench.py's add_arguments (needs the spark extra).
    spark = kinds.add_parser(
        "spark",
        help=_timed("spark", "Spark reading a topic through spark_io, against a Parquet file"),
    )
    spark.add_argument("--dir", type=Path, help="create the work directory inside DIR")
    spark.add_argument("--total-mb", type=int, default=256, help="MiB of records in the topic")
    spark.add_argument(
        "--batch-records", type=int, default=100_000, help="maxOffsetsPerTrigger (100000)"
    )
    spark.add_argument("--runs", type=int, default=3, help="runs; medians are shown")
    spark.add_argument("--quick", action="store_true", help="CI-sized run")
    spark.set_defaults(handler=_cmd_bench_spark)
    # Likewise bench/filter_bench.py's add_arguments.
    filt = kinds.add_parser(
        "filter", help=_timed("filter", "broker-side filtering against an unfiltered fetch")
    )
    filt.add_argument("--dir", help="data directory (default: a temp dir here, removed after)")
    filt.add_argument("--records", type=int, default=200_000, help="records in the topic")
    filt.add_argument("--runs", type=int, default=5, help="runs; medians are shown (5)")
    filt.add_argument("--quick", action="store_true", help="one small run (CI)")
    filt.set_defaults(handler=_cmd_bench_filter)
    # Likewise bench/delay_bench.py's add_arguments.
    delay = kinds.add_parser(
        "delay", help=_timed("delay", "delayed records: lateness, memory with many pending")
    )
    delay.add_argument("--dir", help="data directory (default: a temp dir here, removed after)")
    delay.add_argument("--records", type=int, default=2_000, help="records per lateness run")
    delay.add_argument("--pending", type=int, default=200_000, help="records left pending")
    delay.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    delay.add_argument("--quick", action="store_true", help="one small run (CI)")
    delay.set_defaults(handler=_cmd_bench_delay)
    # Likewise bench/tls_bench.py's add_arguments.
    tls = kinds.add_parser("tls", help=_timed("tls", "batched produce with TLS on against off"))
    tls.add_argument("--dir", help="create the work directory inside DIR")
    tls.add_argument("--nodes", type=int, default=1, help="brokers per cluster (1; or 3)")
    tls.add_argument("--runs", type=int, default=3, help="runs of each mode (3)")
    tls.add_argument("--total-mb", type=float, default=64.0, help="MB per run (64)")
    tls.add_argument("--in-flight", type=int, default=4, help="concurrent requests (4)")
    tls.add_argument(
        "--durability", default="fsync", choices=("fsync", "none"), help="raft durability"
    )
    tls.add_argument("--quick", action="store_true", help="one small run of each (CI)")
    tls.set_defaults(handler=_cmd_bench_tls)
    # Likewise bench/auth_bench.py's add_arguments.
    auth = kinds.add_parser("auth", help=_timed("auth", "produce with --auth on against off"))
    auth.add_argument("--dir", help="create the work directory inside DIR")
    auth.add_argument("--nodes", type=int, default=1, help="brokers per cluster (1; or 3)")
    auth.add_argument("--runs", type=int, default=3, help="runs of each mode (3)")
    auth.add_argument("--total-mb", type=float, default=32.0, help="batched MB per run (32)")
    auth.add_argument("--requests", type=int, default=2000, help="small requests per run")
    auth.add_argument("--in-flight", type=int, default=8, help="small requests at once (8)")
    auth.add_argument(
        "--durability", default="fsync", choices=("fsync", "none"), help="raft durability"
    )
    auth.add_argument("--quick", action="store_true", help="one small run of each (CI)")
    auth.set_defaults(handler=_cmd_bench_auth)
    # Likewise bench/tiered_bench.py's add_arguments.
    tiered = kinds.add_parser(
        "tiered",
        help=_timed(
            "tiered", "tiered storage: produce with uploads, upload MB/s, cold vs local reads"
        ),
    )
    tiered.add_argument("--dir", help="create the work directory inside DIR")
    tiered.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    tiered.add_argument("--total-mb", type=int, default=128, help="MB produced per topic (128)")
    tiered.add_argument("--segment-mb", type=int, default=8, help="segment_bytes, MiB (8)")
    tiered.add_argument("--quick", action="store_true", help="one small run (CI)")
    tiered.add_argument(
        "--proof",
        action="store_true",
        help="issue #19's proof instead: 3 nodes, --total-mb written, local disk bounded, a "
        "follower wiped and restarted serves every offset from 0",
    )
    tiered.add_argument(
        "--local-retention-mb", type=int, default=64, help="--proof: local retention, MiB (64)"
    )
    tiered.add_argument(
        "--snapshot-entries",
        type=int,
        default=256,
        help="--proof: the brokers' --raft-snapshot-entries (256); a wiped follower restores "
        "from a snapshot only once one was taken",
    )
    tiered.set_defaults(handler=_cmd_bench_tiered)


def _cmd_bench_tiered(args: argparse.Namespace) -> int:
    from bench import tiered_bench

    tiered_bench.run(args)
    return 0


def _cmd_bench_tls(args: argparse.Namespace) -> int:
    from bench import tls_bench

    tls_bench.run(args)
    return 0


def _cmd_bench_auth(args: argparse.Namespace) -> int:
    from bench import auth_bench

    auth_bench.run(args)
    return 0


def _cmd_bench_delay(args: argparse.Namespace) -> int:
    from bench import delay_bench

    delay_bench.run(args)
    return 0


def _cmd_bench_filter(args: argparse.Namespace) -> int:
    from bench import filter_bench

    filter_bench.run(args)
    return 0


def _cmd_bench_log(args: argparse.Namespace) -> int:
    from bench import log_bench

    try:
        log_bench.run(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return 0


def _cmd_bench_cluster(args: argparse.Namespace) -> int:
    if args.nodes is None:
        raise UsageError("dmq bench needs --nodes N, or one of: log, broker, spark")
    from bench import cluster_bench

    argv = ["--nodes", str(args.nodes)]
    argv += ["--quick"] if args.quick else []
    argv += ["--runs", str(args.runs)] if args.runs is not None else []
    return int(cluster_bench.main(argv))


def _cmd_bench_groups(args: argparse.Namespace) -> int:
    from bench import groups_bench

    groups_bench.run(args)
    return 0


def _cmd_bench_share(args: argparse.Namespace) -> int:
    from bench import share_bench

    share_bench.run(args)
    return 0


def _cmd_bench_metrics(args: argparse.Namespace) -> int:
    from bench import metrics_bench

    metrics_bench.print_result(metrics_bench.run(args))
    return 0


def _cmd_bench_reads(args: argparse.Namespace) -> int:
    from bench import reads_bench

    reads_bench.run(args)
    return 0


def _cmd_bench_txn(args: argparse.Namespace) -> int:
    from bench import txn_bench

    txn_bench.run(args)
    return 0


def _cmd_bench_broker(args: argparse.Namespace) -> int:
    from bench import broker_bench

    broker_bench.run(args)
    return 0


def _cmd_bench_spark(args: argparse.Namespace) -> int:
    try:
        from bench import spark_bench
    except ImportError as exc:
        raise UsageError(
            f"dmq bench spark needs the spark extra (pip install 'dmq[spark]'): {exc}"
        ) from exc
    try:
        spark_bench.run(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return 0

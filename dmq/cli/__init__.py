"""The `dmq` command: run a broker, manage topics, produce and consume from a shell.

::

    dmq serve [--data-dir DIR] [--http-addr HOST:PORT] ...   run a broker (`dmq serve --help`)
    dmq topic create NAME [--partitions N] [--replication-factor N] [--config KEY=VALUE]...
    dmq topic list | describe NAME | alter NAME [--config KEY=VALUE]... [--partitions N]
    dmq topic delete NAME
    dmq produce TOPIC [--file PATH] [--key-separator SEP] [--acks all|1|0] ...
    dmq consume TOPIC [--partition N] [--from earliest|latest|OFFSET | --from-time T]
                      [--follow] [--max-records N] [--output lines|json]
    dmq cluster status [--json]                   brokers, Raft groups, leaders, lag
    dmq bench --nodes 3 [--quick] [--runs N]       a 3-node cluster against one node
    dmq bench log [--quick] [--dir DIR] [--total-mb MB] [--runs N] ...
    dmq bench broker [--quick] [--runs N] [--total-mb MB] [--rate N] ...
    dmq bench spark [--quick] [--runs N] [--total-mb MB] [--batch-records N]

Commands that talk to a broker take `--url` (before or after the command; default: the
environment variable DMQ_URL, else http://127.0.0.1:8080) and go through `dmq.client`.

Exit status: 0 on success; 1 on an error, printed on stderr as `error: <code>: <message>`
with the code of `dmq.errors`; 2 on a usage error; 130 when interrupted.

This module is the one place that assembles every layer, so it imports the heavy ones
(`dmq.server`, `bench`) only inside the commands that need them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from dmq.cli._common import (
    Subparsers,
    UsageError,
)
from dmq.cli.cluster import add_cluster
from dmq.cli.consume import add_consume
from dmq.cli.group import add_group
from dmq.cli.produce import add_produce
from dmq.cli.serve import add_serve
from dmq.cli.topic import add_topic
from dmq.errors import DmqError

URL_DEFAULT = "http://127.0.0.1:8080"
URL_ENV = "DMQ_URL"


def build_parser() -> argparse.ArgumentParser:
    default_url = os.environ.get(URL_ENV) or URL_DEFAULT
    parser = argparse.ArgumentParser(
        prog="dmq", description="dmq: a distributed message queue (broker, client, tools)."
    )
    parser.add_argument(
        "--url", default=default_url, help=f"broker URL [env {URL_ENV}; default {URL_DEFAULT}]"
    )
    # The same option after the command; SUPPRESS keeps the value given before it.
    url = argparse.ArgumentParser(add_help=False)
    url.add_argument("--url", default=argparse.SUPPRESS, help="broker URL (as before the command)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_serve(commands)
    add_topic(commands, url)
    add_produce(commands, url)
    add_consume(commands, url)
    add_cluster(commands, url)
    add_group(commands, url)
    _add_bench(commands)
    return parser


def _add_bench(commands: Subparsers) -> None:
    bench = commands.add_parser(
        "bench",
        help="benchmarks",
        description="`dmq bench --nodes 3`: a cluster of real brokers on this machine "
        "(bench/cluster_bench.py); or one of the benchmarks below.",
    )
    bench.add_argument("--nodes", type=int, help="cluster benchmark with this many brokers")
    bench.add_argument("--quick", action="store_true", help="CI-sized run")
    bench.add_argument("--runs", type=int, help="runs; medians are shown")
    bench.set_defaults(handler=_cmd_bench_cluster)
    kinds = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    # The options of bench/log_bench.py's add_arguments, repeated here so that `dmq` does
    # not import the benchmark unless it runs (a test keeps the two lists equal).
    log = kinds.add_parser("log", help="the storage engine (log/) against raw file I/O")
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
    broker = kinds.add_parser("broker", help="a single-node broker over HTTP, against log/ appends")
    broker.add_argument("--dir", help="data directory (default: a temp dir here, removed after)")
    broker.add_argument("--runs", type=int, default=3, help="runs; medians are shown")
    broker.add_argument("--total-mb", type=int, default=128, help="MB produced per run")
    broker.add_argument("--rate", type=int, default=500, help="single-record requests/s")
    broker.add_argument("--latency-seconds", type=float, default=5.0)
    broker.add_argument("--quick", action="store_true", help="one small run (CI)")
    broker.set_defaults(handler=_cmd_bench_broker)
    # Likewise bench/groups_bench.py's add_arguments.
    groups = kinds.add_parser(
        "groups", help="consumer groups: commit latency and rate, member death"
    )
    groups.add_argument("--nodes", type=int, default=3, help="brokers of the cluster (3)")
    groups.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    groups.add_argument("--commits", type=int, default=300, help="sequential commits (300)")
    groups.add_argument("--seconds", type=float, default=4.0, help="per rate measure (4)")
    groups.add_argument("--in-flight", type=int, default=32, help="concurrent commits (32)")
    groups.add_argument("--session-ms", type=int, default=1_000, help="session timeout (1000)")
    groups.add_argument("--quick", action="store_true", help="one small run (CI)")
    groups.set_defaults(handler=_cmd_bench_groups)
    # Likewise bench/spark_bench.py's add_arguments (needs the spark extra).
    spark = kinds.add_parser(
        "spark", help="Spark reading a topic through spark_io, against a Parquet file"
    )
    spark.add_argument("--dir", type=Path, help="create the work directory inside DIR")
    spark.add_argument("--total-mb", type=int, default=256, help="MiB of records in the topic")
    spark.add_argument(
        "--batch-records", type=int, default=100_000, help="maxOffsetsPerTrigger (100000)"
    )
    spark.add_argument("--runs", type=int, default=3, help="runs; medians are shown")
    spark.add_argument("--quick", action="store_true", help="CI-sized run")
    spark.set_defaults(handler=_cmd_bench_spark)


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `dmq` command; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2)
        return exit_.code if isinstance(exit_.code, int) else 2
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return handler(args)
    except DmqError as error:
        print(f"error: {error.code}: {error.message}", file=sys.stderr)
        return 1
    except UsageError as error:
        print(f"dmq: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        _silence_stdout()  # the reader left (e.g. `| head`): not an error
        return 0


def _silence_stdout() -> None:
    # Python flushes stdout at exit; pointing it at /dev/null avoids a second EPIPE.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


# --------------------------------------------------------------------------- bench


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

"""The `dmq` command: run a broker, manage topics, produce and consume from a shell.

::

    dmq --version                                 this dmq's release (dmq/__init__.py)
    dmq serve [--data-dir DIR] [--http-addr HOST:PORT] ...   run a broker (`dmq serve --help`)
    dmq topic create NAME [--partitions N] [--replication-factor N] [--config KEY=VALUE]...
    dmq topic list | describe NAME | alter NAME [--config KEY=VALUE]... [--partitions N]
    dmq topic delete NAME
    dmq produce TOPIC [--file PATH] [--key-separator SEP] [--acks all|1|0] ...
    dmq consume TOPIC [--partition N] [--from earliest|latest|OFFSET | --from-time T]
                      [--follow] [--max-records N] [--output lines|json]
    dmq cluster status [--json]                   brokers, Raft groups, leaders, lag
    dmq cluster operations | reassign | decommission-broker | metadata-voters ...
    dmq group list | describe NAME | reset NAME ... | delete NAME
    dmq storage show|reset --data-dir DIR | set-aside   a data directory and its identity
    dmq share consume GROUP TOPIC [--ack accept|release|reject] [--follow]
    dmq share configure GROUP [--lock-duration-ms N] ... | describe GROUP | list
    dmq txn list | describe ID | abort ID          transactions: state, age, partitions
    dmq delay list TOPIC | cancel TOPIC ID         delayed records waiting for their time
    dmq bench --nodes 3 [--quick] [--runs N]       a 3-node cluster against one node
    dmq bench log [--quick] [--dir DIR] [--total-mb MB] [--runs N] ...
    dmq bench broker [--quick] [--runs N] [--total-mb MB] [--rate N] ...
    dmq bench reads [--quick] [--runs N] [--readers N]    ReadIndex reads against leader reads
    dmq bench spark [--quick] [--runs N] [--total-mb MB] [--batch-records N]
    dmq bench tls [--quick] [--runs N] [--nodes 1|3]   batched produce, TLS on against off
    dmq bench auth [--quick] [--runs N] [--nodes 1|3]  produce, --auth on against off
    dmq cert dev [--dir D] [--hosts 127.0.0.1,localhost,...]   a CA and certificates (dev)
    dmq user add NAME [--password P] | remove NAME | list | whoami   (brokers with --auth on)
    dmq acl add|remove --principal User:N --resource-type T [--resource-name N]
                       [--pattern literal|prefixed] --operation OP [--deny] | list
    dmq quota set User:N [--produce-bytes-per-s N] [--fetch-bytes-per-s N]
                         [--requests-per-s N] | list

Commands that talk to a broker take `--url` (before or after the command; default: the
environment variable DMQ_URL, else http://127.0.0.1:8080) and go through `dmq.client`.
For https URLs, `--ca FILE` (env DMQ_CA) names the CA the brokers' certificates are
checked against, and `--cert FILE --key FILE` (DMQ_CERT, DMQ_KEY) a client certificate.
Brokers with `--auth on` want `--token NAME:PASSWORD` (env DMQ_TOKEN), or the superuser's.

Commands that print data take `--output table|json` (`_common.add_output`; `consume` and
`share consume`, which print records, `--output lines|json`); the old `--json` is kept,
hidden, as `--output json`.

Exit status: 0 on success; 1 on an error, printed on stderr as `error: <code>: <message>`
with the code of `dmq.errors`; 2 on a usage error; 130 when interrupted.

One module per command area, each with an `add_<area>(commands, ...)` that registers its
parser and handlers: `serve.py` (and `--join`), `topic.py`, `produce.py`, `consume.py`
(and `--group`), `delay.py` (and `produce --delay`), `cluster.py`, `group.py`,
`storage.py`, `share.py`, `txn.py`, `bench.py`,
`cert.py`, `security.py` (user, acl, quota);
`_common.py` holds the argument types, `UsageError` and the table printer they share. This
module only builds the parser (`build_parser`) and runs a command (`main`); it imports no
area's internals, and no area imports it.

The package is the one place that assembles every layer, so it imports the heavy ones
(`dmq.server`, `bench`) only inside the commands that need them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from dmq import __version__
from dmq.cli._common import UsageError, add_api_timeout
from dmq.cli.bench import add_bench
from dmq.cli.cert import add_cert
from dmq.cli.cluster import add_cluster
from dmq.cli.consume import add_consume
from dmq.cli.delay import add_delay
from dmq.cli.group import add_group
from dmq.cli.produce import add_produce
from dmq.cli.security import add_security
from dmq.cli.serve import add_serve
from dmq.cli.share import add_share
from dmq.cli.storage import add_storage
from dmq.cli.topic import add_topic
from dmq.cli.txn import add_txn
from dmq.client._http import ENV_TOKEN
from dmq.client._tls import ENV_CA, ENV_CERT, ENV_KEY
from dmq.errors import DmqError

URL_DEFAULT = "http://127.0.0.1:8080"
URL_ENV = "DMQ_URL"


def build_parser() -> argparse.ArgumentParser:
    default_url = os.environ.get(URL_ENV) or URL_DEFAULT
    parser = argparse.ArgumentParser(
        prog="dmq", description="dmq: a distributed message queue (broker, client, tools)."
    )
    parser.add_argument("--version", action="version", version=f"dmq {__version__}")
    parser.add_argument(
        "--url", default=default_url, help=f"broker URL [env {URL_ENV}; default {URL_DEFAULT}]"
    )
    # The same option after the command; SUPPRESS keeps the value given before it.
    url = argparse.ArgumentParser(add_help=False)
    url.add_argument("--url", default=argparse.SUPPRESS, help="broker URL (as before the command)")
    for parent, suppress in ((parser, False), (url, True)):
        _add_tls_arguments(parent, suppress=suppress)
        add_api_timeout(parent, suppress=suppress)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_serve(commands)
    add_topic(commands, url)
    add_produce(commands, url)
    add_consume(commands, url)
    add_cluster(commands, url)
    add_group(commands, url)
    add_storage(commands, url)
    add_share(commands, url)
    add_txn(commands, url)
    add_delay(commands, url)
    add_security(commands, url)  # user, acl, quota
    add_bench(commands)
    add_cert(commands)
    return parser


# The client's TLS options: each is exported to the environment variable the clients read
# (dmq/client/_tls.py), so every client a command builds uses it.
_TLS_OPTIONS = (
    ("--ca", ENV_CA, "PEM CA file the brokers' certificates are checked against"),
    ("--cert", ENV_CERT, "PEM client certificate, for brokers that ask for one"),
    ("--key", ENV_KEY, "the private key of --cert"),
    # Not a TLS option, but passed the same way: brokers with --auth on (dmq user add).
    ("--token", ENV_TOKEN, "NAME:PASSWORD (or the superuser token) for brokers with --auth on"),
)


def _add_tls_arguments(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    for flag, env, text in _TLS_OPTIONS:
        parser.add_argument(
            flag,
            dest=_dest(flag),
            default=argparse.SUPPRESS if suppress else None,
            help=f"{text} [env {env}]",
        )


def _dest(flag: str) -> str:
    return "token" if flag == "--token" else flag[2:] + "_file"


def _export_tls(args: argparse.Namespace) -> None:
    for flag, env, _ in _TLS_OPTIONS:
        value = getattr(args, _dest(flag), None)
        if value:
            os.environ[env] = value


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
    _export_tls(args)
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

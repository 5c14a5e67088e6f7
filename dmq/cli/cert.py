"""`dmq cert dev`: certificates for a local TLS cluster (dmq/dev_certs.py; registered by
dmq/cli/__init__.py)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from dmq.cli._common import Subparsers, UsageError, comma_items


def add_cert(commands: Subparsers) -> None:
    cert = commands.add_parser("cert", help="TLS certificates")
    actions = cert.add_subparsers(dest="action", metavar="ACTION", required=True)
    dev = actions.add_parser(
        "dev",
        help="write a self-signed CA, a broker and a client certificate (development only)",
        description="Write ca.pem, broker.pem, client.pem and their keys into --dir. Start "
        "every broker with --tls-cert broker.pem --tls-key broker-key.pem --tls-ca ca.pem; "
        "give clients --ca ca.pem (and --cert client.pem --key client-key.pem when brokers "
        "ask for client certificates).",
    )
    dev.add_argument("--dir", default="./dmq-certs", help="where to write (default ./dmq-certs)")
    dev.add_argument(
        "--hosts",
        default="127.0.0.1,localhost",
        help="the brokers' IP addresses and DNS names, comma-separated: every address "
        "clients and brokers use to reach one (default 127.0.0.1,localhost)",
    )
    dev.add_argument("--days", type=int, default=365, help="validity, days (default 365)")
    dev.add_argument("--force", action="store_true", help="replace existing files")
    dev.set_defaults(handler=_cmd_dev)


def _cmd_dev(args: argparse.Namespace) -> int:
    try:  # cryptography is needed by this command only
        dev_certs = importlib.import_module("dmq.dev_certs")
    except ImportError as exc:
        raise UsageError(f"dmq cert dev needs the cryptography package: {exc}") from exc
    try:
        out = dev_certs.write_dev_certs(
            Path(args.dir), comma_items(args.hosts), days=args.days, force=args.force
        )
    except (ValueError, FileExistsError) as exc:
        raise UsageError(str(exc)) from exc
    print(f"CA:     {out.ca}")
    print(f"broker: {out.broker_cert} {out.broker_key}  (hosts {args.hosts})")
    print(f"client: {out.client_cert} {out.client_key}")
    print(
        f"serve:  dmq serve --tls-cert {out.broker_cert} --tls-key {out.broker_key} "
        f"--tls-ca {out.ca} ..."
    )
    print(f"client: dmq --url https://HOST:PORT --ca {out.ca} ...")
    return 0

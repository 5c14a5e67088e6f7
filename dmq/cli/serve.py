"""`dmq serve`: run a broker, and `--join` a running cluster (registered by dmq/cli/__init__.py).

`--join URL[,URL...]` asks running brokers for the cluster (its brokers' Raft addresses and
the metadata voters) and starts as a new, non-voting broker of it (`resolve_join`).

Before either, the data directory's identity is checked (dmq/meta_file.py), changing
nothing: another broker's directory is refused, and so is `--join` of a cluster other than
the one the directory belongs to (the request names it: the brokers asked answer 409, and
the id they report is compared too), and so is `--join` with a directory that holds data
but names no cluster and never joined one (`_refuse_unidentified_data`). A broker never
changes cluster as a side effect of a flag: `dmq storage reset` (dmq/cli/storage.py) is the explicit way.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dmq import meta_file
from dmq.cli._common import Subparsers, comma_items
from dmq.client._tls import tls_context
from dmq.config import BrokerConfig, load_config
from dmq.config import add_arguments as add_broker_arguments
from dmq.errors import ClusterIdMismatch, DmqError
from dmq.internal_auth import CLUSTER_ID_HEADER
from log.segment import write_durably

JOIN_ASK_TIMEOUT_S = 5.0  # one GET /v1/cluster of a --join broker
JOIN_RETRY_FIRST_S = 0.5  # pause after a round of --join brokers none answered; doubles
JOIN_RETRY_MAX_S = 4.0


def add_serve(commands: Subparsers) -> None:
    serve = commands.add_parser(
        "serve",
        help="run a broker",
        description="Run a broker. Every setting is a flag, an environment variable "
        "DMQ_<NAME> or a key of the TOML --config file, in that precedence.",
    )
    add_broker_arguments(serve)
    serve.set_defaults(handler=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    config = load_config(vars(args), config_file=args.config)
    meta_file.check_start(config.data_path, config.node_id)  # another broker's: refused
    config = resolve_join(config)
    try:  # the whole broker: only this command needs it
        server = importlib.import_module("dmq.server")
    except ImportError as exc:
        raise DmqError(f"cannot load the broker (dmq.server): {exc}") from exc
    return int(server.serve(config))


JOINED_FILE = "joined_cluster.json"  # in <data dir>/meta/: what the last --join read


def _ask_one(
    url: str, data_dir: Path, own_cluster_id: str, tls: ssl.SSLContext | None = None
) -> dict[str, Any]:
    """GET /v1/cluster of one broker, naming this data directory's cluster (if any).

    ClusterIdMismatch, the refusal (one line, both ids, the remedy), if the broker answers
    409 or reports another cluster id than the directory's."""
    request = urllib.request.Request(f"{url}/v1/cluster")  # noqa: S310 - http(s) URLs
    if own_cluster_id:
        request.add_header(CLUSTER_ID_HEADER, own_cluster_id)
    try:
        with urllib.request.urlopen(request, timeout=JOIN_ASK_TIMEOUT_S, context=tls) as resp:  # noqa: S310 - the operator's --join http(s) URLs
            doc: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise
        try:
            theirs = str(json.loads(exc.read())["error"]["details"]["cluster_id"])
        except (ValueError, KeyError, TypeError):
            theirs = "(unknown)"
        doc = {"cluster_id": theirs}
    theirs = str(doc.get("cluster_id") or "")
    if own_cluster_id and theirs and theirs != own_cluster_id:
        raise ClusterIdMismatch(
            meta_file.mismatch_message(data_dir, own_cluster_id, theirs, f"--join {url}"),
            cluster_id=own_cluster_id,
            request_cluster_id=theirs,
        )
    return doc


def _ask_cluster(
    urls: list[str],
    patience_s: float,
    data_dir: Path,
    own_cluster_id: str = "",
    tls: ssl.SSLContext | None = None,
) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """Peers (id -> Raft address), metadata voters and the peers' HTTP addresses (id ->
    host:port: brokers on one host have distinct ones) from the first broker of urls that
    answers with every voter registered and the cluster's id known (a cluster still
    starting names voters it has no address for yet); rounds of every url go on until
    patience_s has passed. DmqError names each url with its last error; a broker of
    another cluster than the data directory's stops the rounds at once."""
    deadline = time.monotonic() + patience_s
    pause = JOIN_RETRY_FIRST_S
    while True:
        failures = []
        for url in urls:
            try:
                doc = _ask_one(url, data_dir, own_cluster_id, tls)
                peers = {b["node_id"]: b["raft_addr"] for b in doc["brokers"]}
                http_addrs = {b["node_id"]: b["http_addr"] for b in doc["brokers"]}
                voters = list(doc["metadata_voters"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                failures.append(f"{url}: {exc}")
                continue
            unknown = sorted(set(voters) - set(peers))
            if not unknown and doc.get("cluster_id"):
                return peers, voters, http_addrs
            failures.append(
                f"{url}: still starting (voters {','.join(unknown)} unregistered)"
                if unknown
                else f"{url}: still starting (no cluster id yet)"
            )
        left = deadline - time.monotonic()
        tried = "; ".join(failures)
        if left <= 0:
            raise DmqError(f"--join: no broker answered with the cluster ({tried})")
        print(f"--join: no broker answered yet ({tried}); asking again", file=sys.stderr)
        time.sleep(min(pause, left))
        pause = min(2 * pause, JOIN_RETRY_MAX_S)


def _refuse_unidentified_data(data_dir: Path) -> None:
    """`--join` with a data directory that holds data (a partition or a Raft group) but no
    `meta.properties` and no `meta/joined_cluster.json`: a directory of a dmq from before
    cluster ids, of a broker started with `--peers`. Which cluster it belongs to is
    unknown, so it is refused (nothing changed) instead of joining whichever cluster the
    URLs name. One with `joined_cluster.json` is a restart of a broker that joined: it
    goes on (its catalogue is compared with the cluster's once registered)."""
    held = [
        sub
        for sub in (data_dir / "partitions", data_dir / "raft" / "groups")
        if sub.is_dir() and any(sub.iterdir())
    ]
    if held:
        raise ClusterIdMismatch(
            f"data directory {data_dir} holds data ({', '.join(str(p) for p in held)}) but no "
            f"{meta_file.META_FILE}: it is from a dmq before cluster ids and which cluster it "
            f"belongs to is unknown; start it once without --join (with its --peers) so that "
            f"it adopts its cluster's id, or empty it with `dmq storage reset --data-dir "
            f"{data_dir}` (deletes its data) to join as a new broker (nothing was changed)",
            cluster_id="",
        )


def resolve_join(config: BrokerConfig) -> BrokerConfig:
    """`--join URL,URL,...`: the running cluster's peers and voters, with this broker added.

    The brokers are asked in turn (`GET /v1/cluster`) until one answers; a first join
    keeps asking until `join_timeout_ms` (a broker down for a restart, or cut off by a
    partition, is waited for), then fails naming every URL and its error. What it read
    is kept in `<data dir>/meta/joined_cluster.json`: a restarted broker asks each URL
    once and, when none answers, starts from the copy (its own catalogue then brings it
    up to date) instead of failing to start."""
    if not config.join:
        return config
    urls = [u.rstrip("/") for u in comma_items(config.join)]
    # With TLS on, a bare host:port is https, checked against tls_ca (dmq/README.md, "TLS").
    urls = [u if "://" in u else f"{config.http_scheme}://{u}" for u in urls]
    tls = (
        tls_context(config.tls_ca, config.tls_cert, config.tls_key) if config.tls_enabled else None
    )
    if not urls:
        raise DmqError(f"--join {config.join!r}: name at least one broker URL")
    saved = config.data_path / "meta" / JOINED_FILE
    patience_s = 0.0 if saved.exists() else config.join_timeout_ms / 1000
    identity = meta_file.read(config.data_path)
    if identity is None and not saved.exists():
        _refuse_unidentified_data(config.data_path)
    own_cluster_id = identity.cluster_id if identity is not None else ""
    try:
        peers, voters, http_addrs = _ask_cluster(
            urls, patience_s, config.data_path, own_cluster_id, tls
        )
    except ClusterIdMismatch:
        raise  # never started from the copy: the seeds said which cluster they are
    except DmqError as exc:
        if not saved.exists():
            raise
        print(f"{exc}; starting from what the last join read ({saved})", file=sys.stderr)
        kept = json.loads(saved.read_text())
        peers, voters = dict(kept["peers"]), list(kept["metadata_voters"])
        http_addrs = dict(kept.get("http_addrs", {}))  # absent from copies of before
        fresh = False
    else:
        fresh = True
    if config.node_id in peers and peers[config.node_id] != config.raft_addr:
        raise DmqError(f"--join: broker id {config.node_id} is taken by {peers[config.node_id]}")
    peers[config.node_id] = config.raft_addr
    http_addrs.pop(config.node_id, None)
    if fresh:  # kept for the next start (a copy read back is not written again)
        saved.parent.mkdir(parents=True, exist_ok=True)
        kept_doc = {"peers": peers, "metadata_voters": voters, "http_addrs": http_addrs}
        write_durably(saved, json.dumps(kept_doc).encode())
    return dataclasses.replace(
        config,
        peers=",".join(f"{k}={v}" for k, v in sorted(peers.items())),
        peer_http_addrs=",".join(f"{k}={v}" for k, v in sorted(http_addrs.items())),
        metadata_voters=",".join(voters),
    )

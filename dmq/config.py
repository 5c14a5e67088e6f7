"""Broker configuration: one frozen dataclass, three sources with the same names.

Every field can be set, highest precedence first, by a command-line flag
(`--data-dir`), an environment variable (`DMQ_DATA_DIR`) or the TOML config file
given with `--config` (`data_dir = "..."`). `dmq serve --help` lists them all with
their defaults and units. Relations between limits are checked at start-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmq import limits
from dmq.errors import InvalidConfig
from log import limits as log_limits
from log.config import DAY_MS

ENV_PREFIX = "DMQ_"


def _doc(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    node_id: str = field(default="n1", metadata=_doc("this broker's id in the cluster"))
    data_dir: str = field(default="./dmq-data", metadata=_doc("where partitions are stored"))
    http_addr: str = field(default="127.0.0.1:8080", metadata=_doc("HTTP listen host:port"))
    raft_addr: str = field(
        default="127.0.0.1:9090", metadata=_doc("Raft listen host:port (all groups share it)")
    )
    peers: str = field(
        default="",
        metadata=_doc(
            "the cluster: id=host:port,... of every broker's raft_addr (empty: one node)"
        ),
    )
    peer_http_addrs: str = field(
        default="",
        metadata=_doc(
            "id=host:port,... of other brokers' http_addr, for the first contact before "
            "the catalogue names them (set by --join; empty: a peer's Raft host with this "
            "broker's HTTP port)"
        ),
    )
    metadata_voters: str = field(
        default="",
        metadata=_doc(
            "ids voting in the metadata group, comma-separated (empty: 1, 3 or 5 first ids)"
        ),
    )
    cluster_secret_file: str = field(
        default="",
        metadata=_doc(
            "file holding the secret every broker of the cluster shares: it authenticates "
            "Raft connections and /v1/internal calls (empty: none, for one node or a "
            "private network)"
        ),
    )
    # TLS (dmq/tls.py; dmq/README.md, "TLS"): on when tls_cert is set.
    tls_cert: str = field(
        default="",
        metadata=_doc(
            "PEM certificate (chain) of this broker: TLS on the HTTP API, the internal "
            "calls and the Raft port (empty: TLS off)"
        ),
    )
    tls_key: str = field(default="", metadata=_doc("PEM private key of tls_cert"))
    tls_ca: str = field(
        default="",
        metadata=_doc(
            "PEM CA certificate(s) that sign the brokers' (and clients') certificates: "
            "checks other brokers and client certificates (needed with tls_cert)"
        ),
    )
    tls_client_auth: str = field(
        default="none",
        metadata=_doc(
            "client certificates on the HTTP API: none, optional (checked if sent) or "
            "required (Kafka's ssl.client.auth)"
        ),
    )
    # Authentication, ACLs and quotas of the HTTP API (dmq/broker/security.py; dmq/README.md,
    # "Security"): off by default, so the embedded single node needs no credentials.
    auth: str = field(
        default="off",
        metadata=_doc(
            "on: every public route but /healthz, /readyz, /openapi.json and /ui needs a "
            "bearer token or HTTP Basic (users and ACLs in the metadata group; bootstrap "
            "superuser token from env DMQ_SUPERUSER_TOKEN); off: no checks"
        ),
    )
    auth_cache_entries_max: int = field(
        default=10_000,
        metadata=_doc("verified credentials kept (LRU) so scrypt runs once per credential"),
    )
    auth_cache_ttl_ms: int = field(
        default=60_000,
        metadata=_doc("how long a verified credential is trusted without scrypt, ms"),
    )
    # A password check is a scrypt (30-60 ms of one core, 16 MiB); a client address with
    # this many under way or queued gets 429 for the next one, so that one client cannot
    # queue checks ahead of everybody else's logins. Cost of a lower bound: clients
    # sharing an address (behind NAT) are refused sooner on their first logins.
    # Signatures of broker-to-broker calls accepted in the last CLOCK_SKEW_MS_MAX (60 s),
    # remembered so that a replay is refused (dmq/internal_auth.py): ~180 bytes each
    # (45 MiB when full at the default), room for 60 s of ~4,000 signed calls/s; past it
    # signed calls get a retriable 503 until old ones expire.
    signature_replay_entries_max: int = field(
        default=250_000,
        metadata=_doc("signed internal calls remembered within their 60 s window"),
    )
    auth_checks_per_address_max: int = field(
        default=2,
        metadata=_doc("password checks (scrypt) under way or queued per client address"),
    )
    raft_durability: str = field(
        default="fsync",
        metadata=_doc("fsync: acks=all survives power loss; none: only process crashes"),
    )
    raft_heartbeat_interval_ms: int = field(default=100, metadata=_doc("Raft heartbeat, ms"))
    raft_election_timeout_min_ms: int = field(
        default=400, metadata=_doc("Raft election timeout, lower bound, ms")
    )
    raft_election_timeout_max_ms: int = field(
        default=800, metadata=_doc("Raft election timeout, upper bound, ms")
    )
    raft_snapshot_entries: int = field(
        default=4096, metadata=_doc("journal entries per group before a snapshot drops them")
    )
    raft_snapshot_bytes: int = field(
        default=256 * limits.MiB,
        metadata=_doc("journal bytes per group before a snapshot drops them (>= 1 MiB)"),
    )
    request_timeout_ms: int = field(
        default=10_000,
        metadata=_doc("how long a produce or admin request waits for a leader and a commit, ms"),
    )
    log_level: str = field(default="info", metadata=_doc("debug, info, warning or error"))
    auto_create_topics: bool = field(
        default=True, metadata=_doc("create a topic on its first produce")
    )
    join: str = field(
        default="",
        metadata=_doc(
            "URLs of running brokers, comma-separated: join their cluster "
            "(sets peers, metadata_voters)"
        ),
    )
    join_timeout_ms: int = field(
        default=60_000,
        metadata=_doc(
            "how long a first --join asks its brokers for the cluster, and then waits to "
            "be registered in it, each, ms"
        ),
    )
    auto_balance_replicas: bool = field(
        default=True,
        metadata=_doc("move replicas so every broker holds within one of the others"),
    )
    default_partitions: int = field(default=1, metadata=_doc("partitions of auto-created topics"))
    default_replication_factor: int = field(
        default=3, metadata=_doc("replicas per partition of new topics, capped at the brokers")
    )
    group_rebalance_timeout_ms: int = field(
        default=limits.GROUP_REBALANCE_TIMEOUT_MS_DEFAULT,
        metadata=_doc(
            "a group member that does not acknowledge a revocation within this is expired, ms"
        ),
    )
    group_offsets_retention_ms: int = field(
        default=limits.GROUP_OFFSETS_RETENTION_MS_DEFAULT,
        metadata=_doc(
            "an empty group and its committed offsets go this long after its last change, ms"
        ),
    )
    transactional_id_expiration_ms: int = field(
        default=limits.TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT,
        metadata=_doc("a transactional id unused this long is forgotten, ms"),
    )
    rest_v2_instance_timeout_ms: int = field(
        default=limits.REST_V2_INSTANCE_TIMEOUT_MS_DEFAULT,
        metadata=_doc(
            "a Confluent REST v2 consumer instance idle this long is deleted and leaves its "
            "group (consumer.instance.timeout.ms), ms"
        ),
    )
    rest_v2_instances_max: int = field(
        default=limits.REST_V2_INSTANCES_MAX,
        metadata=_doc(
            "Confluent REST v2 consumer instances the metadata leader keeps (429 beyond)"
        ),
    )
    # Limits (dmq/limits.py explains each cost).
    request_bytes_max: int = field(
        default=limits.REQUEST_BYTES_MAX, metadata=_doc("largest HTTP request body, bytes")
    )
    produce_records_max: int = field(
        default=limits.PRODUCE_RECORDS_MAX, metadata=_doc("records per JSON/text produce request")
    )
    produce_queue_depth_max: int = field(
        default=limits.PRODUCE_QUEUE_DEPTH_MAX,
        metadata=_doc("queued produce requests per partition before 429"),
    )
    produce_queue_bytes_max: int = field(
        default=limits.PRODUCE_QUEUE_BYTES_MAX,
        metadata=_doc("bytes of produce requests queued per partition before 429"),
    )
    fetch_wait_ms_max: int = field(
        default=limits.FETCH_WAIT_MS_MAX, metadata=_doc("longest long-poll wait_ms, ms")
    )
    fetch_bytes_max: int = field(
        default=limits.FETCH_BYTES_MAX, metadata=_doc("largest fetch max_bytes, bytes")
    )
    fetch_records_max: int = field(
        default=limits.FETCH_RECORDS_MAX, metadata=_doc("largest fetch max_records")
    )
    waiting_fetches_max: int = field(
        default=limits.WAITING_FETCHES_MAX, metadata=_doc("long-polls parked at once before 429")
    )
    metrics_partitions_max: int = field(
        default=limits.METRICS_PARTITIONS_MAX,
        metadata=_doc(
            "GET /metrics: hosted partitions up to which partition metrics are labelled per "
            "partition; above it they are summed per topic (dmq/README.md, 'Metrics')"
        ),
    )
    filter_chars_max: int = field(
        default=limits.FILTER_CHARS_MAX, metadata=_doc("longest filter= selector, characters")
    )
    filter_scan_bytes_max: int = field(
        default=limits.FILTER_SCAN_BYTES_MAX,
        metadata=_doc("log bytes one filtered fetch may read and decode, bytes"),
    )
    max_delay_ms: int = field(
        default=limits.MAX_DELAY_MS, metadata=_doc("longest delay of a delayed record, ms")
    )
    delay_pending_bytes_max: int = field(
        default=limits.DELAY_PENDING_BYTES_MAX,
        metadata=_doc("bytes of delayed records one partition may hold before 429"),
    )
    replicas_per_broker_max: int = field(
        default=limits.REPLICAS_PER_BROKER_MAX,
        metadata=_doc("partition replicas per broker, on average (each holds ~6 files)"),
    )
    record_bytes_max: int = field(
        default=log_limits.RECORD_BYTES_MAX, metadata=_doc("default max_record_bytes of topics")
    )
    batch_bytes_max: int = field(
        default=log_limits.BATCH_BYTES_MAX, metadata=_doc("largest batch, bytes")
    )
    # Storage defaults for new topics.
    segment_bytes: int = field(default=256 * limits.MiB, metadata=_doc("segment size, bytes"))
    retention_ms: int = field(default=7 * DAY_MS, metadata=_doc("time retention, ms (-1: keep)"))
    retention_bytes: int = field(
        default=-1, metadata=_doc("size retention per partition (-1: none)")
    )
    retention_check_interval_ms: int = field(
        default=60_000, metadata=_doc("how often retention and compaction run, ms")
    )
    # Tiered storage (dmq/tiered/README.md): closed segments of topics with
    # remote_storage_enable go to this object store; reads below the local log start
    # come back through a bounded chunk cache.
    remote_storage: str = field(
        default="",
        metadata=_doc(
            "object store for tiered storage: file:///dir or s3://bucket/prefix "
            "('': tiered storage off; s3 credentials and region from the AWS variables)"
        ),
    )
    remote_storage_endpoint: str = field(
        default="", metadata=_doc("URL of an S3-compatible server ('': AWS's)")
    )
    remote_upload_concurrency: int = field(
        default=2, metadata=_doc("segment uploads in flight at once, per broker")
    )
    remote_upload_bytes_per_s: int = field(
        default=64 * limits.MiB, metadata=_doc("upload bandwidth of this broker, bytes/s")
    )
    remote_upload_interval_ms: int = field(
        default=1_000, metadata=_doc("how often leaders look for closed segments to upload, ms")
    )
    remote_cache_bytes: int = field(
        default=256 * limits.MiB,
        metadata=_doc("local cache of remote segment chunks (LRU), bytes on disk"),
    )
    remote_cache_chunk_bytes: int = field(
        default=limits.MiB, metadata=_doc("one cached (and fetched) byte range of a remote segment")
    )
    # A full disk (log/space.py): produce is refused (507) below the floor, which is also
    # the reserve the metadata group, deletions and Raft terms may still use.
    storage_min_free_bytes: int = field(
        default=-1,
        metadata=_doc(
            "free-space floor of the data directory, bytes: produce is refused below it "
            "(-1: the smaller of 1 GiB and 5% of the filesystem; 0: no floor)"
        ),
    )
    storage_alert_free_bytes: int = field(
        default=-1,
        metadata=_doc(
            "free space below which /readyz and cluster status say 'alert', bytes "
            "(-1: twice the floor)"
        ),
    )
    shutdown_grace_ms: int = field(
        default=10_000, metadata=_doc("time given to in-flight requests at shutdown, ms")
    )

    def __post_init__(self) -> None:
        positive = [
            f.name
            for f in dataclasses.fields(self)
            if f.type == "int"
            and f.name
            not in (
                "retention_ms",
                "retention_bytes",
                "storage_min_free_bytes",
                "storage_alert_free_bytes",
            )
            and getattr(self, f.name) < 1
        ]
        if positive:
            raise InvalidConfig(f"{positive[0]} must be >= 1", field=positive[0])
        for name in ("storage_min_free_bytes", "storage_alert_free_bytes"):
            if getattr(self, name) < -1:
                raise InvalidConfig(f"{name} must be >= 0, or -1 for the default", field=name)
        if 0 <= self.storage_alert_free_bytes < self.storage_min_free_bytes:
            raise InvalidConfig(
                "storage_alert_free_bytes must be >= storage_min_free_bytes",
                field="storage_alert_free_bytes",
                limit=self.storage_min_free_bytes,
            )
        if self.batch_bytes_max > log_limits.BATCH_BYTES_MAX:
            raise InvalidConfig(
                f"batch_bytes_max may not exceed {log_limits.BATCH_BYTES_MAX}",
                field="batch_bytes_max",
                limit=log_limits.BATCH_BYTES_MAX,
            )
        if self.record_bytes_max > self.batch_bytes_max:
            raise InvalidConfig(
                "record_bytes_max must be <= batch_bytes_max", field="record_bytes_max"
            )
        # A body must be able to carry the largest batch, base64-encoded in JSON.
        if self.request_bytes_max < self.batch_bytes_max:
            raise InvalidConfig(
                "request_bytes_max must be >= batch_bytes_max", field="request_bytes_max"
            )
        if self.produce_queue_bytes_max < self.batch_bytes_max:
            raise InvalidConfig(
                "produce_queue_bytes_max must be >= batch_bytes_max (one batch must fit)",
                field="produce_queue_bytes_max",
            )
        if self.fetch_bytes_max < self.batch_bytes_max:
            raise InvalidConfig(
                "fetch_bytes_max must be >= batch_bytes_max (a fetch returns whole batches)",
                field="fetch_bytes_max",
            )
        low, high = limits.SESSION_TIMEOUT_MS_MIN, limits.SESSION_TIMEOUT_MS_MAX
        if not low <= self.rest_v2_instance_timeout_ms <= high:  # also its members' session
            raise InvalidConfig(
                f"rest_v2_instance_timeout_ms must be in [{low}, {high}]",
                field="rest_v2_instance_timeout_ms",
                limit=high,
            )
        for name in ("http_addr", "raft_addr"):
            host, _, port = getattr(self, name).rpartition(":")
            if not host or not port.isdigit():
                raise InvalidConfig(f"{name} must be host:port", field=name)
        self._check_tls()
        if self.remote_storage and not (
            self.remote_storage.startswith("file:///")
            or (self.remote_storage.startswith("s3://") and len(self.remote_storage) > 5)
        ):
            raise InvalidConfig(
                "remote_storage must be file:///absolute/dir or s3://bucket/prefix (or empty)",
                field="remote_storage",
            )
        if self.remote_cache_bytes < 2 * self.remote_cache_chunk_bytes:
            raise InvalidConfig(
                "remote_cache_bytes must hold at least two chunks (remote_cache_chunk_bytes)",
                field="remote_cache_bytes",
                limit=2 * self.remote_cache_chunk_bytes,
            )
        self._check_auth()
        if self.raft_durability not in ("fsync", "none"):
            raise InvalidConfig("raft_durability must be fsync or none", field="raft_durability")
        if self.raft_snapshot_bytes < limits.MiB:
            raise InvalidConfig(
                "raft_snapshot_bytes must be at least 1 MiB",
                field="raft_snapshot_bytes",
                limit=limits.MiB,
            )
        peers = self.peer_addrs  # parses and checks
        _ = self.peer_http_addr_map  # parses and checks
        if self.node_id not in peers:
            raise InvalidConfig(
                f"node_id {self.node_id!r} is not among the peers {sorted(peers)}", field="peers"
            )
        unknown = sorted(set(self.voters) - set(peers))
        if unknown:
            raise InvalidConfig(
                f"metadata voter {unknown[0]!r} is not a peer", field="metadata_voters"
            )

    def _check_auth(self) -> None:
        if self.auth not in ("on", "off"):
            raise InvalidConfig("auth must be on or off", field="auth")
        if (
            self.auth == "on"
            and not self.cluster_secret_file
            and (len(self.peer_addrs) > 1 or self.join)
        ):
            # Without it anyone could call /v1/internal/metadata/propose and add a user.
            raise InvalidConfig(
                "auth on in a cluster needs cluster_secret_file (it guards /v1/internal)",
                field="cluster_secret_file",
            )
        for name in ("auth_cache_entries_max", "auth_cache_ttl_ms"):
            if getattr(self, name) < 0:
                raise InvalidConfig(f"{name} must be >= 0 (0: no cache)", field=name)
        if self.signature_replay_entries_max < 1:
            raise InvalidConfig(
                "signature_replay_entries_max must be >= 1", field="signature_replay_entries_max"
            )
        if self.auth_checks_per_address_max < 1:
            raise InvalidConfig(
                "auth_checks_per_address_max must be >= 1", field="auth_checks_per_address_max"
            )

    def _check_tls(self) -> None:
        if self.tls_client_auth not in ("none", "optional", "required"):
            raise InvalidConfig(
                "tls_client_auth must be none, optional or required", field="tls_client_auth"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            missing = "tls_key" if self.tls_cert else "tls_cert"
            raise InvalidConfig("tls_cert and tls_key go together", field=missing)
        if self.tls_cert and not self.tls_ca:
            # Brokers check each other's certificates (internal calls, Raft) against it.
            raise InvalidConfig("tls_cert needs tls_ca (the CA of the brokers)", field="tls_ca")
        if not self.tls_cert and (self.tls_ca or self.tls_client_auth != "none"):
            field_name = "tls_ca" if self.tls_ca else "tls_client_auth"
            raise InvalidConfig(f"{field_name} needs tls_cert and tls_key", field=field_name)

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_cert)

    @property
    def http_scheme(self) -> str:
        """How this cluster's HTTP API is reached: https with TLS on."""
        return "https" if self.tls_enabled else "http"

    @property
    def http_host(self) -> str:
        return self.http_addr.rpartition(":")[0]

    @property
    def http_port(self) -> int:
        return int(self.http_addr.rpartition(":")[2])

    @property
    def peer_addrs(self) -> dict[str, str]:
        """node id -> raft address of every broker; just this one without `peers`."""
        if not self.peers.strip():
            return {self.node_id: self.raft_addr}
        out: dict[str, str] = {}
        for item in self.peers.split(","):
            node_id, sep, addr = item.strip().partition("=")
            host, _, port = addr.rpartition(":")
            if not sep or not node_id or not host or not port.isdigit() or node_id in out:
                raise InvalidConfig(
                    f"peers must be id=host:port,... with distinct ids; got {item!r}", field="peers"
                )
            out[node_id] = addr
        return out

    @property
    def peer_http_addr_map(self) -> dict[str, str]:
        """node id -> HTTP address of the brokers `peer_http_addrs` names."""
        out: dict[str, str] = {}
        for item in (i.strip() for i in self.peer_http_addrs.split(",")):
            if not item:
                continue
            node_id, sep, addr = item.partition("=")
            host, _, port = addr.rpartition(":")
            if not sep or not node_id or not host or not port.isdigit() or node_id in out:
                raise InvalidConfig(
                    f"peer_http_addrs must be id=host:port,... with distinct ids; got {item!r}",
                    field="peer_http_addrs",
                )
            out[node_id] = addr
        return out

    @property
    def voters(self) -> list[str]:
        """The metadata group's voters: as configured, else the first 1, 3 or 5 ids."""
        if self.metadata_voters.strip():
            return sorted({v.strip() for v in self.metadata_voters.split(",") if v.strip()})
        ids = sorted(self.peer_addrs)
        count = 5 if len(ids) >= 5 else 3 if len(ids) >= 3 else 1
        return ids[:count]

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)


def _parse(name: str, type_name: str, raw: Any) -> Any:
    if type_name == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise InvalidConfig(f"{name} must be true or false, got {raw!r}", field=name)
    if type_name == "int":
        if isinstance(raw, bool):
            raise InvalidConfig(f"{name} must be an integer", field=name)
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise InvalidConfig(f"{name} must be an integer, got {raw!r}", field=name) from None
    return str(raw)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One `--flag` per BrokerConfig field, plus `--config FILE`."""
    parser.add_argument("--config", help="TOML config file (same names as the flags)")
    for f in dataclasses.fields(BrokerConfig):
        flag = "--" + f.name.replace("_", "-")
        env = ENV_PREFIX + f.name.upper()
        parser.add_argument(
            flag,
            dest=f.name,
            default=None,
            # argparse %-formats help: a literal % ("5% of the filesystem") is doubled
            help=f"{f.metadata.get('help', '')} [env {env}; default {f.default!r}]".replace(
                "%", "%%"
            ),
        )


def load_config(
    flags: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    config_file: str | None = None,
) -> BrokerConfig:
    """Merge flags > environment > file > defaults, parse types, validate."""
    environ = os.environ if environ is None else environ
    from_file: dict[str, Any] = {}
    if config_file:
        try:
            from_file = tomllib.loads(Path(config_file).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidConfig(
                f"cannot read config file {config_file}: {exc}", field="config"
            ) from exc
    fields = {f.name: f for f in dataclasses.fields(BrokerConfig)}
    unknown = sorted(set(from_file) - set(fields))
    if unknown:
        raise InvalidConfig(f"unknown setting {unknown[0]!r} in {config_file}", field=unknown[0])
    values: dict[str, Any] = {}
    for name, f in fields.items():
        raw = flags.get(name)
        if raw is None:
            raw = environ.get(ENV_PREFIX + name.upper())
        if raw is None:
            raw = from_file.get(name)
        if raw is not None:
            values[name] = _parse(name, str(f.type), raw)
    return BrokerConfig(**values)

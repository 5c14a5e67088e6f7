"""What the services of one broker share: the narrow dependencies, never the Broker.

A service (produce.py, fetch.py, topics.py, ...) is built with a `BrokerContext` and the
other services it calls, and imports neither `Broker` nor broker.py: the Broker composes
services, services do not reach back into it (dmq/README.md, "dmq/broker/"). The context
holds only what is not any one service's own: the config, the peers client, the Raft
node and the metadata service (both opened by `Broker.start`), this broker's replicas
and traffic counters, and the lifecycle flags every request checks.
"""

from __future__ import annotations

import asyncio
import logging

from dmq import errors
from dmq.broker.replicas import ReplicaSet
from dmq.broker.traffic import TrafficCounters
from dmq.config import BrokerConfig
from dmq.internal_auth import read_secret_file
from dmq.metadata.service import MetadataService
from dmq.peers import PeerClient
from dmq.tls import broker_tls
from log.space import SpaceGuard
from raft.node import RaftNode

_log = logging.getLogger("dmq.broker")


class BrokerContext:
    """One broker's shared state; the Broker owns it and sets what `start` opens."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.data_dir = config.data_path
        self.timeout_s = config.request_timeout_ms / 1000
        # dmq/internal_auth.py: signs this broker's internal calls, checks the others'.
        self.cluster_secret = read_secret_file(config.cluster_secret_file)
        # dmq/tls.py: None with TLS off; else the HTTP listener's, the peers' and Raft's.
        self.tls = broker_tls(config)
        self.peers = PeerClient(
            local_host=config.http_host,
            secret=self.cluster_secret,
            tls=None if self.tls is None else self.tls.http_client,
        )
        self.replicas = ReplicaSet()
        # Records and bytes produced and fetched per partition (traffic.py; metrics.py).
        self.traffic = TrafficCounters()
        # The data directory's free-space floor (log/space.py; dmq/broker/storage.py).
        self.space = SpaceGuard(
            self.data_dir,
            floor_bytes=None
            if config.storage_min_free_bytes < 0
            else config.storage_min_free_bytes,
            alert_bytes=(
                None if config.storage_alert_free_bytes < 0 else config.storage_alert_free_bytes
            ),
        )
        self.raft_node: RaftNode | None = None  # set by Broker.start
        self.metadata_service: MetadataService | None = None  # set by Broker.start
        self.cluster_id = ""
        self.ready = False
        # Set when the broker must stop (its Raft node stopped on an error, a replica's
        # data broke an invariant): dmq serve exits non-zero rather than linger half-dead.
        self.failed = asyncio.Event()
        self.failure: BaseException | None = None

    @property
    def metadata(self) -> MetadataService:
        if self.metadata_service is None:
            raise errors.BrokerUnavailable("the broker is starting", retry_after_ms=500)
        return self.metadata_service

    @property
    def node_id(self) -> str:
        return self.config.node_id

    def check_ready(self) -> None:
        """Requests on topics and records wait for the start (and stop at the stop)."""
        if not self.ready:
            raise errors.BrokerUnavailable("the broker is starting or stopping", retry_after_ms=500)

    def fail(self, error: BaseException) -> None:
        """Stop serving: the broker cannot go on safely (dmq serve then exits non-zero)."""
        if self.failure is None:
            _log.critical("broker %s must stop: %r", self.config.node_id, error)
            self.failure = error
        self.ready = False
        self.failed.set()

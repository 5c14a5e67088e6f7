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
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

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
T = TypeVar("T")
REACH_CHECK_S = 0.2  # how often a call to another broker checks it is still in reach


class BrokerContext:
    """One broker's shared state; the Broker owns it and sets what `start` opens."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.data_dir = config.data_path
        self.timeout_s = config.request_timeout_ms / 1000
        # dmq/internal_auth.py: signs this broker's internal calls, checks the others'.
        self.cluster_secret = read_secret_file(config.cluster_secret_file)
        if self.cluster_secret is None and config.auth == "on":
            # One node with auth and no secret file (config.py refuses it for a cluster):
            # a secret of this process alone keeps /v1/internal closed to every caller.
            self.cluster_secret = secrets.token_bytes(32)
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

    def out_of_reach(self, node_id: str) -> bool:
        """Whether this broker's Raft node has heard nothing from broker `node_id` within
        the maximum election timeout. Every broker sends every other a node heartbeat
        each Raft heartbeat interval (raft/transport.py), so silence that long means a
        network cut, a paused or a dead broker: a request sent there now would wait out
        its whole timeout. False when not known (no Raft node yet; a broker never heard
        from since this one started)."""
        node = self.raft_node
        heard = None if node is None else node.network.last_heard.get(node_id)
        if node is None or heard is None:
            return False
        return time.monotonic() - heard >= node.config.election_timeout_max_s

    async def unless_out_of_reach(
        self, node_id: str, call: Awaitable[T], lost: Callable[[], errors.DmqError]
    ) -> T:
        """Await a call to broker `node_id`, but raise `lost()` once that broker goes out
        of reach meanwhile (`out_of_reach`, checked every REACH_CHECK_S) instead of
        waiting out the call's own timeout; the call is cancelled then."""
        task = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=REACH_CHECK_S)
                if done:
                    return task.result()
                if self.out_of_reach(node_id):
                    raise lost()
        finally:
            if not task.done():
                task.cancel()

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

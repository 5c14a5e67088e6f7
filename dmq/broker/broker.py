"""The Broker: starts, stops and composes the services that http_api calls.

Every request is one call on one service (dmq/README.md, "dmq/broker/"):

- `topics` (topics.py): topic admin and the topic list;
- `produce` (produce.py): partition choice, record checks, append or forward, acks;
- `fetch` (fetch.py): records, offsets, offset lookups, the catch-up copy;
- `groups` (groups.py): consumer groups; `share` (share.py): share groups (queues);
  `transactions` (transactions.py): the transaction coordinator's driver and calls;
  `operations` (operations.py): reassignments,
  decommissions, metadata voters, balance;
- `cluster` (cluster.py): the cluster view and status, heartbeats, leader reports;
- `storage` (storage.py): the data directory's free-space level, hand-offs while full;
- `routing` (routing.py) and `reconciler` (reconcile.py) serve the others: who leads
  what and where it listens; this broker's replicas made to match the catalogue;
- `identity` (identity.py): the cluster id, checked before the data directory is
  touched and adopted once registered; `strays` (strays.py): data set aside;
- `metrics` (metrics.py): `GET /metrics`, this broker's Prometheus registry;
- `rest_v2` (rest_v2.py): Confluent REST Proxy v2 consumer instances on groups;
- `security` (security.py): with --auth on, credentials, ACL checks and quotas.

The Broker owns what lives as long as the process: the data-directory lock, the cluster
id, the Raft node (raft/node.py: every group of this broker on one address and one
thread), the metadata service (dmq/metadata/service.py, group 0 on the voters) and the
background duties. The services share a `BrokerContext` (context.py) and never import
this module. A single-node broker is a one-node cluster on the same path.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from dmq import errors, planted
from dmq.broker.cluster import ClusterService
from dmq.broker.context import BrokerContext, T
from dmq.broker.delay import DelayService
from dmq.broker.features import FeaturesService
from dmq.broker.fetch import FetchService
from dmq.broker.groups import GroupsService
from dmq.broker.identity import IdentityService
from dmq.broker.metrics import MetricsService
from dmq.broker.operations import OperationsService
from dmq.broker.produce import ProduceService
from dmq.broker.reconcile import Reconciler
from dmq.broker.rest_v2 import RestConsumers
from dmq.broker.routing import Routing
from dmq.broker.security import SecurityService
from dmq.broker.share import ShareService
from dmq.broker.storage import StorageService
from dmq.broker.strays import StrayData
from dmq.broker.tiered import TieredCollector, TieredService
from dmq.broker.topics import TopicsService
from dmq.broker.transactions import TransactionsService
from dmq.broker.types import ForwardRequest
from dmq.config import BrokerConfig
from dmq.listeners import bind_error
from dmq.metadata.machine import RegisterBroker
from dmq.metadata.service import METADATA_LEFT_MARKER, MetadataService, wall_ms
from dmq.peers import PeerClient
from dmq.tls import BrokerTls, broker_tls, reload_into
from raft.config import RaftConfig
from raft.node import RaftNode

_log = logging.getLogger("dmq.broker")

JOIN_RETRY_S = 0.2  # between attempts to register while the metadata group has no leader
WATCHDOG_INTERVAL_S = 0.5  # how soon a Raft node stopped by an error stops the broker
DURABLE_TRACE_ENV = "DMQ_DURABLE_TRACE"  # test hook of the power-loss tests


def raft_config_for(config: BrokerConfig) -> RaftConfig:
    """The Raft settings of every group on this broker, from the broker's config."""
    # One Raft command carries one produce batch plus a small header: the largest batch
    # must fit in a Raft entry, and an entry in one append_entries message.
    entry_bytes_max = max(1024 * 1024, config.batch_bytes_max + 4096)
    return RaftConfig(
        heartbeat_interval_s=config.raft_heartbeat_interval_ms / 1000,
        election_timeout_min_s=config.raft_election_timeout_min_ms / 1000,
        election_timeout_max_s=config.raft_election_timeout_max_ms / 1000,
        # Check-quorum within an election timeout (raft/prevote.py): a leader cut off from
        # its majority steps down about when the majority, granting pre-votes, elects another.
        leader_step_down_s=config.raft_election_timeout_max_ms / 1000,
        durability="none"
        if config.raft_durability == "none" or planted.active("no-fsync")
        else "fsync",
        log_compaction_min_entries=config.raft_snapshot_entries,
        log_compaction_bytes=config.raft_snapshot_bytes,
        batch_bytes_max=entry_bytes_max,
        append_entries_bytes_max=entry_bytes_max + 128 * 1024,
    )


class Broker:
    """One broker process: its lifecycle and its services (module docstring)."""

    def __init__(self, config: BrokerConfig) -> None:
        self._ctx = ctx = BrokerContext(config)
        self._lock_fd = -1
        self._background: list[asyncio.Task[None]] = []
        # Composed in dependency order: each service gets the context and the services
        # it calls, never the Broker (dmq/README.md, "dmq/broker/").
        self.routing = Routing(ctx)
        ctx.peers.receiver_of = self.routing.node_at  # signed calls name their receiver
        self.identity = IdentityService(ctx)
        self.strays = StrayData(ctx.data_dir)
        self.operations = OperationsService(ctx)  # reassign, decommission, balance
        self.reconciler = Reconciler(ctx, self.routing, self.operations, self.strays)
        self.topics = TopicsService(ctx, self.routing, self.reconciler)
        self.produce = ProduceService(ctx, self.routing, self.topics)
        # Tiered storage (tiered.py): None unless --remote-storage names an object store.
        self.tiered = TieredService.open(ctx) if config.remote_storage else None
        self.fetch = FetchService(ctx, self.routing, self.tiered)
        self.storage = StorageService(ctx, lambda: self.produce.acks0_refused)
        self.cluster = ClusterService(ctx, self.storage.report)
        self.features = FeaturesService(ctx)  # feature levels, finalize (features.py)
        ctx.peers.finalized_level = self.features.finalized_level  # bound signatures
        self.delay = DelayService(ctx, self.routing, self.topics, self.produce)
        self.transactions = TransactionsService(ctx, self.produce)  # transactions.py
        self.groups = GroupsService(
            lambda: ctx.metadata,
            self.routing.http_addr_of,
            self.routing.voter_http_addrs,
            ForwardRequest,
            rebalance_timeout_ms=config.group_rebalance_timeout_ms,
            offsets_retention_ms=config.group_offsets_retention_ms,
            transactional_id_expiration_ms=config.transactional_id_expiration_ms,
        )
        self.share = ShareService(
            ctx, self.fetch, self.produce, self.topics, self.groups.is_leader,
            lambda *access: self.security.allows_stored(*access),
        )  # fmt: skip
        self.rest_v2 = RestConsumers(  # Confluent REST v2 consumer instances (rest_v2.py)
            self.groups, self.fetch, instance_timeout_ms=config.rest_v2_instance_timeout_ms,
            instances_max=config.rest_v2_instances_max, fetch_records_max=config.fetch_records_max,
        )  # fmt: skip
        # GET /metrics: this broker's own registry, read at scrape time (metrics.py).
        self.metrics = MetricsService(ctx, self.fetch, self.storage)
        self.security = SecurityService(ctx)  # --auth on: users, ACLs, quotas (security.py)
        if self.tiered is not None:
            self.metrics.registry.register(TieredCollector(self.tiered))

    # ------------------------------------------------------------------ what others read

    @property
    def config(self) -> BrokerConfig:
        return self._ctx.config

    @property
    def data_dir(self) -> Path:
        return self._ctx.data_dir

    @property
    def timeout_s(self) -> float:
        return self._ctx.timeout_s

    @property
    def peers(self) -> PeerClient:
        return self._ctx.peers

    @property
    def cluster_secret(self) -> bytes | None:
        return self._ctx.cluster_secret

    async def unless_out_of_reach(
        self, node_id: str, call: Awaitable[T], lost: Callable[[], errors.DmqError]
    ) -> T:
        """A call to another broker, given up once it goes out of reach (context.py)."""
        return await self._ctx.unless_out_of_reach(node_id, call, lost)

    @property
    def tls(self) -> BrokerTls | None:
        """dmq/tls.py's contexts; None with TLS off."""
        return self._ctx.tls

    async def reload_tls(self) -> None:
        """Read the TLS files again (dmq/tls.py `reload_into`): the HTTP contexts here, the
        Raft ones on the tick thread that uses them. Raises InvalidConfig, nothing changed,
        when a file cannot be read or does not match, or TLS is off."""
        tls, config = self._ctx.tls, self.config
        if tls is None:
            raise errors.InvalidConfig("TLS is off: no tls_cert to reload", field="tls_cert")
        broker_tls(config)  # fresh contexts from the files: raises before anything changes
        reload_into((tls.http_server, tls.http_client), config)
        node = self._ctx.raft_node
        raft_contexts = (tls.raft.server, tls.raft.client)
        if node is None:
            reload_into(raft_contexts, config)
        else:
            await node.on_tick_thread(lambda: reload_into(raft_contexts, config))

    @property
    def metadata(self) -> MetadataService:
        return self._ctx.metadata

    @property
    def raft_node(self) -> RaftNode | None:
        return self._ctx.raft_node

    @property
    def cluster_id(self) -> str:
        return self._ctx.cluster_id

    @property
    def ready(self) -> bool:
        return self._ctx.ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self._ctx.ready = value

    @property
    def failed(self) -> asyncio.Event:
        return self._ctx.failed

    @property
    def failure(self) -> BaseException | None:
        return self._ctx.failure

    def fail(self, error: BaseException) -> None:
        self._ctx.fail(error)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the Raft node, join the metadata group, open the replicas placed here.

        Waits (retrying) until this broker's registration commits: that needs a majority
        of the metadata voters up. The HTTP server is already listening meanwhile
        (`/readyz` answers 503), so the other brokers can reach this one's internal routes.
        """
        ctx = self._ctx
        self.identity.check_data_dir()  # before anything in the directory changes
        ctx.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        (ctx.data_dir / "meta").mkdir(exist_ok=True)  # markers of the metadata service
        await self._open_raft_node()
        ctx.metadata_service = MetadataService(
            ctx.config.node_id,
            ctx.config.voters,
            self._raft_node(),
            ctx.peers,
            self.routing.metadata_contact_addrs,
            timeout_s=ctx.timeout_s,
            on_change=self.reconciler.wanted.set,
            left_marker=ctx.data_dir / "meta" / METADATA_LEFT_MARKER,
            own_cluster_id=lambda: ctx.cluster_id,  # the data directory's, then adopted
        )
        await ctx.metadata_service.start()
        await self._register()
        self.features.check_runs_at_finalized()  # a rollback past a later finalize
        await self.identity.adopt()
        self.reconciler.remove_orphans()
        await self.reconciler.reconcile()
        if ctx.failure is not None:
            raise errors.StorageError(f"a replica cannot open: {ctx.failure}")
        await ctx.replicas.wait_for_leaders(None)
        self._start_duties()
        ctx.ready = True
        topics, replicas, brokers = (
            len(ctx.metadata.state.topics), len(ctx.replicas), len(ctx.metadata.state.brokers)
        )  # fmt: skip
        _log.info(
            "broker %s ready: %d topic%s, %d replica%s here, %d broker%s, in %s",
            ctx.config.node_id,
            topics, "" if topics == 1 else "s",
            replicas, "" if replicas == 1 else "s",
            brokers, "" if brokers == 1 else "s",
            ctx.data_dir,
        )  # fmt: skip

    async def _open_raft_node(self) -> None:
        ctx = self._ctx
        try:
            raft_config = raft_config_for(ctx.config)
            raft_config.check()
        except Exception as exc:  # RaftConfigError: limits that contradict each other
            raise errors.InvalidConfig(f"raft settings: {exc}", field="raft") from exc
        await ctx.peers.start()
        ctx.raft_node = RaftNode(
            ctx.config.node_id,
            ctx.config.peer_addrs,
            ctx.data_dir / "raft",
            raft_config,
            durable_trace=os.environ.get(DURABLE_TRACE_ENV) == "1",
            cluster_secret=ctx.cluster_secret,  # raft/auth.py's handshake
            cluster_id=ctx.cluster_id.encode(),  # and the cluster it names
            tls=None if ctx.tls is None else ctx.tls.raft,  # raft/tls.py; None: plain TCP
        )
        # A broker that cannot run at the finalized feature level is no Raft peer.
        ctx.raft_node.network.refusals.rule = self.features.peer_refusal
        try:
            await ctx.raft_node.start()
        except OSError as exc:
            named = bind_error("Raft", ctx.config.raft_addr, "--raft-addr", exc)
            if named is None:
                raise
            raise named from exc

    def _raft_node(self) -> RaftNode:
        node = self._ctx.raft_node
        assert node is not None, "the Raft node opens first in start()"
        return node

    def _start_duties(self) -> None:
        """The background duties, each on its own period, until `stop` cancels them."""
        interval_s = self.config.retention_check_interval_ms / 1000
        duties: list[Callable[[], Coroutine[Any, Any, None]]] = [
            self._watchdog,
            lambda: self._ctx.replicas.housekeeping(interval_s),
            self.reconciler.loop,
            self.cluster.heartbeat_loop,
            self.cluster.leader_report_loop,
            self.cluster.leader_balance_loop,
            self.cluster.version_probe_loop,
            self.groups.expiry_loop,
            self.operations.run,
            self.share.run,
            self.storage.storage_loop,
            self.delay.release_loop,
            self.transactions.loop,
        ]
        if self.tiered is not None:
            duties.append(self.tiered.upload_loop)
        loop = asyncio.get_running_loop()
        for duty in duties:
            self._background.append(loop.create_task(duty()))

    async def _register(self) -> None:
        """Retry until the registration commits. A first `--join` (a data directory of no
        cluster yet) gives up after join_timeout_ms, naming where it asked: nothing there
        is worth waiting for, unlike a restart, which waits for its cluster to come back."""
        c = self.config
        loop = asyncio.get_running_loop()
        first_join = bool(c.join) and not self._ctx.cluster_id
        give_up_at = loop.time() + c.join_timeout_ms / 1000 if first_join else None
        attempts = 0
        while True:
            await self.operations.add_known_peers()
            self.identity.check_catalogue()  # never register in another cluster's
            register = RegisterBroker(c.node_id, c.http_addr, c.raft_addr, wall_ms())
            # One attempt may retry for request_timeout_ms: bounded by what is left.
            left_s = None if give_up_at is None else max(0.0, give_up_at - loop.time())
            try:
                await asyncio.wait_for(self.metadata.propose(register), left_s)
                return
            except (errors.RetriableError, TimeoutError) as exc:
                if give_up_at is not None and loop.time() >= give_up_at:
                    asked = ", ".join(self.routing.metadata_contact_addrs()) or "no broker"
                    raise errors.RequestTimeout(
                        f"--join: not registered in the cluster within join_timeout_ms "
                        f"({c.join_timeout_ms} ms): {str(exc) or 'no answer'}; asked the metadata "
                        f"voters at {asked}: check that they run and that this broker "
                        f"reaches them"
                    ) from exc
                attempts += 1
                if attempts % 25 == 1:
                    _log.info("waiting for the metadata group to register: %s", exc)
                await asyncio.sleep(JOIN_RETRY_S)

    async def stop(self) -> None:
        """Stop the duties, the Raft node (every group), then close every replica's files."""
        ctx = self._ctx
        ctx.ready = False
        for task in self._background:
            task.cancel()
        results = await asyncio.gather(*self._background, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                _log.error("background task had failed: %r", result)
        if ctx.metadata_service is not None:
            await ctx.metadata_service.stop()
        try:
            if ctx.raft_node is not None:
                await ctx.raft_node.stop()
            await ctx.replicas.close()
        finally:
            ctx.replicas.shutdown_threads()
            await ctx.peers.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    async def _watchdog(self) -> None:
        """A Raft node stopped by an error stops the broker (its groups are gone)."""
        node = self._raft_node()
        while True:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            if node.failed is not None:
                self.fail(node.failed)
                return

    def _lock_data_dir(self) -> None:
        path = self.data_dir / ".lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise errors.BrokerUnavailable(
                f"data directory {self.data_dir} is locked by another dmq process"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

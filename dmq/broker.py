"""The Broker facade: the one object the HTTP API talks to.

Every request is one call here: produce, fetch, list offsets, topic admin and cluster
status. The Broker chooses partitions, enforces the limits, translates storage and Raft
errors into dmq.errors, and owns this node's replicas.

The cluster (issue 4) underneath:

- a RaftNode (raft/node.py) hosts every Raft group of this broker on one address and
  one thread: the metadata group (`dmq/metadata.py`, on the voters) and one group per
  partition replica placed here (`dmq/replica.py`);
- the topic catalogue is the metadata group's state; admin requests are commands
  proposed to it, and this broker opens, reconfigures and deletes its replicas to match
  (`_reconcile`, after each change of `metadata_version`);
- any broker accepts any request. A produce to a partition with a replica here is
  proposed to its group (a follower's proposal reaches the leader through pysyncobj);
  otherwise it is forwarded to a broker that hosts one. Fetches and offset lookups are
  answered by the partition leader: another broker raises `ForwardRequest` and the HTTP
  layer relays the request (once: a relayed request is never relayed again);
- a single-node broker is a one-node cluster on the same path.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import logging
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dmq import errors, limits, planted
from dmq.config import BrokerConfig
from dmq.groups_service import GroupsService
from dmq.internal_auth import read_secret_file
from dmq.metadata import METADATA_LEFT_MARKER, MetadataService, wall_ms
from dmq.operations import OperationsService
from dmq.partitioner import StickyPartitioner, partition_for_key
from dmq.peers import PeerClient, fetch_batches_blocking
from dmq.replica import (
    GROUPS_PER_TOPIC,
    TOPIC_ID_FILE,
    PartitionReplica,
    StorageThreads,
    raft_status_fields,
)
from dmq.topics import (
    check_topic_name,
    default_topic_config,
    log_config_for,
    validate_topic_config,
)
from log import errors as log_errors
from log import limits as log_limits
from log.partition_log import ReadResult
from log.records import Header, Record, RecordLimits, encode_batch, validate_batch
from log.segment import write_durably
from raft import quiesce
from raft.config import RaftConfig
from raft.metadata import (
    PARTITION_ACTIVE,
    PARTITION_GONE,
    AddPartitions,
    AlterTopicConfig,
    BrokerHeartbeat,
    CreateTopic,
    DeleteTopic,
    InitProducer,
    MetadataState,
    RegisterBroker,
    ReportLeader,
    TopicInfo,
    config_items,
)
from raft.node import RaftNode, Replica
from raft.producers import OutOfOrderSequenceError, ProducerFencedError
from raft.reassignment import hosts_replica

_log = logging.getLogger("dmq.broker")

Acks = Literal["0", "1", "all"]
STORAGE_THREADS = 4  # bounded: partitions are spread over these, see dmq/replica.py
# Background duties, each on its own period.
HEARTBEAT_INTERVAL_S = 2.5  # a quarter of the metadata's broker_session_ms (10 s)
LEADER_REPORT_INTERVAL_S = 1.0  # partition leaders published to the catalogue
LEADER_BALANCE_INTERVAL_S = 5.0  # raft maybe_balance_leaders on every broker
JOIN_RETRY_S = 0.2  # between attempts to register while the metadata group has no leader
# A group position past a partition's log end (a lagging new leader) answers no records
# after at most this long, so a long-polling member looks again soon.
GROUP_AHEAD_OF_LOG_WAIT_MS = 500
REPLICA_OPENS_CONCURRENT_MAX = 16  # replicas opened at once (start-up, large topics)
STATUS_TIMEOUT_S = 2.0  # per broker, for cluster status
LEADER_WAIT_S = 5.0  # create_topic waits at most this long for the new groups' leaders
DURABLE_TRACE_ENV = "DMQ_DURABLE_TRACE"  # test hook of the power-loss tests


class ForwardRequest(Exception):  # noqa: N818 - a control signal, not an error
    """Not a DmqError: tells the HTTP layer to relay this request to `http_addr`.

    `hops` is the forwarded header's value on the relayed request (consumer-group requests
    may take two: observer -> voter -> metadata leader; everything else takes one)."""

    def __init__(self, http_addr: str, hops: int = 1) -> None:
        super().__init__(http_addr)
        self.http_addr = http_addr
        self.hops = hops


@dataclass(frozen=True, slots=True)
class ProducerSequence:
    """An idempotent producer's fields for one batch (raft/producers.py checks them)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int


@dataclass(frozen=True, slots=True)
class ProduceRecord:
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    partition: int | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class OffsetRun:
    """`count` consecutive records of a produce request, in request order, that went to
    `partition` at offsets base_offset, base_offset + 1, ... (None for acks=0 and 1).

    A produce answers one entry per record; runs keep that answer compact (a
    1000-record batch is one run) until the HTTP layer writes it out.
    """

    partition: int
    base_offset: int | None
    count: int


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """Offsets are this broker's replica's; None when no replica is placed here."""

    partition: int
    leader: str | None
    replicas: tuple[str, ...]
    log_start_offset: int | None
    high_watermark: int | None
    log_end_offset: int | None
    status: str = PARTITION_ACTIVE  # or decommissioned (no new records), gone


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    replication_factor: int
    partitions: tuple[PartitionInfo, ...]
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicSummary:
    name: str
    partitions: int
    replication_factor: int


@dataclass(frozen=True, slots=True)
class TopicView:
    """A catalogue topic as the produce path reads it (built once per metadata version)."""

    name: str
    topic_id: int
    partitions: int
    replication_factor: int
    config: dict[str, Any]
    info: TopicInfo
    # Partitions taking new records (not decommissioned or gone), ascending: keyed and
    # sticky choices map onto these (raft/README.md, "Decommission a partition").
    active: tuple[int, ...] = ()


@dataclass(slots=True)
class FetchResult:
    """Records from `offset`: decoded (`records`) or raw batches (`raw`, to be closed)."""

    topic: str
    partition: int
    offset: int
    next_offset: int
    high_watermark: int
    log_start_offset: int
    records: list[Record] = field(default_factory=list)
    raw: ReadResult | None = None


@dataclass(frozen=True, slots=True)
class OffsetsResult:
    partition: int
    log_start_offset: int
    high_watermark: int
    offset: int | None


def translate(exc: log_errors.LogError) -> errors.DmqError:
    """Storage errors at the Broker's border: log/ types never reach the user."""
    if isinstance(exc, ProducerFencedError):
        return errors.ProducerFenced(str(exc), field=exc.field)
    if isinstance(exc, OutOfOrderSequenceError):
        return errors.OutOfOrderSequence(str(exc), field=exc.field)
    if isinstance(exc, log_errors.RecordTooLargeError):
        return errors.RecordTooLarge(str(exc), field=exc.field, limit=exc.limit)
    if isinstance(exc, log_errors.InvalidRecordError):
        return errors.InvalidRequest(str(exc), field=exc.field, limit=exc.limit)
    if isinstance(exc, log_errors.OffsetOutOfRangeError):
        return errors.OffsetOutOfRange(
            str(exc),
            offset=exc.offset,
            log_start_offset=exc.log_start_offset,
            log_end_offset=exc.log_end_offset,
        )
    return errors.StorageError(str(exc))


def raft_config_for(config: BrokerConfig) -> RaftConfig:
    """The Raft settings of every group on this broker, from the broker's config."""
    # One Raft command carries one produce batch plus a small header: the largest batch
    # must fit in a Raft entry, and an entry in one append_entries message.
    entry_bytes_max = max(1024 * 1024, config.batch_bytes_max + 4096)
    return RaftConfig(
        heartbeat_interval_s=config.raft_heartbeat_interval_ms / 1000,
        election_timeout_min_s=config.raft_election_timeout_min_ms / 1000,
        election_timeout_max_s=config.raft_election_timeout_max_ms / 1000,
        leader_step_down_s=max(1.5, 2 * config.raft_election_timeout_max_ms / 1000),
        durability="none"
        if config.raft_durability == "none" or planted.active("no-fsync")
        else "fsync",
        log_compaction_min_entries=config.raft_snapshot_entries,
        batch_bytes_max=entry_bytes_max,
        append_entries_bytes_max=entry_bytes_max + 128 * 1024,
    )


# How soon a replica kept because its group may still count it is checked again.
REPLICA_DELETE_RECHECK_S = 2.0


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.data_dir = config.data_path
        self.timeout_s = config.request_timeout_ms / 1000
        self._lock_fd = -1
        self._replicas: dict[tuple[str, int], PartitionReplica] = {}
        self._threads = StorageThreads(STORAGE_THREADS)
        self._sticky = StickyPartitioner()
        self._waiting_fetches = 0
        self._background: list[asyncio.Task[None]] = []
        self._fire_and_forget: set[asyncio.Task[Any]] = set()
        self._reconcile_lock = asyncio.Lock()
        self._reconcile_wanted = asyncio.Event()
        self._views: dict[str, TopicView] = {}
        # (topic id, partition) -> its directories found at start-up, of a partition that
        # exists but is not placed here: deleted once its leader says this is no member.
        self._unplaced_dirs: dict[tuple[int, int], list[Path]] = {}
        self._views_version = -1
        # dmq/internal_auth.py: signs this broker's internal calls, checks the others'.
        self.cluster_secret = read_secret_file(config.cluster_secret_file)
        self.peers = PeerClient(local_host=config.http_host, secret=self.cluster_secret)
        self.operations = OperationsService(self)  # reassign, decommission, balance
        self.raft_node: RaftNode | None = None
        self._metadata: MetadataService | None = None
        self.cluster_id = ""
        self.ready = False
        # Set when the broker must stop (its Raft node stopped on an error, a replica's
        # data broke an invariant): dmq serve exits non-zero rather than linger half-dead.
        self.failed = asyncio.Event()
        self.failure: BaseException | None = None
        self.groups = GroupsService(
            lambda: self.metadata,
            self._http_addr_of,
            self._voter_http_addrs,
            ForwardRequest,
            rebalance_timeout_ms=config.group_rebalance_timeout_ms,
            offsets_retention_ms=config.group_offsets_retention_ms,
            transactional_id_expiration_ms=config.transactional_id_expiration_ms,
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the Raft node, join the metadata group, open the replicas placed here.

        Waits (retrying) until this broker's registration commits: that needs a majority
        of the metadata voters up. The HTTP server is already listening meanwhile
        (`/readyz` answers 503), so the other brokers can reach this one's internal routes.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        self.cluster_id = self._load_cluster_id()
        try:
            raft_config = raft_config_for(self.config)
            raft_config.check()
        except Exception as exc:  # RaftConfigError: limits that contradict each other
            raise errors.InvalidConfig(f"raft settings: {exc}", field="raft") from exc
        await self.peers.start()
        self.raft_node = RaftNode(
            self.config.node_id,
            self.config.peer_addrs,
            self.data_dir / "raft",
            raft_config,
            durable_trace=os.environ.get(DURABLE_TRACE_ENV) == "1",
            cluster_secret=self.cluster_secret,  # raft/auth.py's handshake
        )
        await self.raft_node.start()
        self._metadata = MetadataService(
            self.config.node_id,
            self.config.voters,
            self.raft_node,
            self.peers,
            self._voter_http_addrs,
            timeout_s=self.timeout_s,
            on_change=self._reconcile_wanted.set,
            left_marker=self.data_dir / "meta" / METADATA_LEFT_MARKER,
        )
        await self._metadata.start()
        await self._register()
        self._remove_orphans()
        await self._reconcile()
        if self.failure is not None:
            raise errors.StorageError(f"a replica cannot open: {self.failure}")
        await self._wait_for_leaders(None)
        loop = asyncio.get_running_loop()
        for duty in (
            self._watchdog,
            self._housekeeping,
            self._reconcile_loop,
            self._heartbeat_loop,
            self._leader_report_loop,
            self._leader_balance_loop,
            self.groups.expiry_loop,
            self.operations.run,
        ):
            self._background.append(loop.create_task(duty()))
        self.ready = True
        _log.info(
            "broker %s ready: %d topics, %d replicas here, %d brokers, in %s",
            self.config.node_id,
            len(self.metadata.state.topics),
            len(self._replicas),
            len(self.metadata.state.brokers),
            self.data_dir,
        )

    async def _register(self) -> None:
        c = self.config
        attempts = 0
        while True:
            await self.operations.add_known_peers()
            try:
                await self.metadata.propose(
                    RegisterBroker(c.node_id, c.http_addr, c.raft_addr, wall_ms())
                )
                return
            except errors.RetriableError as exc:
                attempts += 1
                if attempts % 25 == 1:
                    _log.info("waiting for the metadata group to register: %s", exc)
                await asyncio.sleep(JOIN_RETRY_S)

    async def stop(self) -> None:
        """Stop the duties, the Raft node (every group), then close every replica's files."""
        self.ready = False
        for task in self._background:
            task.cancel()
        results = await asyncio.gather(*self._background, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                _log.error("background task had failed: %r", result)
        if self._metadata is not None:
            await self._metadata.stop()
        try:
            if self.raft_node is not None:
                await self.raft_node.stop()
            for replica in list(self._replicas.values()):
                try:
                    await replica.close(leave_group=False)
                except Exception:  # keep closing the others: each close flushes its log
                    _log.exception("closing %s failed", replica.name)
        finally:
            self._threads.shutdown()
            await self.peers.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

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

    def _load_cluster_id(self) -> str:
        path = self.data_dir / "meta" / "cluster_id"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or not path.read_text().strip():
            write_durably(path, (uuid.uuid4().hex + "\n").encode())
        return path.read_text().strip()

    # ------------------------------------------------------------------ metadata

    @property
    def metadata(self) -> MetadataService:
        if self._metadata is None:
            raise errors.BrokerUnavailable("the broker is starting", retry_after_ms=500)
        return self._metadata

    def _voter_http_addrs(self) -> list[str]:
        """The other voters' HTTP addresses: registered ones, else a guess for the first
        contact. The voters are the catalogue's (`MetadataState.voters`, recorded after
        each change of group 0), the configured `metadata_voters` only until the catalogue
        has any.

        An observer knows the voters' Raft addresses from `peers` but not their HTTP
        addresses until it has the catalogue: it first tries each voter's Raft host with
        this broker's own HTTP port (brokers usually share one port; see dmq/README.md).
        """
        state = self._metadata.state if self._metadata is not None else None
        voters = self._metadata.voters if self._metadata is not None else self.config.voters
        out = []
        for voter in voters:
            if voter == self.config.node_id:
                continue  # a broker asks the others (a promoting one is not served yet)
            info = state.brokers.get(voter) if state is not None else None
            if info is not None:
                out.append(info.http_addr)
            elif voter in self.config.peer_addrs:
                host = self.config.peer_addrs[voter].rpartition(":")[0]
                out.append(f"{host}:{self.config.http_port}")
        return out

    def _http_addr_of(self, node_id: str) -> str | None:
        info = self.metadata.state.brokers.get(node_id)
        return None if info is None else info.http_addr

    def _view(self, name: str) -> TopicView | None:
        state = self.metadata.state
        if state.metadata_version != self._views_version:
            self._views = {}
            self._views_version = state.metadata_version
        view = self._views.get(name)
        if view is None:
            info = state.topics.get(name)
            if info is None:
                return None
            view = TopicView(
                info.name,
                info.topic_id,
                len(info.partitions),
                info.replication_factor,
                dict(info.config),
                info,
                tuple(p for p, pl in enumerate(info.partitions) if pl.status == PARTITION_ACTIVE),
            )
            self._views[name] = view
        return view

    def _topic(self, name: str) -> TopicView:
        if not self.ready:
            raise errors.BrokerUnavailable("the broker is starting or stopping", retry_after_ms=500)
        view = self._view(name)
        if view is None:
            raise errors.TopicNotFound(f"topic {name!r} does not exist", field="topic")
        return view

    def partition_count(self, name: str) -> int | None:
        """The topic's partition count in this broker's catalogue (None: no such topic)."""
        view = self._view(name) if self._metadata is not None else None
        return None if view is None else view.partitions

    def local_replica(self, topic: str, partition: int, topic_id: int) -> PartitionReplica | None:
        """This broker's open replica of that partition, or None (cluster operations)."""
        return self._local_replica(topic, partition, topic_id)

    def _local_replica(self, topic: str, partition: int, topic_id: int) -> PartitionReplica | None:
        """This broker's open replica of the partition of that topic id (a re-created
        topic of the same name is another topic), or None."""
        replica = self._replicas.get((topic, partition))
        if replica is None or replica.topic_id != topic_id or replica.closed:
            return None
        return replica

    def _check_partition(self, topic: TopicView, partition: int) -> None:
        if not 0 <= partition < topic.partitions:
            raise errors.PartitionNotFound(
                f"topic {topic.name!r} has partitions 0..{topic.partitions - 1}, not {partition}",
                field="partition",
                limit=topic.partitions - 1,
            )
        if topic.info.partitions[partition].status == PARTITION_GONE:
            raise errors.PartitionGone(
                f"partition {partition} of {topic.name!r} was decommissioned and is gone "
                "(retention removed its records)",
                field="partition",
            )

    @staticmethod
    def _check_writable(topic: TopicView, partition: int, field: str) -> None:
        """Decommissioned (or gone) partitions take no new records."""
        status = topic.info.partitions[partition].status
        if status != PARTITION_ACTIVE:
            raise errors.PartitionDecommissioned(
                f"partition {partition} of {topic.name!r} is {status}: it takes no new "
                f"records (active partitions: {list(topic.active)})",
                field=field,
            )

    def _sticky_partition(self, topic: TopicView) -> int:
        """The sticky partition of the current batch, among the active ones."""
        return topic.active[self._sticky.partition(len(topic.active))]

    # ------------------------------------------------------------------ replicas

    def _partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / "partitions" / f"{topic}-{partition}"

    async def _reconcile_loop(self) -> None:
        while True:
            await self._reconcile_wanted.wait()
            self._reconcile_wanted.clear()
            try:
                await self._reconcile()
            except Exception:  # the next change (or retry) tries again
                _log.exception("reconciling replicas with the catalogue failed")
                await asyncio.sleep(1.0)
                self._reconcile_wanted.set()

    async def _reconcile(self) -> None:
        """Make this broker's replicas match the catalogue: open, reconfigure, delete."""
        async with self._reconcile_lock:
            await self.operations.add_known_peers()  # members that joined since the start
            state = self.metadata.state
            node_id = self.config.node_id
            wanted: dict[tuple[str, int], tuple[TopicInfo, tuple[str, ...]]] = {}
            for info in state.topics.values():
                for p, placement in enumerate(info.partitions):
                    if hosts_replica(placement, node_id):
                        # A replica a reassignment brings here opens before the leader adds
                        # it to the group (dmq/operations.py, step 1: else a group that
                        # needs its answer to commit the add could never commit it).
                        members = tuple(dict.fromkeys((*placement.replicas, node_id)))
                        wanted[(info.name, p)] = (info, members)
            for key, replica in list(self._replicas.items()):
                want = wanted.get(key)
                if want is None or want[0].topic_id != replica.topic_id:
                    if await self._still_a_member(
                        state, replica.topic, replica.topic_id, replica.partition
                    ):
                        continue
                    del self._replicas[key]
                    _log.info("deleting replica %s (topic id %d)", replica.name, replica.topic_id)
                    await replica.delete()
                else:
                    new_config = log_config_for(dict(want[0].config), self.config)
                    if new_config != replica.log_config:
                        replica.reconfigure(new_config)
            missing = [(key, want) for key, want in wanted.items() if key not in self._replicas]
            gate = asyncio.Semaphore(REPLICA_OPENS_CONCURRENT_MAX)

            async def open_one(info: TopicInfo, partition: int, members: tuple[str, ...]) -> None:
                async with gate:
                    try:
                        await self._open_replica(info, partition, members)
                    except log_errors.StorageError as exc:  # its data broke an invariant
                        _log.exception("replica %s-%d cannot open", info.name, partition)
                        self.fail(exc)
                    except Exception:
                        _log.exception("opening replica %s-%d failed", info.name, partition)
                        self._reconcile_wanted.set()

            await asyncio.gather(*(open_one(w[0], k[1], w[1]) for k, w in missing))
            if self._unplaced_dirs:
                await self._drop_unplaced_dirs(state)

    async def _still_a_member(
        self, state: MetadataState, topic: str, topic_id: int, partition: int
    ) -> bool:
        """A replica the catalogue no longer places here, of a partition that still exists,
        is deleted only once the partition leader's configuration leaves it out: a
        reassignment replaced while it moved here may have added it to the group without
        recording it (a stray member, which acknowledged entries: deleting its log then
        could lose them). The driver removes strays; until then, and while no leader
        answers, the replica stays (checked again in REPLICA_DELETE_RECHECK_S)."""
        info = state.topics.get(topic)
        if info is None or info.topic_id != topic_id or partition >= len(info.partitions):
            return False  # the topic was deleted: its group is gone everywhere
        if info.partitions[partition].status == PARTITION_GONE:
            return False
        try:  # bounded: reconciling (new replicas to open) waits for this answer
            progress = await asyncio.wait_for(
                self.operations.partition_progress(info, partition), REPLICA_DELETE_RECHECK_S
            )
            member = self.config.node_id in progress["members"]
        except (errors.DmqError, TimeoutError) as exc:
            _log.info("keeping replica %s-%d until its leader answers: %r", topic, partition, exc)
            member = True
        if member:
            asyncio.get_running_loop().call_later(
                REPLICA_DELETE_RECHECK_S, self._reconcile_wanted.set
            )
        return member

    async def _drop_unplaced_dirs(self, state: MetadataState) -> None:
        """The directories `_remove_orphans` left at start-up (a partition that exists but
        is not placed here): deleted once its leader says this broker is not a member,
        kept (and opened from them) if the catalogue places the partition here again."""
        by_id = {info.topic_id: info for info in state.topics.values()}
        for (topic_id, partition), paths in list(self._unplaced_dirs.items()):
            info = by_id.get(topic_id)
            placement = (
                info.partitions[partition]
                if info is not None and partition < len(info.partitions)
                else None
            )
            if placement is not None and hosts_replica(placement, self.config.node_id):
                del self._unplaced_dirs[(topic_id, partition)]  # reconcile opens them
                continue
            name = info.name if info is not None else ""
            if await self._still_a_member(state, name, topic_id, partition):
                continue
            del self._unplaced_dirs[(topic_id, partition)]
            for path in paths:
                _log.info("removing directory %s: not a member of its group", path)
                shutil.rmtree(path, ignore_errors=True)

    async def _open_replica(
        self, info: TopicInfo, partition: int, members: tuple[str, ...]
    ) -> PartitionReplica:
        assert self.raft_node is not None
        key = f"{info.name}-{partition}"
        c = self.config

        def fetch_missing(start_offset: int, end_offset: int) -> Any:
            return self._fetch_missing(info.name, partition, members, start_offset, end_offset)

        replica = PartitionReplica(
            info.name,
            info.topic_id,
            partition,
            self._partition_dir(info.name, partition),
            log_config_for(dict(info.config), c),
            self._threads.executor_for(key),
            self.raft_node,
            sorted(members),
            fetch_missing,
            queue_depth_max=c.produce_queue_depth_max,
            queue_bytes_max=c.produce_queue_bytes_max,
            timeout_s=self.timeout_s,
        )
        await replica.open()
        self._replicas[(info.name, partition)] = replica
        return replica

    def _fetch_missing(
        self, topic: str, partition: int, members: tuple[str, ...], start: int, end: int
    ) -> Any:
        """Tick thread (a snapshot's restore): batches [start, end) from another replica,
        the leader first. Blocking: this node's groups wait while it copies."""
        replica = self._replicas.get((topic, partition))
        leader = replica.raft.status().leader_id if replica and replica.raft else None
        # The placement now (a reassignment may have changed it since the replica opened).
        info = self.metadata.state.topics.get(topic)
        if info is not None and partition < len(info.partitions):
            members = tuple(dict.fromkeys((*info.partitions[partition].replicas, *members)))
        order = sorted(m for m in members if m != self.config.node_id)
        if leader in order:
            order.remove(leader)
            order.insert(0, leader)
        last: Exception = errors.BrokerUnavailable(
            f"no replica of {topic}-{partition} to copy from"
        )
        for node_id in order:
            addr = self._http_addr_of(node_id)
            if addr is None:
                continue
            try:
                # Materialised here: a failure halfway must not leave half a copy behind
                # the caller's back (restore then stops the node, see raft/README.md).
                return list(
                    fetch_batches_blocking(
                        addr, topic, partition, start, end, self.timeout_s, self.cluster_secret
                    )
                )
            except errors.DmqError as exc:
                last = exc
        raise last

    def _remove_orphans(self) -> None:
        """Directories of replicas no longer placed here, that a crash left behind.

        Only topic ids below the catalogue's next_topic_id are judged: a newer one may
        belong to a topic this broker has not heard of yet (its state lags). Those of a
        partition that still exists wait for its leader's word (`_drop_unplaced_dirs`).
        """
        state = self.metadata.state
        node_id = self.config.node_id
        placed = {
            (info.topic_id, p)
            for info in state.topics.values()
            for p, placement in enumerate(info.partitions)
            if hosts_replica(placement, node_id)
        }
        existing = {
            (info.topic_id, p)
            for info in state.topics.values()
            for p, placement in enumerate(info.partitions)
            if placement.status != PARTITION_GONE
        }

        def remove(key: tuple[int, int], path: Path, what: str) -> None:
            if key in existing:
                self._unplaced_dirs.setdefault(key, []).append(path)
                return
            _log.info("removing orphan %s directory %s", what, path)
            shutil.rmtree(path)

        root = self.data_dir / "partitions"
        for path in sorted(root.iterdir()) if root.exists() else []:
            try:
                topic_id = int((path / TOPIC_ID_FILE).read_text())
                partition = int(path.name.rpartition("-")[2])
            except (OSError, ValueError):
                continue  # not ours to judge
            if topic_id < state.next_topic_id and (topic_id, partition) not in placed:
                remove((topic_id, partition), path, "partition")
        groups = self.data_dir / "raft" / "groups"
        for path in sorted(groups.iterdir()) if groups.exists() else []:
            if not path.name.isdigit() or int(path.name) == 0:
                continue
            topic_id, partition = divmod(int(path.name), GROUPS_PER_TOPIC)
            if topic_id < state.next_topic_id and (topic_id, partition) not in placed:
                remove((topic_id, partition), path, "raft group")

    # ------------------------------------------------------------------ duties

    async def _housekeeping(self) -> None:
        """Retention and compaction every retention_check_interval_ms."""
        interval_s = self.config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            for replica in list(self._replicas.values()):
                try:
                    await replica.maybe_clean(wall_ms())
                except Exception:  # one partition's failure must not stop the others' upkeep
                    _log.exception("housekeeping failed on %s", replica.name)

    def fail(self, error: BaseException) -> None:
        if self.failure is None:
            _log.critical("broker %s must stop: %r", self.config.node_id, error)
            self.failure = error
        self.ready = False
        self.failed.set()

    async def _watchdog(self) -> None:
        """A Raft node stopped by an error stops the broker (its groups are gone)."""
        assert self.raft_node is not None
        while True:
            await asyncio.sleep(0.5)
            if self.raft_node.failed is not None:
                self.fail(self.raft_node.failed)
                return

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)
            try:
                await self.metadata.propose(BrokerHeartbeat(self.config.node_id, wall_ms()))
            except errors.DmqError as exc:
                _log.debug("heartbeat not committed: %s", exc)

    async def _leader_report_loop(self) -> None:
        """Publish the leaders of groups led here, so brokers without a replica can route."""
        while True:
            await asyncio.sleep(LEADER_REPORT_INTERVAL_S)
            reports = []
            state = self.metadata.state
            for (name, p), replica in list(self._replicas.items()):
                status = replica.raft.status() if replica.raft is not None else None
                info = state.topics.get(name)
                if status is None or not status.is_leader or info is None:
                    continue
                placement = info.partitions[p] if p < len(info.partitions) else None
                if placement is None or info.topic_id != replica.topic_id:
                    continue
                if (placement.leader, placement.leader_term) != (self.config.node_id, status.term):
                    reports.append(
                        ReportLeader(
                            name, info.topic_id, p, self.config.node_id, status.term, wall_ms()
                        )
                    )
            results = await asyncio.gather(
                *(self.metadata.propose(r) for r in reports), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, errors.DmqError):
                    _log.error("leader report failed: %r", result)

    async def _leader_balance_loop(self) -> None:
        assert self.raft_node is not None
        while True:
            await asyncio.sleep(LEADER_BALANCE_INTERVAL_S)
            try:
                await self.raft_node.maybe_balance_leaders()
            except Exception:
                _log.exception("leader balancing failed")

    # ------------------------------------------------------------------ topics

    async def metadata_barrier(self, consistency: str | None) -> None:
        """`consistency=linearizable`: include every change committed before the call."""
        self._topic_ready_check()
        if consistency not in (None, "local", "linearizable"):
            raise errors.InvalidRequest(
                "consistency must be local or linearizable", field="consistency"
            )
        if consistency == "linearizable":
            await self.metadata.read_barrier()

    async def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        replication_factor: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> TopicDescription:
        check_topic_name(name)
        self._topic_ready_check()
        count = self.config.default_partitions if partitions is None else partitions
        if not 1 <= count <= limits.PARTITIONS_PER_TOPIC_MAX:
            raise errors.InvalidRequest(
                f"partitions must be in [1, {limits.PARTITIONS_PER_TOPIC_MAX}], got {count}",
                field="partitions",
                limit=limits.PARTITIONS_PER_TOPIC_MAX,
            )
        brokers = len(self.config.peer_addrs)
        if replication_factor is None:  # the default is capped at the cluster's size
            rf = min(self.config.default_replication_factor, brokers)
        else:
            rf = replication_factor
        if not 1 <= rf <= brokers:
            raise errors.InvalidRequest(
                f"replication_factor {rf} needs {rf} brokers; this cluster has {brokers}",
                field="replication_factor",
                limit=brokers,
            )
        self._check_replicas(count * rf, "partitions")
        topic_config = default_topic_config(self.config)
        # Only an absent config means "defaults": `false` or `[]` is refused, not ignored.
        topic_config.update(validate_topic_config({} if config is None else config, self.config))
        await self.metadata.propose(
            CreateTopic(name, count, rf, config_items(topic_config), wall_ms())
        )
        await self._reconcile()
        await self._wait_for_leaders(name)
        _log.info("created topic %s with %d partitions, %d replicas each", name, count, rf)
        return self.describe_topic(name)

    def _check_replicas(self, added: int, field: str) -> None:
        """Refuse a change that would put more than replicas_per_broker_max partition
        replicas on a broker on average (placement spreads them evenly)."""
        brokers = len(self.config.peer_addrs)
        limit = self.config.replicas_per_broker_max
        existing = sum(
            len(t.partitions) * t.replication_factor for t in self.metadata.state.topics.values()
        )
        if -(-(existing + added) // brokers) > limit:
            raise errors.InvalidRequest(
                f"{existing} partition replicas exist on {brokers} brokers; {added} more would "
                f"exceed replicas_per_broker_max ({limit} per broker)",
                field=field,
                limit=limit,
            )

    def _topic_ready_check(self) -> None:
        if not self.ready:
            raise errors.BrokerUnavailable("the broker is starting or stopping", retry_after_ms=500)

    async def _wait_for_leaders(self, name: str | None) -> None:
        """Until every partition of `name` (None: every topic) hosted here knows its leader
        (bounded): a fetch right after a create or a start finds one instead of a 503."""
        deadline = asyncio.get_running_loop().time() + LEADER_WAIT_S
        while asyncio.get_running_loop().time() < deadline:
            leaderless = [
                r
                for (topic, _), r in self._replicas.items()
                if name in (None, topic) and (r.raft is None or r.raft.status().leader_id is None)
            ]
            if not leaderless:
                return
            await asyncio.sleep(0.02)

    def list_topics(self) -> list[TopicSummary]:
        self._topic_ready_check()
        return [
            TopicSummary(t.name, len(t.partitions), t.replication_factor)
            for t in sorted(self.metadata.state.topics.values(), key=lambda t: t.name)
        ]

    def describe_topic(self, name: str) -> TopicDescription:
        view = self._topic(name)
        parts = []
        for p, placement in enumerate(view.info.partitions):
            local = self._local_replica(name, p, view.topic_id)
            parts.append(
                PartitionInfo(
                    p,
                    self._leader_of(view, p),
                    placement.replicas,
                    local.log_start_offset if local else None,
                    local.high_watermark if local else None,
                    local.log_end_offset if local else None,
                    placement.status,
                )
            )
        return TopicDescription(view.name, view.replication_factor, tuple(parts), view.config)

    def _leader_of(self, view: TopicView, partition: int) -> str | None:
        """The partition's leader as known here: the local replica's Raft view, else the
        catalogue's last report."""
        replica = self._replicas.get((view.name, partition))
        if replica is not None and replica.raft is not None:
            leader = replica.raft.status().leader_id
            if leader is not None:
                return leader
        return view.info.partitions[partition].leader

    async def alter_topic_config(self, name: str, updates: dict[str, Any]) -> TopicDescription:
        checked = validate_topic_config(updates, self.config)
        self._topic(name)
        await self.metadata.propose(AlterTopicConfig(name, config_items(checked), (), wall_ms()))
        await self._reconcile()
        return self.describe_topic(name)

    async def add_partitions(self, name: str, count: int) -> TopicDescription:
        view = self._topic(name)
        if not view.partitions < count <= limits.PARTITIONS_PER_TOPIC_MAX:
            raise errors.InvalidRequest(
                f"count must be more than the current {view.partitions} and at most "
                f"{limits.PARTITIONS_PER_TOPIC_MAX}",
                field="count",
                limit=limits.PARTITIONS_PER_TOPIC_MAX,
            )
        self._check_replicas((count - view.partitions) * view.replication_factor, "count")
        await self.metadata.propose(AddPartitions(name, count, wall_ms()))
        await self._reconcile()
        await self._wait_for_leaders(name)
        return self.describe_topic(name)

    async def delete_topic(self, name: str) -> None:
        self._topic(name)
        await self.metadata.propose(DeleteTopic(name, wall_ms()))
        await self._reconcile()
        _log.info("deleted topic %s", name)

    async def _topic_for_produce(self, name: str) -> TopicView:
        self._topic_ready_check()
        view = self._view(name)
        if view is not None:
            return view
        if not self.config.auto_create_topics:
            raise errors.TopicNotFound(
                f"topic {name!r} does not exist and auto_create_topics is off", field="topic"
            )
        with contextlib.suppress(errors.TopicAlreadyExists):  # a concurrent produce made it
            await self.create_topic(name)
        return self._topic(name)

    # ------------------------------------------------------------------ produce

    def _record_limits(self, topic: TopicView) -> RecordLimits:
        return RecordLimits(
            record_bytes_max=topic.config["max_record_bytes"],
            batch_bytes_max=self.config.batch_bytes_max,
        )

    def _choose_partition(
        self, topic: TopicView, record: ProduceRecord, sticky: int, i: int
    ) -> int:
        if record.partition is not None:
            if not 0 <= record.partition < topic.partitions:
                raise errors.PartitionNotFound(
                    f"records[{i}].partition {record.partition} is not in "
                    f"0..{topic.partitions - 1}",
                    field=f"records[{i}].partition",
                    limit=topic.partitions - 1,
                )
            self._check_writable(topic, record.partition, f"records[{i}].partition")
            return record.partition
        if record.key is not None:
            # Over the active partitions only: with none decommissioned this is Kafka's
            # murmur2 % partitions; decommissioning one remaps keys (raft/README.md).
            return topic.active[partition_for_key(record.key, len(topic.active))]
        return sticky

    @staticmethod
    def _check_record(record: ProduceRecord, i: int, record_bytes_max: int) -> None:
        key_len = len(record.key) if record.key is not None else 0
        if key_len > log_limits.KEY_BYTES_MAX:
            raise errors.RecordTooLarge(
                f"records[{i}].key is {key_len} bytes; key_bytes_max is {log_limits.KEY_BYTES_MAX}",
                field=f"records[{i}].key",
                limit=log_limits.KEY_BYTES_MAX,
            )
        if len(record.headers) > log_limits.HEADER_COUNT_MAX:
            raise errors.RecordTooLarge(
                f"records[{i}] has {len(record.headers)} headers; header_count_max is "
                f"{log_limits.HEADER_COUNT_MAX}",
                field=f"records[{i}].headers",
                limit=log_limits.HEADER_COUNT_MAX,
            )
        size = key_len + (len(record.value) if record.value is not None else 0)
        for h in record.headers:
            hk = len(h.key.encode())
            if hk > log_limits.HEADER_KEY_BYTES_MAX:
                raise errors.RecordTooLarge(
                    f"records[{i}] header key is {hk} bytes; header_key_bytes_max is "
                    f"{log_limits.HEADER_KEY_BYTES_MAX}",
                    field=f"records[{i}].headers",
                    limit=log_limits.HEADER_KEY_BYTES_MAX,
                )
            size += hk + len(h.value)
        if size > record_bytes_max:
            raise errors.RecordTooLarge(
                f"records[{i}] is {size} bytes; max_record_bytes is {record_bytes_max}",
                field=f"records[{i}].value",
                limit=record_bytes_max,
            )

    async def produce(
        self,
        topic_name: str,
        records: Sequence[ProduceRecord],
        *,
        acks: Acks = "all",
        producer: ProducerSequence | None = None,
    ) -> list[OffsetRun]:
        """Append records (JSON/text paths): choose partitions, build one batch per
        partition, commit them, answer one offset per record in request order.

        With `producer` (an idempotent producer's batch) every record must go to one
        partition: the sequence numbers are per partition."""
        if not records:
            raise errors.InvalidRequest("records must hold at least one record", field="records")
        topic = await self._topic_for_produce(topic_name)
        limit = topic.config["max_record_bytes"]
        sticky = self._sticky_partition(topic)
        self._sticky.next_batch()
        now = wall_ms()
        by_partition: dict[int, list[tuple[int, Record]]] = {}
        for i, r in enumerate(records):
            self._check_record(r, i, limit)
            p = self._choose_partition(topic, r, sticky, i)
            ts = now if r.timestamp_ms is None else r.timestamp_ms
            by_partition.setdefault(p, []).append((i, Record(r.key, r.value, r.headers, ts)))
        if producer is not None and len(by_partition) != 1:
            raise errors.InvalidRequest(
                "an idempotent produce (producer_id) must put every record on one partition: "
                "give ?partition= or one key",
                field="producer_id",
            )
        batches: dict[int, bytes] = {}
        for p, items in by_partition.items():
            batch = (
                encode_batch([rec for _, rec in items])
                if producer is None
                else encode_batch(
                    [rec for _, rec in items],
                    producer_id=producer.producer_id,
                    producer_epoch=producer.producer_epoch,
                    base_sequence=producer.base_sequence,
                )
            )
            if len(batch) > self.config.batch_bytes_max:
                raise errors.RecordTooLarge(
                    f"the records for partition {p} make a {len(batch)}-byte batch; "
                    f"batch_bytes_max is {self.config.batch_bytes_max}",
                    field="records",
                    limit=self.config.batch_bytes_max,
                )
            batches[p] = batch
        base_offsets = await self._append_batches(topic, batches, acks)
        placed: list[tuple[int, int | None]] = [(0, None)] * len(records)
        for p, items in by_partition.items():
            base = base_offsets[p]
            for j, (i, _) in enumerate(items):
                placed[i] = (p, None if base is None else base + j)
        runs: list[OffsetRun] = []
        for p, offset in placed:
            last = runs[-1] if runs else None
            if (
                last is not None
                and last.partition == p
                and (offset is None) == (last.base_offset is None)
                and (offset is None or offset == last.base_offset + last.count)  # type: ignore[operator]
            ):
                runs[-1] = OffsetRun(p, last.base_offset, last.count + 1)
            else:
                runs.append(OffsetRun(p, offset, 1))
        return runs

    async def produce_batch(
        self, topic_name: str, batch: bytes, *, partition: int | None, acks: Acks = "all"
    ) -> list[OffsetRun]:
        """Append a ready RecordBatch from a client (the binary fast path), as is."""
        topic = await self._topic_for_produce(topic_name)
        try:
            header = validate_batch(batch, self._record_limits(topic))
        except log_errors.LogError as exc:
            raise translate(exc) from exc
        if partition is None:
            partition = self._sticky_partition(topic)
            self._sticky.next_batch()
        elif not 0 <= partition < topic.partitions:
            raise errors.PartitionNotFound(
                f"partition {partition} is not in 0..{topic.partitions - 1}",
                field="partition",
                limit=topic.partitions - 1,
            )
        self._check_writable(topic, partition, "partition")
        base = (await self._append_batches(topic, {partition: batch}, acks))[partition]
        return [OffsetRun(partition, base, header.record_count)]

    async def _append_batches(
        self, topic: TopicView, batches: dict[int, bytes], acks: Acks
    ) -> dict[int, int | None]:
        append_time = wall_ms() if topic.config["timestamp_type"] == "log_append" else None
        # Check every local partition can take its batch before queueing any: a refusal
        # after some were queued would commit part of a request the client retries.
        for p, b in batches.items():
            replica = self._replicas.get((topic.name, p))
            if replica is not None:
                replica.check_capacity(len(b))
        coroutines = {
            p: self._append_one(topic, p, b, append_time, acks) for p, b in batches.items()
        }
        if acks == "0":
            for coroutine in coroutines.values():
                task = asyncio.get_running_loop().create_task(coroutine)
                self._fire_and_forget.add(task)
                task.add_done_callback(self._fire_and_forget_done)
            return {p: None for p in coroutines}
        # Wait for all of them: each outcome is known before the request is answered.
        outcomes = await asyncio.gather(*coroutines.values(), return_exceptions=True)
        out: dict[int, int | None] = {}
        for p, outcome in zip(coroutines, outcomes, strict=True):
            if isinstance(outcome, log_errors.LogError):
                raise translate(outcome) from outcome
            if isinstance(outcome, BaseException):
                raise outcome
            out[p] = outcome
        return out

    def _fire_and_forget_done(self, task: asyncio.Task[Any]) -> None:
        self._fire_and_forget.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.warning("acks=0 append failed: %s", task.exception())

    async def _append_one(
        self, topic: TopicView, partition: int, batch: bytes, append_time: int | None, acks: Acks
    ) -> int | None:
        replica = self._local_replica(topic.name, partition, topic.topic_id)
        if replica is not None:
            return await replica.append(batch, append_time, acks)
        return await self._append_remote(topic, partition, batch, append_time, acks)

    async def _append_remote(
        self, topic: TopicView, partition: int, batch: bytes, append_time: int | None, acks: Acks
    ) -> int | None:
        """No replica here: hand the batch to a broker hosting one, the leader first,
        retrying across leader changes until the request's deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        delay = 0.02
        last: errors.DmqError = errors.NotLeader(
            f"no broker hosting {topic.name}-{partition} answered", retry_after_ms=200
        )
        while True:
            placement = topic.info.partitions[partition].replicas
            leader = self._leader_of(topic, partition)
            order = sorted(placement, key=lambda n: (n != leader, placement.index(n)))
            for node_id in order:
                addr = self._http_addr_of(node_id)
                remaining = deadline - loop.time()
                if addr is None or remaining <= 0:
                    continue
                try:
                    return await self.peers.append(
                        addr,
                        topic.name,
                        topic.topic_id,
                        partition,
                        batch,
                        acks=acks,
                        log_append_time_ms=append_time,
                        timeout_s=remaining,
                    )
                except (errors.NotLeader, errors.BrokerUnavailable) as exc:
                    last = exc  # this broker cannot take it now: try the next
            if loop.time() + delay >= deadline:
                raise last
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def append_forwarded(
        self,
        topic_name: str,
        topic_id: int,
        partition: int,
        batch: bytes,
        *,
        acks: Acks,
        log_append_time_ms: int | None,
    ) -> int | None:
        """Internal: a batch another broker validated, for a replica hosted here."""
        view = self._topic(topic_name)
        self._check_partition(view, partition)
        # Checked again here: a batch that reaches a Raft log must be one apply accepts.
        try:
            validate_batch(batch, self._record_limits(view))
        except log_errors.LogError as exc:
            raise translate(exc) from exc
        replica = self._local_replica(topic_name, partition, topic_id)
        if replica is None:
            raise errors.BrokerUnavailable(
                f"no replica of {topic_name}-{partition} (topic id {topic_id}) here",
                retry_after_ms=200,
            )
        return await replica.append(batch, log_append_time_ms, acks)

    # ------------------------------------------------------------------ fetch

    def _serving_replica(self, topic: str, partition: int, forwarded: bool) -> PartitionReplica:
        """The replica that answers a read here, or ForwardRequest to the leader's broker.

        Reads go to the partition leader (as Kafka's do), whose high watermark is the
        newest, and only while it heard from a majority lately (a deposed leader that has
        not noticed yet would answer stale reads). A relayed request that lands on a
        broker that does not lead (the catalogue's leader report lags) is not relayed
        again: it gets NotLeader and the client retries. Answering it from a follower's
        replica, as before, answered stale reads (both found by jepsen/).
        """
        view = self._topic(topic)
        self._check_partition(view, partition)
        replica = self._local_replica(topic, partition, view.topic_id)
        raft = None if replica is None else replica.raft
        status = None if raft is None else raft.status()
        if replica is not None and raft is not None and status is not None and status.is_leader:
            # A new leader serves reads once its election no-op is applied (before, its
            # high watermark may lag what the previous leader acknowledged: found by
            # jepsen/ at leadership transfers during replica moves).
            if status.leader_ready and _majority_heard_lately(raft):
                return replica
        elif replica is not None and planted.active("stale-read"):
            return replica
        leader = self._leader_of(view, partition)
        addr = None if leader is None else self._http_addr_of(leader)
        if forwarded or addr is None or leader == self.config.node_id:
            raise errors.NotLeader(
                f"partition {topic}-{partition} has no leader reachable from here yet",
                retry_after_ms=200,
            )
        raise ForwardRequest(addr)

    async def resolve_offset(
        self,
        topic: str,
        partition: int,
        *,
        offset: int | Literal["earliest", "latest"],
        timestamp_ms: int | None = None,
        forwarded: bool = False,
    ) -> int:
        replica = self._serving_replica(topic, partition, forwarded)
        if timestamp_ms is not None:
            found = await replica.offset_for_timestamp(timestamp_ms)
            return replica.high_watermark if found is None else found
        if offset == "earliest":
            return replica.log_start_offset
        if offset == "latest":
            return replica.high_watermark
        return offset

    async def fetch(
        self,
        topic: str,
        partition: int,
        *,
        offset: int,
        max_bytes: int,
        max_records: int,
        wait_ms: int,
        raw: bool,
        forwarded: bool = False,
    ) -> FetchResult:
        """Committed records from `offset` (long-polls up to wait_ms when there are none)."""
        replica = self._serving_replica(topic, partition, forwarded)
        if not replica.log_start_offset <= offset <= replica.log_end_offset:
            raise errors.OffsetOutOfRange(
                f"offset {offset} is outside [{replica.log_start_offset}, {replica.log_end_offset}]",
                offset=offset,
                log_start_offset=replica.log_start_offset,
                log_end_offset=replica.log_end_offset,
            )
        if planted.active("fetch-off-by-one") and 0 < offset < replica.high_watermark:
            offset += 1
        if offset >= replica.high_watermark and wait_ms > 0:
            if self._waiting_fetches >= self.config.waiting_fetches_max:
                raise errors.Backpressure(
                    f"{self._waiting_fetches} fetches are waiting (waiting_fetches_max)",
                    limit=self.config.waiting_fetches_max,
                )
            self._waiting_fetches += 1
            try:
                await replica.wait_for_commit_past(offset, wait_ms / 1000)
            finally:
                self._waiting_fetches -= 1
        if replica.closed:
            # Shutting down (or the topic was altered or deleted): answer the waiting
            # fetch as if its wait had run out, rather than failing it.
            return FetchResult(
                topic, partition, offset, offset, replica.high_watermark, replica.log_start_offset
            )
        try:
            if raw:
                result = await replica.read(offset, max_bytes)
                return FetchResult(
                    topic,
                    partition,
                    offset,
                    result.next_offset,
                    result.high_watermark,
                    result.log_start_offset,
                    raw=result,
                )
            recs, next_offset, hw, lso = await replica.read_records(offset, max_bytes, max_records)
        except log_errors.LogError as exc:
            raise translate(exc) from exc
        return FetchResult(topic, partition, offset, next_offset, hw, lso, records=recs)

    async def list_offsets(
        self, topic: str, partition: int, timestamp_ms: int | None, *, forwarded: bool = False
    ) -> OffsetsResult:
        replica = self._serving_replica(topic, partition, forwarded)
        found = None
        if timestamp_ms is not None:
            found = await replica.offset_for_timestamp(timestamp_ms)
        return OffsetsResult(partition, replica.log_start_offset, replica.high_watermark, found)

    async def read_batches(
        self, topic: str, partition: int, start_offset: int, end_offset: int
    ) -> tuple[bytes, int]:
        """Internal (a lagging replica's catch-up): this replica's committed batches from
        start_offset, up to end_offset or fetch_bytes_max; and the offset up to which it
        vouches for the range (past the last batch when only compaction gaps follow)."""
        view = self._topic(topic)
        self._check_partition(view, partition)
        replica = self._local_replica(topic, partition, view.topic_id)
        if replica is None:
            raise errors.BrokerUnavailable(f"no replica of {topic}-{partition} here")
        if not replica.log_start_offset <= start_offset <= replica.high_watermark:
            raise errors.OffsetOutOfRange(
                f"offset {start_offset} is outside [{replica.log_start_offset}, "
                f"{replica.high_watermark}] here",
                offset=start_offset,
                log_start_offset=replica.log_start_offset,
                log_end_offset=replica.log_end_offset,
            )
        try:
            return await replica.read_batches(start_offset, end_offset, self.config.fetch_bytes_max)
        except log_errors.LogError as exc:
            raise translate(exc) from exc

    # ------------------------------------------------------------------ consumer groups

    async def partition_read(
        self,
        topic: str,
        partition: int,
        offset: int,
        wait_ms: int,
        max_records: int,
        max_bytes: int = limits.FETCH_BYTES_DEFAULT,
    ) -> FetchResult:
        """For the group fetch (dmq/groups_service.py): records from `offset`, read here or
        at the partition leader's broker. A position below the log start (retention removed
        it) reads from the log start, as Kafka's auto.offset.reset=earliest. A position past
        the log end is never moved back: a new leader may still lag the committed offset,
        and serving from its end would deliver records again and let the next commit move
        the group backwards. It answers no records (after up to wait_ms) until the log
        reaches the position."""
        max_bytes = min(max_bytes, self.config.fetch_bytes_max)
        try:
            return await self._read_here_or_there(
                topic, partition, offset, wait_ms, max_records, max_bytes
            )
        except errors.OffsetOutOfRange as exc:
            start, end = exc.log_start_offset, exc.log_end_offset
            if offset > end:
                await asyncio.sleep(min(wait_ms, GROUP_AHEAD_OF_LOG_WAIT_MS) / 1000)
                return FetchResult(topic, partition, offset, offset, end, start)
            return await self._read_here_or_there(
                topic, partition, start, wait_ms, max_records, max_bytes
            )

    async def _read_here_or_there(
        self, topic: str, partition: int, offset: int, wait_ms: int, max_records: int,
        max_bytes: int,
    ) -> FetchResult:  # fmt: skip
        try:
            return await self.fetch(
                topic, partition, offset=offset, max_bytes=max_bytes,
                max_records=max_records, wait_ms=wait_ms, raw=False,
            )  # fmt: skip
        except ForwardRequest as fwd:
            params = {"offset": str(offset), "wait_ms": str(wait_ms), "value_encoding": "base64"}
            params |= {"max_records": str(max_records), "max_bytes": str(max_bytes)}
            doc = await self.peers.call(
                "GET", fwd.http_addr, f"/v1/topics/{topic}/partitions/{partition}/records",
                params=params, timeout_s=wait_ms / 1000 + self.timeout_s,
            )  # fmt: skip
            return fetch_result_from_json(topic, partition, offset, doc)

    async def partition_offsets(
        self, topic: str, partition: int, timestamp_ms: int | None = None
    ) -> OffsetsResult:
        """list_offsets answered here or at the partition leader's broker."""
        try:
            return await self.list_offsets(topic, partition, timestamp_ms)
        except ForwardRequest as fwd:
            params = {} if timestamp_ms is None else {"timestamp": str(timestamp_ms)}
            doc = await self.peers.call(
                "GET", fwd.http_addr, f"/v1/topics/{topic}/partitions/{partition}/offsets",
                params=params, timeout_s=self.timeout_s,
            )  # fmt: skip
            return OffsetsResult(
                partition, doc["log_start_offset"], doc["high_watermark"], doc["offset"]
            )

    # ------------------------------------------------------------------ cluster

    def cluster(self) -> dict[str, Any]:
        state = self.metadata.state
        live = set(state.live_brokers(max(state.clock_ms, wall_ms())))
        return {
            "cluster_id": self.cluster_id,
            "node_id": self.config.node_id,
            "metadata_voters": self.metadata.voters,
            "metadata_version": state.metadata_version,
            "brokers": [
                {
                    "node_id": b.broker_id,
                    "http_addr": b.http_addr,
                    "raft_addr": b.raft_addr,
                    "live": b.broker_id in live,
                }
                for b in sorted(state.brokers.values(), key=lambda b: b.broker_id)
            ],
        }

    def local_status(self) -> dict[str, Any]:
        """This broker's replicas as its Raft groups see them (for cluster status)."""
        replicas = [r.status() for r in list(self._replicas.values())]
        metadata = self._metadata.open_replica if self._metadata is not None else None
        if metadata is not None:
            fields = raft_status_fields(metadata)
            # Group 0's configuration as this member knows it (voter changes; a read of
            # pysyncobj's member list from this thread: a snapshot, for status only).
            replicas.append(
                {**fields, "group_id": 0, "topic": None, "partition": None,
                 "members": metadata.members}
            )  # fmt: skip
        return {"node_id": self.config.node_id, "ready": self.ready, "replicas": replicas}

    async def cluster_status(self) -> dict[str, Any]:
        """Every broker's view merged: brokers, and per group its leader, term, commit
        index and each replica's lag (leader's commit index - replica's last applied)."""
        doc = self.cluster()
        answers: dict[str, dict[str, Any]] = {self.config.node_id: self.local_status()}

        async def ask(node_id: str, addr: str) -> None:
            with contextlib.suppress(errors.DmqError):
                answers[node_id] = await self.peers.call(
                    "GET", addr, "/v1/internal/status", timeout_s=STATUS_TIMEOUT_S
                )

        await asyncio.gather(
            *(
                ask(b["node_id"], b["http_addr"])
                for b in doc["brokers"]
                if b["node_id"] != self.config.node_id
            )
        )
        for b in doc["brokers"]:
            b["reachable"] = b["node_id"] in answers
        doc["groups"] = merge_group_status(answers)
        return doc

    async def init_producer(self, transactional_id: str) -> tuple[int, int]:
        """A producer id and epoch from the metadata group (idempotent producers); the same
        transactional id gets its id back with the epoch + 1, fencing the old instance."""
        applied = await self.metadata.propose(InitProducer(transactional_id, wall_ms()))
        assert applied.producer is not None
        return applied.producer

    async def propose_metadata_forwarded(self, command: bytes) -> int:
        """Internal: an observer's metadata command; the metadata version it produced."""
        applied = await self.metadata.propose_encoded(command)
        return applied.metadata_version

    async def metadata_voters_view(self) -> dict[str, Any]:
        """Internal, on the metadata leader: group 0's members and the catalogue (a voter
        checking whether it is still one, dmq/metadata.py)."""
        return await self.metadata.leader_view()

    async def metadata_state_after(
        self, after_version: int, wait_ms: int, consistency: str | None
    ) -> dict[str, Any]:
        """Internal: the catalogue for an observer, once newer than `after_version`."""
        if consistency == "linearizable":
            await self.metadata.read_barrier()
        return await self.metadata.state_after(after_version, wait_ms)

    @property
    def waiting_fetches(self) -> int:
        return self._waiting_fetches


def fetch_result_from_json(
    topic: str, partition: int, offset: int, doc: dict[str, Any]
) -> FetchResult:
    """A base64 JSON fetch answer from another broker, as the local fetch returns it."""

    def raw(text: str | None) -> bytes | None:
        return None if text is None else base64.b64decode(text)

    records = [
        Record(
            raw(r["key"]),
            raw(r["value"]),
            tuple(Header(h["key"], base64.b64decode(h["value"])) for h in r["headers"]),
            r["timestamp"],
            r["offset"],
        )
        for r in doc["records"]
    ]
    return FetchResult(
        topic, partition, offset, doc["next_offset"], doc["high_watermark"],
        doc["log_start_offset"], records=records,
    )  # fmt: skip


def _majority_heard_lately(raft: Replica) -> bool:
    """A leader serves reads only while a majority of its group was heard from within half
    an election timeout, counted from no later than the end of the node's last Raft round:
    a leader cut off from the others (or paused, then resumed) keeps thinking it leads
    until a round processes the newer term, while the others have elected another and
    committed more, and would answer stale reads (found by jepsen/). Node-level
    liveness, not a per-group lease: it narrows that window, it does not prove it closed."""
    lease_s = raft.node.config.election_timeout_min_s / 2
    wake = quiesce.leader_wake_at(
        raft.node.network.last_heard, raft.followers, len(raft.members), lease_s
    )
    now = time.monotonic()
    return now < raft.node.round_done_at + lease_s and (wake is None or now < wake)


def merge_group_status(answers: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per group: the replicas' reports side by side, the leader of the highest term."""
    groups: dict[int, dict[str, Any]] = {}
    for node_id, answer in sorted(answers.items()):
        for r in answer.get("replicas", []):
            group = groups.setdefault(
                r["group_id"],
                {
                    "group_id": r["group_id"],
                    "topic": r["topic"],
                    "partition": r["partition"],
                    "leader": None,
                    "term": 0,
                    "commit_index": 0,
                    "replicas": [],
                },
            )
            replica = {k: r[k] for k in ("is_leader", "term", "commit_index", "last_applied")}
            replica["node_id"] = node_id
            for k in ("high_watermark", "log_end_offset"):
                if k in r:
                    replica[k] = r[k]
            group["replicas"].append(replica)
            if r["is_leader"] and r["term"] >= group["term"]:
                group.update(leader=node_id, term=r["term"], commit_index=r["commit_index"])
    for group in groups.values():
        for replica in group["replicas"]:
            replica["lag"] = (
                max(0, group["commit_index"] - replica["last_applied"])
                if group["leader"] is not None
                else None
            )
    return [groups[g] for g in sorted(groups)]

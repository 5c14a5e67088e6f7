"""This broker's replicas made to match the catalogue: open, reconfigure, delete.

After every change of the catalogue (`metadata_version`) the metadata service sets
`Reconciler.wanted`; `loop` then runs `reconcile`, one at a time:

1. add every registered broker as a Raft peer (members that joined since the start);
2. delete the replicas the catalogue no longer places here, once the partition's leader
   says this broker is no member (`_still_a_member`: a stray member may hold acknowledged
   entries), and apply config changes in place to the others;
3. open the replicas placed here and not open yet, REPLICA_OPENS_CONCURRENT_MAX at once
   (a replica whose data broke an invariant stops the broker);
4. drop the directories found at start-up of partitions not placed here
   (`remove_orphans`), on the same word of their leader.

A replica's directory is removed only when the catalogue no longer places it here and its
topic id is below the catalogue's `next_topic_id` (a lagging catalogue never deletes a
topic it has not heard of). Data the catalogue does not know at all (a directory another
cluster wrote, a topic id never handed out in this cluster, or one its catalogue gives to
a topic of another name) is stray: set aside by strays.py, never opened as a replica nor
deleted.

Which cluster wrote a partition directory: its `cluster_id` file (CLUSTER_ID_FILE, beside
`topic_id`), written when the replica opens. Topic ids alone cannot tell (every cluster
numbers its topics from 1: cluster A's `ledger` and cluster B's `ledger` are both id 1).
A directory without the file was written by a dmq from before it (this broker's own: the
data directory's `meta.properties` names this cluster once `IdentityService.adopt` ran),
so start-up writes this cluster's id into each one it keeps (`_stamp`); a directory copied from
such an older dmq of another cluster cannot be told apart (dmq/README.md says so).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dmq import errors
from dmq.broker.context import BrokerContext
from dmq.broker.operations import OperationsService
from dmq.broker.routing import Routing
from dmq.broker.strays import StrayData
from dmq.metadata.machine import PARTITION_GONE, MetadataState, TopicInfo
from dmq.metadata.reassignment import hosts_replica
from dmq.partition.replica import (
    CLUSTER_ID_FILE,
    GROUPS_PER_TOPIC,
    TOPIC_ID_FILE,
    PartitionReplica,
)
from dmq.peers import fetch_batches_blocking, fetch_delayed_blocking
from dmq.topics import log_config_for
from log import errors as log_errors

_log = logging.getLogger("dmq.broker")

REPLICA_OPENS_CONCURRENT_MAX = 16  # replicas opened at once (start-up, large topics)
# How soon a replica kept because its group may still count it is checked again.
REPLICA_DELETE_RECHECK_S = 2.0

# (topic, partition) -> the topic and the members its replica here opens with.
Wanted = dict[tuple[str, int], tuple[TopicInfo, tuple[str, ...]]]


class Reconciler:
    """Owns the opening and deletion of replicas; the ReplicaSet is its output."""

    def __init__(
        self,
        ctx: BrokerContext,
        routing: Routing,
        operations: OperationsService,
        strays: StrayData,
    ) -> None:
        self._ctx = ctx
        self._routing = routing
        self._operations = operations
        self._strays = strays
        self._lock = asyncio.Lock()
        self.wanted = asyncio.Event()  # set on each new catalogue (and to retry)
        # (topic id, partition) -> its directories found at start-up, of a partition that
        # exists but is not placed here: deleted once its leader says this is no member.
        self._unplaced_dirs: dict[tuple[int, int], list[Path]] = {}

    async def loop(self) -> None:
        while True:
            await self.wanted.wait()
            self.wanted.clear()
            try:
                await self.reconcile()
            except Exception:  # the next change (or retry) tries again
                _log.exception("reconciling replicas with the catalogue failed")
                await asyncio.sleep(1.0)
                self.wanted.set()

    async def reconcile(self) -> None:
        """Make this broker's replicas match the catalogue: open, reconfigure, delete."""
        async with self._lock:
            await self._operations.add_known_peers()  # members that joined since the start
            state = self._ctx.metadata.state
            wanted = self._wanted_here(state)
            replicas = self._ctx.replicas
            for key, replica in replicas.items():
                want = wanted.get(key)
                if want is None or want[0].topic_id != replica.topic_id:
                    if await self._still_a_member(
                        state, replica.topic, replica.topic_id, replica.partition
                    ):
                        continue
                    replicas.remove(key)
                    _log.info("deleting replica %s (topic id %d)", replica.name, replica.topic_id)
                    await replica.delete()
                else:
                    new_config = log_config_for(dict(want[0].config), self._ctx.config)
                    if new_config != replica.log_config:
                        replica.reconfigure(new_config)
                    replica.set_preferred_leader(want[1][0])  # a reassignment may change it
            missing = [(key, want) for key, want in wanted.items() if key not in replicas]
            await self._open_missing(missing)
            if self._unplaced_dirs:
                await self._drop_unplaced_dirs(state)

    def _wanted_here(self, state: MetadataState) -> Wanted:
        """The replicas the catalogue places here, with the members each opens with."""
        node_id = self._ctx.node_id
        wanted: Wanted = {}
        for info in state.topics.values():
            for p, placement in enumerate(info.partitions):
                if hosts_replica(placement, node_id):
                    # A replica a reassignment brings here opens before the leader adds
                    # it to the group (dmq/broker/operations.py, step 1: else a group that
                    # needs its answer to commit the add could never commit it).
                    members = tuple(dict.fromkeys((*placement.replicas, node_id)))
                    wanted[(info.name, p)] = (info, members)
        return wanted

    async def _open_missing(
        self, missing: list[tuple[tuple[str, int], tuple[TopicInfo, tuple[str, ...]]]]
    ) -> None:
        gate = asyncio.Semaphore(REPLICA_OPENS_CONCURRENT_MAX)

        async def open_one(info: TopicInfo, partition: int, members: tuple[str, ...]) -> None:
            async with gate:
                try:
                    await self._open_replica(info, partition, members)
                except log_errors.StorageError as exc:  # its data broke an invariant
                    _log.exception("replica %s-%d cannot open", info.name, partition)
                    self._ctx.fail(exc)
                except Exception:
                    _log.exception("opening replica %s-%d failed", info.name, partition)
                    self.wanted.set()

        await asyncio.gather(*(open_one(w[0], k[1], w[1]) for k, w in in_turns(missing)))

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
                self._operations.partition_progress(info, partition), REPLICA_DELETE_RECHECK_S
            )
            member = self._ctx.config.node_id in progress["members"]
        except (errors.DmqError, TimeoutError) as exc:
            _log.info("keeping replica %s-%d until its leader answers: %r", topic, partition, exc)
            member = True
        if member:
            asyncio.get_running_loop().call_later(REPLICA_DELETE_RECHECK_S, self.wanted.set)
        return member

    async def _drop_unplaced_dirs(self, state: MetadataState) -> None:
        """The directories `remove_orphans` left at start-up (a partition that exists but
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
            if placement is not None and hosts_replica(placement, self._ctx.config.node_id):
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
        assert self._ctx.raft_node is not None
        key = f"{info.name}-{partition}"
        c = self._ctx.config
        self._set_aside_if_foreign(info, partition)

        def fetch_missing(start_offset: int, end_offset: int) -> Any:
            return self._fetch_missing(info.name, partition, members, start_offset, end_offset)

        def fetch_delayed(position: tuple[int, int]) -> Iterator[Iterator[bytes]]:
            return self._fetch_delayed(info.name, partition, members, position)

        replica = PartitionReplica(
            info.name,
            info.topic_id,
            partition,
            self._partition_dir(info.name, partition),
            log_config_for(dict(info.config), c),
            self._ctx.replicas.executor_for(key),
            self._ctx.raft_node,
            sorted(members),
            fetch_missing,
            queue_depth_max=c.produce_queue_depth_max,
            queue_bytes_max=c.produce_queue_bytes_max,
            timeout_s=self._ctx.timeout_s,
            space=self._ctx.space,
            cluster_id=self._ctx.cluster_id,
            fetch_delayed=fetch_delayed,
            writeback=self._ctx.replicas.writeback,
            preferred_leader=members[0],  # the placement's preferred leader
        )
        await replica.open()
        self._ctx.replicas.add(replica)
        return replica

    def _partition_dir(self, topic: str, partition: int) -> Path:
        return self._ctx.data_dir / "partitions" / f"{topic}-{partition}"

    def _judge_cluster(self, path: Path) -> str | None:
        """Why the partition directory `path` is another cluster's (None if it is this
        one's). One without a `cluster_id` file (written before it existed, or by a first
        open that stopped before writing it) is this broker's (module docstring)."""
        ours = self._ctx.cluster_id
        if not ours:  # not adopted yet (never so once started): nothing to compare
            return None
        try:
            found = (path / CLUSTER_ID_FILE).read_text().strip()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            return f"its {CLUSTER_ID_FILE} file cannot be read ({exc}), this is cluster {ours}"
        if found and found != ours:
            return f"written by cluster {found}, this is cluster {ours}"
        return None

    def _stamp(self, path: Path) -> None:
        """This cluster's id into a directory kept at start-up that has none yet."""
        stamp = path / CLUSTER_ID_FILE
        if self._ctx.cluster_id and path.is_dir() and not stamp.exists():
            stamp.write_text(f"{self._ctx.cluster_id}\n")

    def _set_aside_if_foreign(self, info: TopicInfo, partition: int) -> None:
        """A directory under this replica's name that another cluster wrote, or that
        holds another topic id's data, is never opened as this replica: it is set aside
        first (strays.py)."""
        path = self._partition_dir(info.name, partition)
        try:
            found = int((path / TOPIC_ID_FILE).read_text())
        except (OSError, ValueError):
            return  # none yet, or a replica whose first open stopped before writing it
        foreign = self._judge_cluster(path)
        if foreign is not None:
            self._strays.set_aside(path, found, partition, foreign)
        elif found != info.topic_id:
            self._strays.set_aside(
                path,
                found,
                partition,
                f"holds topic id {found}, the catalogue's {info.name} is topic id {info.topic_id}",
            )

    def _fetch_missing(
        self, topic: str, partition: int, members: tuple[str, ...], start: int, end: int
    ) -> Any:
        """Tick thread (a snapshot's restore): batches [start, end) from another replica,
        the leader first. Blocking: this node's groups wait while it copies."""
        order = self._sources(topic, partition, members)
        last: Exception = errors.BrokerUnavailable(
            f"no replica of {topic}-{partition} to copy from"
        )
        for node_id in order:
            addr = self._routing.http_addr_of(node_id)
            if addr is None:
                continue
            try:
                # Materialised here: a failure halfway must not leave half a copy behind
                # the caller's back (restore then stops the node, see raft/README.md).
                return list(
                    fetch_batches_blocking(
                        addr,
                        topic,
                        partition,
                        start,
                        end,
                        self._ctx.timeout_s,
                        self._ctx.cluster_secret,
                        self._ctx.cluster_id,
                        self._ctx.peers.tls,
                    )
                )
            except errors.DmqError as exc:
                last = exc
        raise last

    def _sources(self, topic: str, partition: int, members: tuple[str, ...]) -> list[str]:
        """The other replicas to copy from, the leader first."""
        replica = self._ctx.replicas.get(topic, partition)
        leader = replica.raft.status().leader_id if replica and replica.raft else None
        # The placement now (a reassignment may have changed it since the replica opened).
        info = self._ctx.metadata.state.topics.get(topic)
        if info is not None and partition < len(info.partitions):
            members = tuple(dict.fromkeys((*info.partitions[partition].replicas, *members)))
        order = sorted(m for m in members if m != self._ctx.config.node_id)
        if leader in order:
            order.remove(leader)
            order.insert(0, leader)
        return order

    def _fetch_delayed(
        self, topic: str, partition: int, members: tuple[str, ...], position: tuple[int, int]
    ) -> Iterator[Iterator[bytes]]:
        """Tick thread (a snapshot's restore): the delay store as at `position` from each
        other replica in turn, the leader first, streamed (the machine keeps the first
        that arrives whole)."""
        for node_id in self._sources(topic, partition, members):
            addr = self._routing.http_addr_of(node_id)
            if addr is not None:
                _log.info(
                    "%s-%d: copying the delay store as at %s from %s", topic, partition,
                    position, node_id,
                )  # fmt: skip
                yield fetch_delayed_blocking(
                    addr, topic, partition, position, self._ctx.timeout_s,
                    self._ctx.cluster_secret, self._ctx.cluster_id, self._ctx.peers.tls,
                )  # fmt: skip

    def remove_orphans(self) -> None:
        """Directories of replicas no longer placed here, that a crash left behind; run once
        at start-up, after this broker's registration committed (its catalogue then holds
        every topic this cluster created before).

        Only topic ids below the catalogue's next_topic_id, of a topic deleted or moved
        away, are removed; those of a partition that still exists wait for its leader's
        word (`_drop_unplaced_dirs`). Stray data (module docstring) is set aside instead.
        """
        state = self._ctx.metadata.state
        node_id = self._ctx.config.node_id
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

        names = {info.topic_id: info.name for info in state.topics.values()}

        def remove(key: tuple[int, int], path: Path, what: str) -> None:
            if key in existing:
                self._unplaced_dirs.setdefault(key, []).append(path)
                return
            _log.info("removing orphan %s directory %s", what, path)
            shutil.rmtree(path)

        # Partitions set aside as stray, by (topic id, partition). Their Raft directories
        # go with them when no group of this cluster has that id: a topic id never handed
        # out here, or another cluster's directory under the id of a topic this cluster
        # deleted. Else (an id the catalogue gives to another name, or another cluster's
        # directory under the id of a partition that exists here) that group id's
        # directory is this cluster's, judged as any other. Registered, so the catalogue
        # is this cluster's and as new as the registration's commit: every kind came from
        # elsewhere.
        strays: dict[tuple[int, int], str] = {}
        with_raft: dict[tuple[int, int], str] = {}  # their Raft directories set aside too
        root = self._ctx.data_dir / "partitions"
        for path in sorted(root.iterdir()) if root.exists() else []:
            try:
                topic_id = int((path / TOPIC_ID_FILE).read_text())
                topic, _, raw_partition = path.name.rpartition("-")
                partition = int(raw_partition)
            except (OSError, ValueError):
                continue  # not ours to judge
            key = (topic_id, partition)
            foreign = self._judge_cluster(path)
            if foreign is not None:
                self._strays.set_aside(path, topic_id, partition, foreign)
                if key not in placed and key not in existing:  # no group of ours
                    with_raft[key] = foreign
                continue
            if topic_id >= state.next_topic_id:
                strays[key] = f"topic id {topic_id} was never created in this cluster"
            elif topic_id in names and names[topic_id] != topic:
                strays[key] = f"topic id {topic_id} is {names[topic_id]!r} here, not {topic!r}"
            if key in strays:
                self._strays.set_aside(path, topic_id, partition, strays[key])
                if topic_id >= state.next_topic_id:
                    with_raft[key] = strays[key]
            elif key not in placed and topic_id < state.next_topic_id:
                remove(key, path, "partition")
            self._stamp(path)  # kept (placed here, or until its leader's word): ours
        groups = self._ctx.data_dir / "raft" / "groups"
        for path in sorted(groups.iterdir()) if groups.exists() else []:
            if not path.name.isdigit() or int(path.name) == 0:
                continue
            key = divmod(int(path.name), GROUPS_PER_TOPIC)
            if key in with_raft:
                self._strays.set_aside(path, key[0], key[1], with_raft[key])
            elif key not in placed and key[0] < state.next_topic_id:
                remove(key, path, "raft group")  # a newer id alone: not judged


def in_turns(
    missing: list[tuple[tuple[str, int], tuple[TopicInfo, tuple[str, ...]]]],
) -> list[tuple[tuple[str, int], tuple[TopicInfo, tuple[str, ...]]]]:
    """The replicas to open, in turns of their preferred leaders: the first partition each
    broker prefers, then the second, and so on (each topic's partitions in order within a
    turn). The placement gives each broker its share of preferred leaders in one run of
    partitions (0-332 to one broker, 333-665 to the next, for 1,000 on 3); opened in
    partition order, the first third all led by one broker for seconds and the leader
    balancer moved them off, to move them back later. Every broker computes the same
    order from the catalogue, so a group opens on all its members at about the same time.
    """
    turn: dict[tuple[str, str], int] = {}
    keyed = []
    for key, want in sorted(missing, key=lambda item: item[0]):
        preferred = (key[0], want[1][0])
        turn[preferred] = turn.get(preferred, -1) + 1
        keyed.append(((turn[preferred], key), (key, want)))
    keyed.sort(key=lambda item: item[0])
    return [item for _, item in keyed]

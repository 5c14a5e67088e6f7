"""This broker's open partition replicas and their upkeep.

The one registry of replicas: the reconciler (reconcile.py) adds and removes them as the
catalogue places partitions here; every other service only looks them up. A replica is
keyed by (topic name, partition); `local` also matches the topic id, because a topic
deleted and created again under the same name is another topic with other records.

The replicas read and run retention on a fixed pool of storage threads (a partition
always on the same one: dmq/partition/replica.py), so threads do not grow with
partitions and the event loop never blocks on disk.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging

from dmq.metadata.service import wall_ms
from dmq.partition.replica import PartitionReplica, StorageThreads
from log.writeback import Writeback

_log = logging.getLogger("dmq.broker")

STORAGE_THREADS = 4  # bounded: partitions are spread over these, see dmq/partition/replica.py
LEADER_WAIT_S = 5.0  # create_topic and start wait at most this long for the groups' leaders

ReplicaKey = tuple[str, int]  # (topic name, partition)


class ReplicaSet:
    """The replicas open on this broker, by (topic, partition)."""

    def __init__(self, storage_threads: int = STORAGE_THREADS) -> None:
        self._replicas: dict[ReplicaKey, PartitionReplica] = {}
        self._threads = StorageThreads(storage_threads)
        # Keys of replicas whose delay store may hold records: each store adds its key
        # when it starts holding some (any thread; set.add under the GIL), the release
        # duty drops a key once the store is empty (dmq/broker/delay.py).
        self.delay_pending: set[ReplicaKey] = set()

    def __len__(self) -> int:
        return len(self._replicas)

    def __contains__(self, key: ReplicaKey) -> bool:
        return key in self._replicas

    def get(self, topic: str, partition: int) -> PartitionReplica | None:
        """The replica open under that name, whatever its topic id (leader lookups)."""
        return self._replicas.get((topic, partition))

    def local(self, topic: str, partition: int, topic_id: int) -> PartitionReplica | None:
        """This broker's open replica of the partition of that topic id (a re-created
        topic of the same name is another topic), or None."""
        replica = self._replicas.get((topic, partition))
        if replica is None or replica.topic_id != topic_id or replica.closed:
            return None
        return replica

    def items(self) -> list[tuple[ReplicaKey, PartitionReplica]]:
        """A copy: callers await between replicas, while the reconciler changes the set."""
        return list(self._replicas.items())

    def values(self) -> list[PartitionReplica]:
        return list(self._replicas.values())

    def add(self, replica: PartitionReplica) -> None:
        key = (replica.topic, replica.partition)
        self._replicas[key] = replica
        # Its store adds the key from now on; what it holds already is added here, after
        # the hook is in place, so that no start of holding records falls between.
        replica.watch_delay(functools.partial(self.delay_pending.add, key))
        if replica.delay_due_hint_ms is not None:
            self.delay_pending.add(key)

    def remove(self, key: ReplicaKey) -> None:
        del self._replicas[key]

    def executor_for(self, key: str) -> concurrent.futures.ThreadPoolExecutor:
        return self._threads.executor_for(key)

    @property
    def writeback(self) -> Writeback:
        """The thread that starts the write-back of what the replicas' logs append."""
        return self._threads.writeback

    async def wait_for_leaders(self, name: str | None) -> None:
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

    async def housekeeping(self, interval_s: float) -> None:
        """Retention and compaction every `interval_s` (retention_check_interval_ms)."""
        while True:
            await asyncio.sleep(interval_s)
            for replica in self.values():
                try:
                    await replica.maybe_clean(wall_ms())
                except Exception:  # one partition's failure must not stop the others' upkeep
                    _log.exception("housekeeping failed on %s", replica.name)

    async def close(self) -> None:
        """Close every replica's files: each close flushes its log and checkpoint."""
        for replica in self.values():
            try:
                await replica.close(leave_group=False)
            except Exception:  # keep closing the others: each close flushes its log
                _log.exception("closing %s failed", replica.name)

    def shutdown_threads(self) -> None:
        """After `close` (or a failed stop): no read or retention runs any more."""
        self._threads.shutdown()

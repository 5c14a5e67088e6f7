"""This broker's cluster identity: checked before anything opens, adopted once registered.

The cluster id lives in the catalogue (dmq/metadata/identity.py) and in every data
directory (`<data-dir>/meta.properties`, dmq/meta_file.py). The Broker calls, in order:

1. `check_data_dir()` before it locks or writes anything in the data directory: a
   directory whose identity names another node id is refused (DataDirMismatch, nothing
   changed); a directory that names a cluster makes this broker speak for it from the
   first Raft hello and HTTP call on (`_use`), so that brokers of another cluster refuse
   it and it refuses them;
2. `check_catalogue()` before each attempt to register: a catalogue (its own group 0's,
   on a voter) that names another cluster than the directory is refused
   (ClusterIdMismatch: the broker stops) before it registers there;
3. `adopt()` once its registration committed: if the catalogue has no id yet (a new
   cluster, or one from before cluster ids) it proposes one, `FormCluster` with the id
   its directory already holds (meta.properties, else the per-broker id an older dmq kept
   in `meta/cluster_id`), else a new random one; the first committed wins and every
   broker reads it back. A directory that names another cluster than the catalogue's is
   refused (ClusterIdMismatch: the broker stops); one with no identity gets it written
   (atomically, fsynced) and is this cluster's from then on.

Every broker therefore reports the same id (`GET /v1/cluster`, `dmq cluster status`),
also after a restart: the id never changes once formed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from dmq import errors, meta_file
from dmq.broker.context import BrokerContext
from dmq.metadata.machine import FormCluster, is_cluster_id
from dmq.metadata.service import wall_ms

_log = logging.getLogger("dmq.broker")

ADOPT_RETRY_S = 0.2  # between attempts while the metadata group has no leader


class IdentityService:
    """Reads, checks and writes this broker's cluster identity (module docstring)."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx

    def check_data_dir(self) -> None:
        """Step 1: refuse another broker's data directory; speak for its cluster."""
        meta = meta_file.check_start(self._ctx.data_dir, self._ctx.config.node_id)
        if meta is not None:
            self._use(meta.cluster_id)

    def check_catalogue(self) -> None:
        """Before each registration attempt (and in `adopt`): a catalogue that names
        another cluster than the data directory is refused (ClusterIdMismatch) before this
        broker registers in it. An observer never holds one (the metadata service does
        not take it, and the other cluster's brokers answer its calls 409): this catches
        a voter whose own group 0 names another cluster than its `meta.properties`."""
        ctx = self._ctx
        theirs = ctx.metadata.state.cluster_id
        if ctx.cluster_id and theirs and theirs != ctx.cluster_id:
            raise errors.ClusterIdMismatch(
                meta_file.mismatch_message(
                    ctx.data_dir, ctx.cluster_id, theirs, "the metadata group it reached"
                )
            )

    async def adopt(self) -> None:
        """Step 2: the catalogue's id (proposed first if it has none), in the data dir."""
        ctx = self._ctx
        await self._catalogue_id()
        self.check_catalogue()
        cluster_id = ctx.metadata.state.cluster_id
        if meta_file.read(ctx.data_dir) is None:
            meta_file.write(ctx.data_dir, meta_file.DataDirMeta(cluster_id, ctx.config.node_id))
            _log.info("data directory %s is now of cluster %s", ctx.data_dir, cluster_id)
        self._use(cluster_id)

    async def _catalogue_id(self) -> str:
        metadata = self._ctx.metadata
        attempts = 0
        while not metadata.state.cluster_id:
            candidate = self._ctx.cluster_id or meta_file.read_legacy_cluster_id(self._ctx.data_dir)
            if not is_cluster_id(candidate):
                candidate = uuid.uuid4().hex
            try:
                try:
                    await metadata.propose(FormCluster(candidate, wall_ms()))
                except errors.ClientError:  # formed meanwhile by another broker: read it
                    await metadata.read_barrier()
            except errors.RetriableError as exc:  # the read too: the leader may move
                # (jepsen campaign: a broker exited at its first start when the leader
                # was lost under the barrier's no-op, outcome unknown)
                attempts += 1
                if attempts % 25 == 1:
                    _log.info("waiting for the metadata group to form the cluster id: %s", exc)
                await asyncio.sleep(ADOPT_RETRY_S)
        return metadata.state.cluster_id

    def _use(self, cluster_id: str) -> None:
        """Name `cluster_id` in every report, HTTP call and Raft hello from now on."""
        ctx = self._ctx
        ctx.cluster_id = cluster_id
        ctx.peers.cluster_id = cluster_id
        if ctx.raft_node is not None:
            ctx.raft_node.set_cluster_id(cluster_id.encode())

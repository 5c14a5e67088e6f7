"""This broker as a member of the cluster: what it tells the others, what it shows of them.

- duties: a heartbeat to the catalogue every HEARTBEAT_INTERVAL_S (a broker silent for
  broker_session_ms is not live and gets no new replicas), the leaders of the groups led
  here every LEADER_REPORT_INTERVAL_S (routing for brokers without a replica, describe),
  and `maybe_balance_leaders` every LEADER_BALANCE_INTERVAL_S; every other broker's
  release asked (GET /healthz, its X-Dmq-Version) every VERSION_PROBE_INTERVAL_S, so that
  a rolling upgrade shows in `cluster` within that time;
- `cluster` (`GET /v1/cluster`): the cluster id, the metadata voters and the brokers, each
  with its release (None: not heard from since this broker started);
- `cluster_status` (`GET /v1/cluster/status`): every broker's `local_status` merged;
- the metadata group served to other brokers (internal routes): an observer's commands,
  the catalogue once newer than a version, group 0's members for a voter checking itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from dmq import __version__, errors
from dmq.broker.context import BrokerContext
from dmq.metadata.machine import BrokerHeartbeat, ReportLeader, ReportStorage
from dmq.metadata.service import wall_ms
from dmq.partition.replica import raft_status_fields

_log = logging.getLogger("dmq.broker")

HEARTBEAT_INTERVAL_S = 2.5  # a quarter of the metadata's broker_session_ms (10 s)
LEADER_REPORT_INTERVAL_S = 1.0  # partition leaders published to the catalogue
LEADER_BALANCE_INTERVAL_S = 5.0  # raft maybe_balance_leaders on every broker
STATUS_TIMEOUT_S = 2.0  # per broker, for cluster status
# Every broker asks each other one GET /healthz this often: n*(n-1) small calls per period
# for a release shown at most this stale in GET /v1/cluster.
VERSION_PROBE_INTERVAL_S = 5.0
VERSION_PROBE_TIMEOUT_S = 2.0
# A storage report goes into the catalogue when the level changes or the free space moves
# by this fraction of the disk (1%): a few commands an hour on a steady disk.
STORAGE_REPORT_CHANGE = 0.01


class ClusterService:
    """This broker's standing in the cluster (module docstring); no state of its own."""

    def __init__(
        self, ctx: BrokerContext, storage_report: Callable[[], dict[str, Any]] | None = None
    ) -> None:
        self._ctx = ctx
        # dmq/broker/storage.py's report: this broker's disk, in status and heartbeats.
        self._storage_report = storage_report or (lambda: {})

    # ------------------------------------------------------------------ duties

    async def heartbeat_loop(self) -> None:
        reported: tuple[str, int] | None = None  # the last storage report committed
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)
            try:
                await self._ctx.metadata.propose(
                    BrokerHeartbeat(self._ctx.config.node_id, wall_ms())
                )
                reported = await self._maybe_report_storage(reported)
            except errors.DmqError as exc:
                _log.debug("heartbeat not committed: %s", exc)

    async def _maybe_report_storage(self, reported: tuple[str, int] | None) -> tuple[str, int]:
        """The disk's level and free bytes into the catalogue (ReportStorage) when the
        level changed or the free space moved by STORAGE_REPORT_CHANGE of the disk."""
        storage = self._storage_report()
        level, free = str(storage.get("level", "")), int(storage.get("free_bytes", -1))
        if level not in ("ok", "alert", "full") or free < 0:
            return reported or ("", -1)
        step = int(storage.get("total_bytes", 0) * STORAGE_REPORT_CHANGE)
        if reported is not None and reported[0] == level and abs(reported[1] - free) <= step:
            return reported
        await self._ctx.metadata.propose(
            ReportStorage(self._ctx.config.node_id, free, level, wall_ms())
        )
        return level, free

    async def leader_report_loop(self) -> None:
        """Publish the leaders of groups led here, so brokers without a replica can route."""
        while True:
            await asyncio.sleep(LEADER_REPORT_INTERVAL_S)
            results = await asyncio.gather(
                *(self._ctx.metadata.propose(r) for r in self._leader_reports()),
                return_exceptions=True,
            )
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, errors.DmqError):
                    _log.error("leader report failed: %r", result)

    def _leader_reports(self) -> list[ReportLeader]:
        """A report per group led here whose leader or term the catalogue does not have."""
        node_id = self._ctx.node_id
        state = self._ctx.metadata.state
        reports = []
        for (name, p), replica in self._ctx.replicas.items():
            status = replica.raft.status() if replica.raft is not None else None
            info = state.topics.get(name)
            if status is None or not status.is_leader or info is None:
                continue
            placement = info.partitions[p] if p < len(info.partitions) else None
            if placement is None or info.topic_id != replica.topic_id:
                continue
            if (placement.leader, placement.leader_term) != (node_id, status.term):
                reports.append(
                    ReportLeader(name, info.topic_id, p, node_id, status.term, wall_ms())
                )
        return reports

    async def version_probe_loop(self) -> None:
        """Learn every other broker's release (PeerClient records it from any answer)."""
        while True:
            await asyncio.sleep(VERSION_PROBE_INTERVAL_S)
            others = [
                b.http_addr
                for b in self._ctx.metadata.state.brokers.values()
                if b.broker_id != self._ctx.config.node_id
            ]

            async def probe(http_addr: str) -> None:
                with contextlib.suppress(errors.DmqError):
                    await self._ctx.peers.call(
                        "GET", http_addr, "/healthz", timeout_s=VERSION_PROBE_TIMEOUT_S
                    )

            await asyncio.gather(*(probe(addr) for addr in others))

    async def leader_balance_loop(self) -> None:
        assert self._ctx.raft_node is not None
        while True:
            await asyncio.sleep(LEADER_BALANCE_INTERVAL_S)
            # No leadership to a broker whose disk is below its floor (storage.py), nor to
            # one leaving the cluster (each such move is undone by its reassignment).
            # Brokers this node cannot reach, RaftNode leaves out itself.
            avoid = frozenset(
                b.broker_id
                for b in self._ctx.metadata.state.brokers.values()
                if b.storage_level == "full" or b.decommissioning
            )
            try:
                await self._ctx.raft_node.maybe_balance_leaders(avoid=avoid)
            except Exception:
                _log.exception("leader balancing failed")

    # ------------------------------------------------------------------ views

    def cluster(self) -> dict[str, Any]:
        state = self._ctx.metadata.state
        live = set(state.live_brokers(max(state.clock_ms, wall_ms())))
        return {
            "cluster_id": self._ctx.cluster_id or state.cluster_id,  # ("" before formed)
            "node_id": self._ctx.config.node_id,
            "metadata_voters": self._ctx.metadata.voters,
            "metadata_version": state.metadata_version,
            "brokers": [
                {
                    "node_id": b.broker_id,
                    "version": self._release_of(b.broker_id, b.http_addr),
                    "http_addr": b.http_addr,
                    # The URL clients use: every broker of a cluster has TLS on, or none.
                    "url": f"{self._ctx.config.http_scheme}://{b.http_addr}",
                    "raft_addr": b.raft_addr,
                    "live": b.broker_id in live,
                    # As of its last heartbeat (-1 / None: not reported yet).
                    "free_bytes": b.free_bytes,
                    "storage": b.storage_level or None,
                }
                for b in sorted(state.brokers.values(), key=lambda b: b.broker_id)
            ],
        }

    def _release_of(self, broker_id: str, http_addr: str) -> str | None:
        if broker_id == self._ctx.config.node_id:
            return __version__
        return self._ctx.peers.versions.get(http_addr)

    def local_status(self) -> dict[str, Any]:
        """This broker's replicas as its Raft groups see them (for cluster status)."""
        replicas = [r.status() for r in self._ctx.replicas.values()]
        metadata = (
            self._ctx.metadata_service.open_replica
            if self._ctx.metadata_service is not None
            else None
        )
        if metadata is not None:
            fields = raft_status_fields(metadata)
            # Group 0's configuration as this member knows it (voter changes; a read of
            # pysyncobj's member list from this thread: a snapshot, for status only).
            replicas.append(
                {**fields, "group_id": 0, "topic": None, "partition": None,
                 "members": metadata.members}
            )  # fmt: skip
        return {
            "node_id": self._ctx.config.node_id,
            "ready": self._ctx.ready,
            "storage": self._storage_report(),
            "replicas": replicas,
        }

    async def cluster_status(self) -> dict[str, Any]:
        """Every broker's view merged: brokers, and per group its leader, term, commit
        index and each replica's lag (leader's commit index - replica's last applied)."""
        doc = self.cluster()
        answers: dict[str, dict[str, Any]] = {self._ctx.config.node_id: self.local_status()}

        async def ask(node_id: str, addr: str) -> None:
            with contextlib.suppress(errors.DmqError):
                answers[node_id] = await self._ctx.peers.call(
                    "GET", addr, "/v1/internal/status", timeout_s=STATUS_TIMEOUT_S
                )

        await asyncio.gather(
            *(
                ask(b["node_id"], b["http_addr"])
                for b in doc["brokers"]
                if b["node_id"] != self._ctx.config.node_id
            )
        )
        for b in doc["brokers"]:
            b["reachable"] = b["node_id"] in answers
            b["version"] = self._release_of(b["node_id"], b["http_addr"])  # as just asked
            if b["reachable"]:  # its own view, fresher than its last heartbeat
                b["storage_status"] = answers[b["node_id"]].get("storage")
        doc["groups"] = merge_group_status(answers)
        return doc

    # ------------------------------------------------------------------ metadata, internal

    async def propose_metadata_forwarded(self, command: bytes) -> int:
        """Internal: an observer's metadata command; the metadata version it produced."""
        applied = await self._ctx.metadata.propose_encoded(command)
        return applied.metadata_version

    async def metadata_voters_view(self) -> dict[str, Any]:
        """Internal, on the metadata leader: group 0's members and the catalogue (a voter
        checking whether it is still one, dmq/metadata/service.py)."""
        return await self._ctx.metadata.leader_view()

    async def metadata_state_after(
        self, after_version: int, wait_ms: int, consistency: str | None
    ) -> dict[str, Any]:
        """Internal: the catalogue for an observer, once newer than `after_version`.
        Only a voter answers: an observer's own catalogue may be as old as the asker's
        (both following voters that have since left), and a long-poll answered from it
        kept the asker there; refused at once, the asker tries the next broker it knows
        until a voter answers (jepsen campaign seed 1026397559: three voters decommissioned
        at once, and two observers that knew only those three never saw the new voters)."""
        if not self._ctx.metadata.is_voter:
            raise errors.NotLeader(
                "this broker is not a metadata voter: ask a voter", retry_after_ms=200
            )
        if consistency == "linearizable":
            await self._ctx.metadata.read_barrier()
        return await self._ctx.metadata.state_after(after_version, wait_ms)


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

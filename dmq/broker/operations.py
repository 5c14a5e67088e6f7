"""Cluster operations: reassign partitions, decommission brokers, balance replicas.

Every operation is state in the metadata group (dmq/metadata/reassignment.py): a partition's
`target` replica set, a broker's `decommissioning` flag. Whichever broker leads the
metadata group drives them (`run`, every OPERATIONS_INTERVAL_S): a new metadata leader
picks up where a crashed or restarted one stopped, because each step reads where the
partition is (the catalogue and the partition group's own configuration) and is
idempotent. raft/README.md ("Cluster operations") lists the steps and what happens if
one stops halfway. In short, for a partition with replicas R and target T:

1. **add** b in T - R: b's broker opens its replica as soon as the target names it (as a
   non-member its votes are ignored); once it is open, the partition leader adds b to the
   Raft group (`RaftNode.change_membership`, pysyncobj's single-server change), then the
   catalogue records R + b (`AlterPartitionReplicas`); b catches up through Raft
   (entries, or a snapshot plus a copy of the log over HTTP). Opening first matters when
   the other members are not a majority of R + b: a single replica, or a group of three
   with the broker being replaced down;
2. **catch up**: nothing is removed while any member of T is out of sync (`caught_up`:
   the whole log, or within REPLICA_LAG_ENTRIES_MAX entries and heard from within
   REPLICA_LAG_TIME_MAX_S): the partition never has fewer than its replication factor
   of replicas in sync;
3. **move leadership** away from a leaving replica o in R - T that leads
   (`transfer_leadership` to a caught-up member of T);
4. **remove** o: the leader removes it from the Raft group, then the catalogue records
   R - o; o's broker deletes the replica's log and Raft directory (dmq/broker/reconcile.py).
   When R reaches T's set the reassignment ends (`target` cleared).

Decommission a partition: `DecommissionPartition` stops it taking new records (produce
answers 409 partition_decommissioned; keyed and sticky choices use the active partitions
only); it stays readable. Once its leader's log is empty (retention removed every record:
log_start_offset == log_end_offset) the driver proposes `RemovePartition`: the catalogue
keeps the number as gone, every broker deletes its replica, groups stop assigning it.

Decommission: each partition with a replica on the broker gets a target with that broker
replaced by the eligible broker holding the fewest replicas; once it holds none, the
broker is unregistered (its data directory may then be deleted). Balance: when every
eligible broker is live and no reassignment runs, a replica moves from the broker with
the most to the one with the fewest while they differ by more than one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, Literal

from dmq import errors
from dmq.broker.context import BrokerContext
from dmq.broker.operations_plan import (
    balancing_move,
    caught_up,
    decommissioned_partitions,
    describe_step,
    describe_voters_step,
    next_voter_step,
    progress_fraction,
    replace_brokers,
    replica_counts,
)
from dmq.metadata.machine import (
    AlterMetadataVoters,
    AlterPartitionReplicas,
    ChangeMetadataVoters,
    DecommissionBroker,
    DecommissionPartition,
    MetadataState,
    PartitionInfo,
    ReassignPartition,
    RemovePartition,
    TopicInfo,
    UnregisterBroker,
)
from dmq.metadata.reassignment import unregister_refusal
from dmq.metadata.service import METADATA_GROUP_ID, translate_raft_error, wall_ms
from dmq.metadata.voters import METADATA_VOTERS_MAX
from dmq.partition.replica import group_id_for
from raft import errors as raft_errors

_log = logging.getLogger("dmq.broker.operations")

OPERATIONS_INTERVAL_S = 0.5  # how often the metadata leader advances operations
# Partitions moved at once (each copies its log to a new broker: disk and network bound).
REASSIGNMENTS_CONCURRENT_MAX = 4
MEMBERSHIP_CHANGE_TIMEOUT_S = 10.0
PEER_CALL_TIMEOUT_S = 5.0
VOTER_STATUS_TIMEOUT_S = 2.0  # asking a broker whether it opened its group-0 replica


def _key(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


class OperationsService:
    """The broker's side of cluster operations (module docstring)."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._running: dict[str, asyncio.Task[None]] = {}
        self._last_step: dict[str, str] = {}  # partition key -> what its last step did
        # Checks of decommissioned partitions' logs, off the driver's round: a broker that
        # hangs must not hold up reassignments.
        self._removals: asyncio.Task[None] | None = None
        # What the metadata voter driver's last step did (on the metadata leader).
        self._voters_step: str | None = None
        # Each voter change's starting set, as this broker first saw it (progress).
        self._voters_start: dict[tuple[str, ...], tuple[str, ...]] = {}

    # ------------------------------------------------------------------ requests

    async def reassign(self, topic: str, partition: int, replicas: list[str]) -> dict[str, Any]:
        """Record a reassignment (the metadata leader then carries it out)."""
        info = self._partition_info(topic, partition)
        brokers = self._ctx.metadata.state.brokers
        unknown = sorted(b for b in replicas if b not in brokers)
        if unknown:
            raise errors.InvalidRequest(f"unknown broker(s) {unknown}", field="replicas")
        await self._ctx.metadata.propose(
            ReassignPartition(topic, info.topic_id, partition, tuple(replicas), wall_ms())
        )
        # From the state, not the Applied: an observer's proposal returns only the version
        # (its state includes that version once propose returns).
        after = self._topic_info(topic)
        return self._operation_doc(after, partition, after.partitions[partition])

    async def change_metadata_voters(self, voters: list[str]) -> dict[str, Any]:
        """Record the voter set wanted for the metadata group (the metadata leader then
        changes group 0 one voter at a time); the `metadata_voters` operation doc."""
        wanted = tuple(sorted(voters))
        if len(set(wanted)) != len(wanted) or not 0 < len(wanted) <= METADATA_VOTERS_MAX:
            raise errors.InvalidRequest(
                f"voters must be 1-{METADATA_VOTERS_MAX} distinct broker ids",
                field="voters",
                limit=METADATA_VOTERS_MAX,
            )
        unknown = sorted(b for b in wanted if b not in self._ctx.metadata.state.brokers)
        if unknown:
            raise errors.InvalidRequest(f"unknown broker(s) {unknown}", field="voters")
        await self._ctx.metadata.propose(ChangeMetadataVoters(wanted, wall_ms()))
        return self._metadata_voters_doc()

    async def decommission(self, broker_id: str) -> dict[str, Any]:
        if broker_id not in self._ctx.metadata.state.brokers:
            raise errors.NotFound(f"broker {broker_id!r} is not registered", field="broker_id")
        await self._maybe_swap_voter_out(broker_id)
        await self._ctx.metadata.propose(DecommissionBroker(broker_id, wall_ms()))
        # The state, not the Applied: an observer's proposal returns only the version.
        info = self._ctx.metadata.state.brokers.get(broker_id)
        return {"broker_id": broker_id, "decommissioning": info is None or info.decommissioning}

    async def decommission_partition(self, topic: str, partition: int) -> dict[str, Any]:
        """Stop the partition taking new records; the driver removes it once empty."""
        info = self._partition_info(topic, partition)
        await self._ctx.metadata.propose(
            DecommissionPartition(topic, info.topic_id, partition, wall_ms())
        )
        after = self._topic_info(topic)  # the state, as in reassign
        return {
            "topic": topic,
            "partition": partition,
            "status": after.partitions[partition].status,
        }

    async def _maybe_swap_voter_out(self, broker_id: str) -> None:
        """A metadata voter leaves group 0 first: the voter set wanted becomes this one's
        with `broker_id` replaced by the eligible non-voter holding the fewest replicas."""
        state = self._ctx.metadata.state
        voters = set(state.voters_target or self._ctx.metadata.voters)
        if broker_id not in voters:
            return
        eligible = state.eligible_brokers(max(state.clock_ms, wall_ms()))
        new = replace_brokers(tuple(sorted(voters)), {broker_id}, eligible, replica_counts(state))
        if new is None:
            raise errors.InvalidRequest(
                f"{broker_id} is a metadata voter and no live, non-voting broker can take its "
                "place: add a broker, or shrink the voter set first "
                "(POST /v1/cluster/metadata-voters)",
                field="broker_id",
            )
        wanted = tuple(sorted(new))
        _log.info("decommissioning voter %s: metadata voters -> %s", broker_id, list(wanted))
        await self._ctx.metadata.propose(ChangeMetadataVoters(wanted, wall_ms()))

    def _topic_info(self, topic: str) -> TopicInfo:
        info = self._ctx.metadata.state.topics.get(topic)
        if info is None:
            raise errors.TopicNotFound(f"topic {topic!r} does not exist", field="topic")
        return info

    def _partition_info(self, topic: str, partition: int) -> TopicInfo:
        """The topic, which must have `partition` (404 naming the field otherwise)."""
        info = self._topic_info(topic)
        if not 0 <= partition < len(info.partitions):
            raise errors.PartitionNotFound(
                f"topic {topic!r} has {len(info.partitions)} partitions", field="partition"
            )
        return info

    # ------------------------------------------------------------------ progress

    async def operations(self) -> dict[str, Any]:
        """Every running reassignment with its progress, and every decommission."""
        state = self._ctx.metadata.state
        moving = [
            (info, p, placement)
            for info in state.topics.values()
            for p, placement in enumerate(info.partitions)
            if placement.target is not None
        ]
        docs = [self._operation_doc(info, p, placement) for info, p, placement in moving]

        async def add_progress(doc: dict[str, Any], info: TopicInfo, p: int) -> None:
            with contextlib.suppress(errors.DmqError):
                placement = state.topics[info.name].partitions[p]
                progress = await self._progress(info, p, placement)
                doc["progress"] = progress_fraction(progress, doc["target"])
                doc["step"] = describe_step(placement, progress)
                doc["group"] = progress

        await asyncio.gather(
            *(add_progress(d, info, p) for d, (info, p, _) in zip(docs, moving, strict=True))
        )
        decommissions = [
            {
                "broker_id": b.broker_id,
                "replicas_left": sum(
                    b.broker_id in pl.replicas for t in state.topics.values() for pl in t.partitions
                ),
            }
            for b in state.brokers.values()
            if b.decommissioning
        ]
        draining = await asyncio.gather(
            *(
                self._partition_decommission_doc(info, p)
                for info, p in decommissioned_partitions(state)
            )
        )
        return {
            "reassignments": docs,
            "decommissions": decommissions,
            "partition_decommissions": list(draining),
            "metadata_voters": self._metadata_voters_doc(),
        }

    def _metadata_voters_doc(self) -> dict[str, Any]:
        """Group 0's recorded voters, the change running (target, step, progress = steps
        done / steps of the change, counted from the set this broker first saw it at)."""
        state = self._ctx.metadata.state
        voters = tuple(self._ctx.metadata.voters)
        target = state.voters_target
        if not target:
            self._voters_start.clear()
            return {"voters": list(voters), "target": None, "step": "done", "progress": 1.0}
        start = self._voters_start.setdefault(target, voters)
        left = len(set(target) ^ set(voters))
        total = max(len(set(target) ^ set(start)), left, 1)
        step = self._voters_step if self._leads_metadata() else None
        return {
            "voters": list(voters),
            "target": list(target),
            "step": step or describe_voters_step(voters, target),
            "progress": round(1 - left / total, 4),
        }

    async def _partition_decommission_doc(self, info: TopicInfo, p: int) -> dict[str, Any]:
        """A decommissioned partition waiting for retention to empty it."""
        doc: dict[str, Any] = {
            "type": "partition_decommission",
            "topic": info.name,
            "partition": p,
            "status": info.partitions[p].status,
            "offsets_left": None,  # unknown while no leader answers
            "last_step": self._last_step.get(_key(info.name, p)),
        }
        with contextlib.suppress(errors.DmqError):
            log = await self._leader_log(info, p, info.partitions[p])
            doc["offsets_left"] = log["log_end_offset"] - log["log_start_offset"]
        return doc

    def _operation_doc(self, info: TopicInfo, p: int, placement: PartitionInfo) -> dict[str, Any]:
        key = _key(info.name, p)
        return {
            "type": "reassignment",
            "topic": info.name,
            "partition": p,
            "replicas": list(placement.replicas),
            "target": list(placement.target) if placement.target is not None else None,
            "started_ms": placement.reassign_started_ms,
            "done": placement.target is None,
            "step": "no partition leader answered",
            # What the driver's last step did or why it will retry (on the metadata leader).
            "last_step": self._last_step.get(key),
            "progress": 1.0 if placement.target is None else 0.0,
        }

    # ------------------------------------------------------------------ the driver

    async def run(self) -> None:
        """The duty loop: on the metadata leader only, advance every operation."""
        try:
            while True:
                await asyncio.sleep(OPERATIONS_INTERVAL_S)
                try:
                    if self._leads_metadata():
                        await self._drive()
                except Exception:  # the next round tries again
                    _log.exception("advancing cluster operations failed")
        finally:  # the broker stops: steps in flight stop too (each is resumable)
            for task in self._running.values():
                task.cancel()
            if self._removals is not None:
                self._removals.cancel()
            await asyncio.gather(
                *self._running.values(),
                *([self._removals] if self._removals else []),
                return_exceptions=True,
            )
            self._running.clear()

    def _leads_metadata(self) -> bool:
        replica = self._ctx.metadata.replica
        return replica is not None and replica.status().is_leader

    async def add_known_peers(self) -> None:
        """Brokers registered since this one started become Raft peers (joins). The broker
        calls it before registering and at each reconciliation (every catalogue change, a
        registration included): a restarted voter's group 0 may name members that joined
        after its `--peers` was written; it learns their addresses from the catalogue it
        replayed, else it could neither answer them nor commit anything."""
        node = self._ctx.raft_node
        if node is None:
            return
        for b in list(self._ctx.metadata.state.brokers.values()):
            known = node.peers.get(b.broker_id) == b.raft_addr
            if not known and await node.add_peer(b.broker_id, b.raft_addr):
                _log.info("raft peer %s at %s added", b.broker_id, b.raft_addr)

    async def _drive(self) -> None:
        await self._drive_voters()
        state = self._ctx.metadata.state
        await self._plan_decommissions(state)
        state = self._ctx.metadata.state
        moving = [
            (info, p)
            for info in state.topics.values()
            for p, placement in enumerate(info.partitions)
            if placement.target is not None
        ]
        if not moving:
            await self._maybe_unregister(state)
            await self._maybe_balance(state)
        if self._removals is None or self._removals.done():
            self._removals = asyncio.get_running_loop().create_task(
                self._remove_partitions_logged(state)
            )
        for key in [k for k, task in self._running.items() if task.done()]:
            del self._running[key]
        for info, p in moving:
            key = _key(info.name, p)
            if key in self._running or len(self._running) >= REASSIGNMENTS_CONCURRENT_MAX:
                continue
            self._running[key] = asyncio.get_running_loop().create_task(
                self._advance_logged(info.name, p)
            )

    # ------------------------------------------------------------------ metadata voters

    async def _drive_voters(self) -> None:
        """One step of group 0's voter change, on its leader (raft/README.md, "Metadata
        voter changes"); never blocks the partition operations on an error."""
        target = self._ctx.metadata.state.voters_target
        if target:  # progress counts from the set the change started at: note it now
            self._voters_start.setdefault(target, tuple(self._ctx.metadata.voters))
        try:
            self._voters_step = await self._advance_voters()
        except raft_errors.RaftError as exc:
            self._voters_step = f"retrying: {translate_raft_error(exc, 'metadata voters')}"
        except errors.DmqError as exc:  # the leadership moved, a broker is down: next round
            self._voters_step = f"retrying: {exc}"
            _log.info("metadata voter change: %s", exc)

    async def _advance_voters(self) -> str:
        """One step of `next_voter_step`, acted on; what it did."""
        node = self._ctx.raft_node
        assert node is not None
        progress = await node.group_progress(METADATA_GROUP_ID)
        if progress.change_pending:
            return "waiting for the membership change to commit"
        state = self._ctx.metadata.state
        doc = progress.to_json()
        step = next_voter_step(
            progress.members,
            state.voters,
            state.voters_target,
            me=self._ctx.config.node_id,
            live=frozenset(state.live_brokers(max(state.clock_ms, wall_ms()))),
            in_sync=frozenset(m for m in progress.members if caught_up(doc, m)),
        )
        if step.action == "record":
            await self._ctx.metadata.propose(AlterMetadataVoters(progress.members, wall_ms()))
        elif step.action == "add":
            assert step.broker is not None
            if not await self._opened_metadata_group(step.broker):
                return f"waiting for {step.broker} to open its replica of the metadata group"
            await self._change_voter("add", step.broker)
        elif step.action == "remove":
            assert step.broker is not None
            await self._change_voter("remove", step.broker)
        elif step.action == "transfer":
            assert step.broker is not None
            await node.transfer_leadership(METADATA_GROUP_ID, step.broker)
        return step.what

    async def _change_voter(self, action: Literal["add", "remove"], broker_id: str) -> None:
        """One Raft change of group 0, then its record in the catalogue (a crash between
        the two: the next round finds the configuration differs and records it)."""
        node = self._ctx.raft_node
        assert node is not None
        _log.info("metadata voters: %s %s", action, broker_id)
        await node.change_membership(
            METADATA_GROUP_ID, action, broker_id, timeout_s=MEMBERSHIP_CHANGE_TIMEOUT_S
        )
        members = (await node.group_progress(METADATA_GROUP_ID)).members
        await self._ctx.metadata.propose(AlterMetadataVoters(members, wall_ms()))

    async def _opened_metadata_group(self, broker_id: str) -> bool:
        """Whether `broker_id` opened its group-0 replica (it does on seeing itself in the
        target): added before, the group would count a member that cannot answer yet."""
        info = self._ctx.metadata.state.brokers.get(broker_id)
        if info is None:
            return False
        try:
            status = await self._ctx.peers.call(
                "GET", info.http_addr, "/v1/internal/status", timeout_s=VOTER_STATUS_TIMEOUT_S
            )
        except errors.DmqError:
            return False
        return any(r.get("group_id") == METADATA_GROUP_ID for r in status.get("replicas", []))

    async def _advance_logged(self, topic: str, partition: int) -> None:
        key = _key(topic, partition)
        try:
            self._last_step[key] = await self._advance(topic, partition)
        except errors.DmqError as exc:  # a leader moved, a broker is down: next round
            self._last_step[key] = f"retrying: {exc}"
            _log.info("reassignment of %s: %s", key, exc)
        except Exception as exc:
            self._last_step[key] = f"retrying: {exc!r}"
            _log.exception("reassignment of %s failed", key)

    async def _advance(self, topic: str, partition: int) -> str:
        """One step of the partition's reassignment (module docstring); what it did."""
        state = self._ctx.metadata.state
        info = state.topics.get(topic)
        if info is None or partition >= len(info.partitions):
            return "topic gone"
        placement = info.partitions[partition]
        target = placement.target
        if target is None:
            return "done"
        replicas = placement.replicas
        progress = await self._progress(info, partition, placement)
        members = set(progress["members"])
        # A member neither placed nor wanted: added before its target was replaced, or by
        # a driver that lost the metadata leadership while reading an older target. Its
        # broker keeps its replica until it is out of the group (Reconciler._still_a_member).
        strays = sorted(members - set(replicas) - set(target))
        if strays:
            await self._membership(info, partition, progress["leader"], "remove", strays[0])
            return f"removed stray member {strays[0]}"
        adding = [b for b in target if b not in replicas]
        if adding:
            new = adding[0]
            if new not in members:
                if not await self._opened(info, partition, new):
                    return f"waiting for {new} to open its replica"
                await self._membership(info, partition, progress["leader"], "add", new)
            await self._record(info, partition, (*replicas, new))
            return f"added {new}"
        lagging = [b for b in target if not caught_up(progress, b)]
        if lagging:
            behind = {
                b: progress["commit_index"] - progress["match_index"].get(b, 0) for b in lagging
            }
            return f"catching up: {behind} entries behind"
        leaving = [b for b in replicas if b not in target][0]
        if progress["leader"] == leaving:
            await self._call(
                leaving, info, partition, "transfer", {"target": target[0]}, method="POST"
            )
            return f"moving leadership from {leaving} to {target[0]}"
        if leaving in members:
            await self._membership(info, partition, progress["leader"], "remove", leaving)
        await self._record(info, partition, tuple(b for b in replicas if b != leaving))
        return f"removed {leaving}"

    async def _opened(self, info: TopicInfo, partition: int, broker_id: str) -> bool:
        """Whether `broker_id` opened the replica the target brings it (its broker does on
        seeing the target). Added before, a group whose other members cannot make a
        majority of the new configuration without it (one replica, or one of three down:
        the broker being replaced) could not commit the add, nor anything after it."""
        try:
            await self._call(broker_id, info, partition, "log", None)
        except errors.DmqError:
            return False
        return True

    async def _record(self, info: TopicInfo, partition: int, replicas: tuple[str, ...]) -> None:
        await self._ctx.metadata.propose(
            AlterPartitionReplicas(info.name, info.topic_id, partition, replicas, wall_ms())
        )

    async def _membership(
        self, info: TopicInfo, partition: int, leader: str, action: str, node_id: str
    ) -> None:
        body = {"action": action, "node_id": node_id}
        await self._call(leader, info, partition, "membership", body, method="POST")

    async def partition_progress(self, info: TopicInfo, partition: int) -> dict[str, Any]:
        """The partition leader's view of its group (members, match indexes)."""
        return await self._progress(info, partition, info.partitions[partition])

    async def _progress(
        self, info: TopicInfo, partition: int, placement: PartitionInfo
    ) -> dict[str, Any]:
        """The partition leader's view of its group, asking the likely leader first."""
        candidates = list(
            dict.fromkeys(
                [
                    *([placement.leader] if placement.leader else []),
                    *placement.replicas,
                    *(placement.target or ()),
                ]
            )
        )
        last: errors.DmqError = errors.NotLeader("no leader found", retry_after_ms=200)
        for node_id in candidates:
            try:
                answer: dict[str, Any] = await self._call(
                    node_id, info, partition, "progress", None
                )
                return answer
            except errors.DmqError as exc:
                last = exc
        raise last

    async def _call(
        self,
        node_id: str,
        info: TopicInfo,
        partition: int,
        what: str,
        body: dict[str, Any] | None,
        *,
        method: str = "GET",
    ) -> Any:
        """An internal partition-group call on broker `node_id` (locally if it is this one)."""
        if node_id == self._ctx.config.node_id:
            return await self.local_call(info.name, partition, info.topic_id, what, body or {})
        addr = self._ctx.metadata.state.brokers.get(node_id)
        if addr is None:
            raise errors.BrokerUnavailable(f"broker {node_id} is not registered")
        return await self._ctx.peers.call(
            method,
            addr.http_addr,
            f"/v1/internal/partitions/{info.name}/{partition}/{what}",
            params={"topic_id": str(info.topic_id)},
            body=json.dumps(body).encode() if body is not None else None,
            content_type="application/json",
            timeout_s=PEER_CALL_TIMEOUT_S + MEMBERSHIP_CHANGE_TIMEOUT_S,
        )

    async def local_call(
        self, topic: str, partition: int, topic_id: int, what: str, body: dict[str, Any]
    ) -> Any:
        """The internal routes' one entry point: act on this broker's replica's group."""
        node = self._ctx.raft_node
        if node is None:
            raise errors.BrokerUnavailable("the broker is starting", retry_after_ms=500)
        group_id = group_id_for(topic_id, partition)
        if group_id not in node.groups:
            raise errors.PartitionNotFound(
                f"no replica of {topic}-{partition} (topic id {topic_id}) on this broker",
                field="partition",
            )
        try:
            if what == "progress":
                return (await node.group_progress(group_id)).to_json()
            if what == "log":
                return self._local_log(topic, partition, topic_id)
            if what == "membership":
                action, node_id = body.get("action"), body.get("node_id")
                if action not in ("add", "remove") or not isinstance(node_id, str):
                    raise errors.InvalidRequest(
                        "action must be add or remove, node_id a string", field="action"
                    )
                changed = await node.change_membership(
                    group_id, action, node_id, timeout_s=MEMBERSHIP_CHANGE_TIMEOUT_S
                )
                return {"changed": changed}
            if what == "transfer":
                target = body.get("target")
                if not isinstance(target, str):
                    raise errors.InvalidRequest("target must be a broker id", field="target")
                await node.transfer_leadership(group_id, target)
                return {"requested": True}
        except raft_errors.RaftError as exc:
            raise translate_raft_error(exc, f"{topic}-{partition} {what}") from exc
        raise errors.InvalidRequest(f"unknown internal operation {what!r}", field="operation")

    def _local_log(self, topic: str, partition: int, topic_id: int) -> dict[str, Any]:
        replica = self._ctx.replicas.local(topic, partition, topic_id)
        if replica is None:  # the group id matched, but not this topic's name
            raise errors.PartitionNotFound(
                f"no replica of {topic}-{partition} (topic id {topic_id}) on this broker",
                field="partition",
            )
        if replica.raft is None:
            raise errors.BrokerUnavailable(f"{topic}-{partition} is opening", retry_after_ms=500)
        replica.refresh_offsets()  # a follower's, or a new leader's, mirror may lag
        return {
            "leader": replica.raft.status().is_leader,
            "log_start_offset": replica.log_start_offset,
            "log_end_offset": replica.log_end_offset,
        }

    # ------------------------------------------------------------------ planning

    async def _plan_decommissions(self, state: MetadataState) -> None:
        leaving = {b for b, info in state.brokers.items() if info.decommissioning}
        if not leaving:
            return
        counts = replica_counts(state)
        eligible = state.eligible_brokers(max(state.clock_ms, wall_ms()))
        for info in state.topics.values():
            for p, placement in enumerate(info.partitions):
                if placement.target is not None or not leaving & set(placement.replicas):
                    continue
                target = replace_brokers(placement.replicas, leaving, eligible, counts)
                if target is None:
                    continue  # not enough eligible brokers now: a later round
                await self._ctx.metadata.propose(
                    ReassignPartition(info.name, info.topic_id, p, target, wall_ms())
                )

    async def _remove_partitions_logged(self, state: MetadataState) -> None:
        try:
            await self._maybe_remove_partitions(state)
        except errors.DmqError as exc:  # the metadata leader moved, a broker is down: later
            _log.info("removing decommissioned partitions: %s", exc)
        except Exception:
            _log.exception("removing decommissioned partitions failed")

    async def _maybe_remove_partitions(self, state: MetadataState) -> None:
        """Decommissioned partitions whose leader's log is empty go (RemovePartition)."""
        for info, p in decommissioned_partitions(state):
            placement = info.partitions[p]
            if placement.target is not None:
                continue  # being moved: removed once the move ends
            key = _key(info.name, p)
            try:
                log = await self._leader_log(info, p, placement)
            except errors.DmqError as exc:
                self._last_step[key] = f"retrying: {exc}"
                continue
            if log["log_start_offset"] < log["log_end_offset"]:
                self._last_step[key] = (
                    f"draining: {log['log_end_offset'] - log['log_start_offset']} offsets "
                    "left until retention removes them"
                )
                continue
            await self._ctx.metadata.propose(
                RemovePartition(info.name, info.topic_id, p, wall_ms())
            )
            self._last_step.pop(key, None)
            _log.info("partition %s decommissioned and empty: removed", key)

    async def _leader_log(
        self, info: TopicInfo, partition: int, placement: PartitionInfo
    ) -> dict[str, Any]:
        """The partition leader's log offsets (a follower's may lag behind retention)."""
        last: errors.DmqError = errors.NotLeader("no leader found", retry_after_ms=200)
        for node_id in dict.fromkeys(
            [*([placement.leader] if placement.leader else []), *placement.replicas]
        ):
            try:
                answer: dict[str, Any] = await self._call(node_id, info, partition, "log", None)
            except errors.DmqError as exc:
                last = exc
                continue
            if answer["leader"]:
                return answer
        raise last

    async def _maybe_unregister(self, state: MetadataState) -> None:
        for b in state.brokers:  # a voter leaves group 0 first (the driver swaps it out)
            if unregister_refusal(state, b) is None:
                await self._ctx.metadata.propose(UnregisterBroker(b, wall_ms()))
                _log.info("broker %s decommissioned: it holds no replica and left", b)

    async def _maybe_balance(self, state: MetadataState) -> None:
        if not self._ctx.config.auto_balance_replicas:
            return
        now_ms = max(state.clock_ms, wall_ms())
        eligible = state.eligible_brokers(now_ms)
        registered = [b for b, i in state.brokers.items() if not i.decommissioning]
        if sorted(registered) != eligible or len(eligible) < 2:
            return  # a broker is down: moving replicas now would only add load
        move = balancing_move(state, eligible)
        if move is not None:
            info, p, target = move
            _log.info("balancing: %s-%d -> %s", info.name, p, list(target))
            await self._ctx.metadata.propose(
                ReassignPartition(info.name, info.topic_id, p, target, wall_ms())
            )

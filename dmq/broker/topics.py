"""Topic admin: create, describe, alter, add partitions, delete, and the topic list.

Admin requests are metadata commands. The service validates names and config, proposes,
and answers once this broker's catalogue includes the change; it then reconciles this
broker's replicas (reconcile.py) and, for new partitions, waits up to LEADER_WAIT_S for
their leaders, so that a fetch right after a create finds one. Reads (`list_topics`,
`describe_topic`) answer from this broker's catalogue, after `metadata_barrier` when the
request asks for `consistency=linearizable`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from dmq import errors, limits
from dmq.broker.context import BrokerContext
from dmq.broker.reconcile import Reconciler
from dmq.broker.routing import Routing
from dmq.broker.types import PartitionInfo, TopicDescription, TopicSummary, TopicView
from dmq.metadata.machine import (
    AddPartitions,
    AlterTopicConfig,
    CreateTopic,
    DeleteTopic,
    config_items,
)
from dmq.metadata.service import wall_ms
from dmq.partition.replica import PartitionReplica
from dmq.topics import (
    check_tiered_config,
    check_topic_name,
    default_topic_config,
    validate_topic_config,
)

_log = logging.getLogger("dmq.broker")


class TopicsService:
    """Topic admin as metadata commands; no state of its own (module docstring)."""

    def __init__(self, ctx: BrokerContext, routing: Routing, reconciler: Reconciler) -> None:
        self._ctx = ctx
        self._routing = routing
        self._reconciler = reconciler

    async def metadata_barrier(self, consistency: str | None) -> None:
        """`consistency=linearizable`: include every change committed before the call."""
        self._ctx.check_ready()
        if consistency not in (None, "local", "linearizable"):
            raise errors.InvalidRequest(
                "consistency must be local or linearizable", field="consistency"
            )
        if consistency == "linearizable":
            await self._ctx.metadata.read_barrier()

    async def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        replication_factor: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> TopicDescription:
        check_topic_name(name)
        self._ctx.check_ready()
        c = self._ctx.config
        count = c.default_partitions if partitions is None else partitions
        if not 1 <= count <= limits.PARTITIONS_PER_TOPIC_MAX:
            raise errors.InvalidRequest(
                f"partitions must be in [1, {limits.PARTITIONS_PER_TOPIC_MAX}], got {count}",
                field="partitions",
                limit=limits.PARTITIONS_PER_TOPIC_MAX,
            )
        brokers = len(c.peer_addrs)
        if replication_factor is None:  # the default is capped at the cluster's size
            rf = min(c.default_replication_factor, brokers)
        else:
            rf = replication_factor
        if not 1 <= rf <= brokers:
            raise errors.InvalidRequest(
                f"replication_factor {rf} needs {rf} brokers; this cluster has {brokers}",
                field="replication_factor",
                limit=brokers,
            )
        self._check_replicas(count * rf, "partitions")
        topic_config = default_topic_config(c)
        # Only an absent config means "defaults": `false` or `[]` is refused, not ignored.
        topic_config.update(validate_topic_config({} if config is None else config, c))
        check_tiered_config(topic_config)
        await self._ctx.metadata.propose(
            CreateTopic(name, count, rf, config_items(topic_config), wall_ms())
        )
        await self._reconciler.reconcile()
        await self._ctx.replicas.wait_for_leaders(name)
        _log.info(
            "created topic %s with %d partition%s, %d replica%s each",
            name, count, "" if count == 1 else "s", rf, "" if rf == 1 else "s",
        )  # fmt: skip
        return self.describe_topic(name)

    def _check_replicas(self, added: int, field: str) -> None:
        """Refuse a change that would put more than replicas_per_broker_max partition
        replicas on a broker on average (placement spreads them evenly)."""
        brokers = len(self._ctx.config.peer_addrs)
        limit = self._ctx.config.replicas_per_broker_max
        existing = sum(
            len(t.partitions) * t.replication_factor
            for t in self._ctx.metadata.state.topics.values()
        )
        if -(-(existing + added) // brokers) > limit:
            raise errors.InvalidRequest(
                f"{existing} partition replicas exist on {brokers} brokers; {added} more would "
                f"exceed replicas_per_broker_max ({limit} per broker)",
                field=field,
                limit=limit,
            )

    def list_topics(self) -> list[TopicSummary]:
        self._ctx.check_ready()
        return [
            TopicSummary(t.name, len(t.partitions), t.replication_factor)
            for t in sorted(self._ctx.metadata.state.topics.values(), key=lambda t: t.name)
        ]

    def describe_topic(self, name: str) -> TopicDescription:
        view = self._routing.topic(name)
        parts = []
        for p, placement in enumerate(view.info.partitions):
            local = self._ctx.replicas.local(name, p, view.topic_id)
            if local is not None:
                local.refresh_offsets()  # a follower's mirror may lag
            parts.append(
                PartitionInfo(
                    p,
                    self._routing.leader_of(view, p),
                    placement.replicas,
                    # with tiered storage, below the local log start (remote_manifest.py)
                    local.remote_manifest.first_offset(local.log_start_offset) if local else None,
                    local.high_watermark if local else None,
                    local.log_end_offset if local else None,
                    placement.status,
                    *_tiered_fields(local),
                )
            )
        return TopicDescription(view.name, view.replication_factor, tuple(parts), view.config)

    async def alter_topic_config(self, name: str, updates: dict[str, Any]) -> TopicDescription:
        checked = validate_topic_config(updates, self._ctx.config)
        check_tiered_config(dict(self._routing.topic(name).config) | checked)
        await self._ctx.metadata.propose(
            AlterTopicConfig(name, config_items(checked), (), wall_ms())
        )
        await self._reconciler.reconcile()
        return self.describe_topic(name)

    async def add_partitions(self, name: str, count: int) -> TopicDescription:
        view = self._routing.topic(name)
        if not view.partitions < count <= limits.PARTITIONS_PER_TOPIC_MAX:
            raise errors.InvalidRequest(
                f"count must be more than the current {view.partitions} and at most "
                f"{limits.PARTITIONS_PER_TOPIC_MAX}",
                field="count",
                limit=limits.PARTITIONS_PER_TOPIC_MAX,
            )
        self._check_replicas((count - view.partitions) * view.replication_factor, "count")
        await self._ctx.metadata.propose(AddPartitions(name, count, wall_ms()))
        await self._reconciler.reconcile()
        await self._ctx.replicas.wait_for_leaders(name)
        return self.describe_topic(name)

    async def delete_topic(self, name: str) -> None:
        self._routing.topic(name)
        await self._ctx.metadata.propose(DeleteTopic(name, wall_ms()))
        await self._reconciler.reconcile()
        _log.info("deleted topic %s", name)

    def exists(self, name: str) -> bool:
        """Whether the catalogue as this broker applied it holds topic `name`."""
        return self._routing.view(name) is not None

    async def topic_for_produce(self, name: str) -> TopicView:
        """The topic a produce names; created with the defaults if auto_create_topics."""
        self._ctx.check_ready()
        view = self._routing.view(name)
        if view is not None:
            return view
        if not self._ctx.config.auto_create_topics:
            raise errors.TopicNotFound(
                f"topic {name!r} does not exist and auto_create_topics is off", field="topic"
            )
        with contextlib.suppress(errors.TopicAlreadyExists):  # a concurrent produce made it
            await self.create_topic(name)
        return self._routing.topic(name)


def _tiered_fields(local: PartitionReplica | None) -> tuple[int | None, int | None, int | None]:
    """remote_end_offset, local_bytes, remote_bytes of this broker's replica."""
    if local is None:
        return None, None, None
    manifest = local.remote_manifest
    return (
        manifest.end_offset if manifest.started else None,
        local.log_size_bytes,
        manifest.remote_bytes,
    )

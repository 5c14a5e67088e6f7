"""This broker's disk: its free-space level, and what the broker does about a full one.

The floor itself is log/space.py's `SpaceGuard` (in the BrokerContext): each partition
replica checks it before queueing an append (507 insufficient_storage below it), and a
follower's Raft group takes no new entries below it (raft/node.py's write gate). This
service adds the broker's side (dmq/README.md, "A full disk"):

- `report()`: the level (ok, alert, full), free bytes, floor and alert level, appends
  refused (appends below the floor, and acks=0 appends a full broker refused after the
  answer), and the Raft groups stalled by a failed write; `/readyz`, `GET /v1/cluster`'s
  broker list (through the heartbeat) and `dmq cluster status` show it;
- `storage_loop()`: every STORAGE_CHECK_INTERVAL_S, logs level changes and, while the disk
  is full, hands the leadership of the partitions led here to a member with space (a
  leader that cannot write stalls its group; a follower with space can go on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from dmq.broker.context import BrokerContext
from log.space import StorageLevel

_log = logging.getLogger("dmq.broker")

STORAGE_CHECK_INTERVAL_S = 1.0  # level checks, and leadership hand-offs while full


class StorageService:
    """The broker's disk level and its hand-offs while full (module docstring)."""

    def __init__(self, ctx: BrokerContext, acks0_refused: Callable[[], int]) -> None:
        self._ctx = ctx
        self._level: StorageLevel = "ok"
        # acks=0 appends forwarded to a full broker after the answer (the produce service
        # counts them): never silently dropped.
        self._acks0_refused = acks0_refused
        self.leadership_handoffs = 0

    def report(self) -> dict[str, Any]:
        space = self._ctx.space
        try:
            now = space.report()
        except OSError as exc:  # the data directory is gone or unreadable
            return {"level": "full", "error": str(exc)}
        node = self._ctx.raft_node
        return {
            "level": now.level,
            "free_bytes": now.free_bytes,
            "total_bytes": now.total_bytes,
            "floor_bytes": now.floor_bytes,
            "alert_bytes": now.alert_bytes,
            "refused_appends": space.refused_appends,
            "refused_bytes": space.refused_bytes,
            "acks0_refused": self._acks0_refused(),
            "stalled_groups": node.stalled_groups() if node is not None else [],
            "leadership_handoffs": self.leadership_handoffs,
        }

    async def storage_loop(self) -> None:
        while True:
            await asyncio.sleep(STORAGE_CHECK_INTERVAL_S)
            try:
                await self._check()
            except Exception:  # one failed look must not end the duty
                _log.exception("storage check failed")

    async def _check(self) -> None:
        now = self._ctx.space.report(fresh=True)
        if now.level != self._level:
            log = _log.warning if now.level != "ok" else _log.info
            log(
                "broker %s: storage %s -> %s (%d bytes free, floor %d, alert %d)",
                self._ctx.node_id,
                self._level,
                now.level,
                now.free_bytes,
                now.floor_bytes,
                now.alert_bytes,
            )
            self._level = now.level
        if now.level == "full":
            await self._hand_off_leadership()

    async def _hand_off_leadership(self) -> None:
        """Each partition led here goes to a member whose disk is not reported full
        (pysyncobj refuses a member that is not caught up: tried again next check)."""
        node = self._ctx.raft_node
        if node is None or self._ctx.metadata_service is None:
            return
        brokers = self._ctx.metadata.state.brokers
        for replica in self._ctx.replicas.values():
            raft = replica.raft
            if raft is None or replica.closed or not raft.status().is_leader:
                continue
            targets = [
                m
                for m in replica.members
                if m != self._ctx.node_id
                and (m not in brokers or brokers[m].storage_level != "full")
            ]
            for target in targets:
                try:
                    await node.transfer_leadership(replica.group_id, target)
                except Exception as exc:  # RequestDenied, NotLeader: the next check retries
                    _log.debug("hand-off of %s to %s refused: %s", replica.name, target, exc)
                    continue
                self.leadership_handoffs += 1
                _log.info("disk full: leadership of %s handed to %s", replica.name, target)
                break

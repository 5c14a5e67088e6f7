"""Feature levels: what each broker supports, what the cluster runs at, and finalizing.

How a broker learns another's range: from its HTTP answers (dmq/compat.py,
FEATURES_HEADER, recorded by dmq/peers.py for every call), never through replicated state.
0.1.0 brokers apply every metadata command during a rolling upgrade, and a command or
snapshot field they cannot decode would split the catalogue; an answer header they never
send reads as "level 0 only" instead. The finalized level itself is replicated
(dmq/metadata/features.py), and its command is proposed only here, after every registered
broker answered a probe with a range holding the target:

1. Ask every other registered broker `GET /healthz` now (the answers carry the headers);
   one that does not answer within PROBE_TIMEOUT_S is a laggard: finalizing must not rest
   on a range remembered from before a restart.
2. The target is the level asked for, else the highest this release supports: finalizing
   means "the upgrade to this release is done", so a broker still on an older release
   must be named, not silently matched by a lower target.
3. Any broker whose range excludes the target: refused (FeatureLevelUnsupported, 409),
   naming each one, its release and its range. Nothing is proposed.
4. Else propose FinalizeFeatureLevel(target): apply raises it, never lowers it.

After finalize (level 1 and up), two rules hold on every broker of this release (what a
0.1.0 broker started afterwards meets, README.md "Releases and upgrading"):
- `peer_refusal`: a broker whose last answer named a range excluding the finalized level
  is refused as a Raft peer (raft/refusals.py), both directions of its link closed;
- internal calls signed in the plain form are refused (http_api/internal_auth.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from dmq import __version__, compat, errors
from dmq.broker.context import BrokerContext
from dmq.metadata.machine import FinalizeFeatureLevel
from dmq.metadata.service import wall_ms

# Per broker, for step 1: a broker that cannot answer a GET /healthz in this long is not
# counted as supporting anything (finalize is refused; ask again once it is back).
PROBE_TIMEOUT_S = 3.0


class FeaturesService:
    """Feature levels of this cluster (module docstring); no state of its own."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx

    def finalized_level(self) -> int:
        service = self._ctx.metadata_service
        return 0 if service is None else service.state.finalized_level

    def check_runs_at_finalized(self) -> None:
        """At start, once registered (the catalogue is then at least that recent): refuse
        to run in a cluster finalized at a level this release does not support, which
        only a later release can have finalized (a rollback past its finalize)."""
        level = self.finalized_level()
        if level > compat.FEATURE_LEVEL_MAX:
            raise errors.FeatureLevelUnsupported(
                f"the cluster is finalized at feature level {level}; this dmq {__version__} "
                f"supports feature levels {compat.FEATURE_LEVEL_MIN} to "
                f"{compat.FEATURE_LEVEL_MAX}: run a release that supports level {level} "
                f"(README.md, 'Releases and upgrading')",
                level=level,
            )

    def peer_refusal(self, peer_id: str) -> str | None:
        """Why `peer_id` may not be a Raft peer now (None: it may). On the Raft tick
        thread: it reads one catalogue reference and two dicts, and never raises. A peer
        not heard from over HTTP is let in: refusing it until its first answer would stop
        a whole cluster restarting at once."""
        level = self.finalized_level()
        broker = self._ctx.metadata.state.brokers.get(peer_id) if level else None
        levels = None if broker is None else self._ctx.peers.feature_ranges.get(broker.http_addr)
        if broker is None or levels is None or levels[0] <= level <= levels[1]:
            return None
        release = self._ctx.peers.versions.get(broker.http_addr, "unknown")
        return (
            f"it runs dmq {release}, which supports feature levels {levels[0]} to "
            f"{levels[1]}, and the cluster is finalized at feature level {level}: upgrade "
            f"it to a release that supports level {level} (README.md, 'Releases and "
            f"upgrading')"
        )

    async def _probe(self) -> dict[str, tuple[str | None, compat.LevelRange | None]]:
        """Step 1: node id -> (release, range) of every registered broker, as it answers
        now (None, None: no answer)."""
        me = self._ctx.config.node_id
        found: dict[str, tuple[str | None, compat.LevelRange | None]] = {
            me: (__version__, (compat.FEATURE_LEVEL_MIN, compat.FEATURE_LEVEL_MAX))
        }
        peers = self._ctx.peers

        async def ask(node_id: str, http_addr: str) -> None:
            found[node_id] = (None, None)
            with contextlib.suppress(errors.DmqError):
                await peers.call("GET", http_addr, "/healthz", timeout_s=PROBE_TIMEOUT_S)
                found[node_id] = (
                    peers.versions.get(http_addr),
                    peers.feature_ranges.get(http_addr),
                )

        brokers = self._ctx.metadata.state.brokers.values()
        await asyncio.gather(*(ask(b.broker_id, b.http_addr) for b in brokers if b.broker_id != me))
        return found

    async def features(self) -> dict[str, Any]:
        """`GET /v1/cluster/features`: each broker's range and release as it answers now,
        the finalized level, and the highest level every broker supports now."""
        found = await self._probe()
        ranges = [levels for _, levels in found.values()]
        finalizable = (
            None
            if None in ranges
            else compat.highest_common_level([r for r in ranges if r is not None])
        )
        level = self.finalized_level()
        return {
            "finalized_level": level,
            "finalized_meaning": compat.FEATURE_LEVELS.get(level, "unknown to this release"),
            "finalizable_level": finalizable,
            "levels": {str(k): v for k, v in sorted(compat.FEATURE_LEVELS.items())},
            "brokers": [
                {
                    "node_id": node_id,
                    "version": release,
                    "reachable": levels is not None,
                    "min_level": None if levels is None else levels[0],
                    "max_level": None if levels is None else levels[1],
                }
                for node_id, (release, levels) in sorted(found.items())
            ],
        }

    async def finalize(self, level: int | None) -> dict[str, Any]:
        """Steps 2-4: raise the finalized level to `level` (None: this release's highest);
        FeatureLevelUnsupported naming the laggards, nothing proposed."""
        found = await self._probe()
        if level is None:
            level = compat.FEATURE_LEVEL_MAX
        refused = compat.laggards(level, found)
        if refused:
            names = "; ".join(f"{node_id} {why}" for node_id, why in refused.items())
            raise errors.FeatureLevelUnsupported(
                f"cannot finalize feature level {level}: {names}; upgrade (or bring back) "
                f"every broker first (README.md, 'Releases and upgrading')",
                level=level,
                laggards=refused,
            )
        await self._ctx.metadata.propose(FinalizeFeatureLevel(level, wall_ms()))
        return {"finalized_level": self.finalized_level(), "requested_level": level}

"""The features domain of the metadata catalogue: the cluster's finalized feature level.

As Kafka's `metadata.version`: each release supports a range of feature levels
(dmq/compat.py, FEATURE_LEVEL_MIN..FEATURE_LEVEL_MAX) and the cluster runs at one, the
*finalized* level, which turns on what 0.1.0 cannot do (compat.FEATURE_LEVELS).

Commands: `FinalizeFeatureLevel`. State: `MetadataState.finalized_level`, 0 until an
operator finalizes; in the catalogue JSON under `features` (every broker, observers too,
enforce it), left out while 0 so that a catalogue never finalized snapshots
byte-identically to 0.1.0's, which is what lets 0.1.0 brokers keep applying it.

Why a new command is safe in a mixed cluster: it is proposed only when every registered
broker answers with a range holding the target (dmq/broker/features.py asks each one over
HTTP first and refuses, 409, naming the laggards), so no 0.1.0 broker is in the cluster
when it commits. A 0.1.0 broker started afterwards on an old data directory meets it in
the journal and rejects it as an unknown command type (its Machine answers Rejected, it
does not crash), and is then refused as a Raft peer by the others (compat.FEATURE_LEVELS).

Rules apply() keeps, whatever commands arrive:

- the level only grows: a lower one is rejected (`feature_level_lower`), state unchanged;
- the same level again is applied and changes nothing (a retried finalize succeeds);
- apply never consults this release's own range: replicas of different releases must
  reach the same state, so the range is the proposer's check, not apply's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from dmq.compat import FEATURE_LEVEL_LIMIT
from dmq.metadata.codec import FieldCodec
from dmq.metadata.registry import CommandSpec, Domain
from dmq.metadata.state import (
    COMMAND_VERSION,
    REJECT_INVALID_ARGUMENT,
    Applied,
    MetadataState,
    Outcome,
    Rejected,
    bump,
)

REJECT_FEATURE_LEVEL_LOWER: Final = "feature_level_lower"


@dataclass(frozen=True, slots=True)
class FinalizeFeatureLevel:
    """Raise the cluster's finalized feature level to `level` (never lower it)."""

    level: int
    now_ms: int
    version: int = COMMAND_VERSION


FeaturesCommand = FinalizeFeatureLevel

CODEC: Final = FieldCodec({"level": "int", "now_ms": "int"})


def _finalize(state: MetadataState, cmd: FinalizeFeatureLevel, now_ms: int) -> Outcome:
    if not 0 <= cmd.level <= FEATURE_LEVEL_LIMIT:
        return state, Rejected(
            REJECT_INVALID_ARGUMENT, f"level must be 0-{FEATURE_LEVEL_LIMIT}", "level"
        )
    if cmd.level < state.finalized_level:
        return state, Rejected(
            REJECT_FEATURE_LEVEL_LOWER,
            f"the cluster is finalized at feature level {state.finalized_level}; a "
            f"finalized level is never lowered (README.md, 'Releases and upgrading')",
            "level",
        )
    if cmd.level == state.finalized_level:
        return state, Applied(state.metadata_version)
    new_state = bump(state, now_ms, finalized_level=cmd.level)
    return new_state, Applied(new_state.metadata_version)


def _to_json(state: MetadataState) -> dict[str, Any]:
    # Left out at 0: a catalogue never finalized is written back byte for byte as 0.1.0's.
    return {"features": {"finalized_level": state.finalized_level}} if state.finalized_level else {}


def _from_json(doc: dict[str, Any], state: MetadataState) -> MetadataState:
    features = doc.get("features", {})  # absent: never finalized (or written by 0.1.0)
    level = features.get("finalized_level", 0) if isinstance(features, dict) else None
    if not isinstance(level, int) or isinstance(level, bool) or level < 0:
        raise ValueError(f"snapshot features must hold a finalized_level >= 0, not {features!r}")
    return replace(state, finalized_level=level) if level else state


DOMAIN: Final = Domain(
    name="features",
    commands=(CommandSpec(FinalizeFeatureLevel, _finalize, CODEC),),
    json_keys=("features",),
    to_json=_to_json,
    from_json=_from_json,
    in_catalogue=True,
)

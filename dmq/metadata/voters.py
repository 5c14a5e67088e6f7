"""The voters domain of the metadata catalogue: the metadata group's own voter set (pure,
deterministic).

Group 0 (the metadata group) changes its own members with the same single-server Raft
changes as a partition group (raft/membership.py), driven by its leader
(dmq/broker/operations.py). The catalogue keeps two sets so that every broker, voter or
observer, can see the change and a new metadata leader can resume it:

- `MetadataState.voters`: group 0's configuration as last recorded. The driver proposes
  `AlterMetadataVoters` with pysyncobj's configuration after each Raft change committed
  (and once at the start, when the catalogue has none: the bootstrap record), so it is at
  most the one change in flight behind the Raft configuration;
- `MetadataState.voters_target`: the set an operator asked for with
  `ChangeMetadataVoters`, `()` when no change runs.

The invariants apply() keeps whatever commands arrive:

- `voters` changes by exactly one broker per record once recorded (Raft's single-server
  change), and only `AlterMetadataVoters` changes it: it records a fact, so it checks
  neither registration nor the target;
- a record whose set equals the target ends the change (`voters_target = ()`);
- a target names 1..METADATA_VOTERS_MAX distinct registered brokers, none decommissioning
  unless already a recorded voter (so a voter's swap can be rolled back);
  a running change can be repeated (no-op) or rolled back (target = the recorded voters),
  not replaced by another (`metadata_voters_change_running`): the driver must never be
  led to remove a member that the recorded set does not show yet;
- a broker in `voters` or `voters_target` cannot be unregistered (dmq/metadata/reassignment.py).

Commands: `ChangeMetadataVoters`, `AlterMetadataVoters`. State: `MetadataState.voters` and
`voters_target`, in the catalogue JSON (observers need them to find the voters); a
snapshot from before voter changes has neither and loads with none recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from dmq.metadata.codec import FieldCodec
from dmq.metadata.registry import CommandSpec, Domain
from dmq.metadata.state import (
    COMMAND_VERSION,
    REJECT_INVALID_ARGUMENT,
    REJECT_INVALID_REPLICAS,
    REJECT_UNKNOWN_BROKER,
    Applied,
    MetadataState,
    Outcome,
    Rejected,
    bump,
)

REJECT_VOTERS_CHANGE_RUNNING: Final = "metadata_voters_change_running"
REJECT_VOTERS_UNKNOWN: Final = "metadata_voters_unknown"

# Raft needs a majority of the voters for every commit: more voters tolerate more failures
# but make each commit wait for more acknowledgements. KRaft and etcd advise 3 or 5; 7 is
# the most this accepts.
METADATA_VOTERS_MAX: Final = 7


@dataclass(frozen=True, slots=True)
class ChangeMetadataVoters:
    """Start changing the metadata group's voters to `voters`: an operation that
    dmq/broker/operations.py carries out, one Raft membership change at a time."""

    voters: tuple[str, ...]
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class AlterMetadataVoters:
    """The metadata group's Raft configuration, recorded by its leader after a change
    committed (and once at the start): the recorded set plus or minus one broker."""

    voters: tuple[str, ...]
    now_ms: int
    version: int = COMMAND_VERSION


VotersCommand = ChangeMetadataVoters | AlterMetadataVoters

CODEC: Final = FieldCodec({"voters": "strs", "now_ms": "int"})


def apply_voters_command(
    state: MetadataState, cmd: ChangeMetadataVoters | AlterMetadataVoters, now_ms: int
) -> Outcome:
    voters = tuple(sorted(cmd.voters))
    if not voters or len(set(voters)) != len(voters) or not all(voters):
        return state, Rejected(
            REJECT_INVALID_ARGUMENT, "voters must be distinct, non-empty broker ids", "voters"
        )
    if isinstance(cmd, AlterMetadataVoters):
        return _record(state, voters, now_ms)
    return _change(state, voters, now_ms)


def _record(state: MetadataState, voters: tuple[str, ...], now_ms: int) -> Outcome:
    """AlterMetadataVoters: the Raft configuration after a committed change."""
    if state.voters and len(set(voters) ^ set(state.voters)) > 1:
        return state, Rejected(
            REJECT_INVALID_REPLICAS,
            f"voters {list(voters)} differ from the recorded {list(state.voters)} by more "
            "than one broker (group 0 changes one member at a time)",
            "voters",
        )
    target = () if set(voters) == set(state.voters_target) else state.voters_target
    if voters == state.voters and target == state.voters_target:
        return state, Applied(state.metadata_version)  # already recorded
    return _bumped(state, now_ms, voters, target)


def _change(state: MetadataState, voters: tuple[str, ...], now_ms: int) -> Outcome:
    """ChangeMetadataVoters: the operator's target (rules in the module docstring)."""
    rejected = _check_target(state, voters)
    if rejected is not None:
        return state, rejected
    if not state.voters_target:
        if voters == state.voters:
            return state, Applied(state.metadata_version)  # nothing to change
        return _bumped(state, now_ms, state.voters, voters)
    if voters == state.voters_target:
        return state, Applied(state.metadata_version)  # the running change, repeated
    if voters == state.voters:  # roll back: the driver returns to the recorded set
        return _bumped(state, now_ms, state.voters, voters)
    return state, Rejected(
        REJECT_VOTERS_CHANGE_RUNNING,
        f"a change of the metadata voters to {list(state.voters_target)} is running "
        f"(recorded: {list(state.voters)}); wait for it, or roll it back by asking for "
        "the recorded set",
        "voters",
    )


def _check_target(state: MetadataState, voters: tuple[str, ...]) -> Rejected | None:
    if not state.voters:
        return Rejected(
            REJECT_VOTERS_UNKNOWN,
            "the metadata group has not recorded its voters yet; retry",
            "voters",
        )
    if len(voters) > METADATA_VOTERS_MAX:
        return Rejected(
            REJECT_INVALID_ARGUMENT,
            f"{len(voters)} voters, at most {METADATA_VOTERS_MAX}",
            "voters",
        )
    unknown = [b for b in voters if b not in state.brokers]
    if unknown:
        return Rejected(REJECT_UNKNOWN_BROKER, f"unknown broker(s) {unknown}", "voters")
    # A decommissioning broker joins no voter set; one that is a recorded voter may stay
    # in a target (rolling back a swap whose replacement died must stay possible).
    leaving = [b for b in voters if state.brokers[b].decommissioning and b not in state.voters]
    if leaving:
        return Rejected(
            REJECT_INVALID_ARGUMENT, f"broker(s) {leaving} are being decommissioned", "voters"
        )
    return None


def _bumped(
    state: MetadataState, now_ms: int, voters: tuple[str, ...], target: tuple[str, ...]
) -> Outcome:
    new_state = bump(state, now_ms, voters=voters, voters_target=target)
    return new_state, Applied(new_state.metadata_version)


def _to_json(state: MetadataState) -> dict[str, Any]:
    return {"voters": list(state.voters), "voters_target": list(state.voters_target)}


def _from_json(doc: dict[str, Any], state: MetadataState) -> MetadataState:
    # A snapshot from before voter changes has neither: the leader records them.
    return replace(
        state,
        voters=tuple(doc.get("voters", ())),
        voters_target=tuple(doc.get("voters_target", ())),
    )


DOMAIN: Final = Domain(
    name="voters",
    commands=(
        CommandSpec(ChangeMetadataVoters, apply_voters_command, CODEC),
        CommandSpec(AlterMetadataVoters, apply_voters_command, CODEC),
    ),
    json_keys=("voters", "voters_target"),
    to_json=_to_json,
    from_json=_from_json,
)

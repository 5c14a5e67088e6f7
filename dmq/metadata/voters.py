"""The metadata group's voter set in the metadata state machine (pure, deterministic).

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

dmq/metadata/machine.py dispatches the two commands here; this module reads its types through
the module object (the two import each other).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from dmq.metadata import machine as md

if TYPE_CHECKING:
    from dmq.metadata.machine import (
        AlterMetadataVoters,
        ChangeMetadataVoters,
        MetadataState,
        Result,
    )

Outcome = tuple["MetadataState", "Result"]

# Raft needs a majority of the voters for every commit: more voters tolerate more failures
# but make each commit wait for more acknowledgements. KRaft and etcd advise 3 or 5; 7 is
# the most this accepts.
METADATA_VOTERS_MAX: Final = 7


def apply_voters_command(
    state: MetadataState, cmd: ChangeMetadataVoters | AlterMetadataVoters, now_ms: int
) -> Outcome:
    voters = tuple(sorted(cmd.voters))
    if not voters or len(set(voters)) != len(voters) or not all(voters):
        return state, md.Rejected(
            md.REJECT_INVALID_ARGUMENT, "voters must be distinct, non-empty broker ids", "voters"
        )
    if isinstance(cmd, md.AlterMetadataVoters):
        return _record(state, voters, now_ms)
    return _change(state, voters, now_ms)


def _record(state: MetadataState, voters: tuple[str, ...], now_ms: int) -> Outcome:
    """AlterMetadataVoters: the Raft configuration after a committed change."""
    if state.voters and len(set(voters) ^ set(state.voters)) > 1:
        return state, md.Rejected(
            md.REJECT_INVALID_REPLICAS,
            f"voters {list(voters)} differ from the recorded {list(state.voters)} by more "
            "than one broker (group 0 changes one member at a time)",
            "voters",
        )
    target = () if set(voters) == set(state.voters_target) else state.voters_target
    if voters == state.voters and target == state.voters_target:
        return state, md.Applied(state.metadata_version)  # already recorded
    return _bumped(state, now_ms, voters, target)


def _change(state: MetadataState, voters: tuple[str, ...], now_ms: int) -> Outcome:
    """ChangeMetadataVoters: the operator's target (rules in the module docstring)."""
    rejected = _check_target(state, voters)
    if rejected is not None:
        return state, rejected
    if not state.voters_target:
        if voters == state.voters:
            return state, md.Applied(state.metadata_version)  # nothing to change
        return _bumped(state, now_ms, state.voters, voters)
    if voters == state.voters_target:
        return state, md.Applied(state.metadata_version)  # the running change, repeated
    if voters == state.voters:  # roll back: the driver returns to the recorded set
        return _bumped(state, now_ms, state.voters, voters)
    return state, md.Rejected(
        md.REJECT_VOTERS_CHANGE_RUNNING,
        f"a change of the metadata voters to {list(state.voters_target)} is running "
        f"(recorded: {list(state.voters)}); wait for it, or roll it back by asking for "
        "the recorded set",
        "voters",
    )


def _check_target(state: MetadataState, voters: tuple[str, ...]) -> md.Rejected | None:
    if not state.voters:
        return md.Rejected(
            md.REJECT_VOTERS_UNKNOWN,
            "the metadata group has not recorded its voters yet; retry",
            "voters",
        )
    if len(voters) > METADATA_VOTERS_MAX:
        return md.Rejected(
            md.REJECT_INVALID_ARGUMENT,
            f"{len(voters)} voters, at most {METADATA_VOTERS_MAX}",
            "voters",
        )
    unknown = [b for b in voters if b not in state.brokers]
    if unknown:
        return md.Rejected(md.REJECT_UNKNOWN_BROKER, f"unknown broker(s) {unknown}", "voters")
    # A decommissioning broker joins no voter set; one that is a recorded voter may stay
    # in a target (rolling back a swap whose replacement died must stay possible).
    leaving = [b for b in voters if state.brokers[b].decommissioning and b not in state.voters]
    if leaving:
        return md.Rejected(
            md.REJECT_INVALID_ARGUMENT, f"broker(s) {leaving} are being decommissioned", "voters"
        )
    return None


def _bumped(
    state: MetadataState, now_ms: int, voters: tuple[str, ...], target: tuple[str, ...]
) -> Outcome:
    new_state = md.bump(state, now_ms, voters=voters, voters_target=target)
    return new_state, md.Applied(new_state.metadata_version)

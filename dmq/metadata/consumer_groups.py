"""The consumer-groups domain of the metadata catalogue: groups/ registered with the shell.

groups/ is the pure group protocol (membership, generations, assignment, offsets: see
groups/README.md); this module only plugs it in. Commands: the nine of
groups/commands.py, in their own field codec but the catalogue's envelope. State:
`MetadataState.groups`, in the snapshot but not in the catalogue observers follow: offset
commits arrive at a high rate and must not make every observer download the catalogue.

Rules apply() keeps:

- a group command moves `clock_ms` and the groups only, never `metadata_version`;
- `now_ms` handed to groups/ is never below the state's clock (the shell's step 3);
- a refusal from groups/ (a `Rejected` event) becomes a `Rejected` result and leaves the
  whole state unchanged;
- `UpdateTopics` is internal: the groups learn the partition set from the catalogue after
  every command that changes it (`follow_partitions`, in the same apply, on every replica
  alike), and a proposed one is refused.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from dmq.metadata.codec import CommandDecodeError
from dmq.metadata.registry import CommandSpec, Domain
from dmq.metadata.state import (
    COMMAND_VERSIONS_SUPPORTED,
    PARTITION_GONE,
    REJECT_INVALID_ARGUMENT,
    REJECT_INVALID_COMMAND,
    Applied,
    MetadataState,
    Outcome,
    Rejected,
    is_int,
)
from groups import state as groups_state
from groups.commands import (
    COMMAND_TYPES,
    GroupCommand,
    GroupCommandDecodeError,
    UpdateTopics,
    decode_group_command,
    encode_group_command,
)
from groups.state import groups_from_json, groups_to_json


class GroupCodec:
    """groups/commands.py's codec, with its errors as the catalogue's."""

    def encode(self, command: Any) -> bytes:
        return encode_group_command(command)

    def decode(self, cls: type[Any], doc: dict[str, Any]) -> Any:
        try:
            return decode_group_command(doc)
        except GroupCommandDecodeError as e:
            raise CommandDecodeError(str(e)) from None

    def check(self, command: Any) -> Rejected | None:
        if command.version not in COMMAND_VERSIONS_SUPPORTED or not is_int(command.now_ms):
            return Rejected(REJECT_INVALID_COMMAND, f"version {command.version} is not supported")
        if isinstance(command, UpdateTopics):  # derived from the catalogue, never proposed
            return Rejected(REJECT_INVALID_COMMAND, "UpdateTopics is internal")
        if command.now_ms < 0:
            return Rejected(REJECT_INVALID_ARGUMENT, "now_ms must be >= 0", "now_ms")
        return None


CODEC: Final = GroupCodec()


def _apply_group(state: MetadataState, command: GroupCommand, now_ms: int) -> Outcome:
    groups, events = groups_state.apply(state.groups, replace(command, now_ms=now_ms))
    for event in events:
        if isinstance(event, groups_state.Rejected):
            return state, Rejected(event.code, event.message, event.field)
    new_state = replace(state, groups=groups, clock_ms=now_ms)
    return new_state, Applied(new_state.metadata_version, group_events=events)


def _follow_partitions(state: MetadataState) -> MetadataState:
    """Groups learn topics, partition counts and gone partitions in the same apply as the
    catalogue change, so a subscription follows them at once."""
    counts = tuple((t.name, len(t.partitions)) for t in state.topics.values())
    gone = tuple(
        (t.name, p)
        for t in state.topics.values()
        for p, placement in enumerate(t.partitions)
        if placement.status == PARTITION_GONE
    )
    update = UpdateTopics(counts, state.clock_ms, gone=gone)
    groups, _ = groups_state.apply(state.groups, update)
    return replace(state, groups=groups)


def _to_json(state: MetadataState) -> dict[str, Any]:
    return {"groups": groups_to_json(state.groups)}


def _from_json(doc: dict[str, Any], state: MetadataState) -> MetadataState:
    if "groups" not in doc:  # a snapshot from before consumer groups
        return state
    return replace(state, groups=groups_from_json(doc["groups"], state.groups.config))


DOMAIN: Final = Domain(
    name="consumer_groups",
    commands=tuple(CommandSpec(cls, _apply_group, CODEC) for cls in COMMAND_TYPES.values()),
    json_keys=("groups",),
    to_json=_to_json,
    from_json=_from_json,
    in_catalogue=False,
    follow_partitions=_follow_partitions,
)

"""The share-groups domain of the metadata catalogue: groups/share.py registered with the shell.

groups/share.py is the pure share-group machine (per-record locks, acknowledgements,
redelivery, dead letters: see its docstring and groups/README.md, "Share groups"); this
module plugs it in. Commands: the nine of groups/share_commands.py, in their own codec but
the catalogue's envelope. State: `MetadataState.share_groups`, in the snapshot but not in
the catalogue observers follow (polls and acks arrive at a high rate).

Rules apply() keeps:

- a share command moves `clock_ms` and the share groups only, never `metadata_version`;
- `now_ms` handed to groups/share.py is never below the state's clock (the shell's step 3),
  so a lock is judged expired at the same time on every replica;
- an `AcquireRecords` naming a partition the catalogue does not have (or has removed) is
  refused: share-partitions exist only for live partitions;
- a refusal leaves the whole state unchanged; `AcquireRecords` returns `ShareApplied`,
  an `Applied` carrying the records it locked (plain `Applied` keeps its repr, which the
  golden test pins);
- after every change of the partition set, share-partitions of deleted topics go
  (`follow_partitions`);
- the snapshot holds the key `share_groups` only once a share group exists, so snapshots
  of clusters that never used them stay byte-identical to those older code wrote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Final

from dmq.metadata.codec import CommandDecodeError
from dmq.metadata.registry import CommandSpec, Domain
from dmq.metadata.state import (
    COMMAND_VERSIONS_SUPPORTED,
    PARTITION_GONE,
    REJECT_INVALID_ARGUMENT,
    REJECT_INVALID_COMMAND,
    REJECT_UNKNOWN_PARTITION,
    Applied,
    MetadataState,
    Outcome,
    Rejected,
    is_int,
)
from groups import share
from groups.share_commands import (
    COMMAND_TYPES,
    STR_FIELDS,
    AcquireRecords,
    ShareCommand,
    ShareCommandDecodeError,
    decode_share_command,
    encode_share_command,
)


@dataclass(frozen=True, slots=True)
class ShareApplied(Applied):
    """An applied share command and the records it locked (`AcquireRecords` only)."""

    acquired: tuple[share.Acquired, ...] = ()


class ShareCodec:
    """groups/share_commands.py's codec, with its errors as the catalogue's."""

    def encode(self, command: Any) -> bytes:
        return encode_share_command(command)

    def decode(self, cls: type[Any], doc: dict[str, Any]) -> Any:
        try:
            return decode_share_command(doc)
        except ShareCommandDecodeError as e:
            raise CommandDecodeError(str(e)) from None

    def check(self, command: Any) -> Rejected | None:
        """A hand-built command gets the scrutiny decoding gives a received one."""
        if command.version not in COMMAND_VERSIONS_SUPPORTED or not is_int(command.now_ms):
            return Rejected(REJECT_INVALID_COMMAND, f"version {command.version} is not supported")
        try:  # the codec checks every field's kind on the way back in
            decode_share_command(_as_doc(command))
        except (ShareCommandDecodeError, TypeError, ValueError) as e:
            return Rejected(REJECT_INVALID_ARGUMENT, f"{type(command).__name__}: {e}")
        for name in STR_FIELDS & set(type(command).__dataclass_fields__):
            if not isinstance(getattr(command, name), str):
                return Rejected(REJECT_INVALID_ARGUMENT, f"{name} must be a string", name)
        if command.now_ms < 0:
            return Rejected(REJECT_INVALID_ARGUMENT, "now_ms must be >= 0", "now_ms")
        return None


def _as_doc(command: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(encode_share_command(command))
    return doc


CODEC: Final = ShareCodec()


def _apply_share(state: MetadataState, command: ShareCommand, now_ms: int) -> Outcome:
    if isinstance(command, AcquireRecords):
        for topic, partition, *_ in command.partitions:
            info = state.topics.get(topic)
            if (
                info is None
                or not 0 <= partition < len(info.partitions)
                or info.partitions[partition].status == PARTITION_GONE
            ):
                return state, Rejected(
                    REJECT_UNKNOWN_PARTITION, f"{topic}-{partition} does not exist", "partitions"
                )
    groups, result = share.apply(state.share_groups, replace(command, now_ms=now_ms))
    if isinstance(result, share.Rejected):
        return state, Rejected(result.code, result.message, result.field)
    new_state = replace(state, share_groups=groups, clock_ms=now_ms)
    return new_state, ShareApplied(new_state.metadata_version, acquired=result)


def _follow_partitions(state: MetadataState) -> MetadataState:
    counts = {t.name: len(t.partitions) for t in state.topics.values()}
    return replace(state, share_groups=share.follow_topics(state.share_groups, counts))


def _to_json(state: MetadataState) -> dict[str, Any]:
    if not state.share_groups.groups:  # older snapshots stay byte-identical
        return {}
    return {"share_groups": share.share_groups_to_json(state.share_groups)}


def _from_json(doc: dict[str, Any], state: MetadataState) -> MetadataState:
    if "share_groups" not in doc:  # a snapshot from before share groups, or with none
        return state
    limits = state.share_groups.limits
    return replace(state, share_groups=share.share_groups_from_json(doc["share_groups"], limits))


DOMAIN: Final = Domain(
    name="share_groups",
    commands=tuple(CommandSpec(cls, _apply_share, CODEC) for cls in COMMAND_TYPES.values()),
    json_keys=("share_groups",),
    to_json=_to_json,
    from_json=_from_json,
    in_catalogue=False,
    follow_partitions=_follow_partitions,
)

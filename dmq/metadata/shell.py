"""The machine shell of the metadata catalogue: decode, dispatch, snapshot, restore.

It knows what every command has in common and nothing of what any one means: it finds a
command's `CommandSpec` in a `Registry` (dmq/metadata/registry.py) by its type name and
runs the domain's apply. It imports no domain; dmq/metadata/catalogue.py builds the
registry from them and dmq/metadata/machine.py binds the two.

Apply, in order (every replica does the same, so all reach the same state):

1. Look the command's exact type up; an unregistered one is rejected.
2. `spec.codec.check`: version, field kinds, `now_ms >= 0`. A hand-built command gets the
   scrutiny decoding gives a received one.
3. `now_ms = max(state.clock_ms, command.now_ms)`: time never goes back, whatever the
   leader's clock said.
4. The domain's apply: deterministic (no clock, randomness, environment or I/O) and
   total: a user error comes back as `Rejected` with the state it was given.
5. If the spec changes the partition set and was applied, each domain with
   `follow_partitions` updates, in registration order, in the same step.

Snapshot: the shell's keys (format, version, config, metadata_version, clock_ms), then
each domain's JSON, as compact key-sorted JSON. `state_to_json` is the catalogue that
observers follow: the domains `in_catalogue` only. Restore reads the shell's keys, then
each domain's, in registration order.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any, Final

from dmq.compat import too_new_message
from dmq.metadata.codec import CommandDecodeError, dumps, parse_envelope
from dmq.metadata.registry import Registry
from dmq.metadata.state import (
    REJECT_INVALID_COMMAND,
    Applied,
    MetadataConfig,
    MetadataState,
    Outcome,
    Rejected,
    Result,
)

SNAPSHOT_FORMAT: Final = "dmq-metadata"
SNAPSHOT_VERSION: Final = 1


def apply(registry: Registry, state: MetadataState, command: Any) -> Outcome:
    """The state after `command` and its result. Never raises for a bad command."""
    spec = registry.spec_of(command)
    if spec is None:
        return state, Rejected(REJECT_INVALID_COMMAND, f"unknown command {type(command).__name__}")
    rejected = spec.codec.check(command)
    if rejected is not None:
        return state, rejected
    now_ms = max(state.clock_ms, command.now_ms)
    new_state, result = spec.apply(state, command, now_ms)
    if spec.changes_partitions and isinstance(result, Applied):
        for domain in registry.domains:
            if domain.follow_partitions is not None:
                new_state = domain.follow_partitions(new_state)
    return new_state, result


def encode_command(registry: Registry, command: Any) -> bytes:
    """`{"type": ..., "version": ..., "fields": {...}}` as compact, key-sorted JSON."""
    spec = registry.spec_of(command)
    if spec is None:
        raise TypeError(f"{type(command).__name__} is not a registered metadata command")
    return spec.codec.encode(command)


def decode_command(registry: Registry, data: bytes) -> Any:
    """The command in `data`; raises CommandDecodeError naming what is wrong."""
    doc = parse_envelope(data)
    type_name = doc["type"]
    spec = registry.spec_named(type_name) if isinstance(type_name, str) else None
    if spec is None:
        raise CommandDecodeError(f"unknown command type {type_name!r}")
    return spec.codec.decode(spec.cls, doc)


def state_to_json(registry: Registry, state: MetadataState) -> dict[str, Any]:
    """The catalogue observers follow: the shell's keys and the domains `in_catalogue`."""
    doc: dict[str, Any] = {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "config": {f.name: getattr(state.config, f.name) for f in fields(state.config)},
        "metadata_version": state.metadata_version,
        "clock_ms": state.clock_ms,
    }
    for domain in registry.domains:
        if domain.in_catalogue and domain.to_json is not None:
            doc.update(domain.to_json(state))
    return doc


def state_from_json(registry: Registry, doc: dict[str, Any]) -> MetadataState:
    """Inverse of state_to_json; raises ValueError on a snapshot of another format."""
    found = doc.get("version")
    if doc.get("format") == SNAPSHOT_FORMAT and isinstance(found, int) and found > SNAPSHOT_VERSION:
        raise ValueError(too_new_message("metadata snapshot", found, SNAPSHOT_VERSION))
    if doc.get("format") != SNAPSHOT_FORMAT or doc.get("version") != SNAPSHOT_VERSION:
        raise ValueError(
            f"not a {SNAPSHOT_FORMAT} v{SNAPSHOT_VERSION} snapshot: "
            f"{doc.get('format')!r} v{doc.get('version')!r}"
        )
    state = MetadataState(
        config=MetadataConfig(**doc["config"]),
        metadata_version=doc["metadata_version"],
        clock_ms=doc["clock_ms"],
    )
    return _read_domains(registry, doc, state, in_catalogue=True)


def _read_domains(
    registry: Registry, doc: dict[str, Any], state: MetadataState, in_catalogue: bool
) -> MetadataState:
    for domain in registry.domains:
        if domain.in_catalogue == in_catalogue and domain.from_json is not None:
            state = domain.from_json(doc, state)
    return state


class Machine:
    """A raft StateMachine over a registry: bytes in, `Applied | Rejected` out.

    `state` is replaced by one reference assignment per command, so readers on other
    threads always see a whole state (dmq/metadata/state.py)."""

    def __init__(self, registry: Registry, config: MetadataConfig | None = None) -> None:
        self.registry: Final = registry
        self.state = MetadataState(config=config or MetadataConfig())

    def apply(self, command: bytes) -> Result:
        try:
            decoded = decode_command(self.registry, command)
        except CommandDecodeError as e:
            return Rejected(REJECT_INVALID_COMMAND, str(e))
        self.state, result = apply(self.registry, self.state, decoded)
        return result

    def snapshot(self) -> bytes:
        doc = state_to_json(self.registry, self.state)
        for domain in self.registry.domains:
            if not domain.in_catalogue and domain.to_json is not None:
                doc.update(domain.to_json(self.state))
        return dumps(doc)

    def restore(self, snapshot: bytes) -> None:
        doc = json.loads(snapshot)
        state = state_from_json(self.registry, doc)
        self.state = _read_domains(self.registry, doc, state, in_catalogue=False)

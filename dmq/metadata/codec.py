"""How catalogue commands travel: the JSON envelope, and the codec of their fields.

Wire form (the metadata journal holds it, so it never changes for a given version):
`{"type": <class name>, "version": <int>, "fields": {...}}` as compact, key-sorted UTF-8
JSON; `fields` holds every dataclass field but `version`. Consumer-group commands
(groups/commands.py) use the same envelope with their own field codec.

`FieldCodec` serves the catalogue's own domains. Each domain gives it the JSON kind of
every field of its commands, by name; a name has one kind within a domain:

| kind     | Python                           | JSON                 |
|----------|----------------------------------|----------------------|
| `str`    | str                              | string               |
| `int`    | int (not bool)                   | number               |
| `strs`   | tuple[str, ...]                  | array of strings     |
| `config` | ConfigItems (sorted pairs)       | object               |

Decoding checks kinds and refuses with `CommandDecodeError`; config *values* are left to
apply, which rejects anything but ints and strings (a Rejected result, never an exception).
`check` gives a hand-built command (one that never went through bytes) the same scrutiny
at apply, so a direct `apply(state, command)` cannot take what decoding would refuse.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Final

from dmq.metadata.state import (
    COMMAND_VERSIONS_SUPPORTED,
    REJECT_INVALID_ARGUMENT,
    REJECT_INVALID_COMMAND,
    Rejected,
    is_int,
    sorted_config,
)

ENVELOPE_KEYS: Final = frozenset({"type", "version", "fields"})
FIELD_KINDS: Final = frozenset({"str", "int", "strs", "config"})


class CommandDecodeError(ValueError):
    """The bytes are not a command this code understands (bad JSON, type, field or version)."""


def dumps(doc: Any) -> bytes:
    """Compact, key-sorted JSON: the one byte form of commands and snapshots."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def parse_envelope(data: bytes) -> dict[str, Any]:
    """The envelope in `data`, its type not yet looked up; raises CommandDecodeError."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CommandDecodeError(f"command is not JSON: {e}") from None
    if not isinstance(doc, dict) or set(doc) != ENVELOPE_KEYS:
        raise CommandDecodeError("command must be an object with type, version and fields")
    return doc


class FieldCodec:
    """Encode, decode and check the commands of one domain by their fields' kinds."""

    def __init__(self, kinds: Mapping[str, str]) -> None:
        unknown = sorted(set(kinds.values()) - FIELD_KINDS)
        if unknown:
            raise ValueError(f"unknown field kinds {unknown}")
        self.kinds: Final = dict(kinds)

    def encode(self, command: Any) -> bytes:
        body: dict[str, Any] = {}
        for f in fields(command):
            if f.name == "version":
                continue
            value = getattr(command, f.name)
            kind = self.kinds[f.name]
            body[f.name] = (
                dict(value) if kind == "config" else list(value) if kind == "strs" else value
            )
        return dumps({"type": type(command).__name__, "version": command.version, "fields": body})

    def decode(self, cls: type[Any], doc: dict[str, Any]) -> Any:
        """The command of type `cls` in an envelope whose type named it."""
        type_name = doc["type"]
        version = doc["version"]
        if not is_int(version) or version not in COMMAND_VERSIONS_SUPPORTED:
            raise CommandDecodeError(
                f"{type_name} version {version!r} is not supported "
                f"(supported: {sorted(COMMAND_VERSIONS_SUPPORTED)})"
            )
        body = doc["fields"]
        expected = {f.name for f in fields(cls)} - {"version"}
        if not isinstance(body, dict) or set(body) != expected:
            raise CommandDecodeError(f"{type_name} fields must be exactly {sorted(expected)}")
        kwargs = {name: self._decode_field(type_name, name, value) for name, value in body.items()}
        return cls(version=version, **kwargs)

    def _decode_field(self, type_name: str, name: str, value: Any) -> Any:
        kind = self.kinds[name]
        ok = (
            (kind == "str" and isinstance(value, str))
            or (kind == "int" and is_int(value))
            or (kind == "config" and isinstance(value, dict))
            or (
                kind == "strs"
                and isinstance(value, list)
                and all(isinstance(v, str) for v in value)
            )
        )
        if not ok:
            raise CommandDecodeError(f"{type_name}.{name} must be of kind {kind}, not {value!r}")
        if kind == "config":
            return sorted_config(value)  # values are checked by apply (Rejected, not raised)
        return tuple(value) if kind == "strs" else value

    def check(self, command: Any) -> Rejected | None:
        """Checks a hand-built command as decode checks a received one."""
        if command.version not in COMMAND_VERSIONS_SUPPORTED:
            return Rejected(REJECT_INVALID_COMMAND, f"version {command.version} is not supported")
        for f in fields(command):
            value = getattr(command, f.name)
            kind = self.kinds.get(f.name, "int")  # `version`, checked above, is an int
            if (kind == "int" and not is_int(value)) or (
                kind == "str" and not isinstance(value, str)
            ):
                return Rejected(REJECT_INVALID_ARGUMENT, f"{f.name} must be {kind}", f.name)
        if command.now_ms < 0:
            return Rejected(REJECT_INVALID_ARGUMENT, "now_ms must be >= 0", "now_ms")
        return None

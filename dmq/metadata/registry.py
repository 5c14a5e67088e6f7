"""What a domain of the metadata catalogue is, and the registry the machine shell
dispatches through.

A `Domain` owns commands (each a `CommandSpec`: its class, the function that applies it
and the codec that carries it), a slice of `MetadataState` and that slice's JSON. The
`Registry` is built once, from every domain, by dmq/metadata/catalogue.py; the shell
(dmq/metadata/shell.py) looks commands up in it by type name and never imports a domain.

Building a registry checks, with exceptions `python -O` cannot strip, what dispatch relies
on: every command type is registered exactly once and by its class name (the envelope's
`type`), every top-level snapshot key belongs to one domain, and domain names are distinct.
Domains run in registration order wherever order matters (restoring a snapshot, following
the partition set), so the order in catalogue.py is part of the replicated behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

from dmq.metadata.state import MetadataState, Outcome, Rejected

C = TypeVar("C")

# Top-level keys of the catalogue JSON and snapshot that the shell itself writes.
SHELL_JSON_KEYS: Final = frozenset({"format", "version", "config", "metadata_version", "clock_ms"})


class CommandCodec(Protocol):
    """How one family of commands is encoded in the envelope (dmq/metadata/codec.py)."""

    def encode(self, command: Any) -> bytes: ...

    def decode(self, cls: type[Any], doc: dict[str, Any]) -> Any:
        """The command in a parsed envelope whose `type` is `cls`'s name; raises
        CommandDecodeError."""
        ...

    def check(self, command: Any) -> Rejected | None:
        """Why apply must refuse this (perhaps hand-built) command before it runs: a wrong
        version, a field of the wrong kind, a negative `now_ms`."""
        ...


@dataclass(frozen=True, slots=True)
class CommandSpec(Generic[C]):
    """One command type: apply gets the state, the command and `now_ms` (the command's,
    never below the state's clock) and must be deterministic and never raise."""

    cls: type[C]
    apply: Callable[[MetadataState, C, int], Outcome]
    codec: CommandCodec
    # Creates, deletes or retires partitions: when it is applied, every domain that
    # follows the partition set (`Domain.follow_partitions`) updates in the same apply.
    changes_partitions: bool = False

    @property
    def name(self) -> str:
        return self.cls.__name__


@dataclass(frozen=True, slots=True)
class Domain:
    """A part of the catalogue: its commands, its slice of the state and the slice's JSON.

    `to_json` returns the top-level keys `json_keys` (a key whose value is still its
    default may be left out, so that older snapshots are written back byte for byte);
    `from_json(doc, state)`
    returns `state` with the slice read from `doc` (a snapshot from before the domain
    existed lacks its keys: it must then keep the defaults). `in_catalogue`: the keys go
    to observers too (`state_to_json`); otherwise they are only in the snapshot.
    """

    name: str
    commands: tuple[CommandSpec[Any], ...]
    json_keys: tuple[str, ...] = ()
    to_json: Callable[[MetadataState], dict[str, Any]] | None = None
    from_json: Callable[[dict[str, Any], MetadataState], MetadataState] | None = None
    in_catalogue: bool = True
    follow_partitions: Callable[[MetadataState], MetadataState] | None = None


class Registry:
    """Every domain of a catalogue, and its commands by type name."""

    def __init__(self, domains: Iterable[Domain]) -> None:
        self.domains: Final = tuple(domains)
        self._specs: Final = _index(self.domains)

    @property
    def command_types(self) -> Mapping[str, type[Any]]:
        """Type name -> command class, in registration order."""
        return {name: spec.cls for name, spec in self._specs.items()}

    def spec_named(self, type_name: str) -> CommandSpec[Any] | None:
        return self._specs.get(type_name)

    def spec_of(self, command: object) -> CommandSpec[Any] | None:
        """The spec of `command`'s exact type (a subclass is not the registered type)."""
        spec = self._specs.get(type(command).__name__)
        return spec if spec is not None and spec.cls is type(command) else None


def _index(domains: tuple[Domain, ...]) -> dict[str, CommandSpec[Any]]:
    names = [d.name for d in domains]
    _require(len(set(names)) == len(names), f"domain names must be distinct: {names}")
    specs: dict[str, CommandSpec[Any]] = {}
    owners: dict[str, str] = dict.fromkeys(SHELL_JSON_KEYS, "the shell")
    for domain in domains:
        for spec in domain.commands:
            other = specs.get(spec.name)
            _require(other is None, f"{spec.name} is registered twice ({domain.name})")
            specs[spec.name] = spec
        for key in domain.json_keys:
            _require(key not in owners, f"JSON key {key!r}: {domain.name} and {owners.get(key)}")
            owners[key] = domain.name
        _require(
            (domain.to_json is None) == (domain.from_json is None) == (not domain.json_keys),
            f"{domain.name}: json_keys, to_json and from_json go together",
        )
    return specs


def _require(condition: bool, message: str) -> None:
    """An invariant of the registry; raised, so `python -O` keeps it."""
    if not condition:
        raise ValueError(f"metadata registry: {message}")

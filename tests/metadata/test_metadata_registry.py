"""Proves that the catalogue is composed through its registry (dmq/metadata/registry.py,
catalogue.py, shell.py) as dmq/metadata/README.md says:

- every command class the domains define (and groups/commands.py's) is registered exactly
  once, under its class name, and a registry refuses a second registration, a JSON key
  claimed twice (or one of the shell's) and a repeated domain name;
- property: for every registered command type, dispatch finds its own spec, and
  decode(encode(c)) == c and encode(decode(encode(c))) == encode(c) for any field values;
- property: replayed from any command sequence, each domain's JSON has exactly its declared
  keys, and the snapshot is the shell's keys plus every domain's (the catalogue JSON only
  the domains in the catalogue);
- adding a domain is one registration: a toy domain appended to the catalogue's gets its
  commands applied, snapshotted and restored, and every other command behaves as before
  (the golden scenario replays to the same results and, toy key aside, the same snapshot).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.metadata import (
    brokers,
    consumer_groups,
    features,
    identity,
    producers,
    reassignment,
    security,
    shell,
    topics,
    transactions,
    voters,
)
from dmq.metadata.catalogue import CATALOGUE
from dmq.metadata.codec import FieldCodec
from dmq.metadata.registry import SHELL_JSON_KEYS, CommandSpec, Domain, Registry
from dmq.metadata.state import COMMAND_VERSION, Applied, MetadataState, Outcome, config_items
from groups import commands as group_commands
from groups import share_commands

DOMAIN_MODULES: Final = (
    brokers, topics, reassignment, voters, producers, consumer_groups, identity, transactions,
    security, features,
)  # fmt: skip
GOLDEN = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "wire_golden.jsonl").read_text().splitlines()
]


def _command_classes(module: ModuleType) -> set[type[Any]]:
    """The frozen dataclasses with `now_ms` and `version` that `module` defines."""
    return {
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and obj.__module__ == module.__name__
        and dataclasses.is_dataclass(obj)
        and {"now_ms", "version"} <= {f.name for f in dataclasses.fields(obj)}
    }


def test_every_command_class_is_registered_exactly_once_under_its_name() -> None:
    defined = set().union(
        *(_command_classes(m) for m in (*DOMAIN_MODULES, group_commands, share_commands))
    )
    specs = [spec for domain in CATALOGUE.domains for spec in domain.commands]
    assert sorted(s.name for s in specs) == sorted(c.__name__ for c in defined)
    assert len({s.cls for s in specs}) == len(specs)
    assert all(CATALOGUE.spec_named(c.__name__).cls is c for c in defined)  # type: ignore[union-attr]
    assert [d.name for d in CATALOGUE.domains] == [
        "brokers", "topics", "reassignment", "voters", "producers", "consumer_groups",
        "identity", "share_groups",
        "transactions", "security", "features",
    ]  # fmt: skip


def test_a_registry_refuses_what_dispatch_could_not_tell_apart() -> None:
    twice = Domain("again", (brokers.DOMAIN.commands[0],))
    with pytest.raises(ValueError, match="RegisterBroker is registered twice"):
        Registry((brokers.DOMAIN, twice))
    key = Domain("key", (), json_keys=("topics",), to_json=lambda s: {}, from_json=lambda d, s: s)
    with pytest.raises(ValueError, match="JSON key 'topics'"):
        Registry((topics.DOMAIN, key))
    shell_key = replace(key, json_keys=("clock_ms",))
    with pytest.raises(ValueError, match="JSON key 'clock_ms'"):
        Registry((shell_key,))
    with pytest.raises(ValueError, match="domain names must be distinct"):
        Registry((brokers.DOMAIN, replace(topics.DOMAIN, name="brokers")))
    with pytest.raises(ValueError, match="go together"):
        Registry((replace(key, json_keys=("k",), from_json=None),))


# --- Round trip of every registered command type --------------------------------------------

_KIND_VALUES: Final[dict[str, st.SearchStrategy[Any]]] = {
    "str": st.text(max_size=8),
    "int": st.integers(),
    "strs": st.lists(st.text(max_size=4), max_size=4).map(tuple),
    "config": st.dictionaries(
        st.text(max_size=6), st.one_of(st.integers(), st.text(max_size=6)), max_size=3
    ).map(config_items),
    "counts": st.lists(st.tuples(st.text(max_size=4), st.integers()), max_size=3).map(tuple),
    "offsets": st.lists(
        st.tuples(st.text(max_size=4), st.integers(), st.integers()), max_size=3
    ).map(tuple),
    "positions": st.lists(
        st.tuples(st.text(max_size=4), st.integers(), st.integers()), max_size=3
    ).map(tuple),
    "acquire": st.lists(
        st.tuples(
            st.text(max_size=4),
            st.integers(),
            st.integers(),
            st.lists(st.integers(), max_size=3).map(tuple),
            st.integers(),
        ),
        max_size=3,
    ).map(tuple),  # fmt: skip
    "acks": st.lists(
        st.tuples(
            st.text(max_size=4), st.integers(), st.integers(), st.text(max_size=6), st.integers()
        ),
        max_size=3,
    ).map(tuple),
}


def _kind(spec: CommandSpec[Any], name: str) -> str:
    if isinstance(spec.codec, FieldCodec):
        return spec.codec.kinds[name]
    if spec.cls.__name__ in share_commands.COMMAND_TYPES:
        return share_commands.field_kind(spec.cls, name)
    return group_commands.field_kind(spec.cls, name)


def _commands_of(spec: CommandSpec[Any]) -> st.SearchStrategy[Any]:
    kwargs = {
        f.name: _KIND_VALUES[_kind(spec, f.name)]
        for f in dataclasses.fields(spec.cls)
        if f.name != "version"
    }
    return st.builds(spec.cls, **kwargs)


any_command = st.sampled_from(
    [spec for domain in CATALOGUE.domains for spec in domain.commands]
).flatmap(_commands_of)


@settings(max_examples=500, deadline=None)
@given(command=any_command)
def test_every_registered_command_round_trips_through_its_spec(command: Any) -> None:
    spec = CATALOGUE.spec_of(command)
    assert spec is not None and spec.cls is type(command)
    data = shell.encode_command(CATALOGUE, command)
    assert json.loads(data)["type"] == spec.name
    decoded = shell.decode_command(CATALOGUE, data)
    assert decoded == command
    assert shell.encode_command(CATALOGUE, decoded) == data


# --- Each domain's JSON slice ---------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(steps=st.lists(st.integers(0, len(GOLDEN) - 1), max_size=40))
def test_each_domain_writes_exactly_its_keys(steps: list[int]) -> None:
    machine = shell.Machine(CATALOGUE)
    for step in steps or range(len(GOLDEN)):
        machine.apply(GOLDEN[step]["command"].encode())
    # A domain writes its keys and no other; one still at its default may be left out
    # (identity's cluster_id before FormCluster: older snapshots stay byte-identical).
    keys: set[str] = set(SHELL_JSON_KEYS)
    in_catalogue: set[str] = set()
    for domain in CATALOGUE.domains:
        if domain.to_json is not None:
            written = set(domain.to_json(machine.state))
            assert written <= set(domain.json_keys), domain.name
            keys |= written
            in_catalogue |= written if domain.in_catalogue else set()
    assert set(json.loads(machine.snapshot())) == keys
    assert set(shell.state_to_json(CATALOGUE, machine.state)) == SHELL_JSON_KEYS | in_catalogue


# --- A new domain is one registration -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ping:
    """The toy domain's one command: it only moves the clock. Its JSON is derived from the
    state (a real domain with state adds its field to MetadataState, README step 3)."""

    note: str
    now_ms: int
    version: int = COMMAND_VERSION


def _ping(state: MetadataState, cmd: Ping, now_ms: int) -> Outcome:
    new_state = replace(state, clock_ms=now_ms)
    return new_state, Applied(new_state.metadata_version)


TOY = Domain(
    name="toy",
    commands=(CommandSpec(Ping, _ping, FieldCodec({"note": "str", "now_ms": "int"})),),
    json_keys=("toy",),
    to_json=lambda state: {"toy": {"brokers": len(state.brokers)}},
    from_json=lambda doc, state: state,
    in_catalogue=False,
)


def test_a_domain_appended_to_the_catalogue_changes_nothing_else() -> None:
    extended = Registry((*CATALOGUE.domains, TOY))
    machine = shell.Machine(extended)
    for line in GOLDEN:
        assert repr(machine.apply(line["command"].encode())) == line["result"]
        snapshot = json.loads(machine.snapshot())
        assert snapshot.pop("toy") == {"brokers": len(machine.state.brokers)}
        digest = hashlib.sha256(
            json.dumps(snapshot, sort_keys=True, separators=(",", ":")).encode()
        )
        assert digest.hexdigest() == line["snapshot_sha256"]
    assert isinstance(machine.apply(shell.encode_command(extended, Ping("hi", 9_000))), Applied)
    assert machine.state.clock_ms == 9_000
    restored = shell.Machine(extended)
    restored.restore(machine.snapshot())
    assert restored.state == machine.state and restored.snapshot() == machine.snapshot()
    assert CATALOGUE.spec_named("Ping") is None  # the catalogue itself is untouched

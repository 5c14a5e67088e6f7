"""Proves that the catalogue's wire forms are the ones older code wrote (journals and
snapshots on disk must open unchanged), against golden files written at commit ff65165 by
tests/metadata/data/make_wire_golden.py:

- every golden command decodes and encodes back to the same bytes;
- replayed in order, each command gives the same result (its repr) and the same snapshot
  (its sha256) as then, and the final snapshot and catalogue JSON are byte-identical;
- the golden snapshot restores and snapshots back to the same bytes;
- a snapshot from before voters, consumer groups or producer ids (keys absent, or a
  transactional id without its last use) restores with those at their defaults.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from immutables import Map

from dmq.metadata.machine import (
    MetadataMachine,
    decode_command,
    encode_command,
    state_from_json,
    state_to_json,
)
from groups.state import GroupsState

DATA = Path(__file__).parent / "data"
GOLDEN = [json.loads(line) for line in (DATA / "wire_golden.jsonl").read_text().splitlines()]
SNAPSHOT = (DATA / "wire_golden_snapshot.json").read_bytes().rstrip(b"\n")


def _compact(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


@pytest.mark.parametrize("line", GOLDEN, ids=lambda line: json.loads(line["command"])["type"])
def test_golden_command_decodes_and_encodes_to_the_same_bytes(line: dict[str, str]) -> None:
    data = line["command"].encode()
    assert encode_command(decode_command(data)) == data


def test_golden_scenario_replays_to_the_same_results_and_snapshots() -> None:
    machine = MetadataMachine()
    for step, line in enumerate(GOLDEN):
        result = machine.apply(line["command"].encode())
        assert repr(result) == line["result"], step
        assert hashlib.sha256(machine.snapshot()).hexdigest() == line["snapshot_sha256"], step
    assert machine.snapshot() == SNAPSHOT
    catalogue = {k: v for k, v in json.loads(SNAPSHOT).items() if k not in ("groups", "producers")}
    assert _compact(state_to_json(machine.state)) == _compact(catalogue)


def test_golden_snapshot_restores_byte_identically() -> None:
    machine = MetadataMachine()
    machine.restore(SNAPSHOT)
    assert machine.snapshot() == SNAPSHOT
    # The catalogue alone (what observers follow) is the state without groups and producers.
    catalogue = state_from_json(json.loads(SNAPSHOT))
    assert catalogue == replace(
        machine.state, groups=GroupsState(), next_producer_id=0, transactional_ids=Map()
    )


def test_snapshot_from_before_voters_groups_and_producer_ids_restores_with_defaults() -> None:
    doc = json.loads(SNAPSHOT)
    for key in ("voters", "voters_target", "groups", "producers"):
        del doc[key]
    machine = MetadataMachine()
    machine.restore(_compact(doc))
    state = machine.state
    assert (state.voters, state.voters_target) == ((), ())
    assert state.groups == GroupsState()
    assert (state.next_producer_id, dict(state.transactional_ids)) == (0, {})
    assert sorted(state.topics) == ["orders", "solo"]


def test_transactional_id_from_before_expiry_counts_as_used_at_the_snapshot_clock() -> None:
    doc = json.loads(SNAPSHOT)
    doc["producers"]["transactional_ids"] = {"old": [7, 2]}
    machine = MetadataMachine()
    machine.restore(_compact(doc))
    assert dict(machine.state.transactional_ids) == {"old": (7, 2, doc["clock_ms"])}

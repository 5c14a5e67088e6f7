"""Proves the identity domain of the catalogue (dmq/metadata/identity.py), whatever commands
arrive, FormCluster ones among the golden scenario's:

- the cluster id is set at most once: the first well-formed FormCluster wins, every later
  one is rejected (`cluster_formed`) and any malformed id is rejected, each rejection
  leaving the state unchanged;
- the id is in the catalogue observers follow, and snapshot + restore give the same bytes;
- a snapshot without it (a cluster from before cluster ids) restores with none, is
  written back byte for byte, and a FormCluster then sets it (the upgrade adopts one id);
- the broker's metadata service never adopts a catalogue of another cluster, nor deletes
  its group 0 on the word of another cluster's leader (the path by which a --join used to
  cost a broker its topics): also when it has seen no catalogue yet (a restarted observer,
  a voter whose machine holds no id), by its data directory's id; a new directory (no
  id) takes the first catalogue it reaches, as a joining broker should.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.metadata.machine import (
    REJECT_CLUSTER_FORMED,
    Applied,
    FormCluster,
    MetadataMachine,
    MetadataState,
    Rejected,
    decode_command,
    encode_command,
    is_cluster_id,
    state_from_json,
    state_to_json,
)
from dmq.metadata.service import MetadataService

DATA = Path(__file__).parent / "data"
GOLDEN = [
    json.loads(line)["command"] for line in (DATA / "wire_golden.jsonl").read_text().splitlines()
]
SNAPSHOT = (DATA / "wire_golden_snapshot.json").read_bytes().rstrip(b"\n")

good_ids = st.text("abcdef0123456789-_XYZ", min_size=1, max_size=64)
any_ids = st.one_of(good_ids, st.text(max_size=70))
steps = st.lists(
    st.one_of(
        st.builds(lambda i, t: ("form", i, t), any_ids, st.integers(0, 10**13)),
        st.integers(0, len(GOLDEN) - 1).map(lambda k: ("golden", k, 0)),
    ),
    max_size=30,
)


@settings(max_examples=120, deadline=None)
@given(steps=steps)
def test_the_cluster_id_is_set_once_by_the_first_well_formed_form_cluster(
    steps: list[tuple[str, object, int]],
) -> None:
    machine = MetadataMachine()
    first: str | None = None
    for kind, value, now_ms in steps:
        if kind == "golden":
            machine.apply(GOLDEN[int(str(value))].encode())
            continue
        before = machine.state
        command = FormCluster(str(value), now_ms)
        result = machine.apply(encode_command(command))
        assert decode_command(encode_command(command)) == command
        if first is None and is_cluster_id(str(value)):
            first = str(value)
            assert isinstance(result, Applied)
            assert machine.state.metadata_version == before.metadata_version + 1
        else:
            assert isinstance(result, Rejected)
            assert machine.state == before
            if first is not None and is_cluster_id(str(value)):
                assert result.code == REJECT_CLUSTER_FORMED
        assert machine.state.cluster_id == (first or "")
    catalogue = state_to_json(machine.state)
    assert catalogue.get("cluster_id", "") == (first or "")
    assert state_from_json(catalogue).cluster_id == (first or "")
    restored = MetadataMachine()
    restored.restore(machine.snapshot())
    assert restored.snapshot() == machine.snapshot()
    assert restored.state == machine.state


def test_a_cluster_from_before_cluster_ids_restores_unchanged_then_adopts_one() -> None:
    machine = MetadataMachine()
    machine.restore(SNAPSHOT)
    assert machine.state.cluster_id == ""
    assert machine.snapshot() == SNAPSHOT  # no key while none: byte for byte
    legacy_id = "f9fcfccf5f2048e9a155df731df1d6cc"  # the per-broker id an older dmq kept
    assert isinstance(machine.apply(encode_command(FormCluster(legacy_id, 1))), Applied)
    assert isinstance(machine.apply(encode_command(FormCluster("another", 2))), Rejected)
    assert json.loads(machine.snapshot())["cluster_id"] == legacy_id


# --- The broker's side: never a catalogue of another cluster ---------------------------------


class _Voters:
    """The metadata leader's answer to a voter checking its membership (no Raft needed)."""

    def __init__(self, state: MetadataState) -> None:
        self.view = {"leader": "n9", "members": ["n9"], "state": state_to_json(state)}

    async def __call__(self, method: str, path: str, **_: object) -> dict[str, object]:
        assert (method, path) == ("GET", "/v1/internal/metadata/voters")
        return self.view


class _Replica:
    def status(self) -> object:
        return type("Status", (), {"is_leader": False, "leader_id": None})()


def _service(state: MetadataState, own: str = "") -> MetadataService:
    """A service whose data directory names cluster `own` ("" for none)."""
    service = MetadataService(
        "n1", ["n1"], None, None, lambda: [], timeout_s=1.0,  # type: ignore[arg-type]
        on_change=lambda: None, left_marker=Path("/nonexistent/metadata_left"),
        own_cluster_id=lambda: own,
    )  # fmt: skip
    service._observed = state
    return service


def _formed(cluster_id: str, version: int) -> MetadataState:
    return replace(MetadataState(), cluster_id=cluster_id, metadata_version=version)


def test_an_observer_never_adopts_another_clusters_catalogue() -> None:
    service = _service(_formed("aaa", 3))
    service._adopt({"state": state_to_json(_formed("bbb", 99))})
    assert service.state == _formed("aaa", 3)
    service._adopt({"state": state_to_json(_formed("aaa", 4))})
    assert service.state == _formed("aaa", 4)


def test_a_voter_never_leaves_group_0_on_another_clusters_word() -> None:
    service = _service(_formed("aaa", 3))
    service._replica = _Replica()  # type: ignore[assignment]
    service._call_voters = _Voters(_formed("bbb", 99))  # type: ignore[method-assign]
    assert asyncio.run(service._maybe_become_observer()) is False
    assert service._replica is not None  # group 0 kept: nothing deleted


def test_a_restarted_observer_compares_its_first_catalogue_with_its_data_directory() -> None:
    service = _service(MetadataState(), own="aaa")  # nothing observed since the restart
    service._adopt({"state": state_to_json(_formed("bbb", 99))})
    assert service.state == MetadataState()  # another cluster's: not taken
    service._adopt({"state": state_to_json(_formed("aaa", 5))})
    assert service.state == _formed("aaa", 5)
    fresh = _service(MetadataState())  # a new data directory: joins whichever it reaches
    fresh._adopt({"state": state_to_json(_formed("bbb", 99))})
    assert fresh.state == _formed("bbb", 99)


def test_a_voter_whose_state_has_no_id_never_leaves_on_another_clusters_word() -> None:
    service = _service(MetadataState(), own="aaa")
    service._replica = _Replica()  # type: ignore[assignment]
    service._call_voters = _Voters(_formed("bbb", 99))  # type: ignore[method-assign]
    assert asyncio.run(service._maybe_become_observer()) is False
    assert service._replica is not None  # group 0 kept: nothing deleted

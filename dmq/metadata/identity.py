"""The identity domain of the metadata catalogue: the cluster id (pure, deterministic).

A cluster has one id, chosen once, when its metadata group first forms, and never changed
(Kafka's `cluster.id`, etcd's cluster ID). Every broker writes it to its data directory
(dmq/meta_file.py) and stamps it on what it sends to other brokers, so that a broker, a
data directory or a message of another cluster is refused instead of mixed in
(dmq/README.md, "Cluster identity").

Commands: `FormCluster`. State: `MetadataState.cluster_id`, "" until formed; in the
catalogue JSON under `cluster_id` (observers need it), left out while "" so that snapshots
of clusters older than the id are byte-identical when written again.

Who proposes it: any broker that, once registered, finds the catalogue without an id; it
proposes the id its data directory already holds (a broker upgraded from a version that
kept a per-broker id), else a new random one. The first command committed wins.

Rules apply() keeps, whatever commands arrive:

- `cluster_id` is set at most once: "" -> id, never id -> other id, never back to "";
- an id is 1..CLUSTER_ID_CHARS_MAX characters of [A-Za-z0-9_-] (it goes into file
  names, HTTP headers and log lines as it is);
- a `FormCluster` after the first is rejected (`cluster_formed`) with the state
  unchanged, whatever id it names: the proposer then reads the id that won.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from dmq.metadata.codec import FieldCodec
from dmq.metadata.registry import CommandSpec, Domain
from dmq.metadata.state import (
    COMMAND_VERSION,
    REJECT_INVALID_ARGUMENT,
    Applied,
    MetadataState,
    Outcome,
    Rejected,
    bump,
)

REJECT_CLUSTER_FORMED: Final = "cluster_formed"

# A uuid4's 32 hex digits fit with room to spare; the bound keeps headers and the Raft
# hello (one length byte) small.
CLUSTER_ID_CHARS_MAX: Final = 64
_ID_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def is_cluster_id(value: str) -> bool:
    """A well-formed cluster id (not checked against any cluster)."""
    return 0 < len(value) <= CLUSTER_ID_CHARS_MAX and set(value) <= _ID_CHARS


@dataclass(frozen=True, slots=True)
class FormCluster:
    """Give the cluster its id, once; later ones are rejected (`cluster_formed`)."""

    cluster_id: str
    now_ms: int
    version: int = COMMAND_VERSION


IdentityCommand = FormCluster

CODEC: Final = FieldCodec({"cluster_id": "str", "now_ms": "int"})


def _form_cluster(state: MetadataState, cmd: FormCluster, now_ms: int) -> Outcome:
    if not is_cluster_id(cmd.cluster_id):
        return state, Rejected(
            REJECT_INVALID_ARGUMENT,
            f"cluster_id must be 1-{CLUSTER_ID_CHARS_MAX} characters of [A-Za-z0-9_-]",
            "cluster_id",
        )
    if state.cluster_id:
        return state, Rejected(
            REJECT_CLUSTER_FORMED,
            f"the cluster's id is already {state.cluster_id}; it never changes",
            "cluster_id",
        )
    new_state = bump(state, now_ms, cluster_id=cmd.cluster_id)
    return new_state, Applied(new_state.metadata_version)


def _to_json(state: MetadataState) -> dict[str, Any]:
    # Left out until formed: an older cluster's snapshot is written back byte for byte.
    return {"cluster_id": state.cluster_id} if state.cluster_id else {}


def _from_json(doc: dict[str, Any], state: MetadataState) -> MetadataState:
    cluster_id = doc.get("cluster_id", "")  # absent: a cluster from before the id
    if not isinstance(cluster_id, str):
        raise ValueError(f"snapshot cluster_id must be a string, not {cluster_id!r}")
    return replace(state, cluster_id=cluster_id) if cluster_id else state


DOMAIN: Final = Domain(
    name="identity",
    commands=(CommandSpec(FormCluster, _form_cluster, CODEC),),
    json_keys=("cluster_id",),
    to_json=_to_json,
    from_json=_from_json,
    in_catalogue=True,
)

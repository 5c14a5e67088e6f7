"""The brokers domain of the metadata catalogue: who is in the cluster, where, and alive.

Commands: `RegisterBroker` (a broker announces itself or new addresses; also a heartbeat)
and `BrokerHeartbeat`; `ReportStorage` (the broker's free disk space and level). State: `MetadataState.brokers`. A broker is live while its last
heartbeat is within `MetadataConfig.broker_session_ms` of the time of a command
(`MetadataState.live_brokers`); only live brokers that are not decommissioning get new
replicas. Decommissioning and unregistering are the reassignment domain's
(dmq/metadata/reassignment.py): they depend on where replicas are.

Rules apply() keeps:

- a heartbeat, or a registration with unchanged addresses, moves `last_heartbeat_ms` and
  `clock_ms` only, never `metadata_version`: brokers heartbeat every few seconds and
  must not wake every observer's catalogue long-poll;
- a re-registration keeps `registered_ms` and the `decommissioning` flag (a restart of a
  leaving broker does not bring it back).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Final

from dmq.metadata.codec import FieldCodec
from dmq.metadata.registry import CommandSpec, Domain
from dmq.metadata.state import (
    COMMAND_VERSION,
    REJECT_INVALID_ARGUMENT,
    REJECT_UNKNOWN_BROKER,
    Applied,
    BrokerInfo,
    MetadataState,
    Outcome,
    Rejected,
    bump,
)


@dataclass(frozen=True, slots=True)
class RegisterBroker:
    """A broker announces itself (or new addresses); also counts as a heartbeat."""

    broker_id: str
    http_addr: str
    raft_addr: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class BrokerHeartbeat:
    broker_id: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class ReportStorage:
    """The broker's data directory (log/space.py): free bytes and level ("ok", "alert",
    "full"). Sent with a heartbeat when either changed; placement and leader balancing
    avoid a broker reported "full". A command of its own, not a heartbeat field: an older
    broker refuses (Rejected) a command it cannot decode, and must not refuse heartbeats."""

    broker_id: str
    free_bytes: int
    storage_level: str
    now_ms: int
    version: int = COMMAND_VERSION


BrokerCommand = RegisterBroker | BrokerHeartbeat | ReportStorage

CODEC: Final = FieldCodec(
    {
        "broker_id": "str",
        "http_addr": "str",
        "raft_addr": "str",
        "now_ms": "int",
        "free_bytes": "int",
        "storage_level": "str",
    }
)
STORAGE_LEVELS: Final = ("ok", "alert", "full")


def _register_broker(state: MetadataState, cmd: RegisterBroker, now_ms: int) -> Outcome:
    for name in ("broker_id", "http_addr", "raft_addr"):
        if not getattr(cmd, name):
            return state, Rejected(REJECT_INVALID_ARGUMENT, f"{name} must not be empty", name)
    old = state.brokers.get(cmd.broker_id)
    broker = BrokerInfo(
        cmd.broker_id,
        cmd.http_addr,
        cmd.raft_addr,
        registered_ms=old.registered_ms if old is not None else now_ms,
        last_heartbeat_ms=now_ms,
        decommissioning=old is not None and old.decommissioning,  # a restart keeps it
    )
    brokers = {**state.brokers, cmd.broker_id: broker}
    if old is not None and (old.http_addr, old.raft_addr) == (cmd.http_addr, cmd.raft_addr):
        new_state = replace(state, brokers=brokers, clock_ms=now_ms)  # a heartbeat, in effect
    else:
        new_state = bump(state, now_ms, brokers=brokers)
    return new_state, Applied(new_state.metadata_version, broker=broker)


def _heartbeat(state: MetadataState, cmd: BrokerHeartbeat, now_ms: int) -> Outcome:
    old = state.brokers.get(cmd.broker_id)
    if old is None:
        return state, Rejected(
            REJECT_UNKNOWN_BROKER, f"broker {cmd.broker_id!r} is not registered", "broker_id"
        )
    broker = replace(old, last_heartbeat_ms=now_ms)
    new_state = replace(state, brokers={**state.brokers, cmd.broker_id: broker}, clock_ms=now_ms)
    return new_state, Applied(new_state.metadata_version, broker=broker)


# BrokerInfo fields added later: left out of the snapshot at their default, so a
# catalogue without storage reports snapshots byte-identically to older code.
_OPTIONAL_INFO: Final = {"free_bytes": -1, "storage_level": ""}


def _report_storage(state: MetadataState, cmd: ReportStorage, now_ms: int) -> Outcome:
    old = state.brokers.get(cmd.broker_id)
    if old is None:
        return state, Rejected(
            REJECT_UNKNOWN_BROKER, f"broker {cmd.broker_id!r} is not registered", "broker_id"
        )
    if cmd.storage_level not in STORAGE_LEVELS:
        return state, Rejected(
            REJECT_INVALID_ARGUMENT,
            f"storage_level must be one of {list(STORAGE_LEVELS)}",
            "storage_level",
        )
    if cmd.free_bytes < 0:
        return state, Rejected(REJECT_INVALID_ARGUMENT, "free_bytes must be >= 0", "free_bytes")
    # Neither metadata_version nor the clock moves: as a heartbeat, no observer wakes.
    broker = replace(old, free_bytes=cmd.free_bytes, storage_level=cmd.storage_level)
    new_state = replace(state, brokers={**state.brokers, cmd.broker_id: broker})
    return new_state, Applied(new_state.metadata_version, broker=broker)


def _to_json(state: MetadataState) -> dict[str, Any]:
    return {
        "brokers": {
            b.broker_id: {
                f.name: getattr(b, f.name)
                for f in fields(b)
                if _OPTIONAL_INFO.get(f.name, object()) != getattr(b, f.name)
            }
            for b in state.brokers.values()
        }
    }


def _from_json(doc: dict[str, Any], state: MetadataState) -> MetadataState:
    brokers = {bid: BrokerInfo(**b) for bid, b in sorted(doc["brokers"].items())}
    return replace(state, brokers=brokers)


DOMAIN: Final = Domain(
    name="brokers",
    commands=(
        CommandSpec(RegisterBroker, _register_broker, CODEC),
        CommandSpec(BrokerHeartbeat, _heartbeat, CODEC),
        CommandSpec(ReportStorage, _report_storage, CODEC),
    ),
    json_keys=("brokers",),
    to_json=_to_json,
    from_json=_from_json,
)

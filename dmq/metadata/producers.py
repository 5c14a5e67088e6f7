"""The producers domain of the metadata catalogue: ids for idempotent and transactional
producers.

Commands: `InitProducer` and `ExpireTransactionalIds`. State: `MetadataState.next_producer_id`
and `transactional_ids` (id -> producer id, epoch, last use), in the snapshot but not in the
catalogue observers follow: producers start far more often than topics change.

Rules apply() keeps:

- producer ids are never reused (`next_producer_id` only grows), so a partition's
  deduplication state (dmq/partition/) can never mistake a new producer for an old one;
- `InitProducer` with a transactional id returns the same producer id with the epoch + 1,
  which fences the previous instance; at PRODUCER_EPOCH_MAX it gets a new id, epoch 0
  (as Kafka);
- `InitProducerFenceable` (what brokers propose; `InitProducer` entries of older journals
  replay as they applied) does the same but never hands out PRODUCER_EPOCH_MAX: from
  epoch PRODUCER_EPOCH_MAX - 1 it moves to a new id (Kafka's `isEpochExhausted`), so a
  transaction always has an epoch above its own for the markers that end it and fence
  its late batches (dmq/metadata/transactions.py: a coordinator abort of the old id's
  transaction is written with its last epoch);
- an id unused (no `InitProducer`) for `retention_ms` at the leader-stamped time is
  forgotten by `ExpireTransactionalIds`; it then starts again at a new producer id.
  Brokers now propose the transactions domain's `ExpireTransactions` instead, which
  also forgets the id's transaction record and never an id whose transaction is open
  (`ExpireTransactionalIds` entries of older journals replay as they applied).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from immutables import Map

from dmq.metadata.codec import FieldCodec
from dmq.metadata.registry import CommandSpec, Domain
from dmq.metadata.state import (
    COMMAND_VERSION,
    REJECT_INVALID_ARGUMENT,
    TOPIC_NAME_CHARS_MAX,
    Applied,
    MetadataState,
    Outcome,
    Rejected,
)

PRODUCER_EPOCH_MAX: Final = 32_767  # the batch header's int16


@dataclass(frozen=True, slots=True)
class InitProducer:
    """Allocate a producer id for an idempotent producer. With a `transactional_id` ("" for
    none) the same id comes back with its epoch + 1, which fences the previous instance."""

    transactional_id: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class InitProducerFenceable:
    """`InitProducer`, except that the epoch handed out is always below
    PRODUCER_EPOCH_MAX: the last epoch is kept for the markers that fence it."""

    transactional_id: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class ExpireTransactionalIds:
    """Forget the transactional ids not used (InitProducer) for `retention_ms` at `now_ms`
    (Kafka's transactional.id.expiration.ms). Proposed by the metadata leader with its
    clock; a forgotten id starts again at a new producer id, epoch 0."""

    retention_ms: int
    now_ms: int
    version: int = COMMAND_VERSION


ProducerCommand = InitProducer | InitProducerFenceable | ExpireTransactionalIds

CODEC: Final = FieldCodec({"transactional_id": "str", "retention_ms": "int", "now_ms": "int"})


def _init_producer(state: MetadataState, cmd: InitProducer, now_ms: int) -> Outcome:
    return _init(state, cmd.transactional_id, now_ms, PRODUCER_EPOCH_MAX)


def _init_producer_fenceable(
    state: MetadataState, cmd: InitProducerFenceable, now_ms: int
) -> Outcome:
    return _init(state, cmd.transactional_id, now_ms, PRODUCER_EPOCH_MAX - 1)


def _init(state: MetadataState, tid: str, now_ms: int, epoch_max: int) -> Outcome:
    """A producer id and epoch; the same id with epoch + 1 while that is <= epoch_max."""
    if len(tid) > TOPIC_NAME_CHARS_MAX:
        return state, Rejected(
            REJECT_INVALID_ARGUMENT,
            f"transactional_id is longer than {TOPIC_NAME_CHARS_MAX}",
            "transactional_id",
        )
    old = state.transactional_ids.get(tid) if tid else None
    if old is not None and old[1] < epoch_max:
        producer = (old[0], old[1] + 1)  # the same id, a newer epoch: fences the old one
        next_id = state.next_producer_id
    else:  # a new id (also when the epoch would overflow, as Kafka)
        if (
            tid
            and old is None
            and len(state.transactional_ids) >= state.config.transactional_ids_max
        ):
            return state, Rejected(
                REJECT_INVALID_ARGUMENT,
                f"at most {state.config.transactional_ids_max} transactional ids",
                "transactional_id",
            )
        producer = (state.next_producer_id, 0)
        next_id = state.next_producer_id + 1
    tids = state.transactional_ids
    if tid:
        tids = tids.set(tid, (*producer, now_ms))
    new_state = replace(state, next_producer_id=next_id, transactional_ids=tids, clock_ms=now_ms)
    return new_state, Applied(new_state.metadata_version, producer=producer)


def idle_transactional_ids(state: MetadataState, retention_ms: int, now_ms: int) -> list[str]:
    """Transactional ids whose last InitProducer is `retention_ms` or more before now_ms."""
    horizon = now_ms - retention_ms
    return sorted(t for t, p in state.transactional_ids.items() if p[2] <= horizon)


def _expire_transactional_ids(
    state: MetadataState, cmd: ExpireTransactionalIds, now_ms: int
) -> Outcome:
    if cmd.retention_ms < 0:
        return state, Rejected(REJECT_INVALID_ARGUMENT, "retention_ms must be >= 0", "retention_ms")
    tids = state.transactional_ids.mutate()
    for t in idle_transactional_ids(state, cmd.retention_ms, now_ms):
        del tids[t]
    new_state = replace(state, transactional_ids=tids.finish(), clock_ms=now_ms)
    return new_state, Applied(new_state.metadata_version)


def _to_json(state: MetadataState) -> dict[str, Any]:
    return {
        "producers": {
            "next_producer_id": state.next_producer_id,
            "transactional_ids": {t: list(p) for t, p in sorted(state.transactional_ids.items())},
        }
    }


def _from_json(doc: dict[str, Any], state: MetadataState) -> MetadataState:
    if "producers" not in doc:  # a snapshot from before producer ids
        return state
    producers = doc["producers"]
    return replace(
        state,
        next_producer_id=producers["next_producer_id"],
        transactional_ids=Map(
            {  # a snapshot from before expiry: used now
                t: (p[0], p[1], p[2] if len(p) > 2 else state.clock_ms)
                for t, p in producers["transactional_ids"].items()
            }
        ),
    )


DOMAIN: Final = Domain(
    name="producers",
    commands=(
        CommandSpec(InitProducer, _init_producer, CODEC),
        CommandSpec(ExpireTransactionalIds, _expire_transactional_ids, CODEC),
        CommandSpec(InitProducerFenceable, _init_producer_fenceable, CODEC),
    ),
    json_keys=("producers",),
    to_json=_to_json,
    from_json=_from_json,
    in_catalogue=False,
)

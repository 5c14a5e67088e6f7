"""The transactions domain of the metadata catalogue: the transaction coordinator's state.

Kafka's transaction coordinator (KIP-98, with KIP-890's server-side partition adds) as a
domain of the metadata group: the decision to commit or abort is one Raft entry here,
durable before any partition sees a marker. Commands:

- `AddPartitionsToTxn`: a transactional produce (the broker proposes it before it appends,
  KIP-890) names the partitions it writes; the first one opens the transaction;
- `AddOffsetsToTxn`: consume-transform-produce (`send_offsets_to_transaction`): a group's
  offsets, checked against the member's generation now, committed only with the transaction;
- `EndTxnBumpEpoch`: the producer's commit or abort: `ongoing` -> `prepare_commit` /
  `prepare_abort`, and, in the same apply, the producer's epoch + 1 (KIP-890 part 2);
- `EndTxn`: the same decision without the bump, as before it existed: kept so that
  journals written then replay as they did; brokers propose `EndTxnBumpEpoch` only;
- `AbortTxn`: the coordinator's own abort of a transaction whose producer was fenced (a
  newer epoch of its transactional id) or that outlived its `timeout_ms`;
- `CompleteTxn`: every marker is written: `prepare_*` -> `complete_*`; a commit's offsets
  become the groups' committed offsets in the same apply.

State: `MetadataState.transactions` (transactional id -> `Transaction`), in the snapshot but
not in the catalogue observers follow (JSON key `transactions`). The producer id and epoch
of a transactional id belong to the producers domain (`transactional_ids`); this domain
reads them (a newer epoch there fences the transaction here) and never writes them.

Rules apply() keeps:

- a command from a producer id/epoch other than the transactional id's current one is
  refused (`producer_fenced`), as is every command of an epoch whose transaction the
  coordinator aborted for a timeout (`Transaction.fenced`): the producer must start again
  (`POST /v1/producers`), which bumps its epoch;
- a transaction moves only along empty/complete_* -> ongoing -> prepare_* -> complete_*;
  a `prepare_*` is never left except to its own `complete_*`: a decision, once durable, is
  carried out whoever leads (the broker's driver, dmq/broker/transactions.py, re-reads the
  state after a failover and writes the markers again; markers are idempotent);
- the markers of a coordinator abort carry the epoch + 1 (`marker_epoch`), so the
  partitions refuse the fenced producer's late batches (a transaction never runs at
  TXN_PRODUCER_EPOCH_MAX: `InitProducerFenceable` and the bump below never hand it out, so
  epoch + 1 always fits; dmq/metadata/producers.py);
- `EndTxnBumpEpoch` bumps the epoch of every transaction it decides (KIP-890 part 2): the
  transactional id's identity becomes (producer id, epoch + 1), or, once epoch + 1 reaches
  TXN_PRODUCER_EPOCH_MAX, (a new producer id, 0) as Kafka; it is recorded in
  `transactional_ids` and in the transaction (`next_producer_*`), and returned
  (`Applied.producer`). The markers carry epoch + 1 (`marker_epoch`), so each partition
  fences the transaction's epoch as it closes it: a batch of transaction N that arrives
  after N's marker is refused, never taken into N + 1 (which runs at epoch + 1). A retry
  of the same decision with the old epoch is answered with the new identity; any other
  use of the old epoch is `producer_fenced`. (`EndTxn`, from before, keeps the epoch: its
  markers carry the producer's epoch);
- `partitions` and `offsets` only grow while `ongoing`, and are cleared at `complete_*`;
- an add of the same producer epoch while `prepare_*` (its commit was answered once the
  decision was durable) is queued in `next_partitions`; `CompleteTxn`, applied only after
  every marker is written, then opens the next transaction (`ongoing`) with them instead
  of `complete_*`: no batch of the next transaction reaches a partition before the
  previous one's marker there, and no marker of the previous one is written after it
  (complete means no driver writes them again). An `EndTxn` with a queued add is refused
  (`concurrent_transactions`): the next transaction began, it is no retry;
- pending offsets reach `MetadataState.groups` only at `complete_commit`.
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
    Applied,
    MetadataState,
    Outcome,
    Rejected,
    Transaction,
)
from groups import state as groups_state
from groups.commands import CommitOffsets

TXN_EMPTY: Final = "empty"
TXN_ONGOING: Final = "ongoing"
TXN_PREPARE_COMMIT: Final = "prepare_commit"
TXN_PREPARE_ABORT: Final = "prepare_abort"
TXN_COMPLETE_COMMIT: Final = "complete_commit"
TXN_COMPLETE_ABORT: Final = "complete_abort"
TXN_STATES: Final = (
    TXN_EMPTY,
    TXN_ONGOING,
    TXN_PREPARE_COMMIT,
    TXN_PREPARE_ABORT,
    TXN_COMPLETE_COMMIT,
    TXN_COMPLETE_ABORT,
)
_COMPLETE_OF: Final = {
    TXN_PREPARE_COMMIT: TXN_COMPLETE_COMMIT,
    TXN_PREPARE_ABORT: TXN_COMPLETE_ABORT,
}

REJECT_UNKNOWN_TRANSACTIONAL_ID: Final = "unknown_transactional_id"
REJECT_PRODUCER_FENCED: Final = "producer_fenced"
REJECT_INVALID_TXN_STATE: Final = "invalid_txn_state"
REJECT_CONCURRENT_TRANSACTIONS: Final = "concurrent_transactions"

# Replicated limits (a change needs a new command version, never a broker setting).
TXN_PARTITIONS_MAX: Final = 10_000  # partitions one transaction writes (its JSON, its markers)
TXN_OFFSETS_MAX: Final = 10_000  # group offsets one transaction carries
TXN_TIMEOUT_MS_MAX: Final = 900_000  # Kafka's transaction.max.timeout.ms default (15 min)
TXN_PRODUCER_EPOCH_MAX: Final = 32_767  # the batch header's int16 (producers.py's limit)


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxn:
    """Before a transactional produce: its partitions join the producer's transaction,
    which opens (with `timeout_ms`) if none is."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[str, ...]  # "topic:partition"
    timeout_ms: int
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxn:
    """A group's offsets, committed only if the transaction commits. The member must hold
    each partition at `generation` now (as a plain offset commit), checked at apply."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    group: str
    member_id: str
    generation: int
    offsets: tuple[str, ...]  # "topic:partition:offset"
    timeout_ms: int
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class EndTxn:
    """The producer's decision: `commit` 1 to commit, 0 to abort."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: int
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class EndTxnBumpEpoch:
    """The producer's decision (`commit` 1 or 0) and its next epoch (KIP-890 part 2): the
    answer (`Applied.producer`) is the producer id and epoch of its next transaction."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: int
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class AbortTxn:
    """The coordinator's abort (`reason` "fenced" or "timeout") of the transaction of
    `producer_epoch`; proposed by the metadata leader's driver, checked here at `now_ms`."""

    transactional_id: str
    producer_epoch: int
    reason: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class CompleteTxn:
    """Every marker of the decision `state` (prepare_commit or prepare_abort) is written."""

    transactional_id: str
    producer_epoch: int
    state: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class ExpireTransactions:
    """Forget the transactional ids not used (`InitProducer`, a decision) for
    `retention_ms` at `now_ms` whose transaction is not open, in both `transactional_ids`
    and `transactions` (Kafka's transactional.id.expiration.ms); and the transaction
    records of ids no longer remembered (`ExpireTransactionalIds`, which brokers proposed
    before this command, forgot only the id: its records stayed, and counted against
    `transactional_ids_max`, for ever). Proposed by the metadata leader with its clock;
    a forgotten id starts again at a new producer id, epoch 0."""

    retention_ms: int
    now_ms: int
    version: int = COMMAND_VERSION


TransactionCommand = (
    AddPartitionsToTxn
    | AddOffsetsToTxn
    | EndTxn
    | EndTxnBumpEpoch
    | AbortTxn
    | CompleteTxn
    | ExpireTransactions
)

CODEC: Final = FieldCodec(
    {
        "transactional_id": "str",
        "producer_id": "int",
        "producer_epoch": "int",
        "partitions": "strs",
        "timeout_ms": "int",
        "group": "str",
        "member_id": "str",
        "generation": "int",
        "offsets": "strs",
        "commit": "int",
        "reason": "str",
        "state": "str",
        "retention_ms": "int",
        "now_ms": "int",
    }
)


# --- parsing of the compact string forms --------------------------------------------------


def parse_partition(text: str) -> tuple[str, int] | None:
    """ "topic:partition" as (topic, partition); None if malformed."""
    topic, sep, number = text.rpartition(":")
    if not sep or not topic or not number.isascii() or not number.isdigit():
        return None
    return topic, int(number)


def parse_offset(text: str) -> tuple[str, str, int, int] | None:
    """ "group:topic:partition:offset" as its four parts; None if malformed."""
    parts = text.split(":")
    if len(parts) != 4 or not all(p.isascii() and p.isdigit() for p in parts[2:]):
        return None
    return parts[0], parts[1], int(parts[2]), int(parts[3])


# --- apply ---------------------------------------------------------------------------------


def _reject(state: MetadataState, code: str, message: str, field: str) -> Outcome:
    return state, Rejected(code, message, field)


def _check_producer(
    state: MetadataState, tid: str, producer_id: int, epoch: int
) -> Rejected | None:
    """The producer's id and epoch must be the transactional id's current ones."""
    current = state.transactional_ids.get(tid)
    if current is None:
        return Rejected(
            REJECT_UNKNOWN_TRANSACTIONAL_ID,
            f"transactional id {tid!r} is unknown: POST /v1/producers first",
            "transactional_id",
        )
    if producer_id != current[0] or epoch < current[1]:
        return Rejected(
            REJECT_PRODUCER_FENCED,
            f"producer {producer_id} epoch {epoch} of {tid!r} is fenced by producer "
            f"{current[0]} epoch {current[1]}",
            "producer_epoch",
        )
    if epoch > current[1]:
        return Rejected(
            REJECT_INVALID_ARGUMENT,
            f"epoch {epoch} of {tid!r} was never handed out (current {current[1]})",
            "producer_epoch",
        )
    txn = state.transactions.get(tid)
    if txn is not None and txn.producer_epoch == epoch and txn.fenced:
        return Rejected(
            REJECT_PRODUCER_FENCED,
            f"the transaction of {tid!r} epoch {epoch} was aborted after its timeout of "
            f"{txn.timeout_ms} ms: start the producer again",
            "producer_epoch",
        )
    return None


def _open_transaction(
    state: MetadataState, tid: str, producer_id: int, epoch: int, timeout_ms: int, now_ms: int
) -> Transaction | Rejected:
    """The transaction `tid` adds to: the ongoing one of this epoch, or a new one."""
    if not 1 <= timeout_ms <= TXN_TIMEOUT_MS_MAX:
        return Rejected(
            REJECT_INVALID_ARGUMENT,
            f"transaction timeout_ms must be in [1, {TXN_TIMEOUT_MS_MAX}]",
            "timeout_ms",
        )
    txn = state.transactions.get(tid)
    if txn is not None and txn.is_open and _identity(txn) != (producer_id, epoch):
        return Rejected(
            REJECT_CONCURRENT_TRANSACTIONS,
            f"the transaction of {tid!r} epoch {txn.producer_epoch} is still open ({txn.state})",
            "transactional_id",
        )
    if txn is not None and txn.state in (TXN_PREPARE_COMMIT, TXN_PREPARE_ABORT):
        return Rejected(
            REJECT_CONCURRENT_TRANSACTIONS,
            f"the last transaction of {tid!r} is still writing its markers ({txn.state})",
            "transactional_id",
        )
    if txn is not None and txn.state == TXN_ONGOING:
        return txn
    if txn is None and len(state.transactions) >= state.config.transactional_ids_max:
        return Rejected(
            REJECT_INVALID_ARGUMENT,
            f"at most {state.config.transactional_ids_max} transactional ids",
            "transactional_id",
        )
    return Transaction(
        producer_id, epoch, TXN_ONGOING, started_ms=now_ms, updated_ms=now_ms,
        timeout_ms=timeout_ms, marker_epoch=epoch,
    )  # fmt: skip


def _with_txn(state: MetadataState, tid: str, txn: Transaction, now_ms: int) -> Outcome:
    new_state = replace(state, **_put(state, tid, txn), clock_ms=now_ms)
    return new_state, Applied(new_state.metadata_version)


def _put(state: MetadataState, tid: str, txn: Transaction) -> dict[str, Any]:
    """The fields to replace for `tid`'s transaction becoming `txn`: the transactions and
    their open index (every write of a transaction goes through here or
    _expire_transactions, which never removes an open one)."""
    opened = state.transactions_open
    if txn.is_open:
        opened = opened.set(tid, None)
    elif tid in opened:
        opened = opened.delete(tid)
    return {"transactions": state.transactions.set(tid, txn), "transactions_open": opened}


def _add_partitions(state: MetadataState, cmd: AddPartitionsToTxn, now_ms: int) -> Outcome:
    tid = cmd.transactional_id
    bad = _check_producer(state, tid, cmd.producer_id, cmd.producer_epoch)
    if bad is not None:
        return state, bad
    if not cmd.partitions:
        return _reject(state, REJECT_INVALID_ARGUMENT, "name at least one partition", "partitions")
    for i, text in enumerate(cmd.partitions):
        parsed = parse_partition(text)
        topic = state.topics.get(parsed[0]) if parsed else None
        if parsed is None or topic is None or parsed[1] >= len(topic.partitions):
            return _reject(
                state, REJECT_INVALID_ARGUMENT,
                f"partitions[{i}] {text!r} is not an existing topic:partition",
                f"partitions[{i}]",
            )  # fmt: skip
    queued = _maybe_queue_partitions(state, cmd, now_ms)
    if queued is not None:
        return queued
    txn = _open_transaction(state, tid, cmd.producer_id, cmd.producer_epoch, cmd.timeout_ms, now_ms)
    if isinstance(txn, Rejected):
        return state, txn
    partitions = _merged(txn.partitions, cmd.partitions)
    if isinstance(partitions, Rejected):
        return state, partitions
    if partitions == txn.partitions and state.transactions.get(tid) == txn:
        return state, Applied(state.metadata_version)  # already added
    return _with_txn(state, tid, replace(txn, partitions=partitions), now_ms)


def _merged(partitions: tuple[str, ...], added: tuple[str, ...]) -> tuple[str, ...] | Rejected:
    """`partitions` with `added`, sorted and distinct, within TXN_PARTITIONS_MAX."""
    merged = tuple(sorted({*partitions, *added}))
    if len(merged) > TXN_PARTITIONS_MAX:
        return Rejected(
            REJECT_INVALID_ARGUMENT,
            f"a transaction writes at most {TXN_PARTITIONS_MAX} partitions",
            "partitions",
        )
    return merged


def _maybe_queue_partitions(
    state: MetadataState, cmd: AddPartitionsToTxn, now_ms: int
) -> Outcome | None:
    """An add while this producer's (same epoch) previous transaction is prepare_*: its
    partitions wait in `next_partitions`, and CompleteTxn opens the next transaction with
    them once every marker of the previous one is written. The broker appends only once
    that transaction is ongoing. None if the transaction is not prepare_*."""
    txn = state.transactions.get(cmd.transactional_id)
    if txn is None or txn.state not in _COMPLETE_OF:
        return None
    if successor(txn) != (cmd.producer_id, cmd.producer_epoch):
        return None
    if not 1 <= cmd.timeout_ms <= TXN_TIMEOUT_MS_MAX:
        return _reject(
            state, REJECT_INVALID_ARGUMENT,
            f"transaction timeout_ms must be in [1, {TXN_TIMEOUT_MS_MAX}]", "timeout_ms",
        )  # fmt: skip
    partitions = _merged(txn.next_partitions, cmd.partitions)
    if isinstance(partitions, Rejected):
        return state, partitions
    if partitions == txn.next_partitions and cmd.timeout_ms == txn.next_timeout_ms:
        return state, Applied(state.metadata_version)  # already queued
    queued = replace(txn, next_partitions=partitions, next_timeout_ms=cmd.timeout_ms)
    return _with_txn(state, cmd.transactional_id, queued, now_ms)


def _add_offsets(state: MetadataState, cmd: AddOffsetsToTxn, now_ms: int) -> Outcome:
    tid = cmd.transactional_id
    bad = _check_producer(state, tid, cmd.producer_id, cmd.producer_epoch)
    if bad is not None:
        return state, bad
    items = []
    for i, text in enumerate(cmd.offsets):
        parsed = parse_offset(f"{cmd.group}:{text}")
        if parsed is None:
            return _reject(
                state, REJECT_INVALID_ARGUMENT,
                f"offsets[{i}] {text!r} is not topic:partition:offset", f"offsets[{i}]",
            )  # fmt: skip
        items.append(parsed[1:])
    # The same checks as a plain commit by this member now (generation, held partitions,
    # limits): run on a copy of the groups' state and thrown away.
    check = CommitOffsets(cmd.group, cmd.member_id, cmd.generation, tuple(items), now_ms)
    _, events = groups_state.apply(state.groups, check)
    refusal = next((e for e in events if isinstance(e, groups_state.Rejected)), None)
    if refusal is not None:
        return state, Rejected(refusal.code, refusal.message, refusal.field)
    txn = _open_transaction(state, tid, cmd.producer_id, cmd.producer_epoch, cmd.timeout_ms, now_ms)
    if isinstance(txn, Rejected):
        return state, txn
    # A later offset for the same group and partition replaces the earlier one.
    pending = {parse_offset(o)[:3]: o for o in txn.offsets}  # type: ignore[index]
    for topic, partition, offset in items:
        pending[(cmd.group, topic, partition)] = f"{cmd.group}:{topic}:{partition}:{offset}"
    if len(pending) > TXN_OFFSETS_MAX:
        return _reject(
            state, REJECT_INVALID_ARGUMENT,
            f"a transaction carries at most {TXN_OFFSETS_MAX} offsets", "offsets",
        )  # fmt: skip
    offsets = tuple(v for _, v in sorted(pending.items()))
    return _with_txn(state, tid, replace(txn, offsets=offsets), now_ms)


def _end_txn(state: MetadataState, cmd: EndTxn, now_ms: int) -> Outcome:
    tid = cmd.transactional_id
    bad = _check_producer(state, tid, cmd.producer_id, cmd.producer_epoch)
    if bad is not None:
        return state, bad
    if cmd.commit not in (0, 1):
        return _reject(state, REJECT_INVALID_ARGUMENT, "commit must be 0 or 1", "commit")
    prepare = TXN_PREPARE_COMMIT if cmd.commit else TXN_PREPARE_ABORT
    txn = state.transactions.get(tid)
    if txn is not None and txn.producer_epoch == cmd.producer_epoch:
        if txn.next_partitions:  # the next transaction began: this is not a retry
            return _reject(
                state, REJECT_CONCURRENT_TRANSACTIONS,
                f"the last transaction of {tid!r} is still writing its markers ({txn.state})",
                "transactional_id",
            )  # fmt: skip
        if txn.state in (prepare, _COMPLETE_OF[prepare]):  # a retry of the same decision
            return state, Applied(state.metadata_version)
        if txn.state == TXN_ONGOING:
            decided = replace(txn, state=prepare, updated_ms=now_ms)
            return _with_txn(state, tid, decided, now_ms)
    what = "commit" if cmd.commit else "abort"
    current = TXN_EMPTY if txn is None or txn.producer_epoch != cmd.producer_epoch else txn.state
    return _reject(
        state, REJECT_INVALID_TXN_STATE,
        f"cannot {what} the transaction of {tid!r}: it is {current}", "transactional_id",
    )  # fmt: skip


def _end_txn_bump(state: MetadataState, cmd: EndTxnBumpEpoch, now_ms: int) -> Outcome:
    """`_end_txn`, then the epoch bump of the decision it made (module docstring)."""
    tid = cmd.transactional_id
    txn = state.transactions.get(tid)
    producer = (cmd.producer_id, cmd.producer_epoch)
    if txn is not None and txn.next_producer_id >= 0 and _identity(txn) == producer:
        return _end_txn_again(state, cmd, txn)
    end = EndTxn(tid, cmd.producer_id, cmd.producer_epoch, cmd.commit, cmd.now_ms, cmd.version)
    decided_state, result = _end_txn(state, end, now_ms)
    if isinstance(result, Rejected) or decided_state.transactions.get(tid) == txn:
        return decided_state, result  # refused, or a retry of a decision made by EndTxn
    decided = decided_state.transactions[tid]
    epoch, next_producer_id = cmd.producer_epoch, decided_state.next_producer_id
    if epoch + 1 < TXN_PRODUCER_EPOCH_MAX:
        following = (cmd.producer_id, epoch + 1)
    else:  # the epoch is spent: a new producer id, as Kafka
        following, next_producer_id = (next_producer_id, 0), next_producer_id + 1
    decided = replace(
        decided,
        marker_epoch=min(epoch + 1, TXN_PRODUCER_EPOCH_MAX),
        next_producer_id=following[0],
        next_producer_epoch=following[1],
    )
    new_state = replace(
        decided_state,
        **_put(decided_state, tid, decided),
        transactional_ids=decided_state.transactional_ids.set(tid, (*following, now_ms)),
        next_producer_id=next_producer_id,
    )
    return new_state, Applied(new_state.metadata_version, producer=following)


def _identity(txn: Transaction) -> tuple[int, int]:
    """The producer id and epoch a transaction runs with (its batches carry them)."""
    return txn.producer_id, txn.producer_epoch


def _end_txn_again(state: MetadataState, cmd: EndTxnBumpEpoch, txn: Transaction) -> Outcome:
    """An `EndTxnBumpEpoch` of a transaction whose decision already bumped the epoch: a
    retry of that decision gets the identity it gave; anything else is refused."""
    tid = cmd.transactional_id
    if cmd.commit not in (0, 1):
        return _reject(state, REJECT_INVALID_ARGUMENT, "commit must be 0 or 1", "commit")
    following = successor(txn)
    current = state.transactional_ids.get(tid)
    if current is None or current[:2] != following:
        return _reject(
            state, REJECT_PRODUCER_FENCED,
            f"producer {cmd.producer_id} epoch {cmd.producer_epoch} of {tid!r} is fenced: "
            f"its transaction ended and a newer instance started", "producer_epoch",
        )  # fmt: skip
    if txn.next_partitions:  # the next transaction began: this is not a retry
        return _reject(
            state, REJECT_CONCURRENT_TRANSACTIONS,
            f"the last transaction of {tid!r} is still writing its markers ({txn.state})",
            "transactional_id",
        )  # fmt: skip
    prepare = TXN_PREPARE_COMMIT if cmd.commit else TXN_PREPARE_ABORT
    if txn.state in (prepare, _COMPLETE_OF[prepare]):
        return state, Applied(state.metadata_version, producer=following)
    what = "commit" if cmd.commit else "abort"
    return _reject(
        state, REJECT_INVALID_TXN_STATE,
        f"cannot {what} the transaction of {tid!r}: it is {txn.state}", "transactional_id",
    )  # fmt: skip


def _abort_txn(state: MetadataState, cmd: AbortTxn, now_ms: int) -> Outcome:
    tid = cmd.transactional_id
    txn = state.transactions.get(tid)
    if txn is None or txn.producer_epoch != cmd.producer_epoch or txn.state != TXN_ONGOING:
        return _reject(
            state, REJECT_INVALID_TXN_STATE,
            f"no ongoing transaction of {tid!r} epoch {cmd.producer_epoch}", "transactional_id",
        )  # fmt: skip
    if cmd.reason == "timeout":
        if now_ms < txn.started_ms + txn.timeout_ms:
            return _reject(
                state, REJECT_INVALID_TXN_STATE,
                f"the transaction of {tid!r} has not timed out", "reason",
            )  # fmt: skip
    elif cmd.reason == "fenced":
        current = state.transactional_ids.get(tid)
        if current is not None and (current[0], current[1]) == (
            txn.producer_id,
            txn.producer_epoch,
        ):
            return _reject(
                state, REJECT_INVALID_TXN_STATE,
                f"the producer of {tid!r} epoch {txn.producer_epoch} is not fenced", "reason",
            )  # fmt: skip
    else:
        return _reject(state, REJECT_INVALID_ARGUMENT, "reason must be fenced or timeout", "reason")
    aborted = replace(
        txn,
        state=TXN_PREPARE_ABORT,
        updated_ms=now_ms,
        marker_epoch=min(txn.producer_epoch + 1, TXN_PRODUCER_EPOCH_MAX),
        fenced=True,
    )
    return _with_txn(state, tid, aborted, now_ms)


def _complete_txn(state: MetadataState, cmd: CompleteTxn, now_ms: int) -> Outcome:
    tid = cmd.transactional_id
    txn = state.transactions.get(tid)
    if txn is None or txn.producer_epoch != cmd.producer_epoch or txn.state != cmd.state:
        return _reject(
            state, REJECT_INVALID_TXN_STATE,
            f"the transaction of {tid!r} epoch {cmd.producer_epoch} is not {cmd.state}",
            "state",
        )  # fmt: skip
    complete = _COMPLETE_OF.get(cmd.state)
    if complete is None:
        return _reject(state, REJECT_INVALID_ARGUMENT, "state must be prepare_*", "state")
    groups = state.groups
    if complete == TXN_COMPLETE_COMMIT and txn.offsets:
        by_group: dict[str, list[tuple[str, int, int]]] = {}
        for text in txn.offsets:
            group, topic, partition, offset = parse_offset(text)  # type: ignore[misc]
            by_group.setdefault(group, []).append((topic, partition, offset))
        for group, items in sorted(by_group.items()):
            groups = groups_state.store_transactional_offsets(groups, group, items, now_ms)
    done = replace(
        txn, state=complete, partitions=(), offsets=(), updated_ms=now_ms,
        next_partitions=(), next_timeout_ms=0,
    )  # fmt: skip
    current = state.transactional_ids.get(tid)
    following = successor(txn)
    still_current = current is not None and current[:2] == following
    if txn.next_partitions and still_current and not txn.fenced:
        # The producer's next transaction, queued while this one was prepare_* (with the
        # epoch this one's decision bumped to, if it did).
        done = Transaction(
            following[0], following[1], TXN_ONGOING, txn.next_partitions,
            started_ms=now_ms, updated_ms=now_ms, timeout_ms=txn.next_timeout_ms,
            marker_epoch=following[1],
        )  # fmt: skip
    new_state = replace(state, **_put(state, tid, done), groups=groups, clock_ms=now_ms)
    return new_state, Applied(new_state.metadata_version)


# --- queries the driver uses (pure) ---------------------------------------------------------


def successor(txn: Transaction) -> tuple[int, int]:
    """The producer id and epoch of the producer's transaction after `txn`: the ones its
    decision bumped to, or (no bump) its own."""
    if txn.next_producer_id >= 0:
        return txn.next_producer_id, txn.next_producer_epoch
    return _identity(txn)


def add_status(
    txn: Transaction | None, producer: tuple[int, int], partitions: tuple[str, ...]
) -> str:
    """Where an applied add of `partitions` by `producer` stands: "added" (its transaction
    is ongoing with them: append), "queued" (behind the previous transaction's markers:
    wait), or "moved" (the state went elsewhere: propose again, which answers why)."""
    if txn is None:
        return "moved"
    if txn.state == TXN_ONGOING and _identity(txn) == producer:
        return "added" if set(partitions) <= set(txn.partitions) else "moved"
    if txn.state in _COMPLETE_OF and successor(txn) == producer:
        return "queued" if set(partitions) <= set(txn.next_partitions) else "moved"
    return "moved"


def open_transactions(state: MetadataState) -> list[tuple[str, Transaction]]:
    """The open transactions (ongoing, prepare_*), by transactional id: O(open) through
    the index, whatever the number of ids remembered."""
    txns = state.transactions
    return [(t, txns[t]) for t in sorted(state.transactions_open)]


def transactions_to_finish(state: MetadataState) -> list[tuple[str, Transaction]]:
    """Decided transactions whose markers are still to be written, by transactional id."""
    return [(t, x) for t, x in open_transactions(state) if x.state in _COMPLETE_OF]


def transactional_ids_to_expire(state: MetadataState, retention_ms: int, now_ms: int) -> list[str]:
    """What `ExpireTransactions(retention_ms, now_ms)` forgets, sorted: ids unused since
    now_ms - retention_ms, and records of ids no longer remembered; never one whose
    transaction is open (its markers are still to be written)."""
    horizon = now_ms - retention_ms
    ids, txns, opened = state.transactional_ids, state.transactions, state.transactions_open
    gone = {t for t, p in ids.items() if p[2] <= horizon}
    gone.update(t for t in txns if t not in ids)
    return sorted(t for t in gone if t not in opened)


def _expire_transactions(state: MetadataState, cmd: ExpireTransactions, now_ms: int) -> Outcome:
    if cmd.retention_ms < 0:
        return _reject(state, REJECT_INVALID_ARGUMENT, "retention_ms must be >= 0", "retention_ms")
    ids, txns = state.transactional_ids.mutate(), state.transactions.mutate()
    for tid in transactional_ids_to_expire(state, cmd.retention_ms, now_ms):
        ids.pop(tid, None)
        txns.pop(tid, None)
    new_state = replace(
        state, transactional_ids=ids.finish(), transactions=txns.finish(), clock_ms=now_ms
    )
    return new_state, Applied(new_state.metadata_version)


def transactions_to_abort(state: MetadataState, now_ms: int) -> list[tuple[str, str]]:
    """(transactional id, reason) of ongoing transactions the coordinator must abort: the
    producer was fenced by a newer epoch, or the transaction outlived its timeout."""
    out = []
    for tid, txn in open_transactions(state):
        if txn.state != TXN_ONGOING:
            continue
        current = state.transactional_ids.get(tid)
        if current is None or (current[0], current[1]) != (txn.producer_id, txn.producer_epoch):
            out.append((tid, "fenced"))
        elif now_ms >= txn.started_ms + txn.timeout_ms:
            out.append((tid, "timeout"))
    return out


# --- JSON ----------------------------------------------------------------------------------


def transaction_to_json(txn: Transaction) -> dict[str, Any]:
    return (
        {
            "producer_id": txn.producer_id,
            "producer_epoch": txn.producer_epoch,
            "state": txn.state,
            "partitions": list(txn.partitions),
            "offsets": list(txn.offsets),
            "started_ms": txn.started_ms,
            "updated_ms": txn.updated_ms,
            "timeout_ms": txn.timeout_ms,
            "marker_epoch": txn.marker_epoch,
            "fenced": txn.fenced,
        }
        | (
            {"next_partitions": list(txn.next_partitions), "next_timeout_ms": txn.next_timeout_ms}
            if txn.next_partitions
            else {}  # left out: snapshots without queued adds keep their bytes
        )
        | (
            {
                "next_producer_id": txn.next_producer_id,
                "next_producer_epoch": txn.next_producer_epoch,
            }
            if txn.next_producer_id >= 0
            else {}  # left out: snapshots from before the epoch bump keep their bytes
        )
    )


def _to_json(state: MetadataState) -> dict[str, Any]:
    if not state.transactions:  # left out: snapshots from before transactions stay the same
        return {}
    return {
        "transactions": {t: transaction_to_json(x) for t, x in sorted(state.transactions.items())}
    }


def _from_json(doc: dict[str, Any], state: MetadataState) -> MetadataState:
    if "transactions" not in doc:  # a snapshot from before transactions
        return state
    txns = {
        t: Transaction(
            int(x["producer_id"]),
            int(x["producer_epoch"]),
            str(x["state"]),
            tuple(x["partitions"]),
            tuple(x["offsets"]),
            int(x["started_ms"]),
            int(x["updated_ms"]),
            int(x["timeout_ms"]),
            int(x["marker_epoch"]),
            bool(x["fenced"]),
            tuple(x.get("next_partitions", ())),
            int(x.get("next_timeout_ms", 0)),
            int(x.get("next_producer_id", -1)),
            int(x.get("next_producer_epoch", -1)),
        )  # fmt: skip
        for t, x in doc["transactions"].items()
    }
    return replace(
        state,
        transactions=Map(txns),
        transactions_open=Map({t: None for t, x in txns.items() if x.is_open}),
    )


DOMAIN: Final = Domain(
    name="transactions",
    commands=(
        CommandSpec(AddPartitionsToTxn, _add_partitions, CODEC),
        CommandSpec(AddOffsetsToTxn, _add_offsets, CODEC),
        CommandSpec(EndTxn, _end_txn, CODEC),
        CommandSpec(EndTxnBumpEpoch, _end_txn_bump, CODEC),
        CommandSpec(AbortTxn, _abort_txn, CODEC),
        CommandSpec(CompleteTxn, _complete_txn, CODEC),
        CommandSpec(ExpireTransactions, _expire_transactions, CODEC),
    ),
    json_keys=("transactions",),
    to_json=_to_json,
    from_json=_from_json,
    in_catalogue=False,
)

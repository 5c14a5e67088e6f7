"""Proves the transactions domain (dmq/metadata/transactions.py) of the catalogue.

- a hypothesis property over random command sequences (adds, offsets, commit and abort
  with and without the epoch bump, coordinator aborts, completes, new producer epochs,
  time): a rejection leaves the whole state unchanged; a transaction only moves along
  empty/complete -> ongoing -> prepare -> its own complete; a prepare never changes its
  decision; partitions only grow while ongoing; pending offsets reach the groups only at
  complete_commit; a bumped decision moves the transactional id to the identity it
  returns, above the transaction's epoch, and its markers carry that epoch; the next
  transaction opens only with that identity; snapshot and restore give the same bytes;
- the refusals a client meets, each naming its field: unknown transactional id, stale
  epoch, commit in another state, offsets of a member that holds no such partition.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from immutables import Map

from dmq.metadata.machine import (
    REJECT_CONCURRENT_TRANSACTIONS,
    REJECT_INVALID_TXN_STATE,
    REJECT_PRODUCER_FENCED,
    REJECT_UNKNOWN_TRANSACTIONAL_ID,
    AbortTxn,
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    Applied,
    CompleteTxn,
    CreateTopic,
    EndTxn,
    EndTxnBumpEpoch,
    ExpireTransactionalIds,
    ExpireTransactions,
    InitProducer,
    InitProducerFenceable,
    MetadataMachine,
    MetadataState,
    RegisterBroker,
    Rejected,
    apply,
    successor,
)
from groups.commands import JoinGroup

ALLOWED = {
    "ongoing": {"ongoing", "prepare_commit", "prepare_abort"},
    # ongoing: CompleteTxn opened the next transaction queued behind this one
    "prepare_commit": {"prepare_commit", "complete_commit", "ongoing"},
    "prepare_abort": {"prepare_abort", "complete_abort", "ongoing"},
    "complete_commit": {"complete_commit", "ongoing"},
    "complete_abort": {"complete_abort", "ongoing"},
}


def base() -> MetadataState:
    state = MetadataState()
    for command in (
        RegisterBroker("n1", "127.0.0.1:1", "127.0.0.1:2", 1),
        CreateTopic("a", 3, 1, (), 2),
        InitProducer("t1", 3),
    ):
        state, result = apply(state, command)
        assert isinstance(result, Applied), result
    return state


TID = st.sampled_from(["t1", "t2"])
EPOCH = st.integers(0, 2)
COMMANDS = st.one_of(
    st.builds(InitProducer, TID, st.just(0)),
    st.builds(
        AddPartitionsToTxn,
        TID,
        st.just(0),
        EPOCH,
        st.lists(st.sampled_from(["a:0", "a:1", "a:2", "a:9", "b:0"]), min_size=0, max_size=2).map(
            tuple
        ),
        st.sampled_from([0, 100, 60_000]),
        st.just(0),
    ),  # fmt: skip
    st.builds(
        AddOffsetsToTxn,
        TID,
        st.just(0),
        EPOCH,
        st.just("g"),
        st.just(""),
        st.just(-1),
        st.lists(st.sampled_from(["a:0:5", "a:1:7", "x"]), min_size=1, max_size=2).map(tuple),
        st.just(1_000),
        st.just(0),
    ),  # fmt: skip
    st.builds(EndTxn, TID, st.just(0), EPOCH, st.integers(0, 2), st.just(0)),
    st.builds(EndTxnBumpEpoch, TID, st.just(0), EPOCH, st.integers(0, 2), st.just(0)),
    st.builds(EndTxnBumpEpoch, TID, st.just(0), EPOCH, st.integers(0, 1), st.just(0)),
    st.builds(AbortTxn, TID, EPOCH, st.sampled_from(["timeout", "fenced", "x"]), st.just(0)),
    st.builds(
        CompleteTxn,
        TID,
        EPOCH,
        st.sampled_from(["prepare_commit", "prepare_abort", "ongoing"]),
        st.just(0),
    ),  # fmt: skip
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(COMMANDS, st.integers(0, 2_000)), max_size=30))
def test_transactions_move_only_forward_and_rejections_change_nothing(steps: list) -> None:  # type: ignore[type-arg]
    state = base()
    now = 10
    for command, advance in steps:
        now += advance
        command = type(command)(**{**_fields(command), "now_ms": now})
        new, result = apply(state, command)
        if isinstance(result, Rejected):
            assert new == state, result
            continue
        if isinstance(command, EndTxnBumpEpoch) and result.producer is not None:
            txn = new.transactions[command.transactional_id]
            assert new.transactional_ids[command.transactional_id][:2] == result.producer
            assert successor(txn) == result.producer != (txn.producer_id, txn.producer_epoch)
            assert txn.marker_epoch == txn.producer_epoch + 1 and txn.state.startswith("prepare")
        for tid, txn in new.transactions.items():
            old = state.transactions.get(tid)
            if old is not None and old.state.startswith("prepare") and txn.state == "ongoing":
                # only CompleteTxn opens the queued next transaction, with the identity
                # the decision left (bumped or not)
                assert isinstance(command, CompleteTxn) and not old.fenced
                assert (txn.producer_id, txn.producer_epoch) == successor(old)
                assert txn.partitions == old.next_partitions != ()
            if old is not None and old.producer_epoch == txn.producer_epoch:
                assert txn.state in ALLOWED[old.state], (old.state, txn.state, command)
                if old.state == "ongoing" and txn.state == "ongoing":
                    assert set(old.partitions) <= set(txn.partitions)
            if txn.next_partitions:
                assert txn.state.startswith("prepare")
            if txn.state.startswith("complete"):
                assert not txn.partitions and not txn.offsets
            if txn.state.startswith("prepare") and old is not None and old.state == txn.state:
                # a prepare never changes, but for adds queued for the next transaction
                assert (
                    replace(txn, next_partitions=(), next_timeout_ms=0)
                    == replace(old, next_partitions=(), next_timeout_ms=0)
                    and set(old.next_partitions) <= set(txn.next_partitions)
                ) or txn.producer_epoch != old.producer_epoch
        committed = new.groups.groups.get("g")
        if committed is not None and committed != state.groups.groups.get("g"):
            assert isinstance(command, CompleteTxn) and command.state == "prepare_commit"
        # The open index (what the driver scans) is exactly the open transactions.
        assert set(new.transactions_open) == {t for t, x in new.transactions.items() if x.is_open}
        state = new
    machine = MetadataMachine()
    machine.state = state
    again = MetadataMachine()
    again.restore(machine.snapshot())
    assert again.snapshot() == machine.snapshot() and again.state == state


def _fields(command: object) -> dict[str, object]:
    return {f: getattr(command, f) for f in command.__slots__ if f != "version"}  # type: ignore[attr-defined]


def reject(state: MetadataState, command: object) -> Rejected:
    new, result = apply(state, command)  # type: ignore[arg-type]
    assert isinstance(result, Rejected) and new == state, result
    return result


def test_refusals_name_what_is_wrong() -> None:
    state = base()
    pid, epoch = state.transactional_ids["t1"][:2]
    r = reject(state, AddPartitionsToTxn("nope", pid, 0, ("a:0",), 1_000, 10))
    assert (r.code, r.field) == (REJECT_UNKNOWN_TRANSACTIONAL_ID, "transactional_id")
    state, _ = apply(state, AddPartitionsToTxn("t1", pid, epoch, ("a:0",), 1_000, 10))
    state, _ = apply(state, InitProducer("t1", 11))  # epoch + 1 fences the open transaction
    r = reject(state, EndTxn("t1", pid, epoch, 1, 12))
    assert (r.code, r.field) == (REJECT_PRODUCER_FENCED, "producer_epoch")
    r = reject(state, AddPartitionsToTxn("t1", pid, epoch + 1, ("a:1",), 1_000, 12))
    assert r.code == REJECT_CONCURRENT_TRANSACTIONS  # until the old one is aborted
    state, result = apply(state, AbortTxn("t1", epoch, "fenced", 13))
    assert isinstance(result, Applied) and state.transactions["t1"].marker_epoch == epoch + 1
    r = reject(state, EndTxn("t1", pid, epoch + 1, 1, 14))
    assert (r.code, r.field) == (REJECT_INVALID_TXN_STATE, "transactional_id")
    state, _ = apply(state, CompleteTxn("t1", epoch, "prepare_abort", 15))
    # Offsets of a member that is not in the group (it holds no partition).
    state, _ = apply(state, JoinGroup("g", "m1", "", ("a",), "", 10_000, "range", 16))
    r = reject(state, AddOffsetsToTxn("t1", pid, epoch + 1, "g", "m2", 1, ("a:0:3",), 1_000, 17))
    assert r.code == "unknown_member" and r.field == "member_id"
    r = reject(state, AddPartitionsToTxn("t1", pid, epoch + 1, ("a:0",), 0, 18))
    assert r.field == "timeout_ms"


def test_an_add_behind_a_decided_transaction_is_queued_and_opens_the_next_one() -> None:
    state = base()
    pid, epoch = state.transactional_ids["t1"][:2]
    state, _ = apply(state, AddPartitionsToTxn("t1", pid, epoch, ("a:0",), 1_000, 10))
    state, _ = apply(state, EndTxn("t1", pid, epoch, 1, 11))  # answered: decision durable
    state, result = apply(state, AddPartitionsToTxn("t1", pid, epoch, ("a:1",), 2_000, 12))
    txn = state.transactions["t1"]
    assert isinstance(result, Applied) and txn.state == "prepare_commit"
    assert txn.partitions == ("a:0",) and txn.next_partitions == ("a:1",)
    r = reject(state, EndTxn("t1", pid, epoch, 1, 13))  # the next one began: no retry
    assert r.code == REJECT_CONCURRENT_TRANSACTIONS
    state, result = apply(state, CompleteTxn("t1", epoch, "prepare_commit", 14))
    txn = state.transactions["t1"]
    assert isinstance(result, Applied) and txn.state == "ongoing"
    assert (txn.partitions, txn.next_partitions, txn.started_ms, txn.timeout_ms) == (
        ("a:1",), (), 14, 2_000,
    )  # fmt: skip
    # A queue behind a producer fenced meanwhile is dropped: nothing opens for it.
    state, _ = apply(state, EndTxn("t1", pid, epoch, 0, 15))
    state, _ = apply(state, AddPartitionsToTxn("t1", pid, epoch, ("a:2",), 1_000, 16))
    state, _ = apply(state, InitProducer("t1", 17))
    state, _ = apply(state, CompleteTxn("t1", epoch, "prepare_abort", 18))
    txn = state.transactions["t1"]
    assert (txn.state, txn.partitions, txn.next_partitions) == ("complete_abort", (), ())


def test_a_decision_bumps_the_epoch_and_a_retry_gets_the_same_identity() -> None:
    state = base()
    pid, epoch = state.transactional_ids["t1"][:2]
    state, _ = apply(state, AddPartitionsToTxn("t1", pid, epoch, ("a:0",), 1_000, 10))
    state, result = apply(state, EndTxnBumpEpoch("t1", pid, epoch, 1, 11))
    assert isinstance(result, Applied) and result.producer == (pid, epoch + 1)
    txn = state.transactions["t1"]
    assert (txn.state, txn.marker_epoch) == ("prepare_commit", epoch + 1)
    assert state.transactional_ids["t1"][:2] == (pid, epoch + 1)
    # A retry of the decision with the old epoch: the same answer, nothing changed.
    again, result = apply(state, EndTxnBumpEpoch("t1", pid, epoch, 1, 12))
    assert isinstance(result, Applied) and result.producer == (pid, epoch + 1)
    assert again.transactions == state.transactions
    assert reject(state, EndTxnBumpEpoch("t1", pid, epoch, 0, 12)).code == REJECT_INVALID_TXN_STATE
    # The old epoch can add nothing; the new one's add waits behind the markers.
    r = reject(state, AddPartitionsToTxn("t1", pid, epoch, ("a:1",), 1_000, 13))
    assert (r.code, r.field) == (REJECT_PRODUCER_FENCED, "producer_epoch")
    state, _ = apply(state, AddPartitionsToTxn("t1", pid, epoch + 1, ("a:1",), 1_000, 13))
    assert state.transactions["t1"].next_partitions == ("a:1",)
    state, _ = apply(state, CompleteTxn("t1", epoch, "prepare_commit", 14))
    txn = state.transactions["t1"]
    assert (txn.producer_epoch, txn.state, txn.partitions) == (epoch + 1, "ongoing", ("a:1",))
    # A newer instance since: the old decision's retry is fenced.
    state, _ = apply(state, InitProducer("t1", 15))
    r = reject(state, EndTxnBumpEpoch("t1", pid, epoch, 1, 16))
    assert r.code == REJECT_PRODUCER_FENCED


def test_at_the_last_epoch_the_decision_moves_to_a_new_producer_id() -> None:
    state = base()
    pid = state.transactional_ids["t1"][0]
    last = 32_766  # epoch + 1 reaches the batch header's int16 maximum
    state = replace(state, transactional_ids=Map({"t1": (pid, last, 3)}))
    state, _ = apply(state, AddPartitionsToTxn("t1", pid, last, ("a:0",), 1_000, 10))
    fresh = state.next_producer_id
    state, result = apply(state, EndTxnBumpEpoch("t1", pid, last, 0, 11))
    assert isinstance(result, Applied) and result.producer == (fresh, 0)
    assert state.next_producer_id == fresh + 1
    txn = state.transactions["t1"]
    assert (txn.producer_id, txn.producer_epoch, txn.marker_epoch) == (pid, last, last + 1)
    state, _ = apply(state, AddPartitionsToTxn("t1", fresh, 0, ("a:2",), 1_000, 12))
    state, _ = apply(state, CompleteTxn("t1", last, "prepare_abort", 13))
    txn = state.transactions["t1"]
    assert (txn.producer_id, txn.producer_epoch, txn.state) == (fresh, 0, "ongoing")


EXPIRY_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["t0", "t1", "t2", "t3"]),
        st.sampled_from(["init", "add", "decide", "complete"]),
        st.integers(0, 40),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(steps=EXPIRY_STEPS, retention=st.integers(0, 80), legacy=st.booleans())
def test_expiry_forgets_idle_ids_with_their_transactions_never_an_open_one(
    steps: list[tuple[str, str, int]], retention: int, legacy: bool
) -> None:
    """ExpireTransactions forgets exactly the ids unused since the horizon whose
    transaction is not open, from both maps, and the records an ExpireTransactionalIds
    (`legacy`, what brokers proposed before) left without an id; nothing else moves."""
    state, now = base(), 10
    for tid, action, elapsed in steps:
        now += elapsed
        identity = state.transactional_ids.get(tid)
        txn = state.transactions.get(tid)
        if action == "init" or identity is None:
            command: object = InitProducerFenceable(tid, now)
        elif action == "add":
            command = AddPartitionsToTxn(tid, identity[0], identity[1], ("a:0",), 60_000, now)
        elif action == "decide":
            command = EndTxnBumpEpoch(tid, identity[0], identity[1], 1, now)
        elif txn is not None and txn.state.startswith("prepare_"):
            command = CompleteTxn(tid, txn.producer_epoch, txn.state, now)
        else:
            continue
        state, _ = apply(state, command)  # refusals are part of the history
    if legacy:
        state, _ = apply(state, ExpireTransactionalIds(retention, now))
    now += 1
    horizon = now - retention
    after, result = apply(state, ExpireTransactions(retention, now))
    assert isinstance(result, Applied)
    ids, txns = state.transactional_ids, state.transactions

    def kept(tid: str) -> bool:
        txn = txns.get(tid)
        if txn is not None and txn.is_open:
            return True
        return tid in ids and ids[tid][2] > horizon

    assert dict(after.transactional_ids) == {t: p for t, p in ids.items() if kept(t)}
    assert dict(after.transactions) == {t: x for t, x in txns.items() if kept(t)}
    assert all(t in after.transactional_ids or x.is_open for t, x in after.transactions.items())
    assert after.transactions_open == state.transactions_open  # never an open one
    again, _ = apply(after, ExpireTransactions(retention, now))
    assert again.transactional_ids == after.transactional_ids
    assert again.transactions == after.transactions


def test_expired_records_no_longer_count_against_the_limit() -> None:
    """The leak ExpireTransactionalIds left: its ids went, their records stayed and kept
    counting against transactional_ids_max, so at the limit every new id was refused for
    ever. ExpireTransactions forgets the records with the ids."""
    state = base()
    state = replace(state, config=replace(state.config, transactional_ids_max=2))
    for tid in ("t1", "t2"):
        state, init = apply(state, InitProducerFenceable(tid, 4))
        pid, epoch = init.producer  # type: ignore[union-attr]
        state, _ = apply(state, AddPartitionsToTxn(tid, pid, epoch, ("a:0",), 1_000, 5))
        state, _ = apply(state, EndTxnBumpEpoch(tid, pid, epoch, 0, 6))
        state, done = apply(state, CompleteTxn(tid, epoch, "prepare_abort", 7))
        assert isinstance(done, Applied), done
    legacy, _ = apply(state, ExpireTransactionalIds(10, 100))
    assert len(legacy.transactional_ids) == 0 and len(legacy.transactions) == 2
    for expired in (legacy, apply(state, ExpireTransactions(10, 100))[0]):
        fresh, init = apply(expired, InitProducerFenceable("t3", 101))
        pid, epoch = init.producer  # type: ignore[union-attr]
        _, add = apply(fresh, AddPartitionsToTxn("t3", pid, epoch, ("a:0",), 1_000, 102))
        if expired is legacy:
            assert isinstance(add, Rejected) and "at most 2" in add.message
        else:
            assert isinstance(add, Applied), add
    cleaned, _ = apply(legacy, ExpireTransactions(10, 101))
    assert len(cleaned.transactions) == 0

"""Transactions: the coordinator's driver, the producer-facing calls, read_committed reads.

The coordinator's state is the metadata group's transactions domain
(dmq/metadata/transactions.py); this service is its hands on the metadata leader. The
life of one transaction (KIP-98, with KIP-890's server-side adds):

1. `POST /v1/producers {"transactional_id"}` (produce.py's init_producer) gives the
   producer id and a new epoch, which fences any older instance;
2. each transactional produce (`?transactional_id=`) first proposes `AddPartitionsToTxn`
   (`before_append`; not when this broker's applied state already shows the transaction
   of that producer id and epoch ongoing with the partition): the coordinator knows every
   partition before it holds a batch; the batches carry the transactional attribute and
   the producer id and epoch;
3. `send_offsets_to_transaction` proposes `AddOffsetsToTxn` (generation checked now);
4. commit or abort proposes `EndTxnBumpEpoch`: `prepare_commit` / `prepare_abort` is
   durable in the metadata Raft log before any marker exists: that is the decision; the
   same entry bumps the producer's epoch (KIP-890 part 2), and the answer gives the
   producer the id and epoch of its next transaction (`next_producer_id`,
   `next_producer_epoch`), its sequences starting over;
5. the driver (`loop`, on the metadata leader only) writes a marker (a control batch) to
   every partition of the transaction, acks=all through each partition's Raft group,
   then proposes `CompleteTxn` (a commit's group offsets become committed there). A
   bumped marker carries the new epoch: the partition fences the transaction's epoch as
   it closes it, so a late batch of it is refused there;
6. a new metadata leader finds `prepare_*` transactions in the state it applied and does
   step 5 again: markers are idempotent (a marker of an epoch the producer already has
   in the partition is refused as a duplicate, which the driver counts as written), so a
   failover anywhere in step 5 never half-commits;
7. the driver also aborts (`AbortTxn`) an ongoing transaction whose producer was fenced
   by a newer epoch, or that outlived its `timeout_ms` (`transaction_timeout_ms`, default
   60 s): its markers carry epoch + 1, so the partitions refuse the old producer's
   late batches.

The commit call answers once the transaction is complete (or, if the markers take longer
than the request timeout, with `prepare_commit`: decided and durable, finished by the
driver). `DMQ_TXN_MARKER_DELAY_MS` (tests only) delays step 5 so a test can kill the
leader between the decision and the markers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final, Literal

from dmq import errors, planted
from dmq.broker.context import BrokerContext
from dmq.broker.produce import BeforeAppend, ProduceService
from dmq.broker.types import FetchResult
from dmq.metadata.machine import (
    AbortTxn,
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    CompleteTxn,
    EndTxnBumpEpoch,
    Transaction,
    add_status,
    open_transactions,
    transactions_to_abort,
    transactions_to_finish,
)
from dmq.metadata.service import wall_ms
from dmq.partition.replica import PartitionReplica
from dmq.partition.transactions import encode_marker

_log = logging.getLogger("dmq.broker.transactions")

Isolation = Literal["read_uncommitted", "read_committed"]
ISOLATIONS: Final = ("read_uncommitted", "read_committed")
TRANSACTION_TIMEOUT_MS_DEFAULT: Final = 60_000  # Kafka's transaction.timeout.ms default
DRIVER_INTERVAL_S: Final = 0.05  # how often the leader looks for work (decided, timed out)
SCAN_INTERVAL_S: Final = 1.0  # with an unchanged state: timeouts and marker retries
COMMIT_POLL_S: Final = 0.02  # a commit call's look at the state when no local driver runs it
# An add waiting for the previous transaction's markers looks again at least this often
# (it wakes on every applied metadata change; this bounds a missed wake-up).
CONCURRENT_WAIT_S: Final = 0.05
EndWait = Literal["complete", "decision"]
END_WAITS: Final = ("complete", "decision")
MARKER_DELAY_ENV: Final = "DMQ_TXN_MARKER_DELAY_MS"  # tests: a window before the markers


class TransactionsService:
    """The transaction coordinator's driver and calls (module docstring)."""

    def __init__(self, ctx: BrokerContext, produce: ProduceService) -> None:
        self._ctx = ctx
        self._produce = produce
        self._finishing: dict[str, asyncio.Task[None]] = {}  # transactional id -> its markers
        self._marker_delay_s = int(os.environ.get(MARKER_DELAY_ENV, "0") or 0) / 1000
        self._scanned: object = None  # the metadata state the driver last scanned
        self._next_scan = 0.0  # monotonic time of the next scan of an unchanged state

    # --- producer-facing ------------------------------------------------------------------

    def before_append(self, transactional_id: str, timeout_ms: int) -> BeforeAppend:
        """The hook a transactional produce runs before appending (step 2)."""

        async def add(topic: str, partitions: list[int], producer_id: int, epoch: int) -> None:
            names = tuple(f"{topic}:{p}" for p in partitions)
            txn = self._ctx.metadata.state.transactions.get(transactional_id)
            if add_status(txn, (producer_id, epoch), names) == "added":
                # Added before (this broker applied it): no Raft round. The epoch bump
                # makes (producer id, epoch) name one transaction, so a state that lags
                # can only show a transaction this batch belongs to; if it was decided
                # meanwhile, the batch joins it before its marker or is refused after.
                return
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._ctx.timeout_s
            while True:
                await self._propose_after_previous(
                    lambda: AddPartitionsToTxn(
                        transactional_id, producer_id, epoch, names, timeout_ms, wall_ms()
                    ),
                    deadline,
                )
                if await self._added(transactional_id, (producer_id, epoch), names, deadline):
                    return
                if loop.time() >= deadline:
                    raise errors.ConcurrentTransactions(
                        f"the last transaction of {transactional_id!r} did not complete in "
                        f"{self._ctx.timeout_s} s",
                        field="transactional_id",
                    )

        return add

    async def _added(
        self, tid: str, producer: tuple[int, int], names: tuple[str, ...], deadline: float
    ) -> bool:
        """After an applied add: True once the transaction of `producer` (id, epoch) is
        ongoing with `names` (at once, unless the add was queued behind the previous
        transaction's markers: then when its CompleteTxn opens this one); False if the
        state moved elsewhere (propose again: it answers what is wrong) or at the
        deadline."""
        loop = asyncio.get_running_loop()
        while True:
            status = add_status(self._ctx.metadata.state.transactions.get(tid), producer, names)
            if status == "added":
                return True
            if status != "queued":
                return False
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await self._ctx.metadata.wait_changed(min(remaining, CONCURRENT_WAIT_S))

    async def _propose_after_previous(
        self, command: Callable[[], Any], deadline: float | None = None
    ) -> None:
        """Propose an add; while the transactional id's previous transaction is still
        writing its markers (`concurrent_transactions`: the commit answered once its
        decision was durable), wait here for it to complete and propose again, up to the
        request timeout. The next transaction's first batch thus waits on the broker for
        the previous one's markers instead of going back to the client and retrying
        after a back-off (Kafka's client retries CONCURRENT_TRANSACTIONS)."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self._ctx.timeout_s
        while True:
            try:
                await self._ctx.metadata.propose(command())
                return
            except errors.ConcurrentTransactions:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise
                await self._ctx.metadata.wait_changed(min(remaining, CONCURRENT_WAIT_S))

    async def add_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        *,
        group: str,
        member_id: str,
        generation: int,
        offsets: tuple[tuple[str, int, int], ...],
        timeout_ms: int,
    ) -> dict[str, Any]:
        """Step 3: the group's offsets join the transaction."""
        items = tuple(f"{t}:{p}:{o}" for t, p, o in offsets)
        await self._propose_after_previous(
            lambda: AddOffsetsToTxn(
                transactional_id,
                producer_id,
                epoch,
                group,
                member_id,
                generation,
                items,
                timeout_ms,
                wall_ms(),
            )  # fmt: skip
        )
        return self.describe(transactional_id)

    async def end(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        *,
        commit: bool,
        wait: EndWait = "complete",
    ) -> dict[str, Any]:
        """Step 4, then, with wait="complete", wait (up to the request timeout) for step 5;
        with wait="decision" answer once the decision is durable (as Kafka's EndTxn): the
        markers follow, and the producer's next add waits for them on the broker. The
        answer names the producer id and epoch of the next transaction."""
        applied = await self._ctx.metadata.propose(
            EndTxnBumpEpoch(transactional_id, producer_id, epoch, int(commit), wall_ms())
        )
        following = applied.producer or (producer_id, epoch)  # None: decided before the bump
        bumped = {"next_producer_id": following[0], "next_producer_epoch": following[1]}
        self._kick()
        if wait == "decision":
            return self.describe(transactional_id) | bumped
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._ctx.timeout_s
        while loop.time() < deadline:
            txn = self._ctx.metadata.state.transactions.get(transactional_id)
            if txn is None or txn.producer_epoch != epoch or not txn.is_open:
                break
            task = self._finishing.get(transactional_id)
            if task is None:  # not (or no longer) the leader's driver: look again soon
                await asyncio.sleep(COMMIT_POLL_S)
                self._kick()
                continue
            with contextlib.suppress(TimeoutError):  # the markers, then CompleteTxn
                await asyncio.wait_for(asyncio.shield(task), deadline - loop.time())
        return self.describe(transactional_id) | bumped

    def check_stable(self, group: str) -> None:
        """Refuse (retriable) a read of `group`'s committed offsets while an open
        transaction carries offsets for it (Kafka's UNSTABLE_OFFSET_COMMIT, KIP-447): a
        consume-transform-produce restarting from them would process its input again if
        that transaction then commits."""
        prefix = f"{group}:"
        for tid, txn in open_transactions(self._ctx.metadata.state):
            if any(o.startswith(prefix) for o in txn.offsets):
                raise errors.ConcurrentTransactions(
                    f"the transaction of {tid!r} ({txn.state}) carries offsets of group "
                    f"{group!r}: read them again once it ends",
                    field="group",
                )

    def describe(self, transactional_id: str) -> dict[str, Any]:
        txn = self._ctx.metadata.state.transactions.get(transactional_id)
        if txn is None:
            raise errors.TransactionNotFound(
                f"transactional id {transactional_id!r} has no transaction",
                field="transactional_id",
            )
        return transaction_json(transactional_id, txn, wall_ms())

    def list_all(self) -> list[dict[str, Any]]:
        """Every transactional id's transaction, for operators (`dmq txn list`)."""
        now = wall_ms()
        state = self._ctx.metadata.state
        return [transaction_json(t, x, now) for t, x in sorted(state.transactions.items())]

    # --- the driver (steps 5 to 7) --------------------------------------------------------

    def _is_leader(self) -> bool:
        replica = self._ctx.metadata.replica
        return replica is not None and replica.status().is_leader

    def _kick(self) -> None:
        """Start the markers of every decided transaction now (if this broker leads)."""
        if not self._is_leader():
            return
        for tid, txn in transactions_to_finish(self._ctx.metadata.state):
            if tid not in self._finishing:
                task = asyncio.get_running_loop().create_task(self._finish(tid, txn))
                self._finishing[tid] = task
                task.add_done_callback(functools.partial(self._finished, tid))

    def _finished(self, tid: str, _: asyncio.Task[None]) -> None:
        self._finishing.pop(tid, None)

    async def loop(self) -> None:
        """Background duty: on the metadata leader, finish decided transactions and abort
        fenced or timed-out ones; elsewhere, nothing."""
        while True:
            await asyncio.sleep(DRIVER_INTERVAL_S)
            try:
                if not self._ctx.ready or not self._is_leader():
                    continue
                # A scan walks every transactional id: only when the state changed, or
                # for timeouts and retries of failed markers, once per SCAN_INTERVAL_S.
                state, now = self._ctx.metadata.state, time.monotonic()
                if state is self._scanned and now < self._next_scan:
                    continue
                self._scanned, self._next_scan = state, now + SCAN_INTERVAL_S
                for tid, reason in transactions_to_abort(state, wall_ms()):
                    txn = self._ctx.metadata.state.transactions[tid]
                    with contextlib.suppress(errors.ClientError):  # moved on meanwhile
                        await self._ctx.metadata.propose(
                            AbortTxn(tid, txn.producer_epoch, reason, wall_ms())
                        )
                        _log.info("aborted the transaction of %r: %s", tid, reason)
                self._kick()
            except errors.DmqError as exc:
                _log.info("transaction driver: %s", exc)

    async def _finish(self, tid: str, txn: Transaction) -> None:
        """Step 5 for one decided transaction; on failure the next tick tries again."""
        try:
            if self._marker_delay_s:
                await asyncio.sleep(self._marker_delay_s)
            commit = txn.state == "prepare_commit"
            partitions = list(txn.partitions)
            if commit and planted.active("txn-partial-markers"):
                partitions = partitions[:1]
            # Bumped (its epoch above the transaction's, module docstring step 5) unless the
            # producer was at the last epoch: then it closes as markers did before the bump.
            ended = txn.producer_epoch if txn.marker_epoch > txn.producer_epoch else None
            marker = encode_marker(txn.producer_id, txn.marker_epoch, commit, wall_ms(), ended)
            await asyncio.gather(*(self._write_marker(p, marker) for p in partitions))
            if not self._is_leader():
                return  # the new leader completes it (its markers are idempotent)
            await self._ctx.metadata.propose(
                CompleteTxn(tid, txn.producer_epoch, txn.state, wall_ms())
            )
        except errors.DmqError as exc:
            _log.info("markers of %r not all written yet: %s", tid, exc)

    async def _write_marker(self, partition_text: str, marker: bytes) -> None:
        topic, _, number = partition_text.rpartition(":")
        # ProducerFenced: a newer epoch's marker is there already, this one is moot; or
        # (DuplicateMarkerError) this very marker is: written before this attempt.
        with contextlib.suppress(errors.ProducerFenced):
            await self._produce.append_marker(topic, int(number), marker)


def transaction_json(tid: str, txn: Transaction, now_ms: int) -> dict[str, Any]:
    """The operator's view of one transaction (GET /v1/transactions)."""
    return {
        "transactional_id": tid,
        "producer_id": txn.producer_id,
        "producer_epoch": txn.producer_epoch,
        "state": txn.state,
        "partitions": list(txn.partitions),
        "offsets": list(txn.offsets),
        "started_ms": txn.started_ms,
        "age_ms": max(0, now_ms - txn.started_ms) if txn.is_open else 0,
        "timeout_ms": txn.timeout_ms,
        "fenced": txn.fenced,
    }


async def read_committed(
    replica: PartitionReplica,
    topic: str,
    partition: int,
    offset: int,
    max_bytes: int,
    max_records: int,
    raw: bool,
) -> FetchResult:
    """A read_committed fetch (fetch.py): nothing at or past the LSO; decoded records
    without aborted ones; raw batches with the aborted transactions they overlap, for the
    client to filter (as Kafka's fetch answers)."""
    lso = replica.last_stable_offset
    end = replica.high_watermark if planted.active("read-committed-leak") else lso
    if raw:
        chunk = await replica.read(offset, max_bytes, end_offset=end)
        aborted = await replica.aborted_between(offset, chunk.next_offset)
        return FetchResult(
            topic, partition, offset, chunk.next_offset, chunk.high_watermark,
            chunk.log_start_offset, raw=chunk, last_stable_offset=lso,
            aborted=tuple(aborted),
        )  # fmt: skip
    records, next_offset, hw, start = await replica.read_committed_records(
        offset, end, max_bytes, max_records
    )
    result = FetchResult(topic, partition, offset, next_offset, hw, start, records=records)
    return replace(result, last_stable_offset=lso)

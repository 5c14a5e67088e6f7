"""The transactional side of `AsyncProducer` (a `transactional_id`): begin, send inside the
transaction, send a consumer group's offsets, commit or abort.

As confluent-kafka / kafka-python, over dmq's HTTP API (dmq/broker/transactions.py):

1. the producer gets its id and epoch (`POST /v1/producers {"transactional_id"}`), which
   fences any older instance with the same transactional id and aborts its transaction;
2. `begin_transaction()` is local: from now on each batch carries the transactional
   attribute, and each produce request `?transactional_id=&transaction_timeout_ms=`, so
   the broker adds its partition to the transaction before appending (KIP-890);
3. `send_offsets_to_transaction(offsets, consumer)` posts the group's offsets to
   `/v1/transactions/{id}/offsets` with the member's id and generation (the coordinator
   checks the member holds those partitions now);
4. `commit_transaction()` flushes; if any send of the transaction failed it raises that
   error (the transaction must then be aborted), else posts `.../commit`, which answers
   once the decision is durable (`transaction_commit_wait="decision"`, the default, as
   Kafka's EndTxn) or every marker is written (`"complete"`). The coordinator bumps the
   epoch with the decision (KIP-890 part 2): the answer's `next_producer_id` and
   `next_producer_epoch` are the producer's from now on, every sequence starting over,
   so a late batch of the transaction just ended can never join the next one;
5. `abort_transaction()` flushes and posts `.../abort`, and takes the bumped epoch as a
   commit does (which also starts over the sequences a failed send left unknown); if
   nothing reached the coordinator it takes a new epoch (step 1 again) after a failure.

`ProducerFenced` (409) means a newer instance owns the transactional id, or the
coordinator aborted this one's transaction after its `transaction_timeout_ms`: close the
producer (or start it again, which takes a new epoch).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol
from urllib.parse import quote

from dmq.client import _limits
from dmq.client._http import Transport
from dmq.client._types import TopicPartition
from dmq.errors import DmqError

TRANSACTION_TIMEOUT_MS_DEFAULT = 60_000  # Kafka's transaction.timeout.ms
# What commit_transaction/abort_transaction wait for: "decision" (as Kafka's EndTxn) once
# the decision is durable, the markers following (a read_committed reader may see the
# records a moment later; the producer's next transaction waits for them on the broker);
# "complete" once every marker is written and the group offsets are committed.
CommitWait = Literal["decision", "complete"]


class GroupMember(Protocol):
    """What `send_offsets_to_transaction` needs of a group consumer."""

    def group_metadata(self) -> tuple[str, str, int]: ...


class Transaction:
    """The client-side state of one transactional producer's transactions."""

    def __init__(
        self,
        transport: Transport,
        transactional_id: str,
        timeout_ms: int,
        commit_wait: CommitWait = "decision",
    ) -> None:
        if not 1 <= timeout_ms <= 900_000:
            raise ValueError("transaction_timeout_ms must be in 1..900000")
        if commit_wait not in ("decision", "complete"):
            raise ValueError('transaction_commit_wait must be "decision" or "complete"')
        self.commit_wait = commit_wait
        self.transport = transport
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.in_transaction = False
        self.error: DmqError | None = None  # the first failed send of this transaction
        self.added = False  # a batch or offsets reached the broker in this transaction
        self.path = f"/v1/transactions/{quote(transactional_id, safe='')}"

    def params(self) -> dict[str, str]:
        """The produce request's query parameters (step 2)."""
        return {
            "transactional_id": self.transactional_id,
            "transaction_timeout_ms": str(self.timeout_ms),
        }

    def check_open(self) -> None:
        if not self.in_transaction:
            raise RuntimeError("a transactional producer sends inside a transaction: "
                               "call begin_transaction() first")  # fmt: skip

    def begin(self) -> None:
        if self.in_transaction:
            raise RuntimeError("a transaction is already open: commit or abort it first")
        self.in_transaction = True
        self.error = None
        self.added = False

    def failed(self, error: DmqError) -> None:
        if self.error is None:
            self.error = error

    async def send_offsets(
        self,
        producer: tuple[int, int],
        offsets: Mapping[TopicPartition | tuple[str, int], int],
        consumer: GroupMember | str,
    ) -> None:
        """Step 3. `offsets`: the next offset to read per partition (as a commit)."""
        self.check_open()
        if isinstance(consumer, str):
            group, member_id, generation = consumer, "", -1  # a group without members
        else:
            group, member_id, generation = consumer.group_metadata()
        body = {
            "producer_id": producer[0],
            "producer_epoch": producer[1],
            "group": group,
            "member_id": member_id,
            "generation": generation,
            "transaction_timeout_ms": self.timeout_ms,
            "offsets": [
                {"topic": tp[0], "partition": tp[1], "offset": int(o)} for tp, o in offsets.items()
            ],
        }
        self.added = True
        await self.transport.request("POST", self.path + "/offsets", json_body=body)

    async def end(self, producer: tuple[int, int], *, commit: bool) -> dict[str, Any]:
        """Steps 4 and 5 (after the caller flushed)."""
        self.check_open()
        if commit and self.error is not None:
            raise self.error
        if not self.added and self.error is None:
            self.in_transaction = False
            return {"state": "empty"}  # nothing reached the coordinator
        body = {"producer_id": producer[0], "producer_epoch": producer[1], "wait": self.commit_wait}
        path = self.path + ("/commit" if commit else "/abort")
        try:
            answer: dict[str, Any] = (
                await self.transport.request("POST", path, json_body=body)
            ).json()
        except DmqError as error:
            if not commit and error.code == "invalid_txn_state":
                answer = {"state": "empty"}  # nothing was added: nothing to abort
            else:
                raise
        self.in_transaction = False
        return answer


def offsets_of(records: Iterable[Any]) -> dict[TopicPartition, int]:
    """The offsets to commit after `records` (ConsumerRecords): the next one per partition."""
    out: dict[TopicPartition, int] = {}
    for r in records:
        tp = TopicPartition(r.topic, r.partition)
        out[tp] = max(out.get(tp, 0), r.offset + 1)
    return out


async def list_transactions(
    url: str, *, default_api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT
) -> list[dict[str, Any]]:
    """Every transactional id's current or last transaction (`GET /v1/transactions`):
    state, age, partitions, pending offsets; for operators (`dmq txn list`)."""
    transport = Transport(
        url,
        request_timeout_ms=_limits.REQUEST_TIMEOUT_MS_DEFAULT,
        api_timeout_ms=default_api_timeout_ms,
    )
    try:
        doc = (await transport.request("GET", "/v1/transactions")).json()
    finally:
        await transport.close()
    return list(doc["transactions"])


async def end_transaction(
    url: str, transactional_id: str, producer: tuple[int, int], *, commit: bool
) -> dict[str, Any]:
    """Commit or abort a transaction another process left open (its producer id and
    epoch): spark_io's exactly-once writer commits its tasks' transactions this way."""
    transport = Transport(url, request_timeout_ms=_limits.REQUEST_TIMEOUT_MS_DEFAULT)
    path = f"/v1/transactions/{quote(transactional_id, safe='')}/" + (
        "commit" if commit else "abort"
    )
    body = {"producer_id": producer[0], "producer_epoch": producer[1]}
    try:
        return dict((await transport.request("POST", path, json_body=body)).json())
    finally:
        await transport.close()


async def describe_transaction(
    url: str,
    transactional_id: str,
    *,
    default_api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT,
) -> dict[str, Any]:
    """One transactional id's current or last transaction (`GET /v1/transactions/{id}`):
    state, producer id and epoch, age, partitions, pending offsets (`dmq txn describe`)."""
    transport = Transport(
        url,
        request_timeout_ms=_limits.REQUEST_TIMEOUT_MS_DEFAULT,
        api_timeout_ms=default_api_timeout_ms,
    )
    try:
        path = f"/v1/transactions/{quote(transactional_id, safe='')}"
        return dict((await transport.request("GET", path)).json())
    finally:
        await transport.close()

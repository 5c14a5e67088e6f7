"""Transaction routes (dmq/broker/transactions.py has the protocol, http_api/README.md the
API), and the transactional parameters of produce and fetch.

Thin handlers: parse and bound the input, call the broker's TransactionsService, encode.
The coordinator's routes are answered by the metadata group's leader (relayed there, as
the group routes are), whose driver writes the markers.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from dmq import errors, limits
from dmq.broker import Broker
from dmq.broker.produce import BeforeAppend
from dmq.broker.transactions import END_WAITS, TRANSACTION_TIMEOUT_MS_DEFAULT
from dmq.broker.types import FetchResult
from http_api import codec
from http_api.codec import isolation_param
from http_api.forward import BROKER, forwarded_hops
from http_api.groups import _int, _name, _offsets

TRANSACTION_TIMEOUT_MS_MAX = 900_000  # dmq/metadata/transactions.py TXN_TIMEOUT_MS_MAX
TRANSACTIONAL_ID_CHARS_MAX = 249  # as topic names (dmq/metadata/state.py)
ABORTED_HEADER = "X-Dmq-Aborted-Transactions"  # binary read_committed: [[pid, first, marker]]
LSO_HEADER = "X-Dmq-Last-Stable-Offset"


def _routed(request: web.Request) -> Broker:
    broker: Broker = request.app[BROKER]
    if not broker.ready:
        raise errors.BrokerUnavailable("the broker is starting or stopping", retry_after_ms=500)
    broker.groups.route(forwarded_hops(request))  # the metadata leader answers
    return broker


def _tid(request: web.Request) -> str:
    return _name(
        request.match_info["transactional_id"], "transactional_id", TRANSACTIONAL_ID_CHARS_MAX
    )


def _producer(doc: dict[str, Any]) -> tuple[int, int]:
    return (
        _int(doc, "producer_id", None, 0, 2**63 - 1),
        _int(doc, "producer_epoch", None, 0, 2**15 - 1),
    )


def _timeout_ms(doc: dict[str, Any]) -> int:
    return _int(
        doc, "transaction_timeout_ms", TRANSACTION_TIMEOUT_MS_DEFAULT, 1, TRANSACTION_TIMEOUT_MS_MAX
    )


async def end_transaction(request: web.Request) -> web.Response:
    """POST /v1/transactions/{transactional_id}/commit and .../abort."""
    doc = codec.parse_json_object(await request.read())
    codec.only_fields(doc, {"producer_id", "producer_epoch", "wait"})
    tid = _tid(request)
    producer_id, epoch = _producer(doc)
    wait = doc.get("wait", "complete")
    if wait not in END_WAITS:
        raise errors.InvalidRequest(
            f"wait must be one of {', '.join(END_WAITS)}, got {wait!r}", field="wait"
        )
    commit = request.path.endswith("/commit")
    broker = _routed(request)
    answer = await broker.transactions.end(tid, producer_id, epoch, commit=commit, wait=wait)
    return codec.json_response(answer)


async def add_offsets(request: web.Request) -> web.Response:
    """POST /v1/transactions/{transactional_id}/offsets: a group's offsets, committed with
    the transaction (send_offsets_to_transaction)."""
    doc = codec.parse_json_object(await request.read())
    codec.only_fields(
        doc,
        {"producer_id", "producer_epoch", "group", "member_id", "generation", "offsets",
         "transaction_timeout_ms"},
    )  # fmt: skip
    tid = _tid(request)
    producer_id, epoch = _producer(doc)
    group = _name(doc.get("group"), "group")
    member_id = doc.get("member_id", "")
    if not isinstance(member_id, str) or len(member_id) > limits.GROUP_NAME_CHARS_MAX:
        raise errors.InvalidRequest("member_id must be a string", field="member_id")
    generation = _int(doc, "generation", -1, -1, 2**31 - 1)
    offsets = _offsets(doc)
    broker = _routed(request)
    answer = await broker.transactions.add_offsets(
        tid, producer_id, epoch, group=group, member_id=member_id, generation=generation,
        offsets=offsets, timeout_ms=_timeout_ms(doc),
    )  # fmt: skip
    return codec.json_response(answer)


async def describe_transaction(request: web.Request) -> web.Response:
    broker = _routed(request)
    return codec.json_response(broker.transactions.describe(_tid(request)))


async def list_transactions(request: web.Request) -> web.Response:
    broker = _routed(request)
    return codec.json_response({"transactions": broker.transactions.list_all()})


# --- produce and fetch parameters ------------------------------------------------------------


def produce_hook(request: web.Request, broker: Broker) -> BeforeAppend | None:
    """`?transactional_id=&transaction_timeout_ms=` of a produce: the hook that adds its
    partitions to the transaction before the append (None for a plain produce)."""
    tid = request.query.get("transactional_id")
    if tid is None or tid == "":
        if "transaction_timeout_ms" in request.query:
            raise errors.InvalidRequest(
                "transaction_timeout_ms needs transactional_id", field="transaction_timeout_ms"
            )
        return None
    _name(tid, "transactional_id", TRANSACTIONAL_ID_CHARS_MAX)
    timeout_ms = codec.int_param(
        request, "transaction_timeout_ms", TRANSACTION_TIMEOUT_MS_DEFAULT, 1,
        TRANSACTION_TIMEOUT_MS_MAX,
    )  # fmt: skip
    return broker.transactions.before_append(tid, timeout_ms)


__all__ = ["TRANSACTION_ROUTES", "isolation_headers", "isolation_param", "produce_hook"]


def isolation_headers(result: FetchResult) -> dict[str, str]:
    """The LSO (every fetch) and, for a raw read_committed read, the aborted ranges."""
    out: dict[str, str] = {}
    if result.last_stable_offset is not None:
        out[LSO_HEADER] = str(result.last_stable_offset)
    if result.aborted:
        out[ABORTED_HEADER] = json.dumps([list(r) for r in result.aborted], separators=(",", ":"))
    return out


TRANSACTION_ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("GET", "/v1/transactions", list_transactions),
    ("GET", "/v1/transactions/{transactional_id}", describe_transaction),
    ("POST", "/v1/transactions/{transactional_id}/commit", end_transaction),
    ("POST", "/v1/transactions/{transactional_id}/abort", end_transaction),
    ("POST", "/v1/transactions/{transactional_id}/offsets", add_offsets),
)

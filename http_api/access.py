"""The one table of what every route touches, and the check the auth stage makes with it.

Kafka authorises each API by a fixed list of (resource, operation) pairs: OffsetCommit
needs READ on the group and READ on every topic it names, TxnOffsetCommit adds WRITE on
the transactional id, CreateTopics needs CREATE on the topic (or on the cluster). This
module is dmq's version of that list: `ROUTE_NEEDS` maps every route of the router
(method, path template: the OpenAPI document's) to the `Need`s of its call, and
`check_route` (called by http_api/auth.py's `run_authorized`, before the handler) checks
each of them. A `Need` says which resource type, which operation, and where the name
comes from:

- `cluster`: the cluster itself;
- `path:<param>`: a path parameter;
- `query:<param>`: a query parameter, when given;
- `body:<path>`: every string at a path of the JSON body: `name`, `group`,
  `topics[]` (each element), `offsets[].topic` (each element's field),
  `to.offsets[].topic`. The handler validates the body's shape and refuses what it does
  not accept; what it accepts is found here, so nothing it acts on goes unchecked;
- `run:<what>`: names known only while the call runs (the topics a pattern matches now,
  a member's assignment, a topic a produce would create, the dead-letter topic a share
  group writes later). The table names them so that they are documented in one place;
  the code that resolves them checks them (`http_api/auth.py` `require` / `may`, or the
  broker's service with the principal it was given), and the tests named in
  http_api/README.md prove each.

A route missing from the table is refused to every principal but superusers (fail
closed), and tests/http_api/test_http_access.py fails until it has its entry.

A topic the principal may not describe is refused as a missing topic (404
`topic_not_found`, the same message as for a name that exists nowhere), whatever the
operation asked: a principal learns nothing of topics it may not see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from dmq import errors
from dmq.broker.security import Principal, SecurityService
from http_api import codec


@dataclass(frozen=True, slots=True)
class Need:
    """One resource a route touches: `resource_type` an ACL resource type, or one of the
    kinds public, internal, authenticated; `source` where its name comes from (module
    docstring); `note` when it applies, for `run:` needs and the README."""

    resource_type: str
    operation: str = ""
    source: str = ""
    note: str = ""


PUBLIC: Final = Need("public")
INTERNAL: Final = Need("internal")
AUTHENTICATED: Final = Need("authenticated")
KINDS: Final = (PUBLIC, INTERNAL, AUTHENTICATED)
STATIC_SOURCES: Final = ("cluster", "path:", "query:", "body:")


def _cluster(op: str) -> Need:
    return Need("cluster", op, "cluster")


def _topic(op: str, source: str = "path:topic", note: str = "") -> Need:
    return Need("topic", op, source, note)


def _group(op: str, source: str = "path:group") -> Need:
    return Need("group", op, source)


def _share(op: str) -> Need:
    return Need("share_group", op, "path:group")


def _txn(op: str, source: str = "path:transactional_id") -> Need:
    return Need("transactional_id", op, source)


_INTERNAL_PATHS: Final = (
    ("POST", "/v1/internal/delay/{topic}/{partition}"),
    ("GET", "/v1/internal/delay/{topic}/{partition}"),
    ("GET", "/v1/internal/delay/{topic}/{partition}/pending"),
    ("GET", "/v1/internal/status"),
    ("POST", "/v1/internal/partitions/{topic}/{partition}/append"),
    ("GET", "/v1/internal/partitions/{topic}/{partition}/batches"),
    ("POST", "/v1/internal/metadata/propose"),
    ("GET", "/v1/internal/metadata"),
    ("GET", "/v1/internal/metadata/voters"),
    ("GET", "/v1/internal/partitions/{topic}/{partition}/progress"),
    ("GET", "/v1/internal/partitions/{topic}/{partition}/log"),
    ("POST", "/v1/internal/partitions/{topic}/{partition}/membership"),
    ("POST", "/v1/internal/partitions/{topic}/{partition}/transfer"),
)

# Needs several routes share.
_PRODUCE: Final = (
    _topic("write"),
    _topic("create", "run:topic", "when the topic does not exist yet (auto-created)"),
    _txn("write", "query:transactional_id"),
)
_PATTERN: Final = (
    _topic("describe", "run:pattern", "each topic the pattern matches, at every call: a "
           "topic it may not describe and read is not matched"),
    _topic("read", "run:pattern", "as above"),
)  # fmt: skip
_ASSIGNED: Final = _topic("read", "run:assignment", "each assigned topic, at every fetch")
_SUBSCRIBE: Final = (_group("read"), _topic("read", "body:topics[]"), *_PATTERN)
_V2_INSTANCE: Final = (_group("read"),)
_V2_POSITIONS: Final = (_group("read"), _topic("read", "body:partitions[].topic"))

# The one table: (method, path template) -> every resource the route touches.
ROUTE_NEEDS: Final[dict[tuple[str, str], tuple[Need, ...]]] = {
    ("GET", "/healthz"): (PUBLIC,),
    ("GET", "/readyz"): (PUBLIC,),
    ("GET", "/openapi.json"): (PUBLIC,),
    ("GET", "/ui"): (PUBLIC,),
    ("GET", "/ui/"): (PUBLIC,),
    ("GET", "/ui/{name}"): (PUBLIC,),
    ("GET", "/metrics"): (_cluster("describe"),),
    **{route: (INTERNAL,) for route in _INTERNAL_PATHS},
    # cluster
    ("GET", "/v1/cluster"): (AUTHENTICATED,),  # brokers and addresses: every client's bootstrap
    ("GET", "/v1/cluster/status"): (_cluster("describe"),),
    ("POST", "/v1/cluster/reassignments"): (_cluster("alter"),),
    ("GET", "/v1/cluster/operations"): (_cluster("describe"),),
    ("POST", "/v1/cluster/metadata-voters"): (_cluster("alter"),),
    ("GET", "/v1/cluster/features"): (_cluster("describe"),),
    ("POST", "/v1/cluster/features/finalize"): (_cluster("alter"),),
    ("POST", "/v1/cluster/brokers/{broker_id}/decommission"): (_cluster("alter"),),
    ("GET", "/v1/storage/set-aside"): (_cluster("describe"),),
    # topics, records
    ("GET", "/v1/topics"): (
        AUTHENTICATED,
        _topic("describe", "run:listed", "lists only the topics it may describe"),
    ),  # fmt: skip
    ("POST", "/v1/topics"): (_topic("create", "body:name"),),  # or create on the cluster
    ("GET", "/v1/topics/{topic}"): (_topic("describe"),),
    ("DELETE", "/v1/topics/{topic}"): (_topic("delete"),),
    ("PATCH", "/v1/topics/{topic}/config"): (_topic("alter"),),
    ("POST", "/v1/topics/{topic}/partitions"): (_topic("alter"),),
    ("POST", "/v1/topics/{topic}/partitions/{partition}/decommission"): (_topic("alter"),),
    ("POST", "/v1/topics/{topic}/records"): _PRODUCE,
    ("GET", "/v1/topics/{topic}/partitions/{partition}/records"): (_topic("read"),),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/offsets"): (_topic("describe"),),
    ("GET", "/v1/topics/{topic}/scheduled"): (_topic("describe"),),
    ("DELETE", "/v1/topics/{topic}/scheduled/{id}"): (_topic("write"),),
    # an id only; with a transactional id, Kafka's InitProducerId: it fences the holder
    ("POST", "/v1/producers"): (AUTHENTICATED, _txn("write", "body:transactional_id")),
    # consumer groups (Kafka: JoinGroup, Heartbeat, OffsetCommit, OffsetFetch, ...)
    ("GET", "/v1/groups"): (_cluster("describe"),),
    ("GET", "/v1/groups/{group}"): (
        _group("describe"),
        _topic("describe", "run:rows", "the partitions shown: only of topics it may describe"),
    ),
    ("DELETE", "/v1/groups/{group}"): (_group("delete"),),
    ("POST", "/v1/groups/{group}/members"): _SUBSCRIBE,
    ("POST", "/v1/groups/{group}/members/{member_id}/heartbeat"): (_group("read"), *_PATTERN),
    ("DELETE", "/v1/groups/{group}/members/{member_id}"): (_group("read"),),
    ("GET", "/v1/groups/{group}/members/{member_id}/records"): (_group("read"), _ASSIGNED),
    ("GET", "/v1/groups/{group}/offsets"): (
        _group("describe"),
        _topic("describe", "run:rows", "the offsets shown: only of topics it may describe"),
    ),
    ("POST", "/v1/groups/{group}/offsets"): (
        _group("read"),
        _topic("read", "body:offsets[].topic"),
    ),
    ("POST", "/v1/groups/{group}/offsets/reset"): (
        _group("delete"),
        _topic("read", "body:topics[]"),
        _topic("read", "body:to.offsets[].topic"),
    ),  # fmt: skip
    # share groups (KIP-932)
    ("GET", "/v1/share-groups"): (_cluster("describe"),),
    ("GET", "/v1/share-groups/{group}"): (_share("describe"),),
    ("PUT", "/v1/share-groups/{group}"): (
        _share("alter"),
        _topic("write", "body:dead_letter_topic"),
        _topic(
            "write",
            "run:dead_letter_topic",
            "the topic the group will use: the body's, else the one it has, else '<group>.dlq'",
        ),
        _topic(
            "create",
            "run:dead_letter_topic",
            "when it does not exist yet; both checked "
            "again at each write, for the principal that set it",
        ),
    ),  # fmt: skip
    ("DELETE", "/v1/share-groups/{group}"): (_share("delete"),),
    ("POST", "/v1/share-groups/{group}/members"): (_share("read"), _topic("read", "body:topics[]")),
    ("DELETE", "/v1/share-groups/{group}/members/{member_id}"): (_share("read"),),
    ("GET", "/v1/share-groups/{group}/members/{member_id}/records"): (_share("read"), _ASSIGNED),
    ("POST", "/v1/share-groups/{group}/members/{member_id}/acks"): (_share("read"),),
    # transactions (Kafka: EndTxn, AddOffsetsToTxn + TxnOffsetCommit)
    ("GET", "/v1/transactions"): (_cluster("describe"),),
    ("GET", "/v1/transactions/{transactional_id}"): (_txn("describe"),),
    ("POST", "/v1/transactions/{transactional_id}/commit"): (_txn("write"),),
    ("POST", "/v1/transactions/{transactional_id}/abort"): (_txn("write"),),
    ("POST", "/v1/transactions/{transactional_id}/offsets"): (
        _txn("write"),
        _group("read", "body:group"),
        _topic("read", "body:offsets[].topic"),
    ),  # fmt: skip
    # security itself (http_api/auth.py's routes)
    ("GET", "/v1/auth/whoami"): (AUTHENTICATED,),
    ("GET", "/v1/auth/users"): (_cluster("describe"),),
    ("POST", "/v1/auth/users"): (_cluster("alter"),),
    ("DELETE", "/v1/auth/users/{name}"): (_cluster("alter"),),
    ("GET", "/v1/acls"): (_cluster("describe"),),
    ("POST", "/v1/acls"): (_cluster("alter"),),
    ("DELETE", "/v1/acls"): (_cluster("alter"),),
    ("GET", "/v1/quotas"): (_cluster("describe"),),
    ("POST", "/v1/quotas"): (_cluster("alter"),),
    # Confluent REST Proxy v2 (http_api/rest_v2.py)
    ("GET", "/topics"): (
        AUTHENTICATED,
        _topic("describe", "run:listed", "lists only the topics it may describe"),
    ),  # fmt: skip
    ("GET", "/topics/{topic}"): (_topic("describe"),),
    ("POST", "/topics/{topic}"): _PRODUCE[:2],
    ("GET", "/topics/{topic}/partitions"): (_topic("describe"),),
    ("GET", "/topics/{topic}/partitions/{p}"): (_topic("describe"),),
    ("POST", "/topics/{topic}/partitions/{p}"): _PRODUCE[:2],
    ("GET", "/topics/{topic}/partitions/{p}/offsets"): (_topic("describe"),),
    ("GET", "/topics/{topic}/partitions/{p}/records"): (_topic("read"),),
    ("POST", "/consumers/{group}"): _V2_INSTANCE,
    ("DELETE", "/consumers/{group}/instances/{instance}"): _V2_INSTANCE,
    ("POST", "/consumers/{group}/instances/{instance}/subscription"): _SUBSCRIBE,
    ("GET", "/consumers/{group}/instances/{instance}/subscription"): (_group("read"), *_PATTERN),
    ("DELETE", "/consumers/{group}/instances/{instance}/subscription"): _V2_INSTANCE,
    ("GET", "/consumers/{group}/instances/{instance}/assignments"): (_group("read"), *_PATTERN),
    ("GET", "/consumers/{group}/instances/{instance}/records"): (_group("read"), _ASSIGNED),
    ("POST", "/consumers/{group}/instances/{instance}/offsets"): (
        _group("read"),
        _topic("read", "body:offsets[].topic"),
        _topic("read", "body:partitions[].topic"),
    ),  # fmt: skip
    ("GET", "/consumers/{group}/instances/{instance}/offsets"): (
        _group("describe"),
        _topic("describe", "body:partitions[].topic"),
    ),  # fmt: skip
    ("POST", "/consumers/{group}/instances/{instance}/positions"): (
        _group("read"),
        _topic("read", "body:offsets[].topic"),
    ),  # fmt: skip
    ("POST", "/consumers/{group}/instances/{instance}/positions/beginning"): _V2_POSITIONS,
    ("POST", "/consumers/{group}/instances/{instance}/positions/end"): _V2_POSITIONS,
}
_UNLISTED: Final = (Need("cluster", "all", "cluster"),)  # a route without an entry: superusers


def needs_of(request: web.Request) -> tuple[Need, ...] | None:
    """What the matched route needs; None for a request no route matched (404/405)."""
    route = request.match_info.route
    resource = route.resource
    if resource is None or not hasattr(route, "handler") or route.method == "*":
        return None
    return ROUTE_NEEDS.get((request.method, resource.canonical), _UNLISTED)


def is_static(need: Need) -> bool:
    """Checked before the handler runs (the others: by the code that resolves them)."""
    return need not in KINDS and need.source.startswith(STATIC_SOURCES)


def strings_at(doc: Any, path: str) -> list[str]:
    """Every string at `path` of a parsed JSON document (module docstring): `a.b` a field
    of an object, `a[]` each element of a list. Anything of another shape is skipped: the
    handler refuses it."""
    found = [doc]
    for step in path.split("."):
        each = step.endswith("[]")
        key = step.removesuffix("[]")
        found = [d[key] for d in found if isinstance(d, dict) and key in d]
        if each:
            found = [x for d in found if isinstance(d, list) for x in d]
    return [x for x in found if isinstance(x, str)]


async def names_of(request: web.Request, need: Need) -> list[str]:
    """The names a static need refers to in this request (none: nothing to check)."""
    kind, _, where = need.source.partition(":")
    if kind == "cluster":
        return ["cluster"]
    if kind == "path":
        return [request.match_info[where]]
    if kind == "query":
        value = request.query.get(where)
        return [] if not value else [value]
    try:
        doc = codec.parse_json_object(await request.read())
    except errors.InvalidRequest:  # not a JSON object: the handler refuses it
        return []
    if need.source == "body:name" and not isinstance(doc.get("name"), str):
        raise errors.InvalidRequest("name must be a string", field="name")
    return list(dict.fromkeys(strings_at(doc, where)))  # each name once, in order


async def check_route(
    request: web.Request, security: SecurityService, principal: Principal
) -> tuple[Need, ...]:
    """Check every static need of the matched route for `principal` (Forbidden, or
    TopicNotFound for a topic it may not describe); the route's needs."""
    needs = needs_of(request) or ()
    for need in needs:
        if is_static(need):
            for name in await names_of(request, need):
                security.check(principal, need.resource_type, name, need.operation)
    return needs


def table_markdown() -> str:
    """ROUTE_NEEDS as the Markdown table http_api/README.md shows (a test compares them)."""
    rows = ["| method | path | needs |", "|---|---|---|"]
    for (method, path), needs in ROUTE_NEEDS.items():
        if needs == (INTERNAL,):
            continue  # listed once, below the table
        cells = []
        for n in needs:
            if n in KINDS:
                cells.append(n.resource_type)
                continue
            where = "" if n.source == "cluster" else f" `{n.source}`"
            cells.append(
                f"{n.operation} {n.resource_type}{where}" + (f" ({n.note})" if n.note else "")
            )
        rows.append(f"| {method} | {path} | {'; '.join(cells)} |")
    return "\n".join(rows)


__all__ = ["AUTHENTICATED", "INTERNAL", "PUBLIC", "ROUTE_NEEDS", "Need", "check_route", "needs_of"]

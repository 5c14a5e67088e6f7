"""Authentication, ACLs and quotas on the HTTP API: the middleware's stage, the one table of
what every route needs, and the routes that manage users, ACLs and quotas.

With `--auth on` (dmq/broker/security.py has the rules), `run_authorized` (a stage of
http_api/edge.py's middleware) looks the matched route up in `ROUTE_NEEDS`
(http_api/access.py: the one table of every resource each route touches, in path, query
or body, and the check made with it):

- `PUBLIC`: nothing (probes, the OpenAPI document, the web console's static files: the
  data the console then asks for is authorised like any other call);
- `INTERNAL`: the cluster secret's signature (http_api/internal_auth.py checks it; a
  single node with auth on makes up a secret of its own, so no caller can sign);
- `AUTHENTICATED`: any valid principal (the cluster's brokers for client bootstrap, the
  topic list, which only shows topics the principal may describe, producer ids, whoami);
- `Need(resource_type, operation, source)`: an ACL on each resource named there.

`/metrics` needs describe on the cluster: it names every topic and group (Prometheus sends
the token with `authorization: {credentials: ...}`).

Another broker calling a public route on its own behalf (a group member's fetch at the
partition leader, an offset lookup) signs it with the cluster secret, as for the internal
routes: a valid signature is the principal User:broker, a superuser.

Then it: authenticates (401 with WWW-Authenticate, before anything else),
checks the ACL (403 naming the operation and resource; 404 for a topic the principal may
not describe), counts the request against the principal's quotas (429 with Retry-After,
nothing done), runs the handler and, for a read, counts the bytes it answered. A request
another broker must answer is relayed with its Authorization header, and checked there again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web

from dmq import errors, internal_auth, limits
from dmq.broker.security import CHALLENGE, QUOTA_KINDS, AclBinding, Principal, SecurityService
from http_api import codec
from http_api.access import INTERNAL, PUBLIC, Need, check_route, needs_of
from http_api.errors import response_for
from http_api.forward import broker_of
from http_api.internal_auth import verify_signed

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PRINCIPAL: Final = web.RequestKey("principal", Principal)
BROKER_PRINCIPAL: Final = Principal("broker", superuser=True)  # a signed broker-to-broker call


def _security(request: web.Request) -> SecurityService:
    return broker_of(request).security


async def run_authorized(
    request: web.Request, security: SecurityService, handler: Handler
) -> web.StreamResponse:
    """With auth on (http_api/edge.py calls this then, before the cluster id check and the
    handler): authenticate, check the route's ACL, charge the quotas, run `handler`, charge
    a read's bytes. A refused request never reaches `handler`."""
    needs = needs_of(request)
    if needs is None or needs[0] in (PUBLIC, INTERNAL):
        return await handler(request)
    try:
        principal = await _principal(request, security)
    except errors.Unauthenticated as exc:
        refusal = response_for(exc)
        refusal.headers["WWW-Authenticate"] = CHALLENGE
        return refusal
    await check_route(request, security, principal)  # every resource the table names
    writes = needs[0] == Need("topic", "write", "path:topic")
    # The bytes as read, however framed (a chunked body has no Content-Length); the
    # handler reads the same cached bytes, bounded by request_bytes_max.
    produce_bytes = len(await request.read()) if writes else 0
    reserved = security.charge_request(principal, produce_bytes, _fetch_reserve(request))
    request[PRINCIPAL] = principal
    answered = 0
    reads = needs[0].operation == "read"
    try:
        response = await handler(request)
        if reads:
            answered = _answered_bytes(response)
        return response
    finally:
        if reads or reserved:
            security.charge_fetch(principal, answered, reserved)


def _fetch_reserve(request: web.Request) -> int:
    """The bytes a request that answers records may take (its `max_bytes`, defaulted
    and bounded as http_api/codec.py's fetch_limits does; 0 for any other request):
    reserved from the principal's fetch quota while it is in flight."""
    if request.method != "GET" or not request.path.endswith("/records"):
        return 0
    config = broker_of(request).config
    raw = request.query.get("max_bytes", "")
    default = min(limits.FETCH_BYTES_DEFAULT, config.fetch_bytes_max)
    asked = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 12 else default
    return max(1, min(asked, config.fetch_bytes_max))


def _answered_bytes(response: web.StreamResponse) -> int:
    """The body's bytes: its Content-Length, else (a streamed answer) what was written."""
    if response.content_length is not None:
        return response.content_length
    return response.body_length if response.prepared else 0


async def _principal(request: web.Request, security: SecurityService) -> Principal:
    """A broker of the cluster (a call signed with the cluster secret, made on its own
    behalf: dmq/internal_auth.py, broker_headers), else the caller's credentials."""
    signature = request.headers.get(internal_auth.SIGNATURE_HEADER)
    secret = broker_of(request).cluster_secret
    if signature is not None and secret is not None:
        await verify_signed(request, secret)
        return BROKER_PRINCIPAL
    return await security.authenticate(request.headers.get("Authorization"), request.remote)


def require(request: web.Request, resource_type: str, name: str, operation: str) -> None:
    """For what the route table cannot see (the topics a group member reads, the
    transactional id a produce names, a topic a produce would create): raise Forbidden
    naming the permission (TopicNotFound for a topic the principal may not describe)
    unless this request's principal may do it. Nothing with auth off."""
    principal = request.get(PRINCIPAL)
    if principal is not None:
        _security(request).check(principal, resource_type, name, operation)


def may(request: web.Request, resource_type: str, name: str, operation: str) -> bool:
    """May this request's principal do it (always, with auth off)? For lists that show
    only what the principal may see."""
    principal = request.get(PRINCIPAL)
    return principal is None or _security(request).allows(principal, resource_type, name, operation)


def principal_name(request: web.Request) -> str:
    """This request's principal as stored for later work on its behalf ("" with auth off)."""
    principal = request.get(PRINCIPAL)
    return "" if principal is None else str(principal)


def describable(request: web.Request) -> Callable[[str], bool]:
    """The topics this request's principal may see (describe): what group descriptions and
    offset listings show; the others are left out as missing ones are."""
    return lambda topic: may(request, "topic", topic, "describe")


def readable(request: web.Request) -> Callable[[str], bool]:
    """The topics a pattern matches for this request's principal, and the assigned ones
    it is served: those it may describe and read (Kafka resolves a subscription's pattern
    only against the topics the member may describe). Asked at each call, so a topic
    created or an ACL changed since the join counts from the next one."""
    return lambda topic: (
        may(request, "topic", topic, "describe") and may(request, "topic", topic, "read")
    )


# ---------------------------------------------------------------------- the routes


async def whoami(request: web.Request) -> web.Response:
    principal = request.get(PRINCIPAL)
    security = _security(request)
    return codec.json_response(
        {
            "principal": None if principal is None else str(principal),
            "superuser": principal is not None and principal.superuser,
            **security.report(),
        }
    )


async def list_users(request: web.Request) -> web.Response:
    return codec.json_response({"users": _security(request).list_users()})


async def add_user(request: web.Request) -> web.Response:
    doc = codec.parse_json_object(await request.read())
    codec.only_fields(doc, {"name", "password"})
    name, password = doc.get("name"), doc.get("password")
    if not isinstance(name, str):
        raise errors.InvalidRequest("name must be a string", field="name")
    if password is not None and not isinstance(password, str):
        raise errors.InvalidRequest("password must be a string", field="password")
    return codec.json_response(await _security(request).put_user(name, password), status=201)


async def remove_user(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    await _security(request).delete_user(name)
    return codec.json_response({"deleted": name})


_ACL_FIELDS: Final = (
    "principal", "resource_type", "pattern", "resource_name", "operation", "permission",
)  # fmt: skip


def _binding(doc: dict[str, Any]) -> AclBinding:
    codec.only_fields(doc, set(_ACL_FIELDS))
    doc = {"pattern": "literal", "permission": "allow", **doc}
    if doc.get("resource_type") == "cluster":
        doc.setdefault("resource_name", "cluster")
    values = []
    for name in _ACL_FIELDS:
        value = doc.get(name)
        if not isinstance(value, str):
            raise errors.InvalidRequest(f"{name} must be a string", field=name)
        values.append(value)
    return AclBinding(*values)


def _acl_json(b: AclBinding) -> dict[str, str]:
    return {
        "principal": b.principal,
        "resource_type": b.resource_type,
        "pattern": b.pattern,
        "resource_name": b.name,
        "operation": b.operation,
        "permission": b.permission,
    }


async def list_acls(request: web.Request) -> web.Response:
    q = request.query
    acls = _security(request).list_acls(q.get("principal"), q.get("resource_type"))
    return codec.json_response({"acls": [_acl_json(b) for b in acls]})


async def add_acl(request: web.Request) -> web.Response:
    binding = _binding(codec.parse_json_object(await request.read()))
    await _security(request).add_acl(binding)
    return codec.json_response(_acl_json(binding), status=201)


async def remove_acl(request: web.Request) -> web.Response:
    binding = _binding(codec.parse_json_object(await request.read()))
    await _security(request).remove_acl(binding)
    return codec.json_response({"deleted": _acl_json(binding)})


async def list_quotas(request: web.Request) -> web.Response:
    return codec.json_response({"quotas": _security(request).list_quotas()})


async def set_quota(request: web.Request) -> web.Response:
    doc = codec.parse_json_object(await request.read())
    codec.only_fields(doc, {"principal", *QUOTA_KINDS})
    principal = doc.get("principal")
    if not isinstance(principal, str):
        raise errors.InvalidRequest("principal must be a string", field="principal")
    rates: dict[str, int] = {}
    for kind in QUOTA_KINDS:
        value = doc.get(kind, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**40:
            raise errors.InvalidRequest(f"{kind} must be 0-{2**40} (0: unlimited)", field=kind)
        rates[kind] = value
    await _security(request).set_quota(principal, rates)
    return codec.json_response({"principal": principal, **rates})


AUTH_ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("GET", "/v1/auth/whoami", whoami),
    ("GET", "/v1/auth/users", list_users),
    ("POST", "/v1/auth/users", add_user),
    ("DELETE", "/v1/auth/users/{name}", remove_user),
    ("GET", "/v1/acls", list_acls),
    ("POST", "/v1/acls", add_acl),
    ("DELETE", "/v1/acls", remove_acl),
    ("GET", "/v1/quotas", list_quotas),
    ("POST", "/v1/quotas", set_quota),
)

"""Serve the internal routes (`/v1/internal/*`) only to brokers that sign their calls.

With a cluster secret, a request to an internal path must carry a valid
`X-Dmq-Signature` (dmq/internal_auth.py has the scheme); otherwise it is answered 401
`unauthenticated` with `details.reason` (missing, malformed, expired, signature) and
logged, and its handler never runs. The check runs before the handler, on the path the
router matches (so no spelling of a path reaches an internal handler unchecked), and reads
the body once (the handler reads the same bytes again). Without a secret nothing is
checked: an unsecured cluster must keep its ports private.

From feature level 1 on (dmq/compat.py), a signature in the plain form (no nonce) is
refused before it is checked: 401, reason `plain` (`maybe_refuse_plain`). Every broker of
this release signs in the bound form once it knows the level, and 0.1.0, which signs only
plainly, has no place in such a cluster.

Whatever the secret, a call naming an internal API level this release does not speak is
refused (`check_internal_level`, dmq/compat.py): 400, logged at WARNING with the caller's
release and level, the handler never run.
"""

from __future__ import annotations

import logging

from aiohttp import web

from dmq import __version__, compat, errors, internal_auth
from http_api.forward import broker_of

_log = logging.getLogger("dmq.http")
# The signatures this broker accepted within their window (dmq/internal_auth.py).
SIGNATURES_SEEN: web.AppKey[internal_auth.ReplayCache] = web.AppKey(
    "signatures_seen", internal_auth.ReplayCache
)


async def verify_signed(request: web.Request, secret: bytes) -> None:
    """Raise Unauthenticated unless the request carries a valid signature made for this
    broker and not seen before (dmq/internal_auth.py); reads the body."""
    body = await request.read()
    headers = request.headers
    maybe_refuse_plain(request)
    internal_auth.verify(
        secret,
        request.method,
        request.raw_path,
        body,
        headers.get(internal_auth.SIGNATURE_HEADER),
        nonce=headers.get(internal_auth.NONCE_HEADER, ""),
        receiver=headers.get(internal_auth.RECEIVER_HEADER, ""),
        me=broker_of(request).config.node_id,
        seen=request.app[SIGNATURES_SEEN],
    )


def maybe_refuse_plain(request: web.Request) -> None:
    """From feature level 1 on (dmq/compat.py), Unauthenticated (`plain`) for a signature
    in the plain form (no nonce): every broker of the cluster signs in the bound form, so
    a plain one is a replayable signature, or a broker of a release older than the
    finalized level (0.1.0 signs only plainly), which must not take part."""
    if request.headers.get(internal_auth.NONCE_HEADER):
        return
    level = broker_of(request).features.finalized_level()
    if level >= 1:
        release = compat.release_of(request.headers)
        raise errors.Unauthenticated(
            f"a call signed in the plain form (as dmq {release} signs) and the cluster is "
            f"finalized at feature level {level}, which requires the bound form: upgrade "
            f"the calling broker (README.md, 'Releases and upgrading')",
            field=internal_auth.SIGNATURE_HEADER,
            reason="plain",
        )


async def check_internal_call(request: web.Request, secret: bytes) -> None:
    """Raise Unauthenticated (logged) unless an internal path's call is signed with the
    cluster secret; a request to any other path passes (http_api/edge.py calls this
    whenever the broker has a secret)."""
    if internal_auth.is_internal(request.path):
        try:
            await verify_signed(request, secret)
        except errors.Unauthenticated as exc:
            _log.warning(
                "refused %s %s from %s: %s",
                request.method,
                request.path[:200],
                request.remote,
                exc.message,
            )
            raise


def check_internal_level(request: web.Request) -> None:
    """Raise InvalidRequest (logged at WARNING, naming the caller's release and level) if a
    broker's call asks for an internal API level above this release's (dmq/compat.py). A
    call without the header is 0.1.0's, level 1."""
    header = request.headers.get(compat.INTERNAL_LEVEL_HEADER)
    if header is None:
        return
    try:
        level = int(header)
    except ValueError:
        level = -1
    if 1 <= level <= compat.INTERNAL_LEVEL_MAX:
        return
    release = request.headers.get(compat.VERSION_HEADER, "unknown")[:40]
    message = (
        f"a call from dmq {release} (at {request.remote}) needs internal API level "
        f"{header[:20]}; this dmq {__version__} speaks levels 1 to {compat.INTERNAL_LEVEL_MAX}: "
        f"finish the rolling upgrade (README.md, 'Releases and upgrading') or roll that "
        f"broker back"
    )
    _log.warning("refused %s %s: %s", request.method, request.path[:200], message)
    raise errors.InvalidRequest(message)

"""Broker-to-broker HTTP calls (`/v1/internal/*`) signed with the cluster secret.

The internal routes let one broker append to another's replica, read its batches, propose
metadata commands and read its Raft status: nothing a client of the public port may do.
With a cluster secret configured (`dmq serve --cluster-secret-file PATH`, the same file
on every broker), a broker serves them only to callers that sign the request:

    X-Dmq-Signature: v1:<unix time, ms>:<hex HMAC-SHA256(secret, message)>
    message = "dmq internal v1\\n" METHOD "\\n" target "\\n" time "\\n" body

where `target` is the request target exactly as sent (raw path and query string), so the
signature covers the method, the route, every parameter, the time and the body. The
broker refuses (401 `unauthenticated`, `details.reason` naming what failed: `missing`,
`malformed`, `expired`, `signature`) a request without a valid signature, or signed more
than CLOCK_SKEW_MS_MAX away from its own clock.

What it does not do: hide anything (the HTTP is plain), or stop the replay of a captured
request within the skew window; keep broker traffic on a private network (or behind TLS)
where someone may listen on it. Without a secret the routes stay open as before: an
unsecured cluster must keep its ports private (`dmq serve` warns at start).

Callers: dmq/peers.py signs every call a broker makes; jepsen/ and the test harnesses
sign with the secret file they gave the brokers.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import urllib.parse
from pathlib import Path

from dmq.errors import InvalidConfig, Unauthenticated

SIGNATURE_HEADER = "X-Dmq-Signature"
# Every call a broker makes on another names its cluster's id (once it knows it), and so does
# `dmq serve --join` asking for the cluster: a broker answers 409 `cluster_id_mismatch` to
# one naming another cluster, and logs it (http_api/identity.py). Not covered by the
# signature: it guards against mistakes (a reused data directory, a copied config), while
# the secret guards against strangers.
CLUSTER_ID_HEADER = "X-Dmq-Cluster-Id"
SIGNATURE_VERSION = "v1"
INTERNAL_PATH_PREFIX = "/v1/internal/"
# A signature made further than this from the receiver's clock is refused. Cost of a
# larger window: a captured request can be replayed for longer; of a smaller one: brokers
# whose clocks drift apart (or a request stuck behind a paused process) are refused.
CLOCK_SKEW_MS_MAX = 60_000
# A secret shorter than this is refused at start-up: it could be guessed.
SECRET_BYTES_MIN = 16
# Unix milliseconds have 13 digits until the year 2286; a longer stamp is malformed.
STAMP_DIGITS_MAX = 15
SECRET_BYTES_MAX = 4096
_CONTEXT = b"dmq internal v1\n"


def read_secret_file(path: str) -> bytes | None:
    """The cluster secret in `path` (surrounding whitespace stripped), None for no path.

    InvalidConfig if the file cannot be read or the secret is shorter than
    SECRET_BYTES_MIN or longer than SECRET_BYTES_MAX bytes.
    """
    if not path:
        return None
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise InvalidConfig(
            f"cannot read the cluster secret file {path}: {exc}", field="cluster_secret_file"
        ) from exc
    if not SECRET_BYTES_MIN <= len(secret) <= SECRET_BYTES_MAX:
        raise InvalidConfig(
            f"the cluster secret in {path} must be {SECRET_BYTES_MIN}-{SECRET_BYTES_MAX} "
            f"bytes (e.g. `openssl rand -hex 32 > {path}`)",
            field="cluster_secret_file",
            limit=SECRET_BYTES_MIN,
        )
    return secret


def is_internal(path: str) -> bool:
    return path.startswith(INTERNAL_PATH_PREFIX)


def target_of(url: str) -> str:
    """The request target (raw path and query) of an absolute URL, as a client sends it."""
    parts = urllib.parse.urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _mac(secret: bytes, method: str, target: str, stamp: str, body: bytes) -> str:
    head = f"{method.upper()}\n{target}\n{stamp}\n".encode()
    mac = hmac.new(secret, _CONTEXT + head, hashlib.sha256)
    mac.update(body)
    return mac.hexdigest()


def sign(
    secret: bytes, method: str, target: str, body: bytes = b"", now_ms: int | None = None
) -> str:
    """The SIGNATURE_HEADER value for one request."""
    stamp = str(int(time.time() * 1000) if now_ms is None else now_ms)
    return f"{SIGNATURE_VERSION}:{stamp}:{_mac(secret, method, target, stamp, body)}"


def signed_headers(
    secret: bytes | None, method: str, target: str, body: bytes | None = None
) -> dict[str, str]:
    """{SIGNATURE_HEADER: ...} for an internal target when there is a secret; else {}."""
    if secret is None or not is_internal(target.split("?", 1)[0]):
        return {}
    return {SIGNATURE_HEADER: sign(secret, method, target, body or b"")}


def broker_headers(
    secret: bytes | None, method: str, target: str, body: bytes | None = None
) -> dict[str, str]:
    """{SIGNATURE_HEADER: ...} for any target when there is a secret; else {}.

    A broker calling a public route of another on its own behalf (a group member's fetch
    at the partition leader, an offset lookup, a delayed record's status) signs it too:
    with --auth on, a valid signature authenticates the caller as a broker of the cluster
    (http_api/auth.py), which may do anything, as the internal routes allow."""
    if secret is None:
        return {}
    return {SIGNATURE_HEADER: sign(secret, method, target, body or b"")}


def verify(
    secret: bytes,
    method: str,
    target: str,
    body: bytes,
    header: str | None,
    now_ms: int | None = None,
) -> None:
    """Return if `header` signs this request with `secret`; else raise Unauthenticated."""
    if header is None:
        raise _refused("missing", f"internal route: no {SIGNATURE_HEADER} header")
    version, _, rest = header.partition(":")
    stamp, _, digest = rest.partition(":")
    if (
        version != SIGNATURE_VERSION
        or not stamp.isascii()
        or not stamp.isdigit()
        or len(stamp) > STAMP_DIGITS_MAX  # int() of thousands of digits raises
    ):
        raise _refused("malformed", f"{SIGNATURE_HEADER} is not {SIGNATURE_VERSION}:<ms>:<hex>")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if abs(now - int(stamp)) > CLOCK_SKEW_MS_MAX:
        raise _refused(
            "expired",
            f"signed {now - int(stamp)} ms from this broker's clock "
            f"(CLOCK_SKEW_MS_MAX {CLOCK_SKEW_MS_MAX})",
        )
    expected = _mac(secret, method, target, stamp, body)
    if not hmac.compare_digest(expected.encode(), digest.encode()):
        raise _refused("signature", "internal route: bad signature (wrong cluster secret?)")


def _refused(reason: str, message: str) -> Unauthenticated:
    return Unauthenticated(message, field=SIGNATURE_HEADER, reason=reason)

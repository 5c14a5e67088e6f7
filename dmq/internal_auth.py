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

A broker's own calls are also bound to the broker they are sent to and made unique:

    X-Dmq-Signed-For: <the receiving broker's node id>
    X-Dmq-Nonce: <16 random bytes, hex>
    message = "dmq internal v1 bound\n" METHOD "\n" target "\n" time "\n" nonce "\n"
              receiver "\n" body

A broker refuses (reason `receiver`) a signature made for another broker, and
(`replayed`) one it has already seen within the window: `ReplayCache` remembers every
signature it accepted until it expires. A signer that does not know the receiver's node
id yet (a broker joining, before it has the catalogue; jepsen/ and the test tools) signs
without `X-Dmq-Signed-For`: such a signature is accepted by any broker of the cluster,
once each. A missing nonce is the plain v1 scheme above (tools written from it).

What it does not do: hide anything (the HTTP is plain, unless TLS is on). Without a secret
the routes stay open as before: an unsecured cluster must keep its ports private (`dmq
serve` warns at start).

Callers: dmq/peers.py signs every call a broker makes; jepsen/ and the test harnesses
sign with the secret file they gave the brokers.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
import urllib.parse
from collections import OrderedDict
from pathlib import Path

from dmq.errors import BrokerUnavailable, InvalidConfig, Unauthenticated

SIGNATURE_HEADER = "X-Dmq-Signature"
# Every call a broker makes on another names its cluster's id (once it knows it), and so does
# `dmq serve --join` asking for the cluster: a broker answers 409 `cluster_id_mismatch` to
# one naming another cluster, and logs it (http_api/identity.py). Not covered by the
# signature: it guards against mistakes (a reused data directory, a copied config), while
# the secret guards against strangers.
CLUSTER_ID_HEADER = "X-Dmq-Cluster-Id"
NONCE_HEADER = "X-Dmq-Nonce"
RECEIVER_HEADER = "X-Dmq-Signed-For"
NONCE_BYTES = 16
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
_BOUND_CONTEXT = b"dmq internal v1 bound\n"  # with a nonce or a receiver: never the same


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


def _mac(
    secret: bytes, method: str, target: str, stamp: str, body: bytes, nonce: str, receiver: str
) -> str:
    head = f"{method.upper()}\n{target}\n{stamp}\n".encode()
    if nonce or receiver:
        head = _BOUND_CONTEXT + head + f"{nonce}\n{receiver}\n".encode()
    else:
        head = _CONTEXT + head
    mac = hmac.new(secret, head, hashlib.sha256)
    mac.update(body)
    return mac.hexdigest()


def sign(
    secret: bytes,
    method: str,
    target: str,
    body: bytes = b"",
    now_ms: int | None = None,
    nonce: str = "",
    receiver: str = "",
) -> str:
    """The SIGNATURE_HEADER value for one request (with `nonce` and `receiver`, the
    bound form: module docstring)."""
    stamp = str(int(time.time() * 1000) if now_ms is None else now_ms)
    mac = _mac(secret, method, target, stamp, body, nonce, receiver)
    return f"{SIGNATURE_VERSION}:{stamp}:{mac}"


def _bound_headers(
    secret: bytes, method: str, target: str, body: bytes, receiver: str
) -> dict[str, str]:
    nonce = secrets.token_hex(NONCE_BYTES)
    headers = {
        SIGNATURE_HEADER: sign(secret, method, target, body, nonce=nonce, receiver=receiver),
        NONCE_HEADER: nonce,
    }
    if receiver:
        headers[RECEIVER_HEADER] = receiver
    return headers


def signed_headers(
    secret: bytes | None, method: str, target: str, body: bytes | None = None, receiver: str = ""
) -> dict[str, str]:
    """The signature headers for an internal target when there is a secret; else {}.
    `receiver`: the node id of the broker called, when the caller knows it."""
    if secret is None or not is_internal(target.split("?", 1)[0]):
        return {}
    return _bound_headers(secret, method, target, body or b"", receiver)


def broker_headers(
    secret: bytes | None,
    method: str,
    target: str,
    body: bytes | None = None,
    receiver: str = "",
    *,
    bound: bool = True,
) -> dict[str, str]:
    """The signature headers for any target when there is a secret; else {}.

    A broker calling a public route of another on its own behalf (a group member's fetch
    at the partition leader, an offset lookup, a delayed record's status) signs it too:
    with --auth on, a valid signature authenticates the caller as a broker of the cluster
    (http_api/auth.py), which may do anything, as the internal routes allow.
    `bound=False`: the plain form, for a peer that knows no other (dmq/compat.py,
    verifies_bound_signatures)."""
    if secret is None:
        return {}
    if not bound:
        return {SIGNATURE_HEADER: sign(secret, method, target, body or b"")}
    return _bound_headers(secret, method, target, body or b"", receiver)


class ReplayCache:
    """The signatures a broker accepted, each until it expires (its time plus
    CLOCK_SKEW_MS_MAX): a second request with one of them is a replay. At most
    `entries_max` are kept; while that many are still valid, a new signed call is
    refused as retriable (BrokerUnavailable, 503) rather than forgetting one that could
    then be replayed. Not thread-safe: the event loop's."""

    def __init__(self, entries_max: int) -> None:
        self.entries_max = entries_max
        # The MAC's first 16 bytes (128 bits: no collision by chance) -> expiry, ms;
        # in arrival order, which is close to expiry order (stamps within the skew).
        self._seen: OrderedDict[bytes, int] = OrderedDict()

    def add(self, mac_hex: str, stamp_ms: int, now_ms: int) -> None:
        """Remember a valid signature; Unauthenticated (`replayed`) if it was seen."""
        while self._seen:
            oldest, expires_ms = next(iter(self._seen.items()))
            if expires_ms >= now_ms:
                break
            del self._seen[oldest]
        key = bytes.fromhex(mac_hex[:32])
        if key in self._seen:
            raise _refused("replayed", "internal call: this signature was used already")
        if len(self._seen) >= self.entries_max:
            raise BrokerUnavailable(
                f"{self.entries_max} signatures of the last {CLOCK_SKEW_MS_MAX} ms are "
                f"remembered already (signature_replay_entries_max): retry",
                retry_after_ms=1000,
            )
        self._seen[key] = stamp_ms + CLOCK_SKEW_MS_MAX

    def __len__(self) -> int:
        return len(self._seen)


def verify(
    secret: bytes,
    method: str,
    target: str,
    body: bytes,
    header: str | None,
    now_ms: int | None = None,
    *,
    nonce: str = "",
    receiver: str = "",
    me: str | None = None,
    seen: ReplayCache | None = None,
) -> None:
    """Return if `header` signs this request with `secret` (with `nonce` and `receiver`
    from their headers); else raise Unauthenticated. `me`: this broker's node id, which
    a named receiver must be; `seen`: where accepted signatures are remembered, so that
    a replay is refused."""
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
    expected = _mac(secret, method, target, stamp, body, nonce, receiver)
    if not hmac.compare_digest(expected.encode(), digest.encode()):
        raise _refused("signature", "internal route: bad signature (wrong cluster secret?)")
    if receiver and me is not None and receiver != me:
        raise _refused("receiver", f"signed for broker {receiver!r}, not for this one ({me})")
    if seen is not None:
        seen.add(expected, int(stamp), now)


def _refused(reason: str, message: str) -> Unauthenticated:
    return Unauthenticated(message, field=SIGNATURE_HEADER, reason=reason)

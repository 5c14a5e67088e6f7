"""Proves that a broker's signed calls are bound to the broker they are sent to and
cannot be replayed (dmq/internal_auth.py), and that `dmq serve` warns about a secret or
key file others may read (dmq/server.py):

- a call signed for n1 verifies at n1 and is refused at n2 (reason `receiver`); removing
  or changing the receiver or the nonce breaks the signature;
- the same signature a second time within its window is refused (`replayed`), at the
  broker that accepted it; a signature without a receiver (a tool's) is accepted once;
- the replay cache is bounded: full of valid signatures it refuses a new one as
  retriable (503), and takes new ones again once the old ones expired;
- a cluster secret file or TLS key readable by group or others is named in a warning;
  an owner-only one is not.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from dmq import errors, internal_auth
from dmq.internal_auth import (
    CLOCK_SKEW_MS_MAX,
    NONCE_HEADER,
    RECEIVER_HEADER,
    SIGNATURE_HEADER,
    ReplayCache,
)
from dmq.server import warn_if_exposed

SECRET = b"0123456789abcdef-secret"
TARGET = "/v1/internal/metadata/propose"
NOW_MS = 1_700_000_000_000


def _verify(headers: dict[str, str], me: str, seen: ReplayCache, now_ms: int = NOW_MS) -> None:
    internal_auth.verify(
        SECRET, "POST", TARGET, b"cmd", headers[SIGNATURE_HEADER], now_ms,
        nonce=headers.get(NONCE_HEADER, ""), receiver=headers.get(RECEIVER_HEADER, ""),
        me=me, seen=seen,
    )  # fmt: skip


def _signed(receiver: str, now_ms: int = NOW_MS) -> dict[str, str]:
    nonce = os.urandom(16).hex()
    header = internal_auth.sign(SECRET, "POST", TARGET, b"cmd", now_ms, nonce, receiver)
    out = {SIGNATURE_HEADER: header, NONCE_HEADER: nonce}
    if receiver:
        out[RECEIVER_HEADER] = receiver
    return out


def _reason(headers: dict[str, str], me: str, seen: ReplayCache, now_ms: int = NOW_MS) -> str:
    with pytest.raises(errors.Unauthenticated) as refused:
        _verify(headers, me, seen, now_ms)
    return str(refused.value.details["reason"])


def test_a_signature_names_its_receiver_and_is_used_once() -> None:
    n1, n2 = ReplayCache(100), ReplayCache(100)
    call = _signed("n1")
    assert _reason(call, "n2", n2) == "receiver"
    _verify(call, "n1", n1)
    assert _reason(call, "n1", n1) == "replayed"
    assert _reason({**call, RECEIVER_HEADER: "n2"}, "n2", n2) == "signature"
    assert _reason({k: v for k, v in call.items() if k != RECEIVER_HEADER}, "n2", n2) == (
        "signature"
    )
    assert _reason({**call, NONCE_HEADER: "00" * 16}, "n1", ReplayCache(100)) == "signature"
    # The helpers every broker call goes through send all three headers.
    headers = internal_auth.broker_headers(SECRET, "POST", TARGET, b"cmd", receiver="n1")
    assert set(headers) == {SIGNATURE_HEADER, NONCE_HEADER, RECEIVER_HEADER}
    tool = _signed("")  # a signer that does not know the receiver: any broker, once
    _verify(tool, "n2", n2)
    assert _reason(tool, "n2", n2) == "replayed"


def test_the_replay_cache_is_bounded_and_forgets_expired_signatures() -> None:
    seen = ReplayCache(2)
    _verify(_signed("n1"), "n1", seen)
    _verify(_signed("n1"), "n1", seen)
    with pytest.raises(errors.BrokerUnavailable):
        _verify(_signed("n1"), "n1", seen)
    later = NOW_MS + CLOCK_SKEW_MS_MAX + 1  # the first two expired
    _verify(_signed("n1", later), "n1", seen, later)
    assert len(seen) == 1


def test_a_secret_or_key_readable_by_others_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret, key = tmp_path / "secret", tmp_path / "key.pem"
    secret.write_text("0123456789abcdef0123")
    key.write_text("not a key: only its mode is read")
    secret.chmod(0o644)
    key.chmod(0o640)
    # Only the two paths are read (a BrokerConfig would want a certificate too).
    config = cast(Any, SimpleNamespace(cluster_secret_file=str(secret), tls_key=str(key)))
    with caplog.at_level(logging.WARNING, logger="dmq.server"):
        assert warn_if_exposed(config) == ["cluster_secret_file", "tls_key"]
    assert "chmod 600" in caplog.text and str(secret) in caplog.text
    secret.chmod(0o600)
    key.chmod(0o400)
    assert warn_if_exposed(config) == []

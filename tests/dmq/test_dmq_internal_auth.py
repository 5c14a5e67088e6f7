"""Proves the signature of broker-to-broker HTTP calls (dmq/internal_auth.py):

- a request signed with the secret verifies, and so does the same signature written out
  independently from the documented scheme (tests/cluster/cluster_harness.py's
  `sign_internal`, which the cluster tests and jepsen-like harnesses use);
- changing the method, the target (path or query), the body, the time or the secret
  fails with reason "signature"; a time further than CLOCK_SKEW_MS_MAX either way fails
  with "expired"; a missing or malformed header with "missing" / "malformed"; every
  refusal is Unauthenticated (401) naming the header;
- only /v1/internal/* targets are signed, and only with a secret;
- the secret file: whitespace around it is ignored; a missing, empty, short or huge one is
  refused with InvalidConfig at start-up; no path means no secret.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster.cluster_harness import sign_internal  # the scheme written out independently
from hypothesis import given
from hypothesis import strategies as st

from dmq import errors, internal_auth

SECRET = b"0123456789abcdef-secret"
NOW_MS = 1_700_000_000_000
TARGET = "/v1/internal/partitions/orders/0/append?acks=all&topic_id=7"


def reason_of(call: object) -> str:
    assert isinstance(call, errors.Unauthenticated)
    return str(call.details["reason"])


def refused(method: str, target: str, body: bytes, header: str | None, now_ms: int) -> str:
    with pytest.raises(errors.Unauthenticated) as caught:
        internal_auth.verify(SECRET, method, target, body, header, now_ms)
    assert caught.value.details["field"] == internal_auth.SIGNATURE_HEADER
    return reason_of(caught.value)


@given(method=st.sampled_from(["GET", "POST"]), body=st.binary(max_size=200))
def test_a_signed_request_verifies_and_matches_the_documented_scheme(
    method: str, body: bytes
) -> None:
    header = internal_auth.sign(SECRET, method, TARGET, body, NOW_MS)
    internal_auth.verify(SECRET, method, TARGET, body, header, NOW_MS)
    assert header == sign_internal(SECRET, method, TARGET, body, NOW_MS)


def test_any_change_breaks_the_signature() -> None:
    header = internal_auth.sign(SECRET, "POST", TARGET, b"batch", NOW_MS)
    assert refused("GET", TARGET, b"batch", header, NOW_MS) == "signature"
    assert refused("POST", TARGET.replace("acks=all", "acks=0"), b"batch", header, NOW_MS) == (
        "signature"
    )
    assert refused("POST", "/v1/internal/status", b"batch", header, NOW_MS) == "signature"
    assert refused("POST", TARGET, b"batcH", header, NOW_MS) == "signature"
    moved = header.replace(str(NOW_MS), str(NOW_MS + 1))
    assert refused("POST", TARGET, b"batch", moved, NOW_MS) == "signature"
    other = internal_auth.sign(b"another-secret-0123456789", "POST", TARGET, b"batch", NOW_MS)
    assert refused("POST", TARGET, b"batch", other, NOW_MS) == "signature"


def test_the_clock_skew_window_is_bounded_both_ways() -> None:
    skew = internal_auth.CLOCK_SKEW_MS_MAX
    for signed_at in (NOW_MS - skew, NOW_MS + skew):
        header = internal_auth.sign(SECRET, "GET", TARGET, b"", signed_at)
        internal_auth.verify(SECRET, "GET", TARGET, b"", header, NOW_MS)
    for signed_at in (NOW_MS - skew - 1, NOW_MS + skew + 1):
        header = internal_auth.sign(SECRET, "GET", TARGET, b"", signed_at)
        assert refused("GET", TARGET, b"", header, NOW_MS) == "expired"


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, "missing"),
        ("", "malformed"),
        ("v2:1:ab", "malformed"),
        ("v1:soon:ab", "malformed"),
        ("v1:-5:ab", "malformed"),
        ("v1:١٢٣:ab", "malformed"),  # Arabic-Indic digits: isdigit() but not ASCII
        (f"v1:{NOW_MS}", "signature"),
        (f"v1:{NOW_MS}:zz", "signature"),
        (f"v1:{NOW_MS}:é", "signature"),
    ],
)
def test_missing_and_malformed_headers_are_refused(header: str | None, reason: str) -> None:
    assert refused("GET", TARGET, b"", header, NOW_MS) == reason


def test_only_internal_targets_are_signed_and_only_with_a_secret() -> None:
    assert internal_auth.SIGNATURE_HEADER in internal_auth.signed_headers(SECRET, "GET", TARGET)
    assert internal_auth.signed_headers(None, "GET", TARGET) == {}
    assert internal_auth.signed_headers(SECRET, "GET", "/v1/topics?x=/v1/internal/") == {}
    assert internal_auth.target_of("http://h:1/v1/internal/x/y?a=1&b=%20") == (
        "/v1/internal/x/y?a=1&b=%20"
    )
    assert internal_auth.target_of("http://h:1") == "/"


def test_the_secret_file(tmp_path: Path) -> None:
    good = tmp_path / "secret"
    good.write_bytes(b"  " + SECRET + b"\n")
    assert internal_auth.read_secret_file(str(good)) == SECRET
    assert internal_auth.read_secret_file("") is None
    for name, content in (("empty", b"\n"), ("short", b"short"), ("huge", b"x" * 5000)):
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(errors.InvalidConfig, match="must be"):
            internal_auth.read_secret_file(str(path))
    with pytest.raises(errors.InvalidConfig, match="cannot read"):
        internal_auth.read_secret_file(str(tmp_path / "missing"))


def test_unauthenticated_is_a_401_client_error_with_a_stable_code() -> None:
    from http_api.errors import status_for

    error = errors.error_for_code("unauthenticated", "no", {"reason": "missing"})
    assert isinstance(error, errors.Unauthenticated)
    assert status_for(error) == 401

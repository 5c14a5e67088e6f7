"""Proves the edge of a real `dmq serve --auth on` against hostile headers and browsers
(http_api/request_guard.py, http_api/auth.py, dmq/broker/security.py), over real sockets:

- malformed credentials are 4xx JSON errors naming the header, never 500: a
  `X-Dmq-Signature` with a 5,000-digit stamp, a 5,000-digit `X-Dmq-Forwarded` on a
  group route, invalid UTF-8 and non-latin-1 characters in `Authorization`; and, as a
  property over arbitrary header names and bytes on a sample of routes, no 5xx at all;
- a state-changing request with a foreign `Origin` is 403 naming Origin (the admin route
  of the issue, `text/plain` with `https://evil.example`), a `text/plain` or form body on
  an admin route is 415 even from no origin, while the same-origin JSON call the web
  console makes (its Origin and X-Dmq-Client) and a `text/plain` produce still pass;
- the produce-bytes quota charges a chunked body (no Content-Length) as it charges the
  same body sent with one: the second 2 KB body against a 1,000 B/s quota is 429;
- the fetch-bytes quota is one debt for all of a principal's requests: parallel
  long-polls together answer about one request beyond the quota, not one each.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests_support import BrokerProcess

SUPERUSER = "superuser-token-for-edge-tests-01"
SU = f"Bearer {SUPERUSER}"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir: Path = tmp_path_factory.mktemp("edge") / "data"
    process = BrokerProcess(
        data_dir, extra_args=["--auth", "on"], env={"DMQ_SUPERUSER_TOKEN": SUPERUSER}
    ).start()
    try:
        yield process
    finally:
        process.stop()


def raw_request(
    b: BrokerProcess, method: bytes, path: bytes, headers: list[tuple[bytes, bytes]],
    body: bytes = b"",
) -> tuple[int, bytes, bytes]:  # fmt: skip
    """Send bytes as they are (http.client refuses what we want to send): status, head, body."""
    lines = [method + b" " + path + b" HTTP/1.1", b"Host: " + f"{b.host}:{b.port}".encode(),
             b"Connection: close", *(k + b": " + v for k, v in headers)]  # fmt: skip
    if body:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    with socket.create_connection((b.host, b.port), timeout=30) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head, payload


def call(
    b: BrokerProcess, method: str, path: str, body: Any = None, auth: str | None = SU,
    headers: dict[str, str] | None = None, content_type: str = "application/json",
) -> tuple[int, dict[str, str], Any]:  # fmt: skip
    conn = http.client.HTTPConnection(b.host, b.port, timeout=60)
    try:
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        all_headers = {**({"Authorization": auth} if auth else {}), **(headers or {})}
        if data is not None:
            all_headers.setdefault("Content-Type", content_type)
        conn.request(method, path, body=data, headers=all_headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = raw
        return resp.status, dict(resp.getheaders()), doc
    finally:
        conn.close()


def _field(payload: bytes) -> str:
    return str(json.loads(payload)["error"]["details"]["field"])


# --- 6: no 5xx for any header --------------------------------------------------------------


def test_malformed_credentials_are_4xx_naming_the_header(broker: BrokerProcess) -> None:
    digits = b"9" * 5000
    cases = [
        (b"/v1/topics", [(b"X-Dmq-Signature", b"v1:" + digits + b":00")], 401, "X-Dmq-Signature"),
        (b"/v1/topics", [(b"X-Dmq-Signature", b"v1:" + b"1" * 20 + b":00")], 401, "X-Dmq-Signature"),
        (b"/v1/groups/g", [(b"Authorization", SU.encode()), (b"X-Dmq-Forwarded", digits)],
         400, "X-Dmq-Forwarded"),
        (b"/v1/topics", [(b"Authorization", b"Bearer \xff\xfe:not-utf8")], 401, "Authorization"),
        (b"/v1/topics", [(b"Authorization", "Bearer bob:pässwörd€".encode())], 401, "Authorization"),
        (b"/v1/topics", [(b"Authorization", b"Basic " + b"A" * 5000)], 401, "Authorization"),
        (b"/v1/topics", [(b"Authorization", SU.encode()), (b"X-Dmq-Cluster-Id", b"\xc3\x28")],
         400, "X-Dmq-Cluster-Id"),
    ]  # fmt: skip
    for path, headers, status, field in cases:
        got, head, payload = raw_request(broker, b"GET", path, headers)
        assert got == status, (headers[-1][0], got, payload[:300])
        assert b"application/json" in head
        assert _field(payload) == field
    assert "Traceback" not in broker.log()


_HEADER_NAMES = st.sampled_from(
    [
        b"Authorization",
        b"X-Dmq-Signature",
        b"X-Dmq-Forwarded",
        b"X-Dmq-Cluster-Id",
        b"X-Dmq-Delay-Ms",
        b"X-Dmq-Deliver-At",
        b"Origin",
        b"Content-Type",
        b"Accept",
        b"X-Dmq-Client",
        b"Transfer-Encoding",
        b"Expect",
        b"Host",
    ]  # fmt: skip
) | st.from_regex(rb"\A[A-Za-z0-9!#$%&'*+.^_`|~-]{1,40}\Z")
_VALUES = (
    st.binary(max_size=200).map(lambda v: v.replace(b"\r", b"").replace(b"\n", b""))
    | st.integers(4300, 6000).map(lambda n: b"9" * n)
    | st.sampled_from([b"Bearer ", b"Basic ", b"v1:", b"Bearer superuser-token-for-edge-tests-01"])
    .flatmap(lambda prefix: st.binary(max_size=100).map(lambda v: prefix + v.replace(b"\r", b"").replace(b"\n", b"")))
)  # fmt: skip
_ROUTES = st.sampled_from(
    [
        (b"GET", b"/v1/topics"),
        (b"GET", b"/v1/groups/g"),
        (b"POST", b"/v1/topics/t/records"),
        (b"POST", b"/v1/auth/users"),
        (b"GET", b"/v1/topics/t/partitions/0/records"),
        (b"POST", b"/v1/groups/g/members"),
        (b"GET", b"/v1/internal/status"),
        (b"GET", b"/metrics"),
        (b"POST", b"/consumers/g"),
        (b"GET", b"/healthz"),
        (b"GET", b"/no-such-route"),  # 404 from the router (http_api/request_guard.py Router)
        (b"DELETE", b"/healthz"),  # 405 from the router
    ]  # fmt: skip
)


def test_an_expect_header_on_a_path_with_no_route_is_no_5xx(broker: BrokerProcess) -> None:
    for method, path in ((b"GET", b"/no-such-route"), (b"DELETE", b"/healthz")):
        status, _, payload = raw_request(broker, method, path, [(b"Expect", b"\x80")], b"")
        assert status == 417 and b'"Expect"' in payload, (path, status, payload[:200])
        status, _, _ = raw_request(broker, method, path, [], b"")
        assert status == (404 if path == b"/no-such-route" else 405)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(route=_ROUTES, headers=st.lists(st.tuples(_HEADER_NAMES, _VALUES), max_size=3))
def test_no_header_bytes_give_a_5xx(
    broker: BrokerProcess, route: tuple[bytes, bytes], headers: list[tuple[bytes, bytes]]
) -> None:
    method, path = route
    body = b'{"records": [{"value": "v"}]}' if method == b"POST" else b""
    status, _, payload = raw_request(broker, method, path, headers, body)
    assert status < 500, (route, headers, payload[:300])


# --- 5: cross-site requests ----------------------------------------------------------------


def test_cross_site_state_changes_are_refused(broker: BrokerProcess) -> None:
    b = broker
    own = f"http://{b.host}:{b.port}"
    user = json.dumps({"name": "mallory", "password": "mallory-pass-1"})
    # The issue's request: text/plain JSON from evil.example with the admin's credentials.
    status, _, body = call(b, "POST", "/v1/auth/users", user, headers={
        "Origin": "https://evil.example"}, content_type="text/plain")  # fmt: skip
    assert status == 403 and body["error"]["details"]["field"] == "Origin", body
    # A foreign origin is refused with JSON too, and on every state-changing method.
    for method, path in (("POST", "/v1/auth/users"), ("DELETE", "/v1/topics/x"),
                         ("PUT", "/v1/share-groups/s"), ("PATCH", "/v1/topics/x/config"),
                         ("POST", "/v1/topics/x/records")):  # fmt: skip
        for origin in ("https://evil.example", "null", f"http://{b.host}:{b.port + 1}"):
            status, _, body = call(b, method, path, {"name": "m"}, headers={"Origin": origin})
            assert status == 403, (method, path, origin, status, body)
    # No Origin (an old browser, a privacy setting): form and text bodies still refused.
    for content_type in ("text/plain", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x"):  # fmt: skip
        status, _, body = call(b, "POST", "/v1/auth/users", user, content_type=content_type)
        assert status == 415 and body["error"]["details"]["field"] == "Content-Type", body
    status, _, _ = call(
        b, "GET", "/v1/auth/users/mallory", headers={"Origin": "https://evil.example"}
    )
    assert status != 403  # reads are not refused for their origin (no route: 405)
    assert call(b, "GET", "/v1/auth/users")[2]["users"] == []
    # What the web console sends: its own origin, X-Dmq-Client, JSON.
    console = {"Origin": own, "X-Dmq-Client": "console"}
    status, _, body = call(b, "POST", "/v1/auth/users", json.loads(user), headers=console)
    assert status == 201, body
    status, _, body = call(b, "POST", "/v1/topics", {"name": "cs"}, headers=console)
    assert status == 201, body
    # Produce keeps its documented text/plain (curl --data-binary), from no origin.
    status, _, body = call(
        b, "POST", "/v1/topics/cs/records", b"one\ntwo", content_type="text/plain"
    )
    assert status == 200 and len(body["offsets"]) == 2, body


# --- 4 and 9: quotas charge every byte, across parallel requests ---------------------------


def _user_with_quota(b: BrokerProcess, name: str, topic: str, quota: dict[str, int]) -> str:
    password = f"{name}-password-1"
    assert call(b, "POST", "/v1/auth/users", {"name": name, "password": password})[0] == 201
    acl = {"principal": f"User:{name}", "resource_type": "topic", "resource_name": topic,
           "operation": "all"}  # fmt: skip
    assert call(b, "POST", "/v1/acls", acl)[0] == 201
    assert call(b, "POST", "/v1/quotas", {"principal": f"User:{name}", **quota})[0] == 200
    if call(b, "GET", f"/v1/topics/{topic}")[0] == 404:
        assert call(b, "POST", "/v1/topics", {"name": topic})[0] == 201
    return f"Bearer {name}:{password}"


def _chunked_produce(b: BrokerProcess, path: str, auth: str, body: bytes) -> int:
    conn = http.client.HTTPConnection(b.host, b.port, timeout=30)
    try:
        halves = iter([body[: len(body) // 2], body[len(body) // 2 :]])
        conn.request("POST", path, body=halves, encode_chunked=True,
                     headers={"Authorization": auth, "Content-Type": "application/json",
                              "Transfer-Encoding": "chunked"})  # fmt: skip
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def test_chunked_produce_bodies_are_charged(broker: BrokerProcess) -> None:
    b = broker
    auth = _user_with_quota(b, "chunky", "qc", {"produce_bytes_per_s": 1000})
    body = json.dumps({"records": [{"value": "x" * 2000}]}).encode()
    path = "/v1/topics/qc/records"
    # One body above the rate passes (the bucket may go into debt by one request) ...
    assert _chunked_produce(b, path, auth, body) == 200
    # ... and the next, within the second it owes, is refused: it was charged 2 KB.
    assert _chunked_produce(b, path, auth, body) == 429
    _, _, offsets = call(b, "GET", "/v1/topics/qc/partitions/0/offsets")
    assert offsets["high_watermark"] == 1


def test_parallel_long_polls_share_one_fetch_debt(broker: BrokerProcess) -> None:
    b = broker
    auth = _user_with_quota(b, "poller", "qf", {"fetch_bytes_per_s": 10_000})
    record = {"value": "y" * 20_000}
    path = "/v1/topics/qf/partitions/0/records?offset=0&wait_ms=3000&max_bytes=30000"
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        polls = [pool.submit(call, b, "GET", path, None, auth) for _ in range(10)]
        time.sleep(1.0)  # the admitted polls are parked: the partition is empty
        assert call(b, "POST", "/v1/topics/qf/records", {"records": [record]})[0] == 200
        answers = [p.result() for p in polls]
    served = sum(len(json.dumps(doc)) for status, _, doc in answers if status == 200)
    refused = [status for status, _, _ in answers if status == 429]
    # One request beyond the 10,000 B bucket at most, shared by all ten (not one each).
    assert served <= 10_000 + 30_000 + 1_000, (served, [s for s, _, _ in answers])
    assert len(refused) >= 8, [s for s, _, _ in answers]

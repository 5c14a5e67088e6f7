"""Proves that credentials never reach a broker's log (http_api/log_redaction.py): a
request with a NUL byte in a header, which aiohttp refuses before any dmq code runs and
used to log at ERROR quoting the raw `Authorization: Bearer bob:<password>` line, leaves
one WARNING line without the password or a traceback (a real `dmq serve`); and the filter
redacts every credential header a message or a traceback quotes (unit)."""

from __future__ import annotations

import logging
import socket
import sys
import time
from pathlib import Path

import pytest

from http_api.log_redaction import REDACTED, RedactingFilter, redact
from tests_support import BrokerProcess

PASSWORD = "hunter2-secret-pass"


def test_a_malformed_request_logs_no_password(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", extra_args=["--auth", "on"],
                           env={"DMQ_SUPERUSER_TOKEN": "superuser-token-for-log-tests"}).start()  # fmt: skip
    try:
        request = (
            b"GET /v1/topics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + f"Authorization: Bearer bob:{PASSWORD}".encode()
            + b"\x00\r\n"
            + f"X-Dmq-Signature: v1:1:{PASSWORD}".encode()
            + b"\r\n\r\n"
        )
        with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
            sock.sendall(request)
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0]
        deadline = time.monotonic() + 10
        while "malformed request" not in broker.log() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        broker.stop()
    log = broker.log()
    assert "refused a malformed request" in log, log[-2000:]
    assert PASSWORD not in log
    assert "ERROR aiohttp" not in log and "Traceback" not in log


@pytest.mark.parametrize(
    "text",
    [
        "b'Authorization: Bearer bob:pw'",
        "authorization:Basic Ym9iOnB3",
        "X-Dmq-Signature: v1:17:abcdef\nnext line",
        'headers {"Cookie": "session=pw"}',
    ],
)
def test_redact_removes_every_credential_value(text: str) -> None:
    out = redact(text)
    assert REDACTED in out
    assert "pw" not in out.replace("Bearer", "") and "abcdef" not in out and "Ym9i" not in out


def test_a_traceback_is_redacted_too() -> None:
    try:
        raise ValueError("bad header Authorization: Bearer bob:pw")
    except ValueError:
        record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1,
                                   "error from %s", ("127.0.0.1",), sys.exc_info())  # fmt: skip
    assert RedactingFilter().filter(record)
    assert record.exc_info is None and record.exc_text is not None
    assert "bob:pw" not in record.exc_text and REDACTED in record.exc_text
    assert record.getMessage() == "error from 127.0.0.1"

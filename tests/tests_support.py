"""Test support: real `dmq serve` processes on loopback (used by conftest.py fixtures)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.loopback import common_free_port

ROOT = Path(__file__).resolve().parent.parent


def free_port(host: str = "127.0.0.1", avoid: tuple[int, ...] = ()) -> int:
    return common_free_port([host], avoid)


class BrokerProcess:
    """One `dmq serve` subprocess. `url` is its HTTP base URL."""

    def __init__(
        self,
        data_dir: Path,
        *,
        host: str = "127.0.0.1",
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.host = host
        self.port = free_port(host)
        # Never the HTTP port again: both are free until the broker binds them, so two
        # draws could meet (a full run once started a broker on one port for both).
        self.raft_port = free_port(host, avoid=(self.port,))
        self.extra_args = list(extra_args or [])
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def args(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "dmq",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--http-addr",
            f"{self.host}:{self.port}",
            "--raft-addr",
            f"{self.host}:{self.raft_port}",
            *self.extra_args,
        ]

    def start(self, timeout_s: float = 30.0) -> BrokerProcess:
        env = {**os.environ, **self.env}
        env.pop("DMQ_URL", None)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process lifetime
        self.proc = subprocess.Popen(self.args, cwd=ROOT, env=env, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dmq serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"dmq serve did not become ready in {timeout_s}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except FileNotFoundError:
            return ""

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not stop in time. Returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    # Small HTTP helpers for tests that do not go through the client.
    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict[str, Any] | None = None,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
    ) -> tuple[int, dict[str, str], bytes]:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def json(
        self,
        method: str,
        path: str,
        body: bytes | dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        status, _, raw = self.request(method, path, body, content_type)
        return status, json.loads(raw) if raw else None


@contextlib.contextmanager
def file_size_cap(cap_bytes: int) -> Iterator[None]:
    """Every file write of this process is cut at cap_bytes (EFBIG past it), as a full
    disk cuts it; SIGXFSZ ignored so the write fails instead of the process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (cap_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    """Until predicate() is true, polling every 0.05 s; AssertionError naming `what` after
    timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)

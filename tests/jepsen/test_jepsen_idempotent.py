"""Proves the harness's idempotent send logic (jepsen/workload.py) on scripted answers: a
send whose first attempts time out (504) is retried with the same producer id, epoch and
sequence and completes ok once with the offset; the next record gets the next sequence; a
send still unknown after every attempt is info and drops the producer (a new id next).
A real broker cannot be made to answer 504 on cue, so the broker here is a small local
HTTP server replaying scripted statuses (the live runs in jepsen/README.md use real ones)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from jepsen.history import History
from jepsen.workload import IDEMPOTENT_ATTEMPTS, Client


class Script(BaseHTTPRequestHandler):
    statuses: list[int] = []
    bodies: list[dict[str, Any]] = []
    producers = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/producers":
            Script.producers += 1
            self._answer(201, {"producer_id": Script.producers, "producer_epoch": 0})
            return
        Script.bodies.append(body)
        status = Script.statuses.pop(0)
        doc = (
            {"offsets": [{"partition": 0, "offset": 7}]}
            if status == 200
            else {"error": {"code": "request_timeout"}}
        )
        self._answer(status, doc)

    def _answer(self, status: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


class FakeCluster:
    def __init__(self, url: str) -> None:
        broker = type("B", (), {"url": url})()
        self.brokers = {"n1": broker, "n2": broker}
        self.every = self.brokers


def test_unknown_idempotent_sends_are_retried_with_the_same_sequence(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Script)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        history = History(tmp_path / "h.jsonl")
        client = Client(
            FakeCluster(f"http://127.0.0.1:{server.server_port}"), history, "t", 0, idempotent=True
        )  # type: ignore[arg-type]
        Script.statuses = [504, 504, 200, 200]
        assert client.send(0, "a") == (
            "ok",
            {"partition": 0, "value": "a", "offset": 7, "attempts": 3},
        )
        assert client.send(0, "b")[0] == "ok"
        seqs = [(b["producer_id"], b["base_sequence"]) for b in Script.bodies]
        assert seqs == [(1, 0), (1, 0), (1, 0), (1, 1)]
        Script.statuses, Script.bodies = [504] * IDEMPOTENT_ATTEMPTS + [200], []
        assert client.send(0, "c")[0] == "info" and client.producer is None
        assert client.send(0, "d")[0] == "ok"
        assert [(b["producer_id"], b["base_sequence"]) for b in Script.bodies][-1] == (2, 0)
        history.close()
    finally:
        server.shutdown()
        server.server_close()

"""`dmq serve --join` of brokers that share one IP address (127.0.0.1, distinct ports), as
on a laptop, on real processes.

Proves: a three-broker cluster formed with --join (n2 through n1, n3 through n2, which
does not vote in the metadata group) becomes ready and serves a topic replicated on all
three: a joining broker learns each peer's real HTTP address from the cluster it asked,
instead of guessing the peer's Raft host with its own HTTP port (which named itself); and
a first join whose cluster cannot be reached once asked exits after join_timeout_ms
with an error naming the timeout and the addresses it tried, instead of waiting forever.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from tests_support import BrokerProcess, free_port


def test_three_brokers_on_one_address_form_a_cluster_with_join(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    n1 = broker_factory("n1", extra_args=["--node-id", "n1"]).start()
    n2 = broker_factory("n2", extra_args=["--node-id", "n2", "--join", n1.url])
    n2.start(timeout_s=60)
    n3 = broker_factory("n3", extra_args=["--node-id", "n3", "--join", n2.url])
    n3.start(timeout_s=60)
    assert {n1.host, n2.host, n3.host} == {"127.0.0.1"}
    status, cluster = n3.json("GET", "/v1/cluster")
    assert status == 200
    addrs = {b["node_id"]: b["http_addr"] for b in cluster["brokers"]}
    assert addrs == {"n1": n1.url[7:], "n2": n2.url[7:], "n3": n3.url[7:]}
    topic = {"name": "laptop", "partitions": 1, "replication_factor": 3}
    assert n3.json("POST", "/v1/topics", topic)[0] == 201
    assert n3.json("POST", "/v1/topics/laptop/records", {"records": [{"value": "v"}]})[0] == 200
    status, fetched = n2.json("GET", "/v1/topics/laptop/partitions/0/records")
    assert status == 200 and [r["value"] for r in fetched["records"]] == ["v"]


def _log_time(log: str, words: str) -> float:
    """Seconds of the day of the first log line holding `words`."""
    line = next(line for line in log.splitlines() if words in line)
    clock = line.split()[1].replace(",", ".")  # 2026-11-29 04:35:33,817 ...
    hours, minutes, seconds = clock.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


class _Answer(http.server.BaseHTTPRequestHandler):
    """Answers GET /v1/cluster with what a real broker answered before it stopped."""

    doc: dict[str, Any] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps(self.doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_join_that_cannot_register_exits_after_its_timeout(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    n1 = broker_factory("n1", extra_args=["--node-id", "n1"]).start()
    _Answer.doc = n1.json("GET", "/v1/cluster")[1]
    n1.stop()  # the cluster answered the join, then went away
    server = http.server.HTTPServer(("127.0.0.1", free_port()), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        n2 = broker_factory(
            "n2", extra_args=["--node-id", "n2", "--join", url, "--join-timeout-ms", "3000"]
        )
        started = time.monotonic()
        try:
            n2.start(timeout_s=60)
            raise AssertionError("n2 became ready without its cluster")
        except RuntimeError as exc:
            assert "exited with 1" in str(exc), exc
        elapsed_s = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    assert elapsed_s < 30, elapsed_s
    log = n2.log()
    assert "not registered in the cluster within join_timeout_ms (3000 ms)" in log, log
    # Gave up at its timeout, not after a whole registration attempt (request_timeout_ms,
    # 10 s): from the end of the join's ask ("listening on") to the exit.
    listening, exiting = (_log_time(log, word) for word in ("listening on", "exiting:"))
    assert exiting - listening < 8.0, log
    assert n1.url[7:] in log, log  # the address it asked: n1's own, not a guess

"""Test support: a cluster of real `python -m dmq serve` processes on loopback.

Node k (n1, n2, ...) listens on 127.0.0.(10 + k), every node on the same HTTP port and the
same Raft port (one free port common to all hosts for each), as the fault harness will.
`DmqCluster` starts them with their stdout and stderr in `<tmp>/<node>.log`, talks to them
with urllib only (no dmq import: the tests see what a client sees), and `close()` kills
every process it started, stopped ones included, so a failing test leaves nothing running.
The `dmq_cluster` fixture (conftest.py) closes it and prints the tail of every node's log
when the test failed.

`DmqCluster(..., secret=b"...")` gives every node `--cluster-secret-file`; its nodes then
sign their requests to `/v1/internal/*` as a broker does (`sign_internal`: the scheme of
dmq/internal_auth.py, written out again here from its documentation).

The Raft group and on-disk layout the helpers read: `<data dir>/partitions/<topic>-<p>/`
holds the segments (`*.log`), `<data dir>/raft/groups/<group id>/journal` the Raft journal
(format in raft/journal.py: 16-byte header, then `u32 len | u32 crc | u64 idx | u64 term |
command` records).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import json
import os
import signal
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

from bench.loopback import common_free_port as free_port_on

ROOT = Path(__file__).resolve().parents[2]
FIRST_HOST = 11  # node k (1-based) listens on 127.0.0.(10 + k)
RETRIABLE_STATUSES = (429, 503, 504)
LOG_TAIL_BYTES = 6000
FAILOVER_S_MAX = 6.0  # the target is 3 s; margin for a loaded 2-core machine

T = TypeVar("T")


class ClusterError(AssertionError):
    """A harness wait or request did not reach its goal in time."""


def wait_for(
    probe: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.05
) -> T:
    """Call probe until it returns something other than None (or False); return that."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = probe()
        except (OSError, ValueError, KeyError, ClusterError) as error:  # not there yet
            last_error = error
            result = None
        if result is not None and result is not False:
            return result
        time.sleep(interval_s)
    raise ClusterError(f"{what}: not within {timeout_s} s (last error: {last_error!r})")


SIGNATURE_HEADER = "X-Dmq-Signature"


def sign_internal(
    secret: bytes, method: str, target: str, body: bytes = b"", now_ms: int | None = None
) -> str:
    """The X-Dmq-Signature of a request to `target` (raw path and query): `v1:<ms>:<hex
    HMAC-SHA256(secret, "dmq internal v1\n" METHOD "\n" target "\n" ms "\n" body)>`."""
    stamp = str(int(time.time() * 1000) if now_ms is None else now_ms)
    message = f"dmq internal v1\n{method}\n{target}\n{stamp}\n".encode() + body
    return f"v1:{stamp}:{hmac.new(secret, message, hashlib.sha256).hexdigest()}"


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def __repr__(self) -> str:
        return f"Response({self.status}, {self.body[:300]!r})"


class Node:
    """One `dmq serve` process (it may be down); `url` is its HTTP base URL."""

    def __init__(
        self, node_id: str, host: str, http_port: int, data_dir: Path, log_path: Path
    ) -> None:
        self.node_id = node_id
        self.host = host
        self.http_port = http_port
        self.data_dir = data_dir
        self.log_path = log_path
        self.args: list[str] = []
        self.env: dict[str, str] = {}
        self.secret: bytes | None = None  # signs /v1/internal requests when set
        self.tls: ssl.SSLContext | None = None  # https, checked against the cluster's CA
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False  # SIGSTOPped
        # The source tree the next start runs (its cwd: `python -m dmq` imports from it);
        # another release's checkout for upgrade tests, with PYTHONPATH in `env` to match.
        self.root = ROOT

    def __repr__(self) -> str:
        return f"Node({self.node_id}, alive={self.alive})"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.http_port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def drop_flags(self, *flags: str) -> None:
        """Remove each of `flags` given, with its value, from the next start's args."""
        for flag in flags:
            if flag in self.args:
                at = self.args.index(flag)
                del self.args[at : at + 2]

    def start(self) -> Node:
        """Spawn the process (no wait: a node is ready only once a majority runs)."""
        assert not self.alive, f"{self.node_id} is already running"
        env = {**os.environ, **self.env}
        env.pop("DMQ_URL", None)
        with open(self.log_path, "ab") as log:
            log.write(f"==== start {time.strftime('%H:%M:%S')} {' '.join(self.args)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dmq", "serve", *self.args],
                cwd=self.root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.stopped = False
        return self

    def kill9(self) -> None:
        """SIGKILL, as a crash: nothing is flushed or closed."""
        if self.alive:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)
        self.stopped = False

    def sigstop(self) -> None:
        assert self.proc is not None and self.alive
        self.proc.send_signal(signal.SIGSTOP)
        self.stopped = True

    def sigcont(self) -> None:
        assert self.proc is not None and self.alive
        self.proc.send_signal(signal.SIGCONT)
        self.stopped = False

    def is_ready(self) -> bool:
        return self.alive and self.request("GET", "/readyz", timeout_s=1.0).status == 200

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | bytes | None = None,
        *,
        timeout_s: float = 20.0,
    ) -> Response:
        """One HTTP request. Connection failures raise OSError (URLError is one)."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.secret is not None and path.startswith("/v1/internal/"):
            req.add_header(SIGNATURE_HEADER, sign_internal(self.secret, method, path, data or b""))
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=self.tls) as resp:
                return Response(resp.status, dict(resp.headers), resp.read())
        except urllib.error.HTTPError as err:
            return Response(err.code, dict(err.headers), err.read())
        except http.client.HTTPException as err:  # e.g. the node died mid-answer
            raise ConnectionError(f"{self.node_id}: {err!r}") from err

    def json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON answer of a request that must succeed (2xx)."""
        resp = self.request(method, path, body)
        if not 200 <= resp.status < 300:
            raise ClusterError(f"{self.node_id} {method} {path}: {resp!r}")
        return resp.json()

    def log_tail(self, size_bytes: int = LOG_TAIL_BYTES) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - size_bytes))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / "partitions" / f"{topic}-{partition}"

    def segment_bytes(self, topic: str, partition: int) -> dict[str, bytes]:
        """Every segment file of the partition replica on this node: name -> bytes."""
        directory = self.partition_dir(topic, partition)
        return {path.name: path.read_bytes() for path in sorted(directory.glob("*.log"))}

    def group_dir(self, group_id: int | str) -> Path:
        return self.data_dir / "raft" / "groups" / str(group_id)


def _tls_args(tls_dir: Path) -> list[str]:
    return [
        "--tls-cert", str(tls_dir / "broker.pem"), "--tls-key", str(tls_dir / "broker-key.pem"),
        "--tls-ca", str(tls_dir / "ca.pem"),
    ]  # fmt: skip


class DmqCluster:
    """n `dmq serve` nodes on 127.0.0.11.., one HTTP and one Raft port shared by all."""

    def __init__(
        self,
        tmp_path: Path,
        n: int = 3,
        *,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        metadata_voters: list[str] | None = None,
        secret: bytes | None = None,
        tls_dir: Path | None = None,
    ) -> None:
        """tls_dir: certificates of `dmq cert dev` for every node's address: TLS on, with
        its ca.pem the harness's CA too."""
        self.tmp_path = tmp_path
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.secret_file = tmp_path / "cluster-secret"
        if secret is not None:
            self.secret_file.write_bytes(secret)
        ids = [f"n{k + 1}" for k in range(n)]
        hosts = [f"127.0.0.{FIRST_HOST + k}" for k in range(n)]
        self.http_port = free_port_on(hosts)
        self.raft_port = free_port_on(hosts, avoid=[self.http_port])
        peers = ",".join(f"{i}={h}:{self.raft_port}" for i, h in zip(ids, hosts, strict=True))
        self.nodes: dict[str, Node] = {}
        for node_id, host in zip(ids, hosts, strict=True):
            node = Node(
                node_id, host, self.http_port, tmp_path / node_id, tmp_path / f"{node_id}.log"
            )
            node.args = [
                "--node-id", node_id, "--data-dir", str(node.data_dir),
                "--http-addr", f"{host}:{self.http_port}",
                "--raft-addr", f"{host}:{self.raft_port}", "--peers", peers,
                *(["--metadata-voters", ",".join(metadata_voters)] if metadata_voters else []),
                *(["--cluster-secret-file", str(self.secret_file)] if secret else []),
                *(_tls_args(tls_dir) if tls_dir else []),
                *(extra_args or []),
            ]  # fmt: skip
            node.env = dict(env or {})
            node.secret = secret
            if tls_dir is not None:
                node.tls = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
                node.tls.load_cert_chain(tls_dir / "client.pem", tls_dir / "client-key.pem")
            self.nodes[node_id] = node

    def limit_peers(self, node_ids: Iterable[str], known: Iterable[str]) -> None:
        """Start `node_ids` knowing only `known` as peers (a cluster that others join
        later: the joiners list everyone, the first brokers learn them from the catalogue)."""
        peers = self.peers_of(known)
        for node_id in node_ids:
            args = self.nodes[node_id].args
            args[args.index("--peers") + 1] = peers

    def peers_of(self, node_ids: Iterable[str]) -> str:
        """The `--peers` value naming node_ids."""
        return ",".join(f"{i}={self.nodes[i].host}:{self.raft_port}" for i in node_ids)

    def use_join(self, node_id: str, urls: str) -> None:
        """Its next start joins through `--join urls` instead of naming peers and voters."""
        node = self.nodes[node_id]
        node.drop_flags("--join", "--peers", "--metadata-voters")
        node.args += ["--join", urls]

    # --- processes ----------------------------------------------------------------------

    def __getitem__(self, node_id: str) -> Node:
        return self.nodes[node_id]

    def live(self) -> list[Node]:
        return [node for node in self.nodes.values() if node.alive and not node.stopped]

    def start_all(self, timeout_s: float = 60.0) -> DmqCluster:
        for node in self.nodes.values():
            node.start()
        self.wait_ready(timeout_s=timeout_s)
        return self

    def wait_ready(self, nodes: Iterable[Node] | None = None, timeout_s: float = 60.0) -> None:
        """Poll /readyz of every given node in turn until all answer 200; a node that exits
        fails the wait at once (with its log)."""
        waiting = list(nodes if nodes is not None else self.nodes.values())
        deadline = time.monotonic() + timeout_s
        while waiting:
            for node in list(waiting):
                if node.proc is None or node.proc.poll() is not None:
                    code = None if node.proc is None else node.proc.returncode
                    raise ClusterError(f"{node.node_id} exited ({code}):\n{node.log_tail()}")
                try:
                    if node.is_ready():
                        waiting.remove(node)
                except OSError:
                    pass
            if waiting and time.monotonic() > deadline:
                names = [node.node_id for node in waiting]
                raise ClusterError(f"{names} not ready within {timeout_s} s")
            if waiting:
                time.sleep(0.1)

    def restart(self, node_id: str, timeout_s: float = 60.0) -> Node:
        node = self.nodes[node_id]
        node.kill9()
        node.start()
        self.wait_ready([node], timeout_s=timeout_s)
        return node

    def kill9(self, node_id: str) -> None:
        self.nodes[node_id].kill9()

    def kill_all(self) -> None:
        """SIGKILL every node at once (then reap them), as a power cut would stop them."""
        for node in self.nodes.values():
            if node.alive:
                assert node.proc is not None
                node.proc.kill()
        for node in self.nodes.values():
            node.kill9()

    def close(self) -> None:
        """Kill every process, stopped or not; never raises for a process already gone."""
        for node in self.nodes.values():
            if node.alive:
                assert node.proc is not None
                if node.stopped:
                    node.proc.send_signal(signal.SIGCONT)
                node.proc.kill()
        for node in self.nodes.values():
            if node.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(10)

    def log_tails(self) -> str:
        return "\n".join(
            f"----- {node.node_id} ({node.log_path}) -----\n{node.log_tail()}"
            for node in self.nodes.values()
        )

    def __enter__(self) -> DmqCluster:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- cluster state ------------------------------------------------------------------

    def any_live(self, exclude: Iterable[str] = ()) -> Node:
        excluded = set(exclude)
        for node in self.live():
            if node.node_id not in excluded:
                return node
        raise ClusterError("no live node")

    def status(self, via: Node | None = None) -> dict[str, Any]:
        node = via or self.any_live()
        return node.json("GET", "/v1/cluster/status")  # type: ignore[no-any-return]

    def group(self, topic: str | None, partition: int | None, via: Node | None = None) -> dict:
        """The /v1/cluster/status entry of one group (topic None: the metadata group)."""
        for group in self.status(via)["groups"]:
            if group["topic"] == topic and (topic is None or group["partition"] == partition):
                return group  # type: ignore[no-any-return]
        raise ClusterError(f"no group for {topic}-{partition}")

    def _leader_probe(self, topic: str | None, partition: int | None) -> str | None:
        live = {node.node_id for node in self.live()}
        group = self.group(topic, partition)
        leader = group["leader"]
        if leader not in live:
            return None
        mine = [r for r in group["replicas"] if r["node_id"] == leader]
        return leader if mine and mine[0]["is_leader"] else None

    def leader_of(self, topic: str, partition: int, timeout_s: float = 20.0) -> str:
        """The node id of the live leader of a partition's group."""
        return wait_for(
            lambda: self._leader_probe(topic, partition),
            timeout_s,
            f"a live leader of {topic}-{partition}",
        )

    def metadata_leader(self, timeout_s: float = 20.0) -> str:
        return wait_for(lambda: self._leader_probe(None, None), timeout_s, "a live metadata leader")

    # --- client calls -------------------------------------------------------------------

    def create_topic(
        self, name: str, partitions: int, replication_factor: int, via: Node | None = None
    ) -> Any:
        """Create a topic (retrying while there is no leader) and wait until every
        partition has a live leader."""
        body = {"name": name, "partitions": partitions, "replication_factor": replication_factor}
        node = via or self.any_live()
        resp = retry(lambda: node.request("POST", "/v1/topics", body), timeout_s=30.0)
        # 409: an earlier attempt that timed out had created it (names are unique per test).
        assert resp.status in (201, 409), f"create {name} through {node.node_id}: {resp!r}"
        for partition in range(partitions):
            self.leader_of(name, partition)
        return resp.json()


def operations(node: Node) -> dict[str, Any]:
    """GET /v1/cluster/operations (reassignments with progress, decommissions)."""
    return node.json("GET", "/v1/cluster/operations")  # type: ignore[no-any-return]


def placements(node: Node, topic: str) -> list[list[str]]:
    """Each partition's replica list as the catalogue has it."""
    return [p["replicas"] for p in node.json("GET", f"/v1/topics/{topic}")["partitions"]]


@dataclass(frozen=True, slots=True)
class Ack:
    value: str
    partition: int
    offset: int
    sent: float  # time.monotonic() when the request left
    done: float  # ... and when its acknowledgement arrived


@dataclass(eq=False)  # a load is itself, not its fields
class LoadThread:
    """A daemon thread running `_run` until `finish()` sets `stop` (then joined, 30 s)."""

    stop: threading.Event = field(default_factory=threading.Event, kw_only=True)
    thread: threading.Thread | None = field(default=None, kw_only=True)

    def start(self) -> Self:
        self.thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(30)


@dataclass(eq=False)
class Producer(LoadThread):
    """A thread producing one record per request (acks=all) through one node, to the given
    partitions in turn, until finish(). After a retriable answer (429, 503, 504) or a
    connection failure it goes on with a new value: an unanswered attempt may or may not
    be in the log, so a value is never sent twice and a duplicate is always a bug."""

    node: Node
    topic: str
    name: str
    partitions: tuple[int, ...] = (0,)
    attempts: list[str] = field(default_factory=list)
    acked: list[Ack] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def _run(self) -> None:
        attempt = 0
        while not self.stop.is_set():
            value = f"{self.name}-{attempt}"
            partition = self.partitions[attempt % len(self.partitions)]
            attempt += 1
            self.attempts.append(value)
            body = {"records": [{"value": value, "partition": partition}]}
            sent = time.monotonic()
            try:
                resp = self.node.request(
                    "POST", f"/v1/topics/{self.topic}/records?acks=all", body, timeout_s=15.0
                )
            except OSError:
                time.sleep(0.05)
                continue
            if resp.status == 200:
                [answer] = resp.json()["offsets"]
                if answer["partition"] != partition:
                    self.errors.append(f"{value}: sent to {partition}, answered {answer}")
                    return
                self.acked.append(Ack(value, partition, answer["offset"], sent, time.monotonic()))
            elif resp.status in RETRIABLE_STATUSES:
                time.sleep(0.05)
            else:
                self.errors.append(f"{value}: {resp!r}")
                return

    def finish(self) -> None:
        super().finish()
        assert self.thread is not None and not self.thread.is_alive(), f"{self.name} is stuck"


def retry(call: Callable[[], Response], timeout_s: float) -> Response:
    """Repeat a request while it answers a retriable status or cannot connect."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            resp = call()
            if resp.status not in RETRIABLE_STATUSES:
                return resp
        except OSError as error:
            resp = Response(0, {}, repr(error).encode())
        if time.monotonic() > deadline:
            return resp
        time.sleep(0.1)


def produce(
    node: Node,
    topic: str,
    records: list[dict[str, Any]],
    *,
    acks: str = "all",
    timeout_s: float = 20.0,
) -> list[tuple[int, int]]:
    """One produce request that must succeed: [(partition, offset)] in record order."""
    resp = node.request(
        "POST", f"/v1/topics/{topic}/records?acks={acks}", {"records": records}, timeout_s=timeout_s
    )
    if resp.status != 200:
        raise ClusterError(f"produce to {topic} through {node.node_id}: {resp!r}")
    return [(item["partition"], item["offset"]) for item in resp.json()["offsets"]]


def fetch_all(
    node: Node, topic: str, partition: int, start_offset: int = 0, timeout_s: float = 20.0
) -> list[tuple[int, str | None, str | None]]:
    """Every committed record of a partition from start_offset, read through `node`:
    [(offset, key, value)], up to the high watermark as the node reports it."""
    records: list[tuple[int, str | None, str | None]] = []
    offset = start_offset
    deadline = time.monotonic() + timeout_s
    while True:
        query = urllib.parse.urlencode({"offset": offset, "max_records": 1000})
        path = f"/v1/topics/{topic}/partitions/{partition}/records?{query}"
        left_s = max(0.0, deadline - time.monotonic())
        resp = retry(lambda path=path: node.request("GET", path), timeout_s=left_s)
        if resp.status != 200:
            raise ClusterError(f"fetch {topic}-{partition}@{offset} via {node.node_id}: {resp!r}")
        answer = resp.json()
        records.extend((r["offset"], r["key"], r["value"]) for r in answer["records"])
        offset = answer["next_offset"]
        if offset >= answer["high_watermark"] or not answer["records"]:
            return records


# --- checks -----------------------------------------------------------------------------


def check_log_against_acks(
    log: list[tuple[int, str | None, str | None]], producers: list[Producer], partition: int = 0
) -> None:
    """For one partition's log: every value acknowledged for it exactly once, at its
    acknowledged offset; no value twice; offsets dense; each producer's acknowledgements
    in increasing offset order."""
    assert [offset for offset, _, _ in log] == list(range(len(log))), "offsets not dense"
    where: dict[str | None, list[int]] = {}
    for offset, _, value in log:
        where.setdefault(value, []).append(offset)
    twice = {value: offsets for value, offsets in where.items() if len(offsets) > 1}
    assert not twice, f"values stored more than once: {twice}"
    attempted = {value for p in producers for value in p.attempts}
    assert set(where) <= attempted, f"values nobody sent: {set(where) - attempted}"
    for producer in producers:
        acked = [ack for ack in producer.acked if ack.partition == partition]
        lost = [(ack.value, ack.offset) for ack in acked if where.get(ack.value) != [ack.offset]]
        assert not lost, f"{producer.name}: acknowledged but not at their offset: {lost[:10]}"
        offsets = [ack.offset for ack in acked]
        assert offsets == sorted(offsets), f"{producer.name}: acknowledged out of order"


def first_ack_sent_after(producers: list[Producer], killed_at: float) -> float | None:
    """Seconds from the kill to the first acknowledgement of a request sent after it."""
    return min(
        (a.done - killed_at for p in producers for a in p.acked if a.sent > killed_at),
        default=None,
    )


def wait_identical_segments(
    cluster: DmqCluster, topic: str, partitions: int, timeout_s: float = 30.0
) -> dict[str, bytes]:
    """Wait until every live node holds byte-identical segment files for each partition;
    return the last partition's files."""

    def same() -> dict[str, bytes] | None:
        files: dict[str, bytes] = {}
        for partition in range(partitions):
            copies = [node.segment_bytes(topic, partition) for node in cluster.live()]
            if not copies[0] or any(copy != copies[0] for copy in copies[1:]):
                return None
            files = copies[0]
        return files

    try:
        return wait_for(same, timeout_s, f"identical segments of {topic}")
    except AssertionError:
        sizes = {
            node.node_id: {
                p: {n: len(b) for n, b in node.segment_bytes(topic, p).items()}
                for p in range(partitions)
            }
            for node in cluster.live()
        }
        raise AssertionError(f"segments of {topic} differ after {timeout_s} s: {sizes}") from None


def wait_caught_up(
    cluster: DmqCluster, topic: str, partition: int, replicas: int = 3, timeout_s: float = 15.0
) -> dict[str, Any]:
    """Wait until /v1/cluster/status shows every replica of the group at one commit index
    and applied position, with lag 0; return the group."""

    def caught_up() -> dict[str, Any] | None:
        group = cluster.group(topic, partition)
        found = group["replicas"]
        positions = {(r["commit_index"], r["last_applied"]) for r in found}
        ok = len(found) == replicas and len(positions) == 1 and all(r["lag"] == 0 for r in found)
        return group if ok else None

    return wait_for(caught_up, timeout_s, f"status: every replica of {topic}-{partition} at lag 0")


# --- on-disk inspection ------------------------------------------------------------------

_JOURNAL_HEADER_BYTES = 16
_JOURNAL_RECORD = struct.Struct("<IIQQ")  # body_len, crc, idx, term


def journal_indexes(journal: Path) -> tuple[int, int] | None:
    """(first, last) Raft index held by a journal file, or None if it holds no entry.
    Stops at the first record cut short (a torn tail), as recovery does."""
    data = journal.read_bytes()
    offset = _JOURNAL_HEADER_BYTES
    first = last = None
    while offset + _JOURNAL_RECORD.size <= len(data):
        body_len, _, idx, _ = _JOURNAL_RECORD.unpack_from(data, offset)
        end = offset + 8 + body_len
        if end > len(data):
            break
        first = idx if first is None else first
        last = idx
        offset = end
    return None if first is None or last is None else (first, last)

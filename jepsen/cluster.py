"""The brokers under test: `python -m dmq serve` processes on their own loopback
addresses (node k on 127.0.0.(10 + k)), one HTTP port and one Raft port common to all,
as tests/cluster does. The harness reaches them over HTTP only (urllib); it touches their
files only to simulate a power loss and to delete a departed broker's data (nemesis.py).

Membership (the join and leave nemeses): `add_broker` makes the next node (n6 on
127.0.0.16 after five) whose first start joins with `--join URL`; `retire` takes a node
out of `brokers` once it left. `brokers` and `hosts` are replaced, never changed in
place, so worker threads iterating them see one consistent cluster; `every` keeps every
node ever made (a worker may still hold the id of one that just left).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from http.client import HTTPException
from pathlib import Path
from typing import Any

from dmq.dev_certs import write_dev_certs
from dmq.internal_auth import SIGNATURE_HEADER, is_internal, sign, signed_headers, target_of
from dmq.planted import PLANTED_BUG_ENV

FIRST_HOST = 11  # node k (1-based) listens on 127.0.0.(10 + k)
LAST_HOST = 254  # joins stop there (ids and addresses are never reused)
DURABLE_TRACE_ENV = "DMQ_DURABLE_TRACE"  # dmq/broker/broker.py: the power-loss test hook
RETRIABLE = (429, 503, 504)
STOP_WAIT_S = 15.0  # a retired broker's graceful stop (SIGTERM) before SIGKILL


PORT_TRIES_MAX = 500
PORT_FLOOR = 10_000


SECRET_FILE = "cluster-secret"  # noqa: S105 - a file name; the secret is drawn per run
# The secret of the cluster under test, set by Cluster: http() signs /v1/internal calls
# with it, as a broker does (dmq/internal_auth.py). One cluster per harness process.
_secret: bytes | None = None
# Brokers' base URLs that run 0.1.0 (the upgrade nemesis, jepsen/upgrade.py): it checks
# only the plain form of an internal signature, so http() signs plainly for them.
plain_signed: set[str] = set()
# The bearer token http() sends (brokers with --auth on): DMQ_TOKEN, or the superuser token
# Cluster(auth=True) draws per run and gives the brokers as DMQ_SUPERUSER_TOKEN.
_token: str | None = os.environ.get("DMQ_TOKEN") or None
# Cluster(tls=True): the CA of the run's certificates, which http() checks brokers against.
_tls: ssl.SSLContext | None = None


class HarnessError(RuntimeError):
    """The harness could not do its part (exit code 2): not a verdict on dmq."""


def _probe_bind(host: str, port: int) -> None:
    """OSError when host:port cannot be bound (taken)."""
    with socket.socket() as probe:
        probe.bind((host, port))


def listen_ports(hosts: list[str], count: int, seed: int) -> list[int]:
    """`count` ports free on every host, below the kernel's ephemeral range: a broker
    restarted after a kill must get its port back, and an ephemeral port is handed to
    any outgoing connection meanwhile (other clusters' nodes on these addresses bind
    their own address with port 0)."""
    low = 32_768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    # Seeded by the string, not seed ^ pid: runs started together (consecutive pids) with
    # seeds 1 and 3 drew the same ports from seed ^ pid and one could not start.
    rng = random.Random(f"{seed}:{os.getpid()}")
    found: list[int] = []
    for _ in range(PORT_TRIES_MAX):
        port = rng.randrange(PORT_FLOOR, low)
        if port in found:
            continue
        try:
            for host in hosts:
                _probe_bind(host, port)
        except OSError:
            continue
        found.append(port)
        if len(found) == count:
            return found
    raise HarnessError(f"no {count} ports free on {', '.join(hosts)} below {low}")


class Answer:
    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers or {}

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def error_code(self) -> str:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return str(json.loads(self.body)["error"]["code"])
        return ""


def http(
    url: str,
    method: str = "GET",
    body: Any = None,
    timeout_s: float = 5.0,
    headers: dict[str, str] | None = None,
) -> Answer:
    """One request; HTTP errors come back as an Answer, connection failures raise OSError
    (ConnectionRefusedError when nothing listens)."""
    data = json.dumps(body).encode() if body is not None else None
    target = target_of(url)
    if _secret is not None and is_internal(target) and url[: -len(target)] in plain_signed:
        signature = {SIGNATURE_HEADER: sign(_secret, method, target, data or b"")}
    else:
        signature = signed_headers(_secret, method, target, data)
    headers = {**(headers or {}), **signature}
    if _token is not None:
        headers.setdefault("Authorization", f"Bearer {_token}")
    req = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 - a broker's http URL
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=_tls) as resp:  # noqa: S310
            return Answer(resp.status, resp.read(), dict(resp.headers))
    except urllib.error.HTTPError as err:
        return Answer(err.code, err.read(), dict(err.headers))
    except urllib.error.URLError as err:
        reason = err.reason
        raise reason if isinstance(reason, OSError) else ConnectionError(str(reason)) from err
    except HTTPException as err:
        raise ConnectionError(repr(err)) from err


class Broker:
    """One `dmq serve` process (it may be down, or stopped by SIGSTOP)."""

    def __init__(self, node_id: str, host: str, data_dir: Path, log_path: Path) -> None:
        self.node_id = node_id
        self.host = host
        self.data_dir = data_dir
        self.log_path = log_path
        self.args: list[str] = []
        self.first_args: list[str] | None = None  # used once instead of args (a join)
        self.starts = 0  # process starts so far
        self.env: dict[str, str] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.url = ""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.alive:
            return
        env = {**os.environ, **self.env}
        env.pop("DMQ_URL", None)
        args = self.first_args if self.first_args is not None and not self.starts else self.args
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"==== start {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dmq", "serve", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.paused = False

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.paused:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(30)
        self.paused = False

    def stop(self, timeout_s: float = STOP_WAIT_S) -> None:
        """A graceful stop (SIGTERM; SIGKILL after timeout_s): how a departed broker ends."""
        if self.proc is not None and self.proc.poll() is None:
            if self.paused:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        self.kill9()  # past timeout_s; nothing when it has exited

    @property
    def killed(self) -> bool:
        """Its last process ended by SIGKILL (a kill or power fault), not on its own."""
        return self.proc is not None and self.proc.returncode == -signal.SIGKILL

    def pause(self) -> None:
        if self.alive and not self.paused:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.alive and self.paused:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def ready(self) -> bool:
        try:
            return self.alive and http(self.url + "/readyz", timeout_s=1.0).status == 200
        except OSError:
            return False


class Cluster:
    """n brokers in `directory` (data dirs and logs), all started with the same env."""

    def __init__(
        self,
        directory: Path,
        n: int,
        *,
        planted_bug: str | None,
        durable_trace: bool,
        seed: int = 0,
        metadata_voters: list[str] | None = None,
        auth: bool = False,
        tls: bool = False,
        broker_args: list[str] | None = None,
    ) -> None:
        """auth: the brokers run with --auth on and a superuser token drawn per run, which
        every request of the harness carries. tls: the brokers serve https and Raft over
        mutual TLS with certificates of a CA drawn per run (`dmq cert dev` for every
        address a broker of the run may take), which the harness checks them against.
        broker_args: more `dmq serve` flags, the same for every broker (--tiered's)."""
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.broker_args = list(broker_args or ())
        # Every broker shares a secret, as a cluster should run: the harness checks dmq
        # with its Raft connections and internal calls authenticated.
        global _secret
        _secret = secrets.token_hex(32).encode()
        self.secret_file = directory / SECRET_FILE
        self.secret_file.write_bytes(_secret)
        ids = [f"n{k + 1}" for k in range(n)]
        self.hosts = {i: f"127.0.0.{FIRST_HOST + k}" for k, i in enumerate(ids)}
        self.http_port, self.raft_port = listen_ports(list(self.hosts.values()), 2, seed)
        self.env = {DURABLE_TRACE_ENV: "1"} if durable_trace else {}
        if planted_bug:
            self.env[PLANTED_BUG_ENV] = planted_bug
        self.auth = auth
        self.tls_dir: Path | None = None
        global _tls
        _tls = None
        if tls:
            hosts = [f"127.0.0.{k}" for k in range(FIRST_HOST, LAST_HOST + 1)]
            self.tls_dir = write_dev_certs(directory / "certs", hosts).ca.parent
            _tls = ssl.create_default_context(cafile=str(self.tls_dir / "ca.pem"))
        if auth:
            global _token
            _token = secrets.token_hex(24)
            self.env["DMQ_SUPERUSER_TOKEN"] = _token
        # None: the brokers' default (the first 1, 3 or 5 ids, dmq/README.md)
        self.voters = metadata_voters
        self.brokers: dict[str, Broker] = {}
        self.every: dict[str, Broker] = {}
        for node_id in ids:
            self._make(node_id, self.peers_arg(ids))

    def peers_arg(self, ids: list[str], voters: list[str] | None = None) -> list[str]:
        """`--peers` naming these brokers, `--metadata-voters` if fixed."""
        peers = ",".join(f"{i}={self.hosts[i]}:{self.raft_port}" for i in ids)
        voters = voters or self.voters
        return ["--peers", peers] + (["--metadata-voters", ",".join(voters)] if voters else [])

    def _make(self, node_id: str, cluster_args: list[str]) -> Broker:
        host = self.hosts[node_id]
        broker = Broker(node_id, host, self.directory / node_id, self.directory / f"{node_id}.log")
        broker.args = [*self._own_args(broker), *cluster_args]
        broker.env = self.env
        scheme = "http" if self.tls_dir is None else "https"
        broker.url = f"{scheme}://{host}:{self.http_port}"
        self.brokers = {**self.brokers, node_id: broker}
        self.every[node_id] = broker
        return broker

    def _own_args(self, broker: Broker) -> list[str]:
        return [
            "--node-id", broker.node_id, "--data-dir", str(broker.data_dir),
            "--http-addr", f"{broker.host}:{self.http_port}",
            "--raft-addr", f"{broker.host}:{self.raft_port}",
            "--cluster-secret-file", str(self.secret_file),
            *(["--auth", "on"] if self.auth else []),
            *self._tls_args(),
            *self.broker_args,
        ]  # fmt: skip

    def _tls_args(self) -> list[str]:
        if self.tls_dir is None:
            return []
        return [
            "--tls-cert", str(self.tls_dir / "broker.pem"),
            "--tls-key", str(self.tls_dir / "broker-key.pem"),
            "--tls-ca", str(self.tls_dir / "ca.pem"),
        ]  # fmt: skip

    def add_broker(self, join_url: str, voters: list[str]) -> Broker:
        """The next node (never a reused id or address), not started: its first start
        joins through join_url (`--join`, one URL or several comma-separated); a restart
        names the current brokers and the voters (what the first join read is settled
        by then). HarnessError if the cluster's ports are taken on its address."""
        k = len(self.every) + 1
        if FIRST_HOST + k - 1 > LAST_HOST:
            raise HarnessError(f"no loopback address left for n{k}")
        node_id, host = f"n{k}", f"127.0.0.{FIRST_HOST + k - 1}"
        for port in self.ports:
            try:
                _probe_bind(host, port)
            except OSError as error:
                raise HarnessError(f"{host}:{port} is taken: {error}") from error
        self.hosts = {**self.hosts, node_id: host}
        broker = self._make(node_id, self.peers_arg([*self.brokers, node_id], voters))
        broker.first_args = [*self._own_args(broker), "--join", join_url]
        return broker

    def retire(self, node_id: str) -> None:
        """A node that left: stop it, forget it as a current broker, delete its data."""
        broker = self.every[node_id]
        broker.stop()
        self.brokers = {i: b for i, b in self.brokers.items() if i != node_id}
        shutil.rmtree(broker.data_dir, ignore_errors=True)

    @property
    def ports(self) -> tuple[int, int]:
        return self.http_port, self.raft_port

    def start_all(self, timeout_s: float = 90.0) -> None:
        for broker in self.brokers.values():
            broker.start()
        self.wait_ready(list(self.brokers.values()), timeout_s)

    def wait_ready(self, brokers: list[Broker], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        waiting = [b for b in brokers if not b.paused]
        while waiting:
            for broker in list(waiting):
                if not broker.alive:
                    raise HarnessError(f"{broker.node_id} exited; see {broker.log_path}")
                if broker.ready():
                    waiting.remove(broker)
            if waiting and time.monotonic() > deadline:
                raise HarnessError(f"{[b.node_id for b in waiting]} not ready in {timeout_s} s")
            time.sleep(0.2)

    def live(self) -> list[Broker]:
        return [b for b in self.brokers.values() if b.alive and not b.paused]

    def status(self) -> dict[str, Any] | None:
        """/v1/cluster/status from the first live broker that answers, else None."""
        for broker in self.live():
            try:
                answer = http(broker.url + "/v1/cluster/status", timeout_s=3.0)
            except OSError:
                continue
            if answer.status == 200:
                return answer.json()  # type: ignore[no-any-return]
        return None

    def leader_of(self, topic: str | None, partition: int | None) -> str | None:
        """The reported leader of a partition's group (topic None: the metadata group)."""
        status = self.status()
        for group in (status or {}).get("groups", []):
            if group["topic"] == topic and (topic is None or group["partition"] == partition):
                return group.get("leader")  # type: ignore[no-any-return]
        return None

    def local_leader(
        self, topic: str, partition: int, among: list[str], timeout_s: float = 1.0
    ) -> str | None:
        """The partition's leader as the brokers `among` see it themselves (each one's
        `GET /v1/internal/status`, its own Raft view, not the catalogue's lagging report):
        one of them that says it leads, else the leader one of them names if it is among
        them, else one that holds a replica; None if none answers. The majority side's
        writers ask it while a partition cuts the old leader off (workload.py)."""
        named: str | None = None
        hosting: str | None = None
        for node_id in among:
            broker = self.brokers.get(node_id)
            if broker is None:
                continue
            try:
                answer = http(broker.url + "/v1/internal/status", timeout_s=timeout_s)
                replicas = answer.json()["replicas"] if answer.status == 200 else []
            except (OSError, ValueError, KeyError):
                continue
            for replica in replicas:
                if replica.get("topic") != topic or replica.get("partition") != partition:
                    continue
                if replica.get("is_leader"):
                    return node_id
                hosting = hosting or node_id
                if replica.get("leader") in among:
                    named = named or replica["leader"]
        return named or hosting

    def close(self) -> None:
        for broker in self.every.values():
            with contextlib.suppress(Exception):
                broker.kill9()

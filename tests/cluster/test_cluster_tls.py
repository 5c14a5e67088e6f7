"""Proves, with real `dmq serve` processes on 127.0.0.11-13 and certificates written by a
real `dmq cert dev` process, that TLS is on everywhere (issue #20, the TLS part):

- the Python client produces and fetches over https (checked against the CA), through
  every broker, so forwarded appends and relayed fetches (broker-to-broker https) work,
  with tls_client_auth = required (the brokers present their certificates to each
  other); /v1/cluster advertises https URLs;
- curl with --cacert reads /readyz; plain http to the TLS port gets no answer; a client
  without the CA is refused with "certificate verify failed" (a ClientError, not retried);
- a binary fetch of a multi-MiB range returns byte for byte the leader's segment file
  (the sendfile path falls back to copying under TLS);
- the Raft port speaks TLS only: a plain TCP hello is refused (logged); a broker killed
  with -9 while records are produced comes back and holds the same log (Raft over TLS);
- with tls_client_auth = required, a client without a certificate is refused and one
  with the client certificate of `dmq cert dev` is served;
- SIGHUP reloads the files: new connections to the HTTP and the Raft port get the new
  certificate (of a new CA, trusted from then on); a key that does not match its
  certificate is refused, logged, and the running certificate stays.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster_harness import ROOT, DmqCluster, fetch_all, produce, wait_for

from dmq.client import Admin, Consumer, Producer, tls_context
from dmq.errors import BrokerUnavailable, ClientError
from raft import auth
from raft.transport import HELLO_GROUP_ID, encode_frame

HOSTS = "127.0.0.11,127.0.0.12,127.0.0.13,localhost"
BATCHES = "application/vnd.dmq.batches"


def dev_certs(directory: Path) -> Path:
    """`dmq cert dev` as a real CLI process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMQ_")}
    done = subprocess.run(
        [sys.executable, "-m", "dmq", "cert", "dev", "--dir", str(directory), "--hosts", HOSTS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (directory / "ca.pem").exists() and (
        directory / "broker-key.pem"
    ).stat().st_mode & 0o077 == 0
    return directory


def _binary_fetch(url: str, context: ssl.SSLContext, topic: str, max_bytes: int) -> bytes:
    request = urllib.request.Request(
        f"{url}/v1/topics/{topic}/partitions/0/records?offset=0&max_bytes={max_bytes}",
        headers={"Accept": BATCHES},
    )
    with urllib.request.urlopen(request, timeout=30, context=context) as resp:
        assert resp.headers["Content-Type"].startswith(BATCHES)
        return bytes(resp.read())


def test_three_brokers_with_tls_everywhere(
    tmp_path: Path, dmq_cluster: Callable[..., DmqCluster]
) -> None:
    certs = dev_certs(tmp_path / "certs")
    ca = certs / "ca.pem"
    # Client certificates required: the brokers' own calls on each other present theirs.
    cluster = dmq_cluster(3, tls_dir=certs, extra_args=["--tls-client-auth", "required"])
    cluster.start_all()
    n1, n2, n3 = cluster["n1"], cluster["n2"], cluster["n3"]
    client = [str(certs / "client.pem"), str(certs / "client-key.pem")]
    tls = tls_context(str(ca), *client)

    brokers = n1.json("GET", "/v1/cluster")["brokers"]
    assert {b["url"] for b in brokers} == {n.url for n in (n1, n2, n3)}
    assert all(b["url"].startswith("https://") for b in brokers)

    # The client over https: created through n1, produced through n2, read through n3.
    with Admin(n1.url, tls=tls) as admin:
        admin.create_topic("t", partitions=2, replication_factor=3)
    with Producer(n2.url, tls=tls, linger_ms=5) as producer:
        futures = [producer.send("t", f"v{i}".encode(), key=f"k{i}".encode()) for i in range(200)]
        producer.flush()
    assert all(f.result().offset >= 0 for f in futures)
    seen: list[bytes] = []
    for partition in (0, 1):
        with Consumer(n3.url, topic="t", tls=tls) as consumer:
            consumer.assign([("t", partition)])
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                batch = consumer.poll(timeout_ms=500)
                seen.extend(r.value for r in batch if r.value is not None)
                if not batch:
                    break
    assert sorted(seen) == sorted(f"v{i}".encode() for i in range(200))

    # curl with the CA; plain http to the TLS port; a client without the CA.
    curl = subprocess.run(
        ["curl", "-sS", "--cacert", str(ca), "--cert", client[0], "--key", client[1],
         f"{n1.url}/readyz"], capture_output=True, text=True, timeout=20, check=False,
    )  # fmt: skip
    assert curl.returncode == 0 and '"ready"' in curl.stdout, curl.stderr
    plain = subprocess.run(
        ["curl", "-sS", f"http://{n1.host}:{n1.http_port}/readyz"], capture_output=True,
        text=True, timeout=20, check=False,
    )  # fmt: skip
    assert plain.returncode != 0 and '"ready"' not in plain.stdout
    env_ca = os.environ.pop("DMQ_CA", None)
    try:
        with pytest.raises(ClientError, match="certificate verify failed"), Admin(n1.url) as admin:
            admin.list_topics()
    finally:
        if env_ca is not None:
            os.environ["DMQ_CA"] = env_ca

    # A multi-MiB binary fetch under TLS is the leader's segment, byte for byte.
    with Admin(n1.url, tls=tls) as admin:
        admin.create_topic("big", partitions=1, replication_factor=3)
    with Producer(n1.url, tls=tls, linger_ms=5) as producer:
        for _ in range(400):
            producer.send("big", os.urandom(8 * 1024), partition=0)
        producer.flush()
    leader = cluster[cluster.leader_of("big", 0)]
    body = _binary_fetch(leader.url, tls, "big", 8 * 1024 * 1024)
    segment = leader.segment_bytes("big", 0)[f"{0:020d}.log"]
    assert len(body) > 3 * 1024 * 1024
    assert body == segment[: len(body)]

    # The Raft port: a plain TCP hello is refused before anything is decoded.
    with socket.create_connection((n1.host, cluster.raft_port), timeout=5) as sock:
        sock.sendall(encode_frame(HELLO_GROUP_ID, b"\0" * auth.CHALLENGE_BYTES))
        sock.settimeout(5)
        with pytest.raises((ConnectionError, TimeoutError, OSError)):
            while sock.recv(4096):
                pass
            raise ConnectionResetError("closed")
    wait_for(lambda: "TLS handshake failed" in n1.log_tail(), 10, "the refusal logged")

    # kill -9 a broker while records go on; it restarts and catches up over TLS.
    victim = next(n for n in (n1, n2, n3) if n.node_id != cluster.leader_of("t", 0))
    # Through a broker that does not lead t-0: an append forwarded over https.
    assert produce(victim, "t", [{"value": "forwarded", "partition": 0}])[0][0] == 0
    cluster.kill9(victim.node_id)
    writer = cluster.any_live(exclude=[victim.node_id])
    produce(writer, "t", [{"value": f"after{i}", "partition": 0} for i in range(50)])
    victim.start()
    cluster.wait_ready([victim])
    want = fetch_all(cluster[cluster.leader_of("t", 0)], "t", 0)
    wait_for(
        lambda: (
            victim.segment_bytes("t", 0) == cluster[cluster.leader_of("t", 0)].segment_bytes("t", 0)
            or None
        ),
        30,
        "the restarted broker's copy of t-0 equal to the leader's",
    )
    assert [v for _, _, v in want][-50:] == [f"after{i}" for i in range(50)]
    assert "TLS handshake with" not in victim.log_tail()  # no failed handshake to its peers


def test_client_certificate_required(
    tmp_path: Path, dmq_cluster: Callable[..., DmqCluster]
) -> None:
    certs = dev_certs(tmp_path / "certs")
    ca, cert, key = (str(certs / name) for name in ("ca.pem", "client.pem", "client-key.pem"))
    cluster = dmq_cluster(1, tls_dir=certs, extra_args=["--tls-client-auth", "required"])
    node = cluster.start_all()["n1"]  # the harness presents the client certificate
    with (
        pytest.raises((BrokerUnavailable, ClientError), match="requires a client certificate"),
        Admin(node.url, tls=tls_context(ca), retries=0) as admin,
    ):
        admin.list_topics()
    with Admin(node.url, tls=tls_context(ca, cert, key)) as admin:  # retries a 503 at start
        admin.create_topic("a", partitions=1, replication_factor=1)
        assert "a" in {t.name for t in admin.list_topics()}


def _served_certificate(host: str, port: int, certs: Path) -> bytes:
    """The DER certificate a TLS listener presents, checked against certs' CA, with certs'
    client certificate presented (the Raft port requires one)."""
    context = tls_context(
        str(certs / "ca.pem"), str(certs / "client.pem"), str(certs / "client-key.pem")
    )
    with (
        socket.create_connection((host, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as sock,
    ):
        der = sock.getpeercert(binary_form=True)
    assert der is not None
    return der


def _pem_as_der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def test_sighup_reloads_the_certificates_and_a_bad_file_changes_nothing(
    tmp_path: Path, dmq_cluster: Callable[..., DmqCluster]
) -> None:
    live = dev_certs(tmp_path / "live")  # the files the broker is started with
    fresh = dev_certs(tmp_path / "fresh")  # another CA and its certificates
    cluster = dmq_cluster(1, tls_dir=live)
    node = cluster.start_all()["n1"]
    http_port = int(node.url.rsplit(":", 1)[1])
    ports = {"http": http_port, "raft": cluster.raft_port}
    old = _pem_as_der(live / "broker.pem")
    for port in ports.values():
        assert _served_certificate(node.host, port, live) == old

    for name in ("ca.pem", "broker.pem", "broker-key.pem"):
        shutil.copyfile(fresh / name, live / name)
    assert node.proc is not None
    node.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "TLS reloaded" in node.log_tail(), 10.0, "the reload's log line")
    new = _pem_as_der(fresh / "broker.pem")
    for kind, port in ports.items():
        assert _served_certificate(node.host, port, fresh) == new, kind
    with Admin(node.url, tls=tls_context(str(fresh / "ca.pem"))) as admin:
        admin.create_topic("after-reload", partitions=1, replication_factor=1)

    # A key that does not match the certificate: refused, the running ones stay.
    shutil.copyfile(fresh / "client-key.pem", live / "broker-key.pem")
    node.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "TLS reload refused" in node.log_tail(), 10.0, "the refusal's log line")
    for kind, port in ports.items():
        assert _served_certificate(node.host, port, fresh) == new, kind
    assert node.proc.poll() is None

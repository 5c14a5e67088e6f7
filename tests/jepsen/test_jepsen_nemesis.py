"""Proves the nemesis's own mechanics, without brokers:

- a cut between two loopback hosts drops this cluster's ports in both directions and
  nothing else (another port between the same hosts, and the clients' 127.0.0.1, still
  connect), heal restores them, close removes the chain and its jump;
- a chain left by a harness process that no longer exists is removed at the next setup;
- the power-loss cut truncates each journal and segment to the last traced durable
  length (after a journal rewrite, only later trace lines count); a torn write (the
  disk nemesis) cuts each file somewhere between that length and its end;
- two runs started together (consecutive pids) draw different ports (seed ^ pid did not:
  seeds 1 and 3 at pids 1000 and 1002 collided and a broker could not start);
- the file names and header size copied from raft/ and log/ (jepsen/ may not import
  them) still match.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.loopback import common_free_port
from jepsen import nemesis
from jepsen.nemesis import CHAIN_PREFIX, Net, cut_to_durable, remove_stale_chains
from log.segment import DURABLE_TRACE_SUFFIX
from raft.journal import DURABLE_TRACE_FILE, HEADER_BYTES, JOURNAL_FILE

A, B = "127.0.0.11", "127.0.0.12"


def iptables_rules() -> str:
    return subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True).stdout


@contextlib.contextmanager
def listener(host: str, port: int) -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(16)
    try:
        yield sock
    finally:
        sock.close()


def connects(src: str, dst: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        sock.bind((src, 0))
        try:
            sock.connect((dst, port))
            return True
        except OSError:
            return False


def test_a_cut_drops_only_this_clusters_ports_and_close_removes_the_chain() -> None:
    ours = common_free_port([A, B])
    theirs = common_free_port([A, B], avoid=[ours])
    net = Net((ours,))
    try:
        net.setup()
        assert net.chain in iptables_rules()
        with listener(B, ours), listener(B, theirs), listener(A, ours):
            assert connects(A, B, ours) and connects(B, A, ours)
            net.cut(A, B)
            assert not connects(A, B, ours) and not connects(B, A, ours)
            assert connects(A, B, theirs), "another cluster's port was cut"
            assert connects("127.0.0.1", B, ours), "the clients' link was cut"
            net.heal()
            assert connects(A, B, ours)
    finally:
        net.close()
    assert net.chain not in iptables_rules()


def test_a_stale_chain_of_a_dead_harness_is_removed() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    chain = f"{CHAIN_PREFIX}{dead.pid}-0"
    subprocess.run(["iptables", "-w", "-N", chain], check=True)
    subprocess.run(["iptables", "-w", "-I", "INPUT", "-j", chain], check=True)
    try:
        assert chain in remove_stale_chains()
        assert chain not in iptables_rules()
    finally:
        nemesis._remove_chain(chain)


def test_power_cut_truncates_to_the_traced_durable_length(tmp_path: Path) -> None:
    journal = tmp_path / "raft" / "groups" / "7" / JOURNAL_FILE
    journal.parent.mkdir(parents=True)
    journal.write_bytes(b"j" * 100)
    journal.with_name(DURABLE_TRACE_FILE).write_text("40\n60\n")
    rewritten = tmp_path / "raft" / "groups" / "8" / JOURNAL_FILE
    rewritten.parent.mkdir(parents=True)
    rewritten.write_bytes(b"r" * 50)
    rewritten.with_name(DURABLE_TRACE_FILE).write_text("90\nrewrite\n")
    untraced = tmp_path / "raft" / "groups" / "9" / JOURNAL_FILE
    untraced.parent.mkdir(parents=True)
    untraced.write_bytes(b"u" * 30)
    segment = tmp_path / "partitions" / "t-0" / "00000000000000000000.log"
    segment.parent.mkdir(parents=True)
    segment.write_bytes(b"s" * 80)
    segment.with_name(segment.name + DURABLE_TRACE_SUFFIX).write_text("10\n")
    assert cut_to_durable(tmp_path) == 40 + 0 + (30 - HEADER_BYTES) + 70
    sizes = [p.stat().st_size for p in (journal, rewritten, untraced, segment)]
    assert sizes == [60, 50, HEADER_BYTES, 10]


def test_copied_constants_match_the_brokers() -> None:
    assert nemesis.JOURNAL_FILE == JOURNAL_FILE
    assert nemesis.JOURNAL_TRACE_FILE == DURABLE_TRACE_FILE
    assert nemesis.JOURNAL_HEADER_BYTES == HEADER_BYTES
    assert nemesis.SEGMENT_TRACE_SUFFIX == DURABLE_TRACE_SUFFIX


@pytest.mark.parametrize("kind", ["flood"])
def test_an_unknown_fault_is_a_harness_error(kind: str, tmp_path: Path) -> None:
    from jepsen.cluster import Cluster, HarnessError
    from jepsen.history import History

    cluster = Cluster(tmp_path, 3, planted_bug=None, durable_trace=False)
    with pytest.raises(HarnessError, match="unknown nemesis"):
        nemesis.Nemesis(cluster, History(), [kind], 1, "t", 1)


def test_runs_started_together_draw_different_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    from jepsen import cluster

    drawn = []
    for seed, pid in ((1, 1000), (3, 1002)):  # 1 ^ 1000 == 3 ^ 1002
        monkeypatch.setattr(cluster.os, "getpid", lambda pid=pid: pid)
        drawn.append(cluster.listen_ports(["127.0.0.1"], 2, seed))
    assert not set(drawn[0]) & set(drawn[1]), drawn


def test_a_torn_write_cuts_between_the_durable_length_and_the_end(tmp_path: Path) -> None:
    import random

    journal = tmp_path / "raft" / "groups" / "7" / JOURNAL_FILE
    journal.parent.mkdir(parents=True)
    segment = tmp_path / "partitions" / "t-0" / "00000000000000000000.log"
    segment.parent.mkdir(parents=True)
    lengths = set()
    rng = random.Random(3)
    for _ in range(30):
        journal.write_bytes(b"j" * 100)
        journal.with_name(DURABLE_TRACE_FILE).write_text("40\n60\n")
        segment.write_bytes(b"s" * 80)
        segment.with_name(segment.name + DURABLE_TRACE_SUFFIX).write_text("10\n")
        cut = cut_to_durable(tmp_path, rng)
        sizes = journal.stat().st_size, segment.stat().st_size
        assert 60 <= sizes[0] <= 100 and 10 <= sizes[1] <= 80
        assert cut == (100 - sizes[0]) + (80 - sizes[1])
        lengths.add(sizes)
    assert len(lengths) > 20, "the cut points are drawn, not fixed"

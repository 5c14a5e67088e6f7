"""Proves that a data directory holding a file in a format newer than this release reads is
refused at `dmq serve` with the message README.md promises ("<file>: format N was written
by a dmq newer than this one; this dmq X reads formats up to M: upgrade ..., or restore
...") and exit status 1, with every byte of the directory unchanged (a checksum of every
file and name, before and after), for each versioned file kind of dmq/data_formats.py:
meta.properties, a Raft journal, a Raft snapshot, a segment, the producer and transaction
state, the tiered-storage manifest. The directory is a real one, written by a real broker;
only the version field of one file is raised. Also: each reader on its own (without the
start-up check) says newer, not corrupt, and a directory of this release starts.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest

import dmq
from dmq import meta_file
from dmq.errors import FormatTooNew, MetaFileCorrupt
from dmq.partition.machine import PartitionSnapshot
from log import records
from log.errors import CorruptRecordError
from raft import journal, snapshot
from raft.errors import RaftError
from tests_support import BrokerProcess

TOPIC = "t"
START_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def written_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory a real broker wrote: a topic, records, a Raft snapshot (taken
    every 8 entries), the producer state; then stopped cleanly."""
    data_dir = tmp_path_factory.mktemp("written") / "data"
    broker = BrokerProcess(data_dir, extra_args=["--raft-snapshot-entries", "8"]).start()
    try:
        assert broker.json("POST", "/v1/topics", {"name": TOPIC, "partitions": 1})[0] == 201
        for k in range(40):
            body = {"records": [{"value": f"v{k}"}]}
            assert broker.json("POST", f"/v1/topics/{TOPIC}/records", body)[0] == 200
    finally:
        assert broker.stop() == 0, broker.log()
    partition = data_dir / "partitions" / f"{TOPIC}-0"
    manifest = {"end_offset": 0, "segments": [], "start_offset": 0, "started": False}
    body = json.dumps(manifest).encode()  # as a broker with tiered storage writes it
    (partition / "remote-manifest").write_bytes(struct.pack("<I", crc32c.crc32c(body)) + body)
    return data_dir


def checksum(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        digest.update(str(path.relative_to(directory)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def one(directory: Path, pattern: str) -> Path:
    found = sorted(directory.glob(pattern))
    assert found, f"no {pattern} in {directory}"
    return found[0]


def raise_meta(data_dir: Path) -> tuple[Path, int, int]:
    path = data_dir / "meta.properties"
    path.write_bytes(path.read_bytes().replace(b"version=1\n", b"version=2\n"))
    return path, 2, meta_file.FORMAT_VERSION


def raise_journal(data_dir: Path) -> tuple[Path, int, int]:
    path = one(data_dir, "raft/groups/*/journal")
    with open(path, "r+b") as file:
        file.seek(len(journal.MAGIC))
        file.write(struct.pack("<I", journal.FORMAT_VERSION + 1))
    return path, journal.FORMAT_VERSION + 1, journal.FORMAT_VERSION


def raise_snapshot(data_dir: Path) -> tuple[Path, int, int]:
    path = one(data_dir, "raft/groups/*/snapshot")
    with open(path, "r+b") as file:
        file.seek(len(snapshot.SNAPSHOT_MAGIC_PREFIX))
        file.write(b"2")
    return path, 2, snapshot.SNAPSHOT_FORMAT


def raise_segment(data_dir: Path) -> tuple[Path, int, int]:
    path = one(data_dir, f"partitions/{TOPIC}-0/*.log")
    with open(path, "r+b") as file:
        file.seek(12)  # the first batch's magic
        file.write(bytes([records.MAGIC + 1]))
    return path, records.MAGIC + 1, records.MAGIC


def _raise_json(path: Path, *, line: bool) -> tuple[Path, int, int]:
    raw = path.read_bytes()
    head, sep, rest = raw[4:].partition(b"\n") if line else (raw[4:], b"", b"")
    doc = {**json.loads(head), "format": 2}
    payload = json.dumps(doc).encode() + sep + rest
    path.write_bytes(struct.pack("<I", crc32c.crc32c(payload)) + payload)
    return path, 2, 1


def raise_producers(data_dir: Path) -> tuple[Path, int, int]:
    return _raise_json(data_dir / "partitions" / f"{TOPIC}-0" / "raft-producers", line=True)


def raise_manifest(data_dir: Path) -> tuple[Path, int, int]:
    return _raise_json(data_dir / "partitions" / f"{TOPIC}-0" / "remote-manifest", line=False)


def serve_once(data_dir: Path) -> tuple[int | None, str]:
    """Start `dmq serve` on data_dir; (its exit status, its log) once it exited, or
    (None, log) if it became ready instead (then stopped)."""
    broker = BrokerProcess(data_dir)
    try:
        broker.start(timeout_s=START_TIMEOUT_S)
    except RuntimeError:
        assert broker.proc is not None
        return broker.proc.returncode, broker.log()
    broker.stop()
    return None, broker.log()


@pytest.mark.parametrize(
    "make_newer",
    [raise_meta, raise_journal, raise_snapshot, raise_segment, raise_producers, raise_manifest],
)
def test_a_newer_file_is_refused_at_start_and_nothing_changes(
    written_dir: Path, tmp_path: Path, make_newer: Callable[[Path], tuple[Path, int, int]]
) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(written_dir, data_dir)
    path, found, readable_max = make_newer(data_dir)
    before = checksum(data_dir)
    status, log = serve_once(data_dir)
    assert status == 1, log
    assert (
        f"{path}" in log
        and f"format {found} was written by a dmq newer than this one; this dmq "
        f"{dmq.__version__} reads formats up to {readable_max}: upgrade this broker to the "
        f"release that wrote it, or restore the data directory"
        in log
    ), log
    assert checksum(data_dir) == before


def test_this_releases_directory_starts(written_dir: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(written_dir, data_dir)
    status, log = serve_once(data_dir)
    assert status is None, log


def test_each_reader_says_newer_not_corrupt(written_dir: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(written_dir, data_dir)
    newer = "was written by a dmq newer than this one"
    meta, _, _ = raise_meta(data_dir)
    with pytest.raises(FormatTooNew, match=newer):
        meta_file.decode(meta.read_bytes())
    with pytest.raises(MetaFileCorrupt):  # an older or unknown version stays corrupt
        meta_file.decode(meta.read_bytes().replace(b"version=2\n", b"version=0\n"))
    path, _, _ = raise_journal(data_dir)
    before = path.read_bytes()
    with pytest.raises(journal.JournalTooNew, match=newer):
        journal.DurableJournal(path.parent)
    assert path.read_bytes() == before
    path, _, _ = raise_snapshot(data_dir)
    with pytest.raises(RaftError, match=newer):
        snapshot.read_snapshot(str(path))
    path, _, _ = raise_segment(data_dir)
    with pytest.raises(CorruptRecordError, match=newer):
        records.read_header(path.read_bytes(), 0)
    doc = {"version": 3, "partition": "t-0", "log_start_offset": 0, "log_end_offset": 0}
    with pytest.raises(ValueError, match=newer):
        PartitionSnapshot.decode(json.dumps(doc).encode())


def test_the_version_line_is_found_whatever_else_the_file_holds() -> None:
    assert meta_file.written_version(b'# x\nformat="y"\nversion=7\nother=1\n') == 7
    assert meta_file.written_version(b"version=x\n") is None

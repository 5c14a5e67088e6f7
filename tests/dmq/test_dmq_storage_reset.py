"""Proves that `dmq storage reset` (dmq/cli/storage.py) deletes the data directory's identity
last: every other entry (records, Raft journals, markers; also one whose name sorts after
`meta.properties`) is gone before it, and a reset interrupted halfway leaves
`meta.properties` in place, still naming its cluster, so the records left are never taken
for a new broker's (run the reset again to finish).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from dmq import meta_file
from dmq.cli import storage

META = meta_file.DataDirMeta("a" * 32, "n1")


def _data_dir(root: Path) -> Path:
    data_dir = root / "data"
    for name in ("partitions/ledger-0/00000000000000000000.log", "raft/groups/0/journal"):
        (data_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (data_dir / name).write_bytes(b"records")
    (data_dir / "meta").mkdir()
    (data_dir / "zz-notes").write_text("sorts after meta.properties\n")
    meta_file.write(data_dir, META)
    return data_dir


def _reset(data_dir: Path) -> int:
    return storage.cmd_storage_reset(argparse.Namespace(data_dir=str(data_dir), yes=True))


def test_reset_deletes_meta_properties_after_everything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = _data_dir(tmp_path)
    deleted: list[str] = []
    real_delete = storage._delete

    def recording(path: Path) -> None:
        deleted.append(path.name)
        real_delete(path)

    monkeypatch.setattr(storage, "_delete", recording)
    assert _reset(data_dir) == 0
    assert deleted[-1] == meta_file.META_FILE
    assert sorted(deleted[:-1]) == ["meta", "partitions", "raft", "zz-notes"]
    assert [p.name for p in data_dir.iterdir()] == [".lock"]


def test_an_interrupted_reset_leaves_the_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = _data_dir(tmp_path)
    real_rmtree = shutil.rmtree

    def failing(path: Path, *args: object, **kwargs: object) -> None:
        if Path(path).name == "raft":
            raise PermissionError(f"cannot delete {path}")
        real_rmtree(path)

    monkeypatch.setattr(storage.shutil, "rmtree", failing)
    with pytest.raises(PermissionError):
        _reset(data_dir)
    assert meta_file.read(data_dir) == META  # the records left still name their cluster
    assert (data_dir / "raft" / "groups" / "0" / "journal").exists()
    monkeypatch.setattr(storage.shutil, "rmtree", real_rmtree)
    assert _reset(data_dir) == 0  # run again: it finishes
    assert [p.name for p in data_dir.iterdir()] == [".lock"]

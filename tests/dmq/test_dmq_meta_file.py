"""Proves the data directory's identity file (dmq/meta_file.py):

- any identity written reads back equal, and the bytes are the documented text;
- any change of the bytes (a flipped bit anywhere, a torn tail, bytes appended) is refused
  with MetaFileCorrupt naming the file, never read as another identity;
- `check_start` refuses a directory of another node id, naming both ids and the remedy,
  and changes nothing in it; a directory without the file passes as fresh.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq import meta_file
from dmq.errors import DataDirMismatch, MetaFileCorrupt
from dmq.meta_file import DataDirMeta

ids = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=40,
)
metas = st.builds(DataDirMeta, cluster_id=ids, node_id=ids)


@settings(max_examples=150, deadline=None)
@given(meta=metas)
def test_an_identity_reads_back_equal(meta: DataDirMeta) -> None:
    assert meta_file.decode(meta_file.encode(meta)) == meta


def test_the_file_is_the_documented_text() -> None:
    text = meta_file.encode(DataDirMeta("6f1c", "n1")).decode()
    lines = text.splitlines()
    assert lines[1:5] == ['format="dmq-data-dir"', "version=1", 'cluster_id="6f1c"', 'node_id="n1"']
    assert lines[5].startswith("crc32c=") and len(lines) == 6


@settings(max_examples=250, deadline=None)
@given(meta=metas, data=st.data())
def test_any_damage_is_refused_never_read_as_another_identity(
    meta: DataDirMeta, data: st.DataObject
) -> None:
    good = meta_file.encode(meta)
    how = data.draw(st.sampled_from(["flip", "truncate", "append"]))
    if how == "flip":
        at = data.draw(st.integers(0, len(good) - 1))
        bit = data.draw(st.integers(0, 7))
        bad = good[:at] + bytes([good[at] ^ (1 << bit)]) + good[at + 1 :]
    elif how == "truncate":
        bad = good[: data.draw(st.integers(0, len(good) - 1))]
    else:
        bad = good + data.draw(st.binary(min_size=1, max_size=8))
    with pytest.raises(MetaFileCorrupt, match="meta.properties"):
        meta_file.decode(bad)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_another_brokers_directory_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    assert meta_file.check_start(tmp_path, "n1") is None  # fresh: no identity yet
    meta_file.write(tmp_path, DataDirMeta("c0ffee", "n1"))
    before = _files(tmp_path)
    assert meta_file.check_start(tmp_path, "n1") == DataDirMeta("c0ffee", "n1")
    with pytest.raises(DataDirMismatch) as refused:
        meta_file.check_start(tmp_path, "n2")
    message = refused.value.message
    assert "\n" not in message
    assert "broker n1 of cluster c0ffee" in message and "--node-id n2" in message
    assert "start it with --node-id n1" in message
    assert _files(tmp_path) == before
    (tmp_path / meta_file.META_FILE).write_bytes(b"format=whatever\n")
    with pytest.raises(MetaFileCorrupt):
        meta_file.check_start(tmp_path, "n1")

"""Proves that a data directory from before cluster ids (the fixture of
test_e2e_data_dir_compat.py, written by commit 145193a) gets one cluster id adopted, once:

- the broker's catalogue had no id: the broker proposes the per-broker id the old code
  kept in `meta/cluster_id`, and reports it (`GET /v1/cluster`);
- it writes `meta.properties` naming that id and its node id, and sets nothing aside
  (every partition directory is one its catalogue knows);
- started again, it reads the same id back and leaves the file byte for byte as it was.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from dmq import meta_file
from tests_support import BrokerProcess

FIXTURE = Path(__file__).parent / "data" / "datadir-145193a.tar.gz"
LEGACY_ID = "f9fcfccf5f2048e9a155df731df1d6cc"  # the fixture's meta/cluster_id


def test_an_old_data_dir_adopts_its_legacy_id_once(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with tarfile.open(FIXTURE) as archive:
        archive.extractall(data_dir, filter="data")
    assert meta_file.read(data_dir) is None
    assert meta_file.read_legacy_cluster_id(data_dir) == LEGACY_ID
    broker = BrokerProcess(data_dir).start()
    try:
        status, body = broker.json("GET", "/v1/cluster")
        assert status == 200 and body["cluster_id"] == LEGACY_ID, body
        assert meta_file.read(data_dir) == meta_file.DataDirMeta(LEGACY_ID, "n1")
        status, body = broker.json("GET", "/v1/storage/set-aside")
        assert status == 200 and body["set_aside"] == [], body
    finally:
        assert broker.stop() == 0
    written = (data_dir / meta_file.META_FILE).read_bytes()
    broker = BrokerProcess(data_dir).start()
    try:
        status, body = broker.json("GET", "/v1/cluster")
        assert status == 200 and body["cluster_id"] == LEGACY_ID, body
        assert (data_dir / meta_file.META_FILE).read_bytes() == written
    finally:
        assert broker.stop() == 0

"""Proves what the reconciler does at start-up with each directory it finds
(dmq/broker/reconcile.py `remove_orphans`, dmq/broker/strays.py), against a catalogue that
holds topics `orders` (id 3, placed here) and `moved` (id 4, placed elsewhere), and has
handed out ids below 6 (ids 1, 2 and 5 were deleted):

- a directory of a deleted topic (id below next_topic_id, no topic has it) is removed, as
  its Raft directory: the catalogue decided it;
- a directory of a topic id this cluster never handed out is set aside with its Raft
  directory, and one whose id the catalogue gives to a topic of another name is set aside
  alone (the group id's Raft directory is the catalogue topic's): renamed under
  `set-aside/` byte for byte, a manifest beside it, listed by `report()`;
- the placed replica's directory and the moved one's (kept until its leader's word) stay;
  a Raft directory of a newer id found alone is not judged;
- a replica about to open on a directory that holds another topic id's data sets it
  aside first, never opens it;
- a directory another cluster wrote (its `cluster_id` file) is set aside whatever its
  topic id says, at start-up and before a replica opens: every cluster numbers topics
  from 1, so cluster A's `orders` may carry the id of this cluster's `orders` (it would
  be opened), of `moved` (kept, then deleted) or of a deleted topic (deleted), with its
  Raft directory when no group of this cluster has that id; a directory without the file
  (from before it) is this broker's own and gets this cluster's id.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from dmq.broker.context import BrokerContext
from dmq.broker.reconcile import Reconciler
from dmq.broker.strays import StrayData
from dmq.config import BrokerConfig
from dmq.metadata.machine import MetadataState, PartitionInfo, TopicInfo
from dmq.partition.replica import CLUSTER_ID_FILE, GROUPS_PER_TOPIC, TOPIC_ID_FILE


def _topic(name: str, topic_id: int, replicas: tuple[str, ...]) -> TopicInfo:
    return TopicInfo(name, topic_id, 1, (), (PartitionInfo(replicas),), 0)


STATE = MetadataState(
    topics={"orders": _topic("orders", 3, ("n1",)), "moved": _topic("moved", 4, ("n2",))},
    next_topic_id=6,
)


OURS = "bbbbbbbb"  # this broker's cluster; "aaaaaaaa" is another one


def _partition(data_dir: Path, name: str, topic_id: int, cluster_id: str = "") -> Path:
    path = data_dir / "partitions" / name
    path.mkdir(parents=True)
    (path / TOPIC_ID_FILE).write_text(f"{topic_id}\n")
    if cluster_id:  # else written by a dmq from before the file
        (path / CLUSTER_ID_FILE).write_text(f"{cluster_id}\n")
    (path / "00000000000000000000.log").write_bytes(f"records of {name}".encode())
    group = data_dir / "raft" / "groups" / str(topic_id * GROUPS_PER_TOPIC)
    if not group.exists():
        group.mkdir(parents=True)
        (group / "journal").write_bytes(f"journal of {name}".encode())
    return path


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _reconciler(data_dir: Path) -> tuple[Reconciler, StrayData]:
    ctx = BrokerContext(BrokerConfig(node_id="n1", data_dir=str(data_dir)))
    ctx.metadata_service = SimpleNamespace(state=STATE)  # type: ignore[assignment]
    ctx.cluster_id = OURS  # IdentityService.adopt ran
    strays = StrayData(data_dir)
    return Reconciler(ctx, None, None, strays), strays  # type: ignore[arg-type]


def test_start_up_removes_what_the_catalogue_deleted_and_sets_aside_what_it_never_knew(
    tmp_path: Path,
) -> None:
    for name, topic_id in [("orders-0", 3), ("moved-0", 4), ("gone-0", 2)]:
        _partition(tmp_path, name, topic_id)
    foreign = {
        "ledger-0": _files(_partition(tmp_path, "ledger-0", 7)),  # never handed out here
        "other-0": _files(_partition(tmp_path, "other-0", 3)),  # id 3 is `orders` here
    }
    (tmp_path / "raft" / "groups" / str(9 * GROUPS_PER_TOPIC)).mkdir()  # alone: not judged
    reconciler, strays = _reconciler(tmp_path)

    reconciler.remove_orphans()

    assert sorted(p.name for p in (tmp_path / "partitions").iterdir()) == ["moved-0", "orders-0"]
    groups = sorted(int(p.name) for p in (tmp_path / "raft" / "groups").iterdir())
    assert groups == [g * GROUPS_PER_TOPIC for g in (3, 4, 9)]
    report = strays.report()["set_aside"]
    by_origin = {entry["original"]: entry for entry in report}
    assert sorted(by_origin) == ["partitions/ledger-0", "partitions/other-0", "raft/groups/7168"]
    assert by_origin["partitions/ledger-0"]["reason"] == (
        "topic id 7 was never created in this cluster"
    )
    assert by_origin["partitions/other-0"]["reason"] == "topic id 3 is 'orders' here, not 'other'"
    for name, files in foreign.items():
        assert _files(Path(by_origin[f"partitions/{name}"]["path"])) == files
    journal = tmp_path / "raft" / "groups" / "3072" / "journal"
    assert journal.read_bytes() == b"journal of orders-0"  # orders' own, kept


def test_a_replica_never_opens_a_directory_of_another_topic_id(tmp_path: Path) -> None:
    path = _partition(tmp_path, "orders-0", 1)  # a deleted `orders`, id 1; today's is 3
    files = _files(path)
    reconciler, strays = _reconciler(tmp_path)
    reconciler._set_aside_if_foreign(STATE.topics["orders"], 0)
    assert not path.exists()
    (entry,) = strays.report()["set_aside"]
    assert entry["reason"] == "holds topic id 1, the catalogue's orders is topic id 3"
    assert _files(Path(entry["path"])) == files


def test_a_directory_another_cluster_wrote_is_set_aside_whatever_its_topic_id(
    tmp_path: Path,
) -> None:
    ours = {name: _partition(tmp_path, name, i, OURS) for name, i in [("moved-0", 4)]}
    legacy = _partition(tmp_path, "orders-0", 3)  # ours, from before the cluster_id file
    foreign = {  # cluster A's topics, whose ids collide with this cluster's
        name: _files(_partition(tmp_path / "a", name, topic_id, "aaaaaaaa"))
        for name, topic_id in [("orders-1", 3), ("moved-1", 4), ("gone-0", 2), ("new-0", 7)]
    }
    ids_in_a = {"orders-1": 3, "moved-1": 4, "gone-0": 2, "new-0": 7}
    for name in foreign:  # copied in by hand
        (tmp_path / "a" / "partitions" / name).rename(tmp_path / "partitions" / name)
    for group in (2 * GROUPS_PER_TOPIC, 7 * GROUPS_PER_TOPIC):  # and two Raft directories
        (tmp_path / "a" / "raft" / "groups" / str(group)).rename(
            tmp_path / "raft" / "groups" / str(group)
        )
    reconciler, strays = _reconciler(tmp_path)

    reconciler.remove_orphans()

    remaining = sorted(p.name for p in (tmp_path / "partitions").iterdir())
    assert remaining == ["moved-0", "orders-0"]
    groups = sorted(int(p.name) for p in (tmp_path / "raft" / "groups").iterdir())
    assert groups == [3 * GROUPS_PER_TOPIC, 4 * GROUPS_PER_TOPIC]  # this cluster's own
    assert (legacy / CLUSTER_ID_FILE).read_text() == f"{OURS}\n"  # stamped as ours
    assert (ours["moved-0"] / CLUSTER_ID_FILE).read_text() == f"{OURS}\n"
    by_origin = {entry["original"]: entry for entry in strays.report()["set_aside"]}
    # Id 2 (a topic this cluster deleted) and id 7 (never handed out): no group of this
    # cluster has them, so their Raft directories are set aside with them, not deleted.
    raft_dirs = [f"raft/groups/{g * GROUPS_PER_TOPIC}" for g in (2, 7)]
    assert sorted(by_origin) == sorted([*(f"partitions/{n}" for n in foreign), *raft_dirs])
    for name, files in foreign.items():
        entry = by_origin[f"partitions/{name}"]
        assert entry["reason"] == f"written by cluster aaaaaaaa, this is cluster {OURS}"
        assert entry["topic_id"] == ids_in_a[name]
        assert _files(Path(entry["path"])) == files  # byte for byte, nothing deleted


def test_a_replica_never_opens_a_directory_another_cluster_wrote(tmp_path: Path) -> None:
    path = _partition(tmp_path, "orders-0", 3, "aaaaaaaa")  # A's orders: id 3 as ours
    files = _files(path)
    reconciler, strays = _reconciler(tmp_path)
    reconciler._set_aside_if_foreign(STATE.topics["orders"], 0)
    assert not path.exists()
    (entry,) = strays.report()["set_aside"]
    assert entry["reason"] == f"written by cluster aaaaaaaa, this is cluster {OURS}"
    assert _files(Path(entry["path"])) == files
    own = _partition(tmp_path, "orders-0", 3, OURS)
    reconciler._set_aside_if_foreign(STATE.topics["orders"], 0)
    assert own.exists()  # this cluster's: opened as the replica

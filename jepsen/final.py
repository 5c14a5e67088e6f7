"""The final phase: after the faults are healed, wait for every group to have a leader,
read every partition from the beginning until every acknowledged offset is covered, then
read each node's own replica (for the divergence check)."""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from jepsen.cluster import Cluster, HarnessError, http
from jepsen.history import History
from jepsen.workload import Client

T = TypeVar("T")

LEADERS_WAIT_S = 90.0
FINAL_READ_S = 60.0  # per partition
HW_STABLE_S = 10.0
OPERATIONS_WAIT_S = 90.0
CATCH_UP_WAIT_S = 30.0
# For every broker's catalogue to show the final metadata voters, and the final placement:
# a broker promoted to metadata voter just before the end may still be catching up group 0
# (CI, 4 test workers on 2 cores: one took more than 20 s), so the bound is generous; a
# broker that stays behind is reported with every broker's catalogue version.
VOTERS_WAIT_S = 60.0
PLACEMENT_WAIT_S = 60.0
REPLICA_PAGES_MAX = 100_000  # pages of fetch_bytes_max: far above any run's log


def wait_for_leaders(cluster: Cluster, timeout_s: float = LEADERS_WAIT_S) -> float:
    """Wait until every broker is ready and every group reports a live leader; seconds."""
    started = time.monotonic()
    cluster.wait_ready(list(cluster.brokers.values()), timeout_s)
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        status = cluster.status()
        if status is not None:
            live = {b.node_id for b in cluster.live()}
            groups = status.get("groups", [])
            if groups and all(g.get("leader") in live for g in groups):
                return time.monotonic() - started
        time.sleep(0.5)
    raise HarnessError(f"groups without a live leader {timeout_s} s after healing")


def wait_operations(cluster: Cluster, timeout_s: float = OPERATIONS_WAIT_S) -> float:
    """Wait until no reassignment, broker decommission nor metadata voter change is
    running (GET /v1/cluster/operations); seconds. One that does not finish on a healed
    cluster is a harness error (unknown)."""
    started = time.monotonic()
    left: Any = None
    while time.monotonic() < started + timeout_s:
        for broker in cluster.live():
            try:
                answer = http(broker.url + "/v1/cluster/operations", timeout_s=5.0)
            except OSError:
                continue
            if answer.status == 200:
                doc = answer.json()
                left = doc.get("reassignments", []) + doc.get("decommissions", [])
                voters = doc.get("metadata_voters") or {}
                if voters.get("target"):
                    left.append(voters)
                if not left:
                    return time.monotonic() - started
                break
        time.sleep(0.5)
    raise HarnessError(f"operations still running {timeout_s} s after healing: {left}")


def check_placement(
    cluster: Cluster, topic: str, replication_factor: int, timeout_s: float = PLACEMENT_WAIT_S
) -> None:
    """After joins and leaves: every partition keeps its replication factor on brokers
    that are still there, in every live broker's catalogue (one still catching up gets
    timeout_s). A replica left on a broker the harness retired means a leave ended
    before its decommission did (a harness bug) or a broker unregistered while it held
    replicas (a dmq bug): a harness error either way, so the run says unknown (the
    checkers read the data, not the placement)."""
    _until_right(
        lambda: (_misplaced(cluster, topic, replication_factor), None),
        timeout_s,
        lambda wrong: (
            f"after every operation ended: {wrong} (replication factor "
            f"{replication_factor}, brokers {sorted(cluster.brokers)}, catalogue versions "
            f"{catalogue_versions(cluster)})"
        ),
    )


def catalogue_versions(cluster: Cluster) -> dict[str, int | str]:
    """Each live broker's `metadata_version` (GET /v1/cluster), or why it gave none: which
    broker is behind, and by how much, when a final check fails."""
    versions: dict[str, int | str] = {}
    for broker in cluster.live():
        try:
            answer = http(broker.url + "/v1/cluster", timeout_s=5.0)
        except OSError as error:
            versions[broker.node_id] = repr(error)
            continue
        ok = answer.status == 200
        versions[broker.node_id] = answer.json()["metadata_version"] if ok else answer.status
    return versions


def _until_right(
    check: Callable[[], tuple[list[str], T]], timeout_s: float, failure: Callable[[list[str]], str]
) -> T:
    """check() every 0.5 s until it finds nothing wrong (then its value); HarnessError
    with failure(what is wrong) past timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        wrong, value = check()
        if not wrong:
            return value
        if time.monotonic() > deadline:
            raise HarnessError(failure(wrong))
        time.sleep(0.5)


def _misplaced(cluster: Cluster, topic: str, replication_factor: int) -> list[str]:
    """`<node>: <topic>-<p> on <replicas>` for each wrong placement a live broker shows."""
    wrong: list[str] = []
    current = set(cluster.brokers)
    for broker in cluster.live():
        try:
            answer = http(broker.url + f"/v1/topics/{topic}", timeout_s=5.0)
        except OSError as error:
            wrong.append(f"{broker.node_id}: {error!r}")
            continue
        if answer.status != 200:
            wrong.append(f"{broker.node_id}: {answer.status} {answer.error_code()}")
            continue
        for number, partition in enumerate(answer.json()["partitions"]):
            replicas = partition["replicas"]
            if len(replicas) < replication_factor or not set(replicas) <= current:
                wrong.append(f"{broker.node_id}: {topic}-{number} on {replicas}")
    return wrong


def check_voters(cluster: Cluster, timeout_s: float = VOTERS_WAIT_S) -> list[str]:
    """After voter changes ended: the catalogue's `metadata_voters` (GET /v1/cluster on
    the metadata leader) equals group 0's members as that leader's Raft node knows them
    (GET /v1/internal/status), and every broker still registered answers the catalogue
    with the same voters and brokers (an observer that is behind gets timeout_s); the
    voters. A mismatch past timeout_s is a harness error (the run says unknown): the
    checkers read the data, this is the operation's own end state."""
    return _until_right(
        lambda: _voters_mismatch(cluster),
        timeout_s,
        lambda wrong: (
            f"metadata voters after every change ended: {wrong} (catalogue versions "
            f"{catalogue_versions(cluster)})"
        ),
    )


def _voters_mismatch(cluster: Cluster) -> tuple[list[str], list[str]]:
    """What disagrees (empty: nothing), and the leader's catalogue voters."""
    leader = cluster.leader_of(None, None)
    if leader not in cluster.brokers:
        return [f"no metadata leader among the brokers ({leader})"], []
    url = cluster.brokers[leader].url
    try:
        catalogue = http(url + "/v1/cluster", timeout_s=5.0).json()
        local = http(url + "/v1/internal/status", timeout_s=5.0).json()
    except (OSError, ValueError) as error:
        return [f"{leader}: {error!r}"], []
    voters = sorted(catalogue["metadata_voters"])
    registered = sorted(b["node_id"] for b in catalogue["brokers"])
    members = [sorted(r["members"]) for r in local["replicas"] if r["group_id"] == 0]
    wrong = []
    if members != [voters]:
        wrong.append(f"leader {leader}: catalogue voters {voters}, group 0 members {members}")
    if not set(registered) <= set(cluster.brokers):
        wrong.append(f"registered {registered}, brokers running {sorted(cluster.brokers)}")
    for node_id in registered:
        broker = cluster.brokers.get(node_id)
        if broker is None:
            continue
        try:
            answer = http(broker.url + "/v1/cluster", timeout_s=5.0)
        except OSError as error:
            wrong.append(f"{node_id}: {error!r}")
            continue
        doc = answer.json() if answer.status == 200 else {}
        seen = (
            sorted(doc.get("metadata_voters", [])),
            sorted(b["node_id"] for b in doc.get("brokers", [])),
        )
        if seen != (voters, registered):
            wrong.append(f"{node_id}: {answer.status} voters and brokers {seen}")
    return wrong, voters


def acked_ends(history: History, partitions: int) -> dict[int, int]:
    """partition -> one past the highest acknowledged offset (0 if none)."""
    ends = dict.fromkeys(range(partitions), 0)
    for op in history.ops():
        if op.f == "send" and op.type == "ok" and op.value.get("offset") is not None:
            part = op.value["partition"]
            ends[part] = max(ends[part], op.value["offset"] + 1)
    return ends


def read_ends(history: History, partitions: int) -> dict[int, int]:
    """partition -> the furthest next_offset the final reads reached (0 if none)."""
    ends = dict.fromkeys(range(partitions), 0)
    for op in history.ops():
        if op.f == "final-poll" and op.type == "ok":
            part = op.value["partition"]
            ends[part] = max(ends[part], op.value["next_offset"])
    return ends


def final_reads(
    cluster: Cluster, history: History, topic: str, partitions: int, processes: itertools.count[int]
) -> None:
    """Read each partition from 0 until next_offset reaches both the high watermark and
    the highest acknowledged offset, or the high watermark stays put for HW_STABLE_S (the
    log ends below an ack: the checker reports it lost); rotate nodes on errors. A read
    refused as out of range while the log now starts past it (--tiered: a segment lost
    before its upload) goes on from that start: the acks skipped are lost, not unseen. At
    most FINAL_READ_S per partition (what stays unread is reported unseen)."""
    ends = acked_ends(history, partitions)
    for partition in range(partitions):
        client = Client(cluster, history, topic, partition)
        client.process = next(processes)
        client.assign(partition, 0)
        offset = 0
        deadline = time.monotonic() + FINAL_READ_S
        stable: tuple[int, float] = (-1, time.monotonic())  # (high watermark, since)
        while time.monotonic() < deadline:
            type_, result = client.read("final-poll", partition, offset, 0)
            start = result.get("log_start_offset") if type_ == "fail" else None
            if isinstance(start, int) and start > offset:
                # The log starts past this read now (a tiered segment lost, --tiered):
                # read on from its start; the acks skipped count as lost, not unseen.
                offset = start
                client.assign(partition, offset)
                continue
            if type_ != "ok":
                time.sleep(0.2)
                if type_ == "info":
                    client.process = next(processes)
                    client.assign(partition, offset)
                continue
            offset, hw = result["next_offset"], result["high_watermark"]
            if hw != stable[0]:
                stable = (hw, time.monotonic())
            if offset >= hw and (
                offset >= ends[partition] or time.monotonic() - stable[1] > HW_STABLE_S
            ):
                break
            if not result["records"]:
                time.sleep(0.2)  # the acknowledged end is not readable (yet)


def wait_caught_up(cluster: Cluster, timeout_s: float = CATCH_UP_WAIT_S) -> bool:
    """True once every group's replicas report lag 0 (else go on: divergence is checked
    on the common prefix)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = cluster.status()
        groups: list[dict[str, Any]] = (status or {}).get("groups", [])
        if groups and all(r.get("lag") == 0 for g in groups for r in g.get("replicas", [])):
            return True
        time.sleep(0.5)
    return False


def _replica_bytes(url: str, topic: str, partition: int, end_offset: int) -> tuple[bytes, int]:
    """This node's own committed batches of a partition from offset 0, none starting at or
    past end_offset (the internal catch-up read: never relayed); (bytes, next offset)."""
    data = bytearray()
    offset = 0
    for _ in range(REPLICA_PAGES_MAX):
        path = (
            f"/v1/internal/partitions/{topic}/{partition}/batches"
            f"?start_offset={offset}&end_offset={end_offset}"
        )
        answer = http(url + path, timeout_s=10.0)
        if answer.status != 200:
            raise HarnessError(f"{path}: {answer.status} {answer.body[:200]!r}")
        if not answer.body:
            break
        data += answer.body
        offset = int(answer.headers.get("X-Dmq-Next-Offset", offset))
    return bytes(data), offset


def replica_reads(
    cluster: Cluster, history: History, topic: str, partitions: int, processes: itertools.count[int]
) -> None:
    """Each node's own replica of each partition, compared on the bytes they all hold:
    first each replica's end, then a SHA-256 of [0, the smallest end) on each."""
    for partition in range(partitions):
        ends: dict[str, int] = {}
        for broker in cluster.live():
            try:
                ends[broker.node_id] = _replica_bytes(broker.url, topic, partition, 2**62)[1]
            except (OSError, HarnessError):
                continue  # no replica here (replication factor < nodes), or it is down
        if not ends:
            continue
        common = min(ends.values())
        for node_id in ends:
            process = next(processes)
            value = {"partition": partition, "end_offset": common}
            history.add(process, "invoke", "replica-read", node_id, value)
            try:
                data, _ = _replica_bytes(cluster.brokers[node_id].url, topic, partition, common)
            except (OSError, HarnessError) as error:
                history.add(
                    process, "fail", "replica-read", node_id, {**value, "error": repr(error)}
                )
                continue
            done = {
                **value,
                "log_end": ends[node_id],
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
            history.add(process, "ok", "replica-read", node_id, done)

"""`jepsen.run --tiered`: the log workload's topic on tiered storage (dmq/tiered/README.md).

Every broker gets `--remote-storage file://<run dir>/remote` (one store shared by the
cluster, as a deployment shares a bucket) and runs retention often; the run's topic has
`remote_storage_enable`, 4 KiB segments and a local retention of 0 bytes, so while the
faults run every closed segment is uploaded and deleted locally within a second or so. The final reads
from offset 0 then go through the object store, and the log checker judges them as any
other read: an acknowledged record the store and the local logs both lack is lost.

After the final reads the harness records (`tiered-status`, a nemesis info op) each
partition's remote end and local bytes as the brokers describe them, and each broker's
remote-read counters: proof that the reads did go through the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jepsen.cluster import Answer, Cluster, http

SEGMENT_BYTES = 4096  # ~50 of the workload's one-record batches
# Local retention 0: every closed segment goes once uploaded (the correct build) — or at
# once (tiered-delete-before-upload), well before the next upload round.
LOCAL_RETENTION_BYTES = 0
RETENTION_CHECK_INTERVAL_MS = 200  # local deletion, on every replica
UPLOAD_INTERVAL_MS = 1000  # the brokers' default: leaders look for closed segments
REMOTE_DIRECTORY = "remote"  # under the run's directory
METRICS = ("dmq_tiered_remote_reads_total", "dmq_tiered_uploaded_segments_total")


def broker_args(run_dir: Path) -> list[str]:
    """The `dmq serve` flags of every broker of a tiered run."""
    store = (run_dir / REMOTE_DIRECTORY).resolve()
    return [
        "--remote-storage", f"file://{store}",
        "--remote-upload-interval-ms", str(UPLOAD_INTERVAL_MS),
        "--retention-check-interval-ms", str(RETENTION_CHECK_INTERVAL_MS),
    ]  # fmt: skip


def topic_config() -> dict[str, Any]:
    """The run topic's config: tiered, tiny segments, a tiny local retention."""
    return {
        "segment_bytes": SEGMENT_BYTES,
        "remote_storage_enable": True,
        "local_retention_bytes": LOCAL_RETENTION_BYTES,
    }


def status(cluster: Cluster, topic: str) -> dict[str, Any]:
    """Each partition as the first broker that describes the topic sees it (with its tiered
    fields remote_end_offset, remote_bytes, local_bytes) and each live broker's tiered
    counters (METRICS)."""
    described = _answers(cluster, f"/v1/topics/{topic}")
    partitions = list(next(iter(described.values())).json()["partitions"]) if described else []
    counters = {
        node: _counters(answer.body.decode(errors="replace"))
        for node, answer in _answers(cluster, "/metrics").items()
    }
    return {"partitions": partitions, "brokers": counters}


def _answers(cluster: Cluster, path: str) -> dict[str, Answer]:
    """node id -> its 200 answer to GET path, for each live broker that gave one."""
    found: dict[str, Answer] = {}
    for broker in cluster.live():
        try:
            answer = http(broker.url + path, timeout_s=10.0)
        except OSError:
            continue
        if answer.status == 200:
            found[broker.node_id] = answer
    return found


def _counters(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in METRICS:
            found[name] = float(value)
    return found

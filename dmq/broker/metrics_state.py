"""The live-state collector of GET /metrics: every family read at scrape time.

Nothing here is counted on the request path (traffic.py's counters aside, which it only
reads). What each family means, its labels and who emits it are tabled in dmq/README.md,
"Metrics". The rules:

- partition families (offsets, bytes, Raft term and lag, produced and fetched) come from
  the replicas this broker hosts, at the label depth `metrics_partitions_max` allows
  (metrics_labels.py), the same for all of them in one scrape;
- consumer-group lag is emitted by the partition's leader (the one broker that knows the
  high watermark for sure), for partitions the group has committed an offset for;
- catalogue-wide counts (brokers, topics, groups, share groups, transactions) are emitted
  by the metadata group's leader only, so that `sum()` over brokers counts them once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from dmq.broker.context import BrokerContext
from dmq.broker.fetch import FetchService
from dmq.broker.metrics_labels import SUM, Combine, Fold, Key, gauge, series_depth
from dmq.broker.storage import StorageService
from dmq.broker.traffic import Traffic
from dmq.metadata.service import wall_ms
from dmq.partition.replica import PartitionReplica

# A follower that lacks committed entries and has not answered its leader for this long
# makes its partition under-replicated (Kafka's replica.lag.time.max.ms is 30 s; dmq's
# elections take ~1 s, so a follower silent for 10 s is down, not slow).
UNDER_REPLICATED_LAG_S = 10.0
PARTITION_LABELS = ("topic", "partition")
STORAGE_LEVELS = ("ok", "alert", "full")
TRANSACTION_STATES = (
    "empty", "ongoing", "prepare_commit", "prepare_abort", "complete_commit", "complete_abort",
)  # fmt: skip


class StateCollector:
    """A prometheus_client collector (it has `collect`) over one broker's live state."""

    def __init__(self, ctx: BrokerContext, fetch: FetchService, storage: StorageService) -> None:
        self._ctx = ctx
        self._fetch = fetch  # its count of parked long-polls
        self.storage_service = storage  # its report of the data directory's disk
        self.lag_s = UNDER_REPLICATED_LAG_S
        # Set by MetricsService.render before each scrape: group id -> followers out of
        # sync, for the groups led here (raft/node.py followers_out_of_sync).
        self.out_of_sync: dict[int, int] = {}
        self.storage_report: dict[str, Any] = {}  # likewise: StorageService.report()

    def collect(self) -> Iterator[Metric]:
        ctx = self._ctx
        replicas = [r for _, r in ctx.replicas.items()]
        metadata = ctx.metadata_service
        if metadata is not None:  # counters of deleted topics go (bounded memory)
            ctx.traffic.forget(set(metadata.state.topics))
        traffic = list(ctx.traffic.partitions.items())  # one C call: a copy
        replica_keys = [(r.topic, str(r.partition)) for r in replicas]
        traffic_keys = [(t, str(p)) for (t, p), _ in traffic]
        series_max = ctx.config.metrics_partitions_max
        depth = series_depth([*replica_keys, *traffic_keys], 2, series_max)
        info = GaugeMetricFamily(
            "dmq_broker_info", "This broker: always 1", labels=["node_id", "cluster_id"]
        )
        info.add_metric([ctx.node_id, ctx.cluster_id], 1)
        yield info
        yield gauge("dmq_metrics_partitions_max", "metrics_partitions_max", series_max)
        yield gauge(
            "dmq_metrics_partition_labels",
            "Labels the partition families carry now: 2 topic+partition, 1 topic, 0 none",
            depth,
        )
        yield from self._partitions(replicas, Fold(replica_keys, depth, PARTITION_LABELS))
        yield from self._traffic(
            [v for _, v in traffic], Fold(traffic_keys, depth, PARTITION_LABELS)
        )
        storage = self.storage_report
        yield from self._raft(len(storage.get("stalled_groups", [])))
        yield from self._group_lag(replicas, series_max)
        yield from self._storage(storage)
        yield from self._catalogue(series_max)

    # ------------------------------------------------------------------ partitions

    def _partitions(self, replicas: list[PartitionReplica], fold: Fold) -> Iterator[Metric]:
        for replica in replicas:
            replica.refresh_offsets()  # a follower's mirror may lag
        statuses = [r.raft.status() if r.raft is not None else None for r in replicas]
        leads = [s is not None and s.is_leader for s in statuses]

        def g(name: str, doc: str, values: Iterable[float], combine: Combine = SUM) -> Metric:
            return fold.family(GaugeMetricFamily, name, doc, values, combine)

        yield g("dmq_partition_log_start_offset", "First offset the log holds (summed above the partition depth)", [r.log_start_offset for r in replicas])  # fmt: skip
        yield g("dmq_partition_high_watermark", "First offset not yet committed", [r.high_watermark for r in replicas])  # fmt: skip
        yield g("dmq_partition_log_end_offset", "Next offset to assign", [r.log_end_offset for r in replicas])  # fmt: skip
        yield g("dmq_partition_last_stable_offset", "read_committed's end (open transactions)", [r.last_stable_offset for r in replicas])  # fmt: skip
        sizes = [r.log_size_bytes for r in replicas]
        yield g("dmq_partition_log_bytes", "Bytes of the replica's log segments", sizes)
        yield g("dmq_partition_leader", "1 where this broker leads the partition", map(int, leads))  # fmt: skip
        yield g(
            "dmq_raft_term",
            "The partition's Raft term as this replica knows it (the largest above depth)",
            [s.term if s is not None else 0 for s in statuses],
            max,
        )
        yield g(
            "dmq_raft_commit_apply_lag_entries",
            "Raft entries committed and not yet applied to the log (the largest above depth)",
            [max(0, s.commit_index - s.last_applied) if s is not None else 0 for s in statuses],
            max,
        )
        groups = {r.group_id for r in replicas}
        under = sum(1 for g_id, n in self.out_of_sync.items() if n and g_id in groups)
        leaderless = sum(1 for s in statuses if s is None or s.leader_id is None)
        yield gauge("dmq_partition_replicas", "Partition replicas hosted here", len(replicas))
        yield gauge("dmq_partitions_led", "Partitions led here", sum(leads))
        yield gauge(
            "dmq_partitions_under_replicated",
            f"Partitions led here with a follower down or behind for {UNDER_REPLICATED_LAG_S:g} s",
            under,
        )
        yield gauge("dmq_partitions_leaderless", "Replicas here that know no leader", leaderless)
        yield gauge("dmq_log_segment_bytes", "Bytes of every log segment here", sum(sizes))
        yield gauge("dmq_produce_requests_inflight", "Produce requests queued on the replicas here", sum(r.queue_depth for r in replicas))  # fmt: skip
        yield gauge("dmq_delay_pending_bytes", "Delayed records held here, bytes", sum(r.delay_pending_bytes for r in replicas))  # fmt: skip
        yield gauge("dmq_delay_partitions", "Replicas here whose delay store holds records (what the release duty looks at)", len(self._ctx.replicas.delay_pending))  # fmt: skip
        yield gauge("dmq_fetch_waiting", "Long-poll fetches parked now", self._fetch.waiting_fetches)  # fmt: skip
        yield gauge("dmq_fetch_waiting_max", "waiting_fetches_max", self._ctx.config.waiting_fetches_max)  # fmt: skip

    def _traffic(self, counted: list[Traffic], fold: Fold) -> Iterator[Metric]:
        def c(name: str, doc: str, values: Iterable[int]) -> Metric:
            return fold.family(CounterMetricFamily, name, doc, values)

        yield c("dmq_produced_records", "Records appended by this broker's replicas as leader (markers included)", [t.produced_records for t in counted])  # fmt: skip
        yield c("dmq_produced_bytes", "Stored batch bytes appended by this broker's replicas as leader", [t.produced_bytes for t in counted])  # fmt: skip
        yield c("dmq_fetched_records", "Records served by this broker (binary fetches: offsets covered)", [t.fetched_records for t in counted])  # fmt: skip
        yield c("dmq_fetched_bytes", "Bytes served: batch bytes (binary), key+value+header bytes (JSON)", [t.fetched_bytes for t in counted])  # fmt: skip

    # ------------------------------------------------------------------ raft

    def _raft(self, stalled_groups: int) -> Iterator[Metric]:
        node = self._ctx.raft_node
        if node is None:
            return
        groups = list(node.groups.values())  # one C call: safe against the tick thread
        yield gauge("dmq_raft_groups", "Raft groups on this broker (metadata included)", len(groups))  # fmt: skip
        yield gauge("dmq_raft_journal_bytes", "Bytes of every Raft journal here", sum(g.journal.size_bytes for g in groups))  # fmt: skip
        yield gauge("dmq_raft_journal_disk_bytes", "Bytes the Raft journal files take on disk: a recycled file's old records after its own, and the retired files compactions write into next, included", sum(g.journal.disk_bytes for g in groups))  # fmt: skip
        yield gauge("dmq_raft_groups_stalled", "Raft groups stalled by a failed write", stalled_groups)  # fmt: skip
        yield CounterMetricFamily(
            "dmq_raft_leader_changes",
            "Times a Raft group here saw a new leader (its first included)",
            value=node.leader_changes,
        )
        snap = node.sync_seconds.snapshot()
        cumulative, buckets = 0, []
        for bound, count in zip((*snap.bounds, float("inf")), snap.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        yield HistogramMetricFamily(
            "dmq_raft_journal_sync_seconds",
            "One Raft journal's sync (write + fdatasync) per group per round",
            buckets=buckets,
            sum_value=snap.sum_s,
        )
        metadata = self._ctx.metadata_service
        raft = metadata.open_replica if metadata is not None else None
        status = raft.status() if raft is not None else None
        if status is not None:
            yield gauge("dmq_metadata_raft_term", "The metadata group's term", status.term)
            yield gauge("dmq_metadata_leader", "1 where this broker leads the metadata group", int(status.is_leader))  # fmt: skip
            yield gauge("dmq_metadata_commit_apply_lag_entries", "Metadata entries committed, not applied here", max(0, status.commit_index - status.last_applied))  # fmt: skip
            yield gauge("dmq_metadata_version", "The catalogue's version applied here", metadata.state.metadata_version if metadata is not None else 0)  # fmt: skip

    # ------------------------------------------------------------------ groups

    def _group_lag(self, replicas: list[PartitionReplica], series_max: int) -> Iterator[Metric]:
        metadata = self._ctx.metadata_service
        if metadata is None:
            return
        led = {
            (r.topic, r.partition): r
            for r in replicas
            if r.raft is not None and r.raft.status().is_leader and not r.closed
        }
        keys: list[Key] = []
        lag: list[float] = []
        committed: list[float] = []
        for name, group in metadata.state.groups.groups.items():
            for (topic, partition), offset in group.committed.items():
                replica = led.get((topic, partition))
                if replica is None:
                    continue
                keys.append((name, topic, str(partition)))
                committed.append(offset)
                lag.append(max(0, replica.high_watermark - offset))
        labels = ("group", "topic", "partition")
        fold = Fold(keys, series_depth(keys, 3, series_max), labels)
        yield fold.family(GaugeMetricFamily, "dmq_consumer_group_lag_records", "High watermark - committed offset, by the partition's leader (summed above depth)", lag)  # fmt: skip
        yield fold.family(GaugeMetricFamily, "dmq_consumer_group_committed_offset", "The group's committed offset, by the partition's leader (the largest above depth)", committed, max)  # fmt: skip

    # ------------------------------------------------------------------ storage

    def _storage(self, report: dict[str, Any]) -> Iterator[Metric]:
        level = GaugeMetricFamily(
            "dmq_storage_level", "1 for the data directory's level now", labels=["level"]
        )
        for name in STORAGE_LEVELS:
            level.add_metric([name], int(report.get("level") == name))
        yield level
        # Names written whole, so that a grep (and tests/test_deploy_monitoring.py) finds them.
        for name, key, doc in (
            ("dmq_storage_free_bytes", "free_bytes", "Free bytes of the data directory's filesystem"),
            ("dmq_storage_total_bytes", "total_bytes", "Size of the data directory's filesystem"),
            ("dmq_storage_floor_bytes", "floor_bytes", "storage_min_free_bytes in force: produce is refused below it"),
            ("dmq_storage_alert_bytes", "alert_bytes", "storage_alert_free_bytes in force"),
        ):  # fmt: skip
            if isinstance(report.get(key), int):
                yield gauge(name, doc, report[key])
        for name, key, doc in (
            ("dmq_storage_refused_appends", "refused_appends", "Appends refused below the free-space floor"),
            ("dmq_storage_refused_bytes", "refused_bytes", "Bytes of appends refused below the floor"),
            ("dmq_storage_acks0_refused", "acks0_refused", "acks=0 appends a full disk refused after the answer"),
            ("dmq_storage_leadership_handoffs", "leadership_handoffs", "Leaderships handed away while the disk was full"),
        ):  # fmt: skip
            if isinstance(report.get(key), int):
                yield CounterMetricFamily(name, doc, value=report[key])

    # ------------------------------------------------------------------ catalogue

    def _catalogue(self, series_max: int) -> Iterator[Metric]:
        """Cluster-wide counts, from the metadata leader only (module docstring)."""
        metadata = self._ctx.metadata_service
        raft = metadata.open_replica if metadata is not None else None
        if metadata is None or raft is None or not raft.status().is_leader:
            return
        state = metadata.state
        live = set(state.live_brokers(max(state.clock_ms, wall_ms())))
        yield gauge("dmq_cluster_brokers", "Brokers registered", len(state.brokers))
        yield gauge("dmq_cluster_brokers_live", "Brokers with a recent heartbeat", len(live))
        yield gauge("dmq_cluster_topics", "Topics", len(state.topics))
        yield gauge("dmq_cluster_partitions", "Partitions of every topic", sum(len(t.partitions) for t in state.topics.values()))  # fmt: skip
        groups = state.groups.groups
        yield gauge("dmq_consumer_groups", "Consumer groups", len(groups))
        yield gauge("dmq_consumer_group_members", "Members of every consumer group", sum(len(g.members) for g in groups.values()))  # fmt: skip
        share = state.share_groups.groups
        yield gauge("dmq_share_groups", "Share groups", len(share))
        names = [(name,) for name in share]
        fold = Fold(names, series_depth(names, 1, series_max), ("group",))
        members = [len(g.members) for g in share.values()]
        in_flight = [sum(len(p.records) for p in g.partitions.values()) for g in share.values()]
        yield fold.family(GaugeMetricFamily, "dmq_share_group_members", "Members of a share group", members)  # fmt: skip
        yield fold.family(GaugeMetricFamily, "dmq_share_group_records_in_flight", "Records a share group holds acquired or waiting for redelivery", in_flight)  # fmt: skip
        states = Counter(t.state for t in state.transactions.values())
        txns = GaugeMetricFamily("dmq_transactions", "Transactional ids by the state of their transaction", labels=["state"])  # fmt: skip
        for name in (*TRANSACTION_STATES, *sorted(set(states) - set(TRANSACTION_STATES))):
            txns.add_metric([name], states.get(name, 0))
        yield txns
        yield gauge("dmq_transactions_open", "Transactions ongoing or deciding", sum(1 for t in state.transactions.values() if t.is_open))  # fmt: skip

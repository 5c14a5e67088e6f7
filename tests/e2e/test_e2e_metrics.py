"""GET /metrics on one real broker process, parsed by prometheus_client's own parser.

Proves that after a produce, a JSON fetch, a binary fetch and a consumer-group commit:
- the produce and fetch counters moved by exactly the records and bytes sent and read
  (produced bytes = the log's segment bytes; binary fetched bytes = produced bytes);
- the offset gauges and the group's lag and committed offset equal what the API says
  (GET .../offsets, GET /v1/groups/{group});
- request latency is labelled by route template and status class (a 404 on a topic is
  counted under `/v1/topics/{topic}`, a path no route matches under `unmatched`), never
  by raw path;
- the broker's health gauges (leader, no under-replicated or leaderless partition, Raft
  term, journal syncs observed, storage, process metrics, catalogue counts) are there.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests_support import BrokerProcess

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(broker: BrokerProcess) -> Samples:
    status, headers, body = broker.request("GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    out: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    found = [v for got, v in samples.get(name, []) if got == labels]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def call(broker: BrokerProcess, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
    status, doc = broker.json(method, path, body)
    assert status == expect, (method, path, status, doc)
    return doc


def test_metrics_follow_produce_fetch_and_group_commits(broker: BrokerProcess) -> None:
    before = scrape(broker)
    assert "dmq_produced_records_total" not in before  # no partition yet
    call(broker, "POST", "/v1/topics", {"name": "m", "partitions": 2}, expect=201)
    values0 = ["a", "bb", "ccc", "dddd", "eeeee"]
    call(broker, "POST", "/v1/topics/m/records?partition=0",
         {"records": [{"value": v} for v in values0]})  # fmt: skip
    call(broker, "POST", "/v1/topics/m/records?partition=1",
         {"records": [{"value": v, "key": "k"} for v in ("x", "y", "z")]})  # fmt: skip
    fetched = call(broker, "GET", "/v1/topics/m/partitions/0/records?offset=0")
    assert [r["value"] for r in fetched["records"]] == values0
    status, _, raw = broker.request("GET", "/v1/topics/m/partitions/1/records?offset=0&format=binary")  # fmt: skip
    assert status == 200
    call(broker, "POST", "/v1/groups/g/offsets",
         {"offsets": [{"topic": "m", "partition": 0, "offset": 2}]})  # fmt: skip
    call(broker, "GET", "/v1/topics/nope", expect=404)
    call(broker, "GET", "/no/such/path", expect=404)

    after = scrape(broker)
    p0, p1 = {"topic": "m", "partition": "0"}, {"topic": "m", "partition": "1"}
    # Counters: exactly what was sent and read.
    assert value(after, "dmq_produced_records_total", **p0) == 5
    assert value(after, "dmq_produced_records_total", **p1) == 3
    assert value(after, "dmq_produced_bytes_total", **p0) == value(after, "dmq_partition_log_bytes", **p0)  # fmt: skip
    produced_p1 = value(after, "dmq_produced_bytes_total", **p1)
    assert produced_p1 == value(after, "dmq_partition_log_bytes", **p1) == len(raw)
    assert value(after, "dmq_fetched_records_total", **p0) == 5
    assert value(after, "dmq_fetched_bytes_total", **p0) == sum(map(len, values0))
    assert value(after, "dmq_fetched_records_total", **p1) == 3
    assert value(after, "dmq_fetched_bytes_total", **p1) == len(raw)
    # Gauges: what the API says.
    for p, labels in ((0, p0), (1, p1)):
        api = call(broker, "GET", f"/v1/topics/m/partitions/{p}/offsets")
        assert value(after, "dmq_partition_high_watermark", **labels) == api["high_watermark"]
        assert value(after, "dmq_partition_log_start_offset", **labels) == api["log_start_offset"]  # fmt: skip
        assert value(after, "dmq_partition_log_end_offset", **labels) == api["high_watermark"]
        assert value(after, "dmq_partition_leader", **labels) == 1
        assert value(after, "dmq_raft_term", **labels) >= 1
    group = call(broker, "GET", "/v1/groups/g")
    (row,) = [r for r in group["partitions"] if r["partition"] == 0]
    g0 = {"group": "g", **p0}
    assert value(after, "dmq_consumer_group_lag_records", **g0) == row["lag"] == 3
    assert value(after, "dmq_consumer_group_committed_offset", **g0) == row["committed_offset"]
    # Latency by route template and status class, never by raw path.
    produce_route = {"method": "POST", "route": "/v1/topics/{topic}/records", "status_class": "2xx"}  # fmt: skip
    assert value(after, "dmq_http_request_duration_seconds_count", **produce_route) == 2
    topic_404 = {"method": "GET", "route": "/v1/topics/{topic}", "status_class": "4xx"}
    assert value(after, "dmq_http_request_duration_seconds_count", **topic_404) == 1
    unmatched = {"method": "GET", "route": "unmatched", "status_class": "4xx"}
    assert value(after, "dmq_http_request_duration_seconds_count", **unmatched) == 1
    routes = {labels["route"] for labels, _ in after["dmq_http_request_duration_seconds_count"]}
    assert not any("nope" in r or "/no/" in r for r in routes), routes
    # Health.
    assert value(after, "dmq_partitions_under_replicated") == 0
    assert value(after, "dmq_partitions_leaderless") == 0
    assert value(after, "dmq_partition_replicas") == value(after, "dmq_partitions_led") == 2
    assert value(after, "dmq_metadata_leader") == 1
    assert value(after, "dmq_cluster_topics") == 1 and value(after, "dmq_consumer_groups") == 1
    assert value(after, "dmq_raft_journal_sync_seconds_count") > 0
    assert value(after, "dmq_raft_leader_changes_total") >= 3  # metadata + 2 partitions
    assert value(after, "dmq_raft_journal_bytes") > 0
    assert value(after, "dmq_storage_free_bytes") > 0
    assert value(after, "dmq_storage_level", level="ok") == 1
    assert value(after, "dmq_fetch_waiting") == 0
    assert value(after, "process_resident_memory_bytes") > 0

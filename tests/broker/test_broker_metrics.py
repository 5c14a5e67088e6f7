"""Proves GET /metrics' building blocks without a process (dmq/broker/metrics*.py):

- `series_depth` keeps {topic, partition} while the partitions fit metrics_partitions_max,
  {topic} while the topics do, and no label past that; a `Fold` sums (or takes the
  largest) onto the kept labels, keeping the total and never more series than the bound;
- traffic.py counts a produced batch's records (from its header) and stored bytes, and a
  JSON fetch's records and key, value and header bytes; a deleted topic's counters go;
- metrics_text.py writes exactly `generate_latest`'s bytes for any gauge, counter and
  histogram families (any label values, quotes and newlines included, any values), and
  refuses a kind it does not know;
- a Broker that has not started renders a scrape that prometheus_client's own parser
  reads: its registry is its own (two brokers in one process do not mix), the process
  metrics are there, and with more partitions than metrics_partitions_max the counters
  carry {topic} only, summed, under the same names.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.parser import text_string_to_metric_families

from dmq.broker import Broker, FetchResult
from dmq.broker.metrics_labels import SUM, Fold, series_depth
from dmq.broker.metrics_text import render_text
from dmq.broker.traffic import TrafficCounters
from dmq.config import BrokerConfig
from log.records import Header, Record, encode_batch


def test_series_depth_drops_labels_until_the_series_fit() -> None:
    few = [("a", "0"), ("a", "1"), ("b", "0")]
    assert series_depth(few, 2, 3) == 2
    assert series_depth(few, 2, 2) == 1  # 3 partitions > 2, 2 topics fit
    assert series_depth(few, 2, 1) == 0  # even the topics do not fit: one series
    many = [("t", str(p)) for p in range(10_000)]
    assert series_depth(many, 2, 1_000) == 1


def test_fold_sums_or_takes_the_largest_onto_the_kept_labels() -> None:
    keys = [("a", "0"), ("a", "1"), ("b", "0")]
    values = [5.0, 7.0, 1.0]
    labels = ("topic", "partition")
    assert dict(Fold(keys, 2, labels).values(values)) == dict(zip(keys, values, strict=True))
    assert dict(Fold(keys, 1, labels).values(values)) == {("a",): 12.0, ("b",): 1.0}
    assert dict(Fold(keys, 1, labels).values(values, max)) == {("a",): 7.0, ("b",): 1.0}
    assert dict(Fold(keys, 0, labels).values(values, SUM)) == {(): 13.0}
    assert Fold(keys, 1, labels).labels == ["topic"]


@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.tuples(st.sampled_from("abc"), st.sampled_from("0123")), st.integers(0, 100)
    ),
    st.integers(1, 12),
)
def test_a_fold_keeps_the_total_and_the_series_bound(
    rows: dict[tuple[str, str], int], series_max: int
) -> None:
    depth = series_depth(rows, 2, series_max)
    series = dict(Fold(list(rows), depth, ("topic", "partition")).values(rows.values()))
    assert sum(series.values()) == sum(rows.values())
    assert len(series) <= series_max
    assert depth == 2 or len(rows) > series_max


def test_traffic_counts_records_and_bytes_once() -> None:
    traffic = TrafficCounters()
    batch = encode_batch([Record(b"k", b"v1"), Record(None, b"v22"), Record(None, None)])
    traffic.produced("t", 0, batch)
    records = [Record(b"k", b"v1", (Header("h", b"xy"),)), Record(None, b"v22")]
    traffic.fetched(FetchResult("t", 0, 0, 2, 3, 0, records=records))
    traffic.fetched(FetchResult("t", 1, 5, 5, 5, 0))  # nothing served: no entry
    counted = traffic.partitions[("t", 0)]
    assert (counted.produced_records, counted.produced_bytes) == (3, len(batch))
    assert (counted.fetched_records, counted.fetched_bytes) == (2, 1 + 2 + 1 + 2 + 3)
    assert ("t", 1) not in traffic.partitions
    traffic.forget({"other"})
    assert traffic.partitions == {}


def _scrape(broker: Broker) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = asyncio.run(broker.metrics.render()).decode()
    return {
        f.name: [(s.labels, s.value) for s in f.samples if s.name in (f.name, f.name + "_total")]
        for f in text_string_to_metric_families(text)
    }


def test_a_scrape_parses_and_folds_partitions_into_topics_past_the_limit(
    tmp_path: Path,
) -> None:
    broker = Broker(BrokerConfig(data_dir=str(tmp_path / "a"), metrics_partitions_max=2))
    other = Broker(BrokerConfig(data_dir=str(tmp_path / "b")))
    batch = encode_batch([Record(None, b"x")] * 4)
    traffic = broker._ctx.traffic  # the service's own counters, as produce.py bumps them
    for topic, partition in (("a", 0), ("a", 1), ("b", 0)):
        traffic.produced(topic, partition, batch)
    families = _scrape(broker)
    assert "process_cpu_seconds" in families and "process_resident_memory_bytes" in families
    assert families["dmq_metrics_partition_labels"] == [({}, 1.0)]
    produced = sorted(families["dmq_produced_records"], key=lambda s: s[0]["topic"])
    assert produced == [({"topic": "a"}, 8.0), ({"topic": "b"}, 4.0)]
    assert families["dmq_partition_replicas"] == [({}, 0.0)]
    # The other broker's registry saw none of it.
    assert _scrape(other)["dmq_produced_records"] == []


_values = st.one_of(
    st.integers(-(10**18), 10**18),
    st.floats(allow_nan=True, allow_infinity=True),
)
_label_values = st.text(max_size=8)  # any text: quotes, backslashes, newlines


@st.composite
def _families(draw: st.DrawFn) -> list[Metric]:
    families: list[Metric] = []
    for index in range(draw(st.integers(0, 6))):
        name = f"dmq_family_{index}"
        doc = draw(st.text(max_size=20))
        kind = draw(st.sampled_from(["gauge", "counter", "histogram", "plain"]))
        if kind == "plain":
            families.append(GaugeMetricFamily(name, doc, value=draw(_values)))
            continue
        if kind == "histogram":
            counts = draw(st.lists(st.integers(0, 10**9), min_size=1, max_size=4))
            bounds = [*map(str, sorted(set(range(len(counts) - 1)))), "+Inf"]
            buckets = list(zip(bounds, counts, strict=True))
            families.append(HistogramMetricFamily(name, doc, buckets=buckets, sum_value=1.5))
            continue
        labels = draw(st.lists(st.sampled_from(["topic", "partition", "group"]), min_size=1, max_size=3, unique=True))  # fmt: skip
        family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, doc, labels=labels)  # fmt: skip
        for _ in range(draw(st.integers(0, 4))):
            family.add_metric([draw(_label_values) for _ in labels], draw(_values))
        families.append(family)
    return families


class _Yields:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


@settings(max_examples=200, deadline=None)
@given(_families())
def test_the_state_writer_writes_generate_latests_bytes(families: list[Metric]) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Yields(families))  # type: ignore[arg-type]
    assert render_text(families).encode() == generate_latest(registry)


def test_the_state_writer_refuses_a_kind_it_does_not_write() -> None:
    with pytest.raises(ValueError, match="info"):
        render_text([InfoMetricFamily("dmq_x", "x", value={"a": "b"})])

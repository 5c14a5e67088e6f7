"""Proves the shape of dmq/broker/ (dmq/README.md, "dmq/broker/") and the produce answer:

- no module of dmq/broker/ imports broker.py (the Broker) but the package's __init__:
  services get a BrokerContext and the services they call, never the Broker, so no import
  circle can run through the Broker again (imports under TYPE_CHECKING count too);
- a Broker that has not started exposes one service per module, each built without it;
  requests on them answer 503 (BrokerUnavailable), not an AttributeError;
- `_offset_runs` gives one offset per record in request order: records spread over
  partitions come back in the order they were sent, consecutive offsets of one partition
  as one run, and acks without offsets (None) as runs of None.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dmq import errors
from dmq.broker import Broker
from dmq.broker.cluster import ClusterService
from dmq.broker.fetch import FetchService
from dmq.broker.produce import ProduceService, _offset_runs
from dmq.broker.topics import TopicsService
from dmq.config import BrokerConfig
from log.records import Record

BROKER_DIR = Path(__file__).resolve().parents[2] / "dmq" / "broker"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            base = node.module if node.level == 0 else f"dmq.broker.{node.module}"
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def test_no_service_imports_the_broker() -> None:
    offenders = sorted(
        path.name
        for path in BROKER_DIR.glob("*.py")
        if path.name not in ("__init__.py", "broker.py")
        and "dmq.broker.broker" in _imported_modules(path)
    )
    assert offenders == [], f"services must not import dmq.broker.broker: {offenders}"


def test_a_broker_not_started_composes_its_services_and_refuses_politely(
    tmp_path: Path,
) -> None:
    broker = Broker(BrokerConfig(data_dir=str(tmp_path)))
    assert isinstance(broker.topics, TopicsService)
    assert isinstance(broker.produce, ProduceService)
    assert isinstance(broker.fetch, FetchService)
    assert isinstance(broker.cluster, ClusterService)
    assert not broker.ready
    with pytest.raises(errors.BrokerUnavailable):
        broker.topics.list_topics()
    with pytest.raises(errors.BrokerUnavailable):
        broker.cluster.cluster()
    assert broker.routing.partition_count("t") is None


@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=40),
    st.booleans(),
)
def test_offset_runs_answer_one_offset_per_record_in_request_order(
    partitions: list[int], with_offsets: bool
) -> None:
    by_partition: dict[int, list[tuple[int, Record]]] = {}
    for i, p in enumerate(partitions):
        by_partition.setdefault(p, []).append((i, Record(None, b"v", (), 0)))
    base = {p: (100 * p if with_offsets else None) for p in by_partition}
    runs = _offset_runs(len(partitions), by_partition, base)
    flat = [
        (run.partition, None if run.base_offset is None else run.base_offset + k)
        for run in runs
        for k in range(run.count)
    ]
    seen: dict[int, int] = {}
    expected = []
    for p in partitions:
        j = seen.get(p, 0)
        seen[p] = j + 1
        expected.append((p, 100 * p + j if with_offsets else None))
    assert flat == expected
    for a, b in zip(runs, runs[1:], strict=False):
        contiguous = a.partition == b.partition and (
            a.base_offset is None
            if b.base_offset is None
            else a.base_offset is not None and a.base_offset + a.count == b.base_offset
        )
        assert not contiguous, "adjacent runs that could be one"

"""The monitoring files agree with the broker (deploy/, docker-compose.yml; issue #21).

Proves that:
- deploy/prometheus/prometheus.yml scrapes /metrics on every compose node's HTTP port;
- docker-compose.yml runs prometheus and grafana with those files mounted;
- every dmq_* family the Grafana dashboard queries is one the broker emits (its name, less
  a histogram's or counter's suffix, is written in dmq/broker/metrics*.py), so a renamed
  metric cannot leave a panel silently empty; the dashboard is JSON with unique panel ids.

Read with plain text parsing: PyYAML is not a dependency (as tests/test_dockerfile.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from test_dockerfile import NODE_NAMES, compose_services

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dmq.json"
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def test_prometheus_scrapes_every_node() -> None:
    text = PROMETHEUS.read_text()
    assert "metrics_path: /metrics" in text
    for node in NODE_NAMES:
        assert f'"{node}:8080"' in text, node


def test_compose_runs_prometheus_and_grafana_with_the_files() -> None:
    services = compose_services((ROOT / "docker-compose.yml").read_text())
    prometheus = "\n".join(services["prometheus"])
    grafana = "\n".join(services["grafana"])
    assert "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml" in prometheus
    assert "./deploy/grafana/dmq.json:" in grafana
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning" in grafana


def test_dashboard_queries_only_families_the_broker_emits() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    source = "".join(p.read_text() for p in (ROOT / "dmq" / "broker").glob("metrics*.py"))
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bdmq_[a-z_]+", target["expr"])
    }
    assert queried, "the dashboard queries no dmq metric"
    missing = []
    for name in sorted(queried):
        base = next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)
        if f'"{base}"' not in source and f'"{name}"' not in source:
            missing.append(name)
    assert missing == [], f"the dashboard queries families the broker does not emit: {missing}"

"""The `dmq_cluster` fixture: builds DmqCluster objects (cluster_harness.py) for a test and,
whatever happens, kills every process they started; when the test failed it first prints
the tail of every node's log (pytest shows it under "Captured stdout teardown")."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import DmqCluster


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def dmq_cluster(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., DmqCluster]]:
    """dmq_cluster(n=3, extra_args=[...], env={...}, metadata_voters=[...], secret=b"...")
    -> DmqCluster (not started)."""
    clusters: list[DmqCluster] = []

    def make(n: int = 3, **kwargs: Any) -> DmqCluster:
        cluster = DmqCluster(tmp_path / f"c{len(clusters)}", n, **kwargs)
        clusters.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            try:
                if request.node.stash.get(_FAILED, True):
                    print(cluster.log_tails())
            finally:
                cluster.close()

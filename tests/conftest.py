"""Shared fixtures: real `dmq serve` processes on loopback, cleaned up even on failure.

`broker_factory` starts brokers as subprocesses (`python -m dmq serve`), each with its
own data directory under tmp_path and a free port, waits for /readyz, and on
teardown stops every process it started (SIGTERM, then SIGKILL after a grace period).
`broker` is one default broker. The process class lives in tests_support.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests_support import BrokerProcess


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[BrokerProcess] = []

    def make(name: str = "broker", **kwargs: Any) -> BrokerProcess:
        proc = BrokerProcess(tmp_path / name, **kwargs)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.stop()


@pytest.fixture
def broker(broker_factory: Any) -> BrokerProcess:
    return broker_factory().start()  # type: ignore[no-any-return]

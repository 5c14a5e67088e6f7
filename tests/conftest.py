"""Shared fixtures: real `dmq serve` processes on loopback, cleaned up even on failure.

`broker_factory` starts brokers as subprocesses (`python -m dmq serve`), each with its
own data directory under tmp_path and a free port, waits for /readyz, and on
teardown stops every process it started (SIGTERM, then SIGKILL after a grace period).
`broker` is one default broker. The process class lives in tests_support.py.

Hypothesis runs without its per-example deadline (200 ms by default): a deadline is a
timing assertion, and timing belongs in the benchmarks (bench/). Under `make test`'s
parallel workers on 2 shared cores, a trivial example once took 25 s (the worker was
descheduled) and failed as DeadlineExceeded, then spent 5 minutes shrinking. A test that
hangs is still stopped by pytest-timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests_support import BrokerProcess

settings.register_profile("dmq", deadline=None)
settings.load_profile("dmq")


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

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

The longest files run first (`durations.json`, seconds per file from a full run: refresh it
with `python tests/durations.py LOG` after a run with `--durations=0`). `make test` hands
whole files to 2 workers in collection order, so a long file collected last (jepsen/,
spark_io/) used to run alone at the end while the other worker idled. Within a file the
order stays as written; the order of files changes nothing else.

Bytecode is compiled once, before the first test (`pytest_configure`): the suite starts
a Python process for every broker, CLI call and harness run, and where
PYTHONDONTWRITEBYTECODE is set (it is on this project's machines) none of them would
write the .pyc it compiled, so each compiled dmq's ~160 modules from source again:
0.8 s of CPU per process, 1.8 s against 1.0 s for `import dmq.server`, and on
tests/cluster/test_cluster_faults.py 43 s of CPU against 33 s. The variable only stops
writing; a .pyc that is there is read.
"""

from __future__ import annotations

import compileall
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests_support import ROOT, BrokerProcess

settings.register_profile("dmq", deadline=None)
settings.load_profile("dmq")

DURATIONS = Path(__file__).with_name("durations.json")


SOURCES = ("dmq", "raft", "log", "groups", "http_api", "spark_io", "bench", "jepsen", "tests")


def pytest_configure(config: pytest.Config) -> None:
    """Compile every source module to __pycache__ once, in the controller (xdist's workers
    start after it); see the module's docstring."""
    if hasattr(config, "workerinput"):
        return
    for name in SOURCES:
        compileall.compile_dir(ROOT / name, quiet=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first (longest-processing-time-first over the workers); files that
    `durations.json` does not know keep their place after the known ones."""
    try:
        seconds = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], index)

    def key(item: pytest.Item) -> tuple[float, int]:
        path = item.nodeid.split("::")[0]
        return (-float(seconds.get(path, 0.0)), first[path])

    items.sort(key=key)


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

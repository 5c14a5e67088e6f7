"""Releases as a client and a broker see them, on a real `dmq serve` process:
- `dmq --version` prints the release of dmq/__init__.py, the one place it is written;
- every answer names the broker's release (X-Dmq-Version) and GET /v1/cluster lists it;
- a call asking for an internal API level this release does not speak is refused with 400
  naming the caller's release and level, and logged at WARNING, before its handler runs.
(Other brokers' releases in GET /v1/cluster, old and new side by side, are proven by
tests/cluster/test_cluster_rolling_upgrade.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import dmq
from dmq import compat
from tests_support import ROOT, BrokerProcess


def test_dmq_version_prints_the_one_version() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "dmq", "--version"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert out.stdout.strip() == f"dmq {dmq.__version__}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'attr = "dmq.__version__"' in pyproject


def test_answers_and_cluster_name_the_release(broker: BrokerProcess) -> None:
    status, headers, raw = broker.request("GET", "/v1/cluster")
    assert status == 200
    assert headers[compat.VERSION_HEADER] == dmq.__version__
    (me,) = [b for b in json.loads(raw)["brokers"] if b["node_id"] == json.loads(raw)["node_id"]]
    assert me["version"] == dmq.__version__
    status, headers, _ = broker.request("GET", "/v1/topics/nope")  # an error answer too
    assert status == 404 and headers[compat.VERSION_HEADER] == dmq.__version__


def test_a_newer_internal_level_is_refused_naming_the_caller(broker: BrokerProcess) -> None:
    req_headers = {compat.VERSION_HEADER: "9.9.9", compat.INTERNAL_LEVEL_HEADER: "7"}
    req = urllib.request.Request(broker.url + "/v1/internal/status", headers=req_headers)
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("a level-7 call was served")
    except urllib.error.HTTPError as err:
        assert err.code == 400
        message = json.loads(err.read())["error"]["message"]
    assert "dmq 9.9.9" in message and "level 7" in message
    assert f"this dmq {dmq.__version__} speaks levels 1 to {compat.INTERNAL_LEVEL_MAX}" in message
    assert "WARNING" in broker.log() and "internal API level 7" in broker.log()
    # The level this release speaks is served.
    ok = urllib.request.Request(broker.url + "/v1/internal/status", headers=compat.CALL_HEADERS)
    with urllib.request.urlopen(ok, timeout=10) as resp:
        assert resp.status == 200

"""`dmq group list|describe|reset|delete` and `dmq consume --group` against a real broker process,
run as the real `dmq` command. Proves that a group consume prints every record once and
commits (a second run prints nothing new), that list and describe show the group with its
committed offsets and zero lag, that reset is refused (exit 1, group_not_empty) while a
member exists and otherwise rewinds the group so the next consume prints everything again;
and that delete is refused while a member exists and then removes the group.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests_support import BrokerProcess


def dmq(broker: BrokerProcess, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dmq", "--url", broker.url, *argv],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_group_consume_commit_describe_and_reset(broker: BrokerProcess) -> None:
    assert broker.json("POST", "/v1/topics", {"name": "t", "partitions": 3})[0] == 201
    records = [{"value": f"v{i}", "partition": i % 3} for i in range(30)]
    assert broker.json("POST", "/v1/topics/t/records", {"records": records})[0] == 200
    first = dmq(broker, "consume", "t", "--group", "cli")
    assert first.returncode == 0, first.stderr
    assert sorted(first.stdout.split()) == sorted(f"v{i}" for i in range(30))
    again = dmq(broker, "consume", "t", "--group", "cli")
    assert again.returncode == 0 and again.stdout == "", again
    listing = dmq(broker, "group", "list")
    assert listing.returncode == 0 and "cli" in listing.stdout and "empty" in listing.stdout
    described = json.loads(dmq(broker, "group", "describe", "cli", "--json").stdout)
    assert [(p["committed_offset"], p["lag"]) for p in described["partitions"]] == [(10, 0)] * 3
    status, member = broker.json("POST", "/v1/groups/cli/members", {"topics": ["t"]})
    assert status == 201
    refused = dmq(broker, "group", "reset", "cli", "--to", "earliest", "--topic", "t")
    assert refused.returncode == 1 and "group_not_empty" in refused.stderr
    assert broker.json("DELETE", f"/v1/groups/cli/members/{member['member_id']}")[0] == 204
    reset = dmq(broker, "group", "reset", "cli", "--to", "earliest", "--topic", "t")
    assert reset.returncode == 0, reset.stderr
    third = dmq(broker, "consume", "t", "--group", "cli", "--max-records", "30")
    assert sorted(third.stdout.split()) == sorted(f"v{i}" for i in range(30))
    status, member = broker.json("POST", "/v1/groups/cli/members", {"topics": ["t"]})
    assert status == 201
    refused = dmq(broker, "group", "delete", "cli")
    assert refused.returncode == 1 and "group_not_empty" in refused.stderr
    assert broker.json("DELETE", f"/v1/groups/cli/members/{member['member_id']}")[0] == 204
    deleted = dmq(broker, "group", "delete", "cli")
    assert deleted.returncode == 0, deleted.stderr
    assert "cli" not in dmq(broker, "group", "list").stdout
    assert broker.json("GET", "/v1/groups/cli")[0] == 404

"""Proves `dmq user`, `dmq acl` and `dmq quota` and the clients' token against a real
`dmq serve --auth on`: the superuser (--token) adds a user and an ACL; the user's token,
given as --token or DMQ_TOKEN, reaches the broker through every client the CLI builds
(producing to its topic works, listing users is forbidden: exit 1 naming `forbidden`);
a quota set through the CLI shows in `dmq user list --json`; without a token, 401.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests_support import ROOT, BrokerProcess

SUPERUSER = "cli-superuser-token-0123456789"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir: Path = tmp_path_factory.mktemp("cli-auth") / "data"
    process = BrokerProcess(
        data_dir, extra_args=["--auth", "on"], env={"DMQ_SUPERUSER_TOKEN": SUPERUSER}
    ).start()
    try:
        yield process
    finally:
        process.stop()


def dmq(
    broker: BrokerProcess, *argv: str, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DMQ_TOKEN", "DMQ_URL")}
    if token is not None:
        env["DMQ_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "dmq", "--url", broker.url, *argv],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_users_acls_quotas_through_the_cli(broker: BrokerProcess) -> None:
    added = dmq(broker, "--token", SUPERUSER, "user", "add", "carol")
    assert added.returncode == 0, added.stderr
    token = added.stdout.split()[1]
    assert token.startswith("carol:")
    acl = ["acl", "add", "--principal", "User:carol", "--resource-type", "topic",
           "--resource-name", "c-", "--pattern", "prefixed", "--operation", "all"]  # fmt: skip
    assert dmq(broker, "--token", SUPERUSER, *acl).returncode == 0
    create = dmq(broker, "topic", "create", "c-1", token=token)  # DMQ_TOKEN
    assert create.returncode == 0, create.stderr
    produce = subprocess.run(
        [sys.executable, "-m", "dmq", "--url", broker.url, "--token", token, "produce", "c-1"],
        input="hello\n", cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert produce.returncode == 0, produce.stderr
    refused = dmq(broker, "user", "list", token=token)
    assert refused.returncode == 1 and "forbidden" in refused.stderr
    anonymous = dmq(broker, "topic", "list")
    assert anonymous.returncode == 1 and "unauthenticated" in anonymous.stderr
    quota = dmq(broker, "quota", "set", "User:carol", "--requests-per-s", "100", token=SUPERUSER)
    assert quota.returncode == 0, quota.stderr
    listed = dmq(broker, "user", "list", "--json", token=SUPERUSER)
    (carol,) = json.loads(listed.stdout)["users"]
    assert carol["quota"]["requests_per_s"] == 100
    acls = dmq(broker, "acl", "list", "--json", token=SUPERUSER)
    assert [a["resource_name"] for a in json.loads(acls.stdout)["acls"]] == ["c-"]
    whoami = dmq(broker, "user", "whoami", "--output", "json", token=token)
    assert json.loads(whoami.stdout)["principal"] == "User:carol"
    table = dmq(broker, "user", "whoami", token=token).stdout.splitlines()
    assert table[0].split() == ["FIELD", "VALUE"] and ["principal", "User:carol"] in [
        line.split() for line in table
    ], table

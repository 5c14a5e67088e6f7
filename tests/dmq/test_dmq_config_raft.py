"""The Raft journal's size bound (`raft_snapshot_bytes`, `--raft-snapshot-bytes`): below
1 MiB it is refused at start with an InvalidConfig naming the field and the limit; the
value reaches the Raft groups as RaftConfig.log_compaction_bytes."""

from __future__ import annotations

import pytest

from dmq import limits
from dmq.broker.broker import raft_config_for
from dmq.config import BrokerConfig
from dmq.errors import InvalidConfig


def test_a_journal_bound_under_1_mib_is_refused_naming_the_field_and_the_limit() -> None:
    with pytest.raises(InvalidConfig) as caught:
        BrokerConfig(raft_snapshot_bytes=limits.MiB - 1)
    assert caught.value.details["field"] == "raft_snapshot_bytes"
    assert caught.value.details["limit"] == limits.MiB


def test_the_journal_bound_reaches_the_raft_groups() -> None:
    assert (
        raft_config_for(BrokerConfig(raft_snapshot_bytes=limits.MiB)).log_compaction_bytes
        == limits.MiB
    )
    assert raft_config_for(BrokerConfig()).log_compaction_bytes == 256 * limits.MiB

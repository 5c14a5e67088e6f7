"""Writes wire_golden.jsonl and wire_golden_snapshot.json: the golden wire forms of the
metadata catalogue, read by tests/metadata/test_metadata_wire_golden.py.

The files were written by this script at commit ff65165, before the catalogue was split
into domains, so they pin the JSON that journals and snapshots of that code hold. Do not
regenerate them to make a test pass: a difference means old journals or snapshots would
read differently. Rerunning it with today's code must leave both files unchanged
(`git diff --exit-code tests/metadata/data`), which is itself a check.

One scenario touches every command type, accepted and refused, with time moving forwards
and backwards. Each line of the .jsonl holds one encoded command, the repr of its result
and the sha256 of the snapshot after it; the .json holds the final snapshot.

Run from the repository root: `python tests/metadata/data/make_wire_golden.py`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dmq.metadata.machine import (
    AddPartitions,
    AlterMetadataVoters,
    AlterPartitionReplicas,
    AlterTopicConfig,
    BrokerHeartbeat,
    ChangeMetadataVoters,
    CreateTopic,
    DecommissionBroker,
    DecommissionPartition,
    DeleteTopic,
    ExpireTransactionalIds,
    InitProducer,
    MetadataMachine,
    ReassignPartition,
    RegisterBroker,
    RemovePartition,
    ReportLeader,
    UnregisterBroker,
    config_items,
    encode_command,
)
from groups.commands import (
    AckGeneration,
    CommitOffsets,
    DeleteGroup,
    ExpireGroups,
    ExpireMembers,
    JoinGroup,
    LeaveGroup,
    ResetOffsets,
    UpdateTopics,
)

HERE = Path(__file__).parent
COMMANDS_FILE = HERE / "wire_golden.jsonl"
SNAPSHOT_FILE = HERE / "wire_golden_snapshot.json"


def scenario() -> list[Any]:
    """Every command type at least once; refusals included (their results are pinned too)."""
    brokers = [RegisterBroker(b, f"{b}:8080", f"{b}:9090", 1_000) for b in ("n1", "n2", "n3")]
    return [
        *brokers,
        RegisterBroker("n4", "n4:8080", "n4:9090", 1_100),
        RegisterBroker("", "x", "y", 1_100),  # refused: empty id
        AlterMetadataVoters(("n1", "n2", "n3"), 1_200),  # the bootstrap record
        BrokerHeartbeat("n1", 900),  # a lagging clock: time stays
        BrokerHeartbeat("nope", 1_300),  # refused: unknown broker
        CreateTopic("orders", 3, 2, config_items({"retention_ms": 60_000}), 1_400),
        CreateTopic("clicks", 2, 3, config_items({"cleanup_policy": "compact"}), 1_450),
        CreateTopic("orders", 1, 1, (), 1_460),  # refused: exists
        CreateTopic("bad name", 1, 1, (), 1_470),  # refused: name
        AlterTopicConfig("orders", config_items({"segment_bytes": 1_048_576}), (), 1_500),
        AlterTopicConfig("orders", (), ("retention_ms",), 1_510),
        AddPartitions("orders", 5, 1_600),
        AddPartitions("orders", 2, 1_610),  # refused: shrinks
        ReportLeader("orders", 1, 0, "n1", 3, 1_700),
        ReportLeader("orders", 1, 0, "n1", 2, 1_710),  # refused: stale
        InitProducer("", 1_800),
        InitProducer("tx-a", 1_810),
        InitProducer("tx-a", 1_820),  # fences: epoch 1
        InitProducer("tx-b", 1_830),
        JoinGroup("g", "m1", "", ("orders", "clicks"), "", 10_000, "sticky", 1_900),
        JoinGroup("g", "m2", "static-2", (), "ord.*", 10_000, "sticky", 1_910),
        AckGeneration("g", "m1", 2, 1_920),
        CommitOffsets("g", "m1", 2, (("clicks", 0, 7),), 1_930),
        CommitOffsets("g", "nobody", 2, (("orders", 0, 1),), 1_940),  # refused
        JoinGroup("h", "h1", "", ("clicks",), "", 10_000, "range", 1_950),
        LeaveGroup("h", "h1", 1_960),
        ResetOffsets("h", (("clicks", 1, 3),), 1_970),
        ResetOffsets("e", (("clicks", 0, 1),), 1_975),  # a group without members
        JoinGroup("k", "k1", "", ("orders",), "", 10_000, "sticky", 1_980),
        ExpireMembers("k", ("k1", "gone"), 1_990),  # empty, no offsets: k goes
        DeleteGroup("k", 1_995),  # refused: no such group
        DeleteGroup("h", 2_000),
        UpdateTopics((("orders", 9),), 2_010),  # refused: internal
        ReassignPartition("orders", 1, 0, ("n3", "n4"), 2_100),
        AlterPartitionReplicas(
            "orders", 1, 0, ("n1", "n2", "n3", "n4"), 2_105
        ),  # refused: 2 at once
        AlterPartitionReplicas("orders", 1, 0, ("n1", "n2", "n3"), 2_110),  # adds n3
        DecommissionPartition("orders", 1, 4, 2_200),
        DecommissionPartition("orders", 1, 3, 2_210),
        RemovePartition("orders", 1, 4, 2_220),
        RemovePartition("orders", 1, 2, 2_230),  # refused: not decommissioned
        ChangeMetadataVoters(("n1", "n2", "n4"), 2_300),
        AlterMetadataVoters(("n1", "n2", "n3", "n4"), 2_310),
        ChangeMetadataVoters(("n1", "n4"), 2_320),  # refused: another change runs
        DecommissionBroker("n3", 2_400),  # clicks needs 3 brokers: n1, n2, n4 stay
        CreateTopic("solo", 1, 1, (), 2_500),
        DeleteTopic("clicks", 2_510),
        DeleteTopic("clicks", 2_520),  # refused: gone
        DecommissionBroker("n3", 2_600),  # already so
        UnregisterBroker("n3", 2_610),  # refused: still holds replicas
        RegisterBroker("n5", "n5:8080", "n5:9090", 2_700),
        DecommissionBroker("n5", 2_710),
        UnregisterBroker("n5", 2_720),
        ExpireTransactionalIds(1_000, 2_800),  # nothing unused since 1,800: both stay
        InitProducer("tx-b", 2_805),
        ExpireTransactionalIds(985, 2_810),  # forgets tx-a (last used at 1,820)
        ExpireTransactionalIds(-1, 2_820),  # refused
        ExpireGroups(100, 2_900),  # forgets e
        BrokerHeartbeat("n2", 3_000),
    ]


def lines(commands: list[Any]) -> tuple[list[str], bytes]:
    machine = MetadataMachine()
    out = []
    for command in commands:
        data = encode_command(command)
        result = machine.apply(data)
        digest = hashlib.sha256(machine.snapshot()).hexdigest()
        doc = {"command": data.decode(), "result": repr(result), "snapshot_sha256": digest}
        out.append(json.dumps(doc, sort_keys=True))
    return out, machine.snapshot()


def main() -> None:
    out, snapshot = lines(scenario())
    COMMANDS_FILE.write_text("\n".join(out) + "\n")
    SNAPSHOT_FILE.write_bytes(snapshot + b"\n")


if __name__ == "__main__":
    main()

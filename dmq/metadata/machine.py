"""The metadata state machine of a cluster, as the rest of dmq uses it: the machine shell
(dmq/metadata/shell.py) bound to the catalogue's registered domains
(dmq/metadata/catalogue.py), and every public name of the domains in one place.

Pure and deterministic (shared/STYLE.md, rule 4): `apply(state, command)` reads no clock,
randomness, environment or network. Time comes in the command (`now_ms`, stamped by the
leader that proposes it); the state keeps `clock_ms`, the largest `now_ms` applied so far, so
a new leader whose clock lags cannot move time backwards. A user error never raises: apply
returns `Rejected(code, message, field)` and the state it was given, so every replica reaches
the same state whatever the command. `MetadataMachine` wraps it as a raft `StateMachine`.

What each domain owns and the invariants it keeps are in its module and in
dmq/metadata/README.md; this module adds no behaviour. Code inside dmq/metadata/ does not
import it (it would close a circle through the domains); code outside imports from here.
"""

from __future__ import annotations

from typing import Any

from dmq.metadata import shell
from dmq.metadata.brokers import BrokerHeartbeat, RegisterBroker, ReportStorage
from dmq.metadata.catalogue import CATALOGUE, CatalogueCommand, Command
from dmq.metadata.codec import CommandDecodeError
from dmq.metadata.features import REJECT_FEATURE_LEVEL_LOWER, FinalizeFeatureLevel
from dmq.metadata.identity import REJECT_CLUSTER_FORMED, FormCluster, is_cluster_id
from dmq.metadata.producers import (
    PRODUCER_EPOCH_MAX,
    ExpireTransactionalIds,
    InitProducer,
    InitProducerFenceable,
)
from dmq.metadata.reassignment import (
    REJECT_BROKER_IN_USE,
    REJECT_LAST_PARTITION,
    REJECT_PARTITION_DECOMMISSIONED,
    REJECT_PARTITION_GONE,
    AlterPartitionReplicas,
    DecommissionBroker,
    DecommissionPartition,
    ReassignPartition,
    RemovePartition,
    UnregisterBroker,
)
from dmq.metadata.security import (
    REJECT_UNKNOWN_ACL,
    REJECT_UNKNOWN_USER,
    AddAcl,
    DeleteUser,
    PutUser,
    RemoveAcl,
    SetQuota,
)
from dmq.metadata.shell import SNAPSHOT_FORMAT, SNAPSHOT_VERSION
from dmq.metadata.state import (
    COMMAND_VERSION,
    COMMAND_VERSIONS_SUPPORTED,
    PARTITION_ACTIVE,
    PARTITION_DECOMMISSIONED,
    PARTITION_GONE,
    REJECT_INVALID_ARGUMENT,
    REJECT_INVALID_COMMAND,
    REJECT_INVALID_REPLICAS,
    REJECT_NOT_ENOUGH_BROKERS,
    REJECT_UNKNOWN_BROKER,
    REJECT_UNKNOWN_PARTITION,
    REJECT_UNKNOWN_TOPIC,
    TOPIC_NAME_CHARS_MAX,
    Applied,
    BrokerInfo,
    ConfigItems,
    ConfigValue,
    MetadataConfig,
    MetadataState,
    PartitionInfo,
    Rejected,
    Result,
    TopicInfo,
    Transaction,
    bump,
    config_items,
    topic_of,
    with_partition,
)
from dmq.metadata.topics import (
    REJECT_INVALID_CONFIG,
    REJECT_INVALID_PARTITIONS,
    REJECT_INVALID_REPLICATION_FACTOR,
    REJECT_INVALID_TOPIC_NAME,
    REJECT_STALE_LEADER,
    REJECT_TOO_MANY_TOPICS,
    REJECT_TOPIC_EXISTS,
    AddPartitions,
    AlterTopicConfig,
    CreateTopic,
    DeleteTopic,
    ReportLeader,
)
from dmq.metadata.transactions import (
    REJECT_CONCURRENT_TRANSACTIONS,
    REJECT_INVALID_TXN_STATE,
    REJECT_PRODUCER_FENCED,
    REJECT_UNKNOWN_TRANSACTIONAL_ID,
    TXN_STATES,
    AbortTxn,
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    CompleteTxn,
    EndTxn,
    EndTxnBumpEpoch,
    ExpireTransactions,
    add_status,
    open_transactions,
    successor,
    transactional_ids_to_expire,
    transactions_to_abort,
    transactions_to_finish,
)
from dmq.metadata.voters import (
    METADATA_VOTERS_MAX,
    REJECT_VOTERS_CHANGE_RUNNING,
    REJECT_VOTERS_UNKNOWN,
    AlterMetadataVoters,
    ChangeMetadataVoters,
)

__all__ = [
    "COMMAND_VERSION",
    "COMMAND_VERSIONS_SUPPORTED",
    "METADATA_VOTERS_MAX",
    "PARTITION_ACTIVE",
    "PARTITION_DECOMMISSIONED",
    "PARTITION_GONE",
    "PRODUCER_EPOCH_MAX",
    "REJECT_BROKER_IN_USE",
    "REJECT_CLUSTER_FORMED",
    "REJECT_FEATURE_LEVEL_LOWER",
    "REJECT_CONCURRENT_TRANSACTIONS",
    "REJECT_INVALID_ARGUMENT",
    "REJECT_INVALID_COMMAND",
    "REJECT_INVALID_CONFIG",
    "REJECT_INVALID_PARTITIONS",
    "REJECT_INVALID_REPLICAS",
    "REJECT_INVALID_REPLICATION_FACTOR",
    "REJECT_INVALID_TOPIC_NAME",
    "REJECT_INVALID_TXN_STATE",
    "REJECT_LAST_PARTITION",
    "REJECT_NOT_ENOUGH_BROKERS",
    "REJECT_PARTITION_DECOMMISSIONED",
    "REJECT_PARTITION_GONE",
    "REJECT_PRODUCER_FENCED",
    "REJECT_STALE_LEADER",
    "REJECT_TOO_MANY_TOPICS",
    "REJECT_UNKNOWN_ACL",
    "REJECT_TOPIC_EXISTS",
    "REJECT_UNKNOWN_BROKER",
    "REJECT_UNKNOWN_PARTITION",
    "REJECT_UNKNOWN_TOPIC",
    "REJECT_UNKNOWN_TRANSACTIONAL_ID",
    "REJECT_UNKNOWN_USER",
    "REJECT_VOTERS_CHANGE_RUNNING",
    "REJECT_VOTERS_UNKNOWN",
    "SNAPSHOT_FORMAT",
    "SNAPSHOT_VERSION",
    "TOPIC_NAME_CHARS_MAX",
    "TXN_STATES",
    "AbortTxn",
    "AddAcl",
    "AddOffsetsToTxn",
    "AddPartitions",
    "AddPartitionsToTxn",
    "AlterMetadataVoters",
    "AlterPartitionReplicas",
    "AlterTopicConfig",
    "Applied",
    "BrokerHeartbeat",
    "BrokerInfo",
    "CatalogueCommand",
    "ChangeMetadataVoters",
    "Command",
    "CommandDecodeError",
    "CompleteTxn",
    "ConfigItems",
    "ConfigValue",
    "CreateTopic",
    "DecommissionBroker",
    "DecommissionPartition",
    "DeleteTopic",
    "DeleteUser",
    "EndTxn",
    "EndTxnBumpEpoch",
    "ExpireTransactionalIds",
    "ExpireTransactions",
    "FinalizeFeatureLevel",
    "FormCluster",
    "InitProducer",
    "InitProducerFenceable",
    "MetadataConfig",
    "MetadataMachine",
    "MetadataState",
    "PartitionInfo",
    "PutUser",
    "ReassignPartition",
    "RegisterBroker",
    "RemoveAcl",
    "ReportStorage",
    "Rejected",
    "RemovePartition",
    "ReportLeader",
    "Result",
    "SetQuota",
    "TopicInfo",
    "Transaction",
    "UnregisterBroker",
    "add_status",
    "apply",
    "bump",
    "config_items",
    "decode_command",
    "encode_command",
    "is_cluster_id",
    "open_transactions",
    "state_from_json",
    "state_to_json",
    "successor",
    "topic_of",
    "transactional_ids_to_expire",
    "transactions_to_abort",
    "transactions_to_finish",
    "with_partition",
]


def apply(state: MetadataState, command: Command) -> tuple[MetadataState, Result]:
    """The state after `command` and its result. Never raises for a bad command."""
    return shell.apply(CATALOGUE, state, command)


def encode_command(command: Command) -> bytes:
    """`{"type": ..., "version": ..., "fields": {...}}` as compact, key-sorted JSON."""
    return shell.encode_command(CATALOGUE, command)


def decode_command(data: bytes) -> Command:
    """The command in `data`; raises CommandDecodeError naming what is wrong."""
    command: Command = shell.decode_command(CATALOGUE, data)
    return command


def state_to_json(state: MetadataState) -> dict[str, Any]:
    """The catalogue observers follow (no consumer groups, no producer ids)."""
    return shell.state_to_json(CATALOGUE, state)


def state_from_json(doc: dict[str, Any]) -> MetadataState:
    """Inverse of state_to_json; raises ValueError on a snapshot of another format."""
    return shell.state_from_json(CATALOGUE, doc)


class MetadataMachine(shell.Machine):
    """The metadata group's raft StateMachine: bytes in, `Applied | Rejected` out."""

    def __init__(self, config: MetadataConfig | None = None) -> None:
        super().__init__(CATALOGUE, config)

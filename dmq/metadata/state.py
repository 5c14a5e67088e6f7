"""The metadata catalogue's shared types: its state, the results of apply, and the helpers
every domain uses to change the state the same way.

Every domain module (dmq/metadata/README.md, "Domains") imports this one and none imports
another domain's internals in a circle; this module imports no domain. `MetadataState`
is one flat frozen value because brokers, the HTTP API and the operations driver read its
fields directly (`state.topics`, `state.voters`, ...); each field belongs to one domain,
named next to it, which alone writes it and gives it its JSON form.

Invariants of the state, whatever commands arrive (tests/metadata):

- `metadata_version` never decreases and grows by one on every change a client of the
  catalogue can see (topics, placement, leader hints, broker addresses, voters): `bump`
  is the only way to move it. Heartbeats, producer ids and consumer groups move
  `clock_ms` but never `metadata_version`, so they do not wake observers' long-polls;
- `clock_ms` is the largest `now_ms` applied so far: a new leader whose clock lags cannot
  move time backwards;
- topic ids are never reused (`next_topic_id` only grows), nor producer ids;
- each partition's replicas are distinct registered brokers, the first is the preferred
  leader; a gone partition has none and keeps its number.

Readers on other threads may read a `MetadataState` at any time: it is an immutable value
and the dicts inside it are never mutated after it is built (apply copies what it
changes), so treat them as read-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

from immutables import Map

from groups import state as groups_state
from groups.share import ShareGroupsState
from groups.state import GroupsState

# Versions of the command encoding this code can decode. A replica that meets a newer one
# rejects the command; a rolling upgrade must therefore enable a new version only once every
# replica decodes it, or replicas would diverge.
COMMAND_VERSION: Final = 1
COMMAND_VERSIONS_SUPPORTED: Final = frozenset({1})

# Kafka's topic name rule; it also bounds transactional ids. Equal to dmq/limits.py's but
# kept here: a replicated rule must change only with a new command version, never because a
# broker-side limit was tuned.
TOPIC_NAME_CHARS_MAX: Final = 249

ConfigValue = int | str
ConfigItems = tuple[tuple[str, ConfigValue], ...]  # sorted by key, keys distinct


def config_items(config: Mapping[str, Any]) -> ConfigItems:
    """A config mapping as the sorted pairs commands and topics hold. Values are not checked
    here: apply rejects anything but ints and strings."""
    return sorted_config(config)


def sorted_config(items: Any) -> ConfigItems:
    """Pairs (or a mapping) sorted by key: the one order commands, topics and JSON use."""
    pairs = items.items() if isinstance(items, Mapping) else items
    return tuple(sorted(((k, v) for k, v in pairs), key=lambda kv: str(kv[0])))


def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON's true would pass isinstance(value, int))."""
    return isinstance(value, int) and not isinstance(value, bool)


# --- State ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetadataConfig:
    """Limits of the metadata group; part of the state, so every replica uses the same."""

    # A broker without a heartbeat for longer is not live: it gets no new replicas.
    broker_session_ms: int = 10_000
    # Mirror dmq/limits.py: bound the catalogue's size (its snapshot is one JSON document).
    topics_max: int = 10_000
    partitions_per_topic_max: int = 1_000
    # Transactional ids remembered (each maps to a producer id and epoch).
    transactional_ids_max: int = 100_000


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: str
    http_addr: str
    raft_addr: str
    registered_ms: int
    last_heartbeat_ms: int
    # Set by the reassignment domain: takes no new replicas; its replicas are moved away.
    decommissioning: bool = False
    # From its last heartbeat (log/space.py): free bytes of its data directory (-1: not
    # reported) and "ok", "alert" or "full" ("": not reported). Not in repr, so the
    # results of older journals read the same.
    free_bytes: int = field(default=-1, repr=False)
    storage_level: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    replicas: tuple[str, ...]  # distinct; replicas[0] is the preferred leader
    leader: str | None = None  # the last reported leader (a hint), one of `replicas`
    leader_term: int = 0  # the Raft term of that report; 0 = none yet
    # The reassignment domain's fields. An ongoing reassignment: the replica set wanted
    # (leader first), None when there is none. Invariant: replicas and target differ;
    # replicas only ever gain a target broker or, once they hold every target broker, lose
    # a non-target one.
    target: tuple[str, ...] | None = None
    reassign_started_ms: int = 0
    # PARTITION_ACTIVE, then PARTITION_DECOMMISSIONED (no new records, still readable),
    # then PARTITION_GONE (no replicas; the number stays taken). Never goes back.
    status: str = "active"


PARTITION_ACTIVE: Final = "active"
PARTITION_DECOMMISSIONED: Final = "decommissioned"
PARTITION_GONE: Final = "gone"


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: int
    replication_factor: int
    config: ConfigItems
    partitions: tuple[PartitionInfo, ...]
    created_ms: int


@dataclass(frozen=True, slots=True)
class Transaction:
    """The transactions domain's record of one transactional id's current (or last)
    transaction; its states and rules are in dmq/metadata/transactions.py."""

    producer_id: int
    producer_epoch: int
    state: str  # empty, ongoing, prepare_commit, prepare_abort, complete_commit/abort
    # "topic:partition", sorted, distinct: every partition that may hold its batches.
    partitions: tuple[str, ...] = ()
    # "group:topic:partition:offset", sorted: offsets committed with the transaction.
    offsets: tuple[str, ...] = ()
    started_ms: int = 0  # when it became ongoing
    updated_ms: int = 0  # the last change of state
    timeout_ms: int = 60_000
    marker_epoch: int = 0  # the epoch its markers carry (producer_epoch, +1 if fenced)
    fenced: bool = False  # aborted by the coordinator: producer_epoch may do nothing more
    # Partitions the same producer's next transaction added while this one is prepare_*
    # (its commit answered once the decision was durable); CompleteTxn opens that next
    # transaction with them, so its first batches wait for no further round. Empty
    # unless prepare_*.
    next_partitions: tuple[str, ...] = ()
    next_timeout_ms: int = 0  # the queued transaction's timeout_ms
    # The producer id and epoch the producer goes on with after this transaction, set by
    # the decision of `EndTxnBumpEpoch` (KIP-890 part 2: epoch + 1, or a new producer id
    # with epoch 0 once the epoch is spent); -1 for a decision that bumped nothing (an
    # `EndTxn` from before the bump, or no decision yet).
    next_producer_id: int = -1
    next_producer_epoch: int = -1

    @property
    def is_open(self) -> bool:
        """Ongoing or deciding: its partitions hold its batches without a marker yet."""
        return self.state in ("ongoing", "prepare_commit", "prepare_abort")


@dataclass(frozen=True, slots=True)
class UserCredential:
    """A user of the HTTP API (security.py): never the password, only its salted scrypt
    key and the parameters it was derived with (hex strings; `n`, `r`, `p` as scrypt's)."""

    salt: str
    key: str
    n: int
    r: int
    p: int
    created_ms: int


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    """One ACL, as Kafka's (security.py): `principal` is "User:<name>" or "User:*";
    `pattern` literal (a `name` of "*" matches every resource) or prefixed."""

    principal: str
    resource_type: str  # cluster, topic, group, share_group, transactional_id
    pattern: str  # literal, prefixed
    name: str
    operation: str  # read, write, create, delete, alter, describe, all
    permission: str  # allow, deny


@dataclass(frozen=True, slots=True)
class QuotaSpec:
    """A principal's rates on every broker (security.py); 0 = unlimited."""

    produce_bytes_per_s: int = 0
    fetch_bytes_per_s: int = 0
    requests_per_s: int = 0


@dataclass(frozen=True, slots=True)
class SecurityState:
    """Users, ACLs and quotas (security.py); read-only once built, like the rest."""

    users: dict[str, UserCredential] = field(default_factory=dict)
    acls: tuple[AclBinding, ...] = ()  # sorted, distinct
    quotas: dict[str, QuotaSpec] = field(default_factory=dict)  # principal -> spec


@dataclass(frozen=True, slots=True)
class MetadataState:
    # Field order is the one older code had (repr, positional construction). Each field
    # names its domain; the first, and metadata_version and clock_ms, are the shell's.
    config: MetadataConfig = field(default_factory=MetadataConfig)
    # brokers.py (reassignment.py sets `decommissioning` and unregisters).
    brokers: dict[str, BrokerInfo] = field(default_factory=dict)  # read-only once built
    # topics.py (reassignment.py moves and retires partitions).
    topics: dict[str, TopicInfo] = field(default_factory=dict)  # read-only once built
    next_topic_id: int = 1  # only grows: ids are never reused
    metadata_version: int = 0  # only grows; +1 per change visible in the catalogue
    clock_ms: int = 0  # the largest now_ms applied; only grows
    # consumer_groups.py: consumer groups and committed offsets, replicated and snapshotted
    # with the rest but not part of the catalogue observers follow (state_to_json): commits
    # at a high rate must not make every observer download the catalogue again.
    groups: GroupsState = field(default_factory=GroupsState)
    # producers.py: idempotent producers, also out of the catalogue; ids are never reused.
    next_producer_id: int = 0
    # -> (producer id, epoch, last InitProducer's now_ms). A persistent map (immutables'
    # HAMT), as `transactions`: a command sets one id in O(log n), where a copied dict cost
    # O(n) on every replica (2.2 ms per command at transactional_ids_max, 100,000 ids).
    transactional_ids: Map[str, tuple[int, int, int]] = field(default_factory=Map)
    # voters.py: the metadata group's own voters, its Raft configuration as last recorded
    # (sorted; () until its leader first records it), and the set a running change is
    # heading for (() = none).
    voters: tuple[str, ...] = ()
    voters_target: tuple[str, ...] = ()
    # identity.py: the cluster's id, "" until the metadata group's first FormCluster;
    # set once, never changed.
    cluster_id: str = ""
    # share_groups.py: share groups (queues) and their in-flight records; snapshot only.
    share_groups: ShareGroupsState = field(default_factory=ShareGroupsState)
    # transactions.py: transactional id -> its current or last transaction (the
    # coordinator's state), out of the catalogue observers follow, like producers.
    transactions: Map[str, Transaction] = field(default_factory=Map)
    # The ids of `transactions` whose transaction is open (ongoing, prepare_*), derived
    # from it (never in the snapshot: rebuilt on restore), so that what the coordinator's
    # driver and reads look for costs O(open transactions), not O(ids remembered).
    transactions_open: Map[str, None] = field(default_factory=Map)
    # security.py: users (salted scrypt keys), ACLs and quotas; in the catalogue (every
    # broker, observers too, authenticates and authorises).
    security: SecurityState = field(default_factory=SecurityState)
    # features.py: the cluster's finalized feature level (dmq/compat.py); 0 until an
    # operator finalizes; only grows.
    finalized_level: int = 0

    def eligible_brokers(self, now_ms: int) -> list[str]:
        """Live brokers that may take new replicas (not decommissioning), sorted."""
        live = self.live_brokers(now_ms)
        return [b for b in live if not self.brokers[b].decommissioning]

    def live_brokers(self, now_ms: int) -> list[str]:
        """Sorted ids of the brokers heard from within broker_session_ms of `now_ms`."""
        session_ms = self.config.broker_session_ms
        return sorted(
            b.broker_id for b in self.brokers.values() if now_ms - b.last_heartbeat_ms <= session_ms
        )


# --- Results --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Applied:
    """The command changed (or confirmed) the state; `topic`/`broker` as it now is."""

    metadata_version: int
    topic: TopicInfo | None = None
    broker: BrokerInfo | None = None
    group_events: tuple[groups_state.Event, ...] = ()
    producer: tuple[int, int] | None = None  # InitProducer: (producer_id, producer_epoch)


@dataclass(frozen=True, slots=True)
class Rejected:
    """A user error: the state is unchanged. `code` is one of the REJECT_* constants (the
    shared ones below, a domain's own in its module)."""

    code: str
    message: str
    field: str | None = None


REJECT_INVALID_COMMAND: Final = "invalid_command"
REJECT_INVALID_ARGUMENT: Final = "invalid_argument"
REJECT_INVALID_REPLICAS: Final = "invalid_replicas"
REJECT_UNKNOWN_TOPIC: Final = "unknown_topic"
REJECT_UNKNOWN_BROKER: Final = "unknown_broker"
REJECT_UNKNOWN_PARTITION: Final = "unknown_partition"
REJECT_NOT_ENOUGH_BROKERS: Final = "not_enough_brokers"

Result = Applied | Rejected
Outcome = tuple[MetadataState, Result]  # what every apply function returns


# --- Helpers every domain changes the state with ----------------------------------------------


def bump(state: MetadataState, now_ms: int, **changes: Any) -> MetadataState:
    """`state` with `changes`, the next metadata_version and the command's clock."""
    return replace(state, metadata_version=state.metadata_version + 1, clock_ms=now_ms, **changes)


def with_partition(
    state: MetadataState, topic: TopicInfo, partition: int, new: PartitionInfo, now_ms: int
) -> tuple[MetadataState, Applied]:
    """`state` with one partition of `topic` replaced by `new`: a visible change."""
    partitions = list(topic.partitions)
    partitions[partition] = new
    new_topic = replace(topic, partitions=tuple(partitions))
    new_state = bump(state, now_ms, topics={**state.topics, topic.name: new_topic})
    return new_state, Applied(new_state.metadata_version, topic=new_topic)


class PartitionRef(Protocol):
    """A command that names one partition of one incarnation of a topic."""

    @property
    def topic(self) -> str: ...
    @property
    def topic_id(self) -> int: ...
    @property
    def partition(self) -> int: ...


def topic_of(state: MetadataState, cmd: PartitionRef) -> TopicInfo | Rejected:
    """The command's topic, or its refusal: the topic must still be the one the command
    names by id (a deleted and recreated topic is another one), with that partition."""
    topic = state.topics.get(cmd.topic)
    if topic is None or topic.topic_id != cmd.topic_id:
        return Rejected(
            REJECT_UNKNOWN_TOPIC, f"topic {cmd.topic!r} id {cmd.topic_id} does not exist", "topic"
        )
    if not 0 <= cmd.partition < len(topic.partitions):
        return Rejected(
            REJECT_UNKNOWN_PARTITION, f"partition {cmd.partition} does not exist", "partition"
        )
    return topic

"""Broker-level limits: every bound of the HTTP API and the Broker, in one place.

Each is the default of a BrokerConfig field of the same name (lower case), so users
can tune it with a flag, an environment variable or the config file; the storage
limits of a single record and batch come from log/limits.py. Relations between the
limits are checked when the broker starts (BrokerConfig.__post_init__).
"""

from __future__ import annotations

from typing import Final

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB

# Largest HTTP request body. Bounds the memory one request can pin; must hold the
# largest batch (batch_bytes_max) plus JSON/base64 overhead (4/3).
REQUEST_BYTES_MAX: Final = 16 * MiB

# Records in one JSON/NDJSON/text produce request: bounds parse time per request.
PRODUCE_RECORDS_MAX: Final = 10_000

# Produce requests in flight per partition replica (proposed, not yet answered): bounds memory
# and latency under overload; beyond it the broker answers 429.
PRODUCE_QUEUE_DEPTH_MAX: Final = 1_000

# Bytes of produce requests queued per partition: with produce_queue_depth_max alone a
# partition could pin 1,000 x batch_bytes_max of memory; this bounds it (429 beyond).
PRODUCE_QUEUE_BYTES_MAX: Final = 64 * MiB

# Group commit is the Raft node's: one Raft entry holds at most 4,096 produce requests
# and batch_bytes_max + 4 KiB (raft/config.py; dmq/broker/broker.py raft_config_for).

# Fetch: the longest a long-poll may wait, the largest response, the most records
# a JSON response may carry, and how many fetches may wait at once (each holds a
# connection and a timer).
FETCH_WAIT_MS_MAX: Final = 30_000
FETCH_BYTES_MAX: Final = 8 * MiB
FETCH_BYTES_DEFAULT: Final = 1 * MiB
FETCH_RECORDS_MAX: Final = 10_000
FETCH_RECORDS_DEFAULT: Final = 500
WAITING_FETCHES_MAX: Final = 1_000
# GET /metrics: partitions this broker hosts up to which the partition metrics carry
# {topic, partition} labels; above it they are summed per topic (and with more topics than
# this, per broker). Each per-partition series costs Prometheus ~3 KiB of memory and the
# scrape ~100 bytes; 1,000 partitions x ~15 series is ~15,000 series per broker.
METRICS_PARTITIONS_MAX: Final = 1_000

# Partition replicas per broker (on average over the cluster, as placement spreads them
# evenly). Each replica holds about 6 file descriptors (Raft journal, its meta file,
# pysyncobj's notifier pipe pair, the active segment, the applied checkpoint) plus its
# closed segments' files while read, and one Raft group's memory (journal cache up to
# 4 MiB when busy): 2,000 replicas need a descriptor limit well above 12,000.
REPLICAS_PER_BROKER_MAX: Final = 2_000

# Topics: Kafka's name rule (legal characters, at most 249) and partition bounds.
TOPIC_NAME_CHARS_MAX: Final = 249
PARTITIONS_PER_TOPIC_MAX: Final = 1_000
TOPICS_MAX: Final = 10_000

# Consumer groups (groups/README.md). These are applied inside the replicated metadata
# state machine, so every replica must use the same values: they are the defaults of
# groups.state.GroupsConfig (tests/dmq/test_dmq_groups_limits.py keeps the two equal) and
# change with the code, not per broker. Each bounds the metadata snapshot.
GROUPS_MAX: Final = 10_000
MEMBERS_PER_GROUP_MAX: Final = 1_000
SESSION_TIMEOUT_MS_MIN: Final = 1_000  # shorter sessions expire healthy members on a busy box
SESSION_TIMEOUT_MS_MAX: Final = 300_000
SESSION_TIMEOUT_MS_DEFAULT: Final = 10_000  # Kafka's consumer default is 45 s; dmq is smaller
OFFSETS_PER_COMMIT_MAX: Final = 10_000  # one Raft entry per commit
COMMITTED_OFFSETS_PER_GROUP_MAX: Final = 100_000
SUBSCRIPTION_TOPICS_MAX: Final = 1_000
TOPIC_PATTERN_CHARS_MAX: Final = 1_000  # matched against every topic name on each change
GROUP_NAME_CHARS_MAX: Final = 249  # group names, member ids and instance ids
# A member id is its instance id (or "member") + "-" + 16 hex digits: the instance id is
# shorter by that much, so that every member id the broker draws fits GROUP_NAME_CHARS_MAX.
MEMBER_ID_SUFFIX_CHARS: Final = 17
INSTANCE_ID_CHARS_MAX: Final = GROUP_NAME_CHARS_MAX - MEMBER_ID_SUFFIX_CHARS
# How often the metadata leader looks for expired sessions: expiry lands within
# session_timeout_ms + this.
GROUP_EXPIRY_CHECK_MS: Final = 200
# Partition offset look-ups one describe runs at once (a group may cover 100,000
# partitions: one request must not open that many calls to the partition leaders).
GROUP_DESCRIBE_CONCURRENCY_MAX: Final = 16
# How long a member may keep partitions revoked from it before the metadata leader expires
# it (KIP-848's rebalance timeout; Kafka derives it from max.poll.interval.ms, 5 minutes):
# a member that heartbeats but never acknowledges a revocation would otherwise hold the
# partitions forever. Per broker (BrokerConfig.group_rebalance_timeout_ms): only the
# leader's clock decides, and it proposes the expiry as a command.
GROUP_REBALANCE_TIMEOUT_MS_DEFAULT: Final = 300_000
# A group with no members is forgotten, committed offsets included, this long after its
# last change (commit, reset, the last member leaving): Kafka's offsets.retention.minutes,
# 7 days. Per broker (BrokerConfig.group_offsets_retention_ms); the leader proposes it.
GROUP_OFFSETS_RETENTION_MS_DEFAULT: Final = 7 * 24 * 3600 * 1000
# A transactional id not used (POST /v1/producers) for this long is forgotten (Kafka's
# transactional.id.expiration.ms, 7 days): the next use starts at a new producer id.
TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT: Final = 7 * 24 * 3600 * 1000
# How often the metadata leader looks for transactional ids to forget (at most; half the
# expiration if that is shorter): the look walks every id remembered (up to
# transactional_ids_max, 100,000: tens of ms), so not at GROUP_EXPIRY_CHECK_MS. An id
# goes within the expiration + this (Kafka looks hourly).
TRANSACTIONAL_ID_EXPIRY_CHECK_MS: Final = 10_000

# Confluent REST Proxy v2 consumer instances (dmq/broker/rest_v2.py), kept in memory by
# the metadata leader. Each holds a group member and one position per assigned partition.
REST_V2_INSTANCES_MAX: Final = 1_000
# An instance idle this long is deleted and leaves its group (the proxy's
# consumer.instance.timeout.ms, 5 minutes); it is also its member's session timeout, so
# it lies within [SESSION_TIMEOUT_MS_MIN, SESSION_TIMEOUT_MS_MAX].
REST_V2_INSTANCE_TIMEOUT_MS_DEFAULT: Final = 300_000
# A records fetch without ?timeout= waits this long (the proxy's consumer.request.timeout.ms).
REST_V2_REQUEST_TIMEOUT_MS_DEFAULT: Final = 1_000

# Broker-side filtering (dmq/selector.py): the longest filter= text, and the bytes of
# log one filtered fetch may read and decode (its CPU bound: a fetch whose records
# mostly do not match reads at most this much, then answers with next_offset past it).
FILTER_CHARS_MAX: Final = 4_096
FILTER_SCAN_BYTES_MAX: Final = 32 * MiB

# Delayed records (dmq/broker/delay.py): the longest delay, and the bytes of delayed
# records one partition may hold (429 beyond). They cost disk (bucket files), not memory:
# a snapshot names the store and a new replica streams it (dmq/partition/delay.py), so
# the bound is a per-partition disk quota (the free-space floor still applies below it).
MAX_DELAY_MS: Final = 7 * 24 * 3600 * 1000
DELAY_PENDING_BYTES_MAX: Final = 8 * GiB

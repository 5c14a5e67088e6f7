"""Every default and bound of the client, in one place, with what it costs.

The broker's own limits (dmq/limits.py, log/limits.py) bound what it accepts; these bound
what one client holds in memory and how long it waits. The user-tunable ones are keyword
arguments of `Producer`, `Consumer` and `Admin` with the same name in lower case.
"""

from __future__ import annotations

from typing import Final

from dmq import limits as broker_limits
from log import limits as log_limits

KiB: Final = 1024
MiB: Final = 1024 * KiB

# Producer: how long a batch waits for more records before it is sent. Higher gives
# bigger batches (throughput, compression ratio) at the cost of that much latency.
LINGER_MS_DEFAULT: Final = 5

# Producer: a batch is sent once its records reach this many bytes (uncompressed,
# estimated). Bounded above by the largest batch the format and the broker accept.
BATCH_BYTES_DEFAULT: Final = 1 * MiB
BATCH_BYTES_MAX: Final = log_limits.BATCH_BYTES_MAX

# Producer: records accepted by `send` and not yet acknowledged, all partitions together.
# Bounds the producer's memory; when full, `send` waits up to request_timeout_ms for
# room and then fails the record with Backpressure.
BUFFER_BYTES_DEFAULT: Final = 32 * MiB

# Retries of a request that failed with a RetriableError or a connection error: the
# delay doubles from retry_backoff_ms up to RETRY_BACKOFF_MS_MAX (with +-20% jitter so
# that clients do not retry in step), or is what the broker asked for (Retry-After),
# up to RETRY_AFTER_MS_MAX. Retries go on until a deadline passes (below), not for a
# fixed count: a leader failover (a Raft election, seconds on a loaded cluster) outlasts
# any small count of ~200 ms retry-afters. RETRY_BACKOFF_MS_MAX is Kafka's
# retry.backoff.max.ms: a client that backed off that far notices a recovered broker at
# most this late; each retry costs the broker one request, so lower means more load
# from a crowd of waiting clients.
RETRY_BACKOFF_MS_DEFAULT: Final = 100
RETRY_BACKOFF_MS_MAX: Final = 1_000
RETRY_AFTER_MS_MAX: Final = 30_000
RETRY_JITTER_FRACTION: Final = 0.2
# An optional cap on the retries of one request (`retries=`); None, the default, is
# Kafka's retries = MAX_INT: the deadline alone decides.
RETRIES_DEFAULT: Final = None

# Producer: a record's whole delivery, from `send` to its success or failure, waits for
# metadata, buffer room and linger included, retries included (Kafka's
# delivery.timeout.ms). A record fails with the last retriable error (or RequestTimeout)
# naming delivery_timeout_ms once it passes. Longer rides out longer outages at the cost
# of memory (a record holds its buffer_bytes share until then) and of a caller learning
# of a dead cluster that much later. Must be >= linger_ms + request_timeout_ms, so that
# a record always gets one whole attempt (checked when the producer is built).
DELIVERY_TIMEOUT_MS_DEFAULT: Final = 120_000

# Admin and consumer calls, and the producer's own calls besides records (metadata, its
# producer id, transaction commit/abort): one call's attempts and retries end by this
# deadline (Kafka's default.api.timeout.ms). Each attempt waits at most
# request_timeout_ms, cut to what is left of it.
DEFAULT_API_TIMEOUT_MS_DEFAULT: Final = 60_000

# Sync Producer: sends handed to the loop thread and not yet in the buffer. `send`
# returns without waiting for the loop (a round trip per record would cap a thread at a
# few thousand records/s); this bounds the tasks a fast caller can pile up before it
# blocks, on top of buffer_bytes.
SYNC_SENDS_PENDING_MAX: Final = 1024
# ...and the loop task that takes them over yields after this many, so that the sender
# and the connections keep running while a thread sends without pause.
SYNC_HANDOFF_YIELD_EVERY: Final = 256

# One HTTP request, connection included; a long-poll fetch gets its wait_ms on top.
REQUEST_TIMEOUT_MS_DEFAULT: Final = 30_000

# Producer: a topic's partition count is re-read in the background this often, so that
# added partitions start receiving keyed and unkeyed records.
METADATA_MAX_AGE_MS: Final = 300_000

# Consumer: bytes asked for per partition per fetch (the broker returns at least one
# whole batch), and at most one fetched response is buffered per partition, so a
# consumer holds about fetch_bytes_max per assigned partition.
FETCH_BYTES_DEFAULT: Final = broker_limits.FETCH_BYTES_DEFAULT
FETCH_BYTES_MAX: Final = broker_limits.FETCH_BYTES_MAX
# The longest long-poll the broker grants; a longer poll() simply asks again.
FETCH_WAIT_MS_MAX: Final = broker_limits.FETCH_WAIT_MS_MAX

POLL_TIMEOUT_MS_DEFAULT: Final = 1_000
POLL_RECORDS_DEFAULT: Final = 500
# A group consumer that does not poll for this long leaves its group (Kafka's
# max.poll.interval.ms default): its partitions go to members that do.
MAX_POLL_INTERVAL_MS_DEFAULT: Final = 300_000

# After closing its session, a client with an https URL waits this long: a request it
# cancelled (a consumer's long-poll in flight at close) closes its TLS connection with a
# close_notify exchange, one round trip, that must end before a sync client's event loop
# stops, or asyncio leaves the socket to the garbage collector (ResourceWarning).
TLS_CLOSE_GRACE_MS: Final = 100
